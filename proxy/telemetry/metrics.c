/* metrics -- the registry behind proxy/telemetry/metrics.h (docs/metrics.md).
 *
 * Layout: every route owns an array of per-worker slots, each slot a cache-line-aligned block of
 * 64-bit counters. Worker w is the only writer of slot w, so an increment is a relaxed load
 * followed by a relaxed store: no lock prefix and no cache line shared with another writer. A
 * scrape reads every slot with relaxed loads and sums them; each counter is a single atomic
 * object, so a reader sees whole values that never go backwards, which is all a monotone counter
 * needs. The registry mutex guards only the route list, reason names and reload state, which
 * change at config install time and are read by scrapes, never by the request path.
 */
#include "proxy/telemetry/metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/telemetry/metrics_int.h"

/* From 0.1 ms: a loopback sidecar's attempts take well under a millisecond. */
static const double hist_bounds[HIST_BOUNDS] = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                 0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                                 1,      2.5,     5,      10,    30,     60 };

static void *alloc_lines(size_t n, size_t size)
{
    if (n == 0 || size > SIZE_MAX / n)
        return NULL;
    void *p = aligned_alloc(CACHE_LINE, n * size);
    /* All-zero bytes are a valid zero for the lock-free 64-bit atomics used here. */
    if (p)
        memset(p, 0, n * size);
    return p;
}

struct metrics *metrics_new(unsigned workers)
{
    struct metrics *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    /* A registry without slots could count nothing; treat 0 as a single worker. */
    m->workers = workers ? workers : 1;
    m->wslots = alloc_lines(m->workers, sizeof(struct worker_slot));
    if (!m->wslots || pthread_mutex_init(&m->lock, NULL) != 0) {
        free(m->wslots);
        free(m);
        return NULL;
    }
    atomic_init(&m->retries_in_flight, 0);
    return m;
}

static void target_free(struct metrics_target *t)
{
    if (!t)
        return;
    free(t->slots);
    free(t->url);
    free(t);
}

static void route_free(struct metrics_route *r)
{
    if (!r)
        return;
    for (unsigned i = 0; i < r->nreasons; i++)
        free(r->reasons[i]);
    for (size_t i = 0; i < r->ntargets; i++)
        target_free(r->targets[i]);
    free(r->targets);
    free(r->slots);
    free(r->name);
    free(r);
}

void metrics_free(struct metrics *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nroutes; i++)
        route_free(m->routes[i]);
    free(m->routes);
    for (size_t i = 0; i < m->nnames; i++) {
        free(m->names[i]->name);
        free(m->names[i]);
    }
    free(m->names);
    strmap_free(&m->by_name);
    free(m->wslots);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static struct metrics_route *route_new(struct metrics *m, const char *name)
{
    struct metrics_route *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->m = m;
    r->nslots = m->workers;
    r->name = strdup(name);
    r->slots = alloc_lines(m->workers, sizeof(struct route_slot));
    if (!r->name || !r->slots) {
        route_free(r);
        return NULL;
    }
    return r;
}

struct metrics_route *metrics_route(struct metrics *m, const char *name)
{
    if (!m || !name)
        return NULL;
    pthread_mutex_lock(&m->lock);
    struct metrics_route *r = strmap_get(&m->by_name, name);
    if (r)
        goto out;
    if (m->nroutes == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 8;
        struct metrics_route **grown = realloc(m->routes, cap * sizeof(*grown));
        if (!grown)
            goto out;
        m->routes = grown;
        m->cap = cap;
    }
    r = route_new(m, name);
    if (!r)
        goto out;
    if (strmap_put(&m->by_name, r->name, r) < 0) {
        route_free(r);
        r = NULL;
        goto out;
    }
    m->routes[m->nroutes++] = r;
    m->unsorted = true;
out:
    pthread_mutex_unlock(&m->lock);
    return r;
}

unsigned metrics_reason(struct metrics_route *r, const char *token)
{
    if (!r)
        return REASON_OTHER;
    unsigned idx = REASON_OTHER;
    pthread_mutex_lock(&r->m->lock);
    /* A literal "other" token goes to the overflow slot too, or two series would carry
     * reason="other". */
    if (token && strcmp(token, "other") != 0) {
        for (unsigned i = 0; i < r->nreasons && idx == REASON_OTHER; i++) {
            if (strcmp(r->reasons[i], token) == 0)
                idx = i;
        }
        if (idx == REASON_OTHER && r->nreasons < REASON_OTHER) {
            char *copy = strdup(token);
            if (copy) {
                idx = r->nreasons;
                r->reasons[r->nreasons++] = copy;
            }
        }
    }
    /* Out of slots (or memory), or "other" itself: counted, under "other". */
    if (idx == REASON_OTHER)
        r->other_used = true;
    pthread_mutex_unlock(&r->m->lock);
    return idx;
}

struct metrics_target *metrics_target(struct metrics_route *r, const char *url)
{
    if (!r || !url)
        return NULL;
    pthread_mutex_lock(&r->m->lock);
    /* kept sorted by URL: found by bisection, printed in order */
    size_t lo = 0, hi = r->ntargets;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(r->targets[mid]->url, url) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    struct metrics_target *t = NULL;
    if (lo < r->ntargets && strcmp(r->targets[lo]->url, url) == 0) {
        t = r->targets[lo];
        goto out;
    }
    if (r->ntargets == r->tcap) {
        size_t cap = r->tcap ? r->tcap * 2 : 4;
        struct metrics_target **grown = realloc(r->targets, cap * sizeof(*grown));
        if (!grown)
            goto out;
        r->targets = grown;
        r->tcap = cap;
    }
    t = calloc(1, sizeof(*t));
    if (t) {
        t->url = strdup(url);
        t->nslots = r->nslots;
        t->slots = alloc_lines(r->nslots, sizeof(struct target_slot));
    }
    if (!t || !t->url || !t->slots) {
        target_free(t);
        t = NULL;
        goto out;
    }
    memmove(&r->targets[lo + 1], &r->targets[lo], (r->ntargets - lo) * sizeof(*r->targets));
    r->targets[lo] = t;
    r->ntargets++;
out:
    pthread_mutex_unlock(&r->m->lock);
    return t;
}

/* ---- the hot path ---- */

/* The slot of worker w, or NULL when there is none to write (no route, bad worker index). */
static inline struct route_slot *slot_of(struct metrics_route *r, unsigned w)
{
    if (!r || w >= r->nslots)
        return NULL;
    return &r->slots[w];
}

void metrics_request(struct metrics_route *r, unsigned w, int code)
{
    struct route_slot *s = slot_of(r, w);
    /* Codes outside 100..599 are not valid final statuses; they have no series to count in. */
    if (s && code >= CODE_MIN && code <= CODE_MAX)
        bump(&s->codes[code - CODE_MIN], 1);
}

void metrics_upgrade(struct metrics_route *r, unsigned w, enum metrics_upgrade o)
{
    struct route_slot *s = slot_of(r, w);
    if (s && o < METRICS_UPGRADE_COUNT)
        bump(&s->upgrades[o], 1);
}

void metrics_tunnel_bytes(struct metrics_route *r, unsigned w, uint64_t from_client,
                          uint64_t from_upstream)
{
    struct route_slot *s = slot_of(r, w);
    if (!s)
        return;
    bump(&s->tunnel_bytes[0], from_client);
    bump(&s->tunnel_bytes[1], from_upstream);
}

void metrics_protocol(struct metrics_route *r, unsigned w, enum metrics_proto p)
{
    struct route_slot *s = slot_of(r, w);
    if (s && (unsigned)p < METRICS_PROTO_COUNT)
        bump(&s->protocol[p], 1);
}

void metrics_grpc(struct metrics_route *r, unsigned w, int status)
{
    struct route_slot *s = slot_of(r, w);
    if (s)
        bump(&s->grpc[status < 0     ? METRICS_GRPC_NONE
                      : status <= 16 ? status
                                     : METRICS_GRPC_OTHER],
             1);
}

/* One observation of 'seconds' into 'hs'. */
static void hist_add(struct hist_slot *hs, double seconds)
{
    /* Durations come from a monotonic clock; a negative or NaN one is a caller bug, and zero is
     * the least wrong place for it. */
    if (!(seconds > 0))
        seconds = 0;
    unsigned b = 0;
    while (b < HIST_BOUNDS && seconds > hist_bounds[b])
        b++;
    double clamped = seconds < HIST_MAX_SECONDS ? seconds : HIST_MAX_SECONDS;
    bump(&hs->buckets[b], 1);
    bump(&hs->sum_us, (uint64_t)llround(clamped * 1e6));
}

void metrics_attempt(struct metrics_target *t, unsigned w, enum metrics_outcome o, double seconds)
{
    if (!t || w >= t->nslots || (unsigned)o >= METRICS_OUT_COUNT)
        return;
    struct target_slot *s = &t->slots[w];
    bump(&s->attempts[o], 1);
    hist_add(&s->hist, seconds);
}

void metrics_retry(struct metrics_route *r, unsigned w, unsigned reason)
{
    struct route_slot *s = slot_of(r, w);
    if (s)
        bump(&s->retries[reason < METRICS_MAX_REASONS ? reason : REASON_OTHER], 1);
}

void metrics_delivery_accept(struct metrics_route *r, unsigned w, enum metrics_accept a)
{
    struct route_slot *s = slot_of(r, w);
    if (s && (unsigned)a < METRICS_ACCEPT_COUNT)
        bump(&s->accepts[a], 1);
}

void metrics_delivery_attempt(struct metrics_route *r, unsigned w, enum metrics_delivery o)
{
    struct route_slot *s = slot_of(r, w);
    if (s && (unsigned)o < METRICS_DELIVERY_COUNT)
        bump(&s->deliveries[o], 1);
}

void metrics_dead_letter(struct metrics_route *r, unsigned w, enum metrics_dead why)
{
    struct route_slot *s = slot_of(r, w);
    if (s && (unsigned)why < METRICS_DEAD_COUNT)
        bump(&s->dead[why], 1);
}

void metrics_discarded(struct metrics_route *r, unsigned w, enum metrics_dead why)
{
    struct route_slot *s = slot_of(r, w);
    if (s && (unsigned)why < METRICS_DEAD_COUNT)
        bump(&s->discarded[why], 1);
}

void metrics_dead_refused(struct metrics_route *r, unsigned w)
{
    struct route_slot *s = slot_of(r, w);
    if (s)
        bump(&s->dead_refused, 1);
}

void metrics_retry_success(struct metrics_route *r, unsigned w)
{
    struct route_slot *s = slot_of(r, w);
    if (s)
        bump(&s->retry_success, 1);
}

void metrics_denied(struct metrics_route *r, unsigned w, enum metrics_denied reason)
{
    struct route_slot *s = slot_of(r, w);
    if (s && (unsigned)reason < METRICS_DENIED_COUNT)
        bump(&s->denied[reason], 1);
}

void metrics_throttled(struct metrics_route *r, unsigned w)
{
    struct route_slot *s = slot_of(r, w);
    if (s)
        bump(&s->throttled, 1);
}

void metrics_hedge(struct metrics_route *r, unsigned w)
{
    struct route_slot *s = slot_of(r, w);
    if (s)
        bump(&s->hedges, 1);
}

void metrics_client_gone(struct metrics_route *r, unsigned w)
{
    struct route_slot *s = slot_of(r, w);
    if (s)
        bump(&s->client_gone, 1);
}

void metrics_retry_after_honored(struct metrics_route *r, unsigned w)
{
    struct route_slot *s = slot_of(r, w);
    if (s)
        bump(&s->retry_after_honored, 1);
}

void metrics_observe(struct metrics_route *r, unsigned w, enum metrics_hist h, double seconds)
{
    struct route_slot *s = slot_of(r, w);
    if (s && (unsigned)h < METRICS_HIST_COUNT)
        hist_add(&s->hist[h], seconds);
}

/* ---- process-wide series ---- */

void metrics_retries_in_flight_add(struct metrics *m, int delta)
{
    if (m)
        atomic_fetch_add_explicit(&m->retries_in_flight, delta, memory_order_relaxed);
}

int64_t metrics_retries_in_flight(const struct metrics *m)
{
    if (!m)
        return 0;
    return atomic_load_explicit(&m->retries_in_flight, memory_order_relaxed);
}

struct metrics_h2up *metrics_h2up_counts(struct metrics *m, unsigned w)
{
    return m && w < m->workers ? &m->wslots[w].h2up : NULL;
}

/* A worker's gauge: only its worker writes it (a scrape reads it from another thread). */
static void worker_gauge_add(struct metrics *m, unsigned w, size_t field, int delta)
{
    if (!m || w >= m->workers)
        return;
    _Atomic int64_t *c = (_Atomic int64_t *)(void *)((char *)&m->wslots[w] + field);
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + delta,
                          memory_order_relaxed);
}

void metrics_connections_add(struct metrics *m, unsigned w, int delta)
{
    worker_gauge_add(m, w, offsetof(struct worker_slot, connections), delta);
}

void metrics_tunnels_add(struct metrics *m, unsigned w, int delta)
{
    worker_gauge_add(m, w, offsetof(struct worker_slot, tunnels), delta);
}

_Atomic int64_t *metrics_upstream_waiting(struct metrics *m, unsigned w)
{
    return m && w < m->workers ? &m->wslots[w].upstream_waiting : NULL;
}

void metrics_connections_limited(struct metrics *m, unsigned w)
{
    if (m && w < m->workers)
        bump(&m->wslots[w].limit_reached, 1);
}

void metrics_set_body_bytes(struct metrics *m, const atomic_uint_fast64_t *bytes)
{
    if (m)
        m->body_bytes = bytes;
}

void metrics_limits(struct metrics *m, const uint64_t limits[METRICS_LIMIT_COUNT])
{
    if (!m || !limits)
        return;
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < METRICS_LIMIT_COUNT; i++)
        if (limits[i] != METRICS_LIMIT_KEEP)
            m->limits[i] = limits[i];
    m->has_limits = true;
    pthread_mutex_unlock(&m->lock);
}

void metrics_reload(struct metrics *m, bool ok, uint64_t generation, double unix_seconds)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->lock);
    if (ok) {
        m->reloads_ok++;
        m->last_success = unix_seconds;
    } else {
        m->reloads_failed++;
    }
    m->last_ok = ok;
    m->generation = generation;
    pthread_mutex_unlock(&m->lock);
}

void metrics_set_draining(struct metrics *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->lock);
    m->draining = true;
    pthread_mutex_unlock(&m->lock);
}

void metrics_process_budget(struct metrics *m, const struct budget_limits *l)
{
    if (!m || !l)
        return;
    pthread_mutex_lock(&m->lock);
    m->budget = *l;
    m->has_budget = true;
    pthread_mutex_unlock(&m->lock);
}

void metrics_set_upstreams(struct metrics *m,
                           size_t (*fn)(void *arg, struct metrics_upstream **rows), void *arg)
{
    if (!m)
        return;
    m->upstreams_fn = fn;
    m->upstreams_arg = arg;
}

void metrics_set_store(struct metrics *m, bool (*fn)(void *arg, struct metrics_store_view *v),
                       void *arg)
{
    if (!m)
        return;
    m->store_fn = fn;
    m->store_arg = arg;
}

void metrics_store_commit(struct metrics *m, double seconds)
{
    if (m)
        hist_add(&m->store_commit, seconds);
}

void metrics_route_budget(struct metrics_route *r, const struct budget_limits *l)
{
    if (!r || !l)
        return;
    pthread_mutex_lock(&r->m->lock);
    r->budget = *l;
    r->has_budget = true;
    pthread_mutex_unlock(&r->m->lock);
}

struct metrics_name *metrics_dns_name(struct metrics *m, const char *name)
{
    if (!m)
        return NULL;
    struct metrics_name *n = NULL;
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < m->nnames; i++)
        if (strcmp(m->names[i]->name, name) == 0) {
            n = m->names[i];
            goto out;
        }
    if (m->nnames == m->capnames) {
        size_t cap = m->capnames ? 2 * m->capnames : 8;
        struct metrics_name **v = realloc(m->names, cap * sizeof(*v));
        if (!v)
            goto out;
        m->names = v;
        m->capnames = cap;
    }
    n = calloc(1, sizeof(*n));
    if (n && !(n->name = strdup(name))) {
        free(n);
        n = NULL;
    }
    if (n)
        m->names[m->nnames++] = n;
out:
    pthread_mutex_unlock(&m->lock);
    return n;
}

void metrics_dns_result(struct metrics_name *n, enum metrics_dns r)
{
    if (n && (unsigned)r < METRICS_DNS_COUNT)
        bump(&n->results[r], 1);
}

void metrics_dns_stale(struct metrics_name *n, bool stale)
{
    if (n)
        atomic_store_explicit(&n->stale, stale, memory_order_relaxed);
}
