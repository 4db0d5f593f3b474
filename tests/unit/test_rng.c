#include <criterion/criterion.h>

#include "policy/rng.h"

/* Expected values come from an independent Python implementation of splitmix64 seeding and
 * xoshiro256** (Blackman and Vigna), not from this code. */
static struct rng seeded(uint64_t seed)
{
    struct rng r;
    rng_seed(&r, seed);
    return r;
}

/* The first four values of the generator seeded 'seed' are exactly 'want'. */
static void expect_sequence(uint64_t seed, const uint64_t want[4])
{
    struct rng r = seeded(seed);
    for (int i = 0; i < 4; i++) {
        uint64_t got = rng_next(&r);
        cr_expect_eq(got, want[i], "seed %llu, value %d: %#llx, want %#llx",
                     (unsigned long long)seed, i + 1, (unsigned long long)got,
                     (unsigned long long)want[i]);
    }
}

Test(rng, seed_0_reproduces_reference_sequence)
{
    static const uint64_t want[4] = { 0x99ec5f36cb75f2b4ULL, 0xbf6e1f784956452aULL,
                                      0x1a5f849d4933e6e0ULL, 0x6aa594f1262d2d2cULL };
    expect_sequence(0, want);
}

Test(rng, seed_42_reproduces_reference_sequence)
{
    static const uint64_t want[4] = { 0x15780b2e0c2ec716ULL, 0x6104d9866d113a7eULL,
                                      0xae17533239e499a1ULL, 0xecb8ad4703b360a1ULL };
    expect_sequence(42, want);
}

Test(rng, between_stays_inclusive_and_hits_both_ends)
{
    struct rng r = seeded(7);
    int seen[7] = { 0 };
    for (int i = 0; i < 10000; i++) {
        uint64_t v = rng_between(&r, 3, 9);
        cr_assert(v >= 3 && v <= 9, "value %llu outside [3, 9]", (unsigned long long)v);
        seen[v - 3]++;
    }
    /* Each of 7 values expected ~1428 times; 1200 is more than 6 standard deviations below. */
    for (int i = 0; i < 7; i++)
        cr_expect_gt(seen[i], 1200, "value %d seen only %d times", i + 3, seen[i]);
}

Test(rng, between_with_empty_or_single_range_returns_low)
{
    struct rng r = seeded(1);
    cr_expect_eq(rng_between(&r, 5, 5), 5);
    cr_expect_eq(rng_between(&r, 9, 2), 9);
}

Test(rng, between_full_range_does_not_hang)
{
    struct rng r = seeded(3);
    uint64_t a = rng_between(&r, 0, UINT64_MAX), b = rng_between(&r, 0, UINT64_MAX);
    cr_expect_neq(a, b);
}

Test(rng, unit_is_in_half_open_interval_with_mean_one_half)
{
    struct rng r = seeded(11);
    double sum = 0;
    for (int i = 0; i < 20000; i++) {
        double u = rng_unit(&r);
        cr_assert(u >= 0.0 && u < 1.0);
        sum += u;
    }
    /* sd of the mean: 0.2887 / sqrt(20000) = 0.002; allow 5 sd. */
    cr_expect(sum / 20000 > 0.49 && sum / 20000 < 0.51, "mean %f", sum / 20000);
}
