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

/* One call in the open transaction: the operators' ops are sqlite_ops.c's, the rest
 * sqlite_sql.c's. */
static const struct store_runner runner = STORE_RUNNER(sql);

/* Runs one batch of calls in one transaction and finishes them all. */
static void run_batch(struct store_impl *s, struct store_call *batch)
{
    uint64_t t0 = store_mono_us();
    int lost = sql_error(sql_step_reset(s->st[S_BEGIN]));
    s->live_delta = 0;
    s->bytes_added = 0;
    struct store_call *c;
    for (c = batch; c && !lost; c = c->next) {
        if (!store_op_writes(c->op)) {
            c->result = store_q_run(&runner, s, c);
            continue;
        }
        int r = sql_error(sql_step_reset(s->st[S_SAVEPOINT]));
        int64_t delta = s->live_delta;
        uint64_t added = s->bytes_added;
        if (r == 0 && (r = store_q_run(&runner, s, c)) < 0) {
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
    if (!lost)
        s->live = (uint64_t)((int64_t)s->live + s->live_delta);
    store_q_end_batch(&s->q, batch, c, lost, t0, s->live, sql_bytes(s));
}

static void *store_thread(void *arg)
{
    struct store_impl *s = arg;
    /* With retention on, the thread wakes each second to sweep, calls or not. */
    int wake = s->q.o.retention ? 1000 : 0;
    bool stop = false;
    while (!stop) {
        struct store_call *batch = store_q_take(&s->q, s->q.o.max_batch, wake, &stop);
        sql_sweep(s); /* before the batch: what it reads is as retention leaves it */
        if (batch)
            run_batch(s, batch);
    }
    return NULL;
}

static void free_impl(struct store_impl *s)
{
    sql_finalize(s);
    sql_ops_finalize(s);
    sqlite3_close(s->db);
    if (s->lock_fd >= 0)
        close(s->lock_fd); /* the flock goes with it */
    store_q_fini(&s->q);
    free(s);
}

static void s_close(struct store_impl *s)
{
    store_q_stop(&s->q);
    free_impl(s);
}

static const struct store_ops sqlite_ops = {
    .name = "sqlite",
    BACKEND_OPS,
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
        snprintf(err->msg, sizeof(err->msg), "%s: %s: %s", s->q.o.path, sql,
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
    if (asprintf(&lock, "%s.lock", s->q.o.path) < 0)
        return STORE_EIO;
    s->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->lock_fd < 0) {
        snprintf(err->msg, sizeof(err->msg), "%s: %s", lock, strerror(errno));
        r = STORE_EIO;
    } else if (flock(s->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        bool held = errno == EWOULDBLOCK;
        snprintf(err->msg, sizeof(err->msg), "%s is in use by another process (%s is %s)",
                 s->q.o.path, lock, held ? "locked" : strerror(errno));
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
    bool names_ok = store_q_init(&s->q, o, &sqlite_ops) == 0;
    s->lock_fd = -1;
    if (o->exclusive && (r = take_lock(s, err)) < 0)
        goto fail;
    /* NOMUTEX: after this function, only the store thread touches the connection. */
    int rc = sqlite3_open_v2(
        o->path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (!s->q.o.path || rc != SQLITE_OK || !names_ok) {
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
        atomic_store(&s->q.st.recovered, (uint64_t)n);
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "PRAGMA page_size", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        s->page_size = (uint64_t)sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    atomic_store(&s->q.st.count, s->live);
    atomic_store(&s->q.st.bytes, sql_bytes(s));
    if ((rc = pthread_create(&s->q.thread, NULL, store_thread, s)) != 0) {
        snprintf(err->msg, sizeof(err->msg), "%s: cannot start the store thread: %s", o->path,
                 strerror(rc));
        r = STORE_EIO;
        goto fail;
    }
    *out = &s->q.pub;
    return 0;
fail:
    free_impl(s);
    return r;
}
