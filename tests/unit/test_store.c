/* The store of durable deliveries (proxy/store/store.h), with a clock of the test's: the
 * operations and their states, idempotency, leases, bounds, group commit, and what a SIGKILL
 * leaves behind. Built twice: as it is, on the SQLite store, against a real file in a directory
 * of the test's own; and included by test_store_pg.c with STORE_PG defined, the same cases on
 * the PostgreSQL store, each test in a namespace of its own on the suite's server (the cases
 * about the SQLite file alone are left out there). */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <signal.h>
#ifdef STORE_PG
#include <libpq-fe.h>
#else
#include <sqlite3.h>
#endif
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proxy/base/loop.h"
#include "proxy/store/store.h"
#ifdef STORE_PG
#include "tests/support/pgserver.h"
#endif

static char dir[64], path[128];
#ifdef STORE_PG
/* The suite's server (pgserver_env) and this test's namespace. */
static struct pgserver pg;
static char ns[96];
#endif
static _Atomic uint64_t fake_now = 1700000000000ULL;
static struct store_cq *cq;

static uint64_t fake_clock(void *arg)
{
    (void)arg;
    return atomic_load(&fake_now);
}

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/test_store.XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/deliveries.db", dir);
#ifdef STORE_PG
    cr_assert_eq(pgserver_env(&pg), 0, "the runner started no PostgreSQL server");
    snprintf(ns, sizeof(ns), "t%ld-%s", (long)getpid(), dir + strlen("/tmp/test_store."));
#endif
    cq = store_cq_new();
    cr_assert_not_null(cq);
}

static void teardown(void)
{
    store_cq_free(cq);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        cr_log_warn("could not remove %s", dir);
}

TestSuite(store, .init = setup, .fini = teardown);

static struct store_opts opts(void)
{
#ifdef STORE_PG
    return (struct store_opts){ .pg_url = pg.url,
                                .pg_password = PGSERVER_PASSWORD,
                                .pg_namespace = ns,
                                .lease_ms = 1000,
                                .clock = fake_clock };
#else
    return (struct store_opts){ .path = path, .lease_ms = 1000, .clock = fake_clock };
#endif
}

#ifdef STORE_PG
#define store_open store_pg_open
#else
#define store_open store_sqlite_open
#endif

static struct store *open_with(const struct store_opts *o)
{
    struct store *s = NULL;
    struct store_err err;
    int r = store_open(o, &s, &err);
    cr_assert_eq(r, 0, "open: %d %s", r, err.msg);
    return s;
}

static struct store *open_default(void)
{
    struct store_opts o = opts();
    return open_with(&o);
}

/* Waits for a call handed over with result 'r' (0), then returns the call's result. */
static int wait_for(struct store_call *c, int r)
{
    cr_assert_eq(r, 0, "the store refused the call at once: %d", r);
    cr_assert_eq(store_call_wait(c, 30000), 0, "the call did not complete");
    return c->result;
}

static int enqueue(struct store *s, const char *route, const char *key, const char *body,
                   uint64_t next_at, char id[STORE_ID_SIZE])
{
    struct store_field f[] = { { "content-type", "application/json" }, { "x-a", "1" } };
    struct store_new d = { .route = route,
                           .method = "POST",
                           .target = "/hook",
                           .fields = f,
                           .nfields = 2,
                           .body = body,
                           .body_len = strlen(body),
                           .idem_key = key,
                           .next_at = next_at };
    struct store_call c = { .cq = cq };
    int r = wait_for(&c, store_enqueue(s, &c, &d));
    if (id)
        memcpy(id, c.id, STORE_ID_SIZE);
    store_call_clear(&c);
    return r;
}

/* Claims up to 'max' for 'owner'; the ids into ids[] (may be NULL); how many. */
static size_t claim(struct store *s, const char *owner, size_t max, char ids[][STORE_ID_SIZE])
{
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_claim_due(s, &c, owner, max)), 0);
    size_t n = c.n;
    for (size_t i = 0; i < n; i++) {
        cr_expect_eq(c.items[i].state, STORE_IN_FLIGHT);
        cr_expect_str_eq(c.items[i].claimed_by, owner);
        if (ids)
            memcpy(ids[i], c.items[i].id, STORE_ID_SIZE);
    }
    store_call_clear(&c);
    return n;
}

static struct store_attempt try_of(int status, const char *outcome)
{
    struct store_attempt a = { .at_ms = atomic_load(&fake_now),
                               .duration_ms = 12,
                               .status = status };
    snprintf(a.outcome, sizeof(a.outcome), "%s", outcome);
    return a;
}

/* The delivery 'id', whole, into *d (the caller clears it); the get's result. */
static int get(struct store *s, const char *id, struct store_delivery *d)
{
    struct store_call c = { .cq = cq };
    int r = wait_for(&c, store_get(s, &c, id));
    memset(d, 0, sizeof(*d));
    if (r == 0) {
        *d = c.items[0];
        memset(&c.items[0], 0, sizeof(c.items[0]));
    }
    store_call_clear(&c);
    return r;
}

static int by_id(struct store *s, int (*op)(struct store *, struct store_call *, const char *),
                 const char *id)
{
    struct store_call c = { .cq = cq };
    int r = wait_for(&c, op(s, &c, id));
    store_call_clear(&c);
    return r;
}

static int complete(struct store *s, const char *id, const char *owner)
{
    struct store_attempt a = try_of(200, "ok");
    struct store_call c = { .cq = cq };
    return wait_for(&c, store_complete(s, &c, id, owner, &a));
}

Test(store, enqueue_then_claim_due_by_next_at)
{
    struct store_opts o = opts();
    o.lease_ms = 60000; /* the first claim's lease outlasts the test */
    struct store *s = open_with(&o);
    uint64_t t = atomic_load(&fake_now);
    char later[STORE_ID_SIZE], now[STORE_ID_SIZE], got[4][STORE_ID_SIZE];
    cr_assert_eq(enqueue(s, "hooks", NULL, "{\"a\":1}", t + 1000, later), 0);
    cr_assert_eq(enqueue(s, "hooks", NULL, "{\"a\":2}", 0, now), 0);
    cr_expect_eq(strlen(later), 32);
    cr_expect_str_neq(later, now);
    cr_assert_eq(claim(s, "w1", 4, got), 1, "only the one due now");
    cr_expect_str_eq(got[0], now);
    cr_expect_eq(claim(s, "w1", 4, NULL), 0, "claimed once");
    atomic_store(&fake_now, t + 999);
    cr_expect_eq(claim(s, "w1", 4, NULL), 0, "not due before its time");
    atomic_store(&fake_now, t + 1000);
    cr_assert_eq(claim(s, "w1", 4, got), 1);
    cr_expect_str_eq(got[0], later);
    struct store_stats st;
    store_stats(s, &st);
    cr_expect_eq(st.enqueued, 2);
    cr_expect_eq(st.count, 2);
    store_close(s);
}

Test(store, complete_makes_it_delivered_with_its_attempt)
{
    struct store *s = open_default();
    char id[STORE_ID_SIZE];
    cr_assert_eq(enqueue(s, "hooks", NULL, "x", 0, id), 0);
    cr_assert_eq(claim(s, "w1", 1, NULL), 1);
    cr_assert_eq(complete(s, id, "w1"), 0);
    struct store_delivery d;
    cr_assert_eq(get(s, id, &d), 0);
    cr_expect_eq(d.state, STORE_DELIVERED);
    cr_expect_eq(d.attempts, 1);
    cr_expect_null(d.claimed_by);
    cr_assert_eq(d.ntries, 1);
    cr_expect_eq(d.tries[0].status, 200);
    cr_expect_eq(d.tries[0].duration_ms, 12);
    cr_expect_str_eq(d.tries[0].outcome, "ok");
    store_delivery_clear(&d);
    cr_expect_eq(claim(s, "w1", 1, NULL), 0, "a delivered one is not claimed");
    struct store_stats st;
    store_stats(s, &st);
    cr_expect_eq(st.count, 0, "delivered ones are not counted against the bound");
    store_close(s);
}

/* The default store with one delivery of route "hooks", 'id', claimed by "w1". */
static struct store *claimed_one(char *id)
{
    struct store *s = open_default();
    cr_assert_eq(enqueue(s, "hooks", NULL, "x", 0, id), 0);
    cr_assert_eq(claim(s, "w1", 1, NULL), 1);
    return s;
}

Test(store, reschedule_records_the_attempt_and_waits_for_next_at)
{
    uint64_t t = atomic_load(&fake_now);
    char id[STORE_ID_SIZE];
    struct store *s = claimed_one(id);
    struct store_attempt a = try_of(503, "status");
    a.delay_ms = 500;
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_reschedule(s, &c, id, "w1", &a, t + 500)), 0);
    cr_expect_eq(claim(s, "w1", 1, NULL), 0);
    atomic_store(&fake_now, t + 500);
    cr_expect_eq(claim(s, "w2", 1, NULL), 1);
    struct store_delivery d;
    cr_assert_eq(get(s, id, &d), 0);
    cr_expect_eq(d.attempts, 1);
    cr_expect_eq(d.next_at, t + 500);
    cr_expect_eq(d.last_delay_ms, 500, "the delay is kept for the next one (decorrelated)");
    cr_assert_eq(d.ntries, 1);
    cr_expect_eq(d.tries[0].status, 503);
    cr_expect_str_eq(d.tries[0].outcome, "status");
    store_delivery_clear(&d);
    store_close(s);
}

/* A reschedule without an attempt (the courier's release: its upstream was at its bound and
 * nothing was sent) waits for next_at and changes neither the count nor the history. */
Test(store, reschedule_without_an_attempt_releases_the_claim_and_records_nothing)
{
    uint64_t t = atomic_load(&fake_now);
    char id[STORE_ID_SIZE];
    struct store *s = claimed_one(id);
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_reschedule(s, &c, id, "w1", NULL, t + 200)), 0);
    cr_expect_eq(claim(s, "w1", 1, NULL), 0, "not due before next_at");
    atomic_store(&fake_now, t + 200);
    cr_expect_eq(claim(s, "w2", 1, NULL), 1, "the lease is dropped: another owner claims it");
    struct store_delivery d;
    cr_assert_eq(get(s, id, &d), 0);
    cr_expect_eq(d.attempts, 0);
    cr_expect_eq(d.ntries, 0);
    store_delivery_clear(&d);
    store_close(s);
}

Test(store, bury_keeps_the_final_head_and_the_first_bytes_of_its_body)
{
    struct store_opts o = opts();
    o.dead_body_bytes = 8;
    struct store *s = open_with(&o);
    char id[STORE_ID_SIZE];
    cr_assert_eq(enqueue(s, "hooks", NULL, "x", 0, id), 0);
    cr_assert_eq(claim(s, "w1", 1, NULL), 1);
    const char *head = "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\n\r\n";
    struct store_dead dead = { .reason = "final",
                               .head = head,
                               .head_len = strlen(head),
                               .body = "0123456789abcdef",
                               .body_len = 16 };
    struct store_attempt a = try_of(400, "status");
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_bury(s, &c, id, "w1", &a, &dead)), 0);
    struct store_delivery d;
    cr_assert_eq(get(s, id, &d), 0);
    cr_expect_eq(d.state, STORE_DEAD);
    cr_expect_str_eq(d.reason, "final");
    cr_expect_eq(d.final_head_len, strlen(head));
    cr_expect_str_eq(d.final_head, head);
    cr_expect_eq(d.final_body_len, 8);
    cr_expect_str_eq(d.final_body, "01234567");
    cr_expect_eq(d.ntries, 1);
    store_delivery_clear(&d);
    cr_expect_eq(claim(s, "w1", 1, NULL), 0, "a dead letter is not claimed");
    store_close(s);
}

Test(store, get_returns_the_head_fields_and_body)
{
    struct store *s = open_default();
    char id[STORE_ID_SIZE];
    cr_assert_eq(enqueue(s, "hooks", "k-1", "{\"order\":7}", 0, id), 0);
    struct store_delivery d;
    cr_assert_eq(get(s, id, &d), 0);
    cr_expect_str_eq(d.id, id);
    cr_expect_str_eq(d.route, "hooks");
    cr_expect_str_eq(d.method, "POST");
    cr_expect_str_eq(d.target, "/hook");
    cr_assert_eq(d.nfields, 2);
    cr_expect_str_eq(d.fields[0].name, "content-type");
    cr_expect_str_eq(d.fields[0].value, "application/json");
    cr_expect_str_eq(d.fields[1].name, "x-a");
    cr_expect_eq(d.body_len, 11);
    cr_expect_str_eq(d.body, "{\"order\":7}");
    cr_expect_str_eq(d.idem_key, "k-1");
    cr_expect_eq(d.body_hash, store_body_hash("{\"order\":7}", 11));
    cr_expect_eq(d.created_at, atomic_load(&fake_now));
    cr_expect_eq(d.state, STORE_SCHEDULED);
    store_delivery_clear(&d);
    cr_expect_eq(get(s, "0123456789abcdef0123456789abcdef", &d), STORE_ENOTFOUND);
    store_close(s);
}

Test(store, list_filters_by_route_and_state_with_paging)
{
    struct store *s = open_default();
    char a[5][STORE_ID_SIZE], b[STORE_ID_SIZE];
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(enqueue(s, "a", NULL, "x", 0, a[i]), 0);
        cr_assert_eq(enqueue(s, "b", NULL, "y", 0, b), 0);
    }
    cr_assert_eq(claim(s, "w1", 20, NULL), 10);
    struct store_dead dead = { .reason = "attempts" };
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_bury(s, &c, a[3], "w1", NULL, &dead)), 0);

    struct store_filter f = { .route = "a", .state = -1, .limit = 2, .offset = 2 };
    c = (struct store_call){ .cq = cq };
    cr_assert_eq(wait_for(&c, store_list(s, &c, &f)), 0);
    cr_expect_eq(c.total, 5);
    cr_assert_eq(c.n, 2);
    cr_expect_str_eq(c.items[0].id, a[2], "in the order accepted");
    cr_expect_str_eq(c.items[1].id, a[3]);
    cr_expect_null(c.items[0].body, "a list leaves bodies out");
    cr_expect_eq(c.items[0].body_len, 1);
    store_call_clear(&c);

    f = (struct store_filter){ .route = "a", .state = STORE_DEAD };
    c = (struct store_call){ .cq = cq };
    cr_assert_eq(wait_for(&c, store_list(s, &c, &f)), 0);
    cr_assert_eq(c.total, 1);
    cr_assert_eq(c.n, 1);
    cr_expect_str_eq(c.items[0].id, a[3]);
    cr_expect_str_eq(c.items[0].reason, "attempts");
    store_call_clear(&c);

    f = (struct store_filter){ .state = STORE_IN_FLIGHT, .limit = 100 };
    c = (struct store_call){ .cq = cq };
    cr_assert_eq(wait_for(&c, store_list(s, &c, &f)), 0);
    cr_expect_eq(c.total, 9);
    cr_expect_eq(c.n, 9);
    store_call_clear(&c);
    store_close(s);
}

Test(store, replay_brings_a_dead_letter_back_with_its_id)
{
    struct store *s = open_default();
    char id[STORE_ID_SIZE], got[1][STORE_ID_SIZE];
    cr_assert_eq(enqueue(s, "hooks", NULL, "x", 0, id), 0);
    cr_assert_eq(claim(s, "w1", 1, NULL), 1);
    cr_expect_eq(by_id(s, store_replay, id), STORE_EBUSY, "not while its lease holds");
    struct store_dead dead = { .reason = "age" };
    struct store_attempt a = try_of(0, "timeout");
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_bury(s, &c, id, "w1", &a, &dead)), 0);
    atomic_fetch_add(&fake_now, 60000);
    cr_assert_eq(by_id(s, store_replay, id), 0);
    struct store_delivery d;
    cr_assert_eq(get(s, id, &d), 0);
    cr_expect_eq(d.state, STORE_SCHEDULED);
    cr_expect_eq(d.replays, 1);
    cr_expect_eq(d.next_at, atomic_load(&fake_now));
    cr_expect_eq(d.ntries, 1, "its history stays");
    store_delivery_clear(&d);
    cr_assert_eq(claim(s, "w2", 1, got), 1);
    cr_expect_str_eq(got[0], id);
    cr_expect_eq(by_id(s, store_replay, "0123456789abcdef0123456789abcdef"), STORE_ENOTFOUND);
    store_close(s);
}

Test(store, drop_removes_it_and_its_attempts)
{
    struct store *s = open_default();
    char id[STORE_ID_SIZE], other[STORE_ID_SIZE];
    cr_assert_eq(enqueue(s, "hooks", NULL, "x", 0, id), 0);
    cr_assert_eq(enqueue(s, "hooks", NULL, "y", 0, other), 0);
    cr_assert_eq(by_id(s, store_drop, id), 0);
    struct store_delivery d;
    cr_expect_eq(get(s, id, &d), STORE_ENOTFOUND);
    cr_expect_eq(by_id(s, store_drop, id), STORE_ENOTFOUND);
    cr_expect_eq(get(s, other, &d), 0, "only that one");
    store_delivery_clear(&d);
    struct store_stats st;
    store_stats(s, &st);
    cr_expect_eq(st.count, 1);
    store_close(s);
}

Test(store, same_key_and_body_is_the_same_delivery_another_body_a_conflict)
{
    struct store *s = open_default();
    char first[STORE_ID_SIZE], again[STORE_ID_SIZE], other[STORE_ID_SIZE];
    cr_assert_eq(enqueue(s, "hooks", "pay-42", "{\"amount\":10}", 0, first), 0);
    cr_assert_eq(enqueue(s, "hooks", "pay-42", "{\"amount\":10}", 0, again), 0);
    cr_expect_str_eq(again, first);
    cr_expect_eq(enqueue(s, "hooks", "pay-42", "{\"amount\":11}", 0, NULL), STORE_ECONFLICT);
    cr_assert_eq(enqueue(s, "other", "pay-42", "{\"amount\":11}", 0, other), 0,
                 "keys are the route's");
    cr_expect_str_neq(other, first);
    struct store_stats st;
    store_stats(s, &st);
    cr_expect_eq(st.enqueued, 2);
    cr_expect_eq(st.count, 2);
    store_close(s);
}

Test(store, an_expired_lease_is_claimed_again_once)
{
    struct store *s = open_default(); /* lease 1000 ms */
    uint64_t t = atomic_load(&fake_now);
    char id[STORE_ID_SIZE];
    cr_assert_eq(enqueue(s, "hooks", NULL, "x", 0, id), 0);
    cr_assert_eq(claim(s, "dead-worker", 1, NULL), 1);
    atomic_store(&fake_now, t + 999);
    cr_expect_eq(claim(s, "w2", 1, NULL), 0, "not while the lease holds");
    atomic_store(&fake_now, t + 1000);
    cr_assert_eq(claim(s, "w2", 1, NULL), 1, "once it ran out");
    atomic_store(&fake_now, t + 1500);
    cr_expect_eq(claim(s, "w3", 1, NULL), 0, "once only");
    cr_expect_eq(complete(s, id, "dead-worker"), STORE_ESTALE, "the old owner lost it");
    struct store_delivery d;
    cr_assert_eq(get(s, id, &d), 0);
    cr_expect_eq(d.state, STORE_IN_FLIGHT);
    cr_expect_str_eq(d.claimed_by, "w2");
    cr_expect_eq(d.attempts, 1, "the lost attempt counts");
    cr_assert_eq(d.ntries, 1);
    cr_expect_str_eq(d.tries[0].outcome, "lease_expired");
    store_delivery_clear(&d);
    cr_expect_eq(complete(s, id, "w2"), 0);
    store_close(s);
}

Test(store, a_full_store_refuses_enqueues)
{
    struct store_opts o = opts();
    o.max_count = 3;
    struct store *s = open_with(&o);
    char id[STORE_ID_SIZE];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(enqueue(s, "hooks", NULL, "x", 0, i == 0 ? id : NULL), 0);
    cr_expect_eq(enqueue(s, "hooks", NULL, "x", 0, NULL), STORE_EFULL);
    struct store_stats st;
    store_stats(s, &st);
    cr_expect_eq(st.refused, 1);
    cr_expect_eq(st.count, 3);
    cr_assert_eq(by_id(s, store_drop, id), 0);
    cr_expect_eq(enqueue(s, "hooks", NULL, "x", 0, NULL), 0, "room again");
    store_close(s);

    /* The size bound: 64 KiB bodies into 512 KiB. */
    o = opts();
    o.max_bytes = 512 * 1024;
    s = open_with(&o);
    char *big = malloc(64 * 1024 + 1);
    memset(big, 'b', 64 * 1024);
    big[64 * 1024] = '\0';
    int r = 0, n = 0;
    while (n < 20 && (r = enqueue(s, "big", NULL, big, 0, NULL)) == 0)
        n++;
    cr_expect_eq(r, STORE_EFULL, "after %d", n);
    cr_expect(n >= 4 && n < 8, "%d bodies of 64 KiB in 512 KiB", n);
    store_close(s);
    free(big);
}

#ifndef STORE_PG /* the SQLite file's */
Test(store, a_full_disk_refuses_like_a_full_store_and_keeps_what_it_had)
{
    /* max_file_bytes stands in for the disk: SQLite meets it as SQLITE_FULL. */
    struct store_opts o = opts();
    o.max_file_bytes = 256 * 1024;
    struct store *s = open_with(&o);
    char *big = malloc(32 * 1024 + 1);
    memset(big, 'd', 32 * 1024);
    big[32 * 1024] = '\0';
    char first[STORE_ID_SIZE];
    int r = 0, n = 0;
    while (n < 20 && (r = enqueue(s, "big", NULL, big, 0, n == 0 ? first : NULL)) == 0)
        n++;
    cr_expect_eq(r, STORE_EFULL, "after %d", n);
    cr_expect_gt(n, 0);
    struct store_delivery d;
    cr_expect_eq(get(s, first, &d), 0, "what was stored is still there");
    store_delivery_clear(&d);
    struct store_stats st;
    store_stats(s, &st);
    cr_expect_eq(st.enqueued, (uint64_t)n);
    cr_expect_eq(st.refused, 1);
    store_close(s);
    free(big);
}

Test(store, a_newer_schema_is_refused)
{
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    struct store_opts o = opts();
    struct store *s = NULL;
    struct store_err err;
    cr_assert_eq(store_sqlite_open(&o, &s, &err), STORE_EINVAL);
    cr_expect(strstr(err.msg, "version 99") != NULL, "%s", err.msg);
}

/* A file written by the first schema (version 1, as that program made it) opens: it is
 * migrated, and what it kept is read as it was, its rows' last delay 0. */
Test(store, a_file_of_schema_version_1_is_migrated_and_keeps_its_rows)
{
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    const char *v1 =
        "CREATE TABLE deliveries(seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE,"
        " route TEXT NOT NULL, method TEXT NOT NULL, target TEXT NOT NULL,"
        " fields BLOB NOT NULL, body BLOB NOT NULL, idem_key TEXT, body_hash INTEGER NOT NULL,"
        " created_at INTEGER NOT NULL, next_at INTEGER NOT NULL,"
        " attempts INTEGER NOT NULL DEFAULT 0, replays INTEGER NOT NULL DEFAULT 0,"
        " state INTEGER NOT NULL, claimed_until INTEGER, claimed_by TEXT,"
        " reason TEXT, final_head BLOB, final_body BLOB);"
        "CREATE TABLE attempts(delivery TEXT NOT NULL, at INTEGER NOT NULL,"
        " duration_ms INTEGER NOT NULL, status INTEGER NOT NULL, outcome TEXT NOT NULL);"
        "INSERT INTO deliveries(id, route, method, target, fields, body, body_hash, created_at,"
        " next_at, attempts, state) VALUES('0123456789abcdef0123456789abcdef', 'hooks', 'POST',"
        " '/x', x'', 'old body', 0, 1, 1, 1, 0);"
        "INSERT INTO attempts VALUES('0123456789abcdef0123456789abcdef', 1, 5, 503, 'status');"
        "PRAGMA user_version = 1;";
    cr_assert_eq(sqlite3_exec(db, v1, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
    sqlite3_close(db);
    struct store *s = open_default();
    struct store_delivery d;
    cr_assert_eq(get(s, "0123456789abcdef0123456789abcdef", &d), 0);
    cr_expect_str_eq(d.body, "old body");
    cr_expect_eq(d.attempts, 1);
    cr_expect_eq(d.last_delay_ms, 0);
    cr_expect_null(d.upstream, "no upstream was recorded then");
    cr_assert_eq(d.ntries, 1);
    cr_expect_null(d.tries[0].upstream);
    cr_expect_eq(d.tries[0].status, 503);
    store_delivery_clear(&d);
    cr_expect_eq(claim(s, "w1", 1, NULL), 1, "it is due, as it was");
    store_close(s);
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_expect_geq(sqlite3_column_int(st, 0), 3);
    sqlite3_finalize(st);
    sqlite3_close(db);
}

#endif

static void on_cq(struct loop_watch *w, uint32_t events)
{
    (void)events;
    store_cq_drain(w->arg);
}

static void count_done(struct store_call *c)
{
    (*(int *)c->arg)++;
}

Test(store, completions_come_back_on_the_callers_loop)
{
    struct store *s = open_default();
    struct loop *l = loop_new();
    cr_assert_not_null(l);
    struct loop_watch w = { .fd = -1 };
    cr_assert_eq(loop_watch_add(l, &w, store_cq_fd(cq), EPOLLIN, on_cq, cq), 0);
    struct store_new d = { .route = "loop", .method = "PUT", .target = "/x" };
    struct store_call c[16];
    int done = 0;
    for (int i = 0; i < 16; i++) {
        c[i] = (struct store_call){ .cq = cq, .done = count_done, .arg = &done };
        cr_assert_eq(store_enqueue(s, &c[i], &d), 0);
    }
    for (int turns = 0; done < 16 && turns < 100; turns++)
        cr_assert_eq(loop_turn(l, 100), 0);
    cr_expect_eq(done, 16, "every completion ran done() in the loop's thread");
    for (int i = 0; i < 16; i++) {
        cr_expect(c[i].finished);
        cr_expect_eq(c[i].result, 0);
        store_call_clear(&c[i]);
    }
    loop_watch_del(l, &w);
    loop_free(l);
    store_close(s);
}

Test(store, close_finishes_every_call_handed_over)
{
    struct store *s = open_default();
    struct store_new d = { .route = "close", .method = "POST", .target = "/" };
    struct store_call c[100];
    for (int i = 0; i < 100; i++) {
        c[i] = (struct store_call){ .cq = cq };
        cr_assert_eq(store_enqueue(s, &c[i], &d), 0);
    }
    store_close(s);
    cr_expect_eq(store_cq_drain(cq), 100);
    for (int i = 0; i < 100; i++)
        cr_expect_eq(c[i].result, 0, "call %d: %d", i, c[i].result);
    s = open_default();
    struct store_filter f = { .route = "close", .state = -1, .limit = 1 };
    struct store_call lc = { .cq = cq };
    cr_assert_eq(wait_for(&lc, store_list(s, &lc, &f)), 0);
    cr_expect_eq(lc.total, 100);
    store_call_clear(&lc);
    store_close(s);
}

/* The group commit: producers with many enqueues outstanding. */
#define PRODUCERS    2
#define PER_PRODUCER 1000
#define WINDOW       64

struct producer {
    struct store *s;
    int ok;
};

static void *produce(void *arg)
{
    struct producer *p = arg;
    struct store_cq *q = store_cq_new();
    static struct store_new d = {
        .route = "group", .method = "POST", .target = "/", .body = "0123456789", .body_len = 10
    };
    struct store_call *calls = calloc(WINDOW, sizeof(*calls));
    for (int sent = 0; sent < PER_PRODUCER; sent += WINDOW) {
        int n = PER_PRODUCER - sent < WINDOW ? PER_PRODUCER - sent : WINDOW;
        for (int i = 0; i < n; i++) {
            calls[i] = (struct store_call){ .cq = q };
            if (store_enqueue(p->s, &calls[i], &d) != 0)
                goto out;
        }
        for (int i = 0; i < n; i++) {
            if (store_call_wait(&calls[i], 60000) == 0 && calls[i].result == 0)
                p->ok++;
        }
    }
out:
    free(calls);
    store_cq_free(q);
    return NULL;
}

Test(store, group_commit_takes_many_enqueues_per_transaction)
{
    struct store *s = open_default();
    struct producer p[PRODUCERS];
    pthread_t t[PRODUCERS];
    for (int i = 0; i < PRODUCERS; i++) {
        p[i] = (struct producer){ .s = s };
        cr_assert_eq(pthread_create(&t[i], NULL, produce, &p[i]), 0);
    }
    for (int i = 0; i < PRODUCERS; i++)
        pthread_join(t[i], NULL);
    struct store_stats st;
    store_stats(s, &st);
    int n = PRODUCERS * PER_PRODUCER;
    cr_expect_eq(p[0].ok + p[1].ok, n);
    cr_expect_eq(st.enqueued, (uint64_t)n);
    cr_log_info("%d enqueues in %llu commits", n, (unsigned long long)st.commits);
    cr_expect_lt(st.commits, (uint64_t)n / 8, "%llu commits for %d enqueues",
                 (unsigned long long)st.commits, n);
    store_close(s);

    s = open_default();
    struct store_filter f = { .route = "group", .state = -1, .limit = 1 };
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_list(s, &c, &f)), 0);
    cr_expect_eq(c.total, (uint64_t)n, "every one is in the file");
    store_call_clear(&c);
    store_close(s);
}

#ifndef STORE_PG /* the SQLite file's */
/* The child of the crash test: enqueues with a few calls outstanding, and writes each id the
 * store acknowledged to 'fd' as it completes, until it is killed. */
static void crash_child(int fd)
{
    struct store_opts o = opts();
    o.clock = NULL;
    struct store *s = NULL;
    struct store_err err;
    if (store_sqlite_open(&o, &s, &err) != 0)
        _exit(2);
    /* open, its schema made: the kills land among the accepts, not before the table exists */
    if (write(fd, "open\n", 5) != 5)
        _exit(5);
    struct store_cq *q = store_cq_new();
    static struct store_new d = {
        .route = "crash", .method = "POST", .target = "/", .body = "crash test body", .body_len = 15
    };
    struct store_call calls[8];
    for (;;) {
        for (int i = 0; i < 8; i++) {
            calls[i] = (struct store_call){ .cq = q };
            if (store_enqueue(s, &calls[i], &d) != 0)
                _exit(3);
        }
        for (int i = 0; i < 8; i++) {
            if (store_call_wait(&calls[i], -1) != 0 || calls[i].result != 0)
                _exit(4);
            char line[STORE_ID_SIZE + 1];
            memcpy(line, calls[i].id, 32);
            line[32] = '\n';
            if (write(fd, line, 33) != 33)
                _exit(5);
        }
    }
}

Test(store, every_acknowledged_id_survives_sigkill, .timeout = 300)
{
    unsigned seed = 20261128;
    size_t acked = 0;
    sqlite3 *db;
    for (int round = 0; round < 30; round++) {
        int fds[2];
        cr_assert_eq(pipe(fds), 0);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            close(fds[0]);
            crash_child(fds[1]);
        }
        close(fds[1]);
        char open_line[5];
        cr_assert_eq(read(fds[0], open_line, 5), 5, "round %d: the child did not open the store",
                     round);
        struct timespec nap = { 0, (long)(20 + rand_r(&seed) % 200) * 1000000L };
        nanosleep(&nap, NULL);
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        cr_assert(WIFSIGNALED(status), "the child ended by itself: %d", status);
        /* What it acknowledged before it died. */
        FILE *in = fdopen(fds[0], "r");
        cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
        sqlite3_stmt *st;
        cr_assert_eq(sqlite3_prepare_v2(db, "SELECT 1 FROM deliveries WHERE id = ?", -1, &st, NULL),
                     SQLITE_OK);
        char line[64];
        size_t n = 0;
        while (fgets(line, sizeof(line), in)) {
            if (strlen(line) != 33)
                continue; /* a line cut by the kill: never a whole acknowledgement */
            line[32] = '\0';
            sqlite3_bind_text(st, 1, line, -1, SQLITE_TRANSIENT);
            cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "round %d: acknowledged %s is lost", round,
                         line);
            sqlite3_reset(st);
            n++;
        }
        fclose(in);
        sqlite3_finalize(st);
        cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
        cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
        cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "ok", "round %d", round);
        sqlite3_finalize(st);
        sqlite3_close(db);
        acked += n;
    }
    cr_log_info("%zu acknowledged ids over 30 kills, all on disk", acked);
    cr_expect_gt(acked, 0, "the children acknowledged nothing: the test tested nothing");
}

/* ---- the process's own file (store_opts.exclusive) ---- */

Test(store, exclusive_open_keeps_a_second_out_naming_the_lock)
{
    struct store_opts o = opts();
    o.exclusive = true;
    struct store *s = open_with(&o);
    struct store *second = NULL;
    struct store_err err;
    cr_assert_eq(store_sqlite_open(&o, &second, &err), STORE_EBUSY);
    cr_assert_null(second);
    cr_assert_not_null(strstr(err.msg, "deliveries.db.lock"), "%s", err.msg);
    store_close(s);
    /* closed: the lock went with it */
    s = open_with(&o);
    store_close(s);
}

/* A delivery in flight when its process went away is due at once at an exclusive open, its
 * lost attempt recorded; a shared open leaves it to its lease. */
Test(store, exclusive_open_makes_what_was_in_flight_due_at_once)
{
    struct store *s = open_default();
    char id[STORE_ID_SIZE], got[1][STORE_ID_SIZE];
    cr_assert_eq(enqueue(s, "r", NULL, "b", 0, id), 0);
    cr_assert_eq(claim(s, "dead-process", 1, got), 1);
    store_close(s);
    s = open_default(); /* not exclusive: the lease (1 s) holds */
    cr_assert_eq(claim(s, "next", 1, NULL), 0);
    store_close(s);
    struct store_opts o = opts();
    o.exclusive = true;
    s = open_with(&o);
    struct store_stats st;
    store_stats(s, &st);
    cr_assert_eq(st.recovered, 1);
    cr_assert_eq(claim(s, "next", 1, got), 1, "due at once, the lease not waited out");
    cr_assert_str_eq(got[0], id);
    struct store_delivery d;
    cr_assert_eq(get(s, id, &d), 0);
    cr_assert_eq(d.ntries, 1);
    cr_assert_str_eq(d.tries[0].outcome, "lease_expired");
    cr_assert_eq(d.attempts, 1);
    store_delivery_clear(&d);
    store_close(s);
}

#endif

Test(store, claim_route_takes_only_that_route)
{
    struct store *s = open_default();
    char a[STORE_ID_SIZE], b[STORE_ID_SIZE];
    cr_assert_eq(enqueue(s, "one", NULL, "x", 0, a), 0);
    cr_assert_eq(enqueue(s, "two", NULL, "y", 0, b), 0);
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_claim_route(s, &c, "me", "two", 5)), 0);
    cr_assert_eq(c.n, 1);
    cr_assert_str_eq(c.items[0].id, b);
    cr_assert_str_eq(c.items[0].route, "two");
    store_call_clear(&c);
    cr_assert_eq(claim(s, "me", 5, NULL), 1, "route one's is still due");
    store_close(s);
}

Test(store, claim_except_takes_the_routes_not_named)
{
    struct store *s = open_default();
    char a[STORE_ID_SIZE], b[STORE_ID_SIZE], g[STORE_ID_SIZE];
    cr_assert_eq(enqueue(s, "one", NULL, "x", 0, a), 0);
    cr_assert_eq(enqueue(s, "gone", NULL, "y", 0, g), 0);
    cr_assert_eq(enqueue(s, "two", NULL, "z", 0, b), 0);
    const char *const named[] = { "one", "two" };
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_claim_except(s, &c, "me", named, 2, 5)), 0);
    cr_assert_eq(c.n, 1);
    cr_assert_str_eq(c.items[0].id, g);
    cr_assert_str_eq(c.items[0].route, "gone");
    store_call_clear(&c);
    cr_assert_eq(claim(s, "me", 5, NULL), 2, "the named routes' are still due");
    store_close(s);
}

Test(store, insert_dead_keeps_a_dead_letter_at_once)
{
    struct store_opts o = opts();
    o.max_count = 1;
    struct store *s = open_with(&o);
    struct store_attempt a = try_of(503, "max-attempts");
    struct store_field f[] = { { "x-a", "1" } };
    struct store_dead_new d = { .req = { .route = "sync",
                                         .method = "POST",
                                         .target = "/pay",
                                         .fields = f,
                                         .nfields = 1,
                                         .body = "b",
                                         .body_len = 1 },
                                .attempts = 3,
                                .tries = &a,
                                .ntries = 1,
                                .dead = { .reason = "max-attempts",
                                          .head = "HTTP/1.1 503\r\n",
                                          .head_len = 14,
                                          .body = "down",
                                          .body_len = 4 } };
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_insert_dead(s, &c, &d)), 0);
    char id[STORE_ID_SIZE];
    memcpy(id, c.id, sizeof(id));
    store_call_clear(&c);
    struct store_delivery got;
    cr_assert_eq(get(s, id, &got), 0);
    cr_assert_eq(got.state, STORE_DEAD);
    cr_assert_eq(got.attempts, 3);
    cr_assert_str_eq(got.reason, "max-attempts");
    cr_assert_eq(got.ntries, 1);
    cr_assert_eq(got.tries[0].status, 503);
    cr_assert_eq(got.final_body_len, 4);
    store_delivery_clear(&got);
    cr_assert_eq(claim(s, "me", 5, NULL), 0, "a dead letter is not due");
    /* the count bound holds for dead letters too */
    c = (struct store_call){ .cq = cq };
    cr_assert_eq(wait_for(&c, store_insert_dead(s, &c, &d)), STORE_EFULL);
    store_call_clear(&c);
    store_close(s);
}

/* ---- the operators' side (issue 39 items 3, 4 and the admin's filters) ---- */

/* Enqueues 'n' deliveries of 'route' handed over all at once (a few transactions, not n). */
static void enqueue_many(struct store *s, const char *route, size_t n)
{
    struct store_new d = {
        .route = route, .method = "POST", .target = "/m", .body = "b", .body_len = 1
    };
    struct store_call *c = calloc(n, sizeof(*c));
    cr_assert_not_null(c);
    for (size_t i = 0; i < n; i++) {
        c[i].cq = cq;
        cr_assert_eq(store_enqueue(s, &c[i], &d), 0);
    }
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(store_call_wait(&c[i], 60000), 0);
        cr_assert_eq(c[i].result, 0);
        store_call_clear(&c[i]);
    }
    free(c);
}

/* Claims 'id' (due now) and buries it with an attempt of 'status'. */
static void kill_one(struct store *s, const char *id, int status)
{
    char got[1][STORE_ID_SIZE];
    cr_assert_eq(claim(s, "w1", 1, got), 1);
    cr_assert_str_eq(got[0], id);
    struct store_attempt a = try_of(status, "status");
    struct store_dead dead = { .reason = "final" };
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_bury(s, &c, id, "w1", &a, &dead)), 0);
}

static int find(struct store *s, const struct store_match *m, struct store_call *c)
{
    memset(c, 0, sizeof(*c));
    c->cq = cq;
    return wait_for(c, store_find(s, c, m));
}

Test(store, find_filters_by_route_state_time_and_status_and_pages_by_cursor)
{
    struct store *s = open_default();
    char a[STORE_ID_SIZE], b[STORE_ID_SIZE], x[STORE_ID_SIZE];
    uint64_t t0 = atomic_load(&fake_now);
    cr_assert_eq(enqueue(s, "hooks", NULL, "1", 0, a), 0);
    atomic_store(&fake_now, t0 + 1000);
    cr_assert_eq(enqueue(s, "hooks", NULL, "2", 0, b), 0);
    cr_assert_eq(enqueue(s, "other", NULL, "3", t0 + 999999, x), 0);
    kill_one(s, a, 410);
    kill_one(s, b, 500);

    struct store_call c;
    struct store_match m = { .route = "hooks", .state = STORE_DEAD };
    cr_assert_eq(find(s, &m, &c), 0);
    cr_expect_eq(c.total, 2);
    cr_assert_eq(c.n, 2);
    cr_expect_str_eq(c.items[0].id, a, "oldest first by default");
    cr_expect_eq(c.items[0].last_status, 410);
    store_call_clear(&c);

    m = (struct store_match){ .state = -1, .status = 500 };
    cr_assert_eq(find(s, &m, &c), 0);
    cr_assert_eq(c.n, 1);
    cr_expect_str_eq(c.items[0].id, b);
    store_call_clear(&c);

    m = (struct store_match){ .state = -1, .since = t0 + 1, .until = t0 + 1001 };
    cr_assert_eq(find(s, &m, &c), 0);
    cr_expect_eq(c.total, 2, "accepted in [since, until): b and x");
    store_call_clear(&c);

    /* newest first, one a page: x, b, a, then no more */
    m = (struct store_match){ .state = -1, .newest_first = true, .limit = 1 };
    const char *want[] = { x, b, a };
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(find(s, &m, &c), 0);
        cr_assert_eq(c.n, 1);
        cr_expect_str_eq(c.items[0].id, want[i], "page %d", i);
        cr_expect_eq(c.more, i < 2, "page %d", i);
        m.cursor = c.cursor;
        store_call_clear(&c);
    }
    store_close(s);
}

static int bulk(struct store *s, const struct store_bulk *b, struct store_call *c)
{
    memset(c, 0, sizeof(*c));
    c->cq = cq;
    return wait_for(c, store_bulk(s, c, b));
}

Test(store, replay_by_filter_spaces_due_times_by_the_rate_and_a_dry_run_only_counts)
{
    struct store_opts o = opts();
    o.lease_ms = 600000; /* the claims below do not expire */
    struct store *s = open_with(&o);
    char id[3][STORE_ID_SIZE];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(enqueue(s, "hooks", NULL, "x", 0, id[i]), 0);
        kill_one(s, id[i], 503);
    }
    struct store_call c;
    struct store_bulk b = {
        .m = { .route = "hooks", .state = -1 }, .replay = true, .dry_run = true, .rate = 2
    };
    cr_assert_eq(bulk(s, &b, &c), 0);
    cr_expect_eq(c.total, 3);
    cr_expect_eq(c.n, 0);
    store_call_clear(&c);
    cr_expect_eq(claim(s, "w1", 10, NULL), 0, "a dry run replays nothing");

    uint64_t now = atomic_load(&fake_now);
    b.dry_run = false;
    cr_assert_eq(bulk(s, &b, &c), 0);
    cr_assert_eq(c.n, 3);
    cr_expect_not(c.more);
    for (int i = 0; i < 3; i++) {
        cr_expect_str_eq(c.items[i].id, id[i], "the same ids, oldest first");
        cr_expect_eq(c.items[i].next_at, now + 500 * (uint64_t)i, "2 a second: 500 ms apart");
    }
    store_call_clear(&c);
    cr_expect_eq(claim(s, "w1", 10, NULL), 1, "one due now");
    atomic_store(&fake_now, now + 1000);
    cr_expect_eq(claim(s, "w1", 10, NULL), 2, "the others a second later");
    store_close(s);
}

Test(store, drop_by_filter_goes_in_batches_and_leaves_the_rest)
{
    struct store *s = open_default();
    enqueue_many(s, "hooks", STORE_BULK_BATCH + 20);
    enqueue_many(s, "keep", 3);
    struct store_call c;
    struct store_bulk b = { .m = { .route = "hooks", .state = STORE_SCHEDULED } };
    size_t dropped = 0, batches = 0;
    do {
        cr_assert_eq(bulk(s, &b, &c), 0);
        dropped += c.n;
        batches++;
        b.m.cursor = c.cursor;
        b.done += c.n;
        bool more = c.more;
        store_call_clear(&c);
        if (!more)
            break;
    } while (batches < 10);
    cr_expect_eq(dropped, STORE_BULK_BATCH + 20);
    cr_expect_eq(batches, 2);
    struct store_match m = { .state = -1 };
    cr_assert_eq(find(s, &m, &c), 0);
    cr_expect_eq(c.total, 3, "only the other route's are left");
    store_call_clear(&c);
    struct store_stats st;
    store_stats(s, &st);
    cr_expect_eq(st.count, 3);
    store_close(s);
}

Test(store, counts_by_route_and_state_with_the_oldest_pending)
{
    struct store *s = open_default();
    uint64_t t0 = atomic_load(&fake_now);
    char id[STORE_ID_SIZE];
    cr_assert_eq(enqueue(s, "a", NULL, "1", 0, id), 0);
    kill_one(s, id, 500);
    atomic_store(&fake_now, t0 + 5000);
    cr_assert_eq(enqueue(s, "a", NULL, "2", t0 + 99999, NULL), 0);
    cr_assert_eq(enqueue(s, "b", NULL, "3", t0 + 99999, NULL), 0);
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_counts(s, &c)), 0);
    cr_assert_eq(c.ncounts, 2);
    cr_expect_str_eq(c.counts[0].route, "a");
    cr_expect_eq(c.counts[0].n[STORE_DEAD], 1);
    cr_expect_eq(c.counts[0].n[STORE_SCHEDULED], 1);
    cr_expect_eq(c.counts[0].oldest_pending, t0 + 5000, "the dead one is not pending");
    cr_expect_str_eq(c.counts[1].route, "b");
    cr_expect_eq(c.counts[1].n[STORE_SCHEDULED], 1);
    store_call_clear(&c);
    store_close(s);
}

/* Whether 'needle' is anywhere in the file at 'p' (absent file: no). */
#ifndef STORE_PG
static bool file_has(const char *p, const char *needle)
{
    FILE *f = fopen(p, "rb");
    if (!f)
        return false;
    size_t cap = 1 << 20, n = 0, len = strlen(needle);
    char *b = malloc(cap);
    size_t got;
    bool found = false;
    while (b && (got = fread(b + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb)
                break;
            b = nb;
        }
    }
    fclose(f);
    found = b && memmem(b, n, needle, len) != NULL;
    free(b);
    return found;
}
#endif

#ifdef STORE_PG
/* Whether a row of the test's namespace holds 'needle' in its fields' bytes, as stored. */
static bool stored_has(const char *needle)
{
    char info[256];
    snprintf(info, sizeof(info), "%s?password=%s", pg.url, PGSERVER_PASSWORD);
    PGconn *c = PQconnectdb(info);
    cr_assert_eq(PQstatus(c), CONNECTION_OK, "%s", PQerrorMessage(c));
    const char *v[2] = { ns, needle };
    PGresult *res = PQexecParams(c,
                                 "SELECT count(*) FROM retryproxy_deliveries WHERE namespace = $1"
                                 " AND position(convert_to($2, 'UTF8') in fields) > 0",
                                 2, NULL, v, NULL, NULL, 0);
    cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQerrorMessage(c));
    bool found = atoi(PQgetvalue(res, 0, 0)) > 0;
    PQclear(res);
    PQfinish(c);
    return found;
}
#else
/* Whether the database file or its WAL holds 'needle'. */
static bool stored_has(const char *needle)
{
    char wal[160];
    snprintf(wal, sizeof(wal), "%s-wal", path);
    return file_has(path, needle) || file_has(wal, needle);
}
#endif

static const char *field_of(const struct store_delivery *d, const char *name)
{
    for (size_t i = 0; i < d->nfields; i++)
        if (strcasecmp(d->fields[i].name, name) == 0)
            return d->fields[i].value;
    return NULL;
}

/* A request with three secrets, enqueued then claimed: the claimed copy. */
static void secrets_round_trip(struct store_opts *o, struct store_delivery *out)
{
    static const char *const extra[] = { "X-Api-Key" };
    o->sensitive = extra;
    o->n_sensitive = 1;
    struct store *s = open_with(o);
    struct store_field f[] = { { "Authorization", "Bearer s3cr3t-t0ken-AAAA" },
                               { "cookie", "session=c00kie-BBBB" },
                               { "x-api-key", "k3y-CCCC" },
                               { "content-type", "text/plain" } };
    struct store_new d = { .route = "r",
                           .method = "POST",
                           .target = "/",
                           .fields = f,
                           .nfields = 4,
                           .body = "b",
                           .body_len = 1 };
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_enqueue(s, &c, &d)), 0);
    cr_expect_eq(c.left_out, o->key ? 0 : 3, "the accept is told what was left out");
    store_call_clear(&c);
    const char *secrets[] = { "s3cr3t-t0ken-AAAA", "c00kie-BBBB", "k3y-CCCC" };
    for (int i = 0; i < 3; i++)
        cr_expect_not(stored_has(secrets[i]), "%s in the database", secrets[i]);
    cr_expect(stored_has("text/plain"), "the database checked is the one written");
    cr_assert_eq(wait_for(&c, store_claim_due(s, &c, "w1", 1)), 0);
    cr_assert_eq(c.n, 1);
    *out = c.items[0];
    memset(&c.items[0], 0, sizeof(c.items[0]));
    store_call_clear(&c);
    store_close(s);
}

Test(store, sensitive_fields_are_sealed_in_the_file_and_open_when_claimed)
{
    unsigned char key[32];
    for (int i = 0; i < 32; i++)
        key[i] = (unsigned char)(i * 7 + 1);
    struct store_opts o = opts();
    o.key = key;
    struct store_delivery d;
    secrets_round_trip(&o, &d);
    cr_expect_str_eq(field_of(&d, "authorization"), "Bearer s3cr3t-t0ken-AAAA");
    cr_expect_str_eq(field_of(&d, "cookie"), "session=c00kie-BBBB");
    cr_expect_str_eq(field_of(&d, "x-api-key"), "k3y-CCCC");
    cr_expect_str_eq(field_of(&d, "content-type"), "text/plain");
    store_delivery_clear(&d);
}

Test(store, without_a_key_sensitive_fields_are_not_stored_at_all)
{
    struct store_opts o = opts();
    struct store_delivery d;
    secrets_round_trip(&o, &d);
    cr_expect_null(field_of(&d, "authorization"));
    cr_expect_null(field_of(&d, "cookie"));
    cr_expect_null(field_of(&d, "x-api-key"));
    cr_expect_str_eq(field_of(&d, "content-type"), "text/plain");
    store_delivery_clear(&d);
}

Test(store, retention_deletes_delivered_after_their_keep_and_dead_letters_only_with_one)
{
    for (int with_dead_keep = 0; with_dead_keep < 2; with_dead_keep++) {
        struct store_opts o = opts();
        o.retention = true;
        o.delivered_keep_ms = 60000;
        o.dead_keep_ms = with_dead_keep ? 120000 : 0;
        struct store *s = open_with(&o);
        char done[STORE_ID_SIZE], dead[STORE_ID_SIZE];
        cr_assert_eq(enqueue(s, "r", NULL, "1", 0, done), 0);
        cr_assert_eq(enqueue(s, "r", NULL, "2", 0, dead), 0);
        char ids[2][STORE_ID_SIZE];
        cr_assert_eq(claim(s, "w1", 2, ids), 2);
        cr_assert_eq(complete(s, done, "w1"), 0);
        struct store_attempt a = try_of(500, "status");
        struct store_dead why = { .reason = "attempts" };
        struct store_call c = { .cq = cq };
        cr_assert_eq(wait_for(&c, store_bury(s, &c, dead, "w1", &a, &why)), 0);
        struct store_delivery d;
        uint64_t t0 = atomic_load(&fake_now);

        atomic_store(&fake_now, t0 + 59000);
        cr_expect_eq(get(s, done, &d), 0, "kept until delivered_keep_ms has passed");
        store_delivery_clear(&d);
        atomic_store(&fake_now, t0 + 61000);
        cr_expect_eq(get(s, done, &d), STORE_ENOTFOUND, "deleted after it");
        store_delivery_clear(&d);
        cr_expect_eq(get(s, dead, &d), 0);
        store_delivery_clear(&d);
        atomic_store(&fake_now, t0 + 365ULL * 86400000);
        cr_expect_eq(get(s, dead, &d), with_dead_keep ? STORE_ENOTFOUND : 0,
                     "a dead letter goes only with dead_keep_ms (%d)", with_dead_keep);
        store_delivery_clear(&d);
        store_close(s);
        atomic_store(&fake_now, t0);
        unlink(path);
    }
}

Test(store, a_tuned_sensitive_list_seals_from_the_next_accept_on)
{
    unsigned char key[32] = { 1, 2, 3 };
    struct store_opts o = opts();
    o.key = key;
    struct store *s = open_with(&o);
    struct store_field f[] = { { "X-Token", "t0ken-before-tune" } };
    struct store_new d = { .route = "r",
                           .method = "POST",
                           .target = "/",
                           .fields = f,
                           .nfields = 1,
                           .body = "b",
                           .body_len = 1 };
    struct store_call c = { .cq = cq };
    cr_assert_eq(wait_for(&c, store_enqueue(s, &c, &d)), 0);
    store_call_clear(&c);
    static const char *const extra[] = { "x-token" };
    struct store_tuning t = { .sensitive = extra, .n_sensitive = 1, .dead_body_bytes = 4096 };
    cr_assert_eq(store_tune(s, &t), 0);
    f[0].value = "t0ken-after-tune";
    cr_assert_eq(wait_for(&c, store_enqueue(s, &c, &d)), 0);
    store_call_clear(&c);
    cr_expect(stored_has("t0ken-before-tune"), "not sensitive then: kept as it came");
    cr_expect_not(stored_has("t0ken-after-tune"), "sensitive since the tune: sealed");
    store_close(s);
}
