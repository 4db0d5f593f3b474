/* store -- what every backend shares: the completion queues, the records' ownership, ids. */
#include "proxy/store/store.h"

#include <poll.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <linux/magic.h>
#include <sys/random.h>
#include <sys/vfs.h>
#include <unistd.h>

static const char *const state_names[STORE_STATES] = {
    [STORE_SCHEDULED] = "scheduled",
    [STORE_IN_FLIGHT] = "in_flight",
    [STORE_DELIVERED] = "delivered",
    [STORE_DEAD] = "dead",
};

const char *store_state_name(enum store_state st)
{
    return (unsigned)st < STORE_STATES ? state_names[st] : "unknown";
}

int store_state_parse(const char *name)
{
    for (int i = 0; i < STORE_STATES; i++)
        if (strcmp(name, state_names[i]) == 0)
            return i;
    return -1;
}

/* Completed calls wait in a list under a mutex; the eventfd says the list is not empty. The
 * backend's thread writes it once per call it finishes: a loop turn then drains them all. */
struct store_cq {
    int efd;
    pthread_mutex_t mu;
    struct store_call *head, *tail;
};

struct store_cq *store_cq_new(void)
{
    struct store_cq *q = calloc(1, sizeof(*q));
    if (!q)
        return NULL;
    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->efd < 0) {
        free(q);
        return NULL;
    }
    pthread_mutex_init(&q->mu, NULL);
    return q;
}

void store_cq_free(struct store_cq *q)
{
    if (!q)
        return;
    close(q->efd);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

int store_cq_fd(const struct store_cq *q)
{
    return q->efd;
}

void store_call_finish(struct store_call *c, int result)
{
    struct store_cq *q = c->cq;
    c->result = result;
    c->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = c;
    else
        q->head = c;
    q->tail = c;
    pthread_mutex_unlock(&q->mu);
    uint64_t one = 1;
    /* Cannot fail but at 2^64-1 unread wake-ups. */
    if (write(q->efd, &one, sizeof(one)) < 0) {
    }
}

size_t store_cq_drain(struct store_cq *q)
{
    uint64_t v;
    if (read(q->efd, &v, sizeof(v)) < 0) {
        /* EAGAIN: nothing new was signalled; calls may still be listed. */
    }
    pthread_mutex_lock(&q->mu);
    struct store_call *c = q->head;
    q->head = q->tail = NULL;
    pthread_mutex_unlock(&q->mu);
    size_t n = 0;
    while (c) {
        struct store_call *next = c->next; /* done() may free or reuse c */
        c->next = NULL;
        c->finished = true;
        if (c->done)
            c->done(c);
        c = next;
        n++;
    }
    return n;
}

int store_call_wait(struct store_call *c, int timeout_ms)
{
    struct pollfd p = { .fd = c->cq->efd, .events = POLLIN };
    while (!c->finished) {
        int r = poll(&p, 1, timeout_ms);
        if (r == 0)
            return -ETIMEDOUT;
        if (r < 0 && errno != EINTR)
            return -errno;
        store_cq_drain(c->cq);
    }
    return 0;
}

void store_fields_free(struct store_field *f, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(f[i].name);
        free(f[i].value);
    }
    free(f);
}

void store_delivery_clear(struct store_delivery *d)
{
    free(d->route);
    free(d->method);
    free(d->target);
    store_fields_free(d->fields, d->nfields);
    free(d->body);
    free(d->idem_key);
    free(d->claimed_by);
    free(d->reason);
    free(d->final_head);
    free(d->final_body);
    for (size_t i = 0; i < d->ntries; i++)
        free((char *)d->tries[i].upstream); /* the record's own copy (store.h) */
    free(d->tries);
    free(d->upstream);
    memset(d, 0, sizeof(*d));
}

void store_call_clear(struct store_call *c)
{
    for (size_t i = 0; i < c->ncounts; i++)
        free(c->counts[i].route);
    free(c->counts);
    c->counts = NULL;
    c->ncounts = 0;
    c->cursor = 0;
    c->more = false;
    for (size_t i = 0; i < c->n; i++)
        store_delivery_clear(&c->items[i]);
    free(c->items);
    c->items = NULL;
    c->n = 0;
    c->total = 0;
    c->result = 0;
    c->finished = false;
    c->dup = false;
    c->left_out = 0;
    c->id[0] = '\0';
}

int store_new_id(char id[STORE_ID_SIZE])
{
    unsigned char b[16];
    size_t got = 0;
    while (got < sizeof(b)) {
        ssize_t r = getrandom(b + got, sizeof(b) - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        got += (size_t)r;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof(b); i++) {
        id[2 * i] = hex[b[i] >> 4];
        id[2 * i + 1] = hex[b[i] & 15];
    }
    id[32] = '\0';
    return 0;
}

uint64_t store_body_hash(const char *body, size_t len)
{
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)body[i];
        h *= 1099511628211ULL;
    }
    return h;
}

bool store_on_tmpfs(const char *path)
{
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    struct statfs st;
    return statfs(dir, &st) == 0 && st.f_type == TMPFS_MAGIC;
}

void store_close(struct store *s)
{
    if (s)
        s->ops->close(s->impl); /* frees s with the backend's state */
}
