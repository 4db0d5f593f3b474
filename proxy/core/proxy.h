/* proxy -- what the whole process shares: the snapshot being served, the metrics registry, the
 * process-wide retry budget, per-route live state, and whether (until when) it is draining.
 * Created by serve.c, read by every worker. */
#ifndef RETRYPROXY_PROXY_PROXY_H
#define RETRYPROXY_PROXY_PROXY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "policy/budget.h"
#include "proxy/core/live.h"
#include "proxy/telemetry/metrics.h"
#include "proxy/core/runtime.h"

struct dns;   /* proxy/dns/resolve.h */
struct store; /* proxy/store/store.h */

struct proxy {
    struct rt_cell cell;
    struct metrics *metrics;
    struct budget budget; /* the top-level "budget": every retry passes it */
    struct live *live;    /* per-route budgets and route-scoped backoff, by route name */
    struct dns *dns;      /* the upstreams' names (control thread; NULL in some tests) */
    struct store *store;  /* durable deliveries and dead letters (NULL: no store.path) */
    atomic_bool draining;
    /* Loop-clock ms at which requests still waiting are answered (0: not draining). */
    atomic_uint_fast64_t drain_deadline_ms;
    /* Request-body bytes held for replay by every worker, against
     * limits.max_buffered_body_bytes. */
    atomic_uint_fast64_t body_bytes;
    /* Upgraded connections open in every worker, against limits.max_tunnels. */
    atomic_uint tunnels;
    unsigned n_workers;
    uint32_t head_max; /* limits.max_header_bytes as started with (read at start only) */
};

#endif
