/* origin -- an upstream origin ("host[:port]") whose name is resolved once, when the config
 * snapshot that names it is made (at start and at each reload), never in a worker, where a
 * lookup would block the loop. Connections to it are shared by its key, across snapshots
 * (proxy/upstream/h2up.h). */
#ifndef RETRYPROXY_PROXY_ORIGIN_H
#define RETRYPROXY_PROXY_ORIGIN_H

#include <stdbool.h>
#include <sys/socket.h>

#include "proxy/upstream/tls.h"

struct origin {
    char *authority; /* as given */
    char *host;      /* its name or address (no brackets), as the URL gave it */
    char *key;       /* "host:port@address" and the TLS settings: a new address after a reload
                        is a new origin */
    struct sockaddr_storage addr;
    socklen_t addr_len; /* 0: the name did not resolve */
    bool tls;           /* an https origin: TLS, HTTP/2 chosen by ALPN (proxy/upstream/tls.h) */
    bool h1_too;        /* ... offering http/1.1 too (routes[].tls.http2 "auto") */
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

/* "host:port" ("[v6]:port" too) resolved now; the port is 80 when absent, 443 with 'tls' (an
 * https origin; NULL: cleartext). NULL out of memory; a name that does not resolve gives an
 * origin with addr_len 0. */
struct origin *origin_new(const char *authority, const struct origin_tls *tls);
void origin_free(struct origin *o); /* accepts NULL */

#endif
