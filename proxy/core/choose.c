#include "proxy/core/choose.h"

#include <stdbool.h>

/* The j-th of the 'n' candidates not in 'avoid', skipping 'skip' (n: none). */
static size_t nth(uint64_t avoid, size_t n, size_t j, size_t skip)
{
    for (size_t i = 0; i < n; i++)
        if (!(avoid & (1ULL << i)) && i != skip && j-- == 0)
            return i;
    return n;
}

size_t choose_balanced(enum cfg_balance b, uint64_t tried, uint64_t ejected, size_t n,
                       const int64_t *load, uint32_t *rr, struct rng *rng)
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
        /* the turn counts over the candidates, so that one left out (ejected) does not hand
         * its share to the next in line; without a turn, any of them */
        size_t j = turn ? *rr % m : m > 1 ? (size_t)rng_between(rng, 0, m - 1) : 0;
        if (turn)
            *rr += 1;
        size_t first = nth(avoid[p], n, j, n);
        if (b != CFG_BALANCE_LEAST_REQUEST || m < 2 || !load)
            return first;
        size_t other = nth(avoid[p], n, (size_t)rng_between(rng, 0, m - 2), first);
        return load[other] < load[first] ? other : first;
    }
    return 0;
}
