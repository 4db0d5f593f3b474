/* harness -- integration tests: run the real retryproxy binary and talk HTTP to it.
 *
 * px_start() writes a config to a temporary file, starts `retryproxy -c FILE --listen
 * 127.0.0.1:0` with its stdout and stderr going to temporary files (never a pipe a test might
 * forget to drain), and waits for the "listening on" line to learn the port. http_do() is a
 * blocking libcurl request with a hard timeout. Everything stays on 127.0.0.1.
 */
#ifndef RETRYPROXY_TESTS_HARNESS_H
#define RETRYPROXY_TESTS_HARNESS_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tests/support/proc.h"

struct px {
    pid_t pid;
    uint16_t port;       /* the proxy listener */
    uint16_t admin_port; /* the admin listener */
    char dir[64];        /* temporary directory holding config.json, stdout, stderr */
    char cfg_path[96];
    char out_path[96];
    char err_path[96];
};

/* Starts retryproxy on the config 'json' (complete JSON text; "listen" and "admin" are
 * overridden with free ports) with up to 8 extra arguments (NULL-terminated list, e.g.
 * "--workers", "1", NULL). Aborts the test with a message if it does not come up within 10 s.
 * Without "--workers" among them, $RETRYPROXY_TEST_WORKERS (if set) is passed as --workers. */
struct px *px_start(const char *json, ...);
/* px_start() with the extra arguments in 'ap'. */
struct px *px_startv(const char *json, va_list ap);

/* Starts retryproxy with exactly 'args' after the program name (NULL-terminated), for tests
 * that manage their own config file; otherwise as px_start(). The process's files still go
 * to p->dir. */
struct px *px_start_argv(const char *const *args);

/* "http://127.0.0.1:ADMIN_PORT" + path. */
const char *px_admin_url(const struct px *p, const char *path, char *buf, size_t cap);

/* Sends SIGTERM and waits up to 'timeout_ms'; returns the exit status (128 + signal when
 * killed by one), or -1 if it had to be killed. Frees 'p' and its files. A ThreadSanitizer
 * report from the process (its stderr, or TSAN_OPTIONS' log_path file) fails the test and
 * aborts (a failed assertion in a .fini is not counted by Criterion 2.4; a crash is). */
int px_stop(struct px *p, int timeout_ms);

/* px_stop() that expects exit status 0 and aborts otherwise, for a suite's .fini (where
 * Criterion 2.4 ignores failed assertions). */
void px_stop_clean(struct px *p);

/* "http://127.0.0.1:PORT" + path, in a static buffer per call site (copy it if needed). */
const char *px_url(const struct px *p, const char *path, char *buf, size_t cap);

/* The proxy process's thread count, open descriptors and resident memory, from /proc. */
int px_threads(const struct px *p);
int px_fds(const struct px *p);
long px_rss_kb(const struct px *p);
/* CPU time it has used so far (user + system, every thread), in milliseconds. */
long px_cpu_ms(const struct px *p);
/* Its stderr/stdout so far (malloc'd, NUL-terminated). */
char *px_stderr(const struct px *p);
char *px_stdout(const struct px *p);
/* Its stdout once it holds 'needle', waiting up to 'timeout_ms' (what it holds by then if
 * never): the proxy writes its start line to stderr before its "listening" event to stdout,
 * so a test reading stdout right after px_start*() may find it still empty. */
char *px_stdout_holding(const struct px *p, const char *needle, int timeout_ms);

struct http_resp {
    int rc; /* CURLcode */
    long status;
    char *headers; /* raw response header block */
    unsigned char *body;
    size_t body_len;
    uint64_t body_hash; /* tup_hash of the body */
    double seconds;
};

/* One request. 'headers' is a NULL-terminated list of "Name: value" (or NULL); 'body' may be
 * NULL. Bodies above 'keep' bytes are hashed, not kept. */
void http_do(const char *method, const char *url, const char *const *headers, const void *body,
             size_t body_len, long timeout_ms, struct http_resp *out);
/* The same over HTTP/2 with prior knowledge (h2c, the preface first: docs/http2.md). */
void http_do_h2(const char *method, const char *url, const char *const *headers, const void *body,
                size_t body_len, long timeout_ms, struct http_resp *out);
/* Value of response header 'name' (first), copied into 'buf', or NULL. */
const char *http_header(const struct http_resp *r, const char *name, char *buf, size_t cap);
/* The same in a static buffer (512 bytes), valid until the next call. */
const char *http_hdr(const struct http_resp *r, const char *name);
void http_free(struct http_resp *r);
/* A libcurl write callback that drops the body. */
size_t http_discard(char *p, size_t size, size_t n, void *ud);

/* A GET sent from its own thread, so that a test can act (signal, reload) while it waits. */
struct http_call {
    pthread_t th;
    bool started;
    char url[128];
    char idh[96], planh[96];
    const char *h[3];
    struct http_resp r;
    int64_t t_start, t_end; /* now_ms() around the request */
};

/* Starts a GET of 'url' with X-Request-Id: 'id' and X-Test-Plan: 'plan' (either may be NULL).
 * The response lands in c->r once http_call_join() returns; the caller frees it. */
void http_call_start(struct http_call *c, const char *url, const char *id, const char *plan);
/* Waits for the request if one was started. */
void http_call_join(struct http_call *c);

/* now_ms(), sleep_ms() and rm_tree() are in proc.h. */

#endif
