/* The request line as an operator reads it (docs/logs.md): durations to a tenth of a
 * millisecond and histogram sums to the microsecond (docs/metrics.md), the target as received
 * and as forwarded, and what an access log carries besides: the client's address and port, its
 * User-Agent, and the body bytes each way, over HTTP/1.1, HTTP/2 and gRPC.
 *
 * Each test reads the proxy's stdout and checks the request line against what the client sent
 * and got and what the test upstream received.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/fixture.h"

#define T 10000 /* ms: upper bound for any single request in these tests */

TestSuite(access_log, .fini = fx_stop, .timeout = 60);

/* Routes: /base/... to upstream 0 under the base path /up (its URL ".../up"), anything else to
 * upstream 0 as it is; no route for /none. */
static void start(const char *level)
{
    fx_upstreams(1);
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"log\": {\"level\": \"%s\"}", level);
    cfgb_route(b, "based", "\"match\": {\"path_prefix\": \"/base\"}, \"upstreams\": [\"%s/up\"]",
               fx_up_url(0));
    cfgb_route(b, "r", "\"match\": {\"path_prefix\": \"/r\"}");
    fx_start_b(b, "--workers", "2", NULL);
}

/* The request line with request id 'id' (asserted), caller decrefs. */
static json_t *logged(const char *id)
{
    json_t *l = fx_request_logged("request_id", id);
    cr_assert(l, "no request line for %s:\n%s", id, px_stdout(px));
    return l;
}

static double num(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    cr_assert(json_is_number(v), "%s is not a number", key);
    return json_number_value(v);
}

/* Whether a duration in ms has a tenth that is not 0: not a whole millisecond. */
static bool has_tenths(double ms)
{
    return fabs(ms - round(ms)) >= 0.05;
}

/* ---- durations (docs/logs.md, docs/metrics.md) ---- */

/* An upstream that answers after 3 ms: the request and attempt lines say at least 3 ms, to the
 * tenth, not in whole milliseconds read from the loop's per-turn clock. */
Test(access_log, durations_have_tenths_of_a_millisecond)
{
    start("debug");
    int tenths = 0;
    for (int i = 0; i < 6; i++) {
        char id[32], idh[64], url[128];
        snprintf(id, sizeof(id), "slow-%d", i);
        snprintf(idh, sizeof(idh), "X-Request-Id: %s", id);
        const char *h[] = { idh, "X-Test-Plan: delay=3", NULL };
        struct http_resp r;
        http_do("GET", px_url(px, "/r/slow", url, sizeof(url)), h, NULL, 0, T, &r);
        cr_assert_eq(r.status, 200);
        http_free(&r);

        json_t *l = logged(id);
        double d = num(l, "duration_ms");
        cr_expect(d >= 3.0 && d < 5000, "duration_ms %.1f for an answer after 3 ms", d);
        tenths += has_tenths(d);
        json_decref(l);
        json_t *a = fx_logged("attempt", "request_id", id);
        cr_assert(a, "no attempt line for %s", id);
        double ad = num(a, "duration_ms");
        cr_expect(ad >= 3.0 && ad <= d, "attempt duration_ms %.1f (request %.1f)", ad, d);
        tenths += has_tenths(ad);
        json_decref(a);
    }
    /* a whole number of ms by chance: one in ten for each of the twelve */
    cr_expect_gt(tenths, 0, "every duration a whole number of milliseconds");
}

/* The sum of every series of 'family' (a histogram's _sum) for route 'route', whatever other
 * labels it has. */
static double family_sum(const char *text, const char *family, const char *route)
{
    char want[64];
    snprintf(want, sizeof(want), "route=\"%s\"", route);
    size_t fl = strlen(family);
    double sum = 0;
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        const char *sp = memchr(line, ' ', n);
        if (sp && strncmp(line, family, fl) == 0 && line[fl] == '{') {
            char *lbl = strndup(line, (size_t)(sp - line));
            if (strstr(lbl, want))
                sum += strtod(sp + 1, NULL);
            free(lbl);
        }
        line = end ? end + 1 : NULL;
    }
    return sum;
}

/* Loopback attempts take well under a millisecond: their sums are not 0, nor whole ms. */
Test(access_log, loopback_durations_sum_to_the_microsecond)
{
    start("info");
    for (int i = 0; i < 8; i++) {
        char url[128];
        struct http_resp r;
        http_do("GET", px_url(px, "/r/fast", url, sizeof(url)), NULL, NULL, 0, T, &r);
        cr_assert_eq(r.status, 200);
        http_free(&r);
    }
    char url[128];
    struct http_resp m;
    http_do("GET", px_admin_url(px, "/metrics", url, sizeof(url)), NULL, NULL, 0, T, &m);
    cr_assert_eq(m.status, 200);
    char *text = strndup((const char *)m.body, m.body_len);
    double att = family_sum(text, "retryproxy_attempt_duration_seconds_sum", "r");
    double req = family_sum(text, "retryproxy_request_duration_seconds_sum", "r");
    free(text);
    http_free(&m);
    cr_expect_gt(att, 0, "attempt_duration_seconds_sum is 0 after 8 attempts");
    cr_expect_gt(req, 0, "request_duration_seconds_sum is 0 after 8 requests");
    cr_expect_lt(att, 8 * 5.0);
    /* whole milliseconds by chance: one in a thousand for each */
    bool whole_att = fabs(att * 1000 - round(att * 1000)) < 1e-6;
    bool whole_req = fabs(req * 1000 - round(req * 1000)) < 1e-6;
    cr_expect(!(whole_att && whole_req), "sums of whole milliseconds: %.6f, %.6f", att, req);
}

/* ---- the target (docs/logs.md) ---- */

Test(access_log, path_as_received_upstream_path_as_forwarded)
{
    start("info");
    char url[128];
    const char *h1[] = { "X-Request-Id: based", NULL };
    struct http_resp r;
    http_do("GET", px_url(px, "/base/x?q=1", url, sizeof(url)), h1, NULL, 0, T, &r);
    cr_assert_eq(r.status, 200);
    http_free(&r);
    json_t *l = logged("based");
    cr_expect_str_eq(json_str(l, "path"), "/base/x?q=1");
    cr_expect_str_eq(json_str(l, "upstream_path"), "/up/base/x?q=1");
    cr_expect_str_eq(tup_get(up, 0)->target, "/up/base/x?q=1", "the upstream got another");
    json_decref(l);

    const char *h2[] = { "X-Request-Id: plain", NULL };
    http_do("GET", px_url(px, "/r/y", url, sizeof(url)), h2, NULL, 0, T, &r);
    cr_assert_eq(r.status, 200);
    http_free(&r);
    l = logged("plain");
    cr_expect_str_eq(json_str(l, "path"), "/r/y");
    cr_expect_str_eq(json_str(l, "upstream_path"), "/r/y");
    json_decref(l);

    const char *h3[] = { "X-Request-Id: nowhere", NULL };
    http_do("GET", px_url(px, "/none", url, sizeof(url)), h3, NULL, 0, T, &r);
    cr_assert_eq(r.status, 404);
    http_free(&r);
    l = logged("nowhere");
    cr_expect(json_is_null(json_object_get(l, "upstream_path")), "no attempt, yet a target");
    json_decref(l);
}

/* ---- the client, its agent, the bytes (docs/logs.md) ---- */

/* A User-Agent a JSON writer must escape: quote, backslash, and a multibyte character. */
#define HOSTILE_UA "agent \"q\" \\b caf\xc3\xa9/1.0"

static unsigned local_port(int fd)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    return ntohs(sa.sin_port);
}

/* Over HTTP/1.1: the client's address and port (as its socket has them), its agent, the body
 * it sent and the body it got, streamed (larger than the relay's buffer). */
Test(access_log, http1_client_agent_and_bytes)
{
    start("info");
    int fd = fx_hold(raw_dial(px->port));
    unsigned port = local_port(fd);
    const char req[] = "POST /r/up HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: " HOSTILE_UA "\r\n"
                       "X-Request-Id: h1-bytes\r\nX-Test-Plan: body=70000\r\n"
                       "Content-Length: 11\r\nConnection: close\r\n\r\nhello world";
    cr_assert(raw_send_all(fd, req, sizeof(req) - 1));
    static char resp[128 * 1024];
    size_t got = 0;
    ssize_t n;
    while (got < sizeof(resp) && (n = raw_recv(fd, resp + got, sizeof(resp) - got, T)) > 0)
        got += (size_t)n;
    char *body = memmem(resp, got, "\r\n\r\n", 4);
    cr_assert(body && strncmp(resp, "HTTP/1.1 200", 12) == 0, "%.60s", resp);
    cr_expect_eq(got - (size_t)(body + 4 - resp), 70000);

    json_t *l = logged("h1-bytes");
    cr_expect_str_eq(json_str(l, "client_addr"), "127.0.0.1");
    cr_expect_eq(num(l, "client_port"), port);
    cr_expect_str_eq(json_str(l, "user_agent"), HOSTILE_UA);
    cr_expect_eq(num(l, "bytes_from_client"), 11);
    cr_expect_eq(num(l, "bytes_to_client"), 70000);
    cr_expect_str_eq(json_str(l, "protocol"), "HTTP/1.1");
    json_decref(l);
}

/* 'method' 'path' with request id 'id', a User-Agent and 'body'; asserts 'status'; returns
 * the body bytes the client got. */
static size_t call(bool h2, const char *path, const char *id, const char *ua, const char *plan,
                   const char *body, long status)
{
    char url[128], idh[64], uah[128], planh[64];
    snprintf(idh, sizeof(idh), "X-Request-Id: %s", id);
    snprintf(uah, sizeof(uah), "User-Agent: %s", ua);
    snprintf(planh, sizeof(planh), "X-Test-Plan: %s", plan);
    const char *h[] = { idh, uah, planh, NULL };
    struct http_resp r;
    (h2 ? http_do_h2 : http_do)(body ? "POST" : "GET", px_url(px, path, url, sizeof(url)), h, body,
                                body ? strlen(body) : 0, T, &r);
    cr_assert_eq(r.rc, 0, "curl error %d on %s", r.rc, path);
    cr_assert_eq(r.status, status, "%s: %ld", path, r.status);
    size_t n = r.body_len;
    http_free(&r);
    return n;
}

/* The line of 'id': from 127.0.0.1, agent 'ua', 'in' body bytes received (at most 'in' when
 * 'in_at_most': an answer made before the body was read), 'out' sent. */
static void expect_line(const char *id, const char *ua, const char *proto, size_t in,
                        bool in_at_most, size_t out)
{
    json_t *l = logged(id);
    cr_expect_str_eq(json_str(l, "client_addr"), "127.0.0.1", "%s", id);
    double port = num(l, "client_port");
    cr_expect(port > 0 && port < 65536, "%s: client_port %g", id, port);
    cr_expect_str_eq(json_str(l, "user_agent"), ua, "%s", id);
    cr_expect_str_eq(json_str(l, "protocol"), proto, "%s", id);
    double from = num(l, "bytes_from_client");
    cr_expect(in_at_most ? from <= in : from == in, "%s: %g from the client, %zu sent", id, from,
              in);
    cr_expect_eq(num(l, "bytes_to_client"), out, "%s: %g to the client, %zu got", id,
                 num(l, "bytes_to_client"), out);
    json_decref(l);
}

/* Short answers (taken whole), long ones (streamed), and retryproxy's own errors, over both
 * protocols. */
Test(access_log, bytes_each_way_over_both_protocols)
{
    start("info");
    for (int h2 = 0; h2 < 2; h2++) {
        const char *proto = h2 ? "HTTP/2" : "HTTP/1.1";
        char id[32];
        snprintf(id, sizeof(id), "short-%d", h2);
        size_t n = call(h2, "/r/s", id, "ua-short/1", "body=100", "0123456789", 200);
        cr_expect_eq(n, 100);
        expect_line(id, "ua-short/1", proto, 10, false, n);

        snprintf(id, sizeof(id), "long-%d", h2);
        n = call(h2, "/r/l", id, "ua-long/2", "body=300000", NULL, 200);
        cr_expect_eq(n, 300000);
        expect_line(id, "ua-long/2", proto, 0, false, n);

        snprintf(id, sizeof(id), "own-%d", h2);
        n = call(h2, "/none", id, HOSTILE_UA, "body=1", "abc", 404);
        cr_expect_gt(n, 0);
        /* HTTP/1.1 reads no body after an answer made at the head; HTTP/2 drops what comes */
        expect_line(id, HOSTILE_UA, proto, 3, true, n);
    }
}

/* A gRPC call (docs/grpc.md): its messages are the body both ways. */
Test(access_log, grpc_call_is_logged_with_its_bytes)
{
    start("info");
    char url[128];
    /* one message of 3 bytes: the flag, the length (big-endian), the bytes */
    static const char msg[8] = { 0, 0, 0, 0, 3, 'a', 'b', 'c' };
    const char *h[] = { "Content-Type: application/grpc", "TE: trailers",
                        "User-Agent: grpc-c/1.0",         "X-Request-Id: grpc-bytes",
                        "X-Test-Plan: body=42",           NULL };
    struct http_resp r;
    http_do_h2("POST", px_url(px, "/r/svc/M", url, sizeof(url)), h, msg, sizeof(msg), T, &r);
    cr_assert_eq(r.rc, 0);
    size_t n = r.body_len;
    http_free(&r);
    json_t *l = logged("grpc-bytes");
    cr_expect(json_object_get(l, "grpc_status") != NULL, "not logged as a gRPC call");
    json_decref(l);
    expect_line("grpc-bytes", "grpc-c/1.0", "HTTP/2", sizeof(msg), false, n);
}
