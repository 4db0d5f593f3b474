/* backend -- the operations' front and the call queue every backend's thread serves
 * (backend.h). */
#include "proxy/store/backend.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t store_bulk_due_at(const struct store_bulk *b, uint64_t now, size_t i)
{
    uint64_t first = b->first_at ? b->first_at : now, rate = b->rate ? b->rate : 1;
    return first + (b->done + i) * 1000 / rate;
}

uint64_t store_q_now(const struct store_opts *o)
{
    if (o->clock)
        return o->clock(o->clock_arg);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t store_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

bool store_op_writes(int op)
{
    return op != OP_LIST && op != OP_GET && op != OP_FIND && op != OP_COUNTS;
}

int store_q_run(const struct store_runner *r, struct store_impl *s, struct store_call *c)
{
    switch ((enum store_op)c->op) {
    case OP_ENQUEUE:
        return r->enqueue(s, c);
    case OP_CLAIM:
    case OP_CLAIM_EXCEPT:
        return r->claim(s, c);
    case OP_COMPLETE:
    case OP_RESCHEDULE:
    case OP_BURY:
        return r->end(s, c);
    case OP_INSERT_DEAD:
        return r->insert_dead(s, c);
    case OP_LIST:
        return r->list(s, c);
    case OP_GET:
        c->items = calloc(1, sizeof(*c->items));
        if (!c->items)
            return STORE_EIO;
        c->n = 1;
        return r->get(s, c->key, c->items);
    case OP_REPLAY:
    case OP_DROP:
        return r->change(s, c);
    case OP_FIND:
        return r->find(s, c);
    case OP_BULK:
        return r->bulk(s, c);
    case OP_COUNTS:
        return r->counts(s, c);
    case OP_RENEW:
        return r->renew(s, c);
    }
    return STORE_EINVAL;
}

void store_q_end_batch(struct store_q *q, struct store_call *batch, const struct store_call *stop,
                       int lost, uint64_t t0, uint64_t count, uint64_t bytes)
{
    if (lost) {
        /* Nothing of the batch is kept: every write fails, and the calls not run. */
        bool ran = true;
        for (struct store_call *x = batch; x; x = x->next) {
            ran = ran && x != stop;
            if (store_op_writes(x->op) || !ran)
                x->result = lost;
        }
    } else {
        atomic_fetch_add(&q->st.commits, 1);
        if (q->o.on_commit)
            q->o.on_commit(q->o.on_commit_arg, (double)(store_mono_us() - t0) / 1e6);
    }
    atomic_store(&q->st.count, count);
    atomic_store(&q->st.bytes, bytes);
    atomic_store(&q->st.commit_us, store_mono_us() - t0);
    while (batch) {
        struct store_call *c = batch;
        batch = c->next;
        if (c->op == OP_ENQUEUE && c->result == STORE_EFULL)
            atomic_fetch_add(&q->st.refused, 1);
        else if (c->op == OP_ENQUEUE && c->result == 0 && !c->dup)
            atomic_fetch_add(&q->st.enqueued, 1);
        store_call_finish(c, c->result);
    }
}

struct store_count *store_count_row(struct store_call *c, size_t *cap, const char *route)
{
    if (c->ncounts && strcmp(c->counts[c->ncounts - 1].route, route) == 0)
        return &c->counts[c->ncounts - 1];
    if (c->ncounts == *cap) {
        size_t n = *cap ? 2 * *cap : 8;
        struct store_count *k = realloc(c->counts, n * sizeof(*k));
        if (!k)
            return NULL;
        c->counts = k;
        *cap = n;
    }
    struct store_count *k = &c->counts[c->ncounts];
    memset(k, 0, sizeof(*k));
    if (!(k->route = strdup(route)))
        return NULL;
    c->ncounts++;
    return k;
}

void store_q_stats(struct store_impl *s, struct store_stats *out)
{
    struct store_q *q = (struct store_q *)s;
    *out = (struct store_stats){ .commits = atomic_load(&q->st.commits),
                                 .enqueued = atomic_load(&q->st.enqueued),
                                 .refused = atomic_load(&q->st.refused),
                                 .count = atomic_load(&q->st.count),
                                 .bytes = atomic_load(&q->st.bytes),
                                 .commit_us = atomic_load(&q->st.commit_us),
                                 .recovered = atomic_load(&q->st.recovered),
                                 .swept = atomic_load(&q->st.swept),
                                 .down = atomic_load(&q->st.down),
                                 .disconnects = atomic_load(&q->st.disconnects),
                                 .lease_ms = q->o.lease_ms };
}

bool store_q_sweep_due(struct store_q *q, uint64_t *last, uint64_t *delivered_cut,
                       uint64_t *dead_cut)
{
    if (!q->o.retention)
        return false;
    uint64_t now = store_q_now(&q->o);
    if (*last && now - *last < STORE_SWEEP_EVERY_MS && now >= *last)
        return false;
    *last = now;
    uint64_t keep = q->o.delivered_keep_ms, dead = q->o.dead_keep_ms;
    *delivered_cut = now > keep ? now - keep : 0;
    /* A dead letter with no keep setting stays until an operator drops it: never evicted. */
    *dead_cut = !dead ? 0 : now > dead ? now - dead : 1;
    return true;
}

void store_q_swept(struct store_q *q, uint64_t *last, int delivered, int dead)
{
    atomic_fetch_add(&q->st.swept, (uint64_t)(delivered + dead));
    if (delivered == STORE_SWEEP_BATCH || dead == STORE_SWEEP_BATCH)
        *last -= STORE_SWEEP_EVERY_MS; /* more are due: again at the next turn */
}

/* A copy of 'n' names (NULL and 0 for none); NULL when out of memory. */
static char **copy_names(const char *const *names, size_t n, bool *ok)
{
    char **c = n ? calloc(n, sizeof(*c)) : NULL;
    *ok = !n || c;
    for (size_t i = 0; c && i < n; i++)
        *ok = *ok && (c[i] = strdup(names[i])) != NULL;
    return c;
}

static void free_names(const char *const *names, size_t n)
{
    for (size_t i = 0; names && i < n; i++)
        free((char *)names[i]);
    free((void *)names);
}

int store_q_init(struct store_q *q, const struct store_opts *o, const struct store_ops *ops)
{
    q->o = *o;
    q->o.path = o->path ? strdup(o->path) : NULL;
    q->o.pg_url = o->pg_url ? strdup(o->pg_url) : NULL;
    q->o.pg_password = o->pg_password ? strdup(o->pg_password) : NULL;
    q->o.pg_namespace = o->pg_namespace ? strdup(o->pg_namespace) : NULL;
    bool copied = (q->o.path || !o->path) && (q->o.pg_url || !o->pg_url) &&
                  (q->o.pg_password || !o->pg_password) && (q->o.pg_namespace || !o->pg_namespace);
    /* The key and the names are the store's own copies: the config may go before it. */
    if (o->key) {
        memcpy(q->key, o->key, sizeof(q->key));
        q->o.key = q->key;
    }
    bool ok;
    q->o.sensitive = (const char *const *)copy_names(o->sensitive, o->n_sensitive, &ok);
    if (!ok) {
        free_names(q->o.sensitive, o->n_sensitive);
        q->o.sensitive = NULL;
        q->o.n_sensitive = 0;
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->pub.ops = ops;
    q->pub.impl = (struct store_impl *)q;
    return ok && copied ? 0 : STORE_EIO;
}

void store_q_fini(struct store_q *q)
{
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free((char *)q->o.path);
    free((char *)q->o.pg_url);
    free((char *)q->o.pg_namespace);
    if (q->o.pg_password)
        explicit_bzero((char *)q->o.pg_password, strlen(q->o.pg_password));
    free((char *)q->o.pg_password);
    free_names(q->o.sensitive, q->o.n_sensitive);
    if (q->tuned)
        free_names(q->tuned->sensitive, q->tuned->n_sensitive);
    free(q->tuned);
    explicit_bzero(q->key, sizeof(q->key));
}

/* The store thread takes a reload's settings (under mu). */
static void take_tuning(struct store_q *q)
{
    struct store_opts *t = q->tuned;
    if (!t)
        return;
    q->tuned = NULL;
    free_names(q->o.sensitive, q->o.n_sensitive);
    q->o.sensitive = t->sensitive;
    q->o.n_sensitive = t->n_sensitive;
    q->o.dead_body_bytes = t->dead_body_bytes;
    q->o.delivered_keep_ms = t->delivered_keep_ms;
    q->o.dead_keep_ms = t->dead_keep_ms;
    free(t);
}

struct store_call *store_q_take(struct store_q *q, size_t max, int wake_ms, bool *stop)
{
    *stop = false;
    pthread_mutex_lock(&q->mu);
    while (!q->head && !q->closing) {
        if (!wake_ms) {
            pthread_cond_wait(&q->cv, &q->mu);
            continue;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += (long)(wake_ms % 1000) * 1000000;
        until.tv_sec += wake_ms / 1000 + until.tv_nsec / 1000000000;
        until.tv_nsec %= 1000000000;
        if (pthread_cond_timedwait(&q->cv, &q->mu, &until) != 0)
            break;
    }
    take_tuning(q);
    struct store_call *batch = q->head, *last = q->head;
    if (!batch) {
        *stop = q->closing; /* closing, and everything handed over is taken */
        pthread_mutex_unlock(&q->mu);
        return NULL;
    }
    for (size_t n = 1; (!max || n < max) && last->next; n++)
        last = last->next;
    q->head = last->next;
    if (!q->head)
        q->tail = NULL;
    last->next = NULL;
    pthread_mutex_unlock(&q->mu);
    return batch;
}

void store_q_stop(struct store_q *q)
{
    pthread_mutex_lock(&q->mu);
    q->closing = true;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
}

/* Hands a call to the store thread: 0, or STORE_ECLOSED (nothing taken). */
static int submit(struct store_impl *s, struct store_call *c, int op)
{
    struct store_q *q = (struct store_q *)s;
    if (!c->cq)
        return STORE_EINVAL;
    c->op = op;
    c->result = 0;
    c->finished = false;
    c->dup = false;
    c->left_out = 0;
    c->items = NULL;
    c->n = 0;
    c->total = 0;
    c->next = NULL;
    int r = 0;
    pthread_mutex_lock(&q->mu);
    if (q->closing) {
        r = STORE_ECLOSED;
    } else {
        if (q->tail)
            q->tail->next = c;
        else
            q->head = c;
        q->tail = c;
        pthread_cond_signal(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return r;
}

static bool id_ok(const char *id)
{
    return id && strlen(id) == STORE_ID_SIZE - 1;
}

static bool new_ok(const struct store_new *d)
{
    return d->route && d->method && d->target && (!d->nfields || d->fields) &&
           (!d->body_len || d->body) && d->body_len <= INT32_MAX;
}

int store_q_enqueue(struct store_impl *s, struct store_call *c, const struct store_new *d)
{
    if (!new_ok(d))
        return STORE_EINVAL;
    c->in = d;
    return submit(s, c, OP_ENQUEUE);
}

int store_q_claim_route(struct store_impl *s, struct store_call *c, const char *owner,
                        const char *route, size_t max)
{
    if (!owner || max == 0)
        return STORE_EINVAL;
    c->owner = owner;
    c->key = route;
    c->max = max;
    return submit(s, c, OP_CLAIM);
}

int store_q_claim_except(struct store_impl *s, struct store_call *c, const char *owner,
                         const char *const *routes, size_t n, size_t max)
{
    if (!owner || max == 0 || (n && !routes))
        return STORE_EINVAL;
    c->owner = owner;
    c->key = NULL;
    c->in = routes;
    c->when = n;
    c->max = max;
    return submit(s, c, OP_CLAIM_EXCEPT);
}

int store_q_claim_due(struct store_impl *s, struct store_call *c, const char *owner, size_t max)
{
    return store_q_claim_route(s, c, owner, NULL, max);
}

static int end(struct store_impl *s, struct store_call *c, int op, const char *id,
               const char *owner, const struct store_attempt *a)
{
    if (!id_ok(id) || !owner || (!a && op == OP_COMPLETE))
        return STORE_EINVAL;
    c->key = id;
    c->owner = owner;
    c->attempt = a;
    return submit(s, c, op);
}

int store_q_complete(struct store_impl *s, struct store_call *c, const char *id, const char *owner,
                     const struct store_attempt *a)
{
    return end(s, c, OP_COMPLETE, id, owner, a);
}

int store_q_reschedule(struct store_impl *s, struct store_call *c, const char *id,
                       const char *owner, const struct store_attempt *a, uint64_t next_at)
{
    c->when = next_at;
    return end(s, c, OP_RESCHEDULE, id, owner, a);
}

int store_q_bury(struct store_impl *s, struct store_call *c, const char *id, const char *owner,
                 const struct store_attempt *a, const struct store_dead *dead)
{
    if (!dead)
        return STORE_EINVAL;
    c->in = dead;
    return end(s, c, OP_BURY, id, owner, a);
}

int store_q_renew(struct store_impl *s, struct store_call *c, const char *owner,
                  const char *const *ids, size_t n)
{
    if (!owner || !n || !ids)
        return STORE_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!id_ok(ids[i]))
            return STORE_EINVAL;
    c->owner = owner;
    c->in = ids;
    c->max = n;
    return submit(s, c, OP_RENEW);
}

int store_q_insert_dead(struct store_impl *s, struct store_call *c, const struct store_dead_new *d)
{
    if (!new_ok(&d->req) || d->req.idem_key || (d->ntries && !d->tries))
        return STORE_EINVAL;
    c->in = d;
    return submit(s, c, OP_INSERT_DEAD);
}

int store_q_list(struct store_impl *s, struct store_call *c, const struct store_filter *f)
{
    if (!f || f->state >= STORE_STATES)
        return STORE_EINVAL;
    c->in = f;
    return submit(s, c, OP_LIST);
}

static int by_id(struct store_impl *s, struct store_call *c, const char *id, int op)
{
    if (!id_ok(id))
        return STORE_EINVAL;
    c->key = id;
    return submit(s, c, op);
}

int store_q_get(struct store_impl *s, struct store_call *c, const char *id)
{
    return by_id(s, c, id, OP_GET);
}

int store_q_replay(struct store_impl *s, struct store_call *c, const char *id)
{
    return by_id(s, c, id, OP_REPLAY);
}

int store_q_drop(struct store_impl *s, struct store_call *c, const char *id)
{
    return by_id(s, c, id, OP_DROP);
}

int store_q_find(struct store_impl *s, struct store_call *c, const struct store_match *m)
{
    if (!m || m->state >= STORE_STATES || m->limit > STORE_FIND_MAX)
        return STORE_EINVAL;
    c->in = m;
    return submit(s, c, OP_FIND);
}

int store_q_bulk(struct store_impl *s, struct store_call *c, const struct store_bulk *b)
{
    if (!b || b->m.state >= STORE_STATES || (b->replay && !b->rate))
        return STORE_EINVAL;
    c->in = b;
    return submit(s, c, OP_BULK);
}

int store_q_counts(struct store_impl *s, struct store_call *c)
{
    return submit(s, c, OP_COUNTS);
}

int store_q_tune(struct store_impl *s, const struct store_tuning *t)
{
    struct store_q *q = (struct store_q *)s;
    struct store_opts *o = calloc(1, sizeof(*o));
    bool ok = o != NULL;
    char **names = o ? copy_names(t->sensitive, t->n_sensitive, &ok) : NULL;
    if (!ok) {
        free_names((const char *const *)names, t->n_sensitive);
        free(o);
        return STORE_EIO;
    }
    o->sensitive = (const char *const *)names;
    o->n_sensitive = t->n_sensitive;
    o->dead_body_bytes = t->dead_body_bytes;
    o->delivered_keep_ms = t->delivered_keep_ms;
    o->dead_keep_ms = t->dead_keep_ms;
    pthread_mutex_lock(&q->mu);
    struct store_opts *old = q->tuned;
    q->tuned = o;
    pthread_mutex_unlock(&q->mu);
    if (old)
        free_names(old->sensitive, old->n_sensitive);
    free(old);
    return 0;
}
