#include "proxy/core/choose.h"

#include <stdbool.h>

#include "policy/score.h"

/* The j-th of the 'n' candidates not in 'avoid', skipping 'skip' (n: none). */
static size_t nth(uint64_t avoid, size_t n, size_t j, size_t skip)
{
    for (size_t i = 0; i < n; i++)
        if (!(avoid & (1ULL << i)) && i != skip && j-- == 0)
            return i;
    return n;
}

/* The candidate not in 'avoid' (nor 'skip') whose span of weight holds 'x', the spans laid end
 * to end in index order. */
static size_t at_weight(uint64_t avoid, size_t n, const uint32_t *w, uint64_t x, size_t skip)
{
    size_t last = n;
    for (size_t i = 0; i < n; i++) {
        if ((avoid & (1ULL << i)) || i == skip)
            continue;
        if (x < w[i])
            return i;
        x -= w[i];
        last = i;
    }
    return last; /* not reached with x below the sum */
}

size_t choose_balanced(enum cfg_balance b, uint64_t tried, uint64_t ejected, size_t n,
                       const int64_t *load, const uint32_t *weight, uint32_t *rr, struct rng *rng)
{
    if (n > 64)
        n = 64;
    if (n <= 1)
        return 0;
    /* Only a request's first attempt takes a turn: a retry that took one too would hand the
     * next request's first attempt to the endpoint this one just left (with two endpoints, one
     * failing, every first attempt would go to the failing one). */
    bool turn = rr && b != CFG_BALANCE_RANDOM && tried == 0;
    const uint64_t avoid[] = { tried | ejected, ejected, tried, 0 };
    uint64_t mask = n == 64 ? ~0ULL : (1ULL << n) - 1;
    for (size_t p = 0; p < sizeof(avoid) / sizeof(avoid[0]); p++) {
        size_t m = (size_t)__builtin_popcountll(~avoid[p] & mask);
        if (m == 0)
            continue;
        uint64_t sum = 0;
        uint32_t lo = UINT32_MAX, hi = 0;
        for (size_t i = 0; weight && i < n; i++) {
            if (avoid[p] & (1ULL << i))
                continue;
            sum += weight[i];
            lo = weight[i] < lo ? weight[i] : lo;
            hi = weight[i] > hi ? weight[i] : hi;
        }
        bool even = !weight || lo == hi || lo == 0;
        size_t first;
        if (even) {
            /* the turn counts over the candidates, so that one left out (ejected) does not
             * hand its share to the next in line; without a turn, any of them */
            size_t j = turn ? *rr % m : m > 1 ? (size_t)rng_between(rng, 0, m - 1) : 0;
            first = nth(avoid[p], n, j, n);
        } else {
            /* weighted: the turn's point is the fractional part of turn x golden ratio, spread
             * evenly over the sum of the weights whatever they are (a low-discrepancy
             * sequence: each candidate's count stays within a few picks of its share); without
             * a turn, a random point */
            uint64_t x = turn ? (((uint64_t)*rr * 0x9E3779B97F4A7C15ULL) >> 32) * sum >> 32
                              : rng_between(rng, 0, sum - 1);
            first = at_weight(avoid[p], n, weight, x, n);
        }
        if (turn)
            *rr += 1;
        if (b != CFG_BALANCE_LEAST_REQUEST || m < 2 || !load)
            return first;
        /* the turn gave an endpoint kept at its floor weight: it is tried as it is, or under
         * least_request it would never be (it loses every comparison), nor its recovery seen */
        if (!even && turn && weight[first] <= SCORE_WEIGHT_FLOOR)
            return first;
        size_t other = even ? nth(avoid[p], n, (size_t)rng_between(rng, 0, m - 2), first)
                            : at_weight(avoid[p], n, weight,
                                        rng_between(rng, 0, sum - weight[first] - 1), first);
        /* equal loads: the turn stands (requests one after another follow the weights alone);
         * else Linkerd's cost, (in flight + 1) / weight, compared crosswise */
        if (even || load[other] == load[first])
            return load[other] < load[first] ? other : first;
        uint64_t cost_other = (uint64_t)(load[other] + 1) * weight[first];
        uint64_t cost_first = (uint64_t)(load[first] + 1) * weight[other];
        return cost_other < cost_first ? other : first;
    }
    return 0;
}
