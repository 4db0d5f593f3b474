/* wire -- the request framing check: every byte a client sends, before libmicrohttpd parses it.
 *
 * libmicrohttpd 0.9.75 is lenient where a proxy must not be (docs/hardening.md): it appends a
 * folded header line to the field *name*, decodes "Transfer-Encoding: chunked" followed by a
 * second Transfer-Encoding line as chunked, cuts values at a NUL, and answers some malformed
 * heads itself with a response whose header block is written twice. So the bytes of each
 * client connection pass through this checker first (proxy/http1/recv_hook.c routes libmicrohttpd's
 * recv() calls here). It parses the HTTP/1.1 message framing (RFC 9112) as a strict recipient:
 *
 *   - a head that is well formed and unambiguous goes to libmicrohttpd untouched, in place;
 *   - a head that is not is never handed over: in its place libmicrohttpd receives a short
 *     stand-in request, which the access handler recognises (wire_take_reject) and answers with
 *     retryproxy's JSON error and Connection: close; nothing after it is read;
 *   - a body whose chunked framing breaks mid-way closes the connection (ECONNRESET), since
 *     part of it is already on its way: the upstream never gets a complete request;
 *   - a head still incomplete after the header deadline is answered 408.
 *
 * Heads that arrive whole in one read cost one pass over their bytes and no copy. A head split
 * across reads is held here (at most head_max bytes) until it is complete.
 *
 * Pure: no libmicrohttpd, no libcurl; the socket read and the clock are passed in.
 */
#ifndef RETRYPROXY_PROXY_WIRE_H
#define RETRYPROXY_PROXY_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proxy/http/refusal.h"

/* A head (request line, fields, blank line) above the connection's head_max bytes
 * (limits.max_header_bytes, WIRE_HEAD_DEFAULT unless configured) is a 431; a request line above
 * REQ_LINE_MAX (or head_max if lower) a 414. The server sizes libmicrohttpd's per-connection
 * pool from head_max so that libmicrohttpd never has to refuse a head itself. */
#define WIRE_HEAD_DEFAULT (8 * 1024)

/* Reads up to 'len' bytes of the connection into 'buf' (recv semantics: >0 bytes, 0 end of
 * stream, -1 with errno). */
typedef ssize_t (*wire_read_fn)(void *ctx, void *buf, size_t len);

/* The framing state of one client connection. Zero-initialise, then wire_init(). */
struct wire {
    /* parser */
    uint8_t st;      /* enum in wire.c */
    uint8_t field;   /* which framing field the current line is */
    uint8_t flags;   /* head facts (wire.c) */
    uint8_t version; /* 10 or 11 */
    uint16_t fields; /* field lines in this head */
    uint16_t tok;    /* length of the current token (method, name, hex digits) */
    uint32_t line;   /* bytes of the current line */
    uint32_t head;   /* bytes of the current head */
    uint16_t n_cl, n_host, n_te_fields;
    uint16_t te_codings, te_chunked; /* coding tokens seen; how many were "chunked" */
    bool te_last_chunked;
    uint8_t vlen;  /* bytes kept of the current framing field's value */
    uint8_t blank; /* empty lines before this request line */
    char val[48];  /* the current framing field's value (trimmed at line end) */
    char name[20]; /* the current field name, lowercased, while it may be a framing one */
    uint64_t cl;   /* body bytes declared */
    uint64_t left; /* body or chunk bytes still to pass */
    enum refusal reason;

    /* buffers of a connection whose head is split across reads, or refused */
    char *stash; /* the incomplete head so far */
    size_t stash_len;
    char *q; /* bytes checked and waiting for libmicrohttpd */
    size_t q_len, q_off;
    uint64_t head_start_ms; /* when the held head began */
    uint32_t head_timeout_ms;
    uint32_t head_max; /* bytes a head may have */

    /* the refusal handed to the access handler */
    bool expired;          /* the worker's sweep found the held head past its deadline */
    bool dead;             /* refused: nothing more is read */
    bool closing;          /* broken mid-body: every read fails */
    uint32_t heads_out;    /* heads handed to libmicrohttpd, the stand-in included */
    uint32_t heads_in;     /* heads the access handler has seen */
    uint32_t reject_head;  /* 1-based index of the stand-in head; 0: none */
    enum refusal rejected; /* why */
};

void wire_init(struct wire *w, uint32_t head_timeout_ms, uint32_t head_max);
/* Frees the buffers (the struct itself is the caller's). */
void wire_release(struct wire *w);

/* libmicrohttpd's read of this connection: fills 'buf' with checked bytes. Returns as recv()
 * does; -1 with errno EAGAIN when nothing may be handed over yet, ECONNRESET once the body
 * framing broke. 'now_ms' is a monotonic clock. */
ssize_t wire_recv(struct wire *w, void *buf, size_t len, wire_read_fn read, void *ctx,
                  uint64_t now_ms);

/* Whether nothing is held or refused: every byte the client sent was handed over (an upgrade
 * takes the connection over only then, docs/upgrades.md). */
bool wire_quiet(const struct wire *w);
/* Whether a held, incomplete head has passed its deadline (the worker's sweep asks). */
bool wire_head_expired(const struct wire *w, uint64_t now_ms);
/* Whether a head is being held (for the sweep's list). */
bool wire_holding(const struct wire *w);

/* Called once per request head that libmicrohttpd parsed on this connection, in order. Returns
 * the reason when that head is the stand-in for a refused one, else REFUSE_NONE. */
enum refusal wire_take_reject(struct wire *w);

/* The checker over a whole byte string, for tests and the fuzzer: feeds 'data' in pieces of
 * the given sizes (cycled; NULL: all at once) and collects what libmicrohttpd would receive
 * into 'out' (at most 'cap' bytes). Returns the bytes written; *closed is set when the
 * connection would be reset. */
size_t wire_run(const char *data, size_t n, const size_t *pieces, size_t n_pieces, char *out,
                size_t cap, bool *closed, struct wire *w);

/* The stand-in request handed over in place of a refused head. */
extern const char wire_standin[];
extern const size_t wire_standin_len;

#endif
