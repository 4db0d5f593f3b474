#include "proxy/core/live.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proxy/telemetry/metrics.h"
#include "proxy/base/strmap.h"

struct live_up_entry {
    struct live_up_entry *next;
    struct live_upstream up;
    char url[];
};

struct live_entry {
    struct live_entry *next;
    struct live_route route;
    struct live_up_entry *ups; /* its upstreams' health, under live's mutex */
    struct strmap ups_by_url;
    char name[];
};

struct live {
    pthread_mutex_t mu;
    struct live_entry *head;
    struct strmap by_name; /* every entry, keyed by its name */
};

struct live *live_new(void)
{
    struct live *l = calloc(1, sizeof(*l));
    if (l)
        pthread_mutex_init(&l->mu, NULL);
    return l;
}

void live_free(struct live *l)
{
    if (!l)
        return;
    for (struct live_entry *e = l->head, *next; e; e = next) {
        next = e->next;
        pthread_mutex_destroy(&e->route.mu);
        for (struct live_up_entry *u = e->ups, *unext; u; u = unext) {
            unext = u->next;
            pthread_mutex_destroy(&u->up.mu);
            for (size_t i = 0; i < u->up.n; i++) {
                pthread_mutex_destroy(&u->up.ep[i]->mu);
                free(u->up.ep[i]);
            }
            free(u->up.ep);
            free(u);
        }
        strmap_free(&e->ups_by_url);
        free(e);
    }
    strmap_free(&l->by_name);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

struct live_route *live_route(struct live *l, const char *name, uint32_t window_ms)
{
    struct live_route *found = NULL;
    pthread_mutex_lock(&l->mu);
    struct live_entry *e = strmap_get(&l->by_name, name);
    if (e) {
        found = &e->route;
        budget_set_window(&found->budget, window_ms);
        goto out;
    }
    size_t n = strlen(name);
    e = calloc(1, sizeof(*e) + n + 1);
    if (!e)
        goto out;
    memcpy(e->name, name, n + 1);
    if (strmap_put(&l->by_name, e->name, e) < 0) {
        free(e);
        goto out;
    }
    budget_init(&e->route.budget, window_ms);
    throttle_init(&e->route.throttle, window_ms); /* its own window is set by the snapshot */
    pthread_mutex_init(&e->route.mu, NULL);
    backoff_seq_reset(&e->route.seq);
    e->next = l->head;
    l->head = e;
    found = &e->route;
out:
    pthread_mutex_unlock(&l->mu);
    return found;
}

uint32_t live_route_backoff_peek(struct live_route *lr, const struct backoff_spec *b,
                                 uint64_t now_ms, struct rng *r, struct live_backoff_mark *m)
{
    pthread_mutex_lock(&lr->mu);
    m->was = lr->seq;
    pthread_mutex_unlock(&lr->mu);
    m->next = m->was;
    return backoff_seq_next(&m->next, b, now_ms, r);
}

void live_route_backoff_take(struct live_route *lr, const struct backoff_spec *b, uint64_t now_ms,
                             struct rng *r, const struct live_backoff_mark *m)
{
    pthread_mutex_lock(&lr->mu);
    if (memcmp(&lr->seq, &m->was, sizeof(m->was)) == 0)
        lr->seq = m->next;
    else
        backoff_seq_next(&lr->seq, b, now_ms, r);
    pthread_mutex_unlock(&lr->mu);
}

struct live_upstream *live_upstream(struct live *l, const char *name, const char *url)
{
    struct live_upstream *found = NULL;
    pthread_mutex_lock(&l->mu);
    struct live_entry *e = strmap_get(&l->by_name, name);
    if (!e)
        goto out;
    struct live_up_entry *u = strmap_get(&e->ups_by_url, url);
    if (u) {
        found = &u->up;
        goto out;
    }
    size_t n = strlen(url);
    u = calloc(1, sizeof(*u) + n + 1);
    if (!u)
        goto out;
    memcpy(u->url, url, n + 1);
    if (strmap_put(&e->ups_by_url, u->url, u) < 0) {
        free(u);
        goto out;
    }
    pthread_mutex_init(&u->up.mu, NULL);
    atomic_init(&u->up.ejection, false);
    u->next = e->ups;
    e->ups = u;
    found = &u->up;
out:
    pthread_mutex_unlock(&l->mu);
    return found;
}

/* The address of 'e' left the record: its health goes with it (the pod behind it is gone; a
 * new pod may come back on the same address, Kubernetes reuses them, and must not inherit an
 * ejection), and the epoch moves, so that the outcomes of attempts still running on the old
 * pod are not recorded against whatever comes next. Under u->mu. */
static void forget_health(struct live_upstream *u, struct live_endpoint *e)
{
    pthread_mutex_lock(&e->mu);
    u->ejections_gone += e->h.ejections_total;
    memset(&e->h, 0, sizeof(e->h));
    atomic_store(&e->until_ms, 0);
    atomic_fetch_add(&e->epoch, 1);
    pthread_mutex_unlock(&e->mu);
}

/* A new slot at the end of the table, which grows by half as much again when full. Under u->mu.
 * NULL out of memory. */
static struct live_endpoint *new_slot(struct live_upstream *u)
{
    if (u->n == u->cap) {
        size_t cap = u->cap ? u->cap + u->cap / 2 : 8;
        struct live_endpoint **ep = realloc(u->ep, cap * sizeof(*ep));
        if (!ep)
            return NULL;
        u->ep = ep;
        u->cap = cap;
    }
    struct live_endpoint *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    pthread_mutex_init(&e->mu, NULL);
    u->ep[u->n++] = e;
    return e;
}

/* qsort() and bsearch() order of slot pointers, by address. */
static int slot_cmp(const void *x, const void *y)
{
    const struct live_endpoint *a = *(struct live_endpoint *const *)x;
    const struct live_endpoint *b = *(struct live_endpoint *const *)y;
    return dns_addr_cmp(&a->addr, &b->addr);
}

/* The used slot holding address 'a' among 'by' (sorted by slot_cmp), NULL: none. */
static struct live_endpoint *slot_of(struct live_endpoint **by, size_t n, const struct dns_addr *a)
{
    struct live_endpoint key = { .addr = *a }, *k = &key;
    struct live_endpoint **hit = n ? bsearch(&k, by, n, sizeof(*by), slot_cmp) : NULL;
    return hit ? *hit : NULL;
}

/* Each address finds its slot by a binary search in the used slots sorted by address, so a
 * record of a thousand addresses syncs in thousands of comparisons, not a million. */
void live_upstream_sync(struct live_upstream *u, const struct dns_addr *a, size_t n,
                        struct live_endpoint **out)
{
    pthread_mutex_lock(&u->mu);
    struct live_endpoint **by = u->n ? malloc(u->n * sizeof(*by)) : NULL;
    size_t m = 0;
    for (size_t i = 0; i < u->n; i++) {
        u->ep[i]->seen = false;
        if (by && u->ep[i]->used)
            by[m++] = u->ep[i];
    }
    if (by)
        qsort(by, m, sizeof(*by), slot_cmp);
    else
        m = 0; /* out of memory: (at worst) an address takes a new slot */
    for (size_t k = 0; k < n; k++)
        if ((out[k] = slot_of(by, m, &a[k])) != NULL)
            out[k]->seen = true;
    free(by);
    for (size_t i = 0; i < u->n; i++) {
        struct live_endpoint *e = u->ep[i];
        bool was = e->present;
        e->present = e->used && e->seen;
        if (was && !e->present)
            forget_health(u, e);
    }
    /* the addresses that joined: slots never used first, then those whose address left and
     * that nothing uses any more (their health went with their address), then new ones; one
     * pass over the table, whatever the number that joined */
    size_t free_i = 0, gone_i = 0;
    for (size_t k = 0; k < n; k++) {
        if (out[k])
            continue;
        struct live_endpoint *e = NULL;
        while (!e && free_i < u->n) {
            struct live_endpoint *c = u->ep[free_i++];
            e = !c->used ? c : NULL;
        }
        while (!e && gone_i < u->n) {
            struct live_endpoint *c = u->ep[gone_i++];
            if (c->used && !c->present && atomic_load(&c->in_flight) == 0 &&
                atomic_load(&c->conns) == 0)
                e = c;
        }
        if (!e)
            e = new_slot(u);
        if ((out[k] = e) != NULL) {
            e->addr = a[k];
            e->used = e->present = e->seen = true;
        }
    }
    pthread_mutex_unlock(&u->mu);
}

bool live_endpoint_record(struct live_endpoint *e, uint32_t epoch, const struct health_spec *s,
                          bool failed, uint64_t now_ms, struct rng *r)
{
    pthread_mutex_lock(&e->mu);
    bool ejected = false;
    if (atomic_load_explicit(&e->epoch, memory_order_relaxed) == epoch) {
        ejected = health_record(&e->h, s, failed, now_ms, r);
        if (ejected)
            atomic_store_explicit(&e->until_ms, e->h.ejected_until_ms, memory_order_relaxed);
    }
    pthread_mutex_unlock(&e->mu);
    return ejected;
}

void live_endpoint_read(struct live_endpoint *e, struct health *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->h;
    pthread_mutex_unlock(&e->mu);
}

/* live_upstream_endpoints(), under u->mu. */
static size_t rows_of(struct live_upstream *u, uint64_t now_ms, struct live_ep_row *out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < u->n && n < max; i++) {
        struct live_endpoint *e = u->ep[i];
        int64_t in_flight = atomic_load(&e->in_flight), conns = atomic_load(&e->conns);
        if (!e->used || (!e->present && !in_flight && !conns))
            continue;
        struct live_ep_row *row = &out[n++];
        row->addr = e->addr;
        row->in_flight = in_flight;
        row->conns = conns;
        live_endpoint_read(e, &row->h);
        row->state = !e->present                         ? LIVE_EP_LEAVING
                     : health_available(&row->h, now_ms) ? LIVE_EP_HEALTHY
                                                         : LIVE_EP_EJECTED;
    }
    return n;
}

size_t live_upstream_endpoints(struct live_upstream *u, uint64_t now_ms, struct live_ep_row *out,
                               size_t max)
{
    pthread_mutex_lock(&u->mu);
    size_t n = rows_of(u, now_ms, out, max);
    pthread_mutex_unlock(&u->mu);
    return n;
}

size_t live_upstream_endpoints_all(struct live_upstream *u, uint64_t now_ms,
                                   struct live_ep_row **out)
{
    size_t n = 0;
    pthread_mutex_lock(&u->mu);
    /* the table's size now: it cannot grow while the mutex is held */
    *out = u->n ? malloc(u->n * sizeof(**out)) : NULL;
    if (*out)
        n = rows_of(u, now_ms, *out, u->n);
    pthread_mutex_unlock(&u->mu);
    if (!n) {
        free(*out);
        *out = NULL;
    }
    return n;
}

/* The worst few of an upstream's endpoints in the record by failure ratio, those at
 * METRICS_FAILING_RATIO or more (docs/metrics.md): kept sorted, the first of equals first. */
static void worst_endpoints(const struct live_ep_row *eps, size_t m, uint64_t now,
                            struct metrics_upstream *row)
{
    for (size_t k = 0; k < m; k++) {
        const struct score *s = &eps[k].h.score;
        double ratio = score_failure(s->fail_q16, s->at_ms, now) / 65535.0;
        if (eps[k].state == LIVE_EP_LEAVING || ratio < METRICS_FAILING_RATIO)
            continue;
        size_t j = row->n_worst < METRICS_WORST_ENDPOINTS ? row->n_worst++ : row->n_worst;
        for (; j > 0 && row->worst[j - 1].failure_ratio < ratio; j--)
            if (j < METRICS_WORST_ENDPOINTS)
                row->worst[j] = row->worst[j - 1];
        if (j < METRICS_WORST_ENDPOINTS) {
            row->worst[j].failure_ratio = ratio;
            inet_ntop(eps[k].addr.family, &eps[k].addr.u, row->worst[j].ip,
                      sizeof(row->worst[j].ip));
        }
    }
}

size_t live_upstream_rows(void *live, struct metrics_upstream **rows)
{
    struct live *l = live;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    size_t n = 0;
    *rows = NULL;
    pthread_mutex_lock(&l->mu);
    for (struct live_entry *e = l->head; e; e = e->next)
        for (struct live_up_entry *u = e->ups; u; u = u->next)
            n++;
    struct metrics_upstream *out = n ? calloc(n, sizeof(*out)) : NULL;
    if (!out) {
        n = 0;
        goto out;
    }
    size_t i = 0;
    for (struct live_entry *e = l->head; e; e = e->next) {
        for (struct live_up_entry *u = e->ups; u; u = u->next) {
            struct live_ep_row *eps;
            size_t m = live_upstream_endpoints_all(&u->up, now, &eps);
            struct metrics_upstream *row = &out[i++];
            *row = (struct metrics_upstream){ .route = e->name,
                                              .url = u->url,
                                              .ejection = atomic_load(&u->up.ejection) };
            pthread_mutex_lock(&u->up.mu);
            row->ejections = u->up.ejections_gone;
            for (size_t k = 0; k < u->up.n; k++) {
                struct health h;
                live_endpoint_read(u->up.ep[k], &h);
                row->ejections += h.ejections_total;
            }
            pthread_mutex_unlock(&u->up.mu);
            for (size_t k = 0; k < m; k++)
                row->endpoints[eps[k].state]++;
            worst_endpoints(eps, m, now, row);
            free(eps);
        }
    }
    *rows = out;
out:
    pthread_mutex_unlock(&l->mu);
    return n;
}
