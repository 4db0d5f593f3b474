#include "proxy/core/balance.h"

#include <stdlib.h>

#include "policy/score.h"
#include "proxy/core/choose.h"
#include "proxy/core/runtime.h"
#include "proxy/core/worker.h"
#include "proxy/dns/resolve.h"
#include "proxy/telemetry/log.h"
#include "proxy/upstream/attempt.h"

void endpoint_unref(struct endpoint *e)
{
    if (e && --e->refs == 0) {
        /* its connections busy when it left are idle now */
        if (e->left && e->to)
            attempt_target_leave(e->left, e->to);
        attempt_target_free(e->to);
        free(e);
    }
}

void balance_views_free(struct bal_view *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++) {
        for (size_t j = 0; j < v[i].n; j++)
            endpoint_unref(v[i].ep[j]);
        free(v[i].ep);
    }
    free(v);
}

/* The slot of 'e' still holds its address. */
static bool same_slot(const struct endpoint *e, struct live_endpoint *le)
{
    return e->le == le && e->epoch == atomic_load_explicit(&le->epoch, memory_order_relaxed);
}

/* View 'v' of upstream 'k' of route 'x' takes the name's addresses now: endpoints that stay are
 * kept, those that joined are made, those that left close their idle connections. */
static void sync_view(struct worker *w, const struct rt_route *x, size_t k, struct bal_view *v,
                      uint64_t gen, const char *url)
{
    struct dns_addrs *as = dns_name_addrs(x->names[k]);
    size_t n = as->n < LIVE_ENDPOINTS_MAX ? as->n : LIVE_ENDPOINTS_MAX;
    struct live_endpoint *le[LIVE_ENDPOINTS_MAX];
    struct endpoint **ep = n ? calloc(n, sizeof(*ep)) : NULL;
    if (n && !ep)
        goto out; /* the old view stays; the next pick tries again */
    live_upstream_sync(x->ups[k], as->a, n, le);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!le[i])
            continue; /* past LIVE_ENDPOINTS_MAX */
        struct endpoint *e = NULL;
        for (size_t j = 0; j < v->n && !e; j++)
            if (v->ep[j] && same_slot(v->ep[j], le[i])) {
                e = v->ep[j];
                v->ep[j] = NULL; /* moved */
            }
        if (!e && (e = calloc(1, sizeof(*e))) != NULL) {
            *e = (struct endpoint){ .refs = 1,
                                    .epoch = atomic_load(&le[i]->epoch),
                                    .le = le[i],
                                    .k = k,
                                    .bit = 1ULL << ((le[i]->index + 7 * k) & 63),
                                    .addr = as->a[i] };
        }
        if (e)
            ep[m++] = e;
    }
    for (size_t j = 0; j < v->n; j++) {
        struct endpoint *gone = v->ep[j];
        if (!gone)
            continue;
        if (!gone->to) /* never picked here: its idle connections may be an older snapshot's */
            gone->to = attempt_target_new(x->urls[gone->k], &gone->addr, &gone->le->conns);
        if (gone->to) {
            attempt_target_leave(w->up, gone->to);
            gone->left = w->up;
        }
        endpoint_unref(gone);
    }
    if (as->n > LIVE_ENDPOINTS_MAX && !v->gen)
        log_event(CFG_LOG_WARN, "upstream name has more addresses than endpoints are kept",
                  "upstream", url, LOG_NUM("addresses", as->n), LOG_NUM("used", LIVE_ENDPOINTS_MAX),
                  NULL);
    free(v->ep);
    v->ep = ep;
    v->n = m;
    v->gen = gen;
out:
    dns_addrs_unref(as);
}

/* Worker 'w''s views of route 'x', synced with their names. */
static struct bal_view *views_of(struct worker *w, const struct rt *rt, const struct rt_route *x,
                                 const struct cfg_route *r)
{
    size_t n_up = r->n_upstreams;
    unsigned id = w->id < rt->n_workers ? w->id : 0;
    struct bal_view *v = &x->views[id * n_up];
    for (size_t k = 0; k < n_up; k++) {
        if (!x->names[k])
            continue;
        uint64_t gen = dns_name_generation(x->names[k]);
        if (v[k].gen != gen)
            sync_view(w, x, k, &v[k], gen, r->upstreams[k].url);
    }
    return v;
}

struct endpoint *balance_pick(struct worker *w, const struct rt *rt, const struct rt_route *x,
                              uint64_t tried, uint64_t now_ms, uint32_t *rr)
{
    const struct cfg_route *r = &rt->cfg->routes[x - rt->routes];
    struct bal_view *v = views_of(w, rt, x, r);
    struct endpoint *cand[64];
    size_t n = 0;
    for (size_t k = 0; k < r->n_upstreams; k++)
        for (size_t j = 0; j < v[k].n && n < 64; j++)
            cand[n++] = v[k].ep[j];
    if (n == 0)
        return NULL;
    size_t i = 0;
    if (n > 1) {
        uint64_t t = 0, ej = 0;
        int64_t load[64];
        uint32_t fail[64], lat[64], weight[64], fastest = 0;
        uint64_t at[64];
        bool ejection = r->ejection.health.consecutive_failures > 0;
        for (size_t c = 0; c < n; c++) {
            struct live_endpoint *le = cand[c]->le;
            if (tried & cand[c]->bit)
                t |= 1ULL << c;
            if (ejection && !live_endpoint_available(le, now_ms))
                ej |= 1ULL << c;
            load[c] = atomic_load_explicit(&le->in_flight, memory_order_relaxed);
            /* the score, as eject_score() last published it (policy/score.h) */
            fail[c] = __atomic_load_n(&le->h.score.fail_q16, __ATOMIC_RELAXED);
            lat[c] = __atomic_load_n(&le->h.score.lat_us, __ATOMIC_RELAXED);
            at[c] = __atomic_load_n(&le->h.score.at_ms, __ATOMIC_RELAXED);
            if (lat[c] && (!fastest || lat[c] < fastest))
                fastest = lat[c];
        }
        for (size_t c = 0; c < n; c++)
            weight[c] = score_weight(fail[c], lat[c], at[c], now_ms, fastest);
        /* a request's first attempt, not a retry, takes a turn: 'tried' names endpoints of any
         * view, one that left included, 't' those of this one only */
        i = choose_balanced(r->balance, t, ej, n, load, r->weigh_endpoints ? weight : NULL,
                            tried ? NULL : rr, &w->rng);
    }
    struct endpoint *e = cand[i];
    if (!e->to)
        e->to = attempt_target_new(x->urls[e->k], &e->addr, &e->le->conns);
    e->refs++;
    return e;
}

void balance_sync_all(struct worker *w, const struct rt *rt)
{
    for (size_t i = 0; i < rt->cfg->n_routes; i++)
        views_of(w, rt, &rt->routes[i], &rt->cfg->routes[i]);
}
