/* balance -- a route's endpoints as one worker sees them, and the pick of one per attempt
 * (docs/endpoints.md).
 *
 * Each upstream of a route names a host (proxy/dns/resolve.h); each of its addresses is an
 * endpoint, whose shared state (health, requests in flight, connections) is a slot of
 * proxy/core/live.h. A worker keeps, per snapshot, route and upstream, a view: its handles on
 * those endpoints, each with its transport target (proxy/upstream/attempt.h), made when first
 * picked. A view follows its name's generation: when the record changes, the next pick (or the
 * wake-up the resolver sends) syncs it, and an endpoint that left gets no new attempt while its
 * idle connections close. Everything here runs on the worker's thread; only the slots are
 * shared.
 */
#ifndef RETRYPROXY_PROXY_BALANCE_H
#define RETRYPROXY_PROXY_BALANCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
    uint64_t bit;               /* its bit in a request's 'tried' */
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

/* The endpoint for the next attempt of a request on route 'x' of 'rt' that has tried 'tried',
 * at 'now_ms': its first attempt ('tried' 0) in turn from *rr (NULL: an older snapshot's
 * request), a retry at random among those untried (proxy/core/choose.h); with a reference the
 * caller drops with endpoint_unref(). NULL when the route has no endpoint (its names resolve to
 * nothing) or out of memory: the attempt is a connect failure. */
struct endpoint *balance_pick(struct worker *w, const struct rt *rt, const struct rt_route *x,
                              uint64_t tried, uint64_t now_ms, uint32_t *rr);

/* Every view of worker 'w' in 'rt' follows its name now (the resolver woke the worker). */
void balance_sync_all(struct worker *w, const struct rt *rt);

void endpoint_unref(struct endpoint *e); /* accepts NULL */

/* Frees the views of route 'x' (its snapshot is freed): 'n' of them. */
void balance_views_free(struct bal_view *v, size_t n);

#endif
