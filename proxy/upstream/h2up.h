/* h2up -- HTTP/2 to upstreams, over cleartext (h2c, prior knowledge) or over TLS for https
 * origins whose server chooses h2 by ALPN: a worker's pool of libnghttp2 client sessions,
 * driven by its event loop (docs/http2.md, "Upstreams over HTTP/2"). proxy/upstream/h2up.c holds
 * the streams, proxy/upstream/h2up_conn.c the connections.
 *
 * Streams to one origin share few connections: a new stream goes on an open connection with
 * room under the peer's SETTINGS_MAX_CONCURRENT_STREAMS and H2UP_MAX_STREAMS, else on a new
 * one (at most H2UP_MAX_CONNS per origin; past that the least loaded takes it and libnghttp2
 * queues it). A connection idle for H2UP_IDLE_MS closes; one that got a GOAWAY takes no new
 * stream and closes when its streams end.
 *
 * Per stream, the owner learns through struct h2up_ops, each called from the loop: the final
 * response head, body bytes (a paused stream keeps what came, at most its flow-control window,
 * and only its own window closes: the connection's other streams go on), trailers, and the
 * end. 'done' is never called from inside libnghttp2: after it the stream is gone.
 */
#ifndef RETRYPROXY_PROXY_H2UP_H
#define RETRYPROXY_PROXY_H2UP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/http/hlist.h"
#include "proxy/base/loop.h"
#include "proxy/telemetry/metrics.h"

#define H2UP_MAX_STREAMS 100   /* streams on one connection at most, whatever the peer allows */
#define H2UP_MAX_CONNS   8     /* connections to one origin per worker */
#define H2UP_IDLE_MS     60000 /* an idle connection closes after this */
/* Each stream's receive window: what a paused stream may hold at most. HTTP/2's default, as
 * nghttpx's backend: at 256 KiB, 100 streams a client left unread held 27 MiB. */
#define H2UP_STREAM_WINDOW (64 * 1024)

/* Returned by a body or upload callback: nothing now, until h2up_resume_body/_upload(). */
#define H2UP_PAUSE ((size_t)-1)

struct h2up;
struct origin;
struct h2up_stream;

/* How a stream ended. */
enum h2up_end {
    H2UP_COMPLETE, /* the whole response: a good head, then the upstream's END_STREAM (its
                    * content-length, if any, matched); an upload it had not read is cut */
    H2UP_STOPPED,  /* the owner's body callback took no bytes: the stream was reset */
    H2UP_UNSENT,   /* nothing reached the upstream: no connection, or the connection failed
                    * before the request went out */
    H2UP_REFUSED,  /* the upstream had the request but its application did not: REFUSED_STREAM
                    * before a head, or a GOAWAY whose last_stream_id is below the stream */
    H2UP_BROKEN,   /* reset (NO_ERROR too) or closed before END_STREAM, connection lost after
                    * the request went out, no :status or one the owner refused */
    H2UP_FALLBACK, /* an https origin's server chose http/1.1 by ALPN: nothing was sent; the
                    * request goes through HTTP/1.1 (h2up_prefers_h1) */
};

struct h2up_ops {
    /* The final response head (any status but 1xx, which are interim): 'status' and the fields
     * in the hlist given to start. False refuses it: the stream is reset, ends H2UP_BROKEN. */
    bool (*head)(void *arg, int status);
    /* Body bytes: how many were taken (all, or 0 to stop the stream), or H2UP_PAUSE to get
     * the same bytes again after h2up_resume_body(). */
    size_t (*body)(void *arg, const char *p, size_t n);
    /* Request body bytes: up to 'max' into 'buf'; 0 at its end; H2UP_PAUSE while none is there
     * (h2up_resume_upload() when there is). */
    size_t (*upload)(void *arg, char *buf, size_t max);
    /* The end; 'error' is the peer's HTTP/2 error code where there was one. */
    void (*done)(void *arg, enum h2up_end end, uint32_t error);
};

/* A field of the request (HTTP/2 rules: lowercase name, no connection-specific field). */
struct h2up_field {
    const char *name, *value;
    size_t name_len, value_len;
    bool never_index; /* sent as a literal never indexed (hdr_per_request()) */
};

struct h2up_req {
    const char *method, *path, *authority;
    const struct h2up_field *fields;
    size_t n_fields;
    bool has_body;   /* the body comes through ops->upload */
    const char *buf; /* else, when not NULL: the whole body, 'len' bytes, kept by the owner */
    size_t len;
    /* Trailer fields (lowercase names) sent after the body, the owner's and read once the body
     * ended; NULL or empty: none. */
    const struct hlist *trailers;
};

/* A worker's pool, its connections made on the connector's side 'cs' (proxy/upstream/connect.h:
 * the loop and the TLS contexts, which outlive the pool), counting into 'counts' (the worker's
 * metrics; NULL: nowhere), or NULL. */
struct connect_side;
struct h2up *h2up_new(struct connect_side *cs, struct metrics_h2up *counts);
/* Gives the memory its sessions no longer use back (after a burst). */
void h2up_trim(struct h2up *h);
/* Closes every connection; every stream must have ended or been cancelled. Accepts NULL. */
void h2up_free(struct h2up *h);

/* Starts a stream to 'o' (proxy/upstream/origin.h; one that did not resolve fails here) (connecting
 * within 'connect_timeout_ms' if need be): the head goes into 'head', trailers into 'trailers'
 * (both the owner's, filled from the loop until 'done' or the cancel). The request is copied. NULL
 * if it could not start (ops->done not called). */
struct h2up_stream *h2up_start(struct h2up *h, const struct origin *o, const struct h2up_req *req,
                               uint64_t connect_timeout_ms, const struct h2up_ops *ops, void *arg,
                               struct hlist *head, struct hlist *trailers);
/* Ends the stream without ops->done (RST_STREAM CANCEL if it went out). Not from inside one of
 * its own callbacks. */
void h2up_cancel(struct h2up_stream *s);
/* Whether the request's HEADERS frame went out. */
bool h2up_sent(const struct h2up_stream *s);
/* The owner has room for body bytes again / upload bytes are there. */
void h2up_resume_body(struct h2up_stream *s);
void h2up_resume_upload(struct h2up_stream *s);

/* Whether https origin 'o' recently chose http/1.1 by ALPN (and may: tls.http2 "auto"): its
 * requests go through HTTP/1.1 without trying h2 first. */
bool h2up_prefers_h1(struct h2up *h, const struct origin *o);

/* Endpoint 'o' left its name's record (docs/endpoints.md): its connections take no new stream,
 * and each closes with a GOAWAY once its streams ended (at once when it has none). */
void h2up_leave(struct h2up *h, const struct origin *o);

/* Connections open now (for tests and metrics). */
size_t h2up_connections(const struct h2up *h);

#endif
