/* score: an endpoint's failure ratio and latency as moving averages on a fake clock, and the
 * weight they give it in the choice (policy/score.h, docs/endpoints.md). */
#include <criterion/criterion.h>

#include "policy/score.h"

static uint32_t weight_of(const struct score *s, uint64_t now_ms, uint32_t fastest_us)
{
    return score_weight(s->fail_q16, s->lat_us, s->at_ms, now_ms, fastest_us);
}

Test(score, a_new_or_healthy_endpoint_weighs_the_most)
{
    struct score s = { 0 };
    cr_expect_eq(weight_of(&s, 0, 0), SCORE_WEIGHT_MAX);
    for (uint64_t t = 1; t <= 100; t++)
        score_record(&s, false, 2000, t);
    cr_expect_eq(s.fail_q16, 0);
    cr_expect_eq(s.lat_us, 2000);
    cr_expect_eq(weight_of(&s, 100, 2000), SCORE_WEIGHT_MAX);
}

Test(score, failures_bring_the_weight_down_to_its_floor_and_no_further)
{
    struct score s = { 0 };
    score_record(&s, true, 0, 1);
    cr_expect_eq(s.fail_q16, 32768, "the healthy prior counts as one: half failed");
    cr_expect_eq(weight_of(&s, 1, 0), SCORE_WEIGHT_MAX / 4);
    for (uint64_t t = 2; t < 50; t++)
        score_record(&s, true, 0, t);
    cr_expect_eq(weight_of(&s, 50, 0), SCORE_WEIGHT_FLOOR);
    cr_expect_eq(s.attempts, 49);
    cr_expect_eq(s.failures, 49);
}

Test(score, after_many_successes_a_failure_weighs_a_tenth)
{
    struct score s = { 0 };
    for (uint64_t t = 1; t <= 100; t++)
        score_record(&s, false, 1000, t);
    score_record(&s, true, 1000, 101);
    cr_expect_eq(s.fail_q16, 6554, "%u", s.fail_q16);
}

Test(score, observations_far_apart_weigh_by_time)
{
    struct score s = { 0 };
    for (uint64_t t = 1; t <= 100; t++)
        score_record(&s, true, 1000, t);
    /* one success 10 s later (two SCORE_TAU_MS): 1 - e^-2 of the average */
    score_record(&s, false, 1000, 100 + 10000);
    cr_expect(s.fail_q16 > 8000 && s.fail_q16 < 9500, "%u", s.fail_q16);
}

Test(score, a_failure_that_is_not_tried_drifts_back)
{
    struct score s = { 0 };
    for (uint64_t t = 1; t <= 100; t++)
        score_record(&s, true, 0, t);
    cr_expect_eq(weight_of(&s, 100, 0), SCORE_WEIGHT_FLOOR);
    /* halved after SCORE_HEAL_MS: a quarter of the weight */
    uint32_t w = weight_of(&s, 100 + SCORE_HEAL_MS, 0);
    cr_expect(w > SCORE_WEIGHT_MAX / 4 - 8 && w < SCORE_WEIGHT_MAX / 4 + 8, "%u", w);
    cr_expect_gt(weight_of(&s, 100 + 10 * SCORE_HEAL_MS, 0), SCORE_WEIGHT_MAX * 3 / 4);
}

Test(score, a_fast_failure_says_nothing_of_speed_a_slow_one_does)
{
    struct score s = { 0 };
    score_record(&s, true, 100, 1);
    cr_expect_eq(s.lat_us, 0, "no latency known from a fast failure");
    for (uint64_t t = 2; t <= 20; t++)
        score_record(&s, false, 10000, t);
    uint32_t lat = s.lat_us;
    score_record(&s, true, 100, 21);
    cr_expect_eq(s.lat_us, lat, "a fast failure left it");
    score_record(&s, true, 1000000, 22);
    cr_expect_gt(s.lat_us, lat, "a timeout raised it");
}

Test(score, a_slow_endpoint_weighs_less_past_twice_the_fastest_and_the_slack)
{
    /* fastest 1 ms: slow past max(2 ms, 1 ms + 5 ms) = 6 ms */
    cr_expect_eq(score_weight(0, 5000, 0, 0, 1000), SCORE_WEIGHT_MAX);
    cr_expect_eq(score_weight(0, 12000, 0, 0, 1000), SCORE_WEIGHT_MAX / 2);
    cr_expect_eq(score_weight(0, 1000000, 0, 0, 1000), SCORE_WEIGHT_FLOOR);
    /* fastest 20 ms: slow past 40 ms */
    cr_expect_eq(score_weight(0, 39000, 0, 0, 20000), SCORE_WEIGHT_MAX);
    cr_expect_eq(score_weight(0, 80000, 0, 0, 20000), SCORE_WEIGHT_MAX / 2);
}
