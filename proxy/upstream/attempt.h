/* attempt -- one upstream attempt of a request, as the request core (proxy/core/retry.h) sees it:
 * the interface every upstream transport implements, the upstream counterpart of proxy/core/front.h
 * (HAProxy's muxes behind one interface). Three are behind it: HTTP/1.1 through libcurl
 * (proxy/upstream/h1up.c), HTTP/2 through libnghttp2 (proxy/upstream/h2up_attempt.c, h2c and h2
 * over TLS) and an upgrade's connection (proxy/upstream/tunnel_up_attempt.c).
 * proxy/upstream/attempt.c chooses among them (an https origin tried in HTTP/2 first goes through
 * libcurl if its server chooses http/1.1) and holds what they share: the slot under
 * limits.max_upstream_requests and the upstream target.
 *
 * In, from the core: queue for a slot, launch with the request head (method, target, fields as
 * an hlist, each transport turning them into its library's format), its body and trailers, cancel,
 * commit, and flow control both ways. Out, through struct attempt_ops, each called from the loop: a
 * slot is free, the response head (status and fields in an hlist) once complete and well formed,
 * body bytes, upload requests, and the end: complete, refused, or broken with what the retry rules
 * read (sent or not, unprocessed, a malformed head). Trailers are in a->trailers at the end.
 *
 * The owner embeds a struct attempt; the transports' state lives in it as bytes (their types
 * are in proxy/upstream/attempt_int.h, which the core does not include).
 */
#ifndef RETRYPROXY_PROXY_ATTEMPT_H
#define RETRYPROXY_PROXY_ATTEMPT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/http/hlist.h"

struct attempt;
struct share;
struct tunnel_up;
struct attempt_url;
struct cfg_tls;
struct slots;
struct curlm;
struct h2up;
struct connect_side;

/* A worker's upstream side: the attempt slots every transport holds (limits.max_upstream_requests)
 * and each transport's engine, which the worker makes and frees (proxy/core/worker.c): libcurl's
 * multi engine for HTTP/1.1, the HTTP/2 sessions, and the connector's side, on which the HTTP/2
 * sessions and the upgrades' tunnels make their connections (the loop and the TLS contexts).
 * Each transport gets what it runs on from here, never from another transport. */
struct attempt_side {
    struct slots *slots;       /* proxy/upstream/slots.h */
    struct curlm *curl;        /* proxy/upstream/curlm.h */
    struct h2up *h2;           /* proxy/upstream/h2up.h */
    struct connect_side *conn; /* proxy/upstream/connect.h */
};

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
    const struct hlist *fields; /* the request's fields, built by proxy/http/head.c */
    const struct hfield *own;   /* and this attempt's own (X-Retry-Attempt...), sent first */
    size_t n_own;
    enum { ATTEMPT_BODY_NONE, ATTEMPT_BODY_BUFFER, ATTEMPT_BODY_STREAM } body;
    const char *body_buf; /* ATTEMPT_BODY_BUFFER: the whole body */
    size_t body_len;
    int64_t content_length; /* ATTEMPT_BODY_STREAM: -1 for chunked */
    /* Trailer fields sent after the body, the owner's and read once the body ended (NULL or
     * empty: none). HTTP/1.1 can carry them only in a chunked body: a buffered body that has
     * them goes chunked; a streamed one with a Content-Length goes without them. */
    const struct hlist *trailers;
    /* An upgrade's handshake (docs/upgrades.md): the token asked for, NULL for none. It goes
     * through the upgrade connector, never libcurl; a 101 agreeing to it is its final head. */
    const char *upgrade;
};

/* The dispatcher's and the running transport's state: bytes here, their types in
 * proxy/upstream/attempt_int.h, which only the transports include. */
#define ATTEMPT_STATE_BYTES 360

struct attempt {
    const struct attempt_ops *ops;
    void *arg;             /* the owner's */
    int status;            /* the response's, once its head came */
    bool sent;             /* at its end: whether any of the request went out (attempt_sent) */
    bool bad_head;         /* the response head was malformed or ambiguous */
    bool unprocessed;      /* the upstream refused it unprocessed (HTTP/2 REFUSED_STREAM, GOAWAY) */
    struct hlist head;     /* the response's header fields */
    struct hlist trailers; /* and its trailer fields, once the body is complete */
    _Alignas(8) unsigned char state[ATTEMPT_STATE_BYTES];
};

/* 'up' outlives the attempt. */
void attempt_init(struct attempt *a, struct attempt_side *up, const struct attempt_ops *ops,
                  void *arg);
/* Frees the buffers; the attempt must not be running (attempt_cancel()). */
void attempt_fini(struct attempt *a);

/* Resets the per-attempt state. True when no transfer slot is free, or the shares of the
 * attempt's endpoint 'to' of 'origin' (cfg_upstream.origin; NULL 'to': the origin's own share)
 * or client connection 'conn' (NULL: none) are used up (slots_set_shares): the attempt is
 * queued and ops->go() is called once one frees; false: launch it now. */
struct attempt_target;
bool attempt_queue(struct attempt *a, const char *origin, struct attempt_target *to,
                   struct share *conn);

/* Starts the transfer to 'url' at its endpoint 'to' (attempt_target_new; NULL: where the URL
 * says, an IP literal's address or libcurl's own lookup) with the upstream's 'base_path'. 0, or
 * -1 if it could not start (handled as a connect failure; ops->done is not called). */
struct attempt_target;
int attempt_launch(struct attempt *a, const struct attempt_url *url,
                   const struct attempt_target *to, const char *base_path,
                   const struct attempt_req *req, uint64_t connect_timeout_ms);

/* An upstream's origin ("http://host:port/", "https://...", "h2c://host:port/") of 'host'
 * (cfg_upstream.host) parsed once, for every attempt to it, with its route's 'tls', for every
 * transport that may carry it: libcurl's URL, the HTTP/2 origin (h2c, or https tried in HTTP/2
 * first: routes[].tls.http2), and with 'tunnels' where an upgrade's tunnel connects (an http or
 * https origin, resolved now: docs/upgrades.md). Read-only once made, so attempts of any worker
 * may share it; it must outlive them (the config snapshot that names the upstream owns it). On
 * the control thread; NULL if out of memory or curl refuses the URL. */
struct attempt_url *attempt_url_new(const char *origin, const char *host, const struct cfg_tls *tls,
                                    bool tunnels);
void attempt_url_free(struct attempt_url *url); /* accepts NULL */

/* An endpoint of 'url' at address 'addr' (docs/endpoints.md): what each transport connects to,
 * connections counted in 'conns'. It must outlive the transfers launched to it. NULL out of
 * memory. */
struct dns_addr;
struct attempt_target *attempt_target_new(const struct attempt_url *url,
                                          const struct dns_addr *addr, _Atomic int64_t *conns);
/* Frees it, letting go of its share of the worker's slots; from any thread. Accepts NULL. */
void attempt_target_free(struct attempt_target *t);
/* The endpoint left its name's record: the worker's idle connections to it close, busy ones
 * once their requests end. */
void attempt_target_leave(struct attempt_side *up, const struct attempt_target *t);

/* Once it ended (ops->done): whether any of the request went out (curl was about to send it,
 * the stream's HEADERS went): if not, nothing reached the upstream, whatever the error. False
 * for an HTTP/2 stream the upstream refused (REFUSED_STREAM, or a GOAWAY below it): it reached
 * no application. */
static inline bool attempt_sent(const struct attempt *a)
{
    return a->sent;
}

/* Whether its transfer runs (started, not yet ended or cancelled). */
bool attempt_running(const struct attempt *a);

/* The upgrade's 101 was agreed to (ops->head reported it): its connection, handed over from
 * inside that callback, is the caller's from now on (proxy/upstream/tunnel_up.h); the attempt then
 * ends complete. */
struct tunnel_up *attempt_take_tunnel(struct attempt *a);

/* Ends the transfer, running or queued for a slot, without ops->done. Returns true if it was
 * running. Not from inside one of its callbacks. */
bool attempt_cancel(struct attempt *a);

/* Its response is the answer and streams to the client: the transfer gives its slot under
 * limits.max_upstream_requests back and runs on at the client's pace. */
void attempt_commit(struct attempt *a);

/* The owner took the body bytes just given and has no room for another write: the transfer
 * pauses now, holding nothing (libcurl keeps the bytes of a write refused with ATTEMPT_PAUSE,
 * up to its receive buffer), until attempt_resume_body(). May be called from ops->body. False
 * when the transport cannot (it has none running, or an upload still goes): the owner refuses
 * the next write instead. (docs/http2.md, "What an unread stream costs") */
bool attempt_pause_body(struct attempt *a);
/* The owner has room for body bytes again / upload bytes are there. */
void attempt_resume_body(struct attempt *a);
void attempt_resume_upload(struct attempt *a);

#endif
