/* Forwarding rules (docs/forwarding.md), end to end: the real binary between a client and
 * the test upstream on 127.0.0.1.
 *
 * Each test asserts what tup received (headers in order, target, connection) and what the client
 * got back. libcurl is the client where an ordinary client is wanted; a raw socket where the
 * bytes on the wire matter (curl normalises dot segments, refuses ambiguous framing and hides
 * bytes that follow a bodiless response).
 */
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

#define T     10000 /* ms: upper bound for any single request in these tests */
#define QUIET 300   /* ms: how long "nothing more arrives" is watched for */

TestSuite(forwarding, .fini = fx_stop, .timeout = 60);

/* One tup and a proxy with one route "r" to it. 'route_extra' and 'top_extra' are JSON members
 * added to the route and to the top level ("" for none). */
static void start(const char *route_extra, const char *top_extra, const char *workers)
{
    fx_start_r(top_extra, route_extra, "--workers", workers, NULL);
}

/* GET 'path' through the proxy with 'headers'; asserts the transfer itself worked. */
static void get(const char *path, const char *const *headers, struct http_resp *r)
{
    char url[512];
    http_do("GET", px_url(px, path, url, sizeof(url)), headers, NULL, 0, T, r);
    cr_assert_eq(r->rc, 0, "curl error %d on GET %s", r->rc, path);
}

/* Number of response header lines named 'name' in a raw header block. */
static size_t header_lines(const char *block, const char *name)
{
    size_t n = 0, nl = strlen(name);
    for (const char *line = block; line && *line;) {
        const char *end = strchr(line, '\n');
        if (strncasecmp(line, name, nl) == 0 && line[nl] == ':')
            n++;
        line = end ? end + 1 : NULL;
    }
    return n;
}

/* The record of the only request tup saw with X-Request-Id 'id' (asserts there is one). */
static const struct tup_req *only_record(struct tup *t, const char *id)
{
    cr_assert_eq(tup_count_id(t, id), 1, "tup saw %zu requests with id %s", tup_count_id(t, id),
                 id);
    for (size_t i = 0; i < tup_count(t); i++) {
        const struct tup_req *q = tup_get(t, i);
        if (strcmp(q->request_id, id) == 0)
            return q;
    }
    return NULL;
}

/* 8-4-4-4-12 lowercase hex, version nibble 4, variant 8, 9, a or b. */
static bool is_uuid_v4(const char *s)
{
    if (strlen(s) != 36)
        return false;
    for (int i = 0; i < 36; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash != (s[i] == '-'))
            return false;
        if (!dash && !((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    }
    return s[14] == '4' && strchr("89ab", s[19]) != NULL;
}

/* ---- a raw client: the exact bytes on the wire ---- */

static int raw_connect(void)
{
    return raw_dial(px->port);
}

static void raw_send(int fd, const char *s)
{
    cr_assert(raw_send_all(fd, s, strlen(s)), "send: %s", strerror(errno));
}

/* Milliseconds until the peer closes 'fd' (end of stream or reset; bytes before it are
 * skipped), or -1 if it is still open after 'timeout_ms'. */
static int64_t ms_until_closed(int fd, int timeout_ms)
{
    int64_t t0 = now_ms();
    char buf[4096];
    for (;;) {
        int64_t left = t0 + timeout_ms - now_ms();
        if (left <= 0)
            return -1;
        ssize_t n = raw_recv(fd, buf, sizeof(buf), (int)left);
        if (n == 0 || (n == -1 && errno == ECONNRESET))
            return now_ms() - t0;
        if (n == -2)
            return -1;
        cr_assert(n > 0 || errno == EINTR, "recv: %s", strerror(errno));
    }
}

struct raw_resp {
    int status;
    char head[16384]; /* status line and header lines, NUL-terminated */
    char body[65536]; /* de-chunked, NUL-terminated */
    size_t body_len;
    size_t extra; /* bytes that arrived after the end of this response */
};

/* Index of the first "\r\n" in p[from, n), or n if there is none. */
static size_t crlf_at(const char *p, size_t from, size_t n)
{
    for (size_t i = from; i + 1 < n; i++)
        if (p[i] == '\r' && p[i + 1] == '\n')
            return i;
    return n;
}

/* The end of a complete chunked body at 'p' (bytes consumed), decoded into 'out', or 0 while
 * it is incomplete. */
static size_t chunked_end(const char *p, size_t n, struct raw_resp *out)
{
    size_t at = 0;
    out->body_len = 0;
    for (;;) {
        size_t eol = crlf_at(p, at, n);
        if (eol == n)
            return 0;
        size_t size = strtoul(p + at, NULL, 16);
        at = eol + 2;
        if (size == 0)
            break;
        if (size >= sizeof(out->body) - out->body_len) {
            cr_assert_fail("chunk of %zu bytes: more than the test expects", size);
            return 0;
        }
        if (n - at < size + 2)
            return 0;
        memcpy(out->body + out->body_len, p + at, size);
        out->body_len += size;
        at += size + 2;
    }
    for (;;) { /* trailer lines up to the empty one */
        size_t eol = crlf_at(p, at, n);
        if (eol == n)
            return 0;
        bool empty = eol == at;
        at = eol + 2;
        if (empty)
            return at;
    }
}

/* Reads one response from 'fd'. 'head_request': the request was HEAD (no body follows).
 * Asserts it arrives whole within 'timeout_ms'. */
static void raw_response(int fd, bool head_request, int timeout_ms, struct raw_resp *out)
{
    enum { CAP = 1 << 20 };
    static char *buf; /* kept for the process: every exit path, assertions included, is fine */
    if (!buf)
        buf = malloc(CAP);
    cr_assert_not_null(buf);
    size_t len = 0, head_end = 0;
    int64_t deadline = now_ms() + timeout_ms;
    bool eof = false;
    memset(out, 0, sizeof(*out));
    for (;;) {
        if (!head_end) {
            for (size_t i = crlf_at(buf, 0, len); i < len; i = crlf_at(buf, i + 2, len))
                if (crlf_at(buf, i + 2, len) == i + 2) {
                    head_end = i + 4;
                    break;
                }
            if (head_end) {
                cr_assert_lt(head_end, sizeof(out->head), "response head too large");
                memcpy(out->head, buf, head_end);
                out->head[head_end] = '\0';
                cr_assert_eq(sscanf(out->head, "HTTP/1.%*d %d", &out->status), 1,
                             "not a status line: %.80s", out->head);
            }
        }
        if (head_end) {
            const char *cl = NULL;
            for (const char *l = strstr(out->head, "\r\n") + 2; *l; l = strstr(l, "\r\n") + 2)
                if (strncasecmp(l, "Content-Length:", 15) == 0)
                    cl = l + 15;
            bool chunked = strcasestr(out->head, "\r\nTransfer-Encoding: chunked\r\n") != NULL;
            bool bodiless = head_request || out->status == 204 || out->status == 304;
            size_t end = 0; /* where this response ends in buf, 0 while incomplete */
            if (bodiless) {
                end = head_end;
            } else if (chunked) {
                size_t used = len > head_end ? chunked_end(buf + head_end, len - head_end, out) : 0;
                end = used ? head_end + used : 0;
            } else if (cl) {
                size_t want = head_end + strtoull(cl, NULL, 10);
                end = len >= want ? want : 0;
            } else if (eof) {
                end = len; /* delimited by the close */
            }
            if (end) {
                if (bodiless || !chunked) {
                    out->body_len = end - head_end;
                    cr_assert_lt(out->body_len, sizeof(out->body), "body too large");
                    memcpy(out->body, buf + head_end, out->body_len);
                }
                out->body[out->body_len] = '\0';
                out->extra = len - end;
                return;
            }
        }
        cr_assert(!eof, "connection closed before a complete response (%zu bytes: %.200s)", len,
                  buf);
        int64_t left = deadline - now_ms();
        cr_assert_gt(left, 0, "no complete response within %d ms (%zu bytes: %.200s)", timeout_ms,
                     len, buf);
        cr_assert_lt(len, CAP - 1, "response too large");
        ssize_t n = raw_recv(fd, buf + len, CAP - 1 - len, (int)left);
        if (n == 0 || (n == -1 && errno == ECONNRESET))
            eof = true;
        else if (n > 0)
            len += (size_t)n;
        else
            cr_assert(n == -2 || errno == EINTR, "recv: %s", strerror(errno));
        buf[len] = '\0';
    }
}

/* Value of header 'name' in a raw head (first one), or NULL. */
static const char *raw_header(const struct raw_resp *r, const char *name, char *buf, size_t cap)
{
    struct http_resp h = { .headers = (char *)r->head };
    return http_header(&h, name, buf, cap);
}

/* No byte arrives on 'fd' within QUIET ms (a bodiless response really had no body). */
static void expect_quiet(int fd)
{
    char b[256];
    ssize_t n = raw_recv(fd, b, sizeof(b) - 1, QUIET);
    if (n > 0)
        b[n] = '\0';
    cr_expect_eq(n, -2, "unexpected bytes after the response: %zd: %.*s", n, n > 0 ? (int)n : 0, b);
}

/* A JSON error of retryproxy's own: status, Content-Type, and each field exactly. 'route' NULL
 * means JSON null; 'attempts' < 0 skips that field. */
static void expect_json_error(int status, const char *ctype, const char *body, size_t len,
                              int want_status, const char *error, const char *route, int attempts)
{
    cr_expect_eq(status, want_status, "status %d, want %d; body: %.*s", status, want_status,
                 (int)len, body);
    cr_expect(ctype && strncasecmp(ctype, "application/json", 16) == 0, "Content-Type %s",
              ctype ? ctype : "(none)");
    json_error_t err;
    json_t *j = json_loadb(body, len, 0, &err);
    cr_assert_not_null(j, "body is not JSON (%s): %.*s", err.text, (int)len, body);
    cr_expect_str_eq(json_string_value(json_object_get(j, "error")), error);
    json_t *rt = json_object_get(j, "route");
    if (route)
        cr_expect_str_eq(json_string_value(rt), route);
    else
        cr_expect(json_is_null(rt), "\"route\" is not null: %.*s", (int)len, body);
    if (attempts >= 0)
        cr_expect(json_is_integer(json_object_get(j, "attempts")) &&
                      json_integer_value(json_object_get(j, "attempts")) == attempts,
                  "\"attempts\" is not %d: %.*s", attempts, (int)len, body);
    cr_expect(json_is_string(json_object_get(j, "message")), "no \"message\": %.*s", (int)len,
              body);
    json_decref(j);
}

static void expect_raw_json_error(const struct raw_resp *r, int want_status, const char *error,
                                  const char *route, int attempts)
{
    char ct[128];
    expect_json_error(r->status, raw_header(r, "Content-Type", ct, sizeof(ct)), r->body,
                      r->body_len, want_status, error, route, attempts);
}

/* Sends 'request' on a fresh connection and reads the answer (the connection is closed). */
static void raw_exchange(const char *request, struct raw_resp *out)
{
    int fd = raw_connect();
    raw_send(fd, request);
    raw_response(fd, false, T, out);
    close(fd);
}

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
    start("", "", "2");
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
    get("/hop", h, &r);
    cr_expect_eq(r.status, 200);
    const struct tup_req *q = only_record(up, "hop");
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
    start("\"retry\": {\"max_retry_body_bytes\": 1000}", "", "2");
    int fd = raw_connect();
    raw_send(fd, "GET /plain HTTP/1.1\r\nHost: a\r\nX-Request-Id: curl-own-get\r\n\r\n");
    static struct raw_resp resp;
    raw_response(fd, false, 10000, &resp);
    cr_expect_eq(resp.status, 200);
    raw_send(fd, "POST /form HTTP/1.1\r\nHost: a\r\nX-Request-Id: curl-own-form\r\n"
                 "Content-Length: 3\r\n\r\nabc");
    raw_response(fd, false, 10000, &resp);
    cr_expect_eq(resp.status, 200);
    char body[1200];
    memset(body, 'b', sizeof(body));
    char head[256];
    snprintf(head, sizeof(head),
             "POST /upload HTTP/1.1\r\nHost: a\r\nX-Request-Id: curl-own-post\r\n"
             "Content-Length: %zu\r\n\r\n",
             sizeof(body));
    raw_send(fd, head);
    send(fd, body, sizeof(body), MSG_NOSIGNAL);
    raw_response(fd, false, 10000, &resp);
    cr_expect_eq(resp.status, 200);
    close(fd);
    static const char *const ids[] = { "curl-own-get", "curl-own-form", "curl-own-post" };
    static const char *const never[] = { "Accept", "Expect", "Content-Type" };
    for (size_t i = 0; i < 3; i++) {
        const struct tup_req *q = only_record(up, ids[i]);
        for (size_t k = 0; k < 3; k++)
            cr_expect_eq(tup_req_header_count(q, never[k]), 0, "%s: %s was added: %s", ids[i],
                         never[k], tup_req_header(q, never[k]));
    }
    cr_expect_eq(only_record(up, "curl-own-post")->body_len, sizeof(body));
}

/* A chunked request body: Transfer-Encoding is hop-by-hop, so the client's field is not
 * forwarded; the body arrives whole (the proxy may frame it its own way). */
Test(forwarding, chunked_request_body_arrives_whole_without_the_clients_framing)
{
    start("", "", "2");
    static char body[3000];
    tup_pattern_fill((unsigned char *)body, 0, sizeof(body));
    const char *h[] = { "Transfer-Encoding: chunked", "X-Test-Plan: echo=1",
                        "X-Request-Id: chunked-up", NULL };
    char url[128];
    struct http_resp r;
    http_do("POST", px_url(px, "/up", url, sizeof(url)), h, body, sizeof(body), T, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, sizeof(body));
    cr_expect_eq(r.body_hash, tup_pattern_hash(sizeof(body)));
    const struct tup_req *q = only_record(up, "chunked-up");
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
    start("", "", "2");
    struct http_resp r;
    const char *one[] = { "X-Forwarded-For: 10.0.0.1", "X-Forwarded-Proto: https",
                          "X-Request-Id: xff-one", NULL };
    get("/xff", one, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    const char *two[] = { "X-Forwarded-For: 10.0.0.1", "X-Forwarded-For: 10.0.0.2, 10.0.0.3",
                          "X-Request-Id: xff-two", NULL };
    get("/xff", two, &r);
    http_free(&r);
    const char *none[] = { "X-Request-Id: xff-none", NULL };
    get("/xff", none, &r);
    http_free(&r);

    const struct tup_req *q = only_record(up, "xff-one");
    cr_expect_eq(tup_req_header_count(q, "X-Forwarded-For"), 1);
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-For"), "10.0.0.1, 127.0.0.1");
    cr_expect_eq(tup_req_header_count(q, "X-Forwarded-Proto"), 1);
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-Proto"), "http");

    q = only_record(up, "xff-two");
    cr_expect_eq(tup_req_header_count(q, "X-Forwarded-For"), 1);
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-For"),
                     "10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1");

    /* one rule for Connection: a field it names is not forwarded as sent, and the fields the
     * proxy writes itself are written from what the client sent whatever Connection says */
    const char *hop[] = { "Connection: X-Forwarded-For, X-Request-Id, X-Forwarded-Proto",
                          "X-Forwarded-For: 10.0.0.9", "X-Forwarded-Proto: https",
                          "X-Request-Id: xff-hop", NULL };
    get("/xff", hop, &r);
    cr_expect_str_eq(http_hdr(&r, "X-Request-Id"), "xff-hop");
    http_free(&r);
    q = only_record(up, "xff-hop");
    cr_expect_eq(tup_req_header_count(q, "X-Forwarded-For"), 1);
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-For"), "10.0.0.9, 127.0.0.1");
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-Proto"), "http");

    q = only_record(up, "xff-none");
    cr_expect_eq(tup_req_header_count(q, "X-Forwarded-For"), 1);
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-For"), "127.0.0.1");
    cr_expect_eq(tup_req_header_count(q, "X-Forwarded-Proto"), 1);
    cr_expect_str_eq(tup_req_header(q, "X-Forwarded-Proto"), "http");
}

/* ---- 3. X-Request-Id ---- */

Test(forwarding, request_id_is_kept_or_generated_and_stable_across_attempts)
{
    start("", "", "2");
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
    get("/id", kept, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    get("/id", NULL, &r); /* records 1 and 2: generated ids */
    http_free(&r);
    get("/id", NULL, &r);
    http_free(&r);
    const char *longest[] = { h128, NULL };
    get("/id", longest, &r);
    http_free(&r);
    const char *too_long[] = { h129, NULL }; /* record 4: replaced by a fresh id */
    get("/id", too_long, &r);
    http_free(&r);
    cr_assert_eq(tup_count(up), 5);

    const struct tup_req *q = tup_get(up, 0);
    cr_expect_eq(tup_req_header_count(q, "X-Request-Id"), 1);
    cr_expect_str_eq(q->request_id, "Client-Id-1");
    const char *a = tup_get(up, 1)->request_id, *b = tup_get(up, 2)->request_id;
    cr_expect(is_uuid_v4(a), "generated X-Request-Id '%s' is not a lowercase UUID v4", a);
    cr_expect(is_uuid_v4(b), "generated X-Request-Id '%s' is not a lowercase UUID v4", b);
    cr_expect_str_neq(a, b, "two requests got the same generated id");
    cr_expect_eq(tup_req_header_count(tup_get(up, 1), "X-Request-Id"), 1);
    cr_expect_str_eq(tup_get(up, 3)->request_id, id128);
    const char *c = tup_get(up, 4)->request_id;
    cr_expect(is_uuid_v4(c), "a 129-character id was not replaced by a UUID v4: '%s'", c);

    /* fail=1 counts per id: if the retry carried a new id, tup would fail it too. */
    const char *plan[] = { "X-Test-Plan: fail=1;status=503", NULL };
    get("/id-retry", plan, &r);
    cr_expect_eq(r.status, 200);
    char v[64];
    cr_expect_str_eq(http_header(&r, "X-Retry-Attempts", v, sizeof(v)), "2");
    http_free(&r);
    cr_assert_eq(tup_count(up), 7);
    const char *first = tup_get(up, 5)->request_id, *second = tup_get(up, 6)->request_id;
    cr_expect(is_uuid_v4(first), "'%s'", first);
    cr_expect_str_eq(second, first, "the retry carried another X-Request-Id");
    cr_expect_eq(tup_get(up, 6)->key_attempt, 2);
}

/* ---- 4. X-Retry-Attempt, X-Retry-Max-Attempts ---- */

Test(forwarding, retry_attempt_header_counts_attempts_and_client_values_are_not_forwarded)
{
    start("\"retry\": {\"max_attempts\": 3, \"backoff\": {\"base_ms\": 10, \"jitter\": \"none\"}}",
          "", "2");
    struct http_resp r;
    char v[64];
    const char *h[] = { "X-Test-Plan: fail=2;status=503", "X-Request-Id: attempts",
                        "X-Retry-Attempt: 7", "X-Retry-Max-Attempts: 5", NULL };
    get("/n", h, &r);
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
    get("/n", low, &r);
    cr_expect_eq(r.status, 503);
    cr_expect_str_eq(http_header(&r, "X-Retry-Attempts", v, sizeof(v)), "1");
    http_free(&r);
    const struct tup_req *q = only_record(up, "lowered");
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
    start("\"timeout_ms\": 5000, \"per_try_timeout_ms\": 1000, \"deadline_header\": "
          "\"X-Deadline-Ms\", \"retry\": {\"backoff\": {\"base_ms\": 10, \"jitter\": \"none\"}}",
          "", "1");
    struct http_resp r;
    /* the client's own X-Deadline-Ms and X-Retry-Timeout-Ms never reach the upstream */
    const char *h[] = { "X-Test-Plan: fail=2;status=503", "X-Request-Id: dl",
                        "X-Deadline-Ms: 999999", NULL };
    get("/d", h, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    cr_assert_eq(tup_count_id(up, "dl"), 3);
    for (size_t i = 0; i < 3; i++) /* the per-try timeout, shorter than what is left */
        cr_expect_eq(deadline_of(i, "X-Deadline-Ms"), 1000, "attempt %zu", i + 1);
    fx_stop();

    /* Without a per-try timeout: what is left of timeout_ms, less with each attempt. */
    start("\"timeout_ms\": 5000, \"deadline_header\": \"X-Deadline-Ms\", \"retry\": "
          "{\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 200, \"jitter\": \"none\"}}",
          "", "1");
    const char *h2[] = { "X-Test-Plan: fail=1;status=503", "X-Request-Id: left", NULL };
    get("/d", h2, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    long first = deadline_of(0, "X-Deadline-Ms"), second = deadline_of(1, "X-Deadline-Ms");
    cr_expect(first <= 5000 && first > 4000, "first attempt: %ld", first);
    cr_expect(second <= first - 200 && second > 3000, "second attempt: %ld after %ld", second,
              first);
}

Test(forwarding, x_retry_timeout_ms_lowers_the_request_timeout_never_raises_it)
{
    start("\"timeout_ms\": 5000, \"deadline_header\": \"X-Deadline-Ms\"", "", "1");
    struct http_resp r;
    const char *lower[] = { "X-Request-Id: lower", "X-Retry-Timeout-Ms: 2000", NULL };
    get("/t", lower, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    long v = deadline_of(0, "X-Deadline-Ms");
    cr_expect(v <= 2000 && v > 1000, "lowered to 2000: %ld", v);
    cr_expect_eq(tup_req_header_count(tup_get(up, 0), "X-Retry-Timeout-Ms"), 0);

    const char *higher[] = { "X-Request-Id: higher", "X-Retry-Timeout-Ms: 99999", NULL };
    get("/t", higher, &r);
    http_free(&r);
    v = deadline_of(1, "X-Deadline-Ms");
    cr_expect(v <= 5000 && v > 4000, "not raised past timeout_ms 5000: %ld", v);

    /* A hanging upstream answers 504 after the client's 300 ms, not the route's 5 s. */
    const char *hang[] = { "X-Test-Plan: fail=9;action=hang", "X-Request-Id: hang",
                           "X-Retry-Timeout-Ms: 300", NULL };
    int64_t t0 = now_ms();
    get("/t", hang, &r);
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
    start("", "", "2");
    struct http_resp r;
    const char *h[] = { "Host: Svc.Example:8080", "X-Request-Id: host", NULL };
    get("/h", h, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    const struct tup_req *q = only_record(up, "host");
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%u", tup_port(up));
    cr_expect_eq(tup_req_header_count(q, "Host"), 1);
    cr_expect_str_eq(tup_req_header(q, "Host"), want);
}

Test(forwarding, preserve_host_sends_the_clients_host)
{
    start("\"preserve_host\": true", "", "2");
    struct http_resp r;
    const char *h[] = { "Host: Svc.Example:8080", "X-Request-Id: host", NULL };
    get("/h", h, &r);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    const struct tup_req *q = only_record(up, "host");
    cr_expect_eq(tup_req_header_count(q, "Host"), 1);
    cr_expect_str_eq(tup_req_header(q, "Host"), "Svc.Example:8080");
}

/* ---- 6. the request target ---- */

#define ODD_TARGET "/a/../b/%2e%2E/c%20d?q=%41&x=1&x=2"

Test(forwarding, request_target_is_forwarded_byte_for_byte)
{
    start("", "", "2");
    struct raw_resp r;
    /* curl would remove the dot segments itself: the raw client sends them as they are */
    raw_exchange("GET " ODD_TARGET " HTTP/1.1\r\nHost: t\r\nX-Request-Id: odd\r\n\r\n", &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(only_record(up, "odd")->target, ODD_TARGET);
    raw_exchange("GET /?a=b/../c&&=%zz HTTP/1.1\r\nHost: t\r\nX-Request-Id: q\r\n\r\n", &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(only_record(up, "q")->target, "/?a=b/../c&&=%zz");
}

Test(forwarding, upstream_base_path_prefixes_the_target)
{
    fx_upstreams(1);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "api", "\"upstreams\": [\"%s/api\"]", fx_up_url(0));
    fx_start_b(b, "--workers", "2", NULL);
    struct raw_resp r;
    raw_exchange("GET /x HTTP/1.1\r\nHost: t\r\nX-Request-Id: x\r\n\r\n", &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(only_record(up, "x")->target, "/api/x");
    raw_exchange("GET " ODD_TARGET " HTTP/1.1\r\nHost: t\r\nX-Request-Id: odd\r\n\r\n", &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(only_record(up, "odd")->target, "/api" ODD_TARGET);
}

/* ---- 7. the response ---- */

/* tup's "Connection: close" (close-after=1) is about the upstream connection: the client's
 * stays open, and upstream chunked framing is not passed on as a header of its own. */
Test(forwarding, upstream_hop_by_hop_response_headers_do_not_reach_the_client)
{
    start("", "", "2");
    int fd = raw_connect();
    struct raw_resp r;
    char v[128];
    raw_send(fd, "GET /r HTTP/1.1\r\nHost: t\r\nX-Test-Plan: close-after=1\r\n\r\n");
    raw_response(fd, false, T, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(r.body, "ok\n");
    cr_expect_eq(r.extra, 0);
    const char *conn = raw_header(&r, "Connection", v, sizeof(v));
    cr_expect(!conn || !strcasestr(conn, "close"), "upstream's Connection: close passed: %s",
              r.head);
    cr_expect_eq(header_lines(r.head, "Keep-Alive"), 0, "%s", r.head);
    cr_expect_str_eq(raw_header(&r, "X-Tup-Attempt", v, sizeof(v)), "1");
    cr_expect_str_eq(raw_header(&r, "X-Tup-Seq", v, sizeof(v)), "0");
    cr_expect_str_eq(raw_header(&r, "X-Tup-Conn", v, sizeof(v)), "1");
    cr_expect_str_eq(raw_header(&r, "Content-Type", v, sizeof(v)), "text/plain");
    cr_expect_eq(header_lines(r.head, "X-Retry-Attempts"), 1, "%s", r.head);
    cr_expect_str_eq(raw_header(&r, "X-Retry-Attempts", v, sizeof(v)), "1");

    /* The same client connection still works. */
    raw_send(fd, "GET /r2 HTTP/1.1\r\nHost: t\r\nX-Test-Plan: chunked=1;body=5000\r\n\r\n");
    raw_response(fd, false, T, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, 5000);
    cr_expect_eq(tup_hash(r.body, r.body_len), tup_pattern_hash(5000));
    cr_expect_eq(r.extra, 0);
    cr_expect_leq(header_lines(r.head, "Transfer-Encoding"), 1, "%s", r.head);
    cr_expect_eq(header_lines(r.head, "Keep-Alive"), 0, "%s", r.head);
    cr_expect_str_eq(raw_header(&r, "X-Tup-Seq", v, sizeof(v)), "1");
    close(fd);
    cr_expect_eq(tup_count(up), 2);
}

/* HEAD is answered with the GET's Content-Length and no body: checked on one raw connection,
 * where a stray body would show up as bytes before the next response. */
Test(forwarding, head_gets_the_get_length_without_a_body_and_204_passes)
{
    start("", "", "2");
    int fd = raw_connect();
    struct raw_resp r;
    char v[128];
    raw_send(fd, "GET /b HTTP/1.1\r\nHost: t\r\nX-Test-Plan: body=1234\r\n\r\n");
    raw_response(fd, false, T, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(raw_header(&r, "Content-Length", v, sizeof(v)), "1234");
    cr_expect_eq(r.body_len, 1234);
    cr_expect_eq(tup_hash(r.body, r.body_len), tup_pattern_hash(1234));

    raw_send(fd, "HEAD /b HTTP/1.1\r\nHost: t\r\nX-Test-Plan: body=1234\r\n\r\n");
    raw_response(fd, true, T, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(raw_header(&r, "Content-Length", v, sizeof(v)), "1234");
    cr_expect_str_eq(raw_header(&r, "X-Retry-Attempts", v, sizeof(v)), "1");
    cr_expect_eq(r.extra, 0, "HEAD response followed by %zu bytes", r.extra);
    expect_quiet(fd);

    raw_send(fd, "GET /nc HTTP/1.1\r\nHost: t\r\nX-Test-Plan: ok=204\r\n\r\n");
    raw_response(fd, false, T, &r);
    cr_expect_eq(r.status, 204);
    cr_expect_str_eq(raw_header(&r, "X-Retry-Attempts", v, sizeof(v)), "1");
    cr_expect_str_eq(raw_header(&r, "X-Tup-Seq", v, sizeof(v)), "2");
    cr_expect_eq(header_lines(r.head, "Transfer-Encoding"), 0, "204 with framing: %s", r.head);
    cr_expect_eq(r.extra, 0, "204 response followed by %zu bytes", r.extra);
    expect_quiet(fd);

    /* and the connection is still in step */
    raw_send(fd, "GET /after HTTP/1.1\r\nHost: t\r\n\r\n");
    raw_response(fd, false, T, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(r.body, "ok\n");
    close(fd);
    cr_expect_eq(tup_count(up), 4);
    cr_expect_str_eq(tup_get(up, 1)->method, "HEAD");
}

/* ---- 8. strict requests ---- */

/* No request reached tup, after time enough for one to arrive. */
static void expect_nothing_forwarded(void)
{
    usleep(200 * 1000);
    cr_expect_eq(tup_count(up), 0, "tup received %zu requests", tup_count(up));
}

Test(forwarding, ambiguous_requests_are_rejected_with_400_json)
{
    start("\"match\": {\"path_prefix\": \"/ok\"}", "", "2");
    struct raw_resp r;
    raw_exchange("POST /ok/clte HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
                 &r);
    expect_raw_json_error(&r, 400, "bad_request", NULL, 0);
    raw_exchange("POST /ok/clcl HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
                 "Content-Length: 5\r\n\r\nhello",
                 &r);
    expect_raw_json_error(&r, 400, "bad_request", NULL, 0);
    raw_exchange("GET /ok/hosthost HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", &r);
    expect_raw_json_error(&r, 400, "bad_request", NULL, 0);
    expect_nothing_forwarded();
}

Test(forwarding, connect_is_405_and_no_route_is_404_json)
{
    start("\"match\": {\"path_prefix\": \"/ok\"}", "", "2");
    struct raw_resp r;
    char v[64];
    raw_exchange("CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n", &r);
    expect_raw_json_error(&r, 405, "method_not_allowed", NULL, 0);
    raw_exchange("GET /nope HTTP/1.1\r\nHost: t\r\n\r\n", &r);
    expect_raw_json_error(&r, 404, "no_route", NULL, 0);
    cr_expect_str_eq(raw_header(&r, "X-Retry-Attempts", v, sizeof(v)), "0");
    expect_nothing_forwarded();
}

/* Issue 27: both closed the connection after them, though only framing refusals do
 * (docs/forwarding.md), and the 405 had no Allow. A request after each on the same connection
 * is answered. */
Test(forwarding, connect_405_and_no_route_404_keep_the_connection)
{
    start("\"match\": {\"path_prefix\": \"/ok\"}", "", "2");
    static const char *const first[] = {
        "CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n",
        "GET /nope HTTP/1.1\r\nHost: t\r\n\r\n",
    };
    static const int status[] = { 405, 404 };
    char v[128];
    for (size_t i = 0; i < 2; i++) {
        struct raw_resp r;
        int fd = raw_connect();
        raw_send(fd, first[i]);
        raw_response(fd, false, T, &r);
        cr_expect_eq(r.status, status[i], "%s", r.head);
        cr_expect_eq(header_lines(r.head, "Connection"), 0, "%d with %s", r.status, r.head);
        if (status[i] == 405)
            cr_expect_str_eq(raw_header(&r, "Allow", v, sizeof(v)),
                             "GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH");
        raw_send(fd, "GET /ok/after HTTP/1.1\r\nHost: t\r\n\r\n");
        raw_response(fd, false, T, &r);
        cr_expect_eq(r.status, 200, "after the %d: %s", status[i], r.head);
        close(fd);
    }
    cr_expect_eq(tup_count(up), 2);
}

/* ---- 9. route matching ---- */

/* Which tup got the request with id 'id': 1 (up), 2 (fx_up(1)), 0 neither, -1 both. */
static int receiver(const char *id)
{
    size_t a = tup_count_id(up, id), b = tup_count_id(fx_up(1), id);
    return a && b ? -1 : a ? 1 : b ? 2 : 0;
}

/* Sends 'method' 'path' with Host 'host' and X-Request-Id 'id'; returns the status. */
static long route_probe(const char *method, const char *path, const char *host, const char *id)
{
    char hh[128], ih[128], url[256];
    snprintf(hh, sizeof(hh), "Host: %s", host);
    snprintf(ih, sizeof(ih), "X-Request-Id: %s", id);
    const char *h[] = { hh, ih, NULL };
    struct http_resp r;
    http_do(method, px_url(px, path, url, sizeof(url)), h, NULL, 0, T, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    long status = r.status;
    http_free(&r);
    return status;
}

Test(forwarding, routes_match_host_port_prefix_methods_first_wins)
{
    fx_upstreams(2);
    struct cfgb *cb = cfgb_new();
    const char *b = fx_up_url(1); /* routes named a-* go to upstream 0, b-* to upstream 1 */
    cfgb_route(cb, "a-port", "\"match\": {\"host\": \"svc.test:8080\"}");
    cfgb_route(cb, "b-host", "\"match\": {\"host\": \"svc.test\"}, \"upstreams\": [\"%s\"]", b);
    cfgb_route(cb, "a-prefix", "\"match\": {\"path_prefix\": \"/pa\"}");
    cfgb_route(cb, "b-post", "\"match\": {\"methods\": [\"POST\"]}, \"upstreams\": [\"%s\"]", b);
    cfgb_route(cb, "a-same", "\"match\": {\"path_prefix\": \"/same\"}");
    cfgb_route(cb, "b-same", "\"match\": {\"path_prefix\": \"/same\"}, \"upstreams\": [\"%s\"]", b);
    fx_start_b(cb, "--workers", "2", NULL);

    static const struct {
        const char *method, *path, *host;
        long status;
        int to; /* 1: up, 2: fx_up(1), 0: none */
    } cases[] = {
        { "GET", "/x", "SVC.Test:8080", 200, 1 }, /* host with port, case-insensitive */
        { "GET", "/x", "svc.test:9090", 200, 2 }, /* another port: only the portless pattern */
        { "GET", "/x", "svc.test", 200, 2 },      /* no port: not the pattern with one */
        { "GET", "/x", "Svc.Test", 200, 2 },
        { "GET", "/pa", "other", 200, 1 },         /* path prefix */
        { "GET", "/pax/y?z=1", "other", 200, 1 },  /* a plain prefix, not a segment */
        { "GET", "/p?a=/pa", "other", 404, 0 },    /* the query is not part of the path */
        { "GET", "/%70a", "other", 404, 0 },       /* raw path: %70 is not 'p' */
        { "POST", "/zzz", "other", 200, 2 },       /* methods */
        { "PUT", "/zzz", "other", 404, 0 },        /* methods: PUT is not listed */
        { "GET", "/same/1", "other", 200, 1 },     /* first match wins */
        { "POST", "/same/1", "other", 200, 2 },    /* ... in file order: b-post comes first */
        { "GET", "/pa", "svc.test:8080", 200, 1 }, /* a-port before a-prefix */
        { "GET", "/same", "svc.test", 200, 2 },    /* b-host before a-same */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char id[32];
        snprintf(id, sizeof(id), "case-%zu", i);
        long st = route_probe(cases[i].method, cases[i].path, cases[i].host, id);
        cr_expect_eq(st, cases[i].status, "%s %s Host %s: status %ld, want %ld", cases[i].method,
                     cases[i].path, cases[i].host, st, cases[i].status);
        cr_expect_eq(receiver(id), cases[i].to, "%s %s Host %s: went to tup %d, want %d",
                     cases[i].method, cases[i].path, cases[i].host, receiver(id), cases[i].to);
    }
}

/* ---- 10. max_body_bytes ---- */

Test(forwarding, bodies_over_max_body_bytes_get_413_and_are_not_forwarded)
{
    start("", "\"limits\": {\"max_body_bytes\": 1000}", "2");
    static char body[5000];
    tup_pattern_fill((unsigned char *)body, 0, sizeof(body));
    char url[128], ct[128];
    struct http_resp r;
    const char *plain[] = { "X-Test-Plan: echo=1", NULL };
    const char *chunked[] = { "X-Test-Plan: echo=1", "Transfer-Encoding: chunked", NULL };
    px_url(px, "/u", url, sizeof(url));

    http_do("POST", url, plain, body, 1001, T, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    expect_json_error((int)r.status, http_header(&r, "Content-Type", ct, sizeof(ct)),
                      (const char *)r.body, r.body_len, 413, "body_too_large", "r", 0);
    http_free(&r);

    /* The limit is found while the body streams in: the answer must still be the 413. */
    http_do("POST", url, chunked, body, sizeof(body), T, &r);
    cr_expect_eq(r.rc, 0, "chunked body over the limit: curl error %d%s", r.rc,
                 r.rc == 52 ? " (empty reply: closed without a response)" : "");
    if (r.rc == 0)
        expect_json_error((int)r.status, http_header(&r, "Content-Type", ct, sizeof(ct)),
                          (const char *)r.body, r.body_len, 413, "body_too_large", "r", 0);
    http_free(&r);
    expect_nothing_forwarded();

    /* At the limit, both framings pass whole. */
    http_do("POST", url, plain, body, 1000, T, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_hash, tup_pattern_hash(1000));
    http_free(&r);
    http_do("POST", url, chunked, body, 1000, T, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_hash, tup_pattern_hash(1000));
    http_free(&r);
    cr_expect_eq(tup_count(up), 2);
}

/* ---- 11. upstream keep-alive ---- */

Test(forwarding, sequential_requests_reuse_one_upstream_connection)
{
    start("", "", "1");
    for (int i = 0; i < 20; i++) {
        struct http_resp r;
        get("/k", NULL, &r);
        cr_expect_eq(r.status, 200, "request %d", i);
        http_free(&r);
    }
    cr_expect_eq(tup_count(up), 20);
    cr_expect_eq(tup_connections(up), 1, "20 requests used %llu upstream connections",
                 (unsigned long long)tup_connections(up));
    for (size_t i = 0; i < tup_count(up); i++)
        cr_expect_eq(tup_get(up, i)->conn_index, i + 1, "request %zu", i);
}

/* A bare upstream in the test itself (on fx_listen), for what tup does not do: close an idle
 * kept-alive connection on its own (as servers do when their keep-alive timeout ends). */

/* Accepts one connection (within 10 s), reads one request head and answers 200 "ok",
 * keeping the connection open; returns it. */
static int bare_answer(int lfd)
{
    struct pollfd p = { .fd = lfd, .events = POLLIN };
    cr_assert_eq(poll(&p, 1, 10000), 1, "the proxy did not connect");
    int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    cr_assert_geq(c, 0);
    char head[4096];
    size_t n = 0;
    while (n < sizeof(head) - 1) {
        struct pollfd q = { .fd = c, .events = POLLIN };
        cr_assert_eq(poll(&q, 1, 10000), 1, "no request head");
        ssize_t k = recv(c, head + n, sizeof(head) - 1 - n, 0);
        cr_assert_gt(k, 0);
        n += (size_t)k;
        head[n] = '\0';
        if (strstr(head, "\r\n\r\n"))
            break;
    }
    const char *ans = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    cr_assert_eq(send(c, ans, strlen(ans), MSG_NOSIGNAL), (ssize_t)strlen(ans));
    return c;
}

/* Between requests the upstream socket stays registered with the proxy's loop. When the
 * upstream closes it there, the proxy must neither spin on the readable socket nor fail the
 * next request: it opens a new connection. */
Test(forwarding, idle_upstream_connection_closed_by_the_upstream_costs_nothing)
{
    uint16_t port;
    int lfd = fx_listen(&port);
    char url[128];
    struct cfgb *cb = cfgb_new();
    cfgb_route(cb, "r", "\"upstreams\": [\"http://127.0.0.1:%u\"]", port);
    fx_start_b(cb, "--workers", "1", NULL);

    struct http_call a;
    http_call_start(&a, px_url(px, "/one", url, sizeof(url)), "idle-1", NULL);
    int c1 = bare_answer(lfd);
    http_call_join(&a);
    cr_assert_eq(a.r.rc, 0);
    cr_expect_eq(a.r.status, 200);
    http_free(&a.r);

    close(c1); /* the kept-alive connection ends while the proxy holds it idle */
    sleep_ms(100);
    long cpu0 = px_cpu_ms(px);
    sleep_ms(1000);
    long cpu1 = px_cpu_ms(px);
    cr_assert_geq(cpu0, 0);
    cr_expect_lt(cpu1 - cpu0, 200, "the idle proxy used %ld ms of CPU in 1 s", cpu1 - cpu0);

    struct http_call b;
    http_call_start(&b, px_url(px, "/two", url, sizeof(url)), "idle-2", NULL);
    int c2 = bare_answer(lfd);
    http_call_join(&b);
    cr_assert_eq(b.r.rc, 0);
    cr_expect_eq(b.r.status, 200);
    char v[16];
    cr_expect_str_eq(http_header(&b.r, "X-Retry-Attempts", v, sizeof(v)), "1");
    http_free(&b.r);
    close(c2);
    close(lfd);
}

/* ---- 12. client connection limits ---- */

Test(forwarding, slow_client_is_closed_after_connection_timeout)
{
    start("", "\"limits\": {\"connection_timeout_ms\": 1000}", "1");
    int fd = raw_connect();
    raw_send(fd, "GET /slo");
    int64_t ms = ms_until_closed(fd, 6000);
    close(fd);
    cr_expect_neq(ms, -1, "the connection was still open after 6 s");
    /* well before the 6 s above: closed by the timeout, however busy the machine (3.8 s was
     * seen beside other jobs) */
    cr_expect_leq(ms, 5000, "closed after %lld ms", (long long)ms);
    cr_expect_geq(ms, 500, "closed after %lld ms, before the timeout", (long long)ms);
    cr_expect_eq(tup_count(up), 0);
}

/* One complete request on 'fd' that must succeed within 'timeout_ms'. */
static void raw_ok(int fd, const char *what, int timeout_ms)
{
    struct raw_resp r;
    raw_send(fd, "GET /c HTTP/1.1\r\nHost: t\r\n\r\n");
    raw_response(fd, false, timeout_ms, &r);
    cr_expect_eq(r.status, 200, "%s: status %d", what, r.status);
}

/* Like nginx and HAProxy at their connection limits, the proxy stops accepting: a connection
 * over the limit waits in the kernel's backlog, unserved, and is served as soon as a slot frees
 * (without any other traffic to wake the worker). */
Test(forwarding, connections_over_max_connections_wait_until_a_slot_frees)
{
    start("", "\"limits\": {\"max_connections\": 2}", "1");
    int c1 = raw_connect(), c2 = raw_connect();
    raw_ok(c1, "first connection", T);
    raw_ok(c2, "second connection", T);

    int c3 = raw_connect(); /* the kernel completes the handshake; the proxy does not accept */
    raw_send(c3, "GET /c HTTP/1.1\r\nHost: t\r\n\r\n");
    char buf[64];
    cr_expect_eq(raw_recv(c3, buf, sizeof(buf), 1000), -2, /* -2: nothing within 1 s */
                 "a third connection was served while max_connections 2 were open");

    raw_ok(c1, "first connection, again", T);
    raw_ok(c2, "second connection, again", T);

    /* A slot freed by a client that went away goes to the waiting connection. */
    int64_t t0 = now_ms();
    close(c1);
    struct raw_resp r;
    raw_response(c3, false, 3000, &r);
    cr_expect_eq(r.status, 200, "the waiting connection was not served after a slot freed");
    cr_expect_lt(now_ms() - t0, 2000, "served %lld ms after the slot freed",
                 (long long)(now_ms() - t0));

    /* Both old connections gone: new ones are accepted at once. */
    close(c2);
    close(c3);
    int c4 = raw_connect();
    raw_ok(c4, "a new connection after the others closed", 3000);
    close(c4);
}

/* The sidecar's environment may hold a proxy setting meant for the application: upstream
 * traffic goes straight to the upstream regardless. */
Test(forwarding, environment_proxy_variables_do_not_reroute_upstreams)
{
    setenv("http_proxy", "http://127.0.0.1:9", 1);
    setenv("HTTP_PROXY", "http://127.0.0.1:9", 1);
    setenv("ALL_PROXY", "http://127.0.0.1:9", 1);
    start("", "", "1");
    unsetenv("http_proxy");
    unsetenv("HTTP_PROXY");
    unsetenv("ALL_PROXY");
    char url[128];
    const char *h[] = { "X-Request-Id: direct", NULL };
    struct http_resp r;
    http_do("GET", px_url(px, "/direct", url, sizeof(url)), h, NULL, 0, T, &r);
    cr_expect_eq(r.rc, 0);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(tup_count_id(up, "direct"), 1);
    http_free(&r);
}
