/* log -- request and event logs on stdout (docs/logs.md).
 *
 * One line per request, JSON by default ("format": "text" for humans), at level info; attempt
 * detail at debug; reloads at info (success) or error (each error its own line). The level and
 * format are process-wide and change on reload (relaxed atomics).
 *
 * Workers do not write per request: each formats into its own buffer, flushed once per loop
 * turn (or when nearly full) with a single write(2) of whole lines under a mutex, so lines from
 * different threads never interleave and a busy worker makes one syscall per turn, not per
 * request. Event lines (reloads, start-up) are written at once.
 */
#ifndef RETRYPROXY_PROXY_LOG_H
#define RETRYPROXY_PROXY_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/cfg.h"

/* The level and format in force; log_configure() is safe from any thread at any time. */
void log_configure(enum cfg_log_level level, enum cfg_log_format format);
bool log_enabled(enum cfg_log_level level);

/* Lines lost to write errors (EAGAIN, EPIPE, a full disk ...) since start. */
uint64_t log_dropped_lines(void);

/* Where lines go: a file descriptor (default 1, stdout). For tests. */
void log_set_fd(int fd);

/* A worker's buffer (NULL where a log_buf is taken: the line is written at once). */
struct log_buf;
struct log_buf *log_buf_new(void);
void log_buf_free(struct log_buf *b); /* flushes first; accepts NULL */
/* Writes what is buffered (whole lines). Cheap when empty. */
void log_flush(struct log_buf *b);

/* One finished request (level info). Strings may be NULL (rendered as null / "-"); every
 * string is escaped as needed. */
struct log_request {
    int64_t unix_ms;   /* when it started (wall clock) */
    const char *route; /* NULL: no route matched */
    const char *method;
    const char *path; /* the request target as received, query included */
    int status;       /* sent to the client */
    unsigned attempts;
    const uint32_t *delays; /* the backoff waits taken, in order */
    size_t n_delays;
    double duration_ms;
    const char *upstream; /* the upstream of the last attempt (its URL) */
    const char *stop;     /* the X-Retry-Stop value, or NULL */
    const char *request_id;
    const char *protocol; /* the client's: "HTTP/1.1", "HTTP/2" (NULL: not written) */
    bool grpc;            /* a gRPC call: its status is written ... */
    int grpc_status;      /* ... this one, or null when -1 (it ended without one) */

    /* what an access log carries besides */
    const char *upstream_path; /* the target the last attempt sent: its base path, then 'path' */
    const char *client_addr;   /* the client's address as text */
    unsigned client_port;      /* 0: unknown */
    const char *user_agent;
    uint64_t bytes_from_client; /* request body bytes received */
    uint64_t bytes_to_client;   /* response body bytes sent */
};
void log_request(struct log_buf *b, const struct log_request *r);

/* One attempt (level debug). */
struct log_attempt {
    int64_t unix_ms;
    const char *route;
    const char *request_id;
    unsigned attempt; /* 1 for the first */
    const char *upstream;
    const char *outcome; /* "200", "503", "connect-failure", "reset", "timeout" */
    double duration_ms;
    const char *decision; /* "retry", "stop:max-attempts", "final" ... */
    uint32_t delay_ms;    /* the wait before the next attempt, when retrying */
};
void log_attempt(struct log_buf *b, const struct log_attempt *a);

/* An event line written at once (not buffered): {"time":..., "level":..., "msg": msg} plus
 * the given fields, a NULL-terminated list: a key and a string value (escaped; NULL is null),
 * or LOG_NUM(key, n), a number, for each field. Thread-safe. */
void log_event(enum cfg_log_level level, const char *msg, ...);
/* A number field of log_event(): a JSON number, never a string, so that a log pipeline types
 * it as one (docs/logs.md). 'n' is converted to int64_t, the integers JSON parsers keep. */
#define LOG_NUM(key, n) log_num_mark, (const char *)(key), (int64_t)(n)
/* Marks a LOG_NUM field in the list (compared by address). */
extern const char log_num_mark[];

#endif
