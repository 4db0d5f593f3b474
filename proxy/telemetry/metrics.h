/* metrics -- Prometheus counters, gauges and histograms (docs/metrics.md), cheap on the hot path.
 *
 * Every per-route series has one slot per worker. A worker only ever writes its own slot, with
 * relaxed atomic loads and stores (no lock, no contended read-modify-write); a scrape sums the
 * slots. Series are keyed by route name and live as long as the registry, so counters keep
 * counting across reloads for routes that keep their names. Creating a series or a reason
 * label takes a mutex and happens when a config snapshot is installed, never per request.
 */
#ifndef RETRYPROXY_PROXY_METRICS_H
#define RETRYPROXY_PROXY_METRICS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* attempts_total{outcome} */
enum metrics_outcome {
    METRICS_OUT_1XX,
    METRICS_OUT_2XX,
    METRICS_OUT_3XX,
    METRICS_OUT_4XX,
    METRICS_OUT_5XX,
    METRICS_OUT_CONNECT_FAILURE,
    METRICS_OUT_RESET,
    METRICS_OUT_TIMEOUT,
    METRICS_OUT_CANCELLED, /* ended for the request before its own outcome: another answered */
    METRICS_OUT_COUNT
};

/* A route's histograms, in seconds: backoff_seconds, request_duration_seconds (an upstream's
 * attempt_duration_seconds goes with metrics_attempt()). */
enum metrics_hist { METRICS_HIST_BACKOFF, METRICS_HIST_REQUEST, METRICS_HIST_COUNT };

/* retries_denied_total{reason}: the X-Retry-Stop values, in this order. */
enum metrics_denied {
    METRICS_DENIED_MAX_ATTEMPTS,
    METRICS_DENIED_BUDGET,
    METRICS_DENIED_CONCURRENCY,
    METRICS_DENIED_DEADLINE,
    METRICS_DENIED_RETRY_AFTER,
    METRICS_DENIED_NOT_RETRYABLE,
    METRICS_DENIED_BODY_TOO_LARGE,
    METRICS_DENIED_DRAINING,
    METRICS_DENIED_PUSHBACK,
    METRICS_DENIED_THROTTLED,
    METRICS_DENIED_COUNT
};

/* Durable routes (docs/delivery.md). delivery_accepts_total{result}: what a durable route's
 * request was answered (202 new or duplicate, 422, 503 full, 413, 503 other). */
enum metrics_accept {
    METRICS_ACCEPT_ACCEPTED,
    METRICS_ACCEPT_DUPLICATE,
    METRICS_ACCEPT_CONFLICT,
    METRICS_ACCEPT_FULL,
    METRICS_ACCEPT_TOO_LARGE,
    METRICS_ACCEPT_ERROR,
    METRICS_ACCEPT_COUNT
};
/* delivery_attempts_total{outcome}: what an attempt of a delivery made of it. */
enum metrics_delivery {
    METRICS_DELIVERY_DELIVERED,
    METRICS_DELIVERY_RESCHEDULED,
    METRICS_DELIVERY_DEAD,
    METRICS_DELIVERY_INTERRUPTED, /* cut by the drain's deadline: its lease given back */
    METRICS_DELIVERY_COUNT
};
/* dead_letters_total{reason} */
enum metrics_dead {
    METRICS_DEAD_ATTEMPTS,
    METRICS_DEAD_AGE,
    METRICS_DEAD_FINAL,
    METRICS_DEAD_ROUTE_GONE,
    METRICS_DEAD_REFUSED, /* a synchronous route's, its retries refused (budget, deadline...) */
    METRICS_DEAD_COUNT
};

/* Distinct retry_on tokens counted per route (retries_total{reason}); more share "other". */
#define METRICS_MAX_REASONS 32

struct metrics;        /* the registry */
struct metrics_route;  /* the series of one route name */
struct metrics_target; /* the series of one upstream URL of one route */
struct budget_limits;  /* policy/budget.h */

/* A registry for 'workers' worker threads (slots 0 .. workers-1). NULL if out of memory. */
struct metrics *metrics_new(unsigned workers);
void metrics_free(struct metrics *m); /* accepts NULL */

/* The series of route 'name', created on first use; always the same pointer for the same name.
 * The empty name "" is for requests that matched no route. Thread-safe (mutex). NULL only if
 * out of memory. */
struct metrics_route *metrics_route(struct metrics *m, const char *name);

/* The label slot of retry_on token 'token' in 'r' (created on first use), for metrics_retry().
 * Thread-safe (mutex). */
unsigned metrics_reason(struct metrics_route *r, const char *token);

/* The series of upstream 'url' (as written in the config) on route 'r', created on first use;
 * always the same pointer for the same pair, kept for the life of the registry like the
 * route's. Thread-safe (mutex); for snapshot installation, never per request. NULL only if out
 * of memory or 'r' is NULL. */
struct metrics_target *metrics_target(struct metrics_route *r, const char *url);

/* ---- the hot path: 'w' is the calling worker's slot; 'r' may be NULL (then nothing) ---- */

/* requests_total{route, code}: the final status sent to the client (100 to 599; others are
 * counted as 0 and not rendered). */
void metrics_request(struct metrics_route *r, unsigned w, int code);
/* attempts_total{route, upstream, outcome} and attempt_duration_seconds{route, upstream}: an
 * attempt on upstream 't' ended in 'o' after 'seconds'. */
void metrics_attempt(struct metrics_target *t, unsigned w, enum metrics_outcome o, double seconds);
/* The word of outcome 'o', as attempts_total{outcome} says it. */
const char *metrics_outcome_name(enum metrics_outcome o);

/* upgrades_total{route, outcome}: an upgrade the route tunnels, answered with a 101 (a tunnel)
 * or not (the upstream, or retryproxy itself, answered otherwise). */
enum metrics_upgrade { METRICS_UPGRADE_TUNNELLED, METRICS_UPGRADE_REFUSED, METRICS_UPGRADE_COUNT };
void metrics_upgrade(struct metrics_route *r, unsigned w, enum metrics_upgrade o);
/* tunnel_bytes_total{route, direction}: bytes a tunnel carried, counted as they go. */
void metrics_tunnel_bytes(struct metrics_route *r, unsigned w, uint64_t from_client,
                          uint64_t from_upstream);
/* The client protocol of a request answered (requests_by_protocol_total). */
enum metrics_proto { METRICS_HTTP1, METRICS_HTTP2, METRICS_PROTO_COUNT };
void metrics_protocol(struct metrics_route *r, unsigned w, enum metrics_proto p);

/* The status a gRPC call ended with (grpc_responses_total): 0 to 16 by number, any other as
 * "other", -1 (none: the call ended without one) as "none". */
#define METRICS_GRPC_OTHER 17
#define METRICS_GRPC_NONE  18
#define METRICS_GRPC_COUNT 19
void metrics_grpc(struct metrics_route *r, unsigned w, int status);
/* retries_total{route, reason} */
void metrics_retry(struct metrics_route *r, unsigned w, unsigned reason);
/* retry_success_total{route}: a request that succeeded after at least one retry */
void metrics_retry_success(struct metrics_route *r, unsigned w);
/* retries_denied_total{route, reason} */
void metrics_denied(struct metrics_route *r, unsigned w, enum metrics_denied reason);
/* delivery_accepts_total{route, result}, delivery_attempts_total{route, outcome},
 * dead_letters_total{route, reason} */
void metrics_delivery_accept(struct metrics_route *r, unsigned w, enum metrics_accept a);
void metrics_delivery_attempt(struct metrics_route *r, unsigned w, enum metrics_delivery o);
void metrics_dead_letter(struct metrics_route *r, unsigned w, enum metrics_dead why);
/* deliveries_discarded_total{route, reason}: one a route with dead_letter false did not keep */
void metrics_discarded(struct metrics_route *r, unsigned w, enum metrics_dead why);
/* dead_letters_refused_total{route}: a dead letter the store did not keep (full, failing) */
void metrics_dead_refused(struct metrics_route *r, unsigned w);
/* throttled_total{route}: an attempt client-side throttling rejected */
void metrics_throttled(struct metrics_route *r, unsigned w);
/* hedges_total{route}: an attempt started while an earlier one of its request runs on */
void metrics_hedge(struct metrics_route *r, unsigned w);
/* client_gone_total{route}: a request whose client went away before its answer started, or
 * while its body was still coming from the upstream */
void metrics_client_gone(struct metrics_route *r, unsigned w);
/* retry_after_honored_total{route} */
void metrics_retry_after_honored(struct metrics_route *r, unsigned w);
/* One observation of 'seconds' into histogram 'h' of route 'r'. */
void metrics_observe(struct metrics_route *r, unsigned w, enum metrics_hist h, double seconds);

/* ---- process-wide series ---- */

/* retries_in_flight: +1 when a retry is decided, -1 when its attempt ends (waits included). */
void metrics_retries_in_flight_add(struct metrics *m, int delta);
int64_t metrics_retries_in_flight(const struct metrics *m);
/* connections_active: per worker, summed at scrape. */
void metrics_connections_add(struct metrics *m, unsigned w, int delta);
/* tunnels_open: per worker, summed at scrape. */
void metrics_tunnels_add(struct metrics *m, unsigned w, int delta);
/* upstream_h2_connections and upstream_h2_connections_total{result}: worker 'w''s counts, which
 * its HTTP/2 upstream pool keeps (proxy/upstream/h2up.h): written by its worker only, read by a
 * scrape from another thread; NULL without metrics. */
enum metrics_h2up_opened {
    METRICS_H2UP_H2,     /* the connection carries HTTP/2 (h2c, or h2 chosen by ALPN) */
    METRICS_H2UP_HTTP1,  /* an https server chose http/1.1: its requests went to libcurl */
    METRICS_H2UP_FAILED, /* no connection: TCP, TLS, the certificate, "required" without h2 */
    METRICS_H2UP_COUNT
};
struct metrics_h2up {
    _Atomic int64_t open;                       /* connections open now */
    _Atomic int64_t opened[METRICS_H2UP_COUNT]; /* connections tried, by how they went */
};
struct metrics_h2up *metrics_h2up_counts(struct metrics *m, unsigned w);
/* upstream_requests_waiting: worker 'w''s count of attempts waiting for an upstream transfer
 * slot (limits.max_upstream_requests and its shares), which its upstream keeps
 * (slots_count_waits()); NULL without metrics. */
_Atomic int64_t *metrics_upstream_waiting(struct metrics *m, unsigned w);
/* connections_limit_reached_total: worker 'w' stopped accepting, its share of
 * limits.max_connections being open. */
void metrics_connections_limited(struct metrics *m, unsigned w);
/* buffered_body_bytes: read from '*bytes' at each scrape. Set once at start. */
void metrics_set_body_bytes(struct metrics *m, const atomic_uint_fast64_t *bytes);
/* limit{limit}: the limits.* settings in effect, set for every snapshot published (nothing is
 * shown before the first); METRICS_LIMIT_KEEP leaves that limit as it was. Thread-safe (mutex). */
enum metrics_limit {
    METRICS_LIMIT_CONNECTIONS,
    METRICS_LIMIT_UPSTREAM_REQUESTS,
    METRICS_LIMIT_BUFFERED_BODY_BYTES,
    METRICS_LIMIT_COUNT
};
#define METRICS_LIMIT_KEEP UINT64_MAX
void metrics_limits(struct metrics *m, const uint64_t limits[METRICS_LIMIT_COUNT]);
/* config_reloads_total{result}, config_generation, config_last_reload_successful (1 after a
 * success, 0 after a failure; 0 before the first load) and, on success,
 * config_last_reload_success_timestamp_seconds ('unix_seconds'). The initial load counts as a
 * successful reload. */
void metrics_reload(struct metrics *m, bool ok, uint64_t generation, double unix_seconds);
/* draining: 0, then 1 for good once the process starts draining (SIGTERM or SIGINT). */
void metrics_set_draining(struct metrics *m);

/* budget_retry_ratio, budget_min_retries_per_second and budget_max_concurrent_retries (+Inf
 * for no cap): the settings of the config just installed, set for every snapshot published.
 * The process-wide budget shows as {scope="process"}, a route's as {route, scope="route"}
 * from its first setting on; like the route's other series it keeps its last values when a
 * reload drops the route. Nothing is shown before the first setting. Thread-safe (mutex). */
void metrics_process_budget(struct metrics *m, const struct budget_limits *l);
void metrics_route_budget(struct metrics_route *r, const struct budget_limits *l);

/* upstream_endpoint_failure_ratio{route, upstream, endpoint} shows at most this many endpoints
 * of an upstream, the worst, and only those whose failure ratio is at least
 * METRICS_FAILING_RATIO (docs/metrics.md): a bounded set of series, whatever the pods. */
#define METRICS_WORST_ENDPOINTS 3
#define METRICS_FAILING_RATIO   0.1

/* upstream_ejections_total and upstream_ejected{route, upstream}: one row per upstream of a
 * route that has had ejection on (docs/forwarding.md), as its health is at the scrape. */
struct metrics_upstream {
    const char *route, *url; /* borrowed from the source, which never frees them */
    bool ejection;           /* the route's ejection is on: the ejection families have it */
    uint64_t ejections;      /* of all its endpoints, ever */
    unsigned endpoints[3];   /* its endpoints now: healthy, ejected, leaving */
    unsigned n_worst;        /* its worst endpoints, the worst first */
    struct metrics_worst {
        char ip[48]; /* the address, without the URL's port */
        double failure_ratio;
    } worst[METRICS_WORST_ENDPOINTS];
};
/* Where a scrape reads those rows: fn(arg, &rows) returns how many, in a malloc'd array the
 * scrape frees (0 and NULL: none, or out of memory). Called without the registry's lock. Set
 * once at start, before the first scrape. */
void metrics_set_upstreams(struct metrics *m,
                           size_t (*fn)(void *arg, struct metrics_upstream **rows), void *arg);

/* dns_resolutions_total{name, result} and dns_stale{name}: the lookups of one upstream host
 * name (proxy/dns/), its series created on first use and kept for the registry's life like a
 * route's. Creating takes the mutex; the counts are the resolver's alone (the control thread).
 * NULL series: nothing. */
enum metrics_dns { METRICS_DNS_OK, METRICS_DNS_NXDOMAIN, METRICS_DNS_FAILURE, METRICS_DNS_COUNT };
struct metrics_name;
struct metrics_name *metrics_dns_name(struct metrics *m, const char *name);
void metrics_dns_result(struct metrics_name *n, enum metrics_dns r);
/* 1 while the name runs on addresses kept after a failed lookup. */
void metrics_dns_stale(struct metrics_name *n, bool stale);

/* The durable deliveries' store (docs/delivery.md): deliveries{route, state},
 * delivery_oldest_seconds{route}, store_bytes, store_rows, store_up, store_disconnects_total,
 * read at each scrape from what
 * fn(arg, &view) fills (borrowed until the scrape ends; false: no store, no series), called
 * without the registry's lock from the scraping thread. Set once at start. */
struct metrics_delivery_row {
    const char *route;
    uint64_t n[4];         /* scheduled, in_flight, delivered, dead */
    double oldest_seconds; /* the oldest pending one's age; < 0: none pending */
};
struct metrics_store_view {
    const struct metrics_delivery_row *rows;
    size_t n;
    uint64_t bytes, rows_total;
    bool up;              /* store_up: false while the shared store's database is lost */
    uint64_t disconnects; /* store_disconnects_total */
};
void metrics_set_store(struct metrics *m, bool (*fn)(void *arg, struct metrics_store_view *v),
                       void *arg);
/* store_commit_seconds: one commit of the store took 'seconds'. Any thread (the store's). */
void metrics_store_commit(struct metrics *m, double seconds);

/* The whole exposition in Prometheus text format 0.0.4: every family with # HELP and # TYPE,
 * names prefixed retryproxy_, series sorted by route name, label values escaped. Returns a
 * malloc'd NUL-terminated buffer (length in *len), or NULL if out of memory. */
char *metrics_render(struct metrics *m, size_t *len);

/* The Markdown table of every family (name, type, labels with their fixed values, help) and
 * the histogram buckets, from the same table the exposition's # HELP and # TYPE lines come
 * from: what `retryproxy reference --metrics` prints and docs/metrics.md holds. */
void metrics_write_reference(FILE *out);

#endif
