/* live -- per-route state that outlives config snapshots: each route's retry budget, its
 * route-scoped backoff sequence and its upstreams' health (docs/budgets.md, docs/backoff.md,
 * docs/forwarding.md; docs/reload.md: they survive a reload for routes that keep their name,
 * and the health for upstreams that keep their URL). Entries are created when a snapshot is
 * installed, never freed before the registry, so a snapshot's pointers to them stay valid for
 * as long as any request holds it.
 */
#ifndef RETRYPROXY_PROXY_LIVE_H
#define RETRYPROXY_PROXY_LIVE_H

#include <pthread.h>
#include <stdatomic.h>

#include "policy/backoff.h"
#include "policy/budget.h"
#include "policy/health.h"
#include "policy/throttle.h"

struct live_route {
    struct budget budget;
    struct throttle throttle; /* client-side throttling's counts (routes[].throttle) */
    pthread_mutex_t mu;       /* guards 'seq': route-scoped retries are not the hot path */
    struct backoff_seq seq;   /* the route's shared sequence (scope "route") */
};

struct live;

struct live *live_new(void);
void live_free(struct live *l); /* accepts NULL */

/* The state of route 'name' (created on first use with a window of 'window_ms'; an existing
 * one adopts 'window_ms'). Thread-safe; for snapshot installation, not per request. NULL if
 * out of memory. */
struct live_route *live_route(struct live *l, const char *name, uint32_t window_ms);

/* A route-scoped sequence (scope "route") advances only for retries that are taken: the delay
 * is looked at first (the policy, the budgets and the deadline may still refuse the retry),
 * and the sequence moves when the retry goes ahead. */
struct live_backoff_mark {
    struct backoff_seq was, next; /* the sequence when looked at, and after this retry */
};

/* The delay before the next retry of the route's sequence, which does not move yet. */
uint32_t live_route_backoff_peek(struct live_route *lr, const struct backoff_spec *b,
                                 uint64_t now_ms, struct rng *r, struct live_backoff_mark *m);
/* The retry looked at with 'm' is taken: the sequence becomes m->next, or, if another retry
 * moved it meanwhile, one step further from where that one left it. */
void live_route_backoff_take(struct live_route *lr, const struct backoff_spec *b, uint64_t now_ms,
                             struct rng *r, const struct live_backoff_mark *m);

/* One upstream's health on one route (routes[].ejection, policy/health.h). */
struct live_upstream {
    pthread_mutex_t mu; /* guards 'h': taken once per attempt, on routes with ejection on */
    struct health h;
    _Atomic uint64_t until_ms; /* h.ejected_until_ms, read without the mutex to pick upstreams */
};

/* The health of upstream 'url' on route 'name', created on first use; the route's state must
 * exist (live_route()). Thread-safe; for snapshot installation. NULL if out of memory. */
struct live_upstream *live_upstream(struct live *l, const char *name, const char *url);

/* Records an attempt's outcome at 'now_ms' (health_record()). True when it ejected 'u'. */
bool live_upstream_record(struct live_upstream *u, const struct health_spec *s, bool failed,
                          uint64_t now_ms, struct rng *r);

/* Whether 'u' is in rotation at 'now_ms'. No lock. */
static inline bool live_upstream_available(struct live_upstream *u, uint64_t now_ms)
{
    return now_ms >= atomic_load_explicit(&u->until_ms, memory_order_relaxed);
}

/* A consistent copy of 'u's state. */
void live_upstream_read(struct live_upstream *u, struct health *out);

/* Every upstream tracked so far, as metrics_set_upstreams() reads them ('live' is the struct
 * live; "ejected" as of CLOCK_MONOTONIC, the loops' clock). */
struct metrics_upstream;
size_t live_upstream_rows(void *live, struct metrics_upstream **rows);

#endif
