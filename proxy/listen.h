/* listen -- the proxy's listening sockets: one per worker on the same address (SO_REUSEPORT),
 * so the kernel spreads connections over workers without any shared accept lock; and no other
 * process on that address (listen.c says how, and what race is left). */
#ifndef RETRYPROXY_PROXY_LISTEN_H
#define RETRYPROXY_PROXY_LISTEN_H

#include <stddef.h>

/* Binds 'n' non-blocking listening sockets to 'addr' ("host:port", "[v6]:port"); port 0 picks
 * one free port for all of them. On success returns 0, fills fds[0..n) and writes the address
 * actually bound to 'bound' ("127.0.0.1:40123"). On failure returns -1 with the reason in
 * 'why' ("cannot listen on ADDR: address already in use by another process" when anything
 * else listens there, SO_REUSEPORT or not; "... by this process's other listener" when that is
 * a socket of this process, as when listen and admin are one address) and no socket left
 * open. */
int listen_open(const char *addr, size_t n, int *fds, char *bound, size_t bound_cap, char *why,
                size_t why_cap);

/* Whether another socket shares the port of fds[0..n) (listening sockets bound to one
 * address): 1 when a listening socket that is not one of them has their port and an address
 * that overlaps theirs (the same, or a wildcard on either side), 0 when none does, -1 when
 * that cannot be told (no /proc/net/tcp). listen_open() fails when it is 1. */
int listen_shared(const int *fds, size_t n);

#endif
