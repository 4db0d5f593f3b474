#include <criterion/criterion.h>

#include "policy/backoff.h"

#define SAMPLES 20000

static struct backoff_spec spec(enum backoff_policy p, uint32_t base, uint32_t cap)
{
    return (struct backoff_spec){ .policy = p,
                                  .jitter = JITTER_NONE,
                                  .scope = BACKOFF_SCOPE_REQUEST,
                                  .base_ms = base,
                                  .cap_ms = cap,
                                  .factor = 2.0,
                                  .jitter_ratio = 0.2 };
}

static void expect_schedule(const struct backoff_spec *b, const uint32_t *want, uint32_t n)
{
    struct rng r;
    uint32_t got[32];
    rng_seed(&r, 1);
    backoff_schedule(b, n, &r, got);
    for (uint32_t i = 0; i < n; i++)
        cr_expect_eq(got[i], want[i], "retry %u: got %u, want %u", i + 1, got[i], want[i]);
}

/* The schedule of 'spec_' with the RNG seeded 1 is exactly the delays that follow. */
#define EXPECT_SCHEDULE(spec_, ...)                                                                \
    do {                                                                                           \
        const struct backoff_spec s_ = (spec_);                                                    \
        const uint32_t want_[] = { __VA_ARGS__ };                                                  \
        expect_schedule(&s_, want_, sizeof(want_) / sizeof(want_[0]));                             \
    } while (0)

static struct backoff_spec with_steps(struct backoff_spec b, uint32_t steps)
{
    b.steps = steps;
    return b;
}

/* ---- the exact sequences of docs/backoff.md ---- */

Test(backoff, exponential_matches_seed_sequence)
{
    EXPECT_SCHEDULE(spec(BACKOFF_EXPONENTIAL, 10, 10000), 10, 20, 40, 80, 160, 320, 640, 1280);
}

Test(backoff, fibonacci_matches_seed_sequence)
{
    EXPECT_SCHEDULE(spec(BACKOFF_FIBONACCI, 10, 10000), 10, 10, 20, 30, 50, 80, 130);
}

Test(backoff, steps_stop_growth_like_kubernetes)
{
    EXPECT_SCHEDULE(with_steps(spec(BACKOFF_EXPONENTIAL, 10, 10000), 3), 10, 20, 40, 80, 80);
}

Test(backoff, steps_apply_to_fibonacci)
{
    EXPECT_SCHEDULE(with_steps(spec(BACKOFF_FIBONACCI, 10, 10000), 2), 10, 10, 20, 20, 20);
}

Test(backoff, cap_limits_exponential)
{
    EXPECT_SCHEDULE(spec(BACKOFF_EXPONENTIAL, 10, 30), 10, 20, 30, 30);
}

Test(backoff, fixed_is_base_every_time)
{
    EXPECT_SCHEDULE(spec(BACKOFF_FIXED, 250, 10000), 250, 250, 250, 250);
}

Test(backoff, exponential_with_fractional_factor_rounds_to_nearest_ms)
{
    struct backoff_spec b = spec(BACKOFF_EXPONENTIAL, 100, 10000);
    b.factor = 1.5;
    /* 100, 150, 225, 337.5 -> 338, 506.25 -> 506 */
    EXPECT_SCHEDULE(b, 100, 150, 225, 338, 506);
}

Test(backoff, huge_retry_numbers_saturate_at_cap_quickly)
{
    struct rng r;
    rng_seed(&r, 1);
    struct backoff_spec e = spec(BACKOFF_EXPONENTIAL, 1, 86400000);
    e.factor = 100.0;
    cr_expect_eq(backoff_delay(&e, UINT32_MAX, 0, &r), 86400000);
    struct backoff_spec f = spec(BACKOFF_FIBONACCI, 1, 86400000);
    cr_expect_eq(backoff_delay(&f, UINT32_MAX, 0, &r), 86400000);
    cr_expect_eq(backoff_delay(&f, 40, 0, &r), 86400000); /* F(40) = 102334155 */
    cr_expect_eq(backoff_delay(&f, 39, 0, &r), 63245986); /* F(39) */
}

/* The delay of retry 'n' of 'b', with an RNG of its own seeded 'seed'. */
static uint32_t delay_seeded(struct backoff_spec b, uint32_t n, uint64_t seed)
{
    struct rng r;
    rng_seed(&r, seed);
    return backoff_delay(&b, n, 0, &r);
}

Test(backoff, retry_zero_is_treated_as_first_retry)
{
    cr_expect_eq(delay_seeded(spec(BACKOFF_EXPONENTIAL, 10, 1000), 0, 1), 10);
}

/* ---- random policies ---- */

Test(backoff, random_policy_is_uniform_in_half_open_range)
{
    struct rng r;
    rng_seed(&r, 5);
    struct backoff_spec b = spec(BACKOFF_RANDOM, 0, 10);
    int seen[10] = { 0 };
    for (int i = 0; i < SAMPLES; i++) {
        uint32_t d = backoff_delay(&b, 1, 0, &r);
        cr_assert_lt(d, 10, "U[0, 10) gave %u", d);
        seen[d]++;
    }
    for (int i = 0; i < 10; i++) /* ~2000 each */
        cr_expect_gt(seen[i], 1700, "%d seen %d times", i, seen[i]);
}

Test(backoff, random_policy_with_equal_base_and_cap_is_base)
{
    cr_expect_eq(delay_seeded(spec(BACKOFF_RANDOM, 40, 40), 1, 5), 40);
}

Test(backoff, decorrelated_stays_within_its_bounds)
{
    struct backoff_spec b = spec(BACKOFF_DECORRELATED, 10, 1000);
    for (uint64_t seed = 0; seed < 500; seed++) {
        struct rng r;
        rng_seed(&r, seed);
        uint32_t d[30];
        backoff_schedule(&b, 30, &r, d);
        cr_assert_eq(d[0], 10);
        for (int n = 1; n < 30; n++) {
            uint32_t hi = 3 * d[n - 1] < 1000 ? 3 * d[n - 1] : 1000;
            cr_assert(d[n] >= 10 && d[n] <= hi, "seed %llu retry %d: %u not in [10, %u]",
                      (unsigned long long)seed, n + 1, d[n], hi);
            /* U[base, 3*prev) is half-open: 3*prev itself is never drawn (unless capped). */
            if (3 * d[n - 1] < 1000)
                cr_assert_lt(d[n], 3 * d[n - 1]);
        }
    }
}

Test(backoff, decorrelated_reaches_the_cap)
{
    struct rng r;
    rng_seed(&r, 9);
    struct backoff_spec b = spec(BACKOFF_DECORRELATED, 10, 200);
    uint32_t d[60];
    backoff_schedule(&b, 60, &r, d);
    int capped = 0;
    for (int i = 0; i < 60; i++)
        capped += d[i] == 200;
    cr_expect_gt(capped, 0, "a long decorrelated sequence should hit the cap");
}

/* ---- jitter: bounds and mean over SAMPLES seeded draws, d = 1000 ---- */

struct stats {
    uint32_t min, max;
    double mean;
};

static struct stats sample(struct backoff_spec b, uint32_t n)
{
    struct rng r;
    rng_seed(&r, 12345);
    struct stats s = { UINT32_MAX, 0, 0 };
    double sum = 0;
    for (int i = 0; i < SAMPLES; i++) {
        uint32_t d = backoff_delay(&b, n, 0, &r);
        s.min = d < s.min ? d : s.min;
        s.max = d > s.max ? d : s.max;
        sum += d;
    }
    s.mean = sum / SAMPLES;
    return s;
}

/* 'tol' is about 5 standard deviations of the sample mean for the interval's width. */
static void expect_stats(struct stats s, uint32_t lo, uint32_t hi, double mean, double tol)
{
    cr_expect_eq(s.min, lo, "min %u, want %u", s.min, lo);
    cr_expect_eq(s.max, hi, "max %u, want %u", s.max, hi);
    cr_expect(s.mean > mean - tol && s.mean < mean + tol, "mean %.2f, want %.2f +- %.2f", s.mean,
              mean, tol);
}

static struct backoff_spec jspec(enum backoff_jitter j)
{
    struct backoff_spec b = spec(BACKOFF_FIXED, 1000, 100000);
    b.jitter = j;
    return b;
}

Test(backoff, jitter_none_is_exact)
{
    expect_stats(sample(jspec(JITTER_NONE), 1), 1000, 1000, 1000, 0.001);
}

Test(backoff, jitter_full_is_uniform_zero_to_d_inclusive)
{
    /* U[0, 1000]: mean 500, sd 289, sd of mean 2.0 */
    expect_stats(sample(jspec(JITTER_FULL), 1), 0, 1000, 500, 10);
}

Test(backoff, jitter_equal_is_half_plus_uniform_half)
{
    /* 500 + U[0, 500]: mean 750, sd 144, sd of mean 1.0 */
    expect_stats(sample(jspec(JITTER_EQUAL), 1), 500, 1000, 750, 5);
}

Test(backoff, jitter_equal_keeps_odd_delays_within_d)
{
    struct backoff_spec b = jspec(JITTER_EQUAL);
    b.base_ms = 7;
    /* 7 - 3 + U[0, 3]: 4..7 */
    expect_stats(sample(b, 1), 4, 7, 5.5, 0.05);
}

Test(backoff, jitter_proportional_spreads_both_ways)
{
    /* 1000 * (1 + U[-0.2, 0.2]): 800..1200, mean 1000, sd 115, sd of mean 0.8 */
    expect_stats(sample(jspec(JITTER_PROPORTIONAL), 1), 800, 1200, 1000, 4);
}

Test(backoff, jitter_additive_adds_up_to_ratio_exclusive)
{
    /* 1000 + U[0, 200): 1000..1199, mean 1099.5, sd 58, sd of mean 0.4 */
    expect_stats(sample(jspec(JITTER_ADDITIVE), 1), 1000, 1199, 1099.5, 2);
}

Test(backoff, jitter_bounded_is_between_base_and_d)
{
    struct backoff_spec b = spec(BACKOFF_EXPONENTIAL, 100, 100000);
    b.jitter = JITTER_BOUNDED;
    /* retry 4: d = 800; U[100, 800): 100..799, mean 449.5, sd 202, sd of mean 1.4 */
    expect_stats(sample(b, 4), 100, 799, 449.5, 7);
}

Test(backoff, jitter_constant_adds_up_to_jitter_ms_exclusive)
{
    struct backoff_spec b = jspec(JITTER_CONSTANT);
    b.jitter_ms = 50;
    /* 1000 + U[0, 50): 1000..1049, mean 1024.5, sd 14.4, sd of mean 0.1 */
    expect_stats(sample(b, 1), 1000, 1049, 1024.5, 0.6);
}

Test(backoff, jitter_with_zero_spread_is_exact)
{
    struct backoff_spec a = jspec(JITTER_ADDITIVE), c = jspec(JITTER_CONSTANT);
    a.jitter_ratio = 0;
    c.jitter_ms = 0;
    expect_stats(sample(a, 1), 1000, 1000, 1000, 0.001);
    expect_stats(sample(c, 1), 1000, 1000, 1000, 0.001);
}

Test(backoff, cap_is_a_hard_limit_after_jitter)
{
    struct backoff_spec b = jspec(JITTER_PROPORTIONAL);
    b.cap_ms = 1000; /* d = 1000 = cap: the upper half of the spread is cut off */
    struct stats s = sample(b, 1);
    cr_expect_eq(s.max, 1000);
    cr_expect_eq(s.min, 800);
    struct backoff_spec c = jspec(JITTER_CONSTANT);
    c.jitter_ms = 500;
    c.cap_ms = 1100;
    cr_expect_eq(sample(c, 1).max, 1100);
}

Test(backoff, same_seed_same_delays_different_seed_different_delays)
{
    struct backoff_spec b = spec(BACKOFF_EXPONENTIAL, 100, 100000);
    b.jitter = JITTER_FULL;
    uint32_t x[8], y[8], z[8];
    struct rng r;
    rng_seed(&r, 77);
    backoff_schedule(&b, 8, &r, x);
    rng_seed(&r, 77);
    backoff_schedule(&b, 8, &r, y);
    rng_seed(&r, 78);
    backoff_schedule(&b, 8, &r, z);
    cr_expect_arr_eq(x, y, sizeof(x));
    cr_expect_neq(memcmp(x, z, sizeof(x)), 0);
}

/* ---- sequences and route scope, with a fake clock ---- */

/* One call of backoff_seq_next(): the clock reading it is given and the delay it must return. */
struct tick {
    uint64_t now_ms;
    uint32_t want;
};

/* Runs one sequence of 'b' from its start (RNG seeded 1) through the ticks and returns how many
 * retries the sequence then counts. */
static uint32_t expect_seq(const struct backoff_spec *b, const struct tick *t, size_t n)
{
    struct rng r;
    rng_seed(&r, 1);
    struct backoff_seq s;
    backoff_seq_reset(&s);
    for (size_t i = 0; i < n; i++) {
        uint32_t got = backoff_seq_next(&s, b, t[i].now_ms, &r);
        cr_expect_eq(got, t[i].want, "call %zu at %llu ms: got %u, want %u", i + 1,
                     (unsigned long long)t[i].now_ms, got, t[i].want);
    }
    return s.n;
}

#define EXPECT_SEQ(b, ...)                                                                         \
    do {                                                                                           \
        const struct tick t_[] = { __VA_ARGS__ };                                                  \
        expect_seq((b), t_, sizeof(t_) / sizeof(t_[0]));                                           \
    } while (0)

Test(backoff, route_scope_resets_after_quiet_period)
{
    struct backoff_spec b = spec(BACKOFF_EXPONENTIAL, 10, 100000);
    b.scope = BACKOFF_SCOPE_ROUTE;
    b.reset_after_ms = 1000;
    const struct tick t[] = {
        { 5000, 10 }, { 5100, 20 },
        { 5200, 40 }, { 6199, 80 }, /* 999 ms without a retry: still the same sequence */
        { 7199, 10 },               /* exactly reset_after_ms without a retry: back to the start */
        { 7200, 20 },
    };
    cr_expect_eq(expect_seq(&b, t, sizeof(t) / sizeof(t[0])), 2);
}

Test(backoff, route_scope_without_reset_after_never_resets)
{
    struct backoff_spec b = spec(BACKOFF_EXPONENTIAL, 10, 100000);
    b.scope = BACKOFF_SCOPE_ROUTE;
    EXPECT_SEQ(&b, { 0, 10 }, { 1000000000, 20 });
}

Test(backoff, request_scope_ignores_the_clock)
{
    struct backoff_spec b = spec(BACKOFF_EXPONENTIAL, 10, 100000);
    b.reset_after_ms = 1; /* only meaningful with scope route */
    EXPECT_SEQ(&b, { 0, 10 }, { 100000, 20 });
}

Test(backoff, route_scope_clock_going_backwards_does_not_reset)
{
    struct backoff_spec b = spec(BACKOFF_EXPONENTIAL, 10, 100000);
    b.scope = BACKOFF_SCOPE_ROUTE;
    b.reset_after_ms = 100;
    EXPECT_SEQ(&b, { 5000, 10 }, { 10, 20 });
}

Test(backoff, decorrelated_sequence_uses_previous_delay)
{
    struct rng r;
    rng_seed(&r, 3);
    struct backoff_spec b = spec(BACKOFF_DECORRELATED, 100, 100000);
    struct backoff_seq s;
    backoff_seq_reset(&s);
    uint32_t prev = backoff_seq_next(&s, &b, 0, &r);
    cr_expect_eq(prev, 100);
    for (int i = 0; i < 20; i++) {
        uint32_t d = backoff_seq_next(&s, &b, 0, &r);
        cr_assert(d >= 100 && d < 3 * prev, "%u not in [100, %u)", d, 3 * prev);
        prev = d;
    }
}

Test(backoff, names_round_trip)
{
    cr_expect_str_eq(backoff_policy_names[BACKOFF_DECORRELATED], "decorrelated");
    cr_expect_str_eq(backoff_jitter_names[JITTER_PROPORTIONAL], "proportional");
    cr_expect_str_eq(backoff_scope_names[BACKOFF_SCOPE_ROUTE], "route");
}
