#include "proxy/core/choose.h"

#include "proxy/core/eject.h"

size_t choose_upstream(const struct rt_route *x, size_t n, uint64_t tried, uint64_t now_ms,
                       uint32_t *rr, struct rng *rng)
{
    return choose_among(tried, eject_mask(x, n, now_ms), n, rr, rng);
}

size_t choose_among(uint64_t tried, uint64_t ejected, size_t n, uint32_t *rr, struct rng *rng)
{
    size_t start;
    if (rr) {
        start = *rr % n;
        *rr = (uint32_t)(start + 1);
    } else {
        start = (size_t)rng_between(rng, 0, n - 1);
    }
    const uint64_t avoid[] = { tried | ejected, ejected, tried };
    for (size_t p = 0; p < sizeof(avoid) / sizeof(avoid[0]); p++) {
        for (size_t k = 0; k < n && k < 64; k++) {
            size_t i = (start + k) % n;
            if (i >= 64 || !(avoid[p] & (1ULL << i)))
                return i;
        }
    }
    return start;
}
