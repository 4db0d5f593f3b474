/* pg -- the shared store: one PostgreSQL database that every proxy of a fleet uses, each in its
 * namespace (docs/delivery.md, "Shared store (PostgreSQL)").
 *
 * The same model as the SQLite store (sqlite.c): callers never run libpq; the store's thread
 * owns the one connection, takes every call waiting, runs them in ONE transaction (each under a
 * savepoint, so one that fails leaves the others in), commits, and only then finishes them: an
 * enqueue that completed with 0 is committed (synchronous_commit as the server has it: on by
 * default). The difference is the database being away. A lost connection fails the batch it
 * was in (nothing of it is acknowledged), and from then on every call fails at once with
 * STORE_EIO while the thread tries again, 100 ms after the loss and then backing off to 5 s:
 * no caller ever waits on a database that is not there (store_stats.down says it is).
 */
#include "proxy/store/pg_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/telemetry/log.h"

#define RETRY_MAX_MS 5000
/* While down the thread wakes this often to try again, calls or not (the gauge comes back). */
#define DOWN_WAKE_MS 250
/* Every proxy migrating at once takes this lock (pg_advisory_xact_lock) in turn. */
#define MIGRATE_LOCK "7526209310651402240"

/* Each step takes the database from the version before it to its own (index + 1). */
static const char *const migrations[PG_SCHEMA_VERSION] = {
    "CREATE TABLE retryproxy_deliveries("
    " seq bigserial PRIMARY KEY,"
    " namespace text NOT NULL,"
    " id text NOT NULL UNIQUE,"
    " route text NOT NULL, method text NOT NULL, target text NOT NULL,"
    " fields bytea NOT NULL, body bytea NOT NULL,"
    " idem_key text, body_hash bigint NOT NULL,"
    " created_at bigint NOT NULL, next_at bigint NOT NULL,"
    " attempts integer NOT NULL DEFAULT 0, replays integer NOT NULL DEFAULT 0,"
    " state smallint NOT NULL,"
    " claimed_until bigint, claimed_by text,"
    " reason text, final_head bytea, final_body bytea,"
    " last_delay bigint NOT NULL DEFAULT 0, upstream text,"
    /* the row's size as the bounds count it (sql_new_row), summed off an index each second */
    " size bigint NOT NULL DEFAULT 0);"
    /* the claim's: due rows of a namespace (and of a route) in due order, leases by expiry */
    "CREATE INDEX retryproxy_due ON retryproxy_deliveries(namespace, state, next_at);"
    "CREATE INDEX retryproxy_route_due ON retryproxy_deliveries(namespace, route, state,"
    " next_at);"
    "CREATE INDEX retryproxy_lease ON retryproxy_deliveries(namespace, state, claimed_until);"
    "CREATE UNIQUE INDEX retryproxy_key ON retryproxy_deliveries(namespace, route, idem_key)"
    " WHERE idem_key IS NOT NULL;"
    "CREATE INDEX retryproxy_size ON retryproxy_deliveries(namespace, state) INCLUDE (size);"
    /* the operators' filters and retention */
    "CREATE INDEX retryproxy_created ON retryproxy_deliveries(namespace, state, created_at);"
    "CREATE INDEX retryproxy_route_created ON retryproxy_deliveries(namespace, route, state,"
    " created_at);"
    "CREATE TABLE retryproxy_attempts("
    " n bigserial PRIMARY KEY,"
    " delivery text NOT NULL REFERENCES retryproxy_deliveries(id) ON DELETE CASCADE,"
    " at bigint NOT NULL, duration_ms bigint NOT NULL, status integer NOT NULL,"
    " outcome text NOT NULL, upstream text);"
    "CREATE INDEX retryproxy_attempts_delivery ON retryproxy_attempts(delivery, n);",
};

static int exec_plain(PGconn *c, const char *sql, char *why, size_t cap)
{
    PGresult *res = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(res);
    int r = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? 0 : STORE_EIO;
    if (r < 0)
        pg_trim_msg(why, cap, PQresultErrorMessage(res));
    PQclear(res);
    return r;
}

/* Creates or migrates the schema in one transaction under the advisory lock. */
static int migrate(PGconn *c, int *from, char *why, size_t cap)
{
    int r = exec_plain(c, "BEGIN", why, cap);
    if (r == 0)
        r = exec_plain(c, "SELECT pg_advisory_xact_lock(" MIGRATE_LOCK ")", why, cap);
    if (r == 0)
        r = exec_plain(c, "CREATE TABLE IF NOT EXISTS retryproxy_schema(version integer NOT NULL)",
                       why, cap);
    PGresult *res =
        r == 0 ? PQexec(c, "SELECT coalesce(max(version), 0) FROM retryproxy_schema") : NULL;
    if (r == 0 && PQresultStatus(res) != PGRES_TUPLES_OK) {
        pg_trim_msg(why, cap, PQresultErrorMessage(res));
        r = STORE_EIO;
    }
    int version = r == 0 ? atoi(PQgetvalue(res, 0, 0)) : 0;
    PQclear(res);
    *from = version;
    if (r == 0 && version > PG_SCHEMA_VERSION) {
        snprintf(why, cap, "the store's schema is version %d, newer than this program's %d",
                 version, PG_SCHEMA_VERSION);
        r = STORE_EINVAL;
    }
    for (int v = version; r == 0 && v < PG_SCHEMA_VERSION; v++)
        r = exec_plain(c, migrations[v], why, cap);
    if (r == 0 && version < PG_SCHEMA_VERSION) {
        char set[96];
        snprintf(set, sizeof(set),
                 "DELETE FROM retryproxy_schema; INSERT INTO retryproxy_schema VALUES(%d)",
                 PG_SCHEMA_VERSION);
        r = exec_plain(c, set, why, cap);
    }
    if (r == 0)
        r = exec_plain(c, "COMMIT", why, cap);
    else
        PQclear(PQexec(c, "ROLLBACK"));
    return r;
}

int store_pg_migrate(const struct store_opts *o, int *from, int *to, struct store_err *err)
{
    char why[200];
    err->msg[0] = '\0';
    PGconn *c = o->pg_url ? pg_connect(o, why, sizeof(why)) : NULL;
    if (!c) {
        snprintf(err->msg, sizeof(err->msg), "postgres: cannot connect: %s",
                 o->pg_url ? why : "no url");
        return STORE_EIO;
    }
    int r = migrate(c, from, why, sizeof(why));
    if (r < 0)
        snprintf(err->msg, sizeof(err->msg), "postgres: %s", why);
    *to = r == 0 ? PG_SCHEMA_VERSION : *from;
    PQfinish(c);
    return r;
}

/* Counts the namespace's rows kept (but the delivered) and their bytes: other proxies add
 * theirs, so the bounds read it again at most a second old. */
static int recount(struct store_impl *s)
{
    struct pgq q = { 0 };
    pgq_text(&q, s->ns);
    int r;
    PGresult *res = pg_exec(s,
                            "SELECT count(*) FILTER (WHERE state <> 2), coalesce(sum(size), 0)"
                            " FROM retryproxy_deliveries WHERE namespace = $1",
                            &q, &r);
    if (res) {
        s->live = (uint64_t)pg_int(res, 0, 0);
        s->bytes = (uint64_t)pg_int(res, 0, 1);
        s->counted_at = pg_mono_ms();
        atomic_store(&s->q.st.count, s->live);
        atomic_store(&s->q.st.bytes, s->bytes);
    }
    PQclear(res);
    return r;
}

/* While down: a new connection once the backoff has passed. */
static void reconnect(struct store_impl *s)
{
    uint64_t now = pg_mono_ms();
    if (s->conn || now < s->retry_at)
        return;
    char why[200];
    s->conn = pg_connect(&s->q.o, why, sizeof(why));
    if (!s->conn) {
        s->backoff_ms = s->backoff_ms ? s->backoff_ms * 2 : PG_RETRY_FIRST_MS;
        if (s->backoff_ms > RETRY_MAX_MS)
            s->backoff_ms = RETRY_MAX_MS;
        s->retry_at = now + s->backoff_ms;
        return;
    }
    s->backoff_ms = 0;
    atomic_store(&s->q.st.down, 0);
    log_event(CFG_LOG_INFO, "delivery store: the database is back", "namespace", s->ns, NULL);
    recount(s);
}

static const struct store_runner runner = STORE_RUNNER(pg);

/* Runs call 'c' under its own savepoint, so that one that fails leaves the others of the batch
 * in: 0 (its result in c->result), or STORE_EIO when the connection is lost. */
static int run_one(struct store_impl *s, struct store_call *c)
{
    int64_t delta = s->live_delta;
    uint64_t added = s->bytes_added;
    int r = pg_cmd(s, "SAVEPOINT call", NULL, NULL);
    if (r == 0 && (r = store_q_run(&runner, s, c)) < 0 && s->conn) {
        pg_cmd(s, "ROLLBACK TO SAVEPOINT call", NULL, NULL);
        s->live_delta = delta;
        s->bytes_added = added;
    }
    if (s->conn)
        pg_cmd(s, "RELEASE SAVEPOINT call", NULL, NULL);
    if (!s->conn)
        return STORE_EIO; /* nothing of the transaction is known to be kept */
    c->result = r;
    return 0;
}

/* Runs one batch of calls in one transaction and finishes them all. A run of ends next to each
 * other (completes, reschedules) is written by one statement (pg_end_set): four round trips a
 * call become three a run, what bounds a backlog's drain (docs/delivery.md); those it leaves
 * go one by one, for their exact answer. */
static void run_batch(struct store_impl *s, struct store_call *batch)
{
    uint64_t t0 = store_mono_us();
    int lost_r = s->conn ? pg_cmd(s, "BEGIN", NULL, NULL) : STORE_EIO;
    if (!lost_r && pg_mono_ms() - s->counted_at >= 1000)
        lost_r = recount(s);
    s->live_delta = 0;
    s->bytes_added = 0;
    struct store_call *c = batch;
    while (c && !lost_r) {
        size_t n = 0;
        for (struct store_call *e = c; e && pg_end_settable(e); e = e->next)
            n++;
        bool *done = n > 1 ? calloc(n, sizeof(*done)) : NULL;
        if (done && (lost_r = pg_end_set(s, c, n, done)) < 0) {
            free(done);
            break;
        }
        for (size_t i = 0; i < (done ? n : 1) && !lost_r; i++, c = c->next) {
            if (done && done[i])
                c->result = 0;
            else if ((lost_r = run_one(s, c)) < 0)
                break;
        }
        free(done);
    }
    if (!lost_r) {
        PGresult *res = pg_exec(s, "COMMIT", NULL, &lost_r);
        /* a transaction that failed answers COMMIT with ROLLBACK */
        if (res && strcmp(PQcmdStatus(res), "COMMIT") != 0)
            lost_r = STORE_EIO;
        PQclear(res);
    } else if (s->conn) {
        pg_cmd(s, "ROLLBACK", NULL, NULL);
    }
    if (!lost_r) {
        s->live = (uint64_t)((int64_t)s->live + s->live_delta);
        s->bytes += s->bytes_added;
    }
    store_q_end_batch(&s->q, batch, c, lost_r, t0, s->live, s->bytes);
}

static void *store_thread(void *arg)
{
    struct store_impl *s = arg;
    bool stop = false;
    while (!stop) {
        int wake = !s->conn ? DOWN_WAKE_MS : s->q.o.retention ? 1000 : 0;
        struct store_call *batch = store_q_take(&s->q, s->q.o.max_batch, wake, &stop);
        reconnect(s);
        pg_sweep(s);
        if (batch)
            run_batch(s, batch);
    }
    return NULL;
}

static void free_impl(struct store_impl *s)
{
    PQfinish(s->conn);
    store_q_fini(&s->q);
    free(s);
}

static void p_close(struct store_impl *s)
{
    store_q_stop(&s->q);
    free_impl(s);
}

static const struct store_ops pg_ops = {
    .name = "postgres",
    BACKEND_OPS,
    .close = p_close,
};

int store_pg_open(const struct store_opts *o, struct store **out, struct store_err *err)
{
    err->msg[0] = '\0';
    if (!o->pg_url || !o->pg_url[0] || o->lease_ms == 0) {
        snprintf(err->msg, sizeof(err->msg), "the store needs a url and a lease");
        return STORE_EINVAL;
    }
    struct store_impl *s = calloc(1, sizeof(*s));
    if (!s)
        return STORE_EIO;
    int r = STORE_EIO, from;
    char why[200];
    if (store_q_init(&s->q, o, &pg_ops) < 0) {
        snprintf(err->msg, sizeof(err->msg), "out of memory");
        goto fail;
    }
    s->ns = s->q.o.pg_namespace ? s->q.o.pg_namespace : "default";
    if (!(s->conn = pg_connect(&s->q.o, why, sizeof(why)))) {
        snprintf(err->msg, sizeof(err->msg), "postgres: cannot connect: %s", why);
        goto fail;
    }
    if ((r = migrate(s->conn, &from, why, sizeof(why))) < 0) {
        snprintf(err->msg, sizeof(err->msg), "postgres: %s", why);
        goto fail;
    }
    if ((r = recount(s)) < 0) {
        snprintf(err->msg, sizeof(err->msg), "postgres: counting the namespace's rows failed");
        goto fail;
    }
    int rc = pthread_create(&s->q.thread, NULL, store_thread, s);
    if (rc != 0) {
        snprintf(err->msg, sizeof(err->msg), "postgres: cannot start the store thread: %s",
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
