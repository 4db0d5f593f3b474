/* front -- the client side of one request, as the request core (proxy/core/retry.h) sees it: the
 * interface every client protocol implements, so that the core knows none of them (h2o's
 * front ends and request core). proxy/http1/relay.c is the HTTP/1.1 one (libmicrohttpd).
 *
 * In, from a front end to the core (proxy/core/retry.h): a request's head, its body bytes, the
 * body's end, and the client side being done with it (answered, reset, or gone). Out, from
 * the core to the front end (struct front_ops below): the request's fields, then one answer
 * (an error of retryproxy's own, a saved upstream response, or the upstream response head
 * followed by its body and trailers), or a reset; flow control both ways.
 *
 * A front end's per-request state begins with a struct front and lives in the request's own
 * allocation (retry_req_new), freed with the request after ops->fini.
 */
#ifndef RETRYPROXY_PROXY_FRONT_H
#define RETRYPROXY_PROXY_FRONT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/http/hlist.h"

struct answer_tag; /* proxy/http/answer.h */
struct front;
struct retry_req;
struct metrics;
struct metrics_route;
struct tunnel;
struct tunnel_up;
struct rt;

/* front_ops.body(): no room, offer the bytes again after retry_req_room(). */
#define FRONT_FULL ((size_t)-1)

/* What an upgrade's tunnel (docs/upgrades.md) is opened with from the core, besides its two
 * ends: its limits, where it is counted and the names it is seen by. */
struct front_tunnel {
    uint32_t idle_ms;     /* limits.tunnel_idle_timeout_ms (0: none) */
    atomic_uint *count;   /* tunnels open in the process (limits.max_tunnels), kept up to date */
    struct tunnel **open; /* the worker's open tunnels (closed at once when it stops) */
    /* What it is seen by (docs/upgrades.md "Seen by operators"): the route's series and the
     * worker's gauges (NULL: none), and the names its closing log line carries (copied). */
    struct metrics *metrics;
    struct metrics_route *route_metrics;
    unsigned worker;
    const char *route, *request_id;
};

struct front_ops {
    /* Calls fn(arg, name, name length, value, value length) for each request header field. */
    void (*fields)(struct front *f,
                   void (*fn)(void *arg, const char *k, size_t kl, const char *v, size_t vl),
                   void *arg);
    /* An error of retryproxy's own, with its code ("no_route"), the route's name (NULL: none)
     * and a message for people. */
    void (*error)(struct front *f, unsigned status, const char *code, const char *route,
                  const char *message, const struct answer_tag *tag);
    /* A response kept whole: its fields, body and trailers (NULL: none) as they came. */
    void (*saved)(struct front *f, int status, const struct hlist *h, const char *body, size_t len,
                  const struct hlist *trailers, const struct answer_tag *tag);
    /* The upstream response whose head is 'h' (kept by the core until the request ends): its
     * body follows through body() and end(). */
    void (*response)(struct front *f, int status, const struct hlist *h,
                     const struct answer_tag *tag);
    /* An upgrade's 101 (docs/upgrades.md; HTTP/1.1 front ends only), its head 'h' as the
     * upstream sent it: once the client has it, bytes go both ways between the client and 'up'
     * (opened with 'conf'), which is the front end's to free from now on. end() follows. */
    void (*upgrade)(struct front *f, const struct hlist *h, const struct answer_tag *tag,
                    struct tunnel_up *up, const struct front_tunnel *conf);
    /* Body bytes of that response: 'n' taken, FRONT_FULL, or 0 when no client takes them. */
    size_t (*body)(struct front *f, const char *p, size_t n);
    /* The body is complete, with its trailers (NULL: none), or broke off ('failed': the
     * client must see the truncation). */
    void (*end)(struct front *f, const struct hlist *trailers, bool failed);
    /* No answer: the client's request is reset, or its connection closed ('status' is what
     * the log and metrics say). */
    void (*reset)(struct front *f, unsigned status);
    /* The core has not taken all body bytes offered: take no more until upload_room(). */
    void (*wait_upload)(struct front *f);
    void (*upload_room)(struct front *f);
    /* Look out for the client going away while nothing else would notice (a backoff wait):
     * retry_req_client_gone() when it does. (HTTP/1.1 watches every connection for its whole
     * life, and calls it whenever a request is in flight: proxy/http1/relay.h.) */
    void (*watch)(struct front *f);
    void (*unwatch)(struct front *f);
    /* NULL but for a stored request being delivered (proxy/delivery/courier.c): the snapshot
     * it runs under (borrowed: the courier holds it while the request lives; NULL: the
     * worker's) and in *route the name of the route it goes to, whatever its head would match.
     * Such a request makes one attempt (the courier schedules the next one), retryable
     * whatever its method (every attempt carries the delivery's id: docs/delivery.md). */
    struct rt *(*delivery)(struct front *f, const char **route);
    /* NULL but for a stored request: called once the attempt's upstream (the index of the
     * route's upstreams) is picked, before anything is sent. False: that upstream has
     * routes[].delivery.max_in_flight_per_upstream of the route's deliveries in flight, so no
     * attempt is made and the answer is an error "upstream_busy" (docs/delivery.md). */
    bool (*attempting)(struct front *f, size_t upstream);
    /* The request is freed: let go of what the front end's state holds. */
    void (*fini)(struct front *f);
};

/* Client protocols, for the metrics and logs. */
enum front_proto { FRONT_HTTP1, FRONT_HTTP2 };

struct front {
    const struct front_ops *ops;
    struct retry_req *req; /* the core's */
    enum front_proto proto;
    unsigned status; /* the answer's (or the reset's), for the log and metrics */
    bool answered;   /* an answer or a reset is made (set by the front end) */
    bool sent;       /* ... and handed to the protocol: the log shows its status */
    bool is_head;    /* a HEAD request: a length comes back, never a body (set by the core) */
    bool grpc;       /* a gRPC call: errors of retryproxy's own are gRPC statuses (docs/grpc.md;
                      * set by the core, or by a front end that saw the content type of a head
                      * it refused) */
    /* Its connection's share of the upstream slots (an HTTP/2 stream's, while its connection
     * is open; proxy/upstream/share.h), or NULL. */
    struct share *share;
    /* Response body bytes handed to the client's protocol (the log), counted by the front end. */
    uint64_t body_sent;
};

#endif
