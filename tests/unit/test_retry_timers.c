/* The request state machine's timers (proxy/core/retry.c) on a fake clock: backoff waits, the
 * per-try timeout, the deadline, Retry-After and the drain deadline fire at exactly their
 * millisecond, with no network and no wall-clock slack; and requests in flight per endpoint
 * (tests/support/faked/retryfake.h: the fakes of the upstream attempt and the client side).
 * Hedging: test_retry_timers_hedge.c; trailers: test_retry_timers_trailers.c.
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

Test(retry_timers, a_backoff_wait_ends_at_its_exact_millisecond)
{
    start("\"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 250, \"jitter\": "
          "\"none\"}}");
    get();
    cr_assert_eq(up.launches, 1);
    at(10);
    attempt_fails(false);
    at(259);
    cr_assert_eq(up.launches, 1, "the retry went before its 250 ms wait was over");
    at(260);
    cr_assert_eq(up.launches, 2);
    cr_assert_eq(since_start(up.launched_at[1]), 260);
    at(300);
    attempt_fails(true);
    at(549);
    cr_assert_eq(up.launches, 2);
    at(550);
    cr_assert_eq(up.launches, 3);
    at(600);
    attempt_fails(true);
    cr_assert_eq(client.answers, 1, "the third attempt was the last: answered at once");
    cr_assert_eq(client.status, 502);
    cr_assert_str_eq(client.stop, "max-attempts");
    cr_assert_eq(since_start(client.at), 600);
    end_request();
}

Test(retry_timers, the_per_try_timeout_cancels_the_attempt_at_its_millisecond)
{
    start("\"per_try_timeout_ms\": 300, \"retry\": {\"max_attempts\": 2, \"backoff\": "
          "{\"policy\": \"fixed\", \"base_ms\": 100, \"jitter\": \"none\"}}");
    get();
    at(299);
    cr_assert_eq(up.cancels, 0);
    at(300);
    cr_assert_eq(up.cancels, 1, "the attempt outlived its per-try timeout");
    at(399);
    cr_assert_eq(up.launches, 1);
    at(400);
    cr_assert_eq(up.launches, 2, "the retry after a timeout waits its backoff, then goes");
    at(700);
    cr_assert_eq(up.cancels, 2);
    cr_assert_eq(client.status, 504);
    cr_assert_str_eq(client.code, "upstream_timeout");
    cr_assert_str_eq(client.stop, "max-attempts");
    cr_assert_eq(since_start(client.at), 700);
    end_request();
}

Test(retry_timers, the_deadline_ends_a_running_attempt_at_its_millisecond)
{
    start("\"timeout_ms\": 1000, \"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": "
          "400, \"jitter\": \"none\"}}");
    get();
    at(100);
    attempt_fails(false);
    at(500);
    cr_assert_eq(up.launches, 2);
    at(999);
    cr_assert_eq(client.answers, 0);
    at(1000);
    cr_assert_eq(up.cancels, 1);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 504);
    cr_assert_str_eq(client.stop, "deadline");
    cr_assert_eq(client.attempts, 2);
    end_request();
}

Test(retry_timers, a_wait_that_would_pass_the_deadline_is_not_taken)
{
    start("\"timeout_ms\": 1000, \"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": "
          "400, \"jitter\": \"none\"}}");
    get();
    at(599); /* 599 + 400 < 1000: this wait fits */
    attempt_fails(false);
    cr_assert_eq(client.answers, 0);
    at(999);
    cr_assert_eq(up.launches, 2);
    cr_assert_eq(client.answers, 0);
    attempt_fails(false); /* 999 + 400 >= 1000: no time left for another attempt */
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 502);
    cr_assert_str_eq(client.stop, "deadline");
    cr_assert_eq(since_start(client.at), 999);
    end_request();
}

Test(retry_timers, the_deadline_during_an_attempt_returns_the_saved_response)
{
    start("\"timeout_ms\": 1000, \"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": "
          "400, \"jitter\": \"none\"}}");
    get();
    at(100);
    attempt_answers(503, NULL); /* kept whole, then a 400 ms wait */
    at(500);
    cr_assert_eq(up.launches, 2);
    at(999);
    cr_assert_eq(client.answers, 0);
    at(1000);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 503, "the first attempt's response is the answer");
    cr_assert_str_eq(client.code, "saved");
    cr_assert_str_eq(client.stop, "deadline");
    end_request();
}

Test(retry_timers, retry_after_sets_the_wait_to_the_millisecond)
{
    start("\"timeout_ms\": 10000, \"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": "
          "100, \"jitter\": \"none\"}}");
    get();
    at(20);
    attempt_answers(429, "2");
    at(2019);
    cr_assert_eq(up.launches, 1, "Retry-After: 2 was not waited out");
    at(2020);
    cr_assert_eq(up.launches, 2);
    end_request();
}

Test(retry_timers, the_drain_deadline_refuses_a_wait_that_would_outlast_it)
{
    start("\"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 300, \"jitter\": "
          "\"none\"}}");
    get();
    atomic_store(&px.drain_deadline_ms, now_ms + 200);
    at(10);
    attempt_fails(false);
    cr_assert_eq(up.launches, 1);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 502);
    cr_assert_str_eq(client.stop, "draining");
    end_request();
}

Test(retry_timers, draining_ends_a_wait_with_a_503_when_its_deadline_comes)
{
    start("\"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 300, \"jitter\": "
          "\"none\"}}");
    get();
    at(10);
    attempt_fails(false);
    at(100);
    retry_expire_all(&w);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 503);
    cr_assert_str_eq(client.code, "draining");
    cr_assert_str_eq(client.stop, "draining");
    at(310);
    cr_assert_eq(up.launches, 1, "the wait's timer outlived the answer");
    end_request();
}

Test(retry_timers, a_client_leaving_during_a_wait_stops_every_timer)
{
    start("\"per_try_timeout_ms\": 300, \"retry\": {\"backoff\": {\"policy\": \"fixed\", "
          "\"base_ms\": 500, \"jitter\": \"none\"}}");
    get();
    at(10);
    attempt_fails(false);
    cr_assert_gt(loop_timer_count(w.loop), 0);
    retry_req_client_gone(req);
    cr_assert_eq(client.status, 499);
    retry_req_completed(req);
    req = NULL;
    cr_assert_eq(loop_timer_count(w.loop), 0, "a timer outlived the request");
    at(5000);
    cr_assert_eq(up.launches, 1);
}

/* ---- requests in flight per endpoint (docs/admin.md "in_flight") ---- */

/* A response that streams is in flight until its body ends, not until its head. */
Test(retry_timers, a_streamed_response_is_in_flight_until_its_body_ends)
{
    start("");
    get();
    cr_assert_eq(in_flight(), 1);
    launch_head(0, 200);
    cr_assert_eq(client.status, 200);
    cr_assert_eq(in_flight(), 1, "the body still streams: the attempt is in flight");
    launch_body_ends(0);
    cr_assert_eq(in_flight(), 0);
    end_request();
    cr_assert_eq(in_flight(), 0);
}

/* A retryable response is in flight while its body is read, not during the wait after it. */
Test(retry_timers, a_drained_response_is_in_flight_until_read_and_not_during_the_wait)
{
    start("\"retry\": {\"max_attempts\": 2, \"retry_on\": [\"503\"], "
          "\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 100, \"jitter\": \"none\"}}");
    get();
    launch_head(0, 503);
    cr_assert_eq(in_flight(), 1, "its body is being read");
    at(10);
    launch_body_ends(0);
    cr_assert_eq(in_flight(), 0, "in flight during the backoff wait");
    at(110);
    cr_assert_eq(up.launches, 2);
    cr_assert_eq(in_flight(), 1);
    launch_answers(1, 200, NULL);
    cr_assert_eq(in_flight(), 0);
    end_request();
}

/* The deadline, or the client leaving, cuts a streaming body off: out of flight at once, while
 * the request itself lives on (its connection). */
Test(retry_timers, a_stream_cut_off_by_the_deadline_leaves_flight_at_once)
{
    start("\"timeout_ms\": 1000");
    get();
    launch_head(0, 200);
    at(999);
    cr_assert_eq(in_flight(), 1);
    at(1000);
    cr_assert(client.ended && client.failed, "the body was not cut off");
    cr_assert(!running(0));
    cr_assert_eq(in_flight(), 0, "a cancelled stream stayed in flight");
    end_request();
}

Test(retry_timers, a_stream_whose_client_left_leaves_flight_once)
{
    start("");
    get();
    launch_head(0, 200);
    cr_assert_eq(in_flight(), 1);
    retry_req_completed(req); /* the connection is gone mid-body */
    req = NULL;
    cr_assert(!running(0));
    cr_assert_eq(in_flight(), 0);
}

/* Hedging: both attempts in flight; the winner's stream stays in flight, the loser leaves once
 * cancelled (the next turn), and nothing is left when the winner's body ends. */
Test(retry_timers, a_hedge_winner_streams_in_flight_and_the_loser_leaves)
{
    hedged(10, 3);
    cr_assert_eq(in_flight(), 2);
    launch_head(1, 200);
    cr_assert_eq(client.status, 200);
    at(150);
    cr_assert(!running(0), "the slow attempt outlived the answer");
    cr_assert_eq(in_flight(), 1, "the loser stayed in flight, or the winner left");
    launch_body_ends(1);
    cr_assert_eq(in_flight(), 0);
    end_request();
}
