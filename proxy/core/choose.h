/* choose -- the rule that picks a route's endpoint for an attempt (docs/endpoints.md), on bits
 * and counts alone: away from the endpoints this request already tried and from those ejected,
 * then by the route's balance. Pure: proxy/core/balance.c gives it the candidates. Two forms
 * of one rule: choose_balanced() on 64-bit masks for a few candidates, O(n) and exact;
 * choose_many() for any number, O(log n) expected per pick, looking at a few candidates only.
 */
#ifndef RETRYPROXY_PROXY_CHOOSE_H
#define RETRYPROXY_PROXY_CHOOSE_H

#include <stdbool.h>
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
 * O(n) per pick: for sets of CHOOSE_MASK_MAX candidates at most. */
#define CHOOSE_MASK_MAX 64
size_t choose_balanced(enum cfg_balance b, uint64_t tried, uint64_t ejected, size_t n,
                       const int64_t *load, const uint32_t *weight, uint32_t *rr, struct rng *rng);

/* What choose_many() asks of a candidate, read live when it looks at it. */
enum { CHOOSE_TRIED = 1, CHOOSE_EJECTED = 2 };
struct choose_set {
    size_t n;
    const uint32_t *weight; /* each candidate's (policy/score.h); NULL: all the same */
    const uint64_t *cum;    /* with 'weight': cum[i] = weight[0] + ... + weight[i] */
    unsigned (*state)(void *ctx, size_t i); /* CHOOSE_TRIED | CHOOSE_EJECTED */
    int64_t (*load)(void *ctx, size_t i);   /* in flight; NULL: none known */
    void *ctx;
};

/* choose_balanced()'s rule over any number of candidates, without a pass over them: a point on
 * the weights laid end to end (the turn's, as choose_balanced() places it, or a random one)
 * and a binary search in 'cum' (O(log n); O(1) with even weights) give a candidate; one tried
 * or ejected is put back and another drawn at random by weight, up to CHOOSE_DRAWS times
 * (rejection sampling: those kept still come in proportion to their weights), and only when
 * every draw was refused does a pass over all of them take one in choose_balanced()'s order
 * of preference (O(n): most of the set tried or ejected). 'retry': the request's attempt is a
 * retry or a hedge (no turn). least_request's second choice is drawn the same way. */
#define CHOOSE_DRAWS 16
size_t choose_many(enum cfg_balance b, const struct choose_set *s, bool retry, uint32_t *rr,
                   struct rng *rng);

/* A request's tried endpoints, by identity (proxy/core/balance.c uses the slot's address): the
 * first inline, since most requests make one attempt, the others in a small array on the heap
 * that grows as attempts do (bounded by retry.max_attempts and hedges). Zeroed: empty. */
struct choose_tried_more;
struct choose_tried {
    const void *one;
    struct choose_tried_more *more;
};
bool choose_tried_more_has(const struct choose_tried_more *m, const void *id);
/* 'id' is in 't' (inline: a first attempt, and most retries, ask only of the first). */
static inline bool choose_tried_has(const struct choose_tried *t, const void *id)
{
    if (!id || !t->one)
        return false;
    return t->one == id || (t->more && choose_tried_more_has(t->more, id));
}
/* Adds 'id' unless it is there. Out of memory it is not kept: a later retry may then go back
 * to it, as when every endpoint has been tried. */
void choose_tried_add(struct choose_tried *t, const void *id);
void choose_tried_free(struct choose_tried *t); /* empty again */

#endif
