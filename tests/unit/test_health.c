#include <criterion/criterion.h>

#include "policy/health.h"

/* Three failures in a row eject; ejections last 100, 200, 400 ... ms up to 1000 (exponential,
 * no jitter); 5 s of health start the sequence over. */
static struct health_spec spec(void)
{
    return (struct health_spec){ .consecutive_failures = 3,
                                 .reset_after_ms = 5000,
                                 .backoff = { .policy = BACKOFF_EXPONENTIAL,
                                              .jitter = JITTER_NONE,
                                              .base_ms = 100,
                                              .cap_ms = 1000,
                                              .factor = 2.0 } };
}

static struct rng rng;

static void setup(void)
{
    rng_seed(&rng, 1);
}

TestSuite(health, .init = setup);

/* 'n' failures at 'now', one per millisecond; whether the last one ejected. */
static bool fail_n(struct health *h, const struct health_spec *s, uint64_t now, unsigned n)
{
    bool ejected = false;
    for (unsigned i = 0; i < n; i++)
        ejected = health_record(h, s, true, now + i, &rng);
    return ejected;
}

Test(health, fewer_failures_than_the_threshold_do_not_eject)
{
    struct health h = { 0 };
    struct health_spec s = spec();
    cr_expect_not(fail_n(&h, &s, 1000, 2));
    cr_expect(health_available(&h, 1002));
    cr_expect_eq(h.failures, 2);
    cr_expect_eq(h.ejections_total, 0);
}

Test(health, the_nth_failure_in_a_row_ejects_until_the_first_delay)
{
    struct health h = { 0 };
    struct health_spec s = spec();
    cr_expect_not(fail_n(&h, &s, 1000, 2));
    cr_expect(health_record(&h, &s, true, 1002, &rng));
    cr_expect_eq(h.ejected_until_ms, 1102);
    cr_expect_not(health_available(&h, 1002));
    cr_expect_not(health_available(&h, 1101));
    cr_expect(health_available(&h, 1102), "an ejection ends at its time");
    cr_expect_eq(h.ejections_total, 1);
    cr_expect_eq(h.failures, 0, "the count starts over after an ejection");
}

Test(health, ejection_lengths_follow_the_backoff_sequence)
{
    struct health h = { 0 };
    struct health_spec s = spec();
    const uint32_t want[] = { 100, 200, 400, 800, 1000, 1000 };
    uint64_t now = 1000;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        cr_assert(fail_n(&h, &s, now, 3), "ejection %zu", i + 1);
        uint64_t began = now + 2;
        cr_expect_eq(h.ejected_until_ms - began, want[i], "ejection %zu lasts %llu ms, want %u",
                     i + 1, (unsigned long long)(h.ejected_until_ms - began), want[i]);
        now = h.ejected_until_ms; /* tried again as soon as it is back, and fails again */
    }
    cr_expect_eq(h.ejections_total, 6);
    cr_expect_eq(health_sequence(&h, &s, now), 6);
}

Test(health, a_success_resets_the_consecutive_count)
{
    struct health h = { 0 };
    struct health_spec s = spec();
    cr_expect_not(fail_n(&h, &s, 1000, 2));
    cr_expect_not(health_record(&h, &s, false, 1002, &rng));
    cr_expect_eq(h.failures, 0);
    cr_expect_not(fail_n(&h, &s, 1003, 2), "two failures after the success are not three");
    cr_expect(health_available(&h, 1005));
    cr_expect(health_record(&h, &s, true, 1005, &rng));
}

Test(health, reset_after_ms_of_health_restarts_the_sequence)
{
    struct health h = { 0 };
    struct health_spec s = spec();
    cr_assert(fail_n(&h, &s, 1000, 3)); /* 100 ms, until 1102 */
    cr_assert(fail_n(&h, &s, 1102, 3)); /* 200 ms, until 1304 */
    cr_assert_eq(h.ejected_until_ms, 1304);
    /* Health counts from the end of the ejection, not from the failure before it. */
    cr_expect_eq(health_sequence(&h, &s, 1304 + 4999), 2);
    cr_expect_eq(health_sequence(&h, &s, 1304 + 5000), 0);
    cr_assert(fail_n(&h, &s, 1304 + 5000, 3));
    cr_expect_eq(h.ejected_until_ms - (1304 + 5002), 100, "the first delay again");
    cr_expect_eq(h.ejections_total, 3, "the total is never reset");
}

Test(health, a_failure_within_reset_after_ms_keeps_the_sequence)
{
    struct health h = { 0 };
    struct health_spec s = spec();
    cr_assert(fail_n(&h, &s, 1000, 3)); /* until 1102 */
    /* a lone failure at 5000 is less than 5 s after 1102's end: health counts from it again */
    cr_expect_not(health_record(&h, &s, true, 5000, &rng));
    cr_expect_eq(health_sequence(&h, &s, 9999), 1);
    cr_assert(fail_n(&h, &s, 9999, 2));
    cr_expect_eq(h.ejected_until_ms - 10000, 200, "the second delay");
}

Test(health, outcomes_while_ejected_count_for_nothing)
{
    struct health h = { 0 };
    struct health_spec s = spec();
    cr_assert(fail_n(&h, &s, 1000, 3)); /* until 1102 */
    cr_expect_not(fail_n(&h, &s, 1050, 5));
    cr_expect_eq(h.ejected_until_ms, 1102, "not extended");
    cr_expect_eq(h.failures, 0);
    cr_expect_not(health_record(&h, &s, false, 1060, &rng));
    cr_expect_not(health_available(&h, 1060), "a success does not end it early");
    cr_expect_eq(h.ejections_total, 1);
}

Test(health, zero_consecutive_failures_never_ejects)
{
    struct health h = { 0 };
    struct health_spec s = spec();
    s.consecutive_failures = 0;
    cr_expect_not(fail_n(&h, &s, 1000, 100));
    cr_expect(health_available(&h, 1100));
    cr_expect_eq(h.failures, 0);
}

Test(health, jittered_ejections_repeat_from_the_seed_and_stay_under_the_cap)
{
    struct health_spec s = spec();
    s.backoff.jitter = JITTER_FULL;
    uint64_t lens[2][8];
    for (int run = 0; run < 2; run++) {
        struct health h = { 0 };
        rng_seed(&rng, 7);
        uint64_t now = 1000;
        for (int i = 0; i < 8; i++) {
            cr_assert(fail_n(&h, &s, now, 3));
            lens[run][i] = h.ejected_until_ms - (now + 2);
            cr_expect_leq(lens[run][i], 1000);
            now = h.ejected_until_ms;
        }
    }
    for (int i = 0; i < 8; i++)
        cr_expect_eq(lens[0][i], lens[1][i], "ejection %d", i + 1);
}
