/* balance -- a route's endpoints as one worker sees them, and the pick of one per attempt
 * (docs/endpoints.md).
 *
 * Each upstream of a route names a host (proxy/dns/resolve.h); each of its addresses is an
 * endpoint, whose shared state (health, requests in flight, connections) is a slot of
 * proxy/core/live.h. A worker keeps, per snapshot, route and upstream, a view: its handles on
 * those endpoints, each with its transport target (proxy/upstream/attempt.h), made when first
 * picked. A view follows its name's generation: when the record changes, the next pick (or the
 * wake-up the resolver sends) syncs it, and an endpoint that left gets no new attempt while its
 * idle connections close. Each worker also keeps, per snapshot and route, its candidates: the
 * views' endpoints laid end to end with their weights, gathered again when a view syncs and
 * weighed again when stale, so that a pick looks at a few of them, not all (O(1) amortized
 * with even weights, O(log n) with uneven ones: docs/endpoints.md). Everything here runs on
 * the worker's thread; only the slots are shared.
 */
#ifndef RETRYPROXY_PROXY_BALANCE_H
#define RETRYPROXY_PROXY_BALANCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/core/choose.h"
#include "proxy/core/live.h"

struct attempt_side;
struct attempt_target;
struct attempt_url;
struct cfg_route;
struct dns_name;
struct rng;

/* One worker's handle on an endpoint. */
struct endpoint {
    unsigned refs;             /* its view's, and each trial's that picked it */
    uint32_t epoch;            /* the slot's when taken: a later one is another address's */
    struct live_endpoint *le;  /* the shared slot */
    struct attempt_target *to; /* where its transfers go; made on its first pick */
    size_t k;                  /* its upstream's index in the route */
    struct attempt_side *left; /* it left the record: the worker's, whose idle connections to
                                  it close once more when its last attempt lets go */
    struct dns_addr addr;
};

/* A route's endpoints as every worker of one snapshot sees them: each worker's views and
 * candidates (balance.c). A config snapshot as it runs (proxy/core/runtime.h) holds one per
 * route. */
struct bal_route;

/* The worker a pick or a sync is made in: its index among the snapshot's workers (one past
 * them: the first's), its RNG, and its upstream side, where an endpoint that left closes its
 * idle connections (proxy/upstream/attempt.h). */
struct bal_worker {
    unsigned id;
    struct rng *rng;
    struct attempt_side *up;
};

/* The views of route 'r' for 'n_workers' workers, each of its upstreams' endpoints reached
 * through urls[k], named names[k] (NULL: none to follow) with their shared slots in ups[k]:
 * arrays of r->n_upstreams, borrowed (the snapshot holds them and outlives these). NULL out of
 * memory. */
struct bal_route *balance_route_new(const struct cfg_route *r, unsigned n_workers,
                                    struct attempt_url *const *urls, struct dns_name *const *names,
                                    struct live_upstream *const *ups);
/* Frees them (the snapshot is freed). Accepts NULL. */
void balance_route_free(struct bal_route *b);

/* The endpoint for the next attempt of a request on route 'b' that has tried 'tried' (their
 * slots, choose_tried_add(.., e->le)), at 'now_ms', in worker 'w': its first attempt (none
 * tried) in turn from *rr (NULL: an older snapshot's request), a retry at random among those
 * untried (proxy/core/choose.h); with a reference the caller drops with endpoint_unref(). NULL
 * when the route has no endpoint (its names resolve to nothing) or out of memory: the attempt
 * is a connect failure. */
struct endpoint *balance_pick(const struct bal_worker *w, struct bal_route *b,
                              const struct choose_tried *tried, uint64_t now_ms, uint32_t *rr);

/* Worker 'w''s views of route 'b' follow their names now (the resolver woke the worker). */
void balance_sync(const struct bal_worker *w, struct bal_route *b);

void endpoint_unref(struct endpoint *e); /* accepts NULL */

#endif
