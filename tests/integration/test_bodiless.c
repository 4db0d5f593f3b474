/* Answers with no body on the wire, to an HTTP/1.1 client (RFC 9112 6.3): a 304 carries the
 * upstream's Content-Length if it sent one and no other (RFC 9110 8.6), never a chunked
 * framing, and nothing follows its head, so the next response on a kept-alive connection
 * parses cleanly. From an http:// upstream (tests/support/rawup.h) and an h2c one
 * (tests/tools/h2_upstream.py). */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/h2u.h"
#include "tests/support/rawup.h"

static void stop(void)
{
    h2u_stop_all();
    fx_stop();
}

TestSuite(bodiless, .fini = stop, .timeout = 60);

struct bytes_in {
    char buf[8192];
    size_t len;
    bool closed;
};

/* Sends GET 'path' with the 'extra' field lines on 'fd' and reads what comes: the head, then
 * for 300 ms more (stray bytes, or the close). */
static void exchange(int fd, const char *path, const char *extra, struct bytes_in *in)
{
    char req[512];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: a\r\n%s\r\n", path, extra);
    cr_assert(raw_send_all(fd, req, (size_t)n));
    in->len = 0;
    in->closed = false;
    int64_t end = now_ms() + 10000;
    bool head = false;
    for (;;) {
        int64_t left = head ? 300 : end - now_ms();
        if (left <= 0)
            break;
        ssize_t k = raw_recv(fd, in->buf + in->len, sizeof(in->buf) - 1 - in->len, (int)left);
        if (k == -2)
            break;
        if (k <= 0) {
            in->closed = true;
            break;
        }
        in->len += (size_t)k;
        in->buf[in->len] = '\0';
        if (!head && strstr(in->buf, "\r\n\r\n")) {
            head = true;
            end = now_ms() + 300;
        }
    }
    in->buf[in->len] = '\0';
}

/* The value of 'name' in the head, or NULL (a static buffer). */
static const char *field(const struct bytes_in *in, const char *name)
{
    static char v[128];
    size_t nl = strlen(name);
    for (const char *l = strstr(in->buf, "\r\n"); l && l[2] != '\r'; l = strstr(l + 2, "\r\n"))
        if (strncasecmp(l + 2, name, nl) == 0 && l[2 + nl] == ':') {
            snprintf(v, sizeof(v), "%.*s", (int)strcspn(l + 3 + nl, "\r"), l + 3 + nl);
            return v[0] == ' ' ? v + 1 : v;
        }
    return NULL;
}

/* A 304 whose head is all that came: 'length' its Content-Length (NULL: none, and then the
 * connection closes after it, the only way libmicrohttpd 0.9.75 frames it), no chunking. */
static void expect_304(const struct bytes_in *in, const char *length, const char *what)
{
    cr_expect(strncmp(in->buf, "HTTP/1.1 304 ", 13) == 0, "%s: got:\n%s", what, in->buf);
    const char *end = strstr(in->buf, "\r\n\r\n");
    cr_assert_not_null(end, "%s: no head:\n%s", what, in->buf);
    cr_expect_eq((size_t)(end + 4 - in->buf), in->len, "%s: bytes after the head:\n%s", what,
                 in->buf);
    cr_expect_null(field(in, "Transfer-Encoding"), "%s: chunked:\n%s", what, in->buf);
    const char *cl = field(in, "Content-Length");
    if (length)
        cr_expect(cl && strcmp(cl, length) == 0, "%s: Content-Length %s, want %s", what,
                  cl ? cl : "none", length);
    else {
        cr_expect_null(cl, "%s: a Content-Length the upstream did not send: %s", what, cl);
        cr_expect(in->closed, "%s: no length, yet the connection stayed open", what);
    }
}

/* The next answer on the same connection starts with its status line, nothing before it. */
static void expect_clean_200(int fd, const char *path, const char *extra, const char *what)
{
    struct bytes_in in;
    exchange(fd, path, extra, &in);
    cr_expect(strncmp(in.buf, "HTTP/1.1 200 ", 13) == 0, "%s: the next answer:\n%s", what, in.buf);
}

Test(bodiless, a_304_from_an_http_upstream_keeps_its_own_length_and_nothing_follows)
{
    struct rawup *s = rawup_start(NULL, 20);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r", "\"upstreams\": [\"http://127.0.0.1:%u\"], \"retry\": {\"retry_on\": []}",
               s->port);
    fx_start_b(b, "--workers", "1", NULL);
    static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    const struct {
        const char *resp, *length, *what;
    } cases[] = {
        { "HTTP/1.1 304 Not Modified\r\nETag: \"a\"\r\nContent-Length: 20\r\n\r\n", "20",
          "http, length 20" },
        { "HTTP/1.1 304 Not Modified\r\nETag: \"a\"\r\nContent-Length: 5\r\n\r\nhello", "5",
          "http, a body after it" },
        { "HTTP/1.1 304 Not Modified\r\nETag: \"a\"\r\n\r\n", NULL, "http, no length" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int fd = raw_dial(px->port);
        s->resp = cases[i].resp;
        s->resp_len = strlen(cases[i].resp);
        struct bytes_in in;
        exchange(fd, "/c", "", &in);
        expect_304(&in, cases[i].length, cases[i].what);
        if (cases[i].length) {
            s->resp = ok;
            s->resp_len = strlen(ok);
            expect_clean_200(fd, "/next", "", cases[i].what);
        }
        close(fd);
    }
    px_stop_clean(px);
    px = NULL;
    rawup_stop(s);
}

Test(bodiless, a_304_from_an_h2c_upstream_keeps_its_own_length_and_nothing_follows)
{
    struct h2u *h2 = h2u_start();
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r", "\"upstreams\": [\"%s\"], \"retry\": {\"retry_on\": []}", h2u_url(h2, ""));
    fx_start_b(b, "--workers", "1", NULL);
    const struct {
        const char *extra, *length, *what;
    } cases[] = {
        { "x-h2-scenario: head-only\r\nx-h2-length: 20\r\n", "20", "h2c, length 20" },
        /* DATA after a 304: the stream is reset (RFC 9113 8.1.1), the head stands alone */
        { "x-h2-scenario: status\r\nx-h2-status: 304\r\n", "3", "h2c, a body after it" },
        { "x-h2-scenario: head-only\r\n", NULL, "h2c, no length" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int fd = raw_dial(px->port);
        struct bytes_in in;
        exchange(fd, "/c", cases[i].extra, &in);
        expect_304(&in, cases[i].length, cases[i].what);
        if (cases[i].length)
            expect_clean_200(fd, "/next", "", cases[i].what);
        close(fd);
    }
}

/* The same holds for the answer to HEAD: a chunked GET's HEAD has no length to give, and gets no
 * last chunk ("0\r\n\r\n") after its head. */
Test(bodiless, a_head_answer_without_a_length_has_nothing_after_its_head)
{
    struct rawup *s = rawup_start("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 20);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r", "\"upstreams\": [\"http://127.0.0.1:%u\"], \"retry\": {\"retry_on\": []}",
               s->port);
    fx_start_b(b, "--workers", "1", NULL);
    int fd = raw_dial(px->port);
    cr_assert(raw_send_all(fd, "HEAD /h HTTP/1.1\r\nHost: a\r\n\r\n", 29));
    struct bytes_in in = { .len = 0 };
    for (;;) {
        ssize_t k = raw_recv(fd, in.buf + in.len, sizeof(in.buf) - 1 - in.len, 3000);
        if (k <= 0) {
            in.closed = k != -2;
            break;
        }
        in.len += (size_t)k;
    }
    in.buf[in.len] = '\0';
    close(fd);
    cr_expect(strncmp(in.buf, "HTTP/1.1 200 ", 13) == 0, "got:\n%s", in.buf);
    const char *end = strstr(in.buf, "\r\n\r\n");
    cr_assert_not_null(end, "no head:\n%s", in.buf);
    cr_expect_eq((size_t)(end + 4 - in.buf), in.len, "bytes after the head:\n%s", in.buf);
    cr_expect_null(field(&in, "Content-Length"), "got:\n%s", in.buf);
    cr_expect(in.closed, "no length, yet the connection stayed open");
    px_stop_clean(px);
    px = NULL;
    rawup_stop(s);
}

/* To an HTTP/2 client too, a 304 carries the upstream's content-length, and none when it sent
 * none (RFC 9110 8.6): from an h2c upstream and an http:// one. */
Test(bodiless, a_304_to_an_http2_client_keeps_its_own_length)
{
    struct h2u *h2 = h2u_start();
    struct rawup *s = rawup_start(NULL, 20);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "h",
               "\"match\": {\"path_prefix\": \"/h\"}, \"upstreams\": [\"%s\"], "
               "\"retry\": {\"retry_on\": []}",
               h2u_url(h2, ""));
    cfgb_route(b, "r", "\"upstreams\": [\"http://127.0.0.1:%u\"], \"retry\": {\"retry_on\": []}",
               s->port);
    static const char r304[] =
        "HTTP/1.1 304 Not Modified\r\nETag: \"a\"\r\nContent-Length: 20\r\n\r\n";
    s->resp = r304;
    s->resp_len = strlen(r304);
    fx_start_b(b, "--workers", "1", NULL);
    const char *with[] = { "x-h2-scenario: head-only", "x-h2-length: 20", NULL };
    const char *without[] = { "x-h2-scenario: head-only", NULL };
    struct http_resp r;
    http_do_h2("GET", fx_url("/h/a"), with, NULL, 0, 10000, &r);
    cr_expect_eq(r.status, 304, "h2c, length 20: %ld", r.status);
    cr_expect_str_eq(http_hdr(&r, "content-length") ? http_hdr(&r, "content-length") : "(none)",
                     "20", "h2c, length 20");
    http_free(&r);
    http_do_h2("GET", fx_url("/h/b"), without, NULL, 0, 10000, &r);
    cr_expect_eq(r.status, 304, "h2c, no length: %ld", r.status);
    cr_expect_null(http_hdr(&r, "content-length"), "h2c, no length: %s",
                   http_hdr(&r, "content-length"));
    http_free(&r);
    http_do_h2("GET", fx_url("/r"), NULL, NULL, 0, 10000, &r);
    cr_expect_eq(r.status, 304, "http://, length 20: %ld", r.status);
    cr_expect_str_eq(http_hdr(&r, "content-length") ? http_hdr(&r, "content-length") : "(none)",
                     "20", "http://, length 20");
    http_free(&r);
    rawup_stop(s);
}
