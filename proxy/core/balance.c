#include "proxy/core/balance.h"

#include <stdlib.h>

#include "config/cfg.h"
#include "policy/score.h"
#include "proxy/core/choose.h"
#include "proxy/dns/resolve.h"
#include "proxy/upstream/attempt.h"

/* A worker's endpoints of one upstream of a route in one snapshot. */
struct bal_view {
    uint64_t gen; /* the name's generation it follows; 0: not synced yet */
    size_t n;
    struct endpoint **ep;
};

/* A worker's candidates of one route (below). */
struct bal_set;

struct bal_route {
    const struct cfg_route *r;
    unsigned n_workers;
    struct attempt_url *const *urls; /* [upstream], the snapshot's */
    struct dns_name *const *names;
    struct live_upstream *const *ups;
    struct bal_view *views; /* [worker][upstream] */
    struct bal_set *sets;   /* [worker]: each worker's candidates, its views together */
};

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

static void views_free(struct bal_view *v, size_t n)
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

/* A slot and its place in a view being made, in the slots' order (sync_view's merge). */
struct slot_at {
    struct live_endpoint *le;
    size_t i;
};

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y ? -1 : x > y;
}

static int slot_at_cmp(const void *x, const void *y)
{
    return cmp_ptr(((const struct slot_at *)x)->le, ((const struct slot_at *)y)->le);
}

static int endpoint_cmp(const void *x, const void *y)
{
    return cmp_ptr((*(struct endpoint *const *)x)->le, (*(struct endpoint *const *)y)->le);
}

/* View 'v' of upstream 'k' of route 'x' takes the name's addresses now: endpoints that stay are
 * kept, those that joined are made, those that left close their idle connections. The old
 * endpoints and the new slots are matched by a merge of both sorted by slot, O(n log n) for a
 * name of n addresses. */
static void sync_view(const struct bal_worker *w, const struct bal_route *x, size_t k,
                      struct bal_view *v, uint64_t gen)
{
    struct dns_addrs *as = dns_name_addrs(x->names[k]);
    size_t n = as->n;
    struct live_endpoint **le = n ? calloc(n, sizeof(*le)) : NULL;
    struct slot_at *by = n ? calloc(n, sizeof(*by)) : NULL;
    struct endpoint **ep = n ? calloc(n, sizeof(*ep)) : NULL;
    if (n && (!le || !by || !ep))
        goto out; /* the old view stays; the next pick tries again */
    live_upstream_sync(x->ups[k], as->a, n, le);
    for (size_t i = 0; i < n; i++)
        by[i] = (struct slot_at){ le[i], i };
    if (n)
        qsort(by, n, sizeof(*by), slot_at_cmp);
    if (v->n)
        qsort(v->ep, v->n, sizeof(*v->ep), endpoint_cmp);
    for (size_t i = 0, j = 0; i < n && j < v->n;) {
        int c = cmp_ptr(by[i].le, v->ep[j]->le);
        if (c == 0 && same_slot(v->ep[j], by[i].le)) {
            ep[by[i].i] = v->ep[j];
            v->ep[j] = NULL; /* moved */
        }
        i += c <= 0;
        j += c >= 0;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        struct endpoint *e = ep[i];
        if (!e && le[i] && (e = calloc(1, sizeof(*e))) != NULL)
            *e = (struct endpoint){ .refs = 1,
                                    .epoch = atomic_load(&le[i]->epoch),
                                    .le = le[i],
                                    .k = k,
                                    .addr = as->a[i] };
        if (e)
            ep[m++] = e; /* in the record's order */
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
    free(v->ep);
    v->ep = ep;
    ep = NULL;
    v->n = m;
    v->gen = gen;
out:
    free(ep);
    free(by);
    free(le);
    dns_addrs_unref(as);
}

/* A worker's candidates of one route: its views' endpoints laid end to end (borrowed: the views
 * hold them), gathered again when a view syncs, and their weights (policy/score.h) with their
 * running sums, computed again when stale. Up to BAL_WEIGH_EVERY candidates that is at every
 * pick, exact as it always was; past that, once picks made since reach a BAL_REWEIGH_SHARE-th of
 * the candidates, or after BAL_REWEIGH_MS: a thousand are weighed every 250 picks, or every
 * second when requests are fewer, about 4 weights a pick (each about 60 instructions) whatever
 * their number. A weight moves with its endpoint's own attempts, which among a thousand are
 * one pick in a thousand, and the score behind it is an average over about ten attempts or 5 s
 * (policy/score.h): weights 250 picks or a second old are a fraction of an attempt behind. The
 * bound in time is a second, not less, so that it does not weigh a thousand every few picks
 * when picks are slow (measured under callgrind at 100 ms: 38 weights a pick, bench/README.md
 * "Endpoints"). */
#define BAL_WEIGH_EVERY   16
#define BAL_REWEIGH_SHARE 4
#define BAL_REWEIGH_MS    1000

struct bal_set {
    bool current; /* 'ep' is what the views hold */
    bool weighed; /* 'weight' is as of 'weighed_ms' */
    bool even;    /* the weights are all the same, or not weighed (routes[].weigh_endpoints) */
    size_t n, cap;
    struct endpoint **ep;
    uint32_t *weight;
    uint64_t *cum; /* cum[i] = weight[0] + ... + weight[i] */
    size_t picks;  /* since weighed */
    uint64_t weighed_ms;
};

static void sets_free(struct bal_set *s, size_t n)
{
    for (size_t i = 0; s && i < n; i++) {
        free(s[i].ep);
        free(s[i].weight);
        free(s[i].cum);
    }
    free(s);
}

struct bal_route *balance_route_new(const struct cfg_route *r, unsigned n_workers,
                                    struct attempt_url *const *urls, struct dns_name *const *names,
                                    struct live_upstream *const *ups)
{
    struct bal_route *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    *b = (struct bal_route){
        .r = r, .n_workers = n_workers, .urls = urls, .names = names, .ups = ups
    };
    b->views = calloc((size_t)n_workers * (r->n_upstreams ? r->n_upstreams : 1), sizeof(*b->views));
    b->sets = calloc(n_workers ? n_workers : 1, sizeof(*b->sets));
    if (!b->views || !b->sets) {
        balance_route_free(b);
        return NULL;
    }
    return b;
}

void balance_route_free(struct bal_route *b)
{
    if (!b)
        return;
    views_free(b->views, (size_t)b->n_workers * b->r->n_upstreams);
    sets_free(b->sets, b->n_workers);
    free(b);
}

/* Set 's' takes the endpoints of the 'n_up' views 'v'. False out of memory (it stays as it
 * was, not current). */
static bool gather(struct bal_set *s, const struct bal_view *v, size_t n_up)
{
    size_t n = 0;
    for (size_t k = 0; k < n_up; k++)
        n += v[k].n;
    if (n > s->cap) {
        struct endpoint **ep = realloc(s->ep, n * sizeof(*ep));
        if (ep)
            s->ep = ep;
        uint32_t *weight = ep ? realloc(s->weight, n * sizeof(*weight)) : NULL;
        if (weight)
            s->weight = weight;
        uint64_t *cum = weight ? realloc(s->cum, n * sizeof(*cum)) : NULL;
        if (!cum)
            return false;
        s->cum = cum;
        s->cap = n;
    }
    s->n = 0;
    for (size_t k = 0; k < n_up; k++)
        for (size_t j = 0; j < v[k].n; j++)
            s->ep[s->n++] = v[k].ep[j];
    s->current = true;
    s->weighed = false;
    return true;
}

/* Each candidate's weight, from its score as eject_score() last published it (policy/score.h),
 * against the fastest of them. */
static void weigh(struct bal_set *s, uint64_t now_ms)
{
    uint32_t fastest = 0, lo = UINT32_MAX, hi = 0;
    for (size_t c = 0; c < s->n; c++) {
        uint32_t lat = __atomic_load_n(&s->ep[c]->le->h.score.lat_us, __ATOMIC_RELAXED);
        if (lat && (!fastest || lat < fastest))
            fastest = lat;
    }
    uint64_t sum = 0;
    for (size_t c = 0; c < s->n; c++) {
        const struct score *sc = &s->ep[c]->le->h.score;
        uint32_t wt = score_weight(__atomic_load_n(&sc->fail_q16, __ATOMIC_RELAXED),
                                   __atomic_load_n(&sc->lat_us, __ATOMIC_RELAXED),
                                   __atomic_load_n(&sc->at_ms, __ATOMIC_RELAXED), now_ms, fastest);
        s->weight[c] = wt;
        s->cum[c] = sum += wt;
        lo = wt < lo ? wt : lo;
        hi = wt > hi ? wt : hi;
    }
    s->even = lo == hi || lo == 0;
    s->weighed = true;
    s->weighed_ms = now_ms;
    s->picks = 0;
}

/* What choose_many() reads of a candidate, live. */
struct pick_ctx {
    struct endpoint **ep;
    const struct choose_tried *tried;
    bool ejection;
    uint64_t now_ms;
};

/* CHOOSE_TRIED | CHOOSE_EJECTED of candidate 'le' (inline: pick_few() asks it of each). */
static inline unsigned state_of(const struct pick_ctx *p, struct live_endpoint *le)
{
    return (choose_tried_has(p->tried, le) ? CHOOSE_TRIED : 0) |
           (p->ejection && !live_endpoint_available(le, p->now_ms) ? CHOOSE_EJECTED : 0);
}

static unsigned cand_state(void *arg, size_t i)
{
    const struct pick_ctx *p = arg;
    return state_of(p, p->ep[i]->le);
}

static int64_t cand_load(void *arg, size_t i)
{
    const struct pick_ctx *p = arg;
    return atomic_load_explicit(&p->ep[i]->le->in_flight, memory_order_relaxed);
}

/* Worker 'w''s views of route 'x', synced with their names; its candidates are gathered again
 * when one of them synced. */
static struct bal_view *views_of(const struct bal_worker *w, struct bal_route *x)
{
    size_t n_up = x->r->n_upstreams;
    unsigned id = w->id < x->n_workers ? w->id : 0;
    struct bal_view *v = &x->views[id * n_up];
    for (size_t k = 0; k < n_up; k++) {
        if (!x->names[k])
            continue;
        uint64_t gen = dns_name_generation(x->names[k]);
        if (v[k].gen != gen) {
            sync_view(w, x, k, &v[k], gen);
            x->sets[id].current = false;
        }
    }
    return v;
}

/* Route 'r''s choice among the few candidates of 's' (CHOOSE_MASK_MAX at most) on masks, exact
 * and O(n), as it always was: choose_balanced(). */
static size_t pick_few(const struct cfg_route *r, const struct bal_set *s, const struct pick_ctx *p,
                       uint32_t *rr, struct rng *rng)
{
    uint64_t t = 0, ej = 0;
    int64_t load[CHOOSE_MASK_MAX];
    for (size_t c = 0; c < s->n; c++) {
        struct live_endpoint *le = s->ep[c]->le;
        unsigned st = state_of(p, le);
        t |= st & CHOOSE_TRIED ? 1ULL << c : 0;
        ej |= st & CHOOSE_EJECTED ? 1ULL << c : 0;
        load[c] = atomic_load_explicit(&le->in_flight, memory_order_relaxed);
    }
    /* a request's first attempt, not a retry, takes a turn */
    return choose_balanced(r->balance, t, ej, s->n, load, r->weigh_endpoints ? s->weight : NULL,
                           p->tried->one ? NULL : rr, rng);
}

struct endpoint *balance_pick(const struct bal_worker *w, struct bal_route *x,
                              const struct choose_tried *tried, uint64_t now_ms, uint32_t *rr)
{
    const struct cfg_route *r = x->r;
    struct bal_view *v = views_of(w, x);
    struct bal_set *s = &x->sets[w->id < x->n_workers ? w->id : 0];
    if (!s->current && !gather(s, v, r->n_upstreams))
        return NULL; /* out of memory: a connect failure */
    if (s->n == 0)
        return NULL;
    size_t i = 0;
    if (s->n > 1) {
        if (r->weigh_endpoints &&
            (!s->weighed || s->n <= BAL_WEIGH_EVERY || s->picks * BAL_REWEIGH_SHARE >= s->n ||
             now_ms - s->weighed_ms >= BAL_REWEIGH_MS || now_ms < s->weighed_ms))
            weigh(s, now_ms);
        s->picks++;
        struct pick_ctx p = { .ep = s->ep,
                              .tried = tried,
                              .ejection = r->ejection.health.consecutive_failures > 0,
                              .now_ms = now_ms };
        if (s->n <= CHOOSE_MASK_MAX) {
            i = pick_few(r, s, &p, rr, w->rng);
        } else {
            bool weighted = r->weigh_endpoints && !s->even;
            struct choose_set cs = { .n = s->n,
                                     .weight = weighted ? s->weight : NULL,
                                     .cum = weighted ? s->cum : NULL,
                                     .state = cand_state,
                                     .load = cand_load,
                                     .ctx = &p };
            i = choose_many(r->balance, &cs, tried->one != NULL, rr, w->rng);
        }
    }
    struct endpoint *e = s->ep[i];
    if (!e->to)
        e->to = attempt_target_new(x->urls[e->k], &e->addr, &e->le->conns);
    e->refs++;
    return e;
}

void balance_sync(const struct bal_worker *w, struct bal_route *b)
{
    views_of(w, b);
}
