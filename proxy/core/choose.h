/* choose -- the rule that picks a route's endpoint for an attempt (docs/endpoints.md), on bits
 * and counts alone: away from the endpoints this request already tried and from those ejected,
 * then by the route's balance. Pure: proxy/core/balance.c gives it the candidates.
 */
#ifndef RETRYPROXY_PROXY_CHOOSE_H
#define RETRYPROXY_PROXY_CHOOSE_H

#include <stddef.h>
#include <stdint.h>

#include "config/cfg.h"
#include "policy/rng.h"

/* Candidate i for the next attempt of a request, among 'n' (bit i of 'tried' and 'ejected'; at
 * most 64). Preferred in this order: one neither tried nor ejected, one not ejected, one not
 * tried (every endpoint ejected: all are used again, Envoy's panic mode), any. Among those, by
 * 'b':
 * - round_robin: a request's first attempt ('tried' 0) takes the route's turn, *rr, counted
 *   over those candidates, and moves it on by one; a retry or a hedge neither reads nor moves
 *   it and takes any of them at random, as does a request of an older config snapshot ('rr'
 *   NULL: its turn is gone). So retries leave the first attempts' rotation as it was: each
 *   endpoint gets its share of them, a failing one too, and no more;
 * - random: any;
 * - least_request: the one round_robin would take and one other at random, the one with fewer
 *   requests in flight ('load') winning, the first on a tie: requests one after another go
 *   round-robin, a slow or overloaded endpoint gets fewer. */
size_t choose_balanced(enum cfg_balance b, uint64_t tried, uint64_t ejected, size_t n,
                       const int64_t *load, uint32_t *rr, struct rng *rng);

#endif
