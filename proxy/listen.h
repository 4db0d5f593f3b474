/* listen -- the proxy's listening sockets: one per worker on the same address (SO_REUSEPORT),
 * so the kernel spreads connections over workers without any shared accept lock. */
#ifndef RETRYPROXY_PROXY_LISTEN_H
#define RETRYPROXY_PROXY_LISTEN_H

#include <stddef.h>

/* Binds 'n' non-blocking listening sockets to 'addr' ("host:port", "[v6]:port"); port 0 picks
 * one free port for all of them. On success returns 0, fills fds[0..n) and writes the address
 * actually bound to 'bound' ("127.0.0.1:40123"). On failure returns -1 with the reason in
 * 'why' and no socket left open. */
int listen_open(const char *addr, size_t n, int *fds, char *bound, size_t bound_cap, char *why,
                size_t why_cap);

#endif
