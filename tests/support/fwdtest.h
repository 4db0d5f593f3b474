/* fwdtest -- what the forwarding suites (tests/integration/test_forwarding*.c) share: a proxy
 * with one route to a tup, libcurl as the client where an ordinary client is wanted, and a raw
 * socket where the bytes on the wire matter (curl normalises dot segments, refuses ambiguous
 * framing and hides bytes that follow a bodiless response).
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_FWDTEST_H
#define RETRYPROXY_TESTS_SUPPORT_FWDTEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/support/fixture.h"

#define FWD_T 10000 /* ms: upper bound for any single request in the forwarding suites */

#define FWD_QUIET 300 /* ms: how long "nothing more arrives" is watched for */

/* One tup and a proxy with one route "r" to it. 'route_extra' and 'top_extra' are JSON members
 * added to the route and to the top level ("" for none). */
void fwd_start(const char *route_extra, const char *top_extra, const char *workers);

/* GET 'path' through the proxy with 'headers'; asserts the transfer itself worked. */
void fwd_get(const char *path, const char *const *headers, struct http_resp *r);

/* Number of response header lines named 'name' in a raw header block. */
size_t fwd_header_lines(const char *block, const char *name);

/* The record of the only request tup saw with X-Request-Id 'id' (asserts there is one). */
const struct tup_req *fwd_only_record(struct tup *t, const char *id);

/* 8-4-4-4-12 lowercase hex, version nibble 4, variant 8, 9, a or b. */
bool fwd_is_uuid_v4(const char *s);

/* ---- a raw client: the exact bytes on the wire ---- */

int fwd_raw_connect(void);

void fwd_raw_send(int fd, const char *s);

/* Milliseconds until the peer closes 'fd' (end of stream or reset; bytes before it are
 * skipped), or -1 if it is still open after 'timeout_ms'. */
int64_t fwd_ms_until_closed(int fd, int timeout_ms);

struct fwd_resp {
    int status;
    char head[16384]; /* status line and header lines, NUL-terminated */
    char body[65536]; /* de-chunked, NUL-terminated */
    size_t body_len;
    size_t extra; /* bytes that arrived after the end of this response */
};

/* Index of the first "\r\n" in p[from, n), or n if there is none. */
size_t fwd_crlf_at(const char *p, size_t from, size_t n);

/* The end of a complete chunked body at 'p' (bytes consumed), decoded into 'out', or 0 while
 * it is incomplete. */
size_t fwd_chunked_end(const char *p, size_t n, struct fwd_resp *out);

/* Reads one response from 'fd'. 'head_request': the request was HEAD (no body follows).
 * Asserts it arrives whole within 'timeout_ms'. */
void fwd_raw_response(int fd, bool head_request, int timeout_ms, struct fwd_resp *out);

/* Value of header 'name' in a raw head (first one), or NULL. */
const char *fwd_raw_header(const struct fwd_resp *r, const char *name, char *buf, size_t cap);

/* No byte arrives on 'fd' within FWD_QUIET ms (a bodiless response really had no body). */
void fwd_expect_quiet(int fd);

/* A JSON error of retryproxy's own: status, Content-Type, and each field exactly. 'route' NULL
 * means JSON null; 'attempts' < 0 skips that field. */
void fwd_expect_json_error(int status, const char *ctype, const char *body, size_t len,
                           int want_status, const char *error, const char *route, int attempts);

void fwd_expect_raw_json_error(const struct fwd_resp *r, int want_status, const char *error,
                               const char *route, int attempts);

/* Sends 'request' on a fresh connection and reads the answer (the connection is closed). */
void fwd_raw_exchange(const char *request, struct fwd_resp *out);

#endif
