/* runtime -- a config snapshot as the proxy runs it, and how a new one reaches the workers.
 *
 * A struct rt binds an immutable config snapshot to what lives outside it: its generation,
 * when it was loaded, and for each route its metrics series (keyed by route name, so counters
 * survive reloads). It is immutable and refcounted like the snapshot; a request holds the one
 * it started with, so a reload never changes a request in flight.
 *
 * The control thread publishes a new rt in the cell (a mutex, taken only on reload) and wakes
 * the workers; each worker swaps its own pointer in its own thread. The request path reads the
 * worker's pointer: no lock, no shared cache line.
 */
#ifndef RETRYPROXY_PROXY_RUNTIME_H
#define RETRYPROXY_PROXY_RUNTIME_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "config/cfg.h"
#include "proxy/core/live.h"
#include "proxy/telemetry/metrics.h"

struct attempt_url; /* proxy/upstream/attempt.h */
struct dns_name;    /* proxy/dns/resolve.h */
struct dns;         /* proxy/dns/resolve.h */
struct bal_route;   /* proxy/core/balance.h */
struct live;        /* proxy/core/live.h */

struct rt_route {
    struct metrics_route *metrics;
    struct live_route *live;    /* its budget and route-scoped backoff, kept across reloads */
    const unsigned *reasons;    /* the metrics reason slot of each retry_on condition */
    struct attempt_url **urls;  /* each upstream's origin, parsed once (proxy/upstream/attempt.h) */
    struct dns_name **names;    /* each upstream's host (NULL: no resolver, the URL's) */
    struct live_upstream **ups; /* each upstream's endpoints, kept by URL */
    struct bal_route *bal;      /* every worker's view of them (proxy/core/balance.h) */
    struct metrics_target **targets; /* each upstream's series, resolved once per snapshot */
};

struct rt {
    atomic_uint refs;
    struct cfg *cfg;
    uint64_t generation;
    int64_t loaded_unix_ms;
    struct rt_route *routes;        /* one per cfg->routes[i] */
    struct metrics_route *no_route; /* requests that matched no route (route="") */
    unsigned n_workers;             /* the views each route has per upstream */
};

/* A runtime snapshot for 'cfg' (a reference is taken) with series in 'm', live state in 'lv',
 * names in 'dns' (NULL: no resolver) for 'n_workers' workers (0: one): the process's
 * (proxy/core/proxy.h). On the control thread (a new name is resolved before it returns). NULL
 * if out of memory. Holds one reference. */
struct rt *rt_new(struct cfg *cfg, uint64_t generation, struct metrics *m, struct live *lv,
                  struct dns *dns, unsigned n_workers);
struct rt *rt_ref(struct rt *rt);
void rt_unref(struct rt *rt); /* accepts NULL */

/* The snapshot being served. */
struct rt_cell {
    pthread_mutex_t mu;
    struct rt *cur;
    atomic_uint_fast64_t generation; /* of 'cur', readable without the mutex */
};

void rt_cell_init(struct rt_cell *c);
void rt_cell_destroy(struct rt_cell *c);
/* Makes 'rt' current, taking over the caller's reference; the previous one is released. */
void rt_cell_publish(struct rt_cell *c, struct rt *rt);
/* The current snapshot, with a new reference (NULL before the first publish). */
struct rt *rt_cell_get(struct rt_cell *c);
static inline uint64_t rt_cell_generation(struct rt_cell *c)
{
    return atomic_load_explicit(&c->generation, memory_order_acquire);
}

#endif
