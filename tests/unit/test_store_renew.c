/* renew (proxy/store/store.h): a claimer extends the leases it still holds, and only those, on
 * both backends, under a clock of the test's: a renewed delivery is not claimed again when its
 * first lease would have run out, another owner's renewal changes nothing, and once the
 * renewed lease runs out the delivery is claimed again (its lost attempt recorded). The
 * PostgreSQL store runs on the suite's private server (tests/support/pgserver.h). */
#include <criterion/criterion.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proxy/store/store.h"
#include "tests/support/pgserver.h"
#include "tests/support/pgserver_hooks.h"
#include "tests/support/proc.h"

#define LEASE 1000
#define W     30000 /* ms: the bound on any store call */

static _Atomic uint64_t now = 1700000000000ULL;

static uint64_t test_clock(void *arg)
{
    (void)arg;
    return atomic_load(&now);
}

static char dir[64], path[96], ns[48], password[64];

static struct store *open_store(bool pg)
{
    struct store_opts o = { .lease_ms = LEASE, .clock = test_clock };
    struct store_err err = { { 0 } };
    struct store *s = NULL;
    if (pg) {
        struct pgserver p;
        cr_assert_eq(pgserver_env(&p), 0, "the runner started no PostgreSQL server");
        snprintf(ns, sizeof(ns), "renew-%ld", (long)getpid());
        snprintf(password, sizeof(password), "%s", PGSERVER_PASSWORD);
        o.pg_url = p.url;
        o.pg_password = password;
        o.pg_namespace = ns;
        cr_assert_eq(store_pg_open(&o, &s, &err), 0, "%s", err.msg);
    } else {
        snprintf(dir, sizeof(dir), "/tmp/rp-renew-XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
        snprintf(path, sizeof(path), "%s/store.db", dir);
        o.path = path;
        cr_assert_eq(store_sqlite_open(&o, &s, &err), 0, "%s", err.msg);
    }
    return s;
}

/* Runs 'c' (handed over with rc) to its end: its result. */
static int done(struct store_call *c, int rc)
{
    cr_assert_eq(rc, 0, "not taken: %d", rc);
    cr_assert_eq(store_call_wait(c, W), 0, "no completion");
    return c->result;
}

/* Claims for 'owner': how many it got (their first id into id when not NULL). */
static size_t claim(struct store *s, struct store_cq *q, const char *owner, char *id)
{
    struct store_call c = { .cq = q };
    cr_assert_eq(done(&c, store_claim_due(s, &c, owner, 10)), 0);
    size_t n = c.n;
    if (n && id)
        memcpy(id, c.items[0].id, STORE_ID_SIZE);
    store_call_clear(&c);
    return n;
}

static uint64_t renew(struct store *s, struct store_cq *q, const char *owner, const char *id)
{
    struct store_call c = { .cq = q };
    const char *ids[1] = { id };
    cr_assert_eq(done(&c, store_renew(s, &c, owner, ids, 1)), 0);
    uint64_t n = c.total;
    store_call_clear(&c);
    return n;
}

static void renewal(bool pg)
{
    struct store *s = open_store(pg);
    struct store_cq *q = store_cq_new();
    struct store_new d = {
        .route = "r", .method = "POST", .target = "/x", .body = "b", .body_len = 1
    };
    struct store_call c = { .cq = q };
    cr_assert_eq(done(&c, store_enqueue(s, &c, &d)), 0);
    char id[STORE_ID_SIZE];
    cr_assert_eq(claim(s, q, "a", id), 1);
    struct store_stats st;
    store_stats(s, &st);
    cr_expect_eq(st.lease_ms, LEASE, "the claimer is told the lease");

    atomic_fetch_add(&now, 800);
    cr_expect_eq(renew(s, q, "b", id), 0, "another owner's renewal changes nothing");
    cr_expect_eq(renew(s, q, "a", id), 1, "the holder renews");
    atomic_fetch_add(&now, 800); /* 1600: past the first lease, within the renewed one */
    cr_expect_eq(claim(s, q, "b", NULL), 0, "claimed while its renewed lease held");
    atomic_fetch_add(&now, 300); /* 1900: past the renewed lease (1800) */
    char again[STORE_ID_SIZE];
    cr_expect_eq(claim(s, q, "b", again), 1, "not claimed once the renewed lease ran out");
    cr_expect_str_eq(again, id);
    cr_expect_eq(renew(s, q, "a", id), 0, "the old holder renews what it lost");

    struct store_call g = { .cq = q };
    cr_assert_eq(done(&g, store_get(s, &g, id)), 0);
    cr_expect_str_eq(g.items[0].claimed_by, "b");
    cr_expect_eq(g.items[0].attempts, 1, "the lost attempt is counted");
    store_call_clear(&g);
    store_close(s);
    store_cq_free(q);
    if (!pg)
        rm_tree(dir);
}

Test(store_renew, sqlite_renews_only_the_holders_lease)
{
    renewal(false);
}

Test(store_renew, postgres_renews_only_the_holders_lease)
{
    renewal(true);
}

Test(store_renew, bad_input_is_refused_and_takes_nothing)
{
    struct store *s = open_store(false);
    struct store_cq *q = store_cq_new();
    struct store_call c = { .cq = q };
    const char *bad[1] = { "short" };
    cr_expect_eq(store_renew(s, &c, "a", bad, 1), STORE_EINVAL);
    cr_expect_eq(store_renew(s, &c, NULL, bad, 1), STORE_EINVAL);
    cr_expect_eq(store_renew(s, &c, "a", NULL, 0), STORE_EINVAL);
    store_close(s);
    store_cq_free(q);
    rm_tree(dir);
}
