/* The store's cases both backends share (included by test_store.c and test_store_pg.c after
 * store_suite.h): the operations and their states, idempotency, leases, bounds, completions on
 * the caller's loop, group commit, claims by route and dead letters kept at once. */
#include "tests/unit/store_suite.h"
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
