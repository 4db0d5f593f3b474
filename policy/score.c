#include "policy/score.h"

#include <math.h>

void score_record(struct score *s, bool failed, uint64_t took_us, uint64_t now_ms)
{
    /* the healthy prior counts as one observation, so the first failure halves the score */
    double alpha = 1.0 / (s->n + 2.0);
    if (alpha < 1.0 / SCORE_WINDOW)
        alpha = 1.0 / SCORE_WINDOW;
    if (s->n > 0 && now_ms > s->at_ms) {
        double by_time = 1.0 - exp(-(double)(now_ms - s->at_ms) / SCORE_TAU_MS);
        if (by_time > alpha)
            alpha = by_time;
    }
    s->fail += alpha * ((failed ? 1.0 : 0.0) - s->fail);
    double took = took_us > UINT32_MAX ? (double)UINT32_MAX : (double)took_us;
    if (s->lat == 0)
        s->lat = failed ? 0 : took;
    else if (!failed || took > s->lat)
        s->lat += alpha * (took - s->lat);
    if (s->n < SCORE_WINDOW)
        s->n++;
    s->attempts++;
    s->failures += failed;
    __atomic_store_n(&s->fail_q16, (uint32_t)lround(s->fail * 65535.0), __ATOMIC_RELAXED);
    __atomic_store_n(&s->lat_us, (uint32_t)lround(s->lat), __ATOMIC_RELAXED);
    __atomic_store_n(&s->at_ms, now_ms, __ATOMIC_RELAXED);
}

uint32_t score_failure(uint32_t fail_q16, uint64_t at_ms, uint64_t now_ms)
{
    uint64_t fail = fail_q16 > 65535 ? 65535 : fail_q16;
    if (fail && now_ms > at_ms) /* drifting back: HEAL / (HEAL + idle) of it */
        fail = fail * SCORE_HEAL_MS / (SCORE_HEAL_MS + (now_ms - at_ms));
    return (uint32_t)fail;
}

uint32_t score_weight(uint32_t fail_q16, uint32_t lat_us, uint64_t at_ms, uint64_t now_ms,
                      uint32_t fastest_us)
{
    uint64_t ok = 65535 - score_failure(fail_q16, at_ms, now_ms);
    /* ok^2 x MAX in 1/65535^2 units, rounded: a healthy endpoint has exactly MAX */
    uint64_t w = (ok * ok * SCORE_WEIGHT_MAX + 65535ULL * 65535 / 2) / (65535ULL * 65535);
    if (lat_us && fastest_us) {
        uint64_t ref = (uint64_t)fastest_us + SCORE_SLACK_US;
        if (ref < 2ULL * fastest_us)
            ref = 2ULL * fastest_us;
        if (lat_us > ref)
            w = w * ref / lat_us;
    }
    return w < SCORE_WEIGHT_FLOOR ? SCORE_WEIGHT_FLOOR : (uint32_t)w;
}
