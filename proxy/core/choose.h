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
 * 'b', each candidate in proportion to its 'weight' (policy/score.h: lower for an endpoint that
 * fails or is slow; NULL, or all the same: even):
 * - round_robin: a request's first attempt ('tried' 0) takes the route's turn, *rr, counted
 *   over those candidates, and moves it on by one; a retry or a hedge neither reads nor moves
 *   it and takes one of them at random, as does a request of an older config snapshot ('rr'
 *   NULL: its turn is gone). So retries leave the first attempts' rotation as it was: each
 *   endpoint gets its share of them, by its weight, and no more. With even weights the turn is
 *   a plain rotation; with uneven ones, the turn's point on the weights laid end to end
 *   follows a golden-ratio sequence: each candidate gets its share within a few picks;
 * - random: one at random, by weight;
 * - least_request: the one round_robin would take and one other at random by weight; the one
 *   of lower cost, (requests in flight ('load') + 1) / weight, wins, the first on a tie:
 *   requests one after another go round-robin, a slow or overloaded endpoint gets fewer. A turn
 *   that falls on an endpoint at SCORE_WEIGHT_FLOOR is taken as it is (it would lose every
 *   comparison and never be tried again).
 * O(n) per pick, as building the candidates is. */
size_t choose_balanced(enum cfg_balance b, uint64_t tried, uint64_t ejected, size_t n,
                       const int64_t *load, const uint32_t *weight, uint32_t *rr, struct rng *rng);

#endif
