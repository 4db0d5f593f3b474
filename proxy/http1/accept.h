/* accept -- a worker's listening socket in its own loop, and the first bytes of each connection:
 * the one port serves HTTP/1.1 and HTTP/2 with prior knowledge (docs/http2.md, "One port").
 *
 * A connection accepted is read with recv(MSG_PEEK) until its first bytes tell: the 24-byte
 * HTTP/2 connection preface, or anything else (HTTP/1.1). Nothing is consumed, so whichever
 * side takes the connection reads it from its first byte (libmicrohttpd through the framing
 * check, proxy/http1/wire.h; or the HTTP/2 session, which checks the preface itself). While the
 * bytes so far are a beginning of the preface the wait is bounded by limits.header_timeout_ms
 * from the first byte; a connection that sends nothing is closed after
 * limits.connection_timeout_ms, as an idle HTTP/1.1 connection is.
 *
 * Connections being looked at count towards the worker's connection limit with those the
 * owner has open: at the limit the listening socket is left alone (the kernel's backlog holds
 * the rest) until accept_closed() says one went.
 */
#ifndef RETRYPROXY_PROXY_ACCEPT_H
#define RETRYPROXY_PROXY_ACCEPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "proxy/base/loop.h"

struct acceptor;

/* The limits in force for a connection being accepted (the current config snapshot's). */
struct accept_limits {
    uint32_t header_timeout_ms; /* the preface's bytes, from the first (0: idle_ms alone) */
    uint32_t idle_ms;           /* the first byte (0: no limit) */
    uint32_t send_buffer;       /* SO_SNDBUF, 0: the kernel's sizing */
};

enum accept_proto { ACCEPT_HTTP1, ACCEPT_HTTP2 };

/* The owner of the accepted connections. Every call comes from the loop's thread. */
struct accept_ops {
    /* How many connections the owner has open (handed over and not yet closed). */
    unsigned (*open)(void *arg);
    void (*limits)(void *arg, struct accept_limits *lim);
    /* A connection was accepted (+1) or closed before it was handed over (-1): the
     * connections gauge. */
    void (*count)(void *arg, int delta);
    /* Accepting stopped: the limit's connections are open (NULL: not told). */
    void (*limited)(void *arg);
    /* A connection whose protocol is known: 'fd' (non-blocking, its bytes unread) is the
     * owner's from now on; 'peer' is the client's address as text. */
    void (*take)(void *arg, enum accept_proto proto, int fd, const struct sockaddr *sa,
                 socklen_t sa_len, const char *peer);
};

/* Accepts on 'listen_fd' (bound, listening, non-blocking; the acceptor's from now on, closed on
 * failure too) up to 'limit' connections open at once. NULL if out of memory or epoll failed. */
struct acceptor *accept_new(struct loop *l, int listen_fd, unsigned limit,
                            const struct accept_ops *ops, void *arg);

/* A connection the owner had taken closed: accepting resumes if the limit had stopped it. */
void accept_closed(struct acceptor *a);

/* Stops accepting for good (draining): the listening socket is closed, so that this worker's
 * share of the port stops taking connections. Connections being looked at go on. */
void accept_quiesce(struct acceptor *a);

/* Connections being looked at now. */
unsigned accept_pending(const struct acceptor *a);

/* Closes the listening socket and every connection not yet handed over. Accepts NULL. */
void accept_free(struct acceptor *a);

/* The address of 'sa' (IPv4 or IPv6) as text in out[cap], "" for any other family. */
void accept_peer_text(const struct sockaddr *sa, char *out, size_t cap);
/* Its port, 0 for any other family. */
unsigned accept_peer_port(const struct sockaddr *sa);

/* The HTTP/2 connection preface (RFC 9113 3.4). */
#define ACCEPT_H2_PREFACE     "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define ACCEPT_H2_PREFACE_LEN 24

/* What the first 'n' bytes of a connection say: ACCEPT_HTTP2 when they are the whole preface,
 * ACCEPT_HTTP1 when they cannot begin it, -1 when they begin it but are too few to tell. */
int accept_sniff(const char *p, size_t n);

#endif
