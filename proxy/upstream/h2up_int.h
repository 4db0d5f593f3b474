/* h2up_int -- what the two halves of proxy/upstream/h2up.h share: proxy/upstream/h2up.c (streams,
 * the session's callbacks, the API) and proxy/upstream/h2up_conn.c (connections: their sessions
 * over proxy/upstream/connect.h, timers). Private to them. */
#ifndef RETRYPROXY_PROXY_H2UP_INT_H
#define RETRYPROXY_PROXY_H2UP_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <nghttp2/nghttp2.h>

#include "proxy/upstream/connect.h"
#include "proxy/upstream/h2up.h"

struct origin;

/* A growable byte buffer. */
struct bytes {
    uint8_t *p;
    size_t len, cap;
};

/* Appends n bytes at p. 0, or -1 out of memory. */
static inline int bytes_append(struct bytes *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        /* from 512 bytes (a gRPC message is often a few): a block malloc keeps per thread */
        size_t cap = b->cap ? b->cap : 512;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q)
            return -1;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

/* Drops the first n bytes. */
static inline void bytes_drop(struct bytes *b, size_t n)
{
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

struct conn {
    struct conn *prev, *next;
    struct h2up *h;
    char *key;
    struct connector k;      /* the socket and TLS (proxy/upstream/connect.h) */
    struct loop_timer timer; /* the idle timeout */
    struct loop_timer kick;  /* work submitted from outside an event of this connection */
    nghttp2_session *s;
    struct h2up_stream *streams; /* every stream not yet freed */
    size_t nstreams;
    /* streams h2c_settle() has to look at (h2up_pending()), first in first out: it never walks
     * them all, so a turn costs the same however many wait on the upstream */
    struct h2up_stream *pending, *pending_last;
    struct bytes out; /* serialized frames the socket did not take yet */
    bool h1_too;      /* http/1.1 is offered too: a server that chooses it is H2UP_FALLBACK */
    bool open;        /* connected, and carries HTTP/2 (TLS done, h2 chosen) */
    bool fell_back;   /* the server chose http/1.1 */
    bool goaway, dead;
    bool leaving; /* its endpoint left the record: a GOAWAY of ours once its streams ended */
};

/* Origins remembered as choosing http/1.1 by ALPN, per worker. */
#define H2UP_H1_MEMO_MAX 32
#define H2UP_H1_MEMO_MS  (5 * 60 * 1000)

struct h2up {
    struct loop *loop;
    struct connect_side *side; /* where its connections are made (the loop's, the TLS contexts) */
    struct pool *pool;         /* the sessions' memory (proxy/base/pool.h) */
    nghttp2_mem mem;
    struct conn *conns;
    size_t nconns;
    struct metrics_h2up *counts; /* NULL: none kept */
    struct {
        char *key; /* an origin's key; NULL: a free slot */
        uint64_t until;
    } h1[H2UP_H1_MEMO_MAX];
};

/* Stream flags, one bit each. */
enum {
    SF_SENT = 1u << 0,        /* its HEADERS went out */
    SF_HEAD = 1u << 1,        /* the final head was reported: later fields are trailers */
    SF_PAUSED = 1u << 2,      /* the owner returned H2UP_PAUSE for body bytes */
    SF_DEFERRED = 1u << 3,    /* the upload waits for the owner */
    SF_ENDED = 1u << 4,       /* its end is decided (reported or to report) */
    SF_CLOSED = 1u << 5,      /* the session is done with it */
    SF_DATA_BUFFER = 1u << 6, /* the body comes from 'buf' */
    SF_DATA_STREAM = 1u << 7, /* the body comes from ops->upload */
};

struct h2up_stream {
    struct h2up_stream *prev, *next;  /* in c->streams */
    struct h2up_stream *pending_next; /* in c->pending, when 'pending' */
    bool pending;
    struct conn *c;
    int32_t id;
    unsigned flags;
    const struct h2up_ops *ops; /* NULL once cancelled or reported */
    void *arg;
    struct hlist *head, *trailers;
    int status;
    enum h2up_end end;
    uint32_t error;
    const char *buf; /* SF_DATA_BUFFER */
    size_t len, off;
    const struct hlist *req_trailers; /* the owner's: sent after the body */
    struct bytes kept; /* body bytes a paused owner has not taken (within the stream's window) */
};

/* ---- proxy/upstream/h2up.c ---- */

/* Decides how 's' ended (once). */
void h2up_end_stream(struct h2up_stream *s, enum h2up_end end, uint32_t error);
/* 's' has something for h2c_settle(): an end to report, kept bytes to offer, or it is closed
 * and ownerless, to free. */
void h2up_pending(struct h2up_stream *s);
/* The session is done with 's' (or never had it): SF_CLOSED, and h2c_settle() looks at it. */
void h2up_closed(struct h2up_stream *s);
/* Kept body bytes to an owner that has room again. */
void h2up_drain_kept(struct h2up_stream *s);
void h2up_free_stream(struct h2up_stream *s);
/* The session callbacks, made anew (the session copies them). */
nghttp2_session_callbacks *h2up_callbacks(void);

/* ---- proxy/upstream/h2up_conn.c ---- */

/* A connection to 'o' with room for a stream, or a new one; NULL if none can be had. */
struct conn *h2c_pick(struct h2up *h, const struct origin *o, uint64_t timeout_ms);
/* Work was submitted from outside an event of 'c': done in the loop's next turn. */
void h2c_kick(struct conn *c);
/* The connection is gone: its streams end (reported by h2c_settle), its socket closes. */
void h2c_fail(struct conn *c);
/* Fails 'c' and frees it with its streams. */
void h2c_free(struct conn *c);
/* Ended streams are reported to their owners, finished ones freed, and frames sent. */
void h2c_settle(struct conn *c);

#endif
