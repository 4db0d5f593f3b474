/* relay -- the HTTP/1.1 front end (proxy/core/front.h) of one request: libmicrohttpd's access
 * handler calls turned into the request core's head, body and end, and the core's answers (an
 * error of retryproxy's own, a saved upstream response, or the upstream response streamed as
 * it arrives) turned into libmicrohttpd responses; suspending and resuming the connection, and
 * watching the client's socket for its leaving while the connection is suspended. With
 * server.c, the only part that calls libmicrohttpd.
 *
 * Answers made while inside the access handler go out when it returns; others resume the
 * suspended connection so that libmicrohttpd calls the handler again to take them.
 */
#ifndef RETRYPROXY_PROXY_RELAY_H
#define RETRYPROXY_PROXY_RELAY_H

#include <stdbool.h>
#include <stddef.h>

#include "proxy/base/loop.h"
#include "proxy/http/refusal.h"

struct MHD_Connection;
struct worker;
struct relay;

/* One client connection, as the relay watches it: for the connection's whole life its socket
 * is watched for the client leaving (a FIN or a reset: EPOLLRDHUP, edge-triggered, so that the
 * bytes of a next request wake nothing), so that a request whose connection libmicrohttpd has
 * suspended learns of it. One epoll_ctl at the connection's start and one at its end, none per
 * request. Kept by the server (proxy/http1/server.c) with its other per-connection state. */
struct relay_conn {
    struct loop_watch w;
    struct loop *loop;
    struct relay *cur; /* the request on the connection, until libmicrohttpd is done with it */
    bool left;         /* the client closed or reset its side: no request here is answered */
};

/* Starts watching connection socket 'fd'; without a watch (out of resources) a client that
 * leaves is noticed only once the connection is resumed. */
void relay_conn_open(struct relay_conn *rc, struct loop *l, int fd);
/* Stops watching (the connection closes, or becomes a tunnel's). Again: nothing. */
void relay_conn_close(struct relay_conn *rc);
/* The server stops: the connection's request, if libmicrohttpd has it suspended, is resumed
 * to be closed with it, its answer (a response still streaming) broken off. */
void relay_conn_stop(struct relay_conn *rc);

/* The front end of a request whose request line has arrived on connection 'c' (see
 * retry_req_new() for the rest); 'kick' has libmicrohttpd run within this loop turn; 'rc' is
 * the connection's watch (NULL: none). NULL if out of memory. */
struct relay *relay_new(struct worker *w, struct loop *l, void (*kick)(void *), void *kick_arg,
                        struct MHD_Connection *c, struct relay_conn *rc, const char *raw_target,
                        const char *peer, unsigned peer_port, enum refusal refused);

/* libmicrohttpd's access handler for the request (see MHD_AccessHandlerCallback): false where
 * it wants MHD_NO (close the connection). */
bool relay_access(struct relay *rl, const char *method, const char *upload_data,
                  size_t *upload_data_size);

/* libmicrohttpd is done with the request's connection (answered, or the client went away). */
void relay_completed(struct relay *rl);

#endif
