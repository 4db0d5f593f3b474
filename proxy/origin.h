/* origin -- an upstream origin ("host[:port]") whose name is resolved once, when the config
 * snapshot that names it is made (at start and at each reload), never in a worker, where a
 * lookup would block the loop. Connections to it are shared by its key, across snapshots
 * (proxy/h2up.h). */
#ifndef RETRYPROXY_PROXY_ORIGIN_H
#define RETRYPROXY_PROXY_ORIGIN_H

#include <sys/socket.h>

struct origin {
    char *authority; /* as given */
    char *key;       /* "host:port@address": a new address after a reload is a new origin */
    struct sockaddr_storage addr;
    socklen_t addr_len; /* 0: the name did not resolve */
};

/* "host:port" (port 80 when absent; "[v6]:port" too) resolved now. NULL out of memory; a name
 * that does not resolve gives an origin with addr_len 0. */
struct origin *origin_new(const char *authority);
void origin_free(struct origin *o); /* accepts NULL */

#endif
