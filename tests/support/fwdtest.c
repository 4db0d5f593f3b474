/* The forwarding suites' shared proxy and raw client (fwdtest.h). */
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

/* One tup and a proxy with one route "r" to it. 'route_extra' and 'top_extra' are JSON members
 * added to the route and to the top level ("" for none). */
void fwd_start(const char *route_extra, const char *top_extra, const char *workers)
{
    fx_start_r(top_extra, route_extra, "--workers", workers, NULL);
}

/* GET 'path' through the proxy with 'headers'; asserts the transfer itself worked. */
void fwd_get(const char *path, const char *const *headers, struct http_resp *r)
{
    char url[512];
    http_do("GET", px_url(px, path, url, sizeof(url)), headers, NULL, 0, FWD_T, r);
    cr_assert_eq(r->rc, 0, "curl error %d on GET %s", r->rc, path);
}

/* Number of response header lines named 'name' in a raw header block. */
size_t fwd_header_lines(const char *block, const char *name)
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
const struct tup_req *fwd_only_record(struct tup *t, const char *id)
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
bool fwd_is_uuid_v4(const char *s)
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

int fwd_raw_connect(void)
{
    return raw_dial(px->port);
}

void fwd_raw_send(int fd, const char *s)
{
    cr_assert(raw_send_all(fd, s, strlen(s)), "send: %s", strerror(errno));
}

/* Milliseconds until the peer closes 'fd' (end of stream or reset; bytes before it are
 * skipped), or -1 if it is still open after 'timeout_ms'. */
int64_t fwd_ms_until_closed(int fd, int timeout_ms)
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

/* Index of the first "\r\n" in p[from, n), or n if there is none. */
size_t fwd_crlf_at(const char *p, size_t from, size_t n)
{
    for (size_t i = from; i + 1 < n; i++)
        if (p[i] == '\r' && p[i + 1] == '\n')
            return i;
    return n;
}

/* The end of a complete chunked body at 'p' (bytes consumed), decoded into 'out', or 0 while
 * it is incomplete. */
size_t fwd_chunked_end(const char *p, size_t n, struct fwd_resp *out)
{
    size_t at = 0;
    out->body_len = 0;
    for (;;) {
        size_t eol = fwd_crlf_at(p, at, n);
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
        size_t eol = fwd_crlf_at(p, at, n);
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
void fwd_raw_response(int fd, bool head_request, int timeout_ms, struct fwd_resp *out)
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
            for (size_t i = fwd_crlf_at(buf, 0, len); i < len; i = fwd_crlf_at(buf, i + 2, len))
                if (fwd_crlf_at(buf, i + 2, len) == i + 2) {
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
                size_t used =
                    len > head_end ? fwd_chunked_end(buf + head_end, len - head_end, out) : 0;
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
const char *fwd_raw_header(const struct fwd_resp *r, const char *name, char *buf, size_t cap)
{
    struct http_resp h = { .headers = (char *)r->head };
    return http_header(&h, name, buf, cap);
}

/* No byte arrives on 'fd' within FWD_QUIET ms (a bodiless response really had no body). */
void fwd_expect_quiet(int fd)
{
    char b[256];
    ssize_t n = raw_recv(fd, b, sizeof(b) - 1, FWD_QUIET);
    if (n > 0)
        b[n] = '\0';
    cr_expect_eq(n, -2, "unexpected bytes after the response: %zd: %.*s", n, n > 0 ? (int)n : 0, b);
}

/* A JSON error of retryproxy's own: status, Content-Type, and each field exactly. 'route' NULL
 * means JSON null; 'attempts' < 0 skips that field. */
void fwd_expect_json_error(int status, const char *ctype, const char *body, size_t len,
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

void fwd_expect_raw_json_error(const struct fwd_resp *r, int want_status, const char *error,
                               const char *route, int attempts)
{
    char ct[128];
    fwd_expect_json_error(r->status, fwd_raw_header(r, "Content-Type", ct, sizeof(ct)), r->body,
                          r->body_len, want_status, error, route, attempts);
}

/* Sends 'request' on a fresh connection and reads the answer (the connection is closed). */
void fwd_raw_exchange(const char *request, struct fwd_resp *out)
{
    int fd = fwd_raw_connect();
    fwd_raw_send(fd, request);
    fwd_raw_response(fd, false, FWD_T, out);
    close(fd);
}
