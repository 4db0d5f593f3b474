/* eject -- upstream health on the request path (docs/forwarding.md "Choosing an upstream"):
 * which of a route's upstreams are ejected now, and each attempt's outcome recorded against its
 * upstream. The state is policy/health.h's, kept by route name and upstream URL in
 * proxy/core/live.h so that it survives reloads; a route without ejection costs a NULL test.
 */
#ifndef RETRYPROXY_PROXY_EJECT_H
#define RETRYPROXY_PROXY_EJECT_H

#include <stdint.h>

#include "config/cfg.h"
#include "policy/rng.h"
#include "proxy/core/decide.h"
#include "proxy/http/hlist.h"
#include "proxy/core/runtime.h"

/* The upstreams of route 'x' ejected at 'now_ms', as bits (upstream i is bit i; those past 63
 * are never reported). 0 when the route's ejection is off. No lock. */
uint64_t eject_mask(const struct rt_route *x, size_t n_upstreams, uint64_t now_ms);

/* The attempt to upstream 'u' of route 'r' (bound as 'x') ended in 'o' (with 'status' and the
 * response's fields 'head' for RETRY_OUT_STATUS): a failure when r->ejection.on names it, else a
 * success. Nothing when the route's ejection is off. */
void eject_record(const struct rt_route *x, const struct cfg_route *r, const struct cfg_upstream *u,
                  enum retry_outcome o, int status, const struct hlist *head, int grpc,
                  uint64_t now_ms, struct rng *rng);

#endif
