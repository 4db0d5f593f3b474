/* tls -- TLS client connections over a worker's non-blocking sockets, for the HTTP/2 upstream
 * sessions of proxy/upstream/h2up.h (https upstreams that choose h2 by ALPN; docs/http2.md "https
 * upstreams"). The only part that calls OpenSSL directly (libcurl does its own TLS).
 *
 * Certificates are verified as libcurl verifies them for the same upstream: the chain against
 * the route's tls.ca_file or else the system's store, and the name (or IP address) the URL
 * gave, or tls.server_name. The server name goes in SNI unless it is an address. A route's
 * tls.cert_file is presented to a server that asks for a client certificate.
 */
#ifndef RETRYPROXY_PROXY_TLS_H
#define RETRYPROXY_PROXY_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct tls;
struct tls_ctxs;

/* What a handshake step, a read or a write needs next. */
enum tls_want {
    TLS_DONE,       /* the handshake is complete */
    TLS_WANT_READ,  /* call again once the socket is readable */
    TLS_WANT_WRITE, /* call again once the socket is writable */
    TLS_FAILED,     /* the handshake failed (see tls_error) */
};

/* A worker's configured contexts, one per set of files, made when first needed. Accepts
 * NULL. */
void tls_ctxs_free(struct tls_ctxs *c);

/* How a client connects (routes[].tls, docs/config.md): its own copies of the strings. */
struct tls_conf {
    char *ca_file;   /* the certificates trusted; NULL: the system's store */
    char *cert_file; /* the client certificate presented when asked; NULL: none */
    char *key_file;  /* its private key; NULL: in cert_file */
    char *name;      /* sent in SNI (unless an address) and verified: tls.server_name or the
                        URL's host */
};
/* 'dst' gets copies of 'src''s strings; -1 out of memory ('dst' left empty). */
int tls_conf_copy(struct tls_conf *dst, const struct tls_conf *src);
void tls_conf_clear(struct tls_conf *c); /* frees the strings */

/* What a client offers by ALPN. */
enum tls_alpn {
    TLS_ALPN_H2,    /* "h2" */
    TLS_ALPN_H2_H1, /* "h2", then "http/1.1" */
    TLS_ALPN_H1,    /* "http/1.1" alone (an upgrade's tunnel, docs/upgrades.md) */
};

/* A client on connected socket 'fd' as 'conf' says (its name: a host name or an IP address,
 * without brackets), offering 'alpn'. '*ctxs' is the worker's context cache (made on first
 * use). NULL when out of memory or a file cannot be loaded (the config checked them, but they
 * may have changed since). */
struct tls *tls_new(struct tls_ctxs **ctxs, int fd, const struct tls_conf *conf,
                    enum tls_alpn alpn);
void tls_free(struct tls *t); /* accepts NULL; sends no close_notify */

enum tls_want tls_handshake(struct tls *t);
/* After TLS_DONE: whether the server chose h2. */
bool tls_is_h2(const struct tls *t);
/* Why the handshake failed, for the log ("certificate verify failed: ..."). */
const char *tls_error(const struct tls *t);

/* Like recv()/send() on a non-blocking socket: bytes moved, 0 at the peer's close (recv), or
 * -1 with errno EAGAIN (try again on the socket's next event of either kind) or EPIPE (the
 * connection is broken). */
ssize_t tls_recv(struct tls *t, void *buf, size_t n);
ssize_t tls_send(struct tls *t, const void *buf, size_t n);
/* Decrypted bytes already read off the socket and waiting for tls_recv. */
bool tls_pending(const struct tls *t);

#endif
