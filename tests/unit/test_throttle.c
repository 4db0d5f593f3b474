/* Client-side throttling (policy/throttle.c): the rejection probability of the SRE book's
 * formula over a sliding window, on a fake clock and a seeded RNG. */
#include <criterion/criterion.h>

#include "policy/throttle.h"

static struct throttle t;
static struct rng rng;

static void setup(void)
{
    throttle_init(&t, 10000);
    rng_seed(&rng, 42);
}

TestSuite(throttle, .init = setup);

/* 'n' attempts at 'now', of which 'accepted' the upstream accepted (admitted or not). */
static void traffic(unsigned n, unsigned accepted, uint64_t now)
{
    for (unsigned i = 0; i < n; i++) {
        throttle_admit(&t, 2.0, now, &rng, NULL);
        if (i < accepted)
            throttle_note_accept(&t, now);
    }
}

Test(throttle, a_healthy_upstream_is_never_throttled)
{
    traffic(1000, 1000, 5000);
    cr_expect_eq(throttle_probability(&t, 2.0, 5000), 0.0);
    double p = 1;
    cr_expect(throttle_admit(&t, 2.0, 5000, &rng, &p));
    cr_expect_eq(p, 0.0);
}

Test(throttle, the_probability_is_requests_less_k_accepts_over_requests_plus_one)
{
    traffic(10, 0, 1000);
    cr_expect_float_eq(throttle_probability(&t, 2.0, 1000), 10.0 / 11.0, 1e-12);
    throttle_init(&t, 10000);
    traffic(10, 4, 1000);
    cr_expect_float_eq(throttle_probability(&t, 2.0, 1000), 2.0 / 11.0, 1e-12);
    cr_expect_eq(throttle_probability(&t, 3.0, 1000), 0.0, "k = 3: 12 >= 10, nothing rejected");
    throttle_init(&t, 10000);
    traffic(10, 5, 1000);
    cr_expect_eq(throttle_probability(&t, 2.0, 1000), 0.0, "half failing is still within k = 2");
}

Test(throttle, rejects_about_that_share_of_attempts)
{
    /* 1000 requests, 250 accepted: p = 500 / 1001 at first, and every attempt counted (none
     * accepted) raises it, to 1500 / 2001 after 1000 more. */
    traffic(1000, 250, 1000);
    unsigned rejected = 0;
    for (int i = 0; i < 1000; i++)
        rejected += !throttle_admit(&t, 2.0, 1000, &rng, NULL);
    cr_expect(rejected > 450 && rejected < 800, "%u of 1000 rejected", rejected);
}

Test(throttle, counts_age_out_of_the_window)
{
    traffic(100, 0, 1000);
    cr_expect_gt(throttle_probability(&t, 2.0, 1000), 0.9);
    cr_expect_gt(throttle_probability(&t, 2.0, 10999), 0.9, "still within 10 s");
    cr_expect_eq(throttle_probability(&t, 2.0, 11500), 0.0, "a window later: forgotten");
    throttle_set_window(&t, 100000);
    traffic(100, 0, 20000);
    cr_expect_gt(throttle_probability(&t, 2.0, 90000), 0.9, "a longer window after a reload");
}
