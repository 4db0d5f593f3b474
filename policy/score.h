/* score -- how well an endpoint has answered lately, and the weight it gets in the choice
 * (docs/endpoints.md "Failing and slow endpoints get fewer attempts"). Pure: the clock comes in as
 * an argument, no I/O, no globals; the caller serializes access to one struct score.
 *
 * Two moving averages of the endpoint's attempts, each observation weighing
 *   alpha = max(1 / (n + 1), 1 / SCORE_WINDOW, 1 - exp(-dt / SCORE_TAU_MS))
 * (n: observations so far, the healthy prior counting as one; dt: since the last): an average of
 * every observation at first, then about the last SCORE_WINDOW of them, or the last
 * SCORE_TAU_MS when they come further apart, so that an endpoint seldom tried is judged on its
 * recent answers, not old ones:
 * - the failure ratio (1: every recent attempt failed, as the route's retry_on judges it);
 * - the latency of its answers, from the attempt's start to its verdict. A fast failure says
 *   nothing of speed: a failure moves it only up (a timeout, a slow error).
 *
 * The weight is SCORE_WEIGHT_MAX x (1 - failure')^2, where failure' is the failure ratio as it
 * drifts back to none while the endpoint is not tried (halved after SCORE_HEAL_MS without an
 * attempt, a third after twice that...: no news is good news, so an endpoint that got no
 * attempt for its low weight is tried again and its recovery seen); times fastest' / latency
 * when the endpoint is slow: more than twice the fastest candidate's latency and SCORE_SLACK_US
 * above it (fastest' = max(2 x fastest, fastest + SCORE_SLACK_US)). Never below
 * SCORE_WEIGHT_FLOOR, so that it is still tried now and then (only ejection takes an endpoint
 * out). Gathered like Linkerd's and Finagle's EWMAs, weighed like gRPC's weighted_round_robin
 * with an error penalty.
 *
 * ''fail_q16', 'lat_us' and 'at_ms' are what the choice reads, without the caller's lock: the
 * writer stores them with __atomic_store_n, a reader loads them with __atomic_load_n (relaxed); all
 * zero is an endpoint with no failure and no latency known yet.
 */
#ifndef RETRYPROXY_POLICY_SCORE_H
#define RETRYPROXY_POLICY_SCORE_H

#include <stdbool.h>
#include <stdint.h>

#define SCORE_WINDOW       10
#define SCORE_TAU_MS       5000
#define SCORE_WEIGHT_MAX   1024
#define SCORE_WEIGHT_FLOOR 32 /* 1/32 of a healthy endpoint's */
#define SCORE_SLACK_US     5000
#define SCORE_HEAL_MS      10000

/* One endpoint's score. Zero-initialise: healthy, nothing observed. */
struct score {
    double fail;                 /* failure ratio's average, 0..1 */
    double lat;                  /* latency's average in microseconds, 0: none seen yet */
    uint64_t at_ms;              /* the last observation, published */
    uint32_t n;                  /* observations, up to SCORE_WINDOW */
    uint32_t fail_q16;           /* 'fail' x 65535, published */
    uint32_t lat_us;             /* 'lat', published */
    uint64_t attempts, failures; /* every observation, never reset */
};

/* Records one attempt that took 'took_us' and 'failed' or not, at 'now_ms'. */
void score_record(struct score *s, bool failed, uint64_t took_us, uint64_t now_ms);

/* The failure ratio x 65535 at 'now_ms' of an endpoint whose published score is 'fail_q16' and
 * 'at_ms': as it has drifted back since its last attempt. */
uint32_t score_failure(uint32_t fail_q16, uint64_t at_ms, uint64_t now_ms);

/* The weight, SCORE_WEIGHT_FLOOR..SCORE_WEIGHT_MAX, at 'now_ms' of an endpoint whose published
 * score is 'fail_q16', 'lat_us' and 'at_ms', among candidates whose fastest has 'fastest_us'
 * (0: none known). Integer arithmetic, one division or two: it runs for each candidate of each
 * pick. */
uint32_t score_weight(uint32_t fail_q16, uint32_t lat_us, uint64_t at_ms, uint64_t now_ms,
                      uint32_t fastest_us);

#endif
