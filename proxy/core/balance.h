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

struct rt;
struct rt_route;
struct worker;
struct upstream;
struct upstream_target;

/* One worker's handle on an endpoint. */
struct endpoint {
    unsigned refs;              /* its view's, and each trial's that picked it */
    uint32_t epoch;             /* the slot's when taken: a later one is another address's */
    struct live_endpoint *le;   /* the shared slot */
    struct upstream_target *to; /* where its transfers go; made on its first pick */
    size_t k;                   /* its upstream's index in the route */
    struct upstream *left;      /* it left the record: the worker's, whose idle connections to
                                   it close once more when its last attempt lets go */
    struct dns_addr addr;
};

/* A worker's endpoints of one upstream of a route in one snapshot. */
struct bal_view {
    uint64_t gen; /* the name's generation it follows; 0: not synced yet */
    size_t n;
    struct endpoint **ep;
};

/* A worker's candidates of one route (balance.c). */
struct bal_set;

/* The endpoint for the next attempt of a request on route 'x' of 'rt' that has tried 'tried'
 * (their slots, choose_tried_add(.., e->le)), at 'now_ms': its first attempt (none tried) in
 * turn from *rr (NULL: an older snapshot's request), a retry at random among those untried
 * (proxy/core/choose.h); with a reference the caller drops with endpoint_unref(). NULL when
 * the route has no endpoint (its names resolve to nothing) or out of memory: the attempt is a
 * connect failure. */
struct endpoint *balance_pick(struct worker *w, const struct rt *rt, const struct rt_route *x,
                              const struct choose_tried *tried, uint64_t now_ms, uint32_t *rr);

/* Every view of worker 'w' in 'rt' follows its name now (the resolver woke the worker). */
void balance_sync_all(struct worker *w, const struct rt *rt);

void endpoint_unref(struct endpoint *e); /* accepts NULL */

/* Frees the views of route 'x' (its snapshot is freed): 'n' of them. */
void balance_views_free(struct bal_view *v, size_t n);

/* A route's candidates for 'n' workers, empty; NULL out of memory. */
struct bal_set *balance_sets_new(size_t n);
void balance_sets_free(struct bal_set *s, size_t n); /* accepts NULL */

#endif
