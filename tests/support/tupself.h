/* tupself -- the clients of the test upstream's self-tests
 * (tests/integration/test_upstream_tool*.c): libcurl where a normal client is wanted, a raw socket
 * where the bytes on the wire matter, both aimed at the suite's in-process upstream tupself
 * (tupself_start() starts it, the suites' .init; tupself_stop() its .fini).
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_TUPSELF_H
#define RETRYPROXY_TESTS_SUPPORT_TUPSELF_H

#include <curl/curl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tests/support/tup.h"

/* The upstream every request of these helpers goes to. */
extern struct tup *tupself;

void tupself_start(void);
void tupself_stop(void);

int64_t now_ns(void);
double ms_since(int64_t start);
/* This process's resident set (VmRSS) in KiB, -1 if unknown. */
long rss_kb(void);

/* ---- libcurl client ---- */

#define KEEP_MAX (16u * 1024 * 1024)

struct resp {
    CURLcode rc;
    long status;
    uint64_t body_len;
    uint64_t body_hash;
    unsigned char *body; /* first KEEP_MAX bytes */
    size_t body_cap;
    char attempt[32];
    char conn[32];
    char retry_after[256];
    char te[64];
    char connection[64];
    char content_length[32];
    double ms;
    bool no_keep; /* hash and count only */
    bool sample_rss;
    long rss_max_kb;
    uint64_t next_sample;
};

struct req {
    const char *method;
    const char *path;
    const char *plan;
    const char *id;
    const void *body;
    size_t body_len;
    bool chunked_upload;
    const char *extra[8];
    long timeout_ms;
};

struct upload {
    const unsigned char *p;
    size_t len;
    size_t off;
};

struct raw {
    int fd;
    char buf[1 << 17];
    size_t len;
};

struct raw_resp {
    int status;
    char head[8192];
    uint64_t body_len;
    uint64_t body_hash;
    char body[4096];
};

/* libcurl's write and header callbacks collecting into a struct resp (their ud). */
size_t on_body(char *p, size_t size, size_t n, void *ud);
size_t on_header(char *p, size_t size, size_t n, void *ud);
void resp_free(struct resp *r);
/* Sets up h for q, collecting into r; the returned list is freed by the caller. */
struct curl_slist *prepare(CURL *h, const struct req *q, struct resp *r, struct upload *u);
/* One request on h (kept connections are reused), or on a fresh handle if h is NULL. */
void perform_on(CURL *h, const struct req *q, struct resp *r);
void perform(const struct req *q, struct resp *r);
/* A GET with X-Test-Plan: plan and X-Request-Id: id (each left out when NULL). */
void get_plan(const char *plan, const char *id, struct resp *r);
/* n bytes of a xorshift sequence seeded by seed; the caller frees them. */
unsigned char *random_bytes(size_t n, unsigned seed);

/* ---- raw socket client ---- */

/* A connection to tupself (5 s send and receive timeouts). */
struct raw *raw_new(void);
void raw_free(struct raw *c);
void raw_send(struct raw *c, const void *p, size_t n);
void raw_sends(struct raw *c, const char *s);
/* Reads more into the buffer: bytes read, 0 on EOF, -1 on error (errno kept). */
ssize_t raw_fill(struct raw *c);
/* Drops the buffer's first n bytes. */
void raw_take(struct raw *c, size_t n);
/* The value of the response header name in out, NULL if r has none. */
const char *raw_header(const struct raw_resp *r, const char *name, char *out, size_t cap);
/* Reads one Content-Length-framed response (HEAD answers: head only). */
void raw_read(struct raw *c, struct raw_resp *r, bool head_only);
/* Bytes received until the peer closed (FIN or RST); asserts it does within the timeout. */
size_t raw_until_closed(struct raw *c);

#endif
