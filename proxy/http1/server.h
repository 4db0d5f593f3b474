/* server -- a libmicrohttpd daemon in a worker's event loop (external epoll mode).
 *
 * The daemon's own epoll fd is one watch of the worker's loop, its timeouts one loop timer.
 * Connections are suspended while their request waits on the upstream side and resumed when
 * there is something to send.
 */
#ifndef RETRYPROXY_PROXY_SERVER_H
#define RETRYPROXY_PROXY_SERVER_H

struct worker;

/* Serves the clients of worker 'w' on 'listen_fd' (bound, listening, non-blocking): a
 * worker_serve_fn (proxy/core/worker.h). */
int server_serve(struct worker *w, int listen_fd);

#endif
