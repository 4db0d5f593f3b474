#include "proxy/live.h"

#include <stdlib.h>
#include <string.h>

#include "proxy/strmap.h"

struct live_entry {
    struct live_entry *next;
    struct live_route route;
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
