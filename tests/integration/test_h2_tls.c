/* https upstreams and HTTP/2 by ALPN (docs/http2.md "https upstreams"): an HTTP/1.1 client, the
 * real binary, and the scripted upstream of tests/tools/h2_upstream.py speaking TLS with a
 * certificate made for the test, whose records say which protocol each connection chose and
 * what reached it. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/h2u.h"
#include "tests/support/tlsfix.h"

#define T 20000 /* ms: upper bound for any single request in these tests */

static struct h2u *srv;

TestSuite(h2_tls, .fini = tlsfix_stop, .timeout = 90);

/* The upstream with certificate 'cert' choosing from 'alpn', and a proxy whose route "r" goes
 * to it with 'tls' (the route's tls object's members) and 'retry' (members of its retry
 * object besides a fast backoff). */
static void start(const char *cert, const char *alpn, const char *tls, const char *retry)
{
    srv = h2u_start_tls(tlsfix_path(cert, "pem"), tlsfix_path(cert, "key"), alpn);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r", "\"upstreams\": [\"%s\"], \"tls\": {%s}, \"retry\": {" CFG_FAST "%s%s}",
               h2u_url(srv, "/base"), tls, *retry ? ", " : "", retry);
    fx_start_b(b, "--workers", "1", NULL);
}

/* The trusted certificate, for 127.0.0.1. */
static const char *trusting(void)
{
    return tlsfix_trust(tlsfix_path("good", "pem"));
}

static struct http_resp call(const char *method, const char *path, const char *const *h,
                             const void *body, size_t len)
{
    struct http_resp r;
    http_do(method, fx_url(path), h, body, len, T, &r);
    return r;
}

/* Records of the upstream whose "event" is 'ev' and member 'key' is 'value'. */
static size_t count_events(const char *ev, const char *key, const char *value)
{
    json_t *all = h2u_records(srv), *r;
    size_t i, n = 0;
    json_array_foreach(all, i, r)
    {
        const char *e = json_str(r, "event"), *v = json_str(r, key);
        n += e && strcmp(e, ev) == 0 && v && strcmp(v, value) == 0;
    }
    json_decref(all);
    return n;
}

/* h2 chosen by ALPN: requests go as HTTP/2 streams with :scheme https, on one connection. */
Test(h2_tls, https_upstream_speaks_h2_chosen_by_alpn_on_one_connection)
{
    tlsfix_cert("good", "IP:127.0.0.1");
    start("good", "h2,http/1.1", trusting(), "");
    for (int i = 0; i < 5; i++) {
        const char *h[] = { "x-h2-body: 40000", NULL };
        struct http_resp r = call("GET", "/one", h, NULL, 0);
        cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
        cr_expect_eq(r.status, 200);
        cr_expect_eq(r.body_len, 40000);
        http_free(&r);
    }
    cr_expect_eq(h2u_count(srv, "action", "answered"), 5);
    cr_expect_eq(h2u_count(srv, "scheme", "https"), 5);
    cr_expect_eq(h2u_count(srv, "path", "/base/one"), 5);
    cr_expect_eq(count_events("tls", "alpn", "h2"), 1);
    cr_expect_eq(h2u_connections(srv), 1, "connections: %zu", h2u_connections(srv));
    cr_expect_eq(fx_metric("retryproxy_upstream_h2_connections"), 1);
    cr_expect_eq(fx_metric("retryproxy_upstream_h2_connections_total{result=\"h2\"}"), 1);
}

/* Over TLS as over h2c, a gRPC status in the trailers is read and retried (docs/grpc.md), and
 * the message reached the upstream whole each time. */
Test(h2_tls, grpc_status_in_trailers_over_tls_is_retried)
{
    tlsfix_cert("good", "IP:127.0.0.1");
    start("good", "h2", trusting(), "\"retry_on\": [\"unavailable\"]");
    const char *h[] = { "X-Request-Id: tls-grpc-1",
                        "Content-Type: application/grpc",
                        "x-h2-scenario: trailers",
                        "x-h2-grpc-status: 14",
                        "x-h2-fail: 1",
                        NULL };
    static const char msg[8] = { 0, 0, 0, 0, 3, 'a', 'b', 'c' };
    struct http_resp r = call("POST", "/svc/Echo", h, msg, sizeof(msg));
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    http_free(&r);
    cr_expect_eq(h2u_count(srv, "request_id", "tls-grpc-1"), 2);
    json_t *all = h2u_records(srv), *rec;
    size_t i, seen = 0;
    json_array_foreach(all, i, rec)
    {
        if (json_str(rec, "request_id") && strcmp(json_str(rec, "request_id"), "tls-grpc-1") == 0) {
            cr_expect_eq(json_integer_value(json_object_get(rec, "body_len")), 8);
            seen++;
        }
    }
    json_decref(all);
    cr_expect_eq(seen, 2);
}

/* REFUSED_STREAM over TLS: unprocessed, so a POST goes again; an RST mid-body is never a good
 * response. */
Test(h2_tls, refused_and_reset_streams_over_tls_keep_their_meaning)
{
    tlsfix_cert("good", "IP:127.0.0.1");
    start("good", "h2", trusting(), "");
    const char *h[] = { "X-Request-Id: tls-ref-1", "x-h2-scenario: refuse", "x-h2-fail: 1", NULL };
    struct http_resp r = call("POST", "/order", h, "one", 3);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    http_free(&r);
    cr_expect_eq(h2u_count(srv, "action", "refused"), 1);
    const char *rst[] = { "x-h2-scenario: rst-mid", "x-h2-body: 20000", NULL };
    r = call("GET", "/big", rst, NULL, 0);
    cr_expect(r.rc != 0 || r.status == 502, "curl %d, status %ld", r.rc, r.status);
    http_free(&r);
}

/* A server that chooses http/1.1: the request goes through libcurl in HTTP/1.1, trusting the
 * same ca_file, and the origin is remembered: later requests make no new HTTP/2 try (one
 * connection for the try, one for libcurl's kept-alive requests). */
Test(h2_tls, a_server_choosing_http1_gets_http1_and_is_remembered)
{
    tlsfix_cert("good", "IP:127.0.0.1");
    start("good", "http/1.1", trusting(), "");
    for (int i = 0; i < 4; i++) {
        struct http_resp r = call("POST", "/h1", NULL, "body", 4);
        cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
        cr_expect_eq(r.status, 200);
        cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "1");
        cr_expect_eq(r.body_len, 3);
        cr_expect(r.body_len == 3 && memcmp(r.body, "h1\n", 3) == 0);
        http_free(&r);
    }
    cr_expect_eq(count_events("http1", "path", "/base/h1"), 4);
    cr_expect_eq(count_events("tls", "alpn", "http/1.1"), 2);
    cr_expect_eq(h2u_connections(srv), 2, "connections: %zu", h2u_connections(srv));
    cr_expect_eq(fx_metric("retryproxy_attempts_total{route=\"r\",outcome=\"2xx\"}"), 4);
    cr_expect_eq(fx_metric("retryproxy_attempts_total{route=\"r\",outcome=\"connect_failure\"}"),
                 0);
    /* the try is counted as such, and is no longer open */
    cr_expect_eq(fx_metric("retryproxy_upstream_h2_connections_total{result=\"http1\"}"), 1);
    cr_expect_eq(fx_metric("retryproxy_upstream_h2_connections_total{result=\"h2\"}"), 0);
    cr_expect_eq(fx_metric("retryproxy_upstream_h2_connections"), 0);
}

/* tls.http2 "off": HTTP/1.1 through libcurl even to a server that would choose h2. */
Test(h2_tls, http2_off_keeps_https_on_http1)
{
    tlsfix_cert("good", "IP:127.0.0.1");
    start("good", "h2,http/1.1", "\"http2\": \"off\", \"ca_file\": null", "");
    /* no ca_file: the system's store does not trust the test's certificate */
    struct http_resp r = call("GET", "/off", NULL, NULL, 0);
    cr_expect_eq(r.status, 502);
    http_free(&r);
    fx_stop();
    h2u_stop_all();
    char tls[256];
    snprintf(tls, sizeof(tls), "\"http2\": \"off\", %s", trusting());
    start("good", "h2,http/1.1", tls, "");
    r = call("GET", "/off", NULL, NULL, 0);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    cr_expect_eq(count_events("http1", "path", "/base/off"), 1);
    cr_expect_eq(count_events("tls", "alpn", "h2"), 0);
}

/* tls.http2 "required": a server that does not choose h2 is a connect failure, nothing sent. */
Test(h2_tls, http2_required_refuses_a_server_without_h2)
{
    tlsfix_cert("good", "IP:127.0.0.1");
    char tls[256];
    snprintf(tls, sizeof(tls), "\"http2\": \"required\", %s", trusting());
    start("good", "http/1.1", tls, "\"max_attempts\": 2");
    struct http_resp r = call("GET", "/req", NULL, NULL, 0);
    cr_expect_eq(r.status, 502);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    cr_expect(r.body && strstr((char *)r.body, "upstream_unavailable"), "%s", r.body);
    http_free(&r);
    cr_expect_eq(fx_metric("retryproxy_attempts_total{route=\"r\",outcome=\"connect_failure\"}"),
                 2);
    cr_expect_eq(count_events("http1", "path", "/base/req"), 0);
    cr_expect_eq(h2u_count(srv, "path", "/base/req"), 0);
}

/* Certificates are verified, by the HTTP/2 side as by libcurl: one no store trusts, and a
 * trusted one for another name, are connect failures and nothing reaches the upstream. */
Test(h2_tls, untrusted_or_misnamed_certificates_are_connect_failures)
{
    tlsfix_cert("good", "IP:127.0.0.1");
    tlsfix_cert("other", "DNS:elsewhere.test");
    start("good", "h2,http/1.1", "", "\"max_attempts\": 1");
    struct http_resp r = call("GET", "/x", NULL, NULL, 0);
    cr_expect_eq(r.status, 502);
    cr_expect(r.body && strstr((char *)r.body, "upstream_unavailable"), "%s", r.body);
    http_free(&r);
    cr_expect_eq(h2u_count(srv, "path", "/base/x"), 0);
    cr_expect_eq(count_events("http1", "path", "/base/x"), 0);
    cr_expect_eq(fx_metric("retryproxy_upstream_h2_connections_total{result=\"failed\"}"), 1);
    /* logged as a tunnel's is (proxy/upstream/connect.c): the upstream, the name, OpenSSL's reason
     */
    char authority[32];
    snprintf(authority, sizeof(authority), "127.0.0.1:%u", h2u_port(srv));
    json_t *line =
        fx_logged("upstream TLS failed; its requests were not sent", "upstream", authority);
    cr_expect_not_null(line, "no TLS failure logged for %s", authority);
    cr_expect_str_eq(json_str(line, "host"), "127.0.0.1");
    const char *error = json_str(line, "error");
    cr_expect(error && strstr(error, "certificate verify failed"), "error: %s", error);
    json_decref(line);
    fx_stop();
    h2u_stop_all();
    /* trusted, but made out to elsewhere.test, not 127.0.0.1 */
    start("other", "h2,http/1.1", tlsfix_trust(tlsfix_path("other", "pem")), "\"max_attempts\": 1");
    r = call("GET", "/y", NULL, NULL, 0);
    cr_expect_eq(r.status, 502);
    http_free(&r);
    cr_expect_eq(h2u_count(srv, "path", "/base/y"), 0);
    cr_expect_eq(count_events("http1", "path", "/base/y"), 0);
}

/* A body streamed as it arrives (too large to keep for a retry) falls back whole: the upload
 * had not begun when the server chose http/1.1, and libcurl sends all of it. */
Test(h2_tls, a_streamed_upload_falls_back_to_http1_whole)
{
    tlsfix_cert("good", "IP:127.0.0.1");
    start("good", "http/1.1", trusting(), "\"max_retry_body_bytes\": 0");
    static char body[300000];
    memset(body, 'x', sizeof(body));
    for (int i = 0; i < 2; i++) {
        struct http_resp r = call("PUT", "/up", NULL, body, sizeof(body));
        cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
        cr_expect_eq(r.status, 200);
        http_free(&r);
    }
    json_t *all = h2u_records(srv), *rec;
    size_t i, n = 0;
    json_array_foreach(all, i, rec)
    {
        const char *e = json_str(rec, "event");
        if (e && strcmp(e, "http1") == 0) {
            cr_expect_eq(json_integer_value(json_object_get(rec, "body_len")), sizeof(body));
            n++;
        }
    }
    json_decref(all);
    cr_expect_eq(n, 2);
}
