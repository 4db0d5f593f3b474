/* attempt -- one upstream attempt of a request: the curl transfer's setup, its callbacks (the
 * response head parsed into a header list by proxy/h1resp.h, body bytes, the upload pulled
 * from the owner), its slot under limits.max_upstream_requests, and its cancel. With
 * upstream.c, the only part that calls libcurl. An h2c upstream's attempt is a stream of
 * proxy/h2up.h instead, reported through the same struct attempt_ops (docs/http2.md).
 *
 * The owner embeds a struct attempt and learns what happens through struct attempt_ops, each
 * called from the loop (curl's callbacks run inside the multi-socket calls of upstream.c):
 * the head once complete and well formed, body bytes, upload requests, and the end.
 */
#ifndef RETRYPROXY_PROXY_ATTEMPT_H
#define RETRYPROXY_PROXY_ATTEMPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policy/rng.h"
#include "proxy/h1resp.h"
#include "proxy/h2up.h"
#include "proxy/hlist.h"
#include "proxy/tunnel_up.h"
#include "proxy/upstream.h"

struct attempt;

/* Returned by a body or upload callback: no bytes now, the attempt pauses that direction
 * until attempt_resume_body() / attempt_resume_upload(). */
#define ATTEMPT_PAUSE ((size_t)-1)

/* How a transfer ended. */
enum attempt_end {
    ATTEMPT_COMPLETE, /* the whole response arrived */
    ATTEMPT_REFUSED,  /* the owner's body callback took no bytes: the transfer was stopped */
    ATTEMPT_BROKEN,   /* connect failure, reset, bad head or framing: see attempt_sent() */
};

struct attempt_ops {
    /* A slot is free for the attempt queued by attempt_queue(): launch it now. */
    void (*go)(struct attempt *a);
    /* The response head is complete and well formed: a->status and a->head are set. Field
     * lines that come after the body (trailers) are in a->trailers when ops->done is called. */
    void (*head)(struct attempt *a);
    /* Body bytes: returns how many were taken (all of them, 0 to stop the transfer), or
     * ATTEMPT_PAUSE to get the same bytes again after attempt_resume_body(). */
    size_t (*body)(struct attempt *a, const char *p, size_t n);
    /* Upload bytes for the request body: up to 'max' into 'buf'; 0 at its end; ATTEMPT_PAUSE
     * while none is there yet (attempt_resume_upload() when there is). */
    size_t (*upload)(struct attempt *a, char *buf, size_t max);
    /* The transfer ended (never for a cancelled one). */
    void (*done)(struct attempt *a, enum attempt_end end);
};

/* What the attempt sends: the same for every attempt of a request but the upstream. */
struct attempt_req {
    const char *method;
    const char *target;         /* origin-form */
    struct curl_slist *headers; /* every field, built by proxy/head.c */
    enum { ATTEMPT_BODY_NONE, ATTEMPT_BODY_BUFFER, ATTEMPT_BODY_STREAM } body;
    const char *body_buf; /* ATTEMPT_BODY_BUFFER: the whole body */
    size_t body_len;
    int64_t content_length; /* ATTEMPT_BODY_STREAM: -1 for chunked */
    /* Trailer fields sent after the body, the owner's and read once the body ended (NULL or
     * empty: none). HTTP/1.1 can carry them only in a chunked body: a buffered body that has
     * them goes chunked; a streamed one with a Content-Length goes without them. */
    const struct hlist *trailers;
    /* An upgrade's handshake (docs/upgrades.md): the token asked for, NULL for none. It goes
     * through proxy/tunnel_up.h, never libcurl; a 101 agreeing to it is its final head. */
    const char *upgrade;
};

struct attempt {
    const struct attempt_ops *ops;
    void *arg; /* the owner's */
    struct upstream *up;
    struct upstream_xfer xfer;
    struct h2up_stream *h2;           /* an h2c upstream's running stream, instead of xfer.easy */
    struct tunnel_up *tun;            /* an upgrade's handshake, instead of xfer.easy */
    struct upstream_wait slot;        /* queued for a transfer slot */
    char *target_buf;                 /* the upstream's base path + the target */
    struct curl_slist host_field;     /* put before the request's fields (tls.server_name) */
    const struct hlist *req_trailers; /* attempt_req.trailers, for a chunked upload */
    const char *up_buf;               /* a buffered body going chunked: what is left of it */
    size_t up_len;
    unsigned sends;        /* times curl was about to send this attempt's request */
    int status;            /* the response's, once its status line came */
    struct hlist head;     /* the response's header fields */
    struct hlist trailers; /* and its trailer fields, once the body is complete */
    struct h1resp resp;    /* libcurl's response head, parsed (proxy/h1resp.h) */
    bool bad_head;         /* the response head was malformed or ambiguous */
    bool unprocessed;      /* the upstream refused it unprocessed (HTTP/2 REFUSED_STREAM, GOAWAY) */
    bool upload_paused, body_paused;
    /* An https attempt tried in HTTP/2 first: what it needs to go through libcurl instead if
     * the server chooses http/1.1 by ALPN (H2UP_FALLBACK; the request outlives the attempt). */
    struct {
        const struct upstream_url *url;
        const char *base_path;
        struct attempt_req req;
        uint64_t connect_timeout_ms;
    } h1;
};

void attempt_init(struct attempt *a, struct upstream *up, const struct attempt_ops *ops, void *arg);
/* Frees the buffers; the attempt must not be running (attempt_cancel()). */
void attempt_fini(struct attempt *a);

/* Resets the per-attempt state. True when no transfer slot is free, or the shares of the
 * attempt's 'origin' (cfg_upstream.origin) or client connection 'conn' (NULL: none) are used
 * up (upstream_set_shares): the attempt is queued and ops->go() is called once one frees;
 * false: launch it now. */
bool attempt_queue(struct attempt *a, const char *origin, struct share *conn);

/* Starts the transfer to 'url' with the upstream's 'base_path'. 0, or -1 if it could not start
 * (handled as a connect failure; ops->done is not called). */
int attempt_launch(struct attempt *a, const struct upstream_url *url, const char *base_path,
                   const struct attempt_req *req, uint64_t connect_timeout_ms);

/* Whether any of the request went out (curl was about to send it, the stream's HEADERS went):
 * if not, nothing reached the upstream, whatever the error. False for an h2c stream the
 * upstream refused (REFUSED_STREAM, or a GOAWAY below it): it reached no application. */
static inline bool attempt_sent(const struct attempt *a)
{
    return a->h2 ? h2up_sent(a->h2) : a->tun ? tunnel_up_sent(a->tun) : a->sends > 0;
}

/* Whether its transfer runs (started, not yet ended or cancelled). */
static inline bool attempt_running(const struct attempt *a)
{
    return a->xfer.easy != NULL || a->h2 != NULL || a->tun != NULL;
}

/* The upgrade's 101 was agreed to (ops->head reported it): its connection, handed over from
 * inside that callback, is the caller's from now on (proxy/tunnel_up.h); the attempt then
 * ends complete. */
struct tunnel_up *attempt_take_tunnel(struct attempt *a);

/* Ends the transfer, running or queued for a slot, without ops->done. Returns true if it was
 * running. Not from inside one of its callbacks. */
bool attempt_cancel(struct attempt *a);

/* Its response is the answer and streams to the client: the transfer gives its slot under
 * limits.max_upstream_requests back and runs on at the client's pace. */
void attempt_commit(struct attempt *a);

/* The fields of proxy/head.c's list as HTTP/2 fields for an h2c upstream (RFC 9113 8.2) into
 * 'f' (at most 'max'), their names lowercased into 'names' (room for every name of the list):
 * connection-specific fields (Connection, Keep-Alive, Proxy-Connection, Transfer-Encoding,
 * Upgrade) and Host are left out, TE unless it is "trailers", and, as curl would, "Name:"
 * alone (a removal) and an empty value. Host's value goes to *host (it becomes :authority).
 * Returns how many; the values point into the list. */
size_t attempt_h2_fields(const struct curl_slist *l, struct h2up_field *f, size_t max, char *names,
                         const char **host, size_t *host_len);

/* The owner has room for body bytes again / upload bytes are there. */
void attempt_resume_body(struct attempt *a);
void attempt_resume_upload(struct attempt *a);

#endif
