/* choose -- which of a route's upstreams an attempt goes to (docs/forwarding.md "Choosing an
 * upstream"): round-robin over the route's list, away from the upstreams this request already
 * tried and from those ejected (proxy/core/eject.h). The one place the choice is made, so that a
 * balancer over a service's endpoints (issue 29) replaces it here and nowhere else.
 */
#ifndef RETRYPROXY_PROXY_CHOOSE_H
#define RETRYPROXY_PROXY_CHOOSE_H

#include <stddef.h>
#include <stdint.h>

#include "policy/rng.h"

struct rt_route;

/* The upstream (its index in the route's list of 'n') for the next attempt of a request that
 * has tried 'tried' (bits) on route 'x' at 'now_ms'. Round-robin from *rr (advanced), or from a
 * random one when 'rr' is NULL (a request of an older config snapshot, whose turn is gone). */
size_t choose_upstream(const struct rt_route *x, size_t n, uint64_t tried, uint64_t now_ms,
                       uint32_t *rr, struct rng *rng);

/* The rule itself, on bits (upstream i is bit i; those past 63 are never avoided): preferred
 * in this order, one neither 'tried' nor 'ejected', one not ejected, one not tried (every
 * upstream ejected: all are used again, Envoy's panic mode), the one in turn. */
size_t choose_among(uint64_t tried, uint64_t ejected, size_t n, uint32_t *rr, struct rng *rng);

#endif
