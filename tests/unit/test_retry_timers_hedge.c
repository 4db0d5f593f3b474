/* The request state machine (proxy/core/retry.c) on a fake clock: hedging
 * (retry.hedge_on_per_try_timeout) and retries whose wait must still fit once a body is read,
 * each at its exact millisecond (tests/support/faked/retryfake.h).
 */
#include "tests/support/faked/retryfake.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/upstream/attempt.h"
#include "proxy/http/grpc.h"
#include "proxy/telemetry/log.h"
#include "proxy/core/retry.h"
#include "proxy/core/worker.h"
#include "proxy/dns/resolve.h"
#include "tests/support/promtext.h"

TestSuite(retry_timers, .fini = finish, .timeout = 20);

#define DEADLINE_800                                                                               \
    "\"timeout_ms\": 1000, \"retry\": {\"max_attempts\": 2, \"retry_on\": [\"503\"], "             \
    "\"backoff\": {\"policy\": "                                                                   \
    "\"fixed\", \"base_ms\": 800, \"jitter\": \"none\"}}"

Test(retry_timers, a_retry_whose_wait_no_longer_fits_once_the_body_is_read_stops_there)
{
    start(DEADLINE_800);
    get();
    launch_head(0, 503); /* at 0: 0 + 800 < 1000, a retry if the wait could start now */
    at(300);
    cr_assert_eq(client.answers, 0);
    launch_body_ends(0); /* the wait would start at 300 and end at 1100, past the deadline */
    cr_assert_eq(client.answers, 1, "retrying ends when the body is read, not at the deadline");
    cr_assert_eq(since_start(client.at), 300);
    cr_assert_eq(client.status, 503);
    cr_assert_str_eq(client.code, "saved");
    cr_assert_str_eq(client.stop, "deadline");
    cr_assert_eq(up.launches, 1);
    cr_assert_eq(metric("retryproxy_retries_total{route=\"r\",reason=\"503\"}"), 0);
    cr_assert_eq(metric("retryproxy_backoff_seconds_count{route=\"r\"}"), 0);
    cr_assert_eq(metric("retryproxy_retries_denied_total{route=\"r\",reason=\"deadline\"}"), 1);
    cr_assert_eq(metric("retryproxy_retries_in_flight"), 0);
    end_request();
}

Test(retry_timers, a_retry_whose_wait_still_fits_once_the_body_is_read_waits_from_then)
{
    start(DEADLINE_800);
    get();
    launch_head(0, 503);
    at(150);
    launch_body_ends(0); /* 150 + 800 < 1000 */
    at(949);
    cr_assert_eq(up.launches, 1);
    at(950);
    cr_assert_eq(up.launches, 2, "the wait runs from the body's end");
    cr_assert_eq(metric("retryproxy_retries_total{route=\"r\",reason=\"503\"}"), 1);
    cr_assert_eq(metric("retryproxy_backoff_seconds_count{route=\"r\"}"), 1);
    cr_assert_eq(metric("retryproxy_retries_denied_total{route=\"r\",reason=\"deadline\"}"), 0);
    attempt_answers(200, NULL);
    cr_assert_eq(client.status, 200);
    end_request();
}

Test(retry_timers, the_deadline_during_a_slow_body_counts_the_retry_once_as_denied)
{
    start(DEADLINE_800);
    get();
    launch_head(0, 503);
    at(1000); /* the body never came: the deadline ends the request */
    cr_assert_eq(client.answers, 1);
    cr_assert_str_eq(client.stop, "deadline");
    cr_assert_eq(client.status, 504, "a body cut off is not returned as complete");
    cr_assert_eq(metric("retryproxy_retries_total{route=\"r\",reason=\"503\"}"), 0);
    cr_assert_eq(metric("retryproxy_backoff_seconds_count{route=\"r\"}"), 0);
    cr_assert_eq(metric("retryproxy_retries_denied_total{route=\"r\",reason=\"deadline\"}"), 1);
    cr_assert_eq(metric("retryproxy_retries_in_flight"), 0);
    end_request();
}

Test(retry_timers, a_hedge_starts_beside_the_slow_attempt_and_the_first_good_answer_wins)
{
    start_hedging(10, 3, "");
    get();
    at(100);
    cr_assert_eq(up.cancels, 0, "the slow attempt was cancelled at its per-try timeout");
    at(109);
    cr_assert_eq(up.launches, 1, "the hedge went before its backoff wait");
    at(110);
    cr_assert_eq(up.launches, 2);
    cr_assert(running(0) && running(1), "two attempts should run at once");
    /* each sends its own number, however long the first took to send */
    cr_assert_str_eq(up.first[0], "X-Retry-Attempt: 1");
    cr_assert_str_eq(up.first[1], "X-Retry-Attempt: 2");
    cr_assert_eq(up.fields[0], up.fields[1], "the request's fields are shared");
    at(150);
    launch_answers(1, 200, NULL);
    cr_assert_eq(client.status, 200);
    cr_assert_str_eq(client.code, "response");
    cr_assert_str_eq(client.stop, "");
    cr_assert_eq(client.attempts, 2);
    at(150);
    cr_assert(!running(0), "the slow attempt outlived the answer");
    cr_assert_eq(up.cancels, 1);
    cr_assert_eq(metric("retryproxy_hedges_total{route=\"r\"}"), 1);
    cr_assert_eq(metric("retryproxy_retries_total{route=\"r\",reason=\"timeout\"}"), 1);
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"2xx\"}"), 1);
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"cancelled\"}"), 1);
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"timeout\"}"), 0);
    cr_assert_eq(metric("retryproxy_retry_success_total{route=\"r\"}"), 1);
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 0);
    end_request();
}

Test(retry_timers, the_slow_attempt_answering_first_cancels_the_hedge)
{
    hedged(10, 3);
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 1, "the hedge holds a retry's slot");
    at(180);
    launch_answers(0, 200, NULL);
    cr_assert_eq(client.status, 200);
    cr_assert_eq(client.attempts, 2);
    cr_assert(running(1), "cancelled from inside curl's callback instead of the next turn");
    at(180);
    cr_assert(!running(1), "the hedge outlived the answer");
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"cancelled\"}"), 1);
    cr_assert_eq(metric("retryproxy_retry_success_total{route=\"r\"}"), 0,
                 "the first attempt's success counted as a retry's");
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 0);
    at(200);
    cr_assert_eq(up.launches, 2, "a third attempt went after the answer");
    end_request();
}

Test(retry_timers, an_answer_during_the_hedges_wait_ends_the_wait)
{
    start_hedging(50, 3, "");
    get();
    at(100);
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 1);
    at(120);
    launch_answers(0, 200, NULL);
    cr_assert_eq(client.status, 200);
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 0, "the hedge's slot was kept");
    at(150);
    cr_assert_eq(up.launches, 1, "the hedge went after the answer");
    end_request();
}

Test(retry_timers, a_hedge_failing_last_waits_for_the_slow_attempt)
{
    hedged(10, 2);
    at(120);
    launch_answers(1, 503, NULL); /* retrying is over: max_attempts 2 */
    cr_assert_eq(client.answers, 0, "answered 503 while the slow attempt could still succeed");
    at(400);
    launch_answers(0, 200, NULL);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 200);
    cr_assert_str_eq(client.code, "response");
    cr_assert_str_eq(client.stop, "");
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"5xx\"}"), 1);
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"2xx\"}"), 1);
    end_request();
}

Test(retry_timers, when_every_attempt_fails_the_last_response_is_the_answer)
{
    hedged(10, 2);
    at(120);
    launch_answers(1, 503, NULL);
    at(300);
    launch_answers(0, 502, NULL);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 502, "the slow attempt's response, the last one, is the answer");
    cr_assert_str_eq(client.code, "response");
    cr_assert_str_eq(client.stop, "max-attempts");
    end_request();
}

Test(retry_timers, when_the_slow_attempt_fails_without_a_response_the_kept_one_is_the_answer)
{
    hedged(10, 2);
    at(120);
    launch_answers(1, 503, NULL);
    at(300);
    launch_fails(0, true);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 503);
    cr_assert_str_eq(client.code, "saved");
    cr_assert_str_eq(client.stop, "max-attempts");
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"reset\"}"), 1);
    end_request();
}

Test(retry_timers, a_slow_attempt_failing_leaves_the_hedge_running)
{
    hedged(10, 3);
    at(150);
    launch_fails(0, true);
    cr_assert_eq(client.answers, 0);
    cr_assert(running(1), "the hedge was cancelled with the slow attempt");
    at(209);
    cr_assert_eq(up.launches, 2, "a failure of the slow attempt started one more");
    at(210); /* the hedge's own per-try timeout: a third attempt, beside it */
    at(220);
    cr_assert_eq(up.launches, 3);
    cr_assert(running(1) && running(2));
    cr_assert_str_eq(up.first[2], "X-Retry-Attempt: 3");
    launch_answers(2, 200, NULL);
    cr_assert_eq(client.status, 200);
    cr_assert_eq(client.attempts, 3);
    at(230);
    cr_assert(!running(1));
    cr_assert_eq(metric("retryproxy_hedges_total{route=\"r\"}"), 2);
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 0);
    end_request();
}

Test(retry_timers, the_deadline_ends_every_attempt_at_its_millisecond)
{
    hedged(10, 3);
    at(210);
    at(220);
    cr_assert(running(0) && running(1) && running(2));
    at(320); /* the third's per-try timeout: no attempt is left, it runs on */
    cr_assert_eq(up.cancels, 0);
    cr_assert_eq(metric("retryproxy_retries_denied_total{route=\"r\",reason=\"max-attempts\"}"), 1);
    at(999);
    cr_assert_eq(client.answers, 0);
    at(1000);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 504);
    cr_assert_str_eq(client.code, "upstream_timeout");
    cr_assert_eq(client.attempts, 3);
    cr_assert(!running(0) && !running(1) && !running(2));
    cr_assert_eq(up.cancels, 3);
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"timeout\"}"), 3);
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 0);
    end_request();
}

Test(retry_timers, a_request_that_may_not_go_twice_is_not_hedged)
{
    start_hedging(10, 3, "");
    open_request("POST");
    at(100);
    cr_assert_eq(up.cancels, 1, "the per-try timeout ends a POST's attempt as without hedging");
    cr_assert_eq(client.status, 504);
    cr_assert_str_eq(client.stop, "not-retryable");
    at(200);
    cr_assert_eq(up.launches, 1);
    end_request();
}

Test(retry_timers, a_hedge_the_budget_refuses_lets_the_attempt_run_on)
{
    start_hedging(10, 3, ", \"budget\": {\"max_concurrent_retries\": 0}");
    get();
    at(100);
    cr_assert_eq(up.cancels, 0);
    cr_assert_eq(metric("retryproxy_retries_denied_total{route=\"r\",reason=\"concurrency\"}"), 1);
    at(500);
    cr_assert_eq(up.launches, 1);
    launch_answers(0, 200, NULL);
    cr_assert_eq(client.status, 200);
    cr_assert_eq(client.attempts, 1);
    cr_assert_eq(metric("retryproxy_hedges_total{route=\"r\"}"), 0);
    end_request();
}

Test(retry_timers, a_client_leaving_during_the_hedges_wait_ends_the_slow_attempt)
{
    start_hedging(50, 3, "");
    get();
    at(120);
    retry_req_client_gone(req);
    cr_assert_eq(client.status, 499);
    cr_assert(!running(0), "the slow attempt outlived its client");
    retry_req_completed(req);
    req = NULL;
    cr_assert_eq(loop_timer_count(w.loop), 0, "a timer outlived the request");
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 0);
    at(5000);
    cr_assert_eq(up.launches, 1);
}

Test(retry_timers, draining_ends_the_slow_attempt_and_the_hedge)
{
    hedged(10, 3);
    retry_expire_all(&w);
    cr_assert_eq(client.status, 503);
    cr_assert_str_eq(client.stop, "draining");
    cr_assert(!running(0) && !running(1));
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"cancelled\"}"), 2);
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 0);
    end_request();
}

/* Every attempts_total series of route "r", summed. */
static double attempts_counted(void)
{
    size_t len;
    char *text = metrics_render(px.metrics, &len);
    cr_assert_not_null(text);
    double sum = 0;
    const char *key = "\nretryproxy_attempts_total{route=\"r\",";
    for (const char *p = strstr(text, key); p; p = strstr(p + 1, key))
        sum += strtod(strchr(p, '}') + 2, NULL);
    free(text);
    return sum;
}

/* Random races, seed by seed: attempts answer 200 or 503 or fail at random instants, some
 * after others have lost, the client leaves or the proxy drains now and then. Whatever the
 * order, the request is answered once, every attempt launched is counted once and none runs
 * on after the request, no timer outlives it, and every retry slot is given back (ASan sees
 * the memory). */
Test(retry_timers, random_races_keep_every_count_and_free_everything)
{
    for (unsigned seed = 1; seed <= 400; seed++) {
        struct rng g;
        rng_seed(&g, seed);
        char more[96] = "";
        if (rng_between(&g, 0, 3) == 0)
            snprintf(more, sizeof(more), ", \"budget\": {\"max_concurrent_retries\": %u}",
                     (unsigned)rng_between(&g, 0, 1));
        start_hedging((unsigned)rng_between(&g, 1, 60), (unsigned)rng_between(&g, 1, 4), more);
        get();
        unsigned t = 0;
        while (client.answers == 0 && t <= 1100) {
            t += (unsigned)rng_between(&g, 1, 40);
            at(t);
            if (client.answers)
                break;
            unsigned k = (unsigned)rng_between(&g, 0, up.launches ? up.launches - 1 : 0);
            switch (rng_between(&g, 0, 9)) {
            case 0:
            case 1:
                if (running(k))
                    launch_answers(k, 200, NULL);
                break;
            case 2:
            case 3:
                if (running(k))
                    launch_answers(k, 503, NULL);
                break;
            case 4:
                if (running(k))
                    launch_fails(k, rng_between(&g, 0, 1));
                break;
            case 5:
                if (rng_between(&g, 0, 9) == 0)
                    retry_req_client_gone(req);
                else if (rng_between(&g, 0, 19) == 0)
                    retry_expire_all(&w);
                break;
            default:
                break; /* time passes */
            }
            /* an attempt counts in its endpoint's in flight exactly while its transfer runs:
             * through its head and body, until it ends, is cancelled or loses */
            cr_assert_eq(in_flight(), launches_running(),
                         "seed %u at %u ms: %lld in flight, %lld "
                         "running",
                         seed, t, (long long)in_flight(), (long long)launches_running());
        }
        cr_assert_eq(client.answers, 1, "seed %u: %u answers", seed, client.answers);
        at(t + 1); /* cancels left for the next turn */
        retry_req_completed(req);
        req = NULL;
        cr_assert_eq(loop_timer_count(w.loop), 0, "seed %u: a timer outlived the request", seed);
        for (unsigned i = 0; i < up.launches; i++)
            cr_assert(!running(i), "seed %u: launch %u runs on after the request", seed, i);
        cr_assert_eq(attempts_counted(), up.launches, "seed %u: %g attempts counted for %u", seed,
                     attempts_counted(), up.launches);
        cr_assert_eq(metrics_retries_in_flight(px.metrics), 0, "seed %u: a slot was kept", seed);
        cr_assert_eq(in_flight(), 0, "seed %u: an attempt stayed in flight", seed);
        finish();
    }
}
