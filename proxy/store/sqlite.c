/* sqlite -- the embedded store: one SQLite file, one thread that owns it, group commit.
 *
 * Callers (the workers' event loops, the admin thread, the CLI) never run SQLite: an operation
 * queues its call under a mutex and wakes the store thread. The thread takes every call that
 * is waiting (store_opts.max_batch at most), runs them in ONE transaction, commits it, and only
 * then hands each call to its completion queue: an enqueue that completed with 0 is in the
 * file, fsync'd (WAL mode, synchronous=FULL). While it commits, new calls gather for the next
 * transaction: the busier the store, the more each fsync carries (docs/delivery.md).
 *
 * Each call runs under a savepoint, so one that fails (a full store, a conflict) leaves the
 * others of its batch in. A failure that takes the whole transaction with it (a full disk, an
 * I/O error, a failed COMMIT) fails every write of the batch with the same error: nothing of
 * it was acknowledged, and nothing is acknowledged that was not committed.
 */
#include "proxy/store/sqlite_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

static const struct store_ops sqlite_ops;
static void take_tuning(struct store_impl *s);

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static bool writes(const struct store_call *c)
{
    return c->op != OP_LIST && c->op != OP_GET && c->op != OP_FIND && c->op != OP_COUNTS;
}

/* One call in the open transaction: the operators' ops are sqlite_ops.c's, the rest
 * sqlite_sql.c's. */
static int run_one(struct store_impl *s, struct store_call *c)
{
    bool ops = c->op == OP_FIND || c->op == OP_BULK || c->op == OP_COUNTS;
    return ops ? sql_ops_run(s, c) : sql_run(s, c);
}

/* Runs one batch of calls in one transaction and finishes them all. */
static void run_batch(struct store_impl *s, struct store_call *batch)
{
    uint64_t t0 = mono_us();
    int lost = sql_error(sql_step_reset(s->st[S_BEGIN]));
    s->live_delta = 0;
    s->bytes_added = 0;
    struct store_call *c;
    for (c = batch; c && !lost; c = c->next) {
        if (!writes(c)) {
            c->result = run_one(s, c);
            continue;
        }
        int r = sql_error(sql_step_reset(s->st[S_SAVEPOINT]));
        int64_t delta = s->live_delta;
        uint64_t added = s->bytes_added;
        if (r == 0 && (r = run_one(s, c)) < 0) {
            sql_step_reset(s->st[S_ROLLBACK_TO]);
            s->live_delta = delta;
            s->bytes_added = added;
        }
        if (sqlite3_get_autocommit(s->db)) {
            /* SQLite rolled the whole transaction back (SQLITE_FULL, an I/O error). */
            lost = r < 0 ? r : STORE_EIO;
            break;
        }
        sql_step_reset(s->st[S_RELEASE]);
        c->result = r;
    }
    if (!lost) {
        int rc = sql_step_reset(s->st[S_COMMIT]);
        if (rc != SQLITE_DONE && rc != SQLITE_OK) {
            lost = sql_error(rc) ? sql_error(rc) : STORE_EIO;
            if (!sqlite3_get_autocommit(s->db))
                sql_step_reset(s->st[S_ROLLBACK]);
        }
    }
    if (lost) {
        /* Nothing of the batch is in the file: every write fails, and the reads not run. */
        bool ran = true;
        for (struct store_call *x = batch; x; x = x->next) {
            ran = ran && x != c;
            if (writes(x) || !ran)
                x->result = lost;
        }
    } else {
        s->live = (uint64_t)((int64_t)s->live + s->live_delta);
        atomic_fetch_add(&s->commits, 1);
        if (s->o.on_commit)
            s->o.on_commit(s->o.on_commit_arg, (double)(mono_us() - t0) / 1e6);
    }
    atomic_store(&s->live_pub, s->live);
    atomic_store(&s->bytes, sql_bytes(s));
    atomic_store(&s->commit_us, mono_us() - t0);
    while (batch) {
        c = batch;
        batch = c->next;
        if (c->op == OP_ENQUEUE && c->result == STORE_EFULL)
            atomic_fetch_add(&s->refused, 1);
        else if (c->op == OP_ENQUEUE && c->result == 0 && !c->dup)
            atomic_fetch_add(&s->enqueued, 1);
        store_call_finish(c, c->result);
    }
}

static void *store_thread(void *arg)
{
    struct store_impl *s = arg;
    size_t max = s->o.max_batch ? s->o.max_batch : SIZE_MAX;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->closing) {
            if (!s->o.retention) {
                pthread_cond_wait(&s->cv, &s->mu);
                continue;
            }
            /* With retention on, the thread wakes each second to sweep, calls or not. */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 1;
            if (pthread_cond_timedwait(&s->cv, &s->mu, &until) != 0)
                break;
        }
        take_tuning(s);
        if (!s->head && !s->closing) {
            pthread_mutex_unlock(&s->mu);
            sql_sweep(s); /* retention, at most once a second (sqlite_ops.c) */
            continue;
        }
        struct store_call *batch = s->head, *last = s->head;
        if (!batch) { /* closing, and everything handed over is finished */
            pthread_mutex_unlock(&s->mu);
            break;
        }
        for (size_t n = 1; n < max && last->next; n++)
            last = last->next;
        s->head = last->next;
        if (!s->head)
            s->tail = NULL;
        last->next = NULL;
        pthread_mutex_unlock(&s->mu);
        sql_sweep(s); /* before the batch: what it reads is as retention leaves it */
        run_batch(s, batch);
    }
    return NULL;
}

/* Hands a call to the store thread: 0, or STORE_ECLOSED (nothing taken). */
static int submit(struct store_impl *s, struct store_call *c, int op)
{
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
    pthread_mutex_lock(&s->mu);
    if (s->closing) {
        r = STORE_ECLOSED;
    } else {
        if (s->tail)
            s->tail->next = c;
        else
            s->head = c;
        s->tail = c;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
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

static int s_enqueue(struct store_impl *s, struct store_call *c, const struct store_new *d)
{
    if (!new_ok(d))
        return STORE_EINVAL;
    c->in = d;
    return submit(s, c, OP_ENQUEUE);
}

static int s_claim_route(struct store_impl *s, struct store_call *c, const char *owner,
                         const char *route, size_t max)
{
    if (!owner || max == 0)
        return STORE_EINVAL;
    c->owner = owner;
    c->key = route;
    c->max = max;
    return submit(s, c, OP_CLAIM);
}

static int s_claim_except(struct store_impl *s, struct store_call *c, const char *owner,
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

static int s_claim_due(struct store_impl *s, struct store_call *c, const char *owner, size_t max)
{
    return s_claim_route(s, c, owner, NULL, max);
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

static int s_complete(struct store_impl *s, struct store_call *c, const char *id, const char *owner,
                      const struct store_attempt *a)
{
    return end(s, c, OP_COMPLETE, id, owner, a);
}

static int s_reschedule(struct store_impl *s, struct store_call *c, const char *id,
                        const char *owner, const struct store_attempt *a, uint64_t next_at)
{
    c->when = next_at;
    return end(s, c, OP_RESCHEDULE, id, owner, a);
}

static int s_bury(struct store_impl *s, struct store_call *c, const char *id, const char *owner,
                  const struct store_attempt *a, const struct store_dead *dead)
{
    if (!dead)
        return STORE_EINVAL;
    c->in = dead;
    return end(s, c, OP_BURY, id, owner, a);
}

static int s_insert_dead(struct store_impl *s, struct store_call *c, const struct store_dead_new *d)
{
    if (!new_ok(&d->req) || d->req.idem_key || (d->ntries && !d->tries))
        return STORE_EINVAL;
    c->in = d;
    return submit(s, c, OP_INSERT_DEAD);
}

static int s_list(struct store_impl *s, struct store_call *c, const struct store_filter *f)
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

static int s_get(struct store_impl *s, struct store_call *c, const char *id)
{
    return by_id(s, c, id, OP_GET);
}

static int s_replay(struct store_impl *s, struct store_call *c, const char *id)
{
    return by_id(s, c, id, OP_REPLAY);
}

static int s_drop(struct store_impl *s, struct store_call *c, const char *id)
{
    return by_id(s, c, id, OP_DROP);
}

static int s_find(struct store_impl *s, struct store_call *c, const struct store_match *m)
{
    if (!m || m->state >= STORE_STATES || m->limit > STORE_FIND_MAX)
        return STORE_EINVAL;
    c->in = m;
    return submit(s, c, OP_FIND);
}

static int s_bulk(struct store_impl *s, struct store_call *c, const struct store_bulk *b)
{
    if (!b || b->m.state >= STORE_STATES || (b->replay && !b->rate))
        return STORE_EINVAL;
    c->in = b;
    return submit(s, c, OP_BULK);
}

static int s_counts(struct store_impl *s, struct store_call *c)
{
    return submit(s, c, OP_COUNTS);
}

static void s_stats(struct store_impl *s, struct store_stats *out)
{
    out->swept = atomic_load(&s->swept);
    out->commits = atomic_load(&s->commits);
    out->enqueued = atomic_load(&s->enqueued);
    out->refused = atomic_load(&s->refused);
    out->count = atomic_load(&s->live_pub);
    out->bytes = atomic_load(&s->bytes);
    out->commit_us = atomic_load(&s->commit_us);
    out->recovered = atomic_load(&s->recovered);
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

static int s_tune(struct store_impl *s, const struct store_tuning *t)
{
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
    pthread_mutex_lock(&s->mu);
    struct store_opts *old = s->tuned;
    s->tuned = o;
    pthread_mutex_unlock(&s->mu);
    if (old)
        free_names(old->sensitive, old->n_sensitive);
    free(old);
    return 0;
}

/* The store thread takes a reload's settings (under mu). */
static void take_tuning(struct store_impl *s)
{
    struct store_opts *t = s->tuned;
    if (!t)
        return;
    s->tuned = NULL;
    free_names(s->o.sensitive, s->o.n_sensitive);
    s->o.sensitive = t->sensitive;
    s->o.n_sensitive = t->n_sensitive;
    s->o.dead_body_bytes = t->dead_body_bytes;
    s->o.delivered_keep_ms = t->delivered_keep_ms;
    s->o.dead_keep_ms = t->dead_keep_ms;
    free(t);
}

static void free_impl(struct store_impl *s)
{
    sql_finalize(s);
    sql_ops_finalize(s);
    sqlite3_close(s->db);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    if (s->lock_fd >= 0)
        close(s->lock_fd); /* the flock goes with it */
    free((char *)s->o.path);
    free_names(s->o.sensitive, s->o.n_sensitive);
    if (s->tuned)
        free_names(s->tuned->sensitive, s->tuned->n_sensitive);
    free(s->tuned);
    explicit_bzero(s->key, sizeof(s->key));
    free(s);
}

static void s_close(struct store_impl *s)
{
    pthread_mutex_lock(&s->mu);
    s->closing = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    free_impl(s);
}

static const struct store_ops sqlite_ops = {
    .name = "sqlite",
    .enqueue = s_enqueue,
    .claim_due = s_claim_due,
    .claim_route = s_claim_route,
    .claim_except = s_claim_except,
    .complete = s_complete,
    .reschedule = s_reschedule,
    .bury = s_bury,
    .insert_dead = s_insert_dead,
    .list = s_list,
    .get = s_get,
    .replay = s_replay,
    .drop = s_drop,
    .find = s_find,
    .bulk = s_bulk,
    .counts = s_counts,
    .tune = s_tune,
    .stats = s_stats,
    .close = s_close,
};

/* A pragma whose one result must read 'want' (journal_mode answers the mode it got). */
static int pragma(struct store_impl *s, const char *sql, const char *want, struct store_err *err)
{
    sqlite3_stmt *st = NULL;
    int r = STORE_EIO;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) == SQLITE_OK) {
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE && !want)
            r = 0;
        else if (rc == SQLITE_ROW)
            r = !want || strcmp((const char *)sqlite3_column_text(st, 0), want) == 0 ? 0
                                                                                     : STORE_EIO;
    }
    if (r < 0)
        snprintf(err->msg, sizeof(err->msg), "%s: %s: %s", s->o.path, sql,
                 st && want && sqlite3_errcode(s->db) == SQLITE_OK ? "not taken"
                                                                   : sqlite3_errmsg(s->db));
    sqlite3_finalize(st);
    return r;
}

/* store_opts.exclusive: PATH.lock beside the file, flock'd for as long as the store is open.
 * A second retryproxy on the same file would claim the first one's deliveries once their
 * leases ran out, and recover() would take them at once: so it does not start. */
static int take_lock(struct store_impl *s, struct store_err *err)
{
    char *lock = NULL;
    int r = 0;
    if (asprintf(&lock, "%s.lock", s->o.path) < 0)
        return STORE_EIO;
    s->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->lock_fd < 0) {
        snprintf(err->msg, sizeof(err->msg), "%s: %s", lock, strerror(errno));
        r = STORE_EIO;
    } else if (flock(s->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        bool held = errno == EWOULDBLOCK;
        snprintf(err->msg, sizeof(err->msg), "%s is in use by another process (%s is %s)",
                 s->o.path, lock, held ? "locked" : strerror(errno));
        r = STORE_EBUSY;
    }
    free(lock);
    return r;
}

int store_sqlite_open(const struct store_opts *o, struct store **out, struct store_err *err)
{
    int r = STORE_EIO;
    err->msg[0] = '\0';
    if (!o->path || !o->path[0] || o->lease_ms == 0) {
        snprintf(err->msg, sizeof(err->msg), "the store needs a path and a lease");
        return STORE_EINVAL;
    }
    struct store_impl *s = calloc(1, sizeof(*s));
    if (!s)
        return STORE_EIO;
    s->o = *o;
    s->o.path = strdup(o->path);
    /* The key and the names are the store's own copies: the config may go before it. */
    if (o->key) {
        memcpy(s->key, o->key, sizeof(s->key));
        s->o.key = s->key;
    }
    bool names_ok;
    s->o.sensitive = (const char *const *)copy_names(o->sensitive, o->n_sensitive, &names_ok);
    if (!names_ok) {
        free_names(s->o.sensitive, o->n_sensitive);
        s->o.sensitive = NULL;
        s->o.n_sensitive = 0;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->pub.ops = &sqlite_ops;
    s->pub.impl = s;
    s->lock_fd = -1;
    if (o->exclusive && (r = take_lock(s, err)) < 0)
        goto fail;
    /* NOMUTEX: after this function, only the store thread touches the connection. */
    int rc = sqlite3_open_v2(
        o->path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (!s->o.path || rc != SQLITE_OK || !names_ok) {
        snprintf(err->msg, sizeof(err->msg), "%s: %s", o->path,
                 s->db ? sqlite3_errmsg(s->db) : "out of memory");
        goto fail;
    }
    sqlite3_extended_result_codes(s->db, 0);
    char cap[64];
    snprintf(cap, sizeof(cap), "PRAGMA max_page_count = %llu",
             (unsigned long long)(o->max_file_bytes / 4096));
    /* A lock held by another process (the CLI) is waited for, not failed at once. */
    if ((r = pragma(s, "PRAGMA busy_timeout = 5000", NULL, err)) < 0 ||
        (r = pragma(s, "PRAGMA page_size = 4096", NULL, err)) < 0 ||
        (r = pragma(s, "PRAGMA journal_mode = WAL", "wal", err)) < 0 ||
        (r = pragma(s, "PRAGMA synchronous = FULL", NULL, err)) < 0 ||
        (o->max_file_bytes && (r = pragma(s, cap, NULL, err)) < 0))
        goto fail;
    s->page_size = 4096;
    if ((r = sql_setup(s, err)) < 0 || (r = sql_ops_setup(s, err)) < 0)
        goto fail;
    if (o->exclusive) {
        int n = sql_recover(s);
        if (n < 0) {
            snprintf(err->msg, sizeof(err->msg), "%s: resuming the deliveries left in flight: %s",
                     o->path, sqlite3_errmsg(s->db));
            r = n;
            goto fail;
        }
        atomic_store(&s->recovered, (uint64_t)n);
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "PRAGMA page_size", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        s->page_size = (uint64_t)sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    atomic_store(&s->live_pub, s->live);
    atomic_store(&s->bytes, sql_bytes(s));
    if ((rc = pthread_create(&s->thread, NULL, store_thread, s)) != 0) {
        snprintf(err->msg, sizeof(err->msg), "%s: cannot start the store thread: %s", o->path,
                 strerror(rc));
        r = STORE_EIO;
        goto fail;
    }
    *out = &s->pub;
    return 0;
fail:
    free_impl(s);
    return r;
}
