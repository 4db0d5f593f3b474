/* The request state machine (proxy/core/retry.c) on a fake clock: a gRPC status in a
 * response's trailers (proxy/core/keep.c, docs/grpc.md) and a request's trailers
 * (docs/forwarding.md "Request trailers") (tests/support/faked/retryfake.h).
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

/* ---- a gRPC status in trailers (proxy/core/keep.c, docs/grpc.md) ---- */

#define GRPC_ROUTE                                                                                 \
    "\"retry\": {\"max_attempts\": 3, \"retry_on\": [\"unavailable\"], " CFG_FAST_FIXED "}"
#define CFG_FAST_FIXED "\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 10, \"jitter\": \"none\"}"

/* A gRPC call (a POST) on a route that retries UNAVAILABLE, its first attempt launched. */
static void grpc_call(const char *route_json)
{
    start(route_json);
    client.content_type = "application/grpc";
    client.trailer_status = -1;
    open_request("POST");
    cr_assert_eq(up.launches, 1);
}

/* One gRPC message of 'n' payload bytes into buf (5 + n bytes). */
static size_t message(char *buf, uint32_t n)
{
    buf[0] = 0;
    buf[1] = (char)(n >> 24);
    buf[2] = (char)(n >> 16);
    buf[3] = (char)(n >> 8);
    buf[4] = (char)n;
    memset(buf + 5, 'm', n);
    return 5 + n;
}

/* Launch 'k''s response ends complete, with trailers holding grpc-status 'status'. */
static void grpc_ends(unsigned k, int status)
{
    struct attempt *a = up.launched[k];
    char v[16];
    snprintf(v, sizeof(v), "%d", status);
    hlist_add(&a->trailers, "grpc-status", 11, v, strlen(v));
    up.running[k] = false;
    a->ops->done(a, ATTEMPT_COMPLETE);
}

/* Launch 'k' answers 200 without grpc-status, then 'n' body bytes, then (when 'status' >= 0)
 * trailers with that grpc-status and its end. */
static void grpc_answers(unsigned k, const char *body, size_t n, int status)
{
    launch_head(k, 200);
    struct attempt *a = up.launched[k];
    if (n && up.running[k])
        cr_assert_eq(a->ops->body(a, body, n), n);
    if (status >= 0 && up.running[k])
        grpc_ends(k, status);
}

Test(retry_timers, a_grpc_status_in_the_trailers_is_retried_and_nothing_reached_the_client)
{
    grpc_call(GRPC_ROUTE);
    char m[64];
    size_t n = message(m, 3);
    grpc_answers(0, m, n, 14);
    cr_expect_eq(client.answers, 0, "held back, then retried: the client saw nothing");
    at(9);
    cr_expect_eq(up.launches, 1);
    at(10);
    cr_assert_eq(up.launches, 2, "the retry after the backoff");
    grpc_answers(1, m, n, 0);
    cr_expect_eq(client.answers, 1);
    cr_expect_eq(client.status, 200);
    cr_expect_str_eq(client.code, "response");
    cr_expect_eq(client.body_bytes, n, "the held message, once");
    cr_expect(client.ended && !client.failed);
    cr_expect_eq(client.trailer_status, 0, "the trailers relayed");
    cr_expect_eq(client.attempts, 2);
    cr_expect_eq(metric("retryproxy_retries_total{route=\"r\",reason=\"unavailable\"}"), 1);
    end_request();
}

Test(retry_timers, a_grpc_status_retry_on_does_not_name_is_relayed_with_its_trailers)
{
    grpc_call(GRPC_ROUTE);
    char m[64];
    size_t n = message(m, 10);
    grpc_answers(0, m, n, 5);
    cr_expect_eq(client.answers, 1);
    cr_expect_eq(client.body_bytes, n);
    cr_expect_eq(client.trailer_status, 5);
    at(1000);
    cr_expect_eq(up.launches, 1);
    end_request();
}

Test(retry_timers, a_second_message_commits_the_call_and_its_status_is_never_retried)
{
    grpc_call(GRPC_ROUTE);
    char m[64];
    size_t n = message(m, 3);
    n += message(m + n, 4); /* two messages: a server-streaming call */
    grpc_answers(0, m, n, -1);
    cr_expect_eq(client.answers, 1, "streaming from the second message on");
    cr_expect_eq(client.body_bytes, n);
    grpc_ends(0, 14);
    cr_expect_eq(client.trailer_status, 14, "relayed as it came");
    at(1000);
    cr_expect_eq(up.launches, 1, "committed: never retried");
    end_request();
}

Test(retry_timers, a_response_too_large_to_hold_streams)
{
    grpc_call(GRPC_ROUTE);
    static char big[40 * 1024];
    size_t n = message(big, sizeof(big) - 5); /* one message, larger than what is held */
    launch_head(0, 200);
    struct attempt *a = up.launched[0];
    cr_assert_eq(a->ops->body(a, big, 16384), 16384);
    cr_assert_eq(a->ops->body(a, big + 16384, 16384), 16384);
    cr_expect_eq(client.answers, 0, "32 KiB held");
    cr_assert_eq(a->ops->body(a, big + 32768, n - 32768), n - 32768);
    cr_expect_eq(client.answers, 1);
    cr_expect_eq(client.body_bytes, n, "what was held, then the rest");
    grpc_ends(0, 14);
    at(1000);
    cr_expect_eq(up.launches, 1);
    end_request();
}

Test(retry_timers, when_retrying_stops_the_last_attempt_streams_with_its_trailers)
{
    grpc_call("\"retry\": {\"max_attempts\": 2, \"retry_on\": [\"unavailable\"], " CFG_FAST_FIXED
              "}");
    char m[64];
    size_t n = message(m, 3);
    grpc_answers(0, m, n, 14);
    at(10);
    cr_assert_eq(up.launches, 2);
    launch_head(1, 200);
    cr_expect_eq(client.answers, 1, "the last attempt is not held: nothing could follow it");
    grpc_ends(1, 14);
    cr_expect_eq(client.trailer_status, 14);
    cr_expect_eq(client.attempts, 2);
    end_request();
}

Test(retry_timers, a_held_response_that_breaks_off_is_never_passed_off_as_good)
{
    grpc_call(GRPC_ROUTE);
    char m[64];
    size_t n = message(m, 3);
    grpc_answers(0, m, n, -1);
    cr_expect_eq(client.answers, 0);
    launch_fails(0, true);
    cr_expect_eq(client.answers, 1);
    cr_expect_eq(client.status, 502, "a reset on a call that is a POST: not retried");
    cr_expect_str_eq(client.code, "upstream_unavailable");
    cr_expect_eq(client.body_bytes, 0, "not a byte of the broken response");
    cr_expect_eq(up.launches, 1);
    end_request();
}

Test(retry_timers, a_saved_grpc_response_keeps_its_trailers)
{
    grpc_call("\"retry\": {\"max_attempts\": 3, \"retry_on\": [\"unavailable\"], " CFG_FAST_FIXED
              "}, \"timeout_ms\": 300");
    char m[64];
    size_t n = message(m, 3);
    grpc_answers(0, m, n, 14);
    at(10);
    cr_assert_eq(up.launches, 2);
    at(300); /* the retry never answers: at the deadline, the response retrying stopped on */
    cr_expect_eq(client.answers, 1);
    cr_expect_str_eq(client.code, "saved");
    cr_expect_eq(client.body_bytes, n);
    cr_expect_eq(client.trailer_status, 14, "with its trailers");
    cr_expect_eq(client.attempts, 2);
    end_request();
}

/* ---- request trailers (retry_req_trailer, docs/forwarding.md "Request trailers") ---- */

static void trailer(const char *k, const char *v)
{
    retry_req_trailer(req, k, strlen(k), v, strlen(v));
}

/* A GET whose head is in: its trailers follow, then its end. */
static void open_head(void)
{
    client.f = retry_req_new(&w, &fake_ops, sizeof(struct front), FRONT_HTTP1, "/x", "127.0.0.1",
                             40000, REFUSE_NONE);
    cr_assert_not_null(client.f);
    req = client.f->req;
    retry_req_head(req, "GET");
}

Test(retry_timers, request_trailers_go_with_every_attempt_but_the_proxys_own)
{
    start("\"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 10, \"jitter\": "
          "\"none\"}}");
    open_head();
    trailer("X-Checksum", "abc");
    trailer("Content-Length", "3");
    trailer("X-Forwarded-For", "6.6.6.6");
    trailer("X-Retry-Attempt", "9");
    trailer("TE", "trailers");
    trailer(":path", "/elsewhere");
    trailer("X_Under", "1"); /* limits.headers_with_underscores "drop", the default */
    trailer("x-sig-bin", "AAEC/w==");
    retry_req_end(req);
    cr_assert_eq(up.launches, 1);
    at(5);
    attempt_fails(false);
    at(15);
    cr_assert_eq(up.launches, 2);
    for (unsigned k = 0; k < 2; k++) {
        const struct hlist *t = up.trailers[k];
        cr_assert_not_null(t, "launch %u sent no trailers", k);
        cr_expect_eq(t->count, 2, "launch %u: %zu trailers", k, t->count);
        size_t pos = 0;
        const char *n, *v;
        cr_assert(hlist_next(t, &pos, &n, &v));
        cr_expect_str_eq(n, "x-checksum", "names go in lowercase");
        cr_expect_str_eq(v, "abc");
        cr_assert(hlist_next(t, &pos, &n, &v));
        cr_expect_str_eq(n, "x-sig-bin");
        cr_expect_str_eq(v, "AAEC/w==");
    }
    end_request();
}

/* limits.max_header_bytes (8192 here) and 100 fields bound the head and the trailers together:
 * past either, none of the trailers goes, the request does. */
Test(retry_timers, request_trailers_past_the_head_bounds_are_all_left_out)
{
    start("");
    open_head();
    trailer("X-A", "1");
    char big[8100];
    memset(big, 'v', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    trailer("X-Big", big);
    trailer("X-C", "2");
    retry_req_end(req);
    cr_assert_eq(up.launches, 1, "the request goes on");
    cr_expect_eq(up.trailers[0]->count, 0, "some trailers went");
    end_request();

    /* its head has one field: 99 trailers fit, not 100 */
    for (unsigned n = 99; n <= 100; n++) {
        open_head();
        char name[16];
        for (unsigned i = 0; i < n; i++) {
            snprintf(name, sizeof(name), "X-T%u", i);
            trailer(name, "1");
        }
        retry_req_end(req);
        cr_expect_eq(up.trailers[up.launches - 1]->count, n == 99 ? 99 : 0, "%u trailers", n);
        end_request();
    }
}
