/* The store suite's fixture and helpers (proxy/store/store.h), with a clock of the test's: a
 * store opened on the backend the including suite is built for, a call handed over and waited
 * for, a delivery enqueued, claimed, read back and completed. Included, before the cases both
 * backends share (store_cases_ops.c, store_cases_admin.c), by test_store.c, the SQLite store
 * against a real file in a directory of the test's own, and by test_store_pg.c with STORE_PG
 * defined, the PostgreSQL store, each test in a namespace of its own on the suite's server.
 * Everything here is static: each of the two suites compiles its own copy. */
#ifndef RETRYPROXY_TESTS_UNIT_STORE_SUITE_H
#define RETRYPROXY_TESTS_UNIT_STORE_SUITE_H
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

#endif
