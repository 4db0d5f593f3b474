/* fields -- which header fields cross the proxy (docs/forwarding.md, "Which fields cross"): one
 * filter for the way up (client to upstream) and one for the way down (upstream to client),
 * each for a head and its trailers alike, and the fields HTTP/2 forbids on either way. Pure:
 * the names come from the caller, NUL-terminated at their length (as libmicrohttpd, libnghttp2
 * and struct hlist give them).
 */
#ifndef RETRYPROXY_PROXY_FIELDS_H
#define RETRYPROXY_PROXY_FIELDS_H

#include <stdbool.h>
#include <stddef.h>

#include "proxy/http/hlist.h"

/* What the way up needs to know of a request. */
struct fields_up {
    const char *deadline_header; /* the route's (NULL: none): the proxy sets it */
    bool drop_underscored;       /* limits.headers_with_underscores is not "allow" */
    bool grpc;                   /* a gRPC call: grpc-timeout is the proxy's */
    /* the values of the client head's Connection fields: the fields they name stay out of the
     * head and of its trailers (RFC 9110 7.6.1) */
    const char *const *connection;
    unsigned n_connection;
};

/* Whether the client's field 'k' (of 'kl' bytes) stays out of what goes upstream: a
 * pseudo-header, a hop-by-hop field or one named by the head's Connection, one of framing or
 * routing (Content-Length, Host, Expect), one the proxy sets itself (X-Retry-Attempt,
 * X-Retry-Max-Attempts, X-Retry-Timeout-Ms, X-Forwarded-For, X-Forwarded-Proto, X-Request-Id,
 * the route's deadline header, grpc-timeout on a gRPC call) or a name with an underscore when
 * 'drop_underscored'. What the proxy reads of such a field, and writes anew, is head.c's. */
bool fields_up_drops(const struct fields_up *u, const char *k, size_t kl);

/* What the way down needs to know of a response. */
struct fields_down {
    /* field lists whose Connection fields name fields that stay out (NULL: none): the head,
     * whose Connection applies to its trailers too, and a trailer section itself */
    const struct hlist *named[2];
    bool own_request_id; /* the proxy sets X-Request-Id on the answer */
};

/* Whether the upstream's field 'k' (of 'kl' bytes) stays out of the answer: a pseudo-header, a
 * hop-by-hop field or one a Connection of 'd' names, Content-Length (the front end frames the
 * body) and the proxy's own (X-Retry-Attempts, X-Retry-Stop, X-Request-Id when it sets one). */
bool fields_down_drops(const struct fields_down *d, const char *k, size_t kl);

/* Calls fn(arg, field) for each field of the upstream's head 'h' that goes down to the client
 * (fields_down_drops(): its own Connection names fields too), in order; the proxy sets
 * X-Request-Id itself when 'own_request_id'. Both front ends copy a response head this way. */
void fields_down_each(const struct hlist *h, bool own_request_id,
                      void (*fn)(void *arg, const struct hfield *f), void *arg);

/* Connection, Keep-Alive, Proxy-Connection, TE, Trailer, Transfer-Encoding, Upgrade: they
 * describe one hop (RFC 9110 7.6.1), and go neither up nor down. */
bool fields_hop_by_hop(const char *k, size_t kl);

/* Whether HTTP/2 forbids the field (RFC 9113 8.2.2): Connection, Keep-Alive, Proxy-Connection,
 * Transfer-Encoding, Upgrade, and TE with any value but "trailers". A message that carries one is
 * malformed: the HTTP/2 front end and upstream never send one. */
bool fields_h2_connection_specific(const char *k, size_t kl, const char *v, size_t vl);

/* The ways a name of the table below is left out. */
enum {
    FIELDS_HOP = 1u << 0,     /* hop-by-hop */
    FIELDS_UP = 1u << 1,      /* never goes up */
    FIELDS_DOWN = 1u << 2,    /* never goes down */
    FIELDS_DOWN_ID = 1u << 3, /* never goes down when the proxy sets its own (X-Request-Id) */
    FIELDS_H2 = 1u << 4,      /* connection-specific in HTTP/2, whatever its value */
};

/* The named fields of the filters, for the docs' check: calls fn(arg, name, ways) for each, in
 * no particular order. (The route's deadline header, grpc-timeout and pseudo-headers are the
 * filters' own cases.) */
void fields_each(void (*fn)(void *arg, const char *name, unsigned ways), void *arg);

#endif
