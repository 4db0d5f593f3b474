/* metrics_int -- the registry's own types (proxy/telemetry/metrics.h), shared by metrics.c (the
 * registry and the hot path) and metrics_text.c (the text exposition and the reference).
 * Nothing else includes it.
 */
#ifndef RETRYPROXY_PROXY_METRICS_INT_H
#define RETRYPROXY_PROXY_METRICS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policy/budget.h"
#include "proxy/telemetry/metrics.h"
#include "proxy/base/strmap.h"

#define CACHE_LINE 64
#define CODE_MIN   100
#define CODE_MAX   599
#define CODE_COUNT (CODE_MAX - CODE_MIN + 1)
/* The last reason slot collects tokens beyond the first METRICS_MAX_REASONS-1 distinct ones. */
#define REASON_OTHER (METRICS_MAX_REASONS - 1)
/* 18 finite upper bounds plus the +Inf bucket. */
#define HIST_BOUNDS  18
#define HIST_BUCKETS (HIST_BOUNDS + 1)
/* Sums are kept in integer microseconds; clamp one observation so the conversion stays defined
 * (a billion seconds is already nonsense for a request). */
#define HIST_MAX_SECONDS 1e9

struct hist_slot {
    /* Non-cumulative per bucket; the scrape accumulates them, and _count is their total so that
     * _count always equals the +Inf bucket in one exposition. */
    _Atomic uint64_t buckets[HIST_BUCKETS];
    _Atomic uint64_t sum_us;
};

/* One worker's share of one route's series. Aligning the struct aligns its size too, so slot
 * w+1 starts on a fresh cache line. */
struct route_slot {
    _Alignas(CACHE_LINE) _Atomic uint64_t codes[CODE_COUNT];
    _Atomic uint64_t retries[METRICS_MAX_REASONS];
    _Atomic uint64_t retry_success;
    _Atomic uint64_t denied[METRICS_DENIED_COUNT];
    _Atomic uint64_t retry_after_honored;
    _Atomic uint64_t throttled;
    _Atomic uint64_t hedges;
    _Atomic uint64_t client_gone;
    _Atomic uint64_t protocol[METRICS_PROTO_COUNT];
    _Atomic uint64_t grpc[METRICS_GRPC_COUNT];
    _Atomic uint64_t upgrades[METRICS_UPGRADE_COUNT];
    _Atomic uint64_t tunnel_bytes[2]; /* from the client, from the upstream */
    _Atomic uint64_t accepts[METRICS_ACCEPT_COUNT];
    _Atomic uint64_t deliveries[METRICS_DELIVERY_COUNT];
    _Atomic uint64_t dead[METRICS_DEAD_COUNT];
    _Atomic uint64_t discarded[METRICS_DEAD_COUNT];
    _Atomic uint64_t dead_refused;
    struct hist_slot hist[METRICS_HIST_COUNT];
};

_Static_assert(sizeof(struct route_slot) % CACHE_LINE == 0, "route slots share cache lines");

/* One worker's share of one upstream's series on one route, aligned as route_slot. */
struct target_slot {
    _Alignas(CACHE_LINE) _Atomic uint64_t attempts[METRICS_OUT_COUNT];
    struct hist_slot hist; /* attempt_duration_seconds */
};

struct metrics_target {
    char *url;
    unsigned nslots;
    struct target_slot *slots; /* one per worker, as the route's */
};

/* Process-wide per-worker gauges, kept apart from the route slots for the same reason. */
struct worker_slot {
    _Alignas(CACHE_LINE) _Atomic int64_t connections;
    _Atomic int64_t tunnels;
    _Atomic int64_t upstream_waiting;
    _Atomic uint64_t limit_reached;
    struct metrics_h2up h2up; /* the worker's HTTP/2 upstream connections */
};

struct metrics_route {
    struct metrics *m;
    char *name;
    unsigned nslots;
    struct route_slot *slots;
    /* Under m->lock: names of reason slots 0 .. nreasons-1, and whether a token was sent to
     * the overflow slot. */
    char *reasons[REASON_OTHER];
    unsigned nreasons;
    bool other_used;
    /* Under m->lock: the route's budget in the config last installed, once there was one. */
    bool has_budget;
    struct budget_limits budget;
    /* Under m->lock: its upstreams' series, sorted by URL (the order a scrape prints them). */
    struct metrics_target **targets;
    size_t ntargets, tcap;
};

struct metrics {
    unsigned workers;
    struct worker_slot *wslots;
    /* Has no worker to own a slot (a retry may end on a timer), so this one is a shared atomic;
     * retries are rare next to requests, so the locked add is affordable. */
    _Atomic int64_t retries_in_flight;

    pthread_mutex_t lock;
    /* In the order they were added; found by name through 'by_name', sorted by name before a
     * scrape prints them ('unsorted' says one was added since). */
    struct metrics_route **routes;
    size_t nroutes, cap;
    struct strmap by_name;
    bool unsorted;
    uint64_t reloads_ok, reloads_failed, generation;
    double last_success;
    bool last_ok;  /* the last load succeeded */
    bool draining; /* for good, once set */
    bool has_budget;
    struct budget_limits budget; /* the process-wide one, once installed */
    bool has_limits;
    uint64_t limits[METRICS_LIMIT_COUNT];   /* the ones installed last, once there were some */
    const atomic_uint_fast64_t *body_bytes; /* set once at start; NULL: not shown */
    /* Set once at start: the upstreams' health rows (metrics_set_upstreams()). */
    size_t (*upstreams_fn)(void *arg, struct metrics_upstream **rows);
    void *upstreams_arg;
    /* Set once at start: the store's view (metrics_set_store()), its commits' histogram. */
    bool (*store_fn)(void *arg, struct metrics_store_view *v);
    void *store_arg;
    struct hist_slot store_commit;
    /* Under lock: the host names' series, in the order they were added. */
    struct metrics_name **names;
    size_t nnames, capnames;
};

/* One host name's lookups (metrics_dns_name()): written by the resolver's thread only. */
struct metrics_name {
    char *name;
    _Atomic uint64_t results[METRICS_DNS_COUNT];
    atomic_bool stale;
};

/* The totals of one route at scrape time. */
struct route_totals {
    uint64_t codes[CODE_COUNT];
    uint64_t retries[METRICS_MAX_REASONS];
    uint64_t retry_success;
    uint64_t denied[METRICS_DENIED_COUNT];
    uint64_t retry_after_honored;
    uint64_t throttled;
    uint64_t hedges;
    uint64_t client_gone;
    uint64_t protocol[METRICS_PROTO_COUNT];
    uint64_t upgrades[METRICS_UPGRADE_COUNT];
    uint64_t tunnel_bytes[2];
    uint64_t grpc[METRICS_GRPC_COUNT];
    uint64_t accepts[METRICS_ACCEPT_COUNT];
    uint64_t deliveries[METRICS_DELIVERY_COUNT];
    uint64_t dead[METRICS_DEAD_COUNT];
    uint64_t discarded[METRICS_DEAD_COUNT];
    uint64_t dead_refused;
    uint64_t buckets[METRICS_HIST_COUNT][HIST_BUCKETS];
    uint64_t sum_us[METRICS_HIST_COUNT];
    bool any; /* some count is non-zero */
};

/* Single-writer increment: only the owning worker stores to this counter, so load+store cannot
 * lose an update, and the atomics keep concurrent scrapes free of torn reads. */
static inline void bump(_Atomic uint64_t *c, uint64_t n)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

static inline uint64_t peek(const _Atomic uint64_t *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

#endif
