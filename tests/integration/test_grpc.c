/* gRPC calls through the request core (docs/grpc.md), with an HTTP/1.1 client and the test
 * upstream: what makes a request a gRPC call (its Content-Type), retries by the grpc-status of
 * a Trailers-Only response, grpc-timeout as the call's deadline and each attempt's own, and
 * retryproxy's own errors as gRPC statuses. The core knows no protocol: what holds here holds
 * behind the HTTP/2 front end too.
 *
 * Each test asserts what the upstream received (attempts, the grpc-timeout it was given) as
 * well as what the client got.
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/http/grpc.h"
#include "tests/support/fixture.h"

#define T 10000 /* ms: upper bound for any single request in these tests */

TestSuite(grpc, .fini = fx_stop, .timeout = 60);

/* Route "svc" (/svc) retries unavailable and internal, 3 attempts, 10 s; anything else 404. */
static void start(void)
{
    fx_upstreams(1);
    struct cfgb *b = cfgb_new();
    cfgb_route(
        b, "svc",
        "\"match\": {\"path_prefix\": \"/svc\"}, \"timeout_ms\": 10000,"
        "\"retry\": {\"max_attempts\": 3, \"retry_on\": [\"unavailable\", \"internal\"], " CFG_FAST
        "}");
    fx_start_b(b, "--workers", "2", NULL);
}

/* A unary call (a POST of one 5-byte message) to 'path' with 'content_type', request id 'id',
 * the upstream's plan 'plan' and one more field 'extra' (may be NULL). */
static void call(const char *path, const char *content_type, const char *id, const char *plan,
                 const char *extra, struct http_resp *r)
{
    char ct[96], idh[96], planh[128], url[256];
    snprintf(ct, sizeof(ct), "Content-Type: %s", content_type);
    snprintf(idh, sizeof(idh), "X-Request-Id: %s", id);
    snprintf(planh, sizeof(planh), "X-Test-Plan: %s", plan ? plan : "");
    const char *h[] = { ct, idh, "TE: trailers", planh, extra, NULL };
    static const char msg[5] = { 0, 0, 0, 0, 0 }; /* an empty message, uncompressed */
    http_do("POST", px_url(px, path, url, sizeof(url)), h, msg, sizeof(msg), T, r);
    cr_assert_eq(r->rc, 0, "curl error %d", r->rc);
}

Test(grpc, a_grpc_status_named_in_retry_on_is_retried_though_the_call_is_a_post)
{
    start();
    struct http_resp r;
    call("/svc/Echo", "application/grpc", "unavail-twice",
         "fail=2;status=200;header=grpc-status:14", NULL, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_null(http_hdr(&r, "grpc-status"), "the third attempt's answer, which has none");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "3");
    cr_expect_eq(tup_count_id(up, "unavail-twice"), 3, "the upstream saw every attempt");
    const struct tup_req *q = tup_get(up, 0);
    cr_assert_not_null(q);
    cr_expect_eq(tup_req_header_count(q, "TE"), 1, "the proxy's own TE, once");
    cr_expect_str_eq(tup_req_header(q, "TE"), "trailers", "a gRPC server wants to see it");
    http_free(&r);
}

Test(grpc, a_post_that_is_not_a_grpc_call_is_not_retried_by_a_grpc_status)
{
    start();
    struct http_resp r;
    call("/svc/Echo", "application/json", "not-grpc", "fail=2;status=200;header=grpc-status:14",
         NULL, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "grpc-status"), "14", "passed through as it came");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "1");
    cr_expect_eq(tup_count_id(up, "not-grpc"), 1);
    http_free(&r);
}

Test(grpc, a_status_retry_on_does_not_name_is_the_answer)
{
    start();
    struct http_resp r;
    call("/svc/Echo", "application/grpc+proto", "not-found",
         "fail=1;status=200;header=grpc-status:5", NULL, &r);
    cr_expect_str_eq(http_hdr(&r, "grpc-status"), "5");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "1");
    cr_expect_eq(tup_count_id(up, "not-found"), 1);
    http_free(&r);
}

Test(grpc, when_retrying_stops_the_last_status_is_returned)
{
    start();
    struct http_resp r;
    call("/svc/Echo", "application/grpc", "unavail-always",
         "fail=9;status=200;header=grpc-status:13", NULL, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "grpc-status"), "13");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Stop"), "max-attempts");
    cr_expect_eq(tup_count_id(up, "unavail-always"), 3);
    http_free(&r);
}

Test(grpc, grpc_timeout_lowers_the_deadline_and_each_attempt_carries_its_own)
{
    start();
    struct http_resp r;
    call("/svc/Slow", "application/grpc", "deadline", "delay=3000", "grpc-timeout: 400m", &r);
    cr_expect_lt(r.seconds, 2.5, "the call's 400 ms, not the route's 10 s");
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "grpc-status"), "4", "DEADLINE_EXCEEDED");
    cr_assert_eq(tup_count_id(up, "deadline"), 1);
    const struct tup_req *q = tup_get(up, 0);
    cr_assert_not_null(q);
    cr_expect_eq(tup_req_header_count(q, "grpc-timeout"), 1, "the proxy's, not the client's too");
    const char *v = tup_req_header(q, "grpc-timeout");
    uint64_t ms;
    cr_assert_not_null(v);
    cr_assert_eq(grpc_timeout_parse(v, strlen(v), &ms), 0, "\"%s\"", v);
    cr_expect(ms > 0 && ms <= 400, "the time left, %s", v);
    http_free(&r);
}

Test(grpc, a_longer_grpc_timeout_does_not_lengthen_the_route_timeout)
{
    start();
    struct http_resp r;
    call("/svc/Echo", "application/grpc", "long", NULL, "grpc-timeout: 1H", &r);
    cr_expect_eq(r.status, 200);
    const char *v = tup_req_header(tup_get(up, 0), "grpc-timeout");
    uint64_t ms;
    cr_assert_not_null(v);
    cr_assert_eq(grpc_timeout_parse(v, strlen(v), &ms), 0);
    cr_expect(ms <= 10000, "the route's 10 s bound it: %s", v);
    http_free(&r);
}

Test(grpc, errors_of_our_own_are_grpc_statuses_on_a_grpc_call_only)
{
    start();
    struct http_resp r;
    call("/nowhere", "application/grpc", "no-route", NULL, NULL, &r);
    cr_expect_eq(r.status, 200, "a Trailers-Only response");
    cr_expect_str_eq(http_hdr(&r, "grpc-status"), "12", "UNIMPLEMENTED");
    cr_expect_str_eq(http_hdr(&r, "grpc-message"), "no route matches this request");
    cr_expect_str_eq(http_hdr(&r, "Content-Type"), "application/grpc");
    cr_expect_eq(r.body_len, 0);
    http_free(&r);
    call("/nowhere", "application/json", "no-route-json", NULL, NULL, &r);
    cr_expect_eq(r.status, 404);
    cr_expect_null(http_hdr(&r, "grpc-status"));
    cr_expect(r.body_len > 0 && strstr((const char *)r.body, "\"no_route\""));
    http_free(&r);
    call("/svc/Echo", "application/grpc", "bad-timeout", NULL, "grpc-timeout: 5 seconds", &r);
    cr_expect_str_eq(http_hdr(&r, "grpc-status"), "13", "INTERNAL, as gRPC maps a 400");
    cr_expect_eq(tup_count_id(up, "bad-timeout"), 0, "nothing forwarded");
    http_free(&r);
}

/* A call of 'n' body bytes (the pattern of tup_pattern_fill) to route "svc". */
static void call_body(const char *id, const char *plan, size_t n, struct http_resp *r)
{
    char idh[96], planh[128], url[256];
    snprintf(idh, sizeof(idh), "X-Request-Id: %s", id);
    snprintf(planh, sizeof(planh), "X-Test-Plan: %s", plan);
    const char *h[] = { "Content-Type: application/grpc", idh, planh, NULL };
    unsigned char *body = malloc(n);
    cr_assert_not_null(body);
    tup_pattern_fill(body, 0, n);
    http_do("POST", px_url(px, "/svc/Upload", url, sizeof(url)), h, body, n, T, r);
    free(body);
    cr_assert_eq(r->rc, 0, "curl error %d", r->rc);
}

Test(grpc, a_calls_body_streams_as_it_comes_and_its_kept_copy_goes_again)
{
    fx_upstreams(1);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "svc",
               "\"retry\": {\"max_attempts\": 3, \"retry_on\": [\"unavailable\"],"
               " \"max_retry_body_bytes\": 200000, " CFG_FAST "}");
    fx_start_b(b, NULL);
    struct http_resp r;
    call_body("tee", "fail=1;status=200;header=grpc-status:14", 150000, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    cr_assert_eq(tup_count_id(up, "tee"), 2);
    for (size_t i = 0; i < 2; i++) {
        const struct tup_req *q = tup_get(up, i);
        cr_expect_eq(q->body_len, 150000, "attempt %zu", i + 1);
        cr_expect_eq(q->body_hash, tup_pattern_hash(150000), "attempt %zu: the same bytes", i + 1);
    }
    http_free(&r);
}

Test(grpc, a_call_whose_body_outgrows_the_replay_limit_goes_once)
{
    fx_upstreams(1);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "svc",
               "\"retry\": {\"max_attempts\": 3, \"retry_on\": [\"unavailable\"],"
               " \"max_retry_body_bytes\": 1000, " CFG_FAST "}");
    fx_start_b(b, NULL);
    struct http_resp r;
    call_body("big", "fail=1;status=200;header=grpc-status:14", 50000, &r);
    cr_expect_str_eq(http_hdr(&r, "grpc-status"), "14", "the one attempt's answer");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Stop"), "body-too-large");
    cr_assert_eq(tup_count_id(up, "big"), 1);
    cr_expect_eq(tup_get(up, 0)->body_hash, tup_pattern_hash(50000), "every byte, once");
    http_free(&r);
}

Test(grpc, calls_are_counted_by_status_and_protocol_and_logged)
{
    start();
    struct http_resp r;
    call("/svc/Echo", "application/grpc", "count-14", "fail=9;status=200;header=grpc-status:14",
         NULL, &r);
    http_free(&r);
    call("/nowhere", "application/grpc", "count-12", NULL, NULL, &r);
    http_free(&r);
    call("/svc/Echo", "application/json", "count-json", NULL, NULL, &r);
    http_free(&r);
    cr_expect_eq(
        fx_wait_metric("retryproxy_grpc_responses_total{route=\"svc\",grpc_status=\"14\"}", 1, T),
        1, "the status the call ended with, once, not per attempt");
    cr_expect_eq(fx_metric("retryproxy_grpc_responses_total{route=\"\",grpc_status=\"12\"}"), 1,
                 "retryproxy's own UNIMPLEMENTED");
    cr_expect_eq(
        fx_metric("retryproxy_requests_by_protocol_total{route=\"svc\",protocol=\"http1\"}"), 2);
    json_t *j = fx_request_logged("request_id", "count-14");
    cr_assert_not_null(j, "no request log line");
    cr_expect_str_eq(json_str(j, "protocol"), "HTTP/1.1");
    cr_expect_eq(json_integer_value(json_object_get(j, "grpc_status")), 14);
    json_decref(j);
    j = fx_request_logged("request_id", "count-json");
    cr_assert_not_null(j);
    cr_expect_null(json_object_get(j, "grpc_status"), "only gRPC calls have one");
    json_decref(j);
}

/* A response without grpc-status whose HTTP status is not 200 (a 503 from a load balancer that
 * speaks no gRPC) has the status gRPC's clients give it (doc/http-grpc-status-mapping.md: 503
 * is UNAVAILABLE): retry_on's "unavailable" retries it, though the call is a POST, and the
 * call is counted and logged with it. */
Test(grpc, an_http_503_without_grpc_status_is_unavailable)
{
    start();
    struct http_resp r;
    call("/svc/Echo", "application/grpc", "http-503", "fail=1;status=503", NULL, &r);
    cr_expect_eq(r.status, 200, "the second attempt's answer");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    cr_expect_eq(tup_count_id(up, "http-503"), 2);
    http_free(&r);
    call("/svc/Echo", "application/grpc", "http-503-always", "fail=9;status=503", NULL, &r);
    cr_expect_eq(r.status, 503, "returned as it came when retrying stops");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "3");
    http_free(&r);
    json_t *j = fx_request_logged("request_id", "http-503-always");
    cr_assert_not_null(j, "no request log line");
    cr_expect_eq(json_integer_value(json_object_get(j, "grpc_status")), 14);
    json_decref(j);
    call("/svc/Echo", "application/grpc", "http-404", "fail=1;status=404", NULL, &r);
    cr_expect_eq(r.status, 404, "UNIMPLEMENTED: not retried");
    cr_expect_eq(tup_count_id(up, "http-404"), 1);
    http_free(&r);
}

/* grpc-timeout: 0m is a deadline that has passed: DEADLINE_EXCEEDED at once, and no attempt
 * reaches the upstream (it would be told 1 ms, and a fast one could even answer it). */
Test(grpc, a_grpc_timeout_of_0_is_deadline_exceeded_without_an_attempt)
{
    start();
    struct http_resp r;
    for (int i = 0; i < 3; i++) {
        call("/svc/Echo", "application/grpc", "zero", NULL, "grpc-timeout: 0m", &r);
        cr_expect_eq(r.status, 200);
        cr_expect_str_eq(http_hdr(&r, "grpc-status"), "4", "DEADLINE_EXCEEDED");
        http_free(&r);
    }
    cr_expect_eq(tup_count_id(up, "zero"), 0, "an attempt went");
}
