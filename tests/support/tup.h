/* tup -- the test upstream: an in-process HTTP/1.1 server for integration tests.
 *
 * Integration tests run the real proxy against a tup on 127.0.0.1 and then assert what the
 * upstream received: how many attempts, which headers, the body's hash, when each arrived.
 * One server thread runs an epoll loop over non-blocking sockets (thousands of connections,
 * constant memory per connection, 100 MiB+ responses generated on the fly).
 *
 * Behaviour per request comes from its X-Test-Plan header (or the default plan):
 * directives separated by ';', each key=value, whitespace around tokens ignored.
 *
 *   fail=N         the first N attempts of this request key fail, later ones succeed. The key
 *                  is the X-Request-Id value ("" when absent: such requests share one counter).
 *                  Every complete request with the key counts, whatever its plan said.
 *   action=A       how a failing attempt fails (default status):
 *                    status     answer with status= (default 503)
 *                    hang       read the request, never answer; the connection stays open
 *                               until the peer closes it or tup_stop
 *                    reset      read the request, then RST without sending a byte
 *                    close      read the request, then FIN without sending a byte
 *                    reset-mid  answer 200 with Content-Length of the full body= (default
 *                               65536), send half of it, wait until the peer acked it, RST
 *                    stall-mid  the same, but send nothing more: hang until the peer closes
 *   status=NNN     status of a failing answer (200..599, default 503)
 *   retry-after=V  add "Retry-After: V" to failing status answers (V raw up to the next ';')
 *   header=N:V     add "N: V" to failing status answers (V raw up to the next ';')
 *   ok=NNN         status of a succeeding answer (200..599, default 200)
 *   body=N         succeeding body: N bytes of tup_pattern_byte(i) (default "ok\n")
 *   chunked=1      send the succeeding body chunked (HTTP/1.1 requests only)
 *   echo=1         succeeding body is the request body; 413 if it was over TUP_ECHO_MAX
 *   delay=MS       once the request is complete, wait MS ms (an epoll timer) before acting:
 *                  answers, reset, close, reset-mid, stale (not hang)
 *   close-after=1  add "Connection: close" to the answer and close after it
 *   stale=1        a request that is not the first on its connection is read, recorded and
 *                  answered by FIN only (a kept-alive connection that went stale)
 *
 * A bad plan (unknown key, bad value) is answered 400 with a text body naming the problem;
 * the request is still recorded and counted. Every answer carries X-Tup-Attempt (the key's
 * attempt number), X-Tup-Conn (connection id) and X-Tup-Seq (record index), and
 * Content-Length or chunked framing (none for 204 and 304, no body for HEAD).
 *
 * Requests that cannot be parsed (malformed head: 400, head over TUP_HEAD_MAX: 431) are
 * answered, the connection is closed, and nothing is recorded.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_TUP_H
#define RETRYPROXY_TESTS_SUPPORT_TUP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* FNV-1a 64-bit: start value for tup_hash_update. */
#define TUP_HASH_INIT UINT64_C(0xcbf29ce484222325)
/* Request line plus headers, including the blank line, are at most this many bytes. */
#define TUP_HEAD_MAX 65536
/* A record keeps at most this many leading body bytes. */
#define TUP_BODY_KEEP 65536
/* echo=1 buffers request bodies up to this size. */
#define TUP_ECHO_MAX (8u * 1024 * 1024)

struct tup;

struct tup_header {
    char *name;
    char *value; /* leading and trailing whitespace removed */
};

/* One complete request (head and body read). Immutable once visible; valid until tup_stop. */
struct tup_req {
    uint64_t seq;        /* index: tup_get(t, r->seq) == r */
    uint64_t conn_id;    /* 1 for the first accepted connection, and so on */
    unsigned conn_index; /* 1 = first request on its connection */
    char method[40];
    char *target;
    size_t n_headers;
    struct tup_header *headers; /* in received order, duplicates kept */
    uint64_t body_len;          /* decoded length (chunked framing removed) */
    uint64_t body_hash;         /* tup_hash of the whole decoded body */
    unsigned char *body;        /* first body_kept bytes; NULL when body_kept is 0 */
    size_t body_kept;           /* min(body_len, TUP_BODY_KEEP) */
    int64_t arrival_ns;         /* CLOCK_MONOTONIC of the read that completed the head */
    char *request_id;           /* X-Request-Id value, "" if none */
    unsigned key_attempt;       /* this key's attempt number, 1-based */
    size_t n_trailers;
    struct tup_header *trailers; /* a chunked body's trailer fields, in received order */
    char local[48]; /* the address it was sent to: on a tup bound to 0.0.0.0, which 127.x */
};

/* Start on 127.0.0.1 with an ephemeral port. Aborts with a message on any setup failure. */
struct tup *tup_start(void);
/* The same on a given port (0 = ephemeral). */
struct tup *tup_start_port(uint16_t port);
/* The same with a default plan and a log (either may be NULL) in force before the first
 * connection is accepted; returns NULL and fills err on failure instead of aborting. */
struct tup *tup_try_start(uint16_t port, const char *default_plan, FILE *log, char *err,
                          size_t errlen);
/* The same on IPv4 address 'ip' (NULL: 127.0.0.1): 127.0.0.2, .3... stand for the pods of one
 * service, on one port (docs/endpoints.md). "0.0.0.0" answers on every loopback address at once
 * (127.0.0.0/8 is all loopback on Linux): hundreds of pods in one upstream, each request's
 * 'local' saying which it was sent to. */
struct tup *tup_try_start_at(const char *ip, uint16_t port, const char *default_plan, FILE *log,
                             char *err, size_t errlen);
uint16_t tup_port(const struct tup *t);
/* Stop the server thread, close every connection, free every record. NULL is a no-op. */
void tup_stop(struct tup *t);

/* Plan for requests without X-Test-Plan (initially "", all defaults). Copied. */
void tup_set_default_plan(struct tup *t, const char *plan);
/* 0 if plan parses; otherwise -1 and the problem in err. */
int tup_plan_check(const char *plan, char *err, size_t errlen);
/* Log one line per request (and per unparsable request) to f; NULL turns logging off. */
void tup_set_log(struct tup *t, FILE *f);

size_t tup_count(struct tup *t);
/* Record i (0-based, arrival order), NULL if i >= tup_count. */
const struct tup_req *tup_get(struct tup *t, size_t i);
/* 0 once at least n records exist, -1 after timeout_ms (< 0: wait forever). */
int tup_wait_count(struct tup *t, size_t n, int timeout_ms);
/* Records whose request_id equals request_id ("" counts requests without one). */
size_t tup_count_id(struct tup *t, const char *request_id);
/* First header named name (case-insensitive), NULL if absent. */
const char *tup_req_header(const struct tup_req *r, const char *name);
size_t tup_req_header_count(const struct tup_req *r, const char *name);
/* First trailer field named name (case-insensitive), NULL if absent. */
const char *tup_req_trailer(const struct tup_req *r, const char *name);

/* Bytes read from every connection so far, whether they parsed or not. */
uint64_t tup_bytes_in(struct tup *t);
/* TCP connections accepted so far. */
uint64_t tup_connections(struct tup *t);
/* TCP connections accepted and not yet closed by tup. */
size_t tup_open_connections(struct tup *t);
/* 0 once at most n connections are open, -1 after timeout_ms (< 0: wait forever). */
int tup_wait_open_at_most(struct tup *t, size_t n, int timeout_ms);

/* FNV-1a 64-bit. tup_hash(p, n) == tup_hash_update(TUP_HASH_INIT, p, n). */
uint64_t tup_hash(const void *data, size_t n);
uint64_t tup_hash_update(uint64_t h, const void *data, size_t n);

/* Byte i of the body pattern: printable, a '\n' every 64 bytes, no short period, so a
 * shifted, lost or repeated block changes the hash. */
unsigned char tup_pattern_byte(uint64_t i);
/* dst[k] = tup_pattern_byte(offset + k) for k < n. */
void tup_pattern_fill(unsigned char *dst, uint64_t offset, size_t n);
/* tup_hash of the first n pattern bytes. */
uint64_t tup_pattern_hash(uint64_t n);

#endif
