/* Forwarding rules (docs/forwarding.md), end to end: the request the upstream gets (hop-by-hop
 * and ordinary headers, X-Forwarded-*, X-Request-Id, the retry headers, Host, the target); the
 * real binary between a client and the test upstream on 127.0.0.1 (tests/support/fwdtest.h).
 * Each test asserts what tup received (headers in order, target, connection) and what the
 * client got back. The response, strict requests, routes and connections:
 * test_forwarding_conns.c.
 */
#include "tests/support/fwdtest.h"

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/fixture.h"

TestSuite(forwarding, .fini = fx_stop, .timeout = 60);

/* ---- 1. hop-by-hop and ordinary request headers ---- */

/* The "x-o-*" headers a record carries, in order, as "name: value\n" with lowercase names. */
static void ordinary_headers(const struct tup_req *q, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < q->n_headers; i++) {
        const struct tup_header *h = &q->headers[i];
        if (strncasecmp(h->name, "x-o-", 4) != 0)
            continue;
        for (const char *c = h->name; *c && used + 1 < cap; c++)
            out[used++] = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
        int n = snprintf(out + used, cap - used, ": %s\n", h->value);
        cr_assert(n >= 0 && (size_t)n < cap - used, "headers longer than %zu bytes", cap);
        used += (size_t)n;
    }
}

Test(forwarding, hop_by_hop_request_headers_are_dropped_others_kept_in_order)
{
    fwd_start("", "", "2");
    const char *h[] = { "X-O-First: 1",
                        "Connection: close, X-Custom-Hop",
                        "X-O-Dup: a",
                        "Keep-Alive: timeout=5",
                        "x-custom-hop: secret", /* named in Connection, other case */
                        "Connection: X-Other-Hop",
                        "X-Other-Hop: 2",
                        "Proxy-Connection: keep-alive",
                        "TE: trailers",
                        "X-O-Empty;", /* curl sends "X-O-Empty:" */
                        "Trailer: X-Trail",
                        "Upgrade: h2c",
                        "X-O-Dup: b",
                        "X-O-Last: z, y",
                        "X-Request-Id: hop",
                        NULL };
    struct http_resp r;
    fwd_get("/hop", h, &r);
    cr_expect_eq(r.status, 200);
    const struct tup_req *q = fwd_only_record(up, "hop");
    static const char *const dropped[] = { "Connection",   "Keep-Alive", "Proxy-Connection",
                                           "TE",           "Trailer",    "Upgrade",
                                           "X-Custom-Hop", "X-Other-Hop" };
    for (size_t i = 0; i < sizeof(dropped) / sizeof(dropped[0]); i++)
        cr_expect_eq(tup_req_header_count(q, dropped[i]), 0, "%s was forwarded: %s", dropped[i],
                     tup_req_header(q, dropped[i]));
    char got[512];
    ordinary_headers(q, got, sizeof(got));
    cr_expect_str_eq(got, "x-o-first: 1\nx-o-dup: a\nx-o-empty: \nx-o-dup: b\nx-o-last: z, y\n");
    http_free(&r);
}

/* libcurl adds Accept: *\/\* to a request that has none, Expect: 100-continue to a streamed
 * upload and a form Content-Type to a buffered one: a proxy adds none of them. Raw bytes, so
 * that no client library adds them on the way in either; the upload is over
 * max_retry_body_bytes, so it streams. */
Test(forwarding, curls_own_headers_never_reach_the_upstream)
{
    fwd_start("\"retry\": {\"max_retry_body_bytes\": 1000}", "", "2");
    int fd = fwd_raw_connect();
    fwd_raw_send(fd, "GET /plain HTTP/1.1\r\nHost: a\r\nX-Request-Id: curl-own-get\r\n\r\n");
    static struct fwd_resp resp;
    fwd_raw_response(fd, false, 10000, &resp);
    cr_expect_eq(resp.status, 200);
    fwd_raw_send(fd, "POST /form HTTP/1.1\r\nHost: a\r\nX-Request-Id: curl-own-form\r\n"
                     "Content-Length: 3\r\n\r\nabc");
    fwd_raw_response(fd, false, 10000, &resp);
    cr_expect_eq(resp.status, 200);
    char body[1200];
    memset(body, 'b', sizeof(body));
    char head[256];
    snprintf(head, sizeof(head),
             "POST /upload HTTP/1.1\r\nHost: a\r\nX-Request-Id: curl-own-post\r\n"
             "Content-Length: %zu\r\n\r\n",
             sizeof(body));
    fwd_raw_send(fd, head);
    send(fd, body, sizeof(body), MSG_NOSIGNAL);
    fwd_raw_response(fd, false, 10000, &resp);
    cr_expect_eq(resp.status, 200);
    close(fd);
    static const char *const ids[] = { "curl-own-get", "curl-own-form", "curl-own-post" };
    static const char *const never[] = { "Accept", "Expect", "Content-Type" };
    for (size_t i = 0; i < 3; i++) {
        const struct tup_req *q = fwd_only_record(up, ids[i]);
        for (size_t k = 0; k < 3; k++)
            cr_expect_eq(tup_req_header_count(q, never[k]), 0, "%s: %s was added: %s", ids[i],
                         never[k], tup_req_header(q, never[k]));
    }
    cr_expect_eq(fwd_only_record(up, "curl-own-post")->body_len, sizeof(body));
}

/* A chunked request body: Transfer-Encoding is hop-by-hop, so the client's field is not
 * forwarded; the body arrives whole (the proxy may frame it its own way). */
Test(forwarding, chunked_request_body_arrives_whole_without_the_clients_framing)
{
    fwd_start("", "", "2");
    static char body[3000];
    tup_pattern_fill((unsigned char *)body, 0, sizeof(body));
    const char *h[] = { "Transfer-Encoding: chunked", "X-Test-Plan: echo=1",
                        "X-Request-Id: chunked-up", NULL };
    char url[128];
    struct http_resp r;
    http_do("POST", px_url(px, "/up", url, sizeof(url)), h, body, sizeof(body), FWD_T, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, sizeof(body));
    cr_expect_eq(r.body_hash, tup_pattern_hash(sizeof(body)));
    const struct tup_req *q = fwd_only_record(up, "chunked-up");
    cr_expect_eq(q->body_len, sizeof(body));
    cr_expect_eq(q->body_hash, tup_pattern_hash(sizeof(body)));
    const char *te = tup_req_header(q, "Transfer-Encoding");
    cr_expect_leq(tup_req_header_count(q, "Transfer-Encoding"), 1);
    cr_expect(!te || strcmp(te, "chunked") == 0, "Transfer-Encoding: %s", te);
    cr_expect(!te || tup_req_header_count(q, "Content-Length") == 0,
              "both Transfer-Encoding and Content-Length sent upstream");
    http_free(&r);
}

/* ---- 2. X-Forwarded-For, X-Forwarded-Proto ---- */

Test(forwarding, x_forwarded_for_is_appended_or_created_and_proto_is_http)
{
    fwd_start("", "", "2");
    struct http_resp r;
    const char *one[] = { "X-Forwarded-For: 10.0.0.1", "X-Forwarded-Proto: https",
                          "X-Request-Id: xff-one", NULL };
    fwd_get("/xff", one, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    const char *two[] = { "X-Forwarded-For: 10.0.0.1", "X-Forwarded-For: 10.0.0.2, 10.0.0.3",
                          "X-Request-Id: xff-two", NULL };
    fwd_get("/xff", two, &r);
    http_free(&r);
    const char *none[] = { "X-Request-Id: xff-none", NULL };
    fwd_get("/xff", none, &r);
    http_free(&r);

    const struct tup_req *q = fwd_only_record(up, "xff-one");
    cr_expect_eq(tup_req_header_count(q, "X-Forwarded-For"), 1);
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-For"), "10.0.0.1, 127.0.0.1");
    cr_expect_eq(tup_req_header_count(q, "X-Forwarded-Proto"), 1);
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-Proto"), "http");

    q = fwd_only_record(up, "xff-two");
    cr_expect_eq(tup_req_header_count(q, "X-Forwarded-For"), 1);
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-For"),
                     "10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1");

    /* one rule for Connection: a field it names is not forwarded as sent, and the fields the
     * proxy writes itself are written from what the client sent whatever Connection says */
    const char *hop[] = { "Connection: X-Forwarded-For, X-Request-Id, X-Forwarded-Proto",
                          "X-Forwarded-For: 10.0.0.9", "X-Forwarded-Proto: https",
                          "X-Request-Id: xff-hop", NULL };
    fwd_get("/xff", hop, &r);
    cr_expect_str_eq(http_hdr(&r, "X-Request-Id"), "xff-hop");
    http_free(&r);
    q = fwd_only_record(up, "xff-hop");
    cr_expect_eq(tup_req_header_count(q, "X-Forwarded-For"), 1);
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-For"), "10.0.0.9, 127.0.0.1");
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-Proto"), "http");

    q = fwd_only_record(up, "xff-none");
    cr_expect_eq(tup_req_header_count(q, "X-Forwarded-For"), 1);
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-For"), "127.0.0.1");
    cr_expect_eq(tup_req_header_count(q, "X-Forwarded-Proto"), 1);
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-Proto"), "http");
}

/* ---- 3. X-Request-Id ---- */

Test(forwarding, request_id_is_kept_or_generated_and_stable_across_attempts)
{
    fwd_start("", "", "2");
    struct http_resp r;
    char id128[129], id129[130];
    memset(id128, 'k', 128);
    id128[128] = '\0';
    memset(id129, 'L', 129);
    id129[129] = '\0';
    char h128[160], h129[160];
    snprintf(h128, sizeof(h128), "X-Request-Id: %s", id128);
    snprintf(h129, sizeof(h129), "X-Request-Id: %s", id129);

    const char *kept[] = { "X-Request-Id: Client-Id-1", NULL };
    fwd_get("/id", kept, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    fwd_get("/id", NULL, &r); /* records 1 and 2: generated ids */
    http_free(&r);
    fwd_get("/id", NULL, &r);
    http_free(&r);
    const char *longest[] = { h128, NULL };
    fwd_get("/id", longest, &r);
    http_free(&r);
    const char *too_long[] = { h129, NULL }; /* record 4: replaced by a fresh id */
    fwd_get("/id", too_long, &r);
    http_free(&r);
    cr_assert_eq(tup_count(up), 5);

    const struct tup_req *q = tup_get(up, 0);
    cr_expect_eq(tup_req_header_count(q, "X-Request-Id"), 1);
    cr_expect_str_eq(q->request_id, "Client-Id-1");
    const char *a = tup_get(up, 1)->request_id, *b = tup_get(up, 2)->request_id;
    cr_expect(fwd_is_uuid_v4(a), "generated X-Request-Id '%s' is not a lowercase UUID v4", a);
    cr_expect(fwd_is_uuid_v4(b), "generated X-Request-Id '%s' is not a lowercase UUID v4", b);
    cr_expect_str_neq(a, b, "two requests got the same generated id");
    cr_expect_eq(tup_req_header_count(tup_get(up, 1), "X-Request-Id"), 1);
    cr_expect_str_eq(tup_get(up, 3)->request_id, id128);
    const char *c = tup_get(up, 4)->request_id;
    cr_expect(fwd_is_uuid_v4(c), "a 129-character id was not replaced by a UUID v4: '%s'", c);

    /* fail=1 counts per id: if the retry carried a new id, tup would fail it too. */
    const char *plan[] = { "X-Test-Plan: fail=1;status=503", NULL };
    fwd_get("/id-retry", plan, &r);
    cr_expect_eq(r.status, 200);
    char v[64];
    cr_expect_str_eq(http_header(&r, "X-Retry-Attempts", v, sizeof(v)), "2");
    http_free(&r);
    cr_assert_eq(tup_count(up), 7);
    const char *first = tup_get(up, 5)->request_id, *second = tup_get(up, 6)->request_id;
    cr_expect(fwd_is_uuid_v4(first), "'%s'", first);
    cr_expect_str_eq(second, first, "the retry carried another X-Request-Id");
    cr_expect_eq(tup_get(up, 6)->key_attempt, 2);
}

/* ---- 4. X-Retry-Attempt, X-Retry-Max-Attempts ---- */

Test(forwarding, retry_attempt_header_counts_attempts_and_client_values_are_not_forwarded)
{
    fwd_start(
        "\"retry\": {\"max_attempts\": 3, \"backoff\": {\"base_ms\": 10, \"jitter\": \"none\"}}",
        "", "2");
    struct http_resp r;
    char v[64];
    const char *h[] = { "X-Test-Plan: fail=2;status=503", "X-Request-Id: attempts",
                        "X-Retry-Attempt: 7", "X-Retry-Max-Attempts: 5", NULL };
    fwd_get("/n", h, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_header(&r, "X-Retry-Attempts", v, sizeof(v)), "3");
    http_free(&r);
    cr_assert_eq(tup_count_id(up, "attempts"), 3);
    for (size_t i = 0; i < 3; i++) {
        const struct tup_req *q = tup_get(up, i);
        char want[8];
        snprintf(want, sizeof(want), "%zu", i + 1);
        cr_expect_eq(tup_req_header_count(q, "X-Retry-Attempt"), 1, "attempt %zu", i + 1);
        cr_expect_str_eq(tup_req_header(q, "X-Retry-Attempt"), want);
        cr_expect_eq(tup_req_header_count(q, "X-Retry-Max-Attempts"), 0, "attempt %zu", i + 1);
    }

    /* Lowering the limit works, and the header still stays at the proxy. */
    const char *low[] = { "X-Test-Plan: fail=2;status=503", "X-Request-Id: lowered",
                          "X-Retry-Max-Attempts: 1", NULL };
    fwd_get("/n", low, &r);
    cr_expect_eq(r.status, 503);
    cr_expect_str_eq(http_header(&r, "X-Retry-Attempts", v, sizeof(v)), "1");
    http_free(&r);
    const struct tup_req *q = fwd_only_record(up, "lowered");
    cr_expect_str_eq(tup_req_header(q, "X-Retry-Attempt"), "1");
    cr_expect_eq(tup_req_header_count(q, "X-Retry-Max-Attempts"), 0);
}

/* The value of header 'name' of the record of attempt 'i' as a number (asserts it is one, once). */
static long deadline_of(size_t i, const char *name)
{
    const struct tup_req *q = tup_get(up, i);
    cr_assert_not_null(q, "no record %zu", i);
    cr_assert_eq(tup_req_header_count(q, name), 1, "attempt %zu: %s", i + 1, name);
    char *end;
    long v = strtol(tup_req_header(q, name), &end, 10);
    cr_assert(*end == '\0' && v >= 0, "attempt %zu: %s: %s", i + 1, name, tup_req_header(q, name));
    return v;
}

Test(forwarding, deadline_header_tells_each_attempt_how_long_it_is_waited_for)
{
    fwd_start(
        "\"timeout_ms\": 5000, \"per_try_timeout_ms\": 1000, \"deadline_header\": "
        "\"X-Deadline-Ms\", \"retry\": {\"backoff\": {\"base_ms\": 10, \"jitter\": \"none\"}}",
        "", "1");
    struct http_resp r;
    /* the client's own X-Deadline-Ms and X-Retry-Timeout-Ms never reach the upstream */
    const char *h[] = { "X-Test-Plan: fail=2;status=503", "X-Request-Id: dl",
                        "X-Deadline-Ms: 999999", NULL };
    fwd_get("/d", h, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    cr_assert_eq(tup_count_id(up, "dl"), 3);
    for (size_t i = 0; i < 3; i++) /* the per-try timeout, shorter than what is left */
        cr_expect_eq(deadline_of(i, "X-Deadline-Ms"), 1000, "attempt %zu", i + 1);
    fx_stop();

    /* Without a per-try timeout: what is left of timeout_ms, less with each attempt. */
    fwd_start("\"timeout_ms\": 5000, \"deadline_header\": \"X-Deadline-Ms\", \"retry\": "
              "{\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 200, \"jitter\": \"none\"}}",
              "", "1");
    const char *h2[] = { "X-Test-Plan: fail=1;status=503", "X-Request-Id: left", NULL };
    fwd_get("/d", h2, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    long first = deadline_of(0, "X-Deadline-Ms"), second = deadline_of(1, "X-Deadline-Ms");
    cr_expect(first <= 5000 && first > 4000, "first attempt: %ld", first);
    cr_expect(second <= first - 200 && second > 3000, "second attempt: %ld after %ld", second,
              first);
}

Test(forwarding, x_retry_timeout_ms_lowers_the_request_timeout_never_raises_it)
{
    fwd_start("\"timeout_ms\": 5000, \"deadline_header\": \"X-Deadline-Ms\"", "", "1");
    struct http_resp r;
    const char *lower[] = { "X-Request-Id: lower", "X-Retry-Timeout-Ms: 2000", NULL };
    fwd_get("/t", lower, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    long v = deadline_of(0, "X-Deadline-Ms");
    cr_expect(v <= 2000 && v > 1000, "lowered to 2000: %ld", v);
    cr_expect_eq(tup_req_header_count(tup_get(up, 0), "X-Retry-Timeout-Ms"), 0);

    const char *higher[] = { "X-Request-Id: higher", "X-Retry-Timeout-Ms: 99999", NULL };
    fwd_get("/t", higher, &r);
    http_free(&r);
    v = deadline_of(1, "X-Deadline-Ms");
    cr_expect(v <= 5000 && v > 4000, "not raised past timeout_ms 5000: %ld", v);

    /* A hanging upstream answers 504 after the client's 300 ms, not the route's 5 s. */
    const char *hang[] = { "X-Test-Plan: fail=9;action=hang", "X-Request-Id: hang",
                           "X-Retry-Timeout-Ms: 300", NULL };
    int64_t t0 = now_ms();
    fwd_get("/t", hang, &r);
    int64_t took = now_ms() - t0;
    cr_expect_eq(r.status, 504);
    char stop[32];
    cr_expect_str_eq(http_header(&r, "X-Retry-Stop", stop, sizeof(stop)), "deadline");
    http_free(&r);
    cr_expect(took >= 290 && took < 3000, "answered after %lld ms", (long long)took);
}

/* ---- 5. Host ---- */

Test(forwarding, host_is_the_upstream_authority_by_default)
{
    fwd_start("", "", "2");
    struct http_resp r;
    const char *h[] = { "Host: Svc.Example:8080", "X-Request-Id: host", NULL };
    fwd_get("/h", h, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    const struct tup_req *q = fwd_only_record(up, "host");
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%u", tup_port(up));
    cr_expect_eq(tup_req_header_count(q, "Host"), 1);
    cr_expect_str_eq(tup_req_header(q, "Host"), want);
}

Test(forwarding, preserve_host_sends_the_clients_host)
{
    fwd_start("\"preserve_host\": true", "", "2");
    struct http_resp r;
    const char *h[] = { "Host: Svc.Example:8080", "X-Request-Id: host", NULL };
    fwd_get("/h", h, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    const struct tup_req *q = fwd_only_record(up, "host");
    cr_expect_eq(tup_req_header_count(q, "Host"), 1);
    cr_expect_str_eq(tup_req_header(q, "Host"), "Svc.Example:8080");
}

/* ---- 6. the request target ---- */

#define ODD_TARGET "/a/../b/%2e%2E/c%20d?q=%41&x=1&x=2"

Test(forwarding, request_target_is_forwarded_byte_for_byte)
{
    fwd_start("", "", "2");
    struct fwd_resp r;
    /* curl would remove the dot segments itself: the raw client sends them as they are */
    fwd_raw_exchange("GET " ODD_TARGET " HTTP/1.1\r\nHost: t\r\nX-Request-Id: odd\r\n\r\n", &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(fwd_only_record(up, "odd")->target, ODD_TARGET);
    fwd_raw_exchange("GET /?a=b/../c&&=%zz HTTP/1.1\r\nHost: t\r\nX-Request-Id: q\r\n\r\n", &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(fwd_only_record(up, "q")->target, "/?a=b/../c&&=%zz");
}

Test(forwarding, upstream_base_path_prefixes_the_target)
{
    fx_upstreams(1);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "api", "\"upstreams\": [\"%s/api\"]", fx_up_url(0));
    fx_start_b(b, "--workers", "2", NULL);
    struct fwd_resp r;
    fwd_raw_exchange("GET /x HTTP/1.1\r\nHost: t\r\nX-Request-Id: x\r\n\r\n", &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(fwd_only_record(up, "x")->target, "/api/x");
    fwd_raw_exchange("GET " ODD_TARGET " HTTP/1.1\r\nHost: t\r\nX-Request-Id: odd\r\n\r\n", &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(fwd_only_record(up, "odd")->target, "/api" ODD_TARGET);
}
