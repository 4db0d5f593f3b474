/* The PostgreSQL store (proxy/store/pg*.c) on a private server of the suite's
 * (tests/support/pgserver.h): every case test_store.c shares (store_cases_ops.c,
 * store_cases_admin.c), the same bodies compiled again on this backend (STORE_PG), then what
 * only a shared store has: several stores on one namespace, namespaces apart, the schema's
 * version, the password, and the database going away. */
#define STORE_PG 1
#include "tests/unit/store_suite.h"

#include "tests/unit/store_cases_ops.c"
#include "tests/unit/store_cases_admin.c"

#include "tests/support/pgserver_hooks.h"

/* An admin connection to database 'db' of server 'p'. */
static PGconn *admin(const struct pgserver *p, const char *db)
{
    char info[256];
    snprintf(info, sizeof(info), "host=127.0.0.1 port=%u user=postgres dbname=%s password=%s",
             p->port, db, PGSERVER_PASSWORD);
    PGconn *c = PQconnectdb(info);
    cr_assert_eq(PQstatus(c), CONNECTION_OK, "%s", PQerrorMessage(c));
    return c;
}

static void admin_exec(PGconn *c, const char *sql)
{
    PGresult *res = PQexec(c, sql);
    cr_assert(PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK,
              "%s: %s", sql, PQerrorMessage(c));
    PQclear(res);
}

/* A new empty database on the suite's server, its URL into url[cap]. */
static void new_database(char *url, size_t cap)
{
    char name[64], sql[128];
    snprintf(name, sizeof(name), "db_%ld", (long)getpid());
    PGconn *c = admin(&pg, "postgres");
    snprintf(sql, sizeof(sql), "CREATE DATABASE %s", name);
    admin_exec(c, sql);
    PQfinish(c);
    snprintf(url, cap, "postgresql://postgres@127.0.0.1:%u/%s", pg.port, name);
}

struct claimer {
    struct store *s;
    const char *owner;
    char (*ids)[STORE_ID_SIZE];
    size_t n;
};

/* Claims a few at a time until a claim finds none, keeping every id it was given. */
static void *claim_all(void *arg)
{
    struct claimer *k = arg;
    struct store_cq *q = store_cq_new();
    for (int round = 0; round < 1000; round++) {
        struct store_call c = { .cq = q };
        if (store_claim_due(k->s, &c, k->owner, 7) != 0 || store_call_wait(&c, 30000) != 0 ||
            c.result != 0)
            break;
        size_t got = c.n;
        for (size_t i = 0; i < got; i++)
            memcpy(k->ids[k->n++], c.items[i].id, STORE_ID_SIZE);
        store_call_clear(&c);
        if (!got)
            break;
    }
    store_cq_free(q);
    return NULL;
}

Test(store, two_stores_on_one_namespace_never_claim_the_same_row)
{
    enum { N = 300 };
    struct store *a = open_default(), *b = open_default();
    for (int i = 0; i < N; i++)
        cr_assert_eq(enqueue(i % 2 ? a : b, "hooks", NULL, "x", 0, NULL), 0);
    struct claimer k[2] = { { .s = a, .owner = "proxy-a" }, { .s = b, .owner = "proxy-b" } };
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        k[i].ids = calloc(N, STORE_ID_SIZE);
        cr_assert_eq(pthread_create(&t[i], NULL, claim_all, &k[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    cr_expect_eq(k[0].n + k[1].n, N, "every row claimed once: %zu + %zu", k[0].n, k[1].n);
    for (size_t i = 0; i < k[0].n; i++)
        for (size_t j = 0; j < k[1].n; j++)
            cr_assert_str_neq(k[0].ids[i], k[1].ids[j], "claimed by both");
    cr_log_info("proxy-a claimed %zu, proxy-b %zu", k[0].n, k[1].n);
    free(k[0].ids);
    free(k[1].ids);
    store_close(a);
    store_close(b);
}

Test(store, a_lease_run_out_is_taken_by_another_store_and_its_owner_is_stale)
{
    struct store *a = open_default(), *b = open_default();
    char id[STORE_ID_SIZE], got[1][STORE_ID_SIZE];
    cr_assert_eq(enqueue(a, "hooks", NULL, "x", 0, id), 0);
    cr_assert_eq(claim(a, "proxy-a", 1, NULL), 1);
    cr_expect_eq(claim(b, "proxy-b", 1, NULL), 0, "not while a's lease holds");
    atomic_fetch_add(&fake_now, 1000); /* the lease (1 s) ran out: proxy-a died, say */
    cr_assert_eq(claim(b, "proxy-b", 1, got), 1);
    cr_expect_str_eq(got[0], id);
    cr_expect_eq(complete(a, id, "proxy-a"), STORE_ESTALE, "a no longer holds it");
    cr_expect_eq(complete(b, id, "proxy-b"), 0);
    struct store_delivery d;
    cr_assert_eq(get(a, id, &d), 0);
    cr_expect_eq(d.state, STORE_DELIVERED);
    cr_assert_eq(d.ntries, 2);
    cr_expect_str_eq(d.tries[0].outcome, "lease_expired");
    store_delivery_clear(&d);
    store_close(a);
    store_close(b);
}

Test(store, two_namespaces_never_see_each_others_rows)
{
    struct store *a = open_default();
    struct store_opts o = opts();
    char other[128];
    snprintf(other, sizeof(other), "%s-other", ns);
    o.pg_namespace = other;
    struct store *b = open_with(&o);
    char id[STORE_ID_SIZE];
    cr_assert_eq(enqueue(a, "hooks", NULL, "x", 0, id), 0);
    cr_assert_eq(enqueue(a, "hooks", "key-1", "x", 0, NULL), 0);
    cr_expect_eq(claim(b, "b", 10, NULL), 0, "b claims none of a's");
    struct store_delivery d;
    cr_expect_eq(get(b, id, &d), STORE_ENOTFOUND);
    store_delivery_clear(&d);
    cr_expect_eq(by_id(b, store_drop, id), STORE_ENOTFOUND);
    cr_expect_eq(by_id(b, store_replay, id), STORE_ENOTFOUND);
    struct store_filter f = { .state = -1, .limit = 10 };
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_list(b, &c, &f)), 0);
    cr_expect_eq(c.total, 0);
    store_call_clear(&c);
    struct store_match m = { .state = -1 };
    cr_assert_eq(wait_for(&c, store_find(b, &c, &m)), 0);
    cr_expect_eq(c.total, 0);
    store_call_clear(&c);
    cr_assert_eq(wait_for(&c, store_counts(b, &c)), 0);
    cr_expect_eq(c.ncounts, 0);
    store_call_clear(&c);
    /* the same Idempotency-Key in another namespace is another accept */
    char id2[STORE_ID_SIZE];
    cr_expect_eq(enqueue(b, "hooks", "key-1", "y", 0, id2), 0);
    cr_expect_eq(claim(a, "a", 10, NULL), 2, "a's own, untouched");
    store_close(a);
    store_close(b);
}

Test(store, migrate_creates_the_schema_once_and_a_newer_one_refuses_open)
{
    char url[160];
    new_database(url, sizeof(url));
    struct store_opts o = opts();
    o.pg_url = url;
    int from = -1, to = -1;
    struct store_err err;
    cr_assert_eq(store_pg_migrate(&o, &from, &to, &err), 0, "%s", err.msg);
    cr_expect_eq(from, 0);
    cr_expect_geq(to, 1);
    cr_assert_eq(store_pg_migrate(&o, &from, &to, &err), 0, "%s", err.msg);
    cr_expect_eq(from, to, "nothing to do the second time");
    const char *at = strrchr(url, '/') + 1;
    PGconn *c = admin(&pg, at);
    admin_exec(c, "UPDATE retryproxy_schema SET version = 99");
    PQfinish(c);
    struct store *s = NULL;
    cr_assert_eq(store_pg_open(&o, &s, &err), STORE_EINVAL);
    cr_assert_null(s);
    cr_expect(strstr(err.msg, "version 99") != NULL, "%s", err.msg);
}

Test(store, a_wrong_password_is_refused_at_open_saying_why)
{
    struct store_opts o = opts();
    o.pg_password = "not-the-password";
    struct store *s = NULL;
    struct store_err err;
    cr_assert_eq(store_pg_open(&o, &s, &err), STORE_EIO);
    cr_expect(strstr(err.msg, "password authentication failed") != NULL, "%s", err.msg);
}

static int64_t mono_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The database stopped: every call fails at once with STORE_EIO and the store says it is down;
 * started again: calls succeed again, nothing acknowledged before was lost. A server of this
 * test's own: the suite's serves the other tests meanwhile. */
Test(store, calls_fail_fast_while_the_database_is_down_and_come_back_after, .timeout = 120)
{
    struct pgserver own;
    cr_assert_eq(pgserver_start(&own), 0);
    struct store_opts o = opts();
    o.pg_url = own.url;
    struct store *s = open_with(&o);
    char id[STORE_ID_SIZE];
    cr_assert_eq(enqueue(s, "hooks", NULL, "before", 0, id), 0);
    cr_assert_eq(pgserver_halt(&own), 0);
    int64_t t0 = mono_now_ms();
    int r = enqueue(s, "hooks", NULL, "during", 0, NULL);
    int64_t first = mono_now_ms() - t0;
    cr_expect_eq(r, STORE_EIO, "the call that met the loss: %d", r);
    t0 = mono_now_ms();
    for (int i = 0; i < 20; i++)
        cr_expect_eq(enqueue(s, "hooks", NULL, "during", 0, NULL), STORE_EIO);
    int64_t twenty = mono_now_ms() - t0;
    struct store_stats st;
    store_stats(s, &st);
    cr_expect_eq(st.down, 1);
    cr_expect_geq(st.disconnects, 1);
    cr_log_info("down: the first call failed in %lld ms, 20 more in %lld ms", (long long)first,
                (long long)twenty);
    cr_expect_lt(twenty, 10000, "20 calls while down took %lld ms", (long long)twenty);
    cr_assert_eq(pgserver_restart(&own), 0);
    int64_t until = mono_now_ms() + 30000;
    while ((r = enqueue(s, "hooks", NULL, "after", 0, NULL)) != 0 && mono_now_ms() < until)
        usleep(100 * 1000);
    cr_expect_eq(r, 0, "back after the restart");
    store_stats(s, &st);
    cr_expect_eq(st.down, 0);
    struct store_delivery d;
    cr_expect_eq(get(s, id, &d), 0, "the accept before the outage is kept");
    store_delivery_clear(&d);
    store_close(s);
    pgserver_stop(&own);
}

/* Two proxies taking one Idempotency-Key at once: the second's insert meets the first's
 * uncommitted row (here a transaction of the test's, held open), waits for its commit, and
 * answers with its id, as for any repeat with the same body (not 422). */
Test(store, the_same_key_taken_by_two_proxies_at_once_is_one_delivery)
{
    struct store *s = open_default();
    PGconn *other = admin(&pg, "postgres");
    admin_exec(other, "BEGIN");
    char hash[32], sql[768];
    snprintf(hash, sizeof(hash), "%lld", (long long)store_body_hash("x", 1));
    snprintf(sql, sizeof(sql),
             "INSERT INTO retryproxy_deliveries(namespace, id, route, method, target, fields, body,"
             " idem_key, body_hash, created_at, next_at, state) VALUES('%s',"
             " '0123456789abcdef0123456789abcdef', 'hooks', 'POST', '/hook', '', 'x', 'k-race',"
             " %s, 1, 1, 0)",
             ns, hash);
    admin_exec(other, sql);
    struct store_field f[] = { { "x-a", "1" } };
    struct store_new d = { .route = "hooks",
                           .method = "POST",
                           .target = "/hook",
                           .fields = f,
                           .nfields = 1,
                           .body = "x",
                           .body_len = 1,
                           .idem_key = "k-race" };
    struct store_call c = { .cq = cq };
    cr_assert_eq(store_enqueue(s, &c, &d), 0);
    cr_expect_eq(store_call_wait(&c, 500), -ETIMEDOUT, "the insert waits for the other's commit");
    admin_exec(other, "COMMIT");
    PQfinish(other);
    cr_assert_eq(store_call_wait(&c, 30000), 0);
    cr_expect_eq(c.result, 0, "not a conflict: %d", c.result);
    cr_expect(c.dup);
    cr_expect_str_eq(c.id, "0123456789abcdef0123456789abcdef");
    store_call_clear(&c);
    store_close(s);
}

/* The ends of one batch are written by one statement, each call answered as when they go one by
 * one (pg_end_set, what bounds a backlog's drain: docs/delivery.md). The store's thread is held
 * on a table lock by a get while the ends queue up behind it, so that they make one batch; a
 * statement trigger counts the UPDATEs the server runs. */
Test(store, the_ends_of_one_batch_are_one_statement_each_answered_as_alone, .timeout = 120)
{
    char url[160];
    new_database(url, sizeof(url));
    struct store_opts o = opts();
    o.pg_url = url;
    struct store *s = open_with(&o);
    char ids[6][STORE_ID_SIZE];
    for (int i = 0; i < 6; i++)
        cr_assert_eq(enqueue(s, "hooks", NULL, "x", 0, ids[i]), 0);
    cr_assert_eq(claim(s, "proxy-a", 6, NULL), 6);
    const char *db = strrchr(url, '/') + 1;
    PGconn *c = admin(&pg, db);
    admin_exec(c, "CREATE TABLE updates_seen(n integer NOT NULL); INSERT INTO updates_seen"
                  " VALUES (0); CREATE FUNCTION seen() RETURNS trigger LANGUAGE plpgsql AS"
                  " $$BEGIN UPDATE updates_seen SET n = n + 1; RETURN NULL; END$$;"
                  " CREATE TRIGGER seen AFTER UPDATE ON retryproxy_deliveries"
                  " FOR EACH STATEMENT EXECUTE FUNCTION seen()");
    admin_exec(c, "BEGIN; LOCK TABLE retryproxy_deliveries IN ACCESS EXCLUSIVE MODE");
    struct store_call blocker = { .cq = cq };
    cr_assert_eq(store_get(s, &blocker, ids[5]), 0);
    char *waiting = NULL;
    for (int i = 0; i < 400; i++) { /* the store's thread waits on the lock */
        free(waiting);
        waiting = pgserver_query(&pg,
                                 "SELECT count(*) FROM pg_stat_activity WHERE datname = $1"
                                 " AND wait_event_type = 'Lock'",
                                 db, NULL);
        if (waiting && strcmp(waiting, "1") == 0)
            break;
        usleep(50 * 1000);
    }
    cr_assert_str_eq(waiting, "1", "the store's thread never waited on the lock");
    free(waiting);
    struct store_attempt a = try_of(200, "ok"), r = try_of(503, "status");
    r.delay_ms = 4000;
    uint64_t later = atomic_load(&fake_now) + 5000;
    const char unknown[STORE_ID_SIZE] = "0123456789abcdef0123456789abcdef";
    struct {
        const char *id, *owner;
        bool resched, tried;
        int want;
    } ends[] = {
        { ids[0], "proxy-a", false, true, 0 },
        { ids[1], "proxy-a", true, true, 0 },
        { ids[2], "proxy-b", false, true, STORE_ESTALE }, /* not its lease */
        { unknown, "proxy-a", false, true, STORE_ENOTFOUND },
        { ids[3], "proxy-a", false, true, 0 },
        { ids[3], "proxy-a", false, true, STORE_ESTALE }, /* ended just before */
        { ids[4], "proxy-a", true, false, 0 },            /* given back: no attempt went */
        { ids[5], "proxy-a", true, true, 0 },
    };
    enum { N = sizeof(ends) / sizeof(ends[0]) };
    struct store_call calls[N];
    for (size_t i = 0; i < N; i++) {
        calls[i] = (struct store_call){ .cq = cq };
        const struct store_attempt *t = !ends[i].tried ? NULL : ends[i].resched ? &r : &a;
        int q = ends[i].resched
                    ? store_reschedule(s, &calls[i], ends[i].id, ends[i].owner, t, later)
                    : store_complete(s, &calls[i], ends[i].id, ends[i].owner, t);
        cr_assert_eq(q, 0);
    }
    admin_exec(c, "COMMIT");
    cr_expect_eq(wait_for(&blocker, 0), 0);
    store_call_clear(&blocker);
    for (size_t i = 0; i < N; i++)
        cr_expect_eq(wait_for(&calls[i], 0), ends[i].want, "end %zu: %d, not %d", i,
                     calls[i].result, ends[i].want);
    PGresult *res = PQexec(c, "SELECT n FROM updates_seen");
    cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK);
    int updates = atoi(PQgetvalue(res, 0, 0));
    PQclear(res);
    PQfinish(c);
    /* one for the five ends taken together (the three answered one by one with an error undo
     * theirs with their savepoint); one each when every end goes alone */
    cr_expect_eq(updates, 1, "%d UPDATE statements for %d ends", updates, (int)N);
    struct {
        enum store_state state;
        size_t ntries;
        uint64_t next_at; /* 0: not looked at */
        const char *outcome, *claimed_by;
    } want[6] = {
        { STORE_DELIVERED, 1, 0, "ok", NULL },      { STORE_SCHEDULED, 1, later, "status", NULL },
        { STORE_IN_FLIGHT, 0, 0, NULL, "proxy-a" }, /* the stale end changed nothing */
        { STORE_DELIVERED, 1, 0, "ok", NULL },      /* the second end wrote no attempt */
        { STORE_SCHEDULED, 0, later, NULL, NULL },  { STORE_SCHEDULED, 1, later, "status", NULL },
    };
    for (int i = 0; i < 6; i++) {
        struct store_delivery d;
        cr_assert_eq(get(s, ids[i], &d), 0);
        cr_expect_eq(d.state, want[i].state, "delivery %d", i);
        cr_expect_eq(d.attempts, want[i].ntries, "delivery %d", i);
        cr_expect_eq(d.ntries, want[i].ntries, "delivery %d", i);
        if (want[i].next_at)
            cr_expect_eq(d.next_at, want[i].next_at, "delivery %d", i);
        if (d.ntries == 1 && want[i].outcome)
            cr_expect_str_eq(d.tries[0].outcome, want[i].outcome, "delivery %d", i);
        if (want[i].state == STORE_SCHEDULED && d.ntries)
            cr_expect_eq(d.last_delay_ms, 4000, "delivery %d", i);
        cr_expect(want[i].claimed_by ? d.claimed_by && !strcmp(d.claimed_by, want[i].claimed_by)
                                     : !d.claimed_by,
                  "delivery %d: held by %s", i, d.claimed_by ? d.claimed_by : "none");
        store_delivery_clear(&d);
    }
    store_close(s);
}
