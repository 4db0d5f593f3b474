/* connect -- one connection to an upstream origin in a worker's loop, for every transport that
 * makes its own (the HTTP/2 sessions of proxy/upstream/h2up_conn.c, an upgrade's tunnel of
 * proxy/upstream/tunnel_up.c): a non-blocking connect to the origin's resolved address
 * (proxy/upstream/origin.h) bounded by a connect timeout, the SO_ERROR check, and for an https
 * origin TLS with SNI, verification and ALPN (proxy/upstream/tls.h); then reads and writes over
 * plain TCP or TLS.
 *
 * The user embeds a struct connector and hears, through its ops: 'up' once the connection is
 * made (and which protocol ALPN chose), 'failed' if it could not be (nothing was sent), and
 * after 'up' 'io' for the events it asked for with connector_watch(). Bytes TLS has decrypted
 * but not handed over come with no socket event: connector_recv() leaves them to an 'io'
 * (EPOLLIN) in the loop's next turn. A TLS failure is logged here, the same for every user (at
 * most one line a second per worker, naming the origin and OpenSSL's reason); a refused or
 * timed-out connect is not (its attempt is a connect failure in the metrics and in the
 * debug-level "attempt" line, docs/logs.md).
 */
#ifndef RETRYPROXY_PROXY_CONNECT_H
#define RETRYPROXY_PROXY_CONNECT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "proxy/base/loop.h"
#include "proxy/upstream/tls.h"

struct origin;

/* A worker's side of the connections it makes by itself (the HTTP/2 sessions of
 * proxy/upstream/h2up.h, the upgrades' tunnels of proxy/upstream/tunnel_up.h): its loop and its
 * TLS contexts (proxy/upstream/tls.h, made on the first TLS connection), which every connector
 * of the worker shares. The worker makes and frees it (proxy/core/worker.c) and hands it to each
 * transport that connects: no transport reaches into another for them. */
struct connect_side {
    struct loop *loop;
    struct tls_ctxs *tls; /* NULL until the first TLS connection */
};

/* The side of loop 'l', or NULL out of memory. */
struct connect_side *connect_side_new(struct loop *l);
/* Frees it; every connection made on it is closed. Accepts NULL. */
void connect_side_free(struct connect_side *cs);

struct connector_ops {
    /* Connected (TLS done for an https origin): 'h2' whether the server chose h2 by ALPN. */
    void (*up)(void *arg, bool h2);
    /* Not connected (refused, timed out, TLS failed; nothing was sent): the connector is
     * closed already. 'why' lives until the callback returns. */
    void (*failed)(void *arg, const char *why);
    /* After 'up': the socket has what connector_watch() asked for, or TLS holds bytes. */
    void (*io)(void *arg, uint32_t events);
};

struct connector {
    struct loop *loop;
    const struct connector_ops *ops;
    void *arg;
    int fd;                  /* -1: none */
    struct tls *tls;         /* an https origin's, once TCP is connected */
    struct tls_ctxs **ctxs;  /* the worker's TLS contexts */
    struct tls_conf tconf;   /* an https origin's; its name NULL: cleartext */
    char *authority;         /* the origin's, for the log */
    enum tls_alpn alpn;      /* what TLS offers */
    bool tcp, up;            /* TCP is connected; ... and TLS too, 'up' was called */
    struct loop_watch w;     /* fd -1 until the socket has one */
    struct loop_timer timer; /* the connect timeout (TCP and TLS) */
    struct loop_timer kick;  /* TLS holds bytes no socket event will announce */
    _Atomic int64_t *conns;  /* the origin's count of open connections, while 'fd' is open */
};

/* Starts connecting 'k' to 'o' (https: TLS offering 'alpn'), within 'timeout_ms' (0: no limit
 * of its own), on the worker's side 'cs' (its loop and TLS contexts). 0, or -1 when no connect
 * could start (a name that did not resolve, no socket, out of memory): 'k' is closed, ops not
 * called. */
int connector_start(struct connector *k, struct connect_side *cs, const struct origin *o,
                    enum tls_alpn alpn, uint64_t timeout_ms, const struct connector_ops *ops,
                    void *arg);
/* From 'up': the protocol ALPN chose will not do. Logged as a TLS failure, then 'failed'. */
void connector_refuse(struct connector *k, const char *why);
/* Closes the connection (no close_notify) and frees what 'k' holds; again is harmless. A
 * connector never started must be zeroed with fd and w.fd -1 (connector_init). */
void connector_close(struct connector *k);
void connector_init(struct connector *k);
/* Stops watching and timing, the socket and TLS kept (a new owner reads them, and
 * connector_close() still closes them). */
void connector_unwatch(struct connector *k);
/* After connector_unwatch(): 'io' again, for the events 'ev', and for bytes TLS holds already
 * (an 'io' with EPOLLIN in the loop's next turn). 0 or -errno. */
int connector_rewatch(struct connector *k, uint32_t ev);

/* The events the user waits for (EPOLLIN, EPOLLOUT, or 0). 0 or -errno. */
static inline int connector_watch(struct connector *k, uint32_t ev)
{
    return k->w.events == ev ? 0 : loop_watch_mod(k->loop, &k->w, ev);
}

ssize_t connector_tls_recv(struct connector *k, void *p, size_t n);

/* Like recv()/send() on the non-blocking socket, over TLS for an https origin
 * (proxy/upstream/tls.h: TLS wants what it did not take offered again, the same bytes). */
static inline ssize_t connector_recv(struct connector *k, void *p, size_t n)
{
    return k->tls ? connector_tls_recv(k, p, n) : recv(k->fd, p, n, 0);
}

static inline ssize_t connector_send(struct connector *k, const void *p, size_t n)
{
    return k->tls ? tls_send(k->tls, p, n) : send(k->fd, p, n, MSG_NOSIGNAL);
}

/* After a -1 from connector_recv/send: try again on a later event. */
bool connector_again(void);

#endif
