#include "proxy/core/live.h"

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
    atomic_init(&u->up.until_ms, 0);
    u->next = e->ups;
    e->ups = u;
    found = &u->up;
out:
    pthread_mutex_unlock(&l->mu);
    return found;
}

bool live_upstream_record(struct live_upstream *u, const struct health_spec *s, bool failed,
                          uint64_t now_ms, struct rng *r)
{
    pthread_mutex_lock(&u->mu);
    bool ejected = health_record(&u->h, s, failed, now_ms, r);
    if (ejected)
        atomic_store_explicit(&u->until_ms, u->h.ejected_until_ms, memory_order_relaxed);
    pthread_mutex_unlock(&u->mu);
    return ejected;
}

void live_upstream_read(struct live_upstream *u, struct health *out)
{
    pthread_mutex_lock(&u->mu);
    *out = u->h;
    pthread_mutex_unlock(&u->mu);
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
            struct health h;
            live_upstream_read(&u->up, &h);
            out[i++] = (struct metrics_upstream){ .route = e->name,
                                                  .url = u->url,
                                                  .ejections = h.ejections_total,
                                                  .ejected = !health_available(&h, now) };
        }
    }
    *rows = out;
out:
    pthread_mutex_unlock(&l->mu);
    return n;
}
