/* share -- a part of a worker's upstream attempt slots (proxy/upstream/slots.h)
 * that one party may hold at once: the attempts to one upstream endpoint, or those of one client
 * connection's HTTP/2 streams (limits.upstream_share_percent, connection_share_percent;
 * docs/hardening.md). Counted here, enforced by proxy/upstream/slots.c. A connection's share is
 * reference-counted: attempts holding or waiting for a slot through it may outlive the
 * connection. No library: the HTTP/2 front end makes one per connection without libcurl.
 */
#ifndef RETRYPROXY_PROXY_SHARE_H
#define RETRYPROXY_PROXY_SHARE_H

#include <stdbool.h>
#include <stddef.h>

struct upstream_wait;

struct share {
    size_t held;   /* slots its attempts hold */
    unsigned refs; /* its owner's, and one per attempt holding or waiting through it */
    bool conn;     /* a client connection's (else an endpoint's or an origin's) */
    /* The heads of the classes of owners waiting because it is used up (slots.c), and while
     * there are any, its place in its slots' list of such shares. */
    struct upstream_wait *parked_head;
    struct share *prev, *next;
};

/* A client connection's share, with one reference (the connection's). NULL out of memory: the
 * connection's attempts are then bounded by the worker's slots alone. */
struct share *share_new_conn(void);
void share_ref(struct share *s);
/* Drops a reference; the last frees it. Accepts NULL. */
void share_unref(struct share *s);

#endif
