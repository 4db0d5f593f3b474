/* tunnel_up -- the upstream side of an upgrade's attempt (docs/upgrades.md): libcurl cannot
 * carry an HTTP/1.1 upgrade (Debian 12's 7.88 waits on for a final response after a 101), so
 * this connects by itself in the worker's loop through proxy/upstream/connect.h, as the HTTP/2
 * sessions do: TLS offering only "http/1.1" by ALPN for an https origin (proxy/upstream/tls.h), the
 * request head written from proxy/http/head.c's fields with Connection and Upgrade put back, and
 * the response head read by proxy/upstream/h1resp.h, with the checks every HTTP/1.1 response head
 * passes.
 *
 * A 101 the owner accepts (tunnel_up_handover() from inside its 'head' callback) ends the
 * attempt complete, and the connection, with the bytes read past the head, becomes the
 * tunnel's (proxy/http1/tunnel.h). Any other final answer is read by its framing (Content-Length,
 * chunked, or to the close), its body handed over as it comes, and the connection closed.
 */
#ifndef RETRYPROXY_PROXY_TUNNEL_UP_H
#define RETRYPROXY_PROXY_TUNNEL_UP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct connect_side;
struct hfield;
struct hlist;
struct origin;
struct tunnel_up;

/* Returned by the body callback: no bytes now, offered again after tunnel_up_resume(). */
#define TUNNEL_UP_PAUSE ((size_t)-1)

enum tunnel_up_end {
    TUNNEL_UP_COMPLETE, /* a whole answer (or the 101 taken over) */
    TUNNEL_UP_STOPPED,  /* the body callback took no bytes */
    TUNNEL_UP_BROKEN,   /* a reset, a malformed body, after the request went */
    TUNNEL_UP_UNSENT,   /* the connection or TLS failed: nothing reached the upstream */
    TUNNEL_UP_BAD_HEAD, /* a malformed or ambiguous response head (broken, a 502 of its own) */
};

struct tunnel_up_ops {
    /* The final response head is in: its 'status' and the fields in tunnel_up_req.head (a
     * 101 is the agreement to the upgrade; interim 1xx heads are dropped). */
    void (*head)(void *arg, int status);
    /* Body bytes of an answer other than 101: how many were taken, 0 to stop, or
     * TUNNEL_UP_PAUSE. */
    size_t (*body)(void *arg, const char *p, size_t n);
    /* The attempt ended (never after tunnel_up_cancel()). */
    void (*done)(void *arg, enum tunnel_up_end end);
};

struct tunnel_up_req {
    const struct origin *o;
    const char *method;
    const char *target;       /* origin-form, the upstream's base path in front */
    const struct hfield *own; /* the attempt's own fields, sent first */
    size_t n_own;
    const struct hlist *fields; /* the request's (proxy/http/head.c; NULL: none) */
    const char *upgrade;        /* the token asked for (the client's, with its version if any; it
                                 * outlives the attempt) */
    struct hlist *head;         /* the response head's fields go here (the owner's, cleared) */
    bool no_body;               /* a HEAD request */
    uint64_t connect_timeout_ms;
    uint64_t *bytes_sent; /* NULL: not counted */
};

/* Starts the attempt, its connection made on the worker's connector side 'cs'
 * (proxy/upstream/connect.h: the loop and the TLS contexts). NULL out of memory or when no
 * socket can be made (a connect failure; ops->done is not called). */
struct tunnel_up *tunnel_up_start(struct connect_side *cs, const struct tunnel_up_req *req,
                                  const struct tunnel_up_ops *ops, void *arg);
/* Ends it without ops->done and frees it. Not from inside its callbacks. Accepts NULL. */
void tunnel_up_cancel(struct tunnel_up *u);
/* Whether any of the request went out. */
bool tunnel_up_sent(const struct tunnel_up *u);
/* The body callback has room again. */
void tunnel_up_resume(struct tunnel_up *u);

/* From inside ops->line, at the empty line of a 101 head: the connection is taken over. The
 * attempt then ends complete; 'u' is the new owner's, who reads it with the calls below and
 * frees it with tunnel_up_free(). */
void tunnel_up_handover(struct tunnel_up *u);
/* The bytes read past the 101 head, which the client must get first. */
const char *tunnel_up_rest(const struct tunnel_up *u, size_t *len);

/* The data phase, after the handover: cleartext and TLS alike, through the connector
 * (proxy/upstream/connect.h). From tunnel_up_attach() on, 'io' hears the events asked for with
 * tunnel_up_watch() (EPOLLIN, EPOLLOUT, or 0), and an EPOLLIN in the loop's next turn for bytes
 * TLS decrypted and holds, which no socket event announces (docs/upgrades.md). 0 or -1. */
int tunnel_up_attach(struct tunnel_up *u, void (*io)(void *arg, uint32_t events), void *arg);
int tunnel_up_watch(struct tunnel_up *u, uint32_t ev);
/* Like recv()/send() on a non-blocking socket: bytes moved, 0 at the upstream's end (recv), or
 * -1 with errno EAGAIN (later, on an 'io') or another (the connection is broken). A send that
 * TLS did not take is offered again with the same bytes first. */
ssize_t tunnel_up_recv(struct tunnel_up *u, void *p, size_t n);
ssize_t tunnel_up_send(struct tunnel_up *u, const void *p, size_t n);
/* Passes the client's end on: a cleartext connection's write side is shut. -1 over TLS, which
 * has no half-close here: the connection must end whole. */
int tunnel_up_shut_write(struct tunnel_up *u);
/* Closes the connection and frees it (the owner's after a handover). Accepts NULL. */
void tunnel_up_free(struct tunnel_up *u);

#endif
