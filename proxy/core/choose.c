#include "proxy/core/choose.h"

/* The j-th of the 'n' candidates not in 'avoid', from 'start' on, skipping 'skip' (n: none). */
static size_t nth(uint64_t avoid, size_t n, size_t start, size_t j, size_t skip)
{
    for (size_t k = 0; k < n; k++) {
        size_t i = (start + k) % n;
        if (!(avoid & (1ULL << i)) && i != skip && j-- == 0)
            return i;
    }
    return n;
}

size_t choose_balanced(enum cfg_balance b, uint64_t tried, uint64_t ejected, size_t n,
                       const int64_t *load, uint32_t *rr, struct rng *rng)
{
    if (n > 64)
        n = 64;
    if (n <= 1)
        return 0;
    size_t start;
    if (rr && b != CFG_BALANCE_RANDOM) {
        start = *rr % n;
        *rr = (uint32_t)(start + 1);
    } else {
        start = (size_t)rng_between(rng, 0, n - 1);
    }
    const uint64_t avoid[] = { tried | ejected, ejected, tried, 0 };
    for (size_t p = 0; p < sizeof(avoid) / sizeof(avoid[0]); p++) {
        uint64_t mask = n == 64 ? ~0ULL : (1ULL << n) - 1;
        size_t m = (size_t)__builtin_popcountll(~avoid[p] & mask);
        if (m == 0)
            continue;
        size_t first = nth(avoid[p], n, start, 0, n);
        if (b != CFG_BALANCE_LEAST_REQUEST || m < 2 || !load)
            return first; /* random's start was random */
        size_t other = nth(avoid[p], n, start, (size_t)rng_between(rng, 0, m - 2), first);
        return load[other] < load[first] ? other : first;
    }
    return start;
}
