/* The HTTP/2 front end (docs/http2.md): clients speaking HTTP/2 with prior knowledge on the
 * proxy's one port, the upstream the test upstream over HTTP/1.1.
 *
 * Each test asserts what the upstream received (method, target, Host, fields, body hash,
 * attempts) as well as what the client got. The clients: libcurl (http_do_h2), curl's and
 * nghttp2's command-line tools, and tests/tools/h2peer.py (python3-h2) for the misbehaving
 * ones (resets, floods, a reader that never reads), which prints one line of results.
 */
#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/h2u.h"

#define T 10000 /* ms: upper bound for any single request in these tests */

TestSuite(h2_front, .fini = fx_stop, .timeout = 60);

/* Route "r" (/r...) to upstream 0 with the given retry settings and extra route keys; 'top'
 * extra top-level keys. */
static void start(const char *top, const char *route_extra, const char *retry)
{
    fx_upstreams(1);
    struct cfgb *b = cfgb_new();
    if (top && *top)
        cfgb_top(b, "%s", top);
    cfgb_route(b, "r", "\"match\": {\"path_prefix\": \"/r\"}%s%s, \"retry\": {%s}",
               route_extra && *route_extra ? ", " : "", route_extra ? route_extra : "",
               retry ? retry : CFG_FAST);
    fx_start_b(b, "--workers", "1", NULL);
}

static void h2(const char *method, const char *path, const char *const *headers, const void *body,
               size_t len, struct http_resp *r)
{
    char url[256];
    http_do_h2(method, px_url(px, path, url, sizeof(url)), headers, body, len, T, r);
    cr_assert_eq(r->rc, 0, "curl error %d on %s %s over HTTP/2", r->rc, method, path);
}

/* The proxy answers a new connection after an attack on another. */
static void still_answers(void)
{
    struct http_resp r;
    h2("GET", "/r/after", NULL, NULL, 0, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
}

/* ---- requests ---- */

Test(h2_front, get_reaches_upstream_with_method_path_host_and_fields)
{
    start("", "\"preserve_host\": true", NULL);
    const char *hs[] = { "X-Custom: v1", "X-Request-Id: h2-get-1", NULL };
    struct http_resp r;
    h2("GET", "/r/items?q=1", hs, NULL, 0, &r);
    cr_expect_eq(r.status, 200);
    cr_expect(strncmp(r.headers, "HTTP/2 200", 10) == 0, "not HTTP/2: %.40s", r.headers);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "1");
    cr_expect_str_eq(http_hdr(&r, "X-Request-Id"), "h2-get-1");
    cr_assert_eq(tup_wait_count(up, 1, T), 0);
    const struct tup_req *q = tup_get(up, 0);
    cr_expect_str_eq(q->method, "GET");
    cr_expect_str_eq(q->target, "/r/items?q=1");
    char host[64];
    snprintf(host, sizeof(host), "127.0.0.1:%u", px->port);
    cr_expect_str_eq(tup_req_header(q, "Host"), host, "the :authority is the Host");
    cr_expect_str_eq(tup_req_header(q, "X-Custom"), "v1");
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-For"), "127.0.0.1", "the peer's address");
    cr_expect_str_eq(q->request_id, "h2-get-1");
    for (size_t i = 0; i < q->n_headers; i++)
        cr_expect(q->headers[i].name[0] != ':', "pseudo-header %s forwarded", q->headers[i].name);
    cr_expect_null(tup_req_header(q, "TE"));
    http_free(&r);
}

Test(h2_front, post_body_reaches_upstream_whole)
{
    start("", NULL, NULL);
    static unsigned char body[300000];
    tup_pattern_fill(body, 0, sizeof(body));
    const char *hs[] = { "X-Request-Id: h2-post-1", "Content-Type: application/octet-stream",
                         NULL };
    struct http_resp r;
    h2("POST", "/r/upload", hs, body, sizeof(body), &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "1");
    cr_assert_eq(tup_wait_count(up, 1, T), 0);
    const struct tup_req *q = tup_get(up, 0);
    cr_expect_str_eq(q->method, "POST");
    cr_expect_eq(q->body_len, sizeof(body));
    cr_expect_eq(q->body_hash, tup_pattern_hash(sizeof(body)));
    cr_expect_str_eq(tup_req_header(q, "Content-Type"), "application/octet-stream");
    http_free(&r);
}

Test(h2_front, upload_of_no_declared_length_reaches_upstream)
{
    start("", NULL, NULL);
    char line[256];
    h2u_peer(line, sizeof(line), "upload %u /r/up 200000", px->port);
    cr_expect_eq(h2u_peer_field(line, "status"), 200, "%s", line);
    cr_assert_eq(tup_wait_count(up, 1, T), 0);
    const struct tup_req *q = tup_get(up, 0);
    cr_expect_eq(q->body_len, 200000);
}

Test(h2_front, response_body_streams_back_whole)
{
    start("", NULL, NULL);
    const char *hs[] = { "X-Test-Plan: body=3000000", NULL };
    struct http_resp r;
    h2("GET", "/r/big", hs, NULL, 0, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, 3000000);
    cr_expect_eq(r.body_hash, tup_pattern_hash(3000000));
    http_free(&r);
}

Test(h2_front, retries_work_per_stream)
{
    start("", NULL, "\"max_attempts\": 4, \"retry_on\": [\"5xx\"], " CFG_FAST);
    const char *hs[] = { "X-Request-Id: h2-retry-1", "X-Test-Plan: fail=2", NULL };
    struct http_resp r;
    h2("GET", "/r/flaky", hs, NULL, 0, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "3");
    cr_expect_eq(tup_count_id(up, "h2-retry-1"), 3);
    http_free(&r);
    /* retries exhausted: the last 503 with the X-Retry-* fields */
    const char *hs2[] = { "X-Request-Id: h2-retry-2", "X-Test-Plan: fail=9", NULL };
    h2("GET", "/r/flaky", hs2, NULL, 0, &r);
    cr_expect_eq(r.status, 503);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "4");
    cr_expect_not_null(http_hdr(&r, "X-Retry-Stop"));
    cr_expect_eq(tup_count_id(up, "h2-retry-2"), 4);
    http_free(&r);
}

Test(h2_front, no_route_is_a_json_404)
{
    start("", NULL, NULL);
    struct http_resp r;
    h2("GET", "/nowhere", NULL, NULL, 0, &r);
    cr_expect_eq(r.status, 404);
    cr_expect_str_eq(http_hdr(&r, "Content-Type"), "application/json");
    cr_expect_not_null(strstr((const char *)r.body, "\"error\": \"no_route\""), "%.*s",
                       (int)r.body_len, r.body);
    cr_expect_not_null(http_hdr(&r, "X-Request-Id"));
    cr_expect_eq(tup_count(up), 0);
    http_free(&r);
}

Test(h2_front, a_request_over_http2_is_counted_once)
{
    start("", NULL, NULL);
    struct http_resp r;
    h2("GET", "/r/count", NULL, NULL, 0, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    cr_expect_eq(fx_wait_metric("retryproxy_requests_total{route=\"r\",code=\"200\"}", 1, T), 1);
    cr_expect_eq(fx_metric("retryproxy_requests_total{route=\"r\",code=\"200\"}"), 1);
}

/* ---- one port, both protocols ---- */

Test(h2_front, http1_still_works_on_the_same_port)
{
    start("", NULL, NULL);
    struct http_resp r;
    char url[256];
    http_do("GET", px_url(px, "/r/one", url, sizeof(url)), NULL, NULL, 0, T, &r);
    cr_expect_eq(r.rc, 0);
    cr_expect_eq(r.status, 200);
    cr_expect(strncmp(r.headers, "HTTP/1.1 200", 12) == 0, "%.40s", r.headers);
    http_free(&r);
    h2("GET", "/r/two", NULL, NULL, 0, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    cr_expect_eq(tup_count(up), 2);
}

/* An HTTP/1.1 request arriving one byte at a time, the first bytes not yet telling: it is
 * still handed to libmicrohttpd with every byte. */
Test(h2_front, http1_bytes_one_at_a_time)
{
    start("", NULL, NULL);
    int fd = fx_hold(raw_dial(px->port));
    const char req[] = "POST /r/slow HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi";
    for (size_t i = 0; i < sizeof(req) - 1; i++) {
        cr_assert(raw_send_all(fd, req + i, 1));
        usleep(5000);
    }
    char buf[2048];
    ssize_t n = raw_recv(fd, buf, sizeof(buf) - 1, T);
    cr_assert_gt(n, 0);
    buf[n] = '\0';
    cr_expect(strncmp(buf, "HTTP/1.1 200", 12) == 0, "%s", buf);
    cr_assert_eq(tup_wait_count(up, 1, T), 0);
    cr_expect_eq(tup_get(up, 0)->body_len, 2);
}

/* A beginning of the preface that stops: closed after limits.header_timeout_ms. */
Test(h2_front, partial_preface_closed_after_header_timeout)
{
    start("\"limits\": {\"header_timeout_ms\": 300}", NULL, NULL);
    int fd = fx_hold(raw_dial(px->port));
    cr_assert(raw_send_all(fd, "PRI * HTTP/2.0\r\n", 16));
    int64_t t0 = now_ms();
    char buf[256];
    ssize_t n = raw_recv(fd, buf, sizeof(buf), 5000);
    cr_expect(n == 0 || n == -1, "the connection stays open (%zd)", n);
    cr_expect_lt(now_ms() - t0, 3000);
    cr_expect_geq(now_ms() - t0, 250);
}

/* An HTTP/2 connection with nothing open and nothing sent for limits.connection_timeout_ms
 * gets a GOAWAY and is closed. */
Test(h2_front, idle_connection_closed_after_connection_timeout)
{
    start("\"limits\": {\"connection_timeout_ms\": 500}", NULL, NULL);
    char line[256];
    h2u_peer(line, sizeof(line), "idle %u", px->port);
    cr_expect_eq(h2u_peer_field(line, "goaway"), 0, "%s", line);
    cr_expect_geq(h2u_peer_field(line, "ms"), 400, "%s", line);
    cr_expect_lt(h2u_peer_field(line, "ms"), 4000, "%s", line);
}

/* connection_timeout_ms 0 is "never", for HTTP/2 connections too. */
Test(h2_front, no_idle_timeout_when_it_is_zero)
{
    start("\"limits\": {\"connection_timeout_ms\": 0}", NULL, NULL);
    char line[256];
    h2u_peer(line, sizeof(line), "idle %u 1.5", px->port);
    cr_expect_eq(h2u_peer_field(line, "goaway"), -1, "closed: %s", line);
    cr_expect_geq(h2u_peer_field(line, "ms"), 1400, "closed: %s", line);
}

/* An HTTP/2 connection is one in the connections gauge while it is open. */
Test(h2_front, connections_gauge_counts_an_http2_connection)
{
    start("", NULL, NULL);
    cr_assert_eq(fx_wait_metric("retryproxy_connections_active", 0, T), 0);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), H2U_PEER " idle %u 2 >/dev/null &", px->port);
    cr_assert_eq(fx_sh(cmd), 0);
    cr_expect_eq(fx_wait_metric("retryproxy_connections_active", 1, T), 1);
    cr_expect_eq(fx_wait_metric("retryproxy_connections_active", 0, T), 0, "not given back");
}

/* ---- many streams ---- */

Test(h2_front, h2load_200_requests_over_2_connections_20_streams_each)
{
    start("", NULL, NULL);
    char cmd[256], line[256];
    snprintf(cmd, sizeof(cmd), "h2load -n 200 -c 2 -m 20 http://127.0.0.1:%u/r/load 2>&1",
             px->port);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    bool all = false, codes = false;
    while (fgets(line, sizeof(line), p)) {
        if (strstr(line, "requests: 200 total, 200 started, 200 done, 200 succeeded"))
            all = true;
        if (strstr(line, "status codes: 200 2xx"))
            codes = true;
    }
    cr_expect_eq(pclose(p), 0);
    cr_expect(all && codes, "h2load did not get 200 answers of 200");
    cr_expect_eq(tup_count(up), 200);
}

/* Cookie fields split by the client reach an HTTP/1.1 upstream as one (RFC 9113 8.2.3). */
Test(h2_front, split_cookie_fields_are_joined)
{
    start("", NULL, NULL);
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "nghttp -H 'cookie: a=1' -H 'cookie: b=2' http://127.0.0.1:%u/r/cookie >/dev/null",
             px->port);
    cr_assert_eq(fx_sh(cmd), 0);
    cr_assert_eq(tup_wait_count(up, 1, T), 0);
    const struct tup_req *q = tup_get(up, 0);
    cr_expect_eq(tup_req_header_count(q, "Cookie"), 1);
    cr_expect_str_eq(tup_req_header(q, "Cookie"), "a=1; b=2");
}

Test(h2_front, nghttp_two_streams)
{
    start("", NULL, NULL);
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "nghttp -n -s http://127.0.0.1:%u/r/a http://127.0.0.1:%u/r/b 2>&1 | "
             "grep -c ' 200 '",
             px->port, px->port);
    FILE *p = popen(cmd, "r");
    char line[64] = "";
    cr_assert(fgets(line, sizeof(line), p) != NULL);
    pclose(p);
    cr_expect_eq(atoi(line), 2, "nghttp: %s", line);
    cr_expect_eq(tup_count(up), 2);
}

/* ---- the client going away ---- */

/* A stream reset while its request waits out a backoff delay: the core stops retrying. */
Test(h2_front, client_reset_during_backoff_stops_the_retries)
{
    start("", NULL,
          "\"max_attempts\": 5, \"retry_on\": [\"5xx\"], "
          "\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 1000, \"jitter\": \"none\"}");
    char line[256];
    h2u_peer(line, sizeof(line), "reset-in-backoff %u /r/wait h2-reset-1", px->port);
    sleep(2);
    cr_expect_eq(tup_count_id(up, "h2-reset-1"), 1, "the upstream saw retries after the reset");
    cr_expect_eq(fx_metric("retryproxy_retries_in_flight"), 0);
    /* the core was told the client went (retry_req_client_gone): a 499, "client-closed" */
    char *out = px_stdout(px);
    json_t *log = fx_log_line(out, "request");
    cr_assert_not_null(log, "no request log line: %s", out);
    cr_expect_eq(json_integer_value(json_object_get(log, "status")), 499);
    cr_expect_str_eq(json_str(log, "stop"), "client-closed");
    json_decref(log);
    free(out);
}

/* ---- drain ---- */

Test(h2_front, drain_sends_goaway_and_finishes_the_stream_in_flight)
{
    start("", NULL, NULL);
    char line[256];
    h2u_peer(line, sizeof(line), "drain %u /r/drain %d", px->port, (int)px->pid);
    cr_expect_eq(h2u_peer_field(line, "goaway"), 0, "%s", line);
    cr_expect_eq(h2u_peer_field(line, "last"), 1, "%s", line);
    cr_expect_eq(h2u_peer_field(line, "status"), 200, "%s", line);
    cr_expect_eq(h2u_peer_field(line, "ended"), 1, "%s", line);
    /* the drain ends with the stream: the proxy exits 0 by itself (a second SIGTERM from
     * px_stop() could meet it on its way out) */
    int st = 0;
    pid_t got = 0;
    for (int64_t end = now_ms() + T; got == 0 && now_ms() < end; usleep(10000))
        got = waitpid(px->pid, &st, WNOHANG);
    cr_expect_eq(got, px->pid, "the proxy did not exit after its drain");
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", st);
    px_stop(px, 0); /* its files; the process is gone */
    px = NULL;
}

/* ---- attacks (docs/hardening.md, "HTTP/2") ---- */

Test(h2_front, rapid_reset_flood_gets_goaway_and_the_proxy_stays_up)
{
    start("", NULL, NULL);
    char line[256];
    h2u_peer(line, sizeof(line), "rapid-reset %u /r/rr 1000", px->port);
    long code = h2u_peer_field(line, "goaway");
    cr_expect(code > 0, "no GOAWAY with an error: %s", line);
    still_answers();
}

Test(h2_front, continuation_flood_gets_goaway)
{
    start("", NULL, NULL);
    char line[256];
    h2u_peer(line, sizeof(line), "continuation %u /r/cont 100", px->port);
    cr_expect_eq(h2u_peer_field(line, "goaway"), 11, "no GOAWAY ENHANCE_YOUR_CALM: %s", line);
    still_answers();
}

/* 'method' 'path' with a header list past limits.max_header_bytes (4096), 'then' after it (or
 * NULL), to a proxy started for it. */
static void oversized(const char *method, const char *path, const char *then, struct http_resp *r)
{
    start("\"limits\": {\"max_header_bytes\": 4096}", NULL, NULL);
    static char big[6100];
    memcpy(big, "X-Big: ", 7);
    memset(big + 7, 'b', 6000);
    const char *hs[] = { big, then, NULL };
    h2(method, path, hs, NULL, 0, r);
}

Test(h2_front, oversized_header_list_is_a_431)
{
    struct http_resp r;
    oversized("GET", "/r/big-head", NULL, &r);
    cr_expect_eq(r.status, 431);
    cr_expect_not_null(strstr((const char *)r.body, "headers_too_large"));
    /* the limit in force, not a fixed figure (issue 27) */
    cr_expect_not_null(strstr((const char *)r.body, "request headers larger than "
                                                    "limits.max_header_bytes (4096 bytes) or 100 "
                                                    "fields"),
                       "%s", (const char *)r.body);
    cr_expect_eq(tup_count(up), 0);
    http_free(&r);
}

/* A gRPC call whose header list is too large gets a gRPC status, though its content type came
 * after the bound was passed: RESOURCE_EXHAUSTED, Trailers-Only (docs/grpc.md). */
Test(h2_front, an_oversized_grpc_head_is_a_grpc_status)
{
    struct http_resp r;
    oversized("POST", "/r/big-grpc", "Content-Type: application/grpc", &r);
    cr_expect_eq(r.status, 200, "a gRPC error is an HTTP 200: %ld", r.status);
    cr_expect_str_eq(http_hdr(&r, "grpc-status"), "8");
    cr_expect_eq(tup_count(up), 0);
    http_free(&r);
}

/* A whole answer before the whole request (a gRPC error here, the body still to come): more of
 * the body after it gets RST_STREAM NO_ERROR, so the client may stop sending (RFC 9113 8.1;
 * curl 7.88 otherwise waits for its timeout to end an upload the answer overtook). */
Test(h2_front, body_after_the_whole_answer_gets_a_no_error_reset)
{
    start("", NULL, NULL);
    char line[256];
    /* no route answers /nowhere: UNIMPLEMENTED at once, Trailers-Only */
    h2u_peer(line, sizeof(line), "early-answer %u /nowhere", px->port);
    cr_expect_eq(h2u_peer_field(line, "status"), 200, "%s", line);
    cr_expect_eq(h2u_peer_field(line, "ended"), 1, "%s", line);
    cr_expect_eq(h2u_peer_field(line, "reset"), 0, "no RST_STREAM NO_ERROR: %s", line);
    still_answers();
}

Test(h2_front, upload_past_max_body_bytes_is_a_413)
{
    start("\"limits\": {\"max_body_bytes\": 1000}", NULL, NULL);
    /* no declared length: refused as the bytes pass the limit */
    char line[256];
    h2u_peer(line, sizeof(line), "upload %u /r/up 200000", px->port);
    cr_expect_eq(h2u_peer_field(line, "status"), 413, "%s", line);
    cr_expect_lt(h2u_peer_field(line, "sent"), 200000, "the whole upload was taken: %s", line);
    /* a declared length: refused at the head */
    static char body[5000];
    struct http_resp r;
    h2("POST", "/r/up", NULL, body, sizeof(body), &r);
    cr_expect_eq(r.status, 413);
    cr_expect_not_null(strstr((const char *)r.body, "body_too_large"));
    http_free(&r);
    cr_expect_eq(tup_count(up), 0);
}

/* A stream whose reader never opens its window holds its 64 KiB and the upstream waits; a
 * second stream on the same connection is answered at once. */
Test(h2_front, slow_reader_of_one_stream_does_not_stall_another)
{
    start("", NULL, NULL);
    char line[256];
    h2u_peer(line, sizeof(line), "slow-reader %u /r/big /r/small", px->port);
    cr_expect_eq(h2u_peer_field(line, "small"), 200, "%s", line);
    cr_expect_eq(h2u_peer_field(line, "small_ended"), 1, "%s", line);
    cr_expect_leq(h2u_peer_field(line, "big"), 65535, "%s", line);
    cr_expect_lt(h2u_peer_field(line, "ms"), 3000, "%s", line);
}

/* ---- request trailers (docs/forwarding.md, "Request trailers") ---- */

/* A body kept for retries goes chunked to an HTTP/1.1 upstream, so that the client's trailing
 * HEADERS can follow it as trailers; an empty body too (HEADERS, then the trailing HEADERS). */
Test(h2_front, trailers_reach_an_http1_upstream_after_a_chunked_body)
{
    start("", NULL, NULL);
    const unsigned sizes[] = { 1000, 0 };
    for (unsigned k = 0; k < 2; k++) {
        char line[256];
        h2u_peer(
            line, sizeof(line),
            "trailers %u /r/t %u 'x-request-id:h2-trl-1' 'x-checksum:abc123;x-sig-bin:AAEC/w=='",
            px->port, sizes[k]);
        cr_expect_eq(h2u_peer_field(line, "status"), 200, "%s", line);
        cr_assert_eq(tup_wait_count(up, k + 1, T), 0);
        const struct tup_req *q = tup_get(up, k);
        cr_expect_eq(q->body_len, sizes[k]);
        cr_expect_str_eq(tup_req_header(q, "Transfer-Encoding"), "chunked");
        cr_expect_str_eq(tup_req_trailer(q, "x-checksum"), "abc123", "%u bytes", sizes[k]);
        cr_expect_str_eq(tup_req_trailer(q, "x-sig-bin"), "AAEC/w==", "%u bytes", sizes[k]);
        cr_expect_eq(q->n_trailers, 2);
    }
}

/* Streamed with its content-length (too large to keep), the body goes with that length: HTTP/1.1
 * then has no place for trailers, and they are left out; the request goes on. */
Test(h2_front, trailers_of_a_streamed_body_of_known_length_are_left_out_on_http1)
{
    start("", NULL, CFG_FAST ", \"max_retry_body_bytes\": 1024");
    char line[256];
    h2u_peer(line, sizeof(line),
             "trailers %u /r/t 5000 'x-request-id:h2-trl-2;content-length:5000' 'x-checksum:abc'",
             px->port);
    cr_expect_eq(h2u_peer_field(line, "status"), 200, "%s", line);
    cr_assert_eq(tup_wait_count(up, 1, T), 0);
    const struct tup_req *q = tup_get(up, 0);
    cr_expect_eq(q->body_len, 5000);
    cr_expect_str_eq(tup_req_header(q, "Content-Length"), "5000");
    cr_expect_eq(q->n_trailers, 0);
}
