/* live -- per-route state that outlives config snapshots: each route's retry budget, its
 * route-scoped backoff sequence and its upstreams' health (docs/budgets.md, docs/backoff.md,
 * docs/endpoints.md; docs/reload.md: they survive a reload for routes that keep their name,
 * and the endpoints' health for upstreams that keep their URL). Entries are created when a snapshot
 * is installed, never freed before the registry, so a snapshot's pointers to them stay valid for as
 * long as any request holds it.
 */
#ifndef RETRYPROXY_PROXY_LIVE_H
#define RETRYPROXY_PROXY_LIVE_H

#include <pthread.h>
#include <stdatomic.h>

#include "policy/backoff.h"
#include "policy/budget.h"
#include "policy/health.h"
#include "policy/throttle.h"
#include "proxy/dns/resolve.h"

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

/* An upstream's endpoints (docs/endpoints.md): one slot per address its name resolves to, as
 * many as it has (no cap: the resolver keeps what a DNS answer holds). A slot keeps its address
 * while the address stays in the record, and while attempts or connections still use it after it
 * left (it is then "leaving"); an address that joins takes a free slot, or one whose address left
 * and is no longer used. Health belongs to the pod, not the address: when the address leaves,
 * the slot's health is cleared and its epoch moves, so the same address coming back (a new pod
 * on a reused IP) starts healthy. A slot is never freed before the registry, so the workers'
 * pointers to it stay valid; its epoch tells a worker holding it for an address it has since
 * left or been given away from. */

struct live_endpoint {
    pthread_mutex_t mu; /* guards 'h': taken once per attempt, on routes with ejection on */
    struct health h;
    _Atomic uint64_t until_ms; /* h.ejected_until_ms, read without the mutex to pick */
    _Atomic int64_t in_flight; /* attempts on it now, every worker's: least_request reads it */
    _Atomic int64_t conns;     /* connections open to it now (the transports count them) */
    _Atomic uint32_t epoch;    /* moves when its address leaves (and so before the slot is
                                  given to another) */
    /* under the upstream's mutex */
    bool used;    /* holds 'addr' */
    bool present; /* 'addr' is in the name's last record */
    bool seen;    /* live_upstream_sync(): 'addr' is in the record being synced */
    struct dns_addr addr;
};

/* One upstream of one route (routes[].upstreams, kept by URL across reloads): its endpoints.
 * The table of slots grows as addresses join; it holds pointers, so a slot never moves when it
 * grows and a worker's pointer to one stays valid. Only the table's readers under 'mu' (the
 * admin view, the metrics, a sync) see the table itself. */
struct live_upstream {
    pthread_mutex_t mu;      /* guards the table and the slots' addresses */
    atomic_bool ejection;    /* the route's ejection is on, as the last snapshot says */
    uint64_t ejections_gone; /* ejections of addresses whose slots went to others */
    size_t n, cap;           /* slots made so far, and room in 'ep' */
    struct live_endpoint **ep;
};

/* The upstream 'url' on route 'name', created on first use; the route's state must exist
 * (live_route()). Thread-safe; for snapshot installation. NULL if out of memory. */
struct live_upstream *live_upstream(struct live *l, const char *name, const char *url);

/* The 'n' addresses (distinct, as a name's set is) of the upstream name's current record each
 * get their slot, in out[i]
 * (NULL out of memory); the other slots' addresses are leaving. O((n + slots) log slots).
 * Thread-safe; when a worker sees the record change, not per request. */
void live_upstream_sync(struct live_upstream *u, const struct dns_addr *a, size_t n,
                        struct live_endpoint **out);

/* Records an attempt's outcome on 'e' at 'now_ms' (health_record()), unless the slot went to
 * another address since 'epoch'. True when it ejected 'e'. */
bool live_endpoint_record(struct live_endpoint *e, uint32_t epoch, const struct health_spec *s,
                          bool failed, uint64_t now_ms, struct rng *r);

/* Whether 'e' is in rotation at 'now_ms'. No lock. */
static inline bool live_endpoint_available(struct live_endpoint *e, uint64_t now_ms)
{
    return now_ms >= atomic_load_explicit(&e->until_ms, memory_order_relaxed);
}

/* A consistent copy of 'e's health. */
void live_endpoint_read(struct live_endpoint *e, struct health *out);

/* What the admin view and the metrics show of an endpoint. */
enum live_ep_state { LIVE_EP_HEALTHY, LIVE_EP_EJECTED, LIVE_EP_LEAVING, LIVE_EP_STATES };
struct live_ep_row {
    struct dns_addr addr;
    enum live_ep_state state;
    int64_t in_flight, conns;
    struct health h;
};
/* The upstream's endpoints now (in the record, or leaving while still used), at most 'max',
 * in slot order, as of 'now_ms'. Returns how many. Thread-safe. */
size_t live_upstream_endpoints(struct live_upstream *u, uint64_t now_ms, struct live_ep_row *out,
                               size_t max);
/* The same, all of them, in a new array in *out (free() it; NULL when there are none, or out
 * of memory: then 0). */
size_t live_upstream_endpoints_all(struct live_upstream *u, uint64_t now_ms,
                                   struct live_ep_row **out);

/* Every upstream tracked so far, as metrics_set_upstreams() reads them ('live' is the struct
 * live; "ejected" as of CLOCK_MONOTONIC, the loops' clock). */
struct metrics_upstream;
size_t live_upstream_rows(void *live, struct metrics_upstream **rows);

#endif
