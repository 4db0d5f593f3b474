/* tunnel -- an upgraded connection (docs/upgrades.md): after the client got the upstream's 101,
 * bytes go both ways unchanged between the client's socket and the upstream's connection
 * (proxy/upstream/tunnel_up.h), in the worker's loop.
 *
 * Each way has a bounded buffer (TUNNEL_BUFFER): a full one stops reading the side that fills
 * it (backpressure), so a slow reader on one side pauses the other and a tunnel holds at most
 * twice that. A side's end (EOF) is passed on as a half-close (shutdown(SHUT_WR)) once what it
 * sent is written; an error on either side ends both. No byte either way for
 * limits.tunnel_idle_timeout_ms ends it too. The bytes the upstream sent after its 101 head go
 * to the client first, and those the client sent after its request (libmicrohttpd's extra_in)
 * to the upstream first.
 */
#ifndef RETRYPROXY_PROXY_TUNNEL_H
#define RETRYPROXY_PROXY_TUNNEL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/core/front.h"

/* Bytes buffered each way at most. */
#define TUNNEL_BUFFER (64 * 1024)

struct loop;
struct tunnel_up;

struct tunnel;

/* The client's end: its socket, the bytes already read past the request, and how it is given
 * back once the tunnel ends (the front end closes it: libmicrohttpd owns the socket). */
struct tunnel_client {
    int fd;
    const char *extra;
    size_t extra_len;
    void (*close)(void *arg);
    void *close_arg;
};

/* Opens a tunnel between 'c' and 'up' (which it owns from now on, whatever the result). 0, or
 * -1 out of memory: then both ends are closed already. */
int tunnel_open(struct loop *l, const struct tunnel_client *c, struct tunnel_up *up,
                const struct front_tunnel *conf);

/* Closes every tunnel of the list (the drain time has ended, or the worker stops). */
void tunnel_close_all(struct tunnel **open);

#endif
