/* server -- a libmicrohttpd daemon in a worker's event loop (external epoll mode).
 *
 * The daemon's own epoll fd is one watch of the worker's loop, its timeouts one loop timer.
 * Connections are suspended while their request waits on the upstream side and resumed when
 * there is something to send.
 */
#ifndef RETRYPROXY_PROXY_SERVER_H
#define RETRYPROXY_PROXY_SERVER_H

#include "config/cfg.h"

struct worker;
struct server;

/* A daemon accepting on 'listen_fd' (bound, listening, non-blocking) for worker 'w'; the
 * descriptor is the server's from now on, closed on failure too. NULL with a message on
 * stderr on failure. The worker's 'kick' is set to have this server run within the turn. */
struct server *server_start(struct worker *w, int listen_fd, const struct cfg *c);

/* Stops accepting new connections (draining); connections already open keep being served. */
void server_quiesce(struct server *s);

/* Stops accepting and closes every connection (their requests are told they are done).
 * Accepts NULL. */
void server_stop(struct server *s);

#endif
