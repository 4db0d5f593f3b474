/* origin -- an upstream origin ("host[:port]") whose name is resolved once, when the config
 * snapshot that names it is made (at start and at each reload), never in a worker, where a
 * lookup would block the loop. Connections to it are shared by its key, across snapshots
 * (proxy/h2up.h). */
#ifndef RETRYPROXY_PROXY_ORIGIN_H
#define RETRYPROXY_PROXY_ORIGIN_H

#include <stdbool.h>
#include <sys/socket.h>

struct origin {
    char *authority; /* as given */
    char *host;      /* its name or address (no brackets): TLS verifies the certificate for it */
    char *key;       /* "host:port@address": a new address after a reload is a new origin */
    struct sockaddr_storage addr;
    socklen_t addr_len; /* 0: the name did not resolve */
    bool tls;           /* an https origin: TLS, HTTP/2 chosen by ALPN (proxy/tls.h) */
    bool h1_too;        /* ... offering http/1.1 too (routes[].tls.http2 "auto") */
    char *ca_file;      /* ... trusting these certificates; NULL: the system's store */
};

/* How an https origin is reached (routes[].tls, docs/config.md). */
struct origin_tls {
    const char *ca_file; /* NULL: the system's store */
    bool h1_too;         /* http/1.1 offered too */
};

/* "host:port" ("[v6]:port" too) resolved now; the port is 80 when absent, 443 with 'tls' (an
 * https origin; NULL: cleartext). NULL out of memory; a name that does not resolve gives an
 * origin with addr_len 0. */
struct origin *origin_new(const char *authority, const struct origin_tls *tls);
void origin_free(struct origin *o); /* accepts NULL */

#endif
