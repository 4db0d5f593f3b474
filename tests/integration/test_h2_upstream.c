/* h2c upstreams, end to end (docs/http2.md): an HTTP/1.1 client (curl, or raw bytes), the real
 * binary, and the scripted HTTP/2 upstream of tests/tools/h2_upstream.py, whose records say
 * what reached it on which connection and stream. */
#include <criterion/criterion.h>

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proxy/http/grpc.h"
#include "tests/support/fixture.h"
#include "tests/support/h2u.h"

#define T 20000 /* ms: upper bound for any single request in these tests */

static struct h2u *h2;

static void stop(void)
{
    h2u_stop_all();
    fx_stop();
}

TestSuite(h2_upstream, .fini = stop, .timeout = 90);

/* The h2 upstream and a proxy with route "r" to it (base path /base): 'retry' are members of
 * the route's retry object besides a fast backoff, 'extra' more route members (either ""). */
static void start(const char *retry, const char *extra, const char *workers)
{
    h2 = h2u_start();
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r", "\"upstreams\": [\"%s\"], \"retry\": {" CFG_FAST "%s%s}%s%s",
               h2u_url(h2, "/base"), *retry ? ", " : "", retry, *extra ? ", " : "", extra);
    fx_start_b(b, "--workers", workers, NULL);
}

static struct http_resp call(const char *method, const char *path, const char *const *h,
                             const void *body, size_t len)
{
    struct http_resp r;
    http_do(method, fx_url(path), h, body, len, T, &r);
    return r;
}

/* Sends the request (a body of strlen(body) bytes, if any) and asserts its answer: 'status'
 * after 'attempts' attempts (X-Retry-Attempts). */
static void expect_answer(const char *method, const char *path, const char *const *h,
                          const char *body, long status, const char *attempts)
{
    struct http_resp r = call(method, path, h, body, body ? strlen(body) : 0);
    cr_assert_eq(r.rc, 0, "%s %s: curl error %d", method, path, r.rc);
    cr_expect_eq(r.status, status, "%s %s: %ld", method, path, r.status);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), attempts);
    if (body && status == 200)
        cr_expect_eq(r.body_len, strlen(body), "%s %s: not the body echoed", method, path);
    http_free(&r);
}

/* The value of field 'name' in a record's 'list' ("headers" or "trailers": [[name, value], ...]),
 * or NULL. */
static const char *rec_in(const json_t *rec, const char *list, const char *name)
{
    const json_t *hs = json_object_get(rec, list), *kv;
    size_t i;
    json_array_foreach(hs, i, kv)
    {
        if (strcmp(json_string_value(json_array_get(kv, 0)), name) == 0)
            return json_string_value(json_array_get(kv, 1));
    }
    return NULL;
}

static const char *rec_field(const json_t *rec, const char *name)
{
    return rec_in(rec, "headers", name);
}

static bool has_reset(void *arg)
{
    (void)arg;
    return h2u_count(h2, "action", "reset-by-client") > 0;
}

/* The first stream the proxy reset, waited for (the reset goes out after the answer that made
 * it): asserted, the caller decrefs. */
static json_t *wait_reset(void)
{
    cr_assert(fx_wait(has_reset, NULL, 5000, 10), "no stream was reset");
    return h2u_find(h2, "action", "reset-by-client");
}

static int64_t rec_int(const json_t *rec, const char *key)
{
    return json_integer_value(json_object_get(rec, key));
}

static char *sha256_hex(const void *p, size_t n)
{
    char path[64], cmd[128];
    snprintf(path, sizeof(path), "/tmp/retryproxy-h2sha-%d", (int)getpid());
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "sha256sum %s", path);
    FILE *pf = popen(cmd, "r");
    cr_assert_not_null(pf);
    static char hex[65];
    cr_assert_eq(fscanf(pf, "%64s", hex), 1);
    pclose(pf);
    unlink(path);
    return hex;
}

Test(h2_upstream, get_reaches_the_upstream_as_http2_with_method_path_authority_and_fields)
{
    start("", "", "1");
    const char *h[] = { "X-Request-Id: get-1", "X-Custom: Value One", "Connection: keep-alive",
                        "Keep-Alive: timeout=5", NULL };
    struct http_resp r = call("GET", "/hello?x=1", h, NULL, 0);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, 3);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "1");
    json_t *rec = h2u_find(h2, "request_id", "get-1");
    cr_assert_not_null(rec);
    cr_expect_str_eq(json_string_value(json_object_get(rec, "method")), "GET");
    cr_expect_str_eq(json_string_value(json_object_get(rec, "path")), "/base/hello?x=1");
    cr_expect_str_eq(json_string_value(json_object_get(rec, "scheme")), "http");
    char auth[64];
    snprintf(auth, sizeof(auth), "127.0.0.1:%u", h2u_port(h2));
    cr_expect_str_eq(json_string_value(json_object_get(rec, "authority")), auth);
    cr_expect_str_eq(rec_field(rec, "x-custom"), "Value One");
    cr_expect_str_eq(rec_field(rec, "x-retry-attempt"), "1");
    cr_expect_str_eq(rec_field(rec, "x-forwarded-proto"), "http");
    /* connection-specific fields and Host never go out on HTTP/2 (RFC 9113 8.2.2) */
    cr_expect_null(rec_field(rec, "connection"));
    cr_expect_null(rec_field(rec, "keep-alive"));
    cr_expect_null(rec_field(rec, "host"));
    cr_expect_null(rec_field(rec, "content-length"));
    cr_expect_eq(rec_int(rec, "body_len"), 0);
    json_decref(rec);
    http_free(&r);
}

Test(h2_upstream, preserve_host_sends_the_clients_host_as_authority)
{
    start("", "\"preserve_host\": true", "1");
    const char *h[] = { "X-Request-Id: host-1", "Host: api.example.com:8443", NULL };
    struct http_resp r = call("GET", "/h", h, NULL, 0);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    json_t *rec = h2u_find(h2, "request_id", "host-1");
    cr_assert_not_null(rec);
    cr_expect_str_eq(json_string_value(json_object_get(rec, "authority")), "api.example.com:8443");
    cr_expect_null(rec_field(rec, "host"));
    json_decref(rec);
    http_free(&r);
}

/* A body kept for retries (below max_retry_body_bytes) and one streamed once (above it). */
Test(h2_upstream, post_bodies_buffered_and_streamed_reach_the_upstream_whole)
{
    start("\"max_retry_body_bytes\": 65536", "", "1");
    size_t sizes[] = { 1000, 3 * 1024 * 1024 + 7 };
    for (size_t k = 0; k < 2; k++) {
        size_t n = sizes[k];
        char *body = malloc(n);
        for (size_t i = 0; i < n; i++)
            body[i] = (char)('a' + (i * 7 + k) % 26);
        char id[64], idh[96];
        snprintf(id, sizeof(id), "post-%zu", k);
        snprintf(idh, sizeof(idh), "X-Request-Id: %s", id);
        const char *h[] = { idh, "Content-Type: application/octet-stream", NULL };
        struct http_resp r = call("POST", "/p", h, body, n);
        cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
        cr_expect_eq(r.status, 200);
        cr_expect_eq(r.body_len, n, "echo of %zu bytes: %zu", n, r.body_len);
        json_t *rec = h2u_find(h2, "request_id", id);
        cr_assert_not_null(rec);
        cr_expect_str_eq(json_string_value(json_object_get(rec, "method")), "POST");
        cr_expect_eq(rec_int(rec, "body_len"), (int64_t)n);
        cr_expect_str_eq(json_string_value(json_object_get(rec, "body_sha256")),
                         sha256_hex(body, n));
        char cl[32];
        snprintf(cl, sizeof(cl), "%zu", n);
        cr_expect_str_eq(rec_field(rec, "content-length"), cl);
        cr_expect_str_eq(rec_field(rec, "content-type"), "application/octet-stream");
        json_decref(rec);
        http_free(&r);
        free(body);
    }
}

/* 40 calls one after another, then 4 at once, go over one connection: streams multiplex. */
Test(h2_upstream, many_calls_share_one_connection)
{
    start("", "", "1");
    for (int i = 0; i < 40; i++) {
        struct http_resp r = call("GET", "/seq", NULL, NULL, 0);
        cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
        cr_assert_eq(r.status, 200);
        http_free(&r);
    }
    char url[FX_CALLS][128];
    for (int i = 0; i < FX_CALLS; i++) {
        snprintf(url[i], sizeof(url[i]), "%s", fx_url("/par"));
        http_call_start(&fx_calls[i], url[i], NULL, NULL);
    }
    for (int i = 0; i < FX_CALLS; i++) {
        http_call_join(&fx_calls[i]);
        cr_expect_eq(fx_calls[i].r.status, 200);
    }
    cr_expect_eq(h2u_count(h2, "action", "answered"), 40 + FX_CALLS);
    cr_expect_eq(h2u_connections(h2), 1, "connections: %zu", h2u_connections(h2));
}

/* REFUSED_STREAM: nothing reached the application, so even a POST (not in retry.methods) goes
 * again, and the upstream processed it once. */
Test(h2_upstream, refused_stream_on_a_post_is_retried_and_processed_once)
{
    start("", "", "1");
    const char *h[] = { "X-Request-Id: refused-1", "x-h2-scenario: refuse", "x-h2-fail: 1", NULL };
    expect_answer("POST", "/order", h, "one order", 200, "2");
    cr_expect_eq(h2u_count(h2, "action", "refused"), 1);
    /* counted as any attempt is: the refused one as a reset (issue 20: a retryable reset) */
    cr_expect_eq(fx_metric("retryproxy_attempts_total{route=\"r\",outcome=\"reset\"}"), 1);
    cr_expect_eq(fx_metric("retryproxy_attempts_total{route=\"r\",outcome=\"connect_failure\"}"),
                 0);
    cr_expect_eq(fx_metric("retryproxy_attempts_total{route=\"r\",outcome=\"2xx\"}"), 1);
    cr_expect_eq(h2u_count(h2, "action", "answered"), 1);
    json_t *rec = h2u_find(h2, "action", "answered");
    cr_assert_not_null(rec);
    cr_expect_str_eq(rec_field(rec, "x-retry-attempt"), "2");
    json_decref(rec);
}

/* A GOAWAY whose last_stream_id is below the stream: the stream was not processed, the POST
 * goes again on a new connection. */
Test(h2_upstream, goaway_below_the_stream_is_retried_on_a_new_connection)
{
    start("", "", "1");
    const char *h[] = { "X-Request-Id: goaway-1", "x-h2-scenario: goaway", "x-h2-fail: 1", NULL };
    expect_answer("POST", "/order", h, "one order", 200, "2");
    cr_expect_eq(h2u_count(h2, "action", "goaway"), 1);
    cr_expect_eq(h2u_count(h2, "action", "answered"), 1);
    cr_expect_eq(h2u_connections(h2), 2);
}

/* RST_STREAM after half the body: never a complete 200. A small response is collected before
 * it is answered, a large one streams; with a content-length and without one (the client's
 * framing would then be chunked, and only the proxy can tell it broke off): either way the
 * client sees a 502 or the truncation. */
Test(h2_upstream, rst_mid_body_is_never_passed_off_as_a_good_response)
{
    start("", "", "1");
    const char *sizes[] = { "x-h2-body: 20000", "x-h2-body: 1000000" };
    const char *lengths[] = { "x-h2-length: yes", "x-h2-no-length: 1" };
    for (size_t k = 0; k < 4; k++) {
        const char *h[] = { "x-h2-scenario: rst-mid", sizes[k % 2], lengths[k / 2], NULL };
        struct http_resp r = call("GET", "/big", h, NULL, 0);
        bool whole = r.rc == 0 && r.status == 200;
        cr_expect_not(whole, "%s, %s: a reset response passed as complete (%zu bytes)",
                      sizes[k % 2], lengths[k / 2], r.body_len);
        cr_expect(r.rc != 0 || r.status == 502, "%s, %s: curl %d, status %ld", sizes[k % 2],
                  lengths[k / 2], r.rc, r.status);
        http_free(&r);
    }
}

/* A head without :status is no response: a reset, retried as retry_on says, then a 502; one such
 * answer then a good one is the good one. */
Test(h2_upstream, head_without_status_is_a_reset_retried_then_502)
{
    start("\"max_attempts\": 3", "", "1");
    const char *h[] = { "X-Request-Id: nostatus-1", "x-h2-scenario: no-status", NULL };
    expect_answer("GET", "/n", h, NULL, 502, "3");
    cr_expect_eq(h2u_count(h2, "request_id", "nostatus-1"), 3);
    const char *once[] = { "X-Request-Id: nostatus-2", "x-h2-scenario: no-status", "x-h2-fail: 1",
                           NULL };
    expect_answer("GET", "/n", once, NULL, 200, "2");
}

Test(h2_upstream, no_status_is_not_retried_when_retry_on_leaves_reset_out)
{
    start("\"retry_on\": [\"connect-failure\", \"5xx\"]", "", "1");
    const char *h[] = { "X-Request-Id: nostatus-3", "x-h2-scenario: no-status", "x-h2-fail: 1",
                        NULL };
    expect_answer("GET", "/n", h, NULL, 502, "1");
}

Test(h2_upstream, a_response_with_trailers_arrives_whole)
{
    start("", "", "1");
    const char *h[] = { "x-h2-scenario: trailers", "x-h2-body: 100000", NULL };
    struct http_resp r = call("GET", "/t", h, NULL, 0);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, 100000);
    http_free(&r);
}

/* A gRPC call whose status comes in the trailers of an h2c response (docs/grpc.md): they reach
 * the core with the attempt's end, so UNAVAILABLE there is retried, though the call is a POST. */
Test(h2_upstream, a_grpc_status_in_h2c_trailers_is_retried)
{
    start("\"retry_on\": [\"unavailable\"]", "", "1");
    const char *h[] = { "X-Request-Id: grpc-1",
                        "Content-Type: application/grpc",
                        "x-h2-scenario: trailers",
                        "x-h2-grpc-status: 14",
                        "x-h2-fail: 1",
                        NULL };
    static const char msg[5] = { 0, 0, 0, 0, 0 };
    struct http_resp r = call("POST", "/svc/Echo", h, msg, sizeof(msg));
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    cr_expect_eq(h2u_count(h2, "request_id", "grpc-1"), 2);
    http_free(&r);
}

/* An attempt past per_try_timeout_ms is cancelled (RST_STREAM CANCEL) and the retry goes on the
 * same connection, which the cancel left open. */
Test(h2_upstream, a_timed_out_stream_is_cancelled_and_its_connection_serves_the_retry)
{
    start("\"retry_on\": [\"timeout\"]", "\"per_try_timeout_ms\": 300", "1");
    const char *h[] = { "X-Request-Id: slowtry-1", "x-h2-delay-ms: 3000", "x-h2-fail: 1", NULL };
    struct http_resp r = call("GET", "/late", h, NULL, 0);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    cr_expect_lt(r.seconds, 2.5, "took %.2f s", r.seconds);
    /* the first attempt was reset (CANCEL, 0x8) before its answer, the second answered */
    json_t *rst = wait_reset();
    cr_expect_str_eq(json_string_value(json_object_get(rst, "request_id")), "slowtry-1");
    cr_expect_eq(rec_int(rst, "error_code"), 8);
    json_decref(rst);
    json_t *rec = h2u_find(h2, "action", "answered");
    cr_assert_not_null(rec);
    cr_expect_str_eq(rec_field(rec, "x-retry-attempt"), "2");
    json_decref(rec);
    cr_expect_eq(h2u_connections(h2), 1);
    http_free(&r);
    r = call("GET", "/after", NULL, NULL, 0);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(h2u_connections(h2), 1);
    http_free(&r);
}

/* Hedging: the first attempt runs on past per_try_timeout_ms while the second goes on the same
 * connection; the second's answer wins and the first stream is reset (the loser's cancel comes
 * from inside the winner's head callback). */
Test(h2_upstream, a_hedged_attempt_wins_and_the_other_stream_is_reset)
{
    start("\"retry_on\": [\"timeout\"], \"hedge_on_per_try_timeout\": true",
          "\"per_try_timeout_ms\": 200", "1");
    const char *h[] = { "X-Request-Id: hedge-1", "x-h2-delay-ms: 3000", "x-h2-fail: 1", NULL };
    expect_answer("GET", "/hedge", h, NULL, 200, "2");
    json_t *rst = wait_reset();
    cr_expect_str_eq(json_string_value(json_object_get(rst, "request_id")), "hedge-1");
    json_decref(rst);
    cr_expect_eq(h2u_count(h2, "action", "answered"), 1);
    cr_expect_eq(h2u_connections(h2), 1);
    expect_answer("GET", "/after", NULL, NULL, 200, "1");
}

/* No h2c connection (a port nothing listens on): a connect failure, retried on the next
 * upstream whatever the method. A name that does not resolve has no endpoint: never tried
 * (docs/endpoints.md). */
Test(h2_upstream, a_refused_connection_is_a_connect_failure_retried_for_a_post)
{
    h2 = h2u_start();
    struct cfgb *b = cfgb_new();
    char closed[64];
    snprintf(closed, sizeof(closed), "h2c://127.0.0.1:%u", fx_closed_port());
    cfgb_route(b, "r",
               "\"upstreams\": [\"%s\", \"h2c://nowhere.invalid:80\", \"%s\"], "
               "\"retry\": {" CFG_FAST "}",
               closed, h2u_url(h2, ""));
    fx_start_b(b, "--workers", "1", NULL);
    const char *h[] = { "X-Request-Id: closed-1", NULL };
    expect_answer("POST", "/o", h, "order", 200, "2");
    cr_expect_eq(h2u_count(h2, "request_id", "closed-1"), 1);
    cr_expect_eq(fx_metric("retryproxy_attempts_total{route=\"r\",outcome=\"connect_failure\"}"),
                 1);
    cr_expect_eq(fx_metric("retryproxy_attempts_total{route=\"r\",outcome=\"2xx\"}"), 1);
}

static bool answered_once(void *arg)
{
    (void)arg;
    return h2u_count(h2, "request_id", "slow-1") == 1;
}

/* One call's client reads nothing: only that stream's window closes. Another call on the same
 * upstream connection completes meanwhile, the proxy holds at most about a window of the
 * stalled body, and the slow call's body arrives whole once it is read. */
Test(h2_upstream, a_slow_reader_does_not_stall_other_calls_on_the_connection)
{
    start("", "\"timeout_ms\": 60000", "1");
    long rss0 = px_rss_kb(px);
    int fd = fx_hold(raw_dial(px->port));
    const size_t big = 64u * 1024 * 1024;
    char req[256];
    int rl =
        snprintf(req, sizeof(req),
                 "GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Request-Id: slow-1\r\n"
                 "x-h2-body: %zu\r\n\r\n",
                 big);
    cr_assert(raw_send_all(fd, req, (size_t)rl));
    cr_assert(fx_wait(answered_once, NULL, 10000, 20));
    sleep_ms(1500); /* the upstream sends what the windows allow */
    const char *h[] = { "X-Request-Id: fast-1", NULL };
    int64_t t0 = now_ms();
    struct http_resp r = call("GET", "/fast", h, NULL, 0);
    int64_t took = now_ms() - t0;
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_lt(took, 5000, "the other call took %lld ms", (long long)took);
    json_t *slow = h2u_find(h2, "request_id", "slow-1"),
           *fast = h2u_find(h2, "request_id", "fast-1");
    cr_assert(slow && fast);
    cr_expect_eq(rec_int(slow, "conn"), rec_int(fast, "conn"), "not on the same connection");
    json_decref(slow);
    json_decref(fast);
    http_free(&r);
    /* not the 64 MiB the upstream would send without flow control */
    long grown = px_rss_kb(px) - rss0;
    cr_expect_lt(grown, 24 * 1024, "the proxy grew by %ld KiB", grown);
    /* the slow call's body, read now, is whole */
    char buf[65536];
    size_t got = 0;
    ssize_t n;
    while ((n = raw_recv(fd, buf, sizeof(buf), 10000)) > 0)
        got += (size_t)n;
    cr_expect_gt(got, big, "read %zu bytes", got);
    cr_expect_lt(got, big + 1024, "read %zu bytes", got);
}

/* An upstream that sends a whole response and then closes its connection (GOAWAY) while the
 * client reads slowly: what the proxy kept of it still reaches the client, whole, after the
 * connection is gone. (Taking kept bytes once opened the stream's window on a session that no
 * longer existed, a crash that fuzz_h2up found.) */
static bool has_answer(void *arg)
{
    (void)arg;
    return h2u_count(h2, "action", "answered") > 0;
}

Test(h2_upstream, a_response_kept_for_a_slow_client_survives_its_connection_closing)
{
    enum { SIZE = 200000 }; /* within the stream's window: it all arrives, the client paused */
    h2 = h2u_start();
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"limits\": {\"send_buffer_bytes\": 4096}");
    cfgb_route(b, "r", "\"upstreams\": [\"%s\"]", h2u_url(h2, "/base"));
    fx_start_b(b, "--workers", "1", NULL);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(px->port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    const char req[] = "GET /big HTTP/1.1\r\nHost: svc\r\nx-h2-body: 200000\r\n"
                       "x-h2-close-after: 1\r\nConnection: close\r\n\r\n";
    cr_assert(raw_send_all(fd, req, sizeof(req) - 1));
    /* the response comes whole and the connection closes while nothing is read */
    cr_assert(fx_wait(has_answer, NULL, 5000, 20), "the upstream did not answer");
    usleep(500 * 1000);
    static char got[SIZE + 4096];
    size_t len = 0;
    ssize_t n;
    while (len < sizeof(got) && (n = raw_recv(fd, got + len, sizeof(got) - len, 3000)) > 0)
        len += (size_t)n;
    close(fd);
    got[len < sizeof(got) ? len : sizeof(got) - 1] = '\0';
    cr_expect(strncmp(got, "HTTP/1.1 200", 12) == 0, "%.40s", got);
    char *body = strstr(got, "\r\n\r\n");
    cr_assert_not_null(body, "no head in %zu bytes", len);
    cr_expect_eq(len - (size_t)(body + 4 - got), SIZE, "the body came incomplete");
    cr_expect_eq(h2u_count(h2, "action", "answered"), 1);
}

/* ---- request trailers (docs/forwarding.md, "Request trailers") ---- */

/* The records of request 'id' (those of streams that were answered), asserting there are 'n';
 * each must carry the trailers x-checksum: abc123 and x-sig-bin: AAEC/w== and nothing of what
 * the proxy leaves out; their body 'body_len' bytes. */
static void expect_trailers_on_each(const char *id, size_t n, int64_t body_len)
{
    json_t *recs = h2u_records(h2), *rec;
    size_t i, seen = 0;
    json_array_foreach(recs, i, rec)
    {
        const char *rid = json_string_value(json_object_get(rec, "request_id"));
        if (!rid || strcmp(rid, id) != 0)
            continue;
        seen++;
        cr_expect_str_eq(rec_in(rec, "trailers", "x-checksum"), "abc123", "attempt %zu", seen);
        cr_expect_str_eq(rec_in(rec, "trailers", "x-sig-bin"), "AAEC/w==", "attempt %zu", seen);
        cr_expect_null(rec_in(rec, "trailers", "x-retry-attempt"), "the proxy's own field");
        cr_expect_null(rec_in(rec, "trailers", "x-forwarded-for"), "the proxy's own field");
        cr_expect_null(rec_in(rec, "trailers", "host"), "a routing field");
        cr_expect_eq(json_array_size(json_object_get(rec, "trailers")), 2, "attempt %zu", seen);
        cr_expect_eq(rec_int(rec, "body_len"), body_len, "attempt %zu", seen);
    }
    json_decref(recs);
    cr_expect_eq(seen, n, "%s: %zu records", id, seen);
}

/* An HTTP/2 client's trailing HEADERS reach an h2c upstream after the body: a buffered body
 * (its 503 answered attempt retried: the retry sends them again) and a streamed one. */
Test(h2_upstream, an_http2_clients_trailers_reach_the_upstream_on_every_attempt)
{
    start("\"methods\": [\"POST\"], \"max_retry_body_bytes\": 65536", "", "1");
    const char *trailers = "x-checksum:abc123;x-sig-bin:AAEC/w==;x-retry-attempt:9;"
                           "x-forwarded-for:6.6.6.6";
    char line[256];
    h2u_peer(line, sizeof(line),
             "trailers %u /t 1000 'x-request-id:trl-1;x-h2-scenario:status;"
             "x-h2-fail:1' '%s'",
             px->port, trailers);
    cr_expect_eq(h2u_peer_field(line, "status"), 200, "%s", line);
    expect_trailers_on_each("trl-1", 2, 1000);
    /* past max_retry_body_bytes: streamed as it comes, the trailers after its last byte */
    h2u_peer(line, sizeof(line), "trailers %u /t 200000 'x-request-id:trl-2' '%s'", px->port,
             trailers);
    cr_expect_eq(h2u_peer_field(line, "status"), 200, "%s", line);
    expect_trailers_on_each("trl-2", 1, 200000);
}

/* An HTTP/1.1 client's chunked trailers: the names go lowercase, as HTTP/2 wants them; one the
 * head's Connection names (X-Hop) stays out, as it would from the head. */
Test(h2_upstream, an_http1_clients_chunked_trailers_reach_the_upstream_on_every_attempt)
{
    start("\"methods\": [\"POST\"]", "", "1");
    int fd = fx_hold(raw_dial(px->port));
    const char req[] = "POST /t HTTP/1.1\r\nHost: x\r\nConnection: close, X-Hop\r\n"
                       "X-Request-Id: trl-3\r\nx-h2-scenario: status\r\nx-h2-fail: 1\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n"
                       "5\r\nhello\r\n6\r\n world\r\n0\r\n"
                       "X-Checksum: abc123\r\nX-Sig-Bin: AAEC/w==\r\nX-Retry-Attempt: 9\r\n"
                       "Host: elsewhere\r\nX-Hop: 1\r\n\r\n";
    cr_expect_eq(raw_send_status(fd, req, sizeof(req) - 1, T), 200);
    expect_trailers_on_each("trl-3", 2, 11);
}

/* The head and the trailers together past limits.max_header_bytes: the request goes on, its
 * trailers all left out, and the log says why. */
Test(h2_upstream, trailers_past_the_head_bounds_are_left_out_and_logged)
{
    start("", "", "1");
    char pad[5001], big[4001], line[256];
    memset(pad, 'p', sizeof(pad) - 1);
    pad[sizeof(pad) - 1] = '\0';
    memset(big, 'b', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    h2u_peer(line, sizeof(line),
             "trailers %u /t 10 'x-request-id:trl-4;x-pad:%s' "
             "'x-small:1;x-big:%s'",
             px->port, pad, big);
    cr_expect_eq(h2u_peer_field(line, "status"), 200, "%s", line);
    json_t *rec = h2u_find(h2, "request_id", "trl-4");
    cr_assert_not_null(rec);
    cr_expect_eq(json_array_size(json_object_get(rec, "trailers")), 0, "some trailers went");
    cr_expect_eq(rec_int(rec, "body_len"), 10);
    json_decref(rec);
    char *out = px_stdout(px);
    json_t *log = fx_log_line(out, "request trailers not forwarded");
    cr_assert_not_null(log, "no log line");
    cr_expect_str_eq(json_str(log, "request_id"), "trl-4");
    json_decref(log);
    free(out);
}

/* A held gRPC response (docs/grpc.md "A status in trailers") that ends cleanly without trailers
 * has no status to retry by: it is relayed as it came, once, and the call has no status. */
Test(h2_upstream, a_held_grpc_response_ending_without_trailers_is_relayed_as_it_came)
{
    start("\"retry_on\": [\"unavailable\"]", "", "1");
    const char *h[] = { "X-Request-Id: grpc-bare", "Content-Type: application/grpc",
                        "x-h2-no-trailers: 1", NULL };
    static const char msg[7] = { 0, 0, 0, 0, 2, 'h', 'i' };
    struct http_resp r = call("POST", "/svc/Echo", h, msg, sizeof(msg));
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, sizeof(msg), "the message, as it came");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "1");
    cr_expect_eq(h2u_count(h2, "request_id", "grpc-bare"), 1);
    http_free(&r);
    json_t *j = fx_request_logged("request_id", "grpc-bare");
    cr_assert_not_null(j, "no request log line");
    cr_expect(json_is_null(json_object_get(j, "grpc_status")), "the call has no status");
    json_decref(j);
}

/* A gRPC call is hedged like any request that may go again (docs/grpc.md "Deadlines"): every
 * attempt takes 700 ms, the first answers first and wins, and it was told the time left before
 * the deadline in its grpc-timeout, not the 300 ms per-try timeout. */
Test(h2_upstream, a_grpc_call_is_hedged_and_its_first_attempt_told_the_time_left)
{
    start("\"max_attempts\": 2, \"methods\": [\"POST\"], \"hedge_on_per_try_timeout\": true, "
          "\"retry_on\": [\"timeout\", \"unavailable\"]",
          "\"per_try_timeout_ms\": 300, \"timeout_ms\": 8000", "1");
    const char *h[] = { "X-Request-Id: grpc-hedge", "Content-Type: application/grpc",
                        "x-h2-delay-ms: 700", NULL };
    static const char msg[7] = { 0, 0, 0, 0, 2, 'h', 'i' };
    struct http_resp r = call("POST", "/svc/Echo", h, msg, sizeof(msg));
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_null(http_hdr(&r, "grpc-status"), "not an error of our own");
    cr_expect_eq(r.body_len, sizeof(msg), "the message echoed");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2", "the first attempt and its hedge");
    http_free(&r);
    json_t *rec = h2u_find(h2, "action", "answered");
    cr_assert_not_null(rec, "no attempt was answered");
    cr_expect_eq(rec_int(rec, "attempt"), 1, "the first attempt won");
    const char *v = rec_field(rec, "grpc-timeout");
    cr_assert_not_null(v);
    uint64_t ms = 0;
    cr_assert_eq(grpc_timeout_parse(v, strlen(v), &ms), 0, "\"%s\"", v);
    cr_expect_gt(ms, 1000, "the first attempt was told %s", v);
    json_decref(rec);
    json_t *rst = wait_reset(); /* the hedge, the second attempt, cancelled */
    cr_expect_str_eq(json_string_value(json_object_get(rst, "request_id")), "grpc-hedge");
    json_decref(rst);
}

/* The most TCP segments with data the upstream's connection had received when one of its
 * requests was answered (tests/tools/h2_upstream.py's "data_segs_in"; one connection). */
static long segs_in(void)
{
    json_t *all = h2u_records(h2), *rec;
    long most = -1;
    size_t i;
    json_array_foreach(all, i, rec)
    {
        json_t *n = json_object_get(rec, "data_segs_in");
        if (json_is_integer(n) && json_integer_value(n) > most)
            most = json_integer_value(n);
    }
    json_decref(all);
    return most;
}

/* 40 calls that arrive together over one client connection go out to the upstream gathered:
 * a loop turn's frames for a connection in one write (docs/http2.md "Writes"), where each frame
 * nghttp2 serialised used to be a send of its own (a gRPC call's HEADERS, its message and the
 * empty DATA that ends it: three). */
static void burst(const char *extra)
{
    start("", "", "1");
    char cmd[512], line[256];
    snprintf(cmd, sizeof(cmd),
             "h2load -n 40 -c 1 -m 40 %s http://127.0.0.1:%u/burst 2>&1 </dev/null", extra,
             px->port);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    bool all = false;
    while (fgets(line, sizeof(line), p))
        if (strstr(line, "requests: 40 total, 40 started, 40 done, 40 succeeded"))
            all = true;
    cr_expect_eq(pclose(p), 0);
    cr_assert(all, "h2load did not get 40 answers");
    cr_assert_eq(h2u_count(h2, "action", "answered"), 40);
    cr_expect_eq(h2u_connections(h2), 1);
    long segs = segs_in();
    cr_assert_geq(segs, 1, "no data_segs_in recorded");
    /* 2 here; 15 to 50 before (the kernel merges some small sends itself) */
    cr_expect_leq(segs, 8, "40 calls reached the upstream in %ld segments", segs);
}

Test(h2_upstream, a_burst_of_gets_reaches_the_upstream_in_few_writes)
{
    burst("");
}

Test(h2_upstream, a_burst_of_grpc_calls_reaches_the_upstream_in_few_writes)
{
    char file[] = "/tmp/retryproxy-burst-XXXXXX";
    int fd = mkstemp(file);
    cr_assert_geq(fd, 0);
    static const char msg[10] = { 0, 0, 0, 0, 5, 'h', 'e', 'l', 'l', 'o' };
    cr_assert_eq(write(fd, msg, sizeof(msg)), (ssize_t)sizeof(msg));
    close(fd);
    char extra[256];
    snprintf(extra, sizeof(extra), "-d %s -H 'content-type: application/grpc' -H 'te: trailers'",
             file);
    burst(extra);
    unlink(file);
}

/* A request id and a trace id differ on every request: both sides of the proxy send them as
 * literals never indexed, so that they never churn an HPACK table (docs/http2.md "Header
 * compression"); fields that repeat are left to HPACK. */
Test(h2_upstream, per_request_fields_go_as_never_indexed_literals_both_ways)
{
    start("", "", "1");
    char line[512];
    h2u_peer(line, sizeof(line),
             "fields %u /ni 'x-request-id:ni-1;traceparent:00-4bf92f-00f067-01;x-kept:1'",
             px->port);
    cr_assert_eq(h2u_peer_field(line, "status"), 200, "%s", line);
    cr_expect(strstr(line, "never_indexed x-request-id") != NULL, "to the client: %s", line);
    json_t *rec = h2u_find(h2, "request_id", "ni-1");
    cr_assert_not_null(rec);
    json_t *names = json_object_get(rec, "never_indexed"), *n;
    bool rid = false, trace = false, kept = false;
    size_t i;
    json_array_foreach(names, i, n)
    {
        rid |= strcmp(json_string_value(n), "x-request-id") == 0;
        trace |= strcmp(json_string_value(n), "traceparent") == 0;
        kept |= strcmp(json_string_value(n), "x-kept") == 0;
    }
    cr_expect(rid && trace, "to the upstream: %s", json_dumps(names, 0));
    cr_expect_not(kept);
    json_decref(rec);
}
