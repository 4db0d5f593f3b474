/* eject -- endpoint health on the request path (docs/forwarding.md "Ejecting an upstream that
 * keeps failing", docs/endpoints.md): each attempt's outcome recorded against its endpoint. The
 * state is policy/health.h's, in the endpoint's slot of proxy/core/live.h, so that it survives
 * reloads; proxy/core/balance.c reads it to pick. Every route keeps the endpoints' scores (one
 * lock per attempt); a route without ejection costs nothing more.
 */
#ifndef RETRYPROXY_PROXY_EJECT_H
#define RETRYPROXY_PROXY_EJECT_H

#include <stdint.h>

#include "config/cfg.h"
#include "policy/rng.h"
#include "proxy/core/decide.h"
#include "proxy/http/hlist.h"

struct endpoint;

/* The attempt to endpoint 'e' of route 'r' ended in 'o' (with 'status' and the response's fields
 * 'head' for RETRY_OUT_STATUS) after 'took_us' from its start: its score (policy/score.h) takes
 * it, a failure when r->retry.on names it (what the route retries), on every route; and its
 * health, a failure when r->ejection.on names it, on a route with ejection on. Nothing when the
 * attempt had no endpoint. */
void eject_record(const struct cfg_route *r, const struct endpoint *e, enum retry_outcome o,
                  int status, const struct hlist *head, int grpc, uint64_t took_us, uint64_t now_ms,
                  struct rng *rng);

#endif
