/* h2front -- the HTTP/2 front end (proxy/core/front.h): a libnghttp2 server session per client
 * connection, driven from the worker's loop, every stream a request of the core
 * (docs/http2.md). With proxy/upstream/h2up.c, the only part that calls libnghttp2.
 *
 * Bytes in go to nghttp2_session_mem_recv() as the socket has them; bytes out come from
 * nghttp2_session_mem_send() into a bounded output buffer, written as the socket takes them
 * (EPOLLOUT when it is full). Never a thread, never a blocking call. The library checks the
 * preface and HTTP/2's messaging rules; what is bounded per connection, and by what, is in
 * docs/http2.md and docs/hardening.md ("HTTP/2").
 */
#ifndef RETRYPROXY_PROXY_H2FRONT_H
#define RETRYPROXY_PROXY_H2FRONT_H

#include <stdint.h>

#include "proxy/base/loop.h"

struct h2front;
struct worker;

/* A connection's limits, from the config snapshot in force when it opened. */
struct h2front_limits {
    uint32_t max_header_bytes; /* a request's header list (SETTINGS_MAX_HEADER_LIST_SIZE) */
    uint32_t idle_ms;          /* limits.connection_timeout_ms (0: never) */
};

/* The HTTP/2 connections of worker 'w' (handed to retry_req_new as it is), in loop 'l';
 * closed(arg) is called after each connection closed (from the loop, never from inside
 * another call of this header's). NULL if out of memory. */
struct h2front *h2front_new(struct worker *w, struct loop *l, void (*closed)(void *arg), void *arg);

/* Serves HTTP/2 on 'fd' (non-blocking, the preface unread; h2front's from now on, closed on
 * failure too) from the client 'peer' (its address as text) and 'peer_port'. 0, or -1. */
int h2front_open(struct h2front *h, int fd, const char *peer, unsigned peer_port,
                 const struct h2front_limits *lim);

/* Connections open. */
unsigned h2front_count(const struct h2front *h);

/* Draining: every connection, and any opened from now on, gets a graceful GOAWAY (the last
 * stream it took); each closes once its streams are done. */
void h2front_drain(struct h2front *h);

/* Closes every connection (their requests are completed) and frees 'h'. Accepts NULL. */
void h2front_free(struct h2front *h);
/* Gives the memory its sessions no longer use back (after a burst). */
void h2front_trim(struct h2front *h);

#endif
