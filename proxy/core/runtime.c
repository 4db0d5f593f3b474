#include "proxy/core/runtime.h"

#include <stdlib.h>
#include <sys/time.h>

#include "proxy/core/balance.h"
#include "proxy/dns/resolve.h"
#include "proxy/upstream/attempt.h"

static int64_t unix_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static void rt_free(struct rt *rt)
{
    if (rt->routes)
        for (size_t i = 0; i < rt->cfg->n_routes; i++) {
            struct rt_route *x = &rt->routes[i];
            free((void *)x->reasons);
            size_t n_up = rt->cfg->routes[i].n_upstreams;
            balance_route_free(x->bal);
            for (size_t k = 0; k < n_up; k++) {
                if (x->urls)
                    attempt_url_free(x->urls[k]);
                if (x->names)
                    dns_name_unref(x->names[k]);
            }
            free(x->urls);
            free(x->names);
            free(x->ups);
            free(x->targets);
        }
    free(rt->routes);
    cfg_unref(rt->cfg);
    free(rt);
}

struct rt *rt_new(struct cfg *cfg, uint64_t generation, struct metrics *m, struct live *lv,
                  struct dns *dns, unsigned n_workers)
{
    struct rt *rt = calloc(1, sizeof(*rt));
    if (!rt)
        return NULL;
    atomic_init(&rt->refs, 1);
    rt->cfg = cfg_ref(cfg);
    rt->generation = generation;
    rt->loaded_unix_ms = unix_ms();
    rt->n_workers = n_workers ? n_workers : 1;
    rt->routes = calloc(cfg->n_routes, sizeof(*rt->routes));
    rt->no_route = metrics_route(m, "");
    if (!rt->routes || !rt->no_route)
        goto fail;
    for (size_t i = 0; i < cfg->n_routes; i++) {
        const struct cfg_route *r = &cfg->routes[i];
        struct rt_route *x = &rt->routes[i];
        unsigned *reasons = calloc(r->retry.n_on ? r->retry.n_on : 1, sizeof(*reasons));
        x->reasons = reasons;
        x->metrics = metrics_route(m, r->name);
        x->live = live_route(lv, r->name, r->budget.window_ms);
        x->urls = calloc(r->n_upstreams ? r->n_upstreams : 1, sizeof(*x->urls));
        x->targets = calloc(r->n_upstreams ? r->n_upstreams : 1, sizeof(*x->targets));
        x->names = calloc(r->n_upstreams ? r->n_upstreams : 1, sizeof(*x->names));
        x->ups = calloc(r->n_upstreams ? r->n_upstreams : 1, sizeof(*x->ups));
        x->bal = x->urls && x->names && x->ups
                     ? balance_route_new(r, rt->n_workers, x->urls, x->names, x->ups)
                     : NULL;
        if (!reasons || !x->metrics || !x->live || !x->urls || !x->targets || !x->names ||
            !x->ups || !x->bal)
            goto fail;
        throttle_set_window(&x->live->throttle, r->throttle.window_ms);
        for (size_t k = 0; k < r->n_upstreams; k++)
            if (!(x->urls[k] = attempt_url_new(r->upstreams[k].origin, r->upstreams[k].host,
                                               &r->tls, r->n_upgrades > 0)) ||
                !(x->targets[k] = metrics_target(x->metrics, r->upstreams[k].url)))
                goto fail;
        for (size_t k = 0; k < r->n_upstreams; k++) {
            if (!(x->ups[k] = live_upstream(lv, r->name, r->upstreams[k].url)) ||
                (dns && !(x->names[k] = dns_name_start(dns, r->upstreams[k].host))))
                goto fail;
            atomic_store(&x->ups[k]->ejection, r->ejection.health.consecutive_failures > 0);
        }
        for (size_t k = 0; k < r->retry.n_on; k++)
            reasons[k] = metrics_reason(x->metrics, r->retry.on[k].token);
    }
    /* the new names are asked side by side: one resolver.timeout_ms at most in all */
    if (dns)
        dns_wait(dns);
    for (size_t i = 0; i < cfg->n_routes; i++)
        for (size_t k = 0; k < cfg->routes[i].n_upstreams; k++) {
            struct dns_name *name = rt->routes[i].names[k];
            if (!name)
                continue;
            /* its endpoints are seen (/upstreams) before a request picks one */
            struct dns_addrs *as = dns_name_addrs(name);
            struct live_endpoint **le = as->n ? calloc(as->n, sizeof(*le)) : NULL;
            if (le || !as->n) /* else (out of memory) the workers' first sync makes them */
                live_upstream_sync(rt->routes[i].ups[k], as->a, as->n, le);
            free(le);
            dns_addrs_unref(as);
        }
    return rt;
fail:
    rt_free(rt);
    return NULL;
}

struct rt *rt_ref(struct rt *rt)
{
    atomic_fetch_add_explicit(&rt->refs, 1, memory_order_relaxed);
    return rt;
}

void rt_unref(struct rt *rt)
{
    if (rt && atomic_fetch_sub_explicit(&rt->refs, 1, memory_order_acq_rel) == 1)
        rt_free(rt);
}

void rt_cell_init(struct rt_cell *c)
{
    pthread_mutex_init(&c->mu, NULL);
    c->cur = NULL;
    atomic_init(&c->generation, 0);
}

void rt_cell_destroy(struct rt_cell *c)
{
    rt_unref(c->cur);
    c->cur = NULL;
    pthread_mutex_destroy(&c->mu);
}

void rt_cell_publish(struct rt_cell *c, struct rt *rt)
{
    pthread_mutex_lock(&c->mu);
    struct rt *old = c->cur;
    c->cur = rt;
    atomic_store_explicit(&c->generation, rt->generation, memory_order_release);
    pthread_mutex_unlock(&c->mu);
    rt_unref(old);
}

struct rt *rt_cell_get(struct rt_cell *c)
{
    pthread_mutex_lock(&c->mu);
    struct rt *rt = c->cur ? rt_ref(c->cur) : NULL;
    pthread_mutex_unlock(&c->mu);
    return rt;
}
