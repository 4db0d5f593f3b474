/* rng -- small, seedable pseudo-random generator for backoff jitter.
 *
 * xoshiro256** (Blackman and Vigna), seeded through splitmix64 so that any 64-bit seed,
 * including 0, gives a well-mixed state. Not for cryptography. A generator belongs to one
 * thread at a time; nothing here is global, so tests replay a sequence exactly from its seed.
 */
#ifndef RETRYPROXY_POLICY_RNG_H
#define RETRYPROXY_POLICY_RNG_H

#include <stdint.h>

struct rng {
    uint64_t s[4];
};

/* Seeds 'r' from 'seed'. The same seed always gives the same sequence. */
void rng_seed(struct rng *r, uint64_t seed);

/* Next 64 uniformly distributed bits. */
uint64_t rng_next(struct rng *r);

/* Uniform integer in [lo, hi] (both inclusive), without modulo bias. lo > hi returns lo. */
uint64_t rng_between(struct rng *r, uint64_t lo, uint64_t hi);

/* Uniform double in [0, 1), 53 bits of precision. */
double rng_unit(struct rng *r);

#endif
