/* The request id back to the client (docs/forwarding.md, "Responses to the client"): every
 * answer carries the X-Request-Id the request went upstream and was logged with, whether the
 * upstream's response is streamed, collected or retryproxy's own error.
 *
 * Each test asserts what the client got against what tup received and what the request log
 * line says.
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "tests/support/fixture.h"

#define T 10000 /* ms: upper bound for any single request in these tests */

TestSuite(request_id, .fini = fx_stop, .timeout = 60);

/* Routes: /ok to upstream 0; /dead to a port nothing listens on (502 after two attempts);
 * /hang to upstream 0 with a per-try timeout and one attempt (504). Anything else: 404. Bodies
 * over 1000 bytes: 413. */
static void start(void)
{
    fx_upstreams(1);
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"limits\": {\"max_body_bytes\": 1000}");
    cfgb_route(b, "ok", "\"match\": {\"path_prefix\": \"/ok\"}, \"retry\": {" CFG_FAST "}");
    cfgb_route(b, "dead",
               "\"match\": {\"path_prefix\": \"/dead\"}, \"upstreams\": [\"http://127.0.0.1:%u\"],"
               "\"retry\": {\"max_attempts\": 2, " CFG_FAST "}",
               fx_closed_port());
    cfgb_route(b, "hang",
               "\"match\": {\"path_prefix\": \"/hang\"}, \"per_try_timeout_ms\": 200,"
               "\"retry\": {\"max_attempts\": 1}");
    fx_start_b(b, "--workers", "2", NULL);
}

/* 'method' 'path' with 'headers' and 'body_len' bytes of body; asserts the transfer worked. */
static void call(const char *method, const char *path, const char *const *headers, size_t body_len,
                 struct http_resp *r)
{
    static char body[4096];
    memset(body, 'b', sizeof(body));
    cr_assert_leq(body_len, sizeof(body));
    char url[256];
    http_do(method, px_url(px, path, url, sizeof(url)), headers, body_len ? body : NULL, body_len,
            T, r);
    cr_assert_eq(r->rc, 0, "curl error %d on %s %s", r->rc, method, path);
}

/* Response header lines named 'name' in the raw header block. */
static size_t lines_named(const char *block, const char *name)
{
    size_t n = 0, nl = strlen(name);
    for (const char *line = block; line && *line;) {
        if (strncasecmp(line, name, nl) == 0 && line[nl] == ':')
            n++;
        line = strchr(line, '\n');
        line = line ? line + 1 : NULL;
    }
    return n;
}

/* 8-4-4-4-12 lowercase hex: the shape of a generated id. */
static bool is_uuid(const char *s)
{
    if (!s || strlen(s) != 36)
        return false;
    for (int i = 0; i < 36; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? s[i] != '-' : !strchr("0123456789abcdef", s[i]))
            return false;
    }
    return true;
}

/* The one X-Request-Id of the answer (asserts there is exactly one), copied into buf. */
static const char *answer_id(const struct http_resp *r, char *buf, size_t cap)
{
    cr_assert_eq(lines_named(r->headers, "X-Request-Id"), 1,
                 "want one X-Request-Id in the answer, got:\n%s", r->headers);
    return http_header(r, "X-Request-Id", buf, cap);
}

/* Sends 'head' on a connection of its own and reads the answer until the proxy closes it
 * (these answers carry Connection: close) into buf, NUL-terminated. */
static void raw_answer(const char *head, char *buf, size_t cap)
{
    int fd = fx_hold(raw_dial(px->port));
    cr_assert(raw_send_all(fd, head, strlen(head)));
    size_t got = 0;
    for (ssize_t n; got < cap - 1 && (n = raw_recv(fd, buf + got, cap - 1 - got, T)) > 0;)
        got += (size_t)n;
    buf[got] = '\0';
    close(fd);
    fx_release(fd);
}

/* The "request_id" of the request log line for 'path' (copied). */
static const char *logged_id(const char *path, char *buf, size_t cap)
{
    json_t *j = fx_request_logged("path", path);
    if (!j)
        return NULL;
    snprintf(buf, cap, "%s", json_str(j, "request_id") ? json_str(j, "request_id") : "(null)");
    json_decref(j);
    return buf;
}

Test(request_id, a_generated_id_comes_back_as_the_upstream_and_the_log_saw_it)
{
    start();
    struct http_resp r;
    char id[160], logged[160];
    call("GET", "/ok/small", NULL, 0, &r); /* collected: answered in one piece */
    cr_expect_eq(r.status, 200);
    answer_id(&r, id, sizeof(id));
    cr_expect(is_uuid(id), "generated id '%s'", id);
    cr_expect_eq(tup_count_id(up, id), 1, "the upstream did not receive id %s", id);
    cr_expect_str_eq(logged_id("/ok/small", logged, sizeof(logged)), id);
    http_free(&r);

    const char *big[] = { "X-Test-Plan: body=200000", NULL }; /* streamed: over 64 KiB */
    call("GET", "/ok/big", big, 0, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, 200000);
    answer_id(&r, id, sizeof(id));
    cr_expect(is_uuid(id), "generated id '%s'", id);
    cr_expect_eq(tup_count_id(up, id), 1, "the upstream did not receive id %s", id);
    http_free(&r);

    /* a retried request: one id for both attempts and the answer */
    const char *retried[] = { "X-Test-Plan: fail=1;status=503", NULL };
    call("GET", "/ok/retried", retried, 0, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    answer_id(&r, id, sizeof(id));
    cr_expect_eq(tup_count_id(up, id), 2, "both attempts carry the id %s", id);
    http_free(&r);
}

Test(request_id, a_client_id_comes_back_unchanged_and_replaces_the_upstreams_own)
{
    start();
    struct http_resp r;
    char id[160];
    const char *mine[] = { "X-Request-Id: Client-Id/7 ok", NULL };
    call("GET", "/ok/mine", mine, 0, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(answer_id(&r, id, sizeof(id)), "Client-Id/7 ok");
    cr_expect_eq(tup_count_id(up, "Client-Id/7 ok"), 1);
    http_free(&r);

    /* an upstream that answers with an id of its own (a 500: the answer, not retried): the
     * client still gets one X-Request-Id, the request's */
    const char *own[] = { "X-Request-Id: theirs-and-mine",
                          "X-Test-Plan: fail=1;status=500;header=X-Request-Id:upstream-own", NULL };
    call("GET", "/ok/own", own, 0, &r);
    cr_expect_eq(r.status, 500);
    cr_expect_str_eq(answer_id(&r, id, sizeof(id)), "theirs-and-mine");
    http_free(&r);
}

/* retryproxy's own errors carry it too: the id is logged, so a client can quote it. */
Test(request_id, the_proxys_own_errors_carry_it)
{
    start();
    struct http_resp r;
    char id[160], logged[160];
    static const struct {
        const char *method, *path;
        size_t body;
        long status;
    } cases[] = {
        { "GET", "/nowhere", 0, 404 },    /* no_route */
        { "POST", "/ok/big", 2000, 413 }, /* body_too_large, by Content-Length */
        { "GET", "/dead/x", 0, 502 },     /* upstream_unavailable, after 2 attempts */
        { "GET", "/hang/x", 0, 504 },     /* upstream_timeout */
    };
    const char *hang[] = { "X-Test-Plan: fail=1;action=hang", NULL };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        call(cases[i].method, cases[i].path, cases[i].status == 504 ? hang : NULL, cases[i].body,
             &r);
        cr_expect_eq(r.status, cases[i].status, "%s: status %ld", cases[i].path, r.status);
        cr_expect_str_eq(http_hdr(&r, "Content-Type"), "application/json", "%s", cases[i].path);
        answer_id(&r, id, sizeof(id));
        cr_expect(is_uuid(id), "%s: id '%s'", cases[i].path, id);
        cr_expect_str_eq(logged_id(cases[i].path, logged, sizeof(logged)), id, "%s", cases[i].path);
        http_free(&r);
    }

    /* the client's own id on an error */
    const char *mine[] = { "X-Request-Id: lost-1", NULL };
    call("GET", "/nowhere-mine", mine, 0, &r);
    cr_expect_eq(r.status, 404);
    cr_expect_str_eq(answer_id(&r, id, sizeof(id)), "lost-1");
    http_free(&r);

    /* CONNECT (405) and an ambiguous head (400: two Hosts) get one too; the id of a head that
     * was refused is always a new one. Raw bytes: curl sends neither. */
    static const struct {
        const char *head;
        const char *status_line;
    } raw[] = {
        { "GET /ok/two HTTP/1.1\r\nHost: a\r\nHost: b\r\nX-Request-Id: bad-1\r\n\r\n",
          "HTTP/1.1 400" },
        { "CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n", "HTTP/1.1 405" },
    };
    for (size_t i = 0; i < sizeof(raw) / sizeof(raw[0]); i++) {
        char buf[4096];
        raw_answer(raw[i].head, buf, sizeof(buf));
        cr_expect(strncmp(buf, raw[i].status_line, 12) == 0, "%s", buf);
        const char *h = strcasestr(buf, "\r\nX-Request-Id: ");
        char got[40] = "";
        if (h)
            snprintf(got, sizeof(got), "%.36s", h + 16);
        cr_expect(h && is_uuid(got) && h[16 + 36] == '\r', "no new id in:\n%s", buf);
    }
}
