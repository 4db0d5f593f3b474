/* h2int -- what the two halves of the HTTP/2 front end share (proxy/http2/h2front.h): the
 * connection's state and its session (proxy/http2/h2front.c), and the streams'
 * (proxy/http2/h2stream.c: each stream a request of the core, its head and body in, its answer
 * out). Internal to them.
 */
#ifndef RETRYPROXY_PROXY_H2INT_H
#define RETRYPROXY_PROXY_H2INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nghttp2/nghttp2.h>

#include "proxy/core/front.h"
#include "proxy/http2/h2front.h"
#include "proxy/http2/h2guard.h"
#include "proxy/http/answer.h"
#include "proxy/http/hlist.h"
#include "proxy/base/ring.h"
#include "proxy/upstream/share.h"
#include "proxy/http/refusal.h"

/* What one connection may hold (docs/hardening.md, "HTTP/2"). */
#define H2_MAX_STREAMS   100           /* SETTINGS_MAX_CONCURRENT_STREAMS */
#define H2_STREAM_WINDOW 65535         /* a stream's upload window (SETTINGS_INITIAL_...) */
#define H2_CONN_WINDOW   (1024 * 1024) /* the connection's upload window */
#define H2_STREAM_BUFFER (64 * 1024)   /* a stream's response bytes waiting (as relay.c) */
/* ... and all the connection's streams' together: an empty stream always takes a write, so
 * that a stream read promptly goes on however many are not read; each is sure of
 * H2_STREAM_SURE (one write of libcurl's, whose receive buffer is as large:
 * CURLM_RECV_BUFFER in proxy/upstream/curlm.h), and what streams hold beyond that comes
 * from H2_SHARED. A stream with no room for another write pauses its upstream at once, so an
 * unread stream holds one write here and none in libcurl (docs/http2.md). */
#define H2_STREAM_SURE   (8 * 1024)
#define H2_SHARED        (128 * 1024)
#define H2_CONN_BUFFER   (H2_MAX_STREAMS * H2_STREAM_SURE + H2_SHARED)
#define H2_OUT_CAP       (32 * 1024) /* frames serialised, waiting for the socket */
#define H2_READ          (16 * 1024) /* one recv() */
#define H2_READS_PER_IO  4           /* recv()s per readable event: fairness */
#define H2_CONTINUATIONS 8           /* CONTINUATION frames after one HEADERS */
/* Stream resets, the client's (nghttp2 counts those) and ours (counted here: a client that
 * has us reset streams costs as much, CVE-2023-44487 and its "made you reset" variant): a
 * token bucket of this many, refilled at this many a second. Empty: GOAWAY
 * ENHANCE_YOUR_CALM. */
#define H2_RESET_BURST 200
#define H2_RESET_RATE  33
/* The most the upstream side delivers in one write (libcurl's CURL_MAX_WRITE_SIZE, when it
 * hands over what it kept of a paused write; an h2c upstream's DATA frame): once a stream's
 * buffer has this much room, a paused upstream may go on. */
#define UPSTREAM_WRITE_MAX (16 * 1024)
/* After a GOAWAY that ends a session (an error, a flood), the connection's write side is shut
 * and what the client still sends is read and dropped for this long, so that the GOAWAY is
 * not lost to a reset (closing with unread bytes resets the connection). */
#define H2_LINGER_MS 1000
/* A stream whose answer is whole while its client's upload is not is reset NO_ERROR this long
 * after our END_STREAM went (RFC 9113 8.1), unless more DATA comes first (reset at once). Not
 * at once: curl 7.88 takes a reset read together with the answer for a failure. */
#define H2_TAIL_MS 50
/* The status the core gives a request whose client went away (nginx's 499). */
#define CLIENT_CLOSED 499

/* Stream flags (struct h2stream 'flags'). */
enum {
    S_REMOTE_END = 1u << 0, /* the client's END_STREAM came */
    S_ENDED = 1u << 1,      /* ... and went to the core (retry_req_end) */
    S_NO_BODY = 1u << 2,    /* the answer went without a body (HEAD, 204, 304) */
    S_DEFERRED = 1u << 3,   /* the data provider waits for bytes (nghttp2_session_resume_data) */
    S_DOWN_DONE = 1u << 4,  /* the response body is complete */
    S_DOWN_FAIL = 1u << 5,  /* ... or broke off: the stream is reset */
    S_FULL = 1u << 6,       /* its upstream is paused (body() said FRONT_FULL, or paused it
                             * at once): retry_req_room() when there is room */
    S_ROOM = 1u << 7,       /* the core takes upload bytes again */
    S_DISCARD = 1u << 8,    /* answered, the rest of the upload is refused */
    S_RESET = 1u << 9,      /* we reset the stream */
    S_LOCAL_END = 1u << 10, /* our END_STREAM went */
    S_WATCHED = 1u << 11,   /* the core waits out a backoff: a reset is the client going */
    S_WHOLE = 1u << 12,     /* the answer's body is 'body', whole (saved, or an error) */
    S_NO_BLAME = 1u << 13,  /* our reset is not the client's doing (an upstream broke off, a
                             * deadline): not counted toward its reset budget */
};

struct h2conn;

/* A stream's front end, in its request's allocation (proxy/core/front.h). */
struct h2stream {
    struct front f;
    struct h2conn *c; /* NULL once the stream closed or its connection went */
    struct h2stream *prev, *next;
    int32_t id;
    unsigned flags;
    struct hlist fields; /* the request's, "host" from :authority first */
    struct ring down;    /* response body bytes for the client */
    size_t owed;         /* of the connection's shared room, what is set aside for its next
                          * write (h2_body()) */
    const char *body;    /* or a whole body: saved (the core's) or an error (owned) */
    size_t body_len, body_off;
    char *owned;
    struct hlist trailers;
    const struct hlist *head; /* the answer's upstream head (the core's), which the trailers'
                               * filter reads; NULL: none */
    struct answer_tag tag;    /* ... and its tag (pointers into the request) */
    uint64_t local_end_ms;    /* loop ms when our END_STREAM went */
    char *up; /* upload bytes the core has not taken yet (within the stream's window) */
    size_t up_off, up_len, up_cap;
};

/* The request head being received: HEADERS and its CONTINUATIONs come without anything in
 * between on a connection, so one at a time. */
struct h2head {
    int32_t id;
    struct hlist fields;
    char method[REQ_METHOD_MAX + 1];
    char *path;
    char *cookie; /* the cookie fields joined with "; " (RFC 9113 8.2.3), forwarded as one */
    size_t cookie_len;
    size_t bytes;   /* counted as SETTINGS_MAX_HEADER_LIST_SIZE counts them */
    unsigned n;     /* fields */
    bool authority; /* :authority came: it is the Host */
    bool length;    /* a content-length came */
    bool grpc;      /* a gRPC content-type came, seen even past the bounds: a refused call's
                     * error is a gRPC status too */
    enum refusal refused;
};

struct h2conn {
    struct h2conn *prev, *next;
    struct h2front *hf;
    nghttp2_session *sess;
    int fd;
    bool closing;
    bool goaway;   /* a graceful GOAWAY is submitted (draining) */
    bool fatal;    /* the session ended: close after writing what is left */
    bool linger;   /* ... written, the write side shut: reading the rest away */
    bool room;     /* a stream may have S_ROOM: progress() looks, else walks no stream */
    unsigned full; /* streams whose body() said FRONT_FULL */
    struct h2stream *streams;
    unsigned n_streams;
    size_t buffered; /* response bytes in the streams' buffers */
    size_t shared;   /* ... of them, those past each stream's H2_STREAM_SURE, and the room set
                      * aside for streams' next writes (h2stream 'owed') */
    struct h2head head;
    struct h2front_limits lim;
    uint64_t last_io;          /* loop ms of the last byte in or out */
    uint64_t resets, reset_ms; /* the reset bucket's tokens, and when it was last filled */
    struct h2guard guard;      /* what the client sends that the session does not bound */
    struct share *share; /* its streams' share of the upstream slots (proxy/upstream/share.h) */
    struct loop_watch watch;
    struct loop_timer flush_t, idle_t;
    struct loop_timer tail_t; /* resets streams answered whole whose upload goes on */
    char *out;                /* H2_OUT_CAP bytes */
    size_t out_len;
    const uint8_t *pend; /* a frame from nghttp2 that did not fit in 'out' */
    size_t pend_len;
    char peer[48];
    unsigned peer_port;
};

struct h2front {
    struct worker *w;
    struct loop *loop;
    void (*closed)(void *arg);
    void *arg;
    nghttp2_session_callbacks *cbs;
    nghttp2_option *opt;
    struct pool *pool; /* the sessions' memory (proxy/base/pool.h) */
    nghttp2_mem mem;
    struct h2conn *conns;
    unsigned n;
    bool draining;
};

/* ---- proxy/http2/h2front.c: the connection ---- */

/* Has the connection's work (writing, offering kept uploads, a drain's GOAWAY) done at the end
 * of this loop turn, outside of nghttp2's callbacks and of the core's calls. */
void h2c_schedule(struct h2conn *c);
/* Our END_STREAM went on 'st' before the client's: it is reset NO_ERROR H2_TAIL_MS later if
 * its client has not ended its upload by then. */
void h2c_tail(struct h2conn *c, struct h2stream *st);
/* Resets the stream (RST_STREAM 'code'), once. */
void h2c_reset_stream(struct h2stream *st, uint32_t code);

/* ---- proxy/http2/h2stream.c: the streams ---- */

/* The stream side of the session's callbacks (nghttp2_session_callbacks). */
int h2s_on_begin_headers(nghttp2_session *sess, const nghttp2_frame *frame, void *user);
int h2s_on_header(nghttp2_session *sess, const nghttp2_frame *frame, const uint8_t *name, size_t nl,
                  const uint8_t *value, size_t vl, uint8_t flags, void *user);
int h2s_on_data(nghttp2_session *sess, uint8_t flags, int32_t id, const uint8_t *data, size_t len,
                void *user);
int h2s_on_frame_recv(nghttp2_session *sess, const nghttp2_frame *frame, void *user);
/* Offers the upload bytes a stream kept to the core again (S_ROOM); drops them once the answer
 * is whole. */
void h2s_drain_upload(struct h2stream *st);
/* Our END_STREAM went. */
void h2s_local_end(struct h2stream *st);
/* The stream is over for its connection: what it holds is given back (its buffered response
 * bytes, and its kept upload bytes to the connection's window). */
void h2s_gone(struct h2stream *st);

#endif
