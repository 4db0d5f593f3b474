/* origin -- an upstream origin ("host[:port]") as a connection reaches it: its name, port and
 * TLS settings, and the address connected to. A name is never looked up here (a worker must not
 * block): the URL's origin has an address only when its host is an IP literal, and each of a
 * name's endpoints (proxy/dns/resolve.h, docs/endpoints.md) is an origin of its own, made with
 * origin_at(). Connections to it are shared by its key, across snapshots (proxy/upstream/h2up.h).
 */
#ifndef RETRYPROXY_PROXY_ORIGIN_H
#define RETRYPROXY_PROXY_ORIGIN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "proxy/upstream/tls.h"

struct origin {
    char *authority; /* as given */
    char *host;      /* its name or address (no brackets), as the URL gave it */
    char *key;       /* "host:port@address" and the TLS settings: each endpoint is an origin */
    struct sockaddr_storage addr;
    socklen_t addr_len; /* 0: a name, whose endpoints have the addresses */
    uint16_t port;
    _Atomic int64_t *conns; /* connections open to it count here (NULL: nowhere) */
    bool tls;               /* an https origin: TLS, HTTP/2 chosen by ALPN (proxy/upstream/tls.h) */
    bool h1_too;            /* ... offering http/1.1 too (routes[].tls.http2 "auto") */
    struct tls_conf tls_conf; /* ... and how (its name: tls.server_name, else 'host') */
};

/* How an https origin is reached (routes[].tls, docs/config.md). */
struct origin_tls {
    const char *ca_file;     /* NULL: the system's store */
    const char *cert_file;   /* the client certificate; NULL: none */
    const char *key_file;    /* its key; NULL: in cert_file */
    const char *server_name; /* NULL: the URL's host */
    bool h1_too;             /* http/1.1 offered too */
};

/* "host:port" ("[v6]:port" too); the port is 80 when absent, 443 with 'tls' (an https origin;
 * NULL: cleartext). Its address is the host's when that is an IP literal, else none (addr_len 0).
 * NULL out of memory. */
struct origin *origin_new(const char *authority, const struct origin_tls *tls);
/* The same origin at address 'a' (one endpoint), its connections counted in 'conns' (NULL:
 * not). NULL out of memory. */
struct dns_addr;
struct origin *origin_at(const struct origin *o, const struct dns_addr *a, _Atomic int64_t *conns);
void origin_free(struct origin *o); /* accepts NULL */

#endif
