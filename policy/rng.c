#include "policy/rng.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t v, int k)
{
    return (v << k) | (v >> (64 - k));
}

void rng_seed(struct rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;

    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Rejection sampling on the top of the 64-bit range: draws below 'limit' would make the low
 * residues more likely than the high ones, so they are drawn again (at most a few times on
 * average for any span). */
uint64_t rng_between(struct rng *r, uint64_t lo, uint64_t hi)
{
    if (lo >= hi)
        return lo;
    uint64_t span = hi - lo + 1; /* 0 means the full 2^64 range */
    if (span == 0)
        return rng_next(r);
    uint64_t limit = -span % span; /* 2^64 mod span */
    uint64_t x;
    do {
        x = rng_next(r);
    } while (x < limit);
    return lo + x % span;
}

double rng_unit(struct rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}
