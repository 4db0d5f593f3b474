/* The store's cases both backends share (included by test_store.c and test_store_pg.c after
 * store_suite.h), the operators' side: finds by filter and cursor, replays and drops by filter,
 * counts, sensitive fields sealed as stored, and retention. */
#include "tests/unit/store_suite.h"
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
