/* slots: a worker's upstream attempt slots (proxy/upstream/slots.h): the cap, the queue in arrival
 * order, handing a freed slot on in the next turn of the loop, the endpoint (or origin) and
 * connection shares, and the endpoint shares' lifetime. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "proxy/base/loop.h"
#include "proxy/upstream/slots.h"

static struct loop *l;
static struct slots *s;

/* An owner: what it waits with, the slot it takes when its turn comes, and when it came. */
struct owner {
    struct upstream_wait wt;
    struct slot_hold hold;
    int went; /* its place among those that went, from 1; 0: not yet */
};
static int gone;

static void go(struct upstream_wait *wt)
{
    struct owner *o = (struct owner *)(void *)wt; /* wt is first */
    o->went = ++gone;
    slots_take(s, &o->hold);
}

static void setup(void)
{
    l = loop_new();
    cr_assert_not_null(l);
    s = slots_new(l);
    cr_assert_not_null(s);
    gone = 0;
}

static void teardown(void)
{
    slots_free(s);
    loop_free(l);
}

TestSuite(slots, .init = setup, .fini = teardown);

/* Takes a slot at once if it may, else queues: as proxy/upstream/attempt.c does. */
static void ask(struct owner *o, struct share *origin, struct share *conn)
{
    memset(o, 0, sizeof(*o));
    o->wt.share[0] = o->hold.share[0] = origin;
    o->wt.share[1] = o->hold.share[1] = conn;
    if (slots_full(s, o->wt.share))
        slots_wait(s, &o->wt, go);
    else
        go(&o->wt);
}

static void turn(void)
{
    loop_turn(l, 0);
}

Test(slots, past_the_cap_owners_wait_and_go_in_arrival_order_in_the_next_turn)
{
    slots_set_cap(s, 2);
    struct owner o[4];
    for (int i = 0; i < 4; i++)
        ask(&o[i], NULL, NULL);
    cr_assert_eq(o[0].went, 1);
    cr_assert_eq(o[1].went, 2);
    cr_assert_eq(o[2].went, 0);
    slots_release(s, &o[1].hold);
    cr_assert_eq(o[2].went, 0, "a freed slot is handed on in the next turn, not at once");
    turn();
    cr_assert_eq(o[2].went, 3);
    cr_assert_eq(o[3].went, 0);
    slots_release(s, &o[0].hold);
    turn();
    cr_assert_eq(o[3].went, 4);
    slots_release(s, &o[2].hold);
    slots_release(s, &o[3].hold);
}

Test(slots, a_used_up_origin_share_is_passed_over_and_goes_first_when_it_frees)
{
    slots_set_cap(s, 4);
    slots_set_shares(s, 50, 100); /* an origin holds 2 of 4 at most */
    struct share *a = slots_origin_share(s, "http://a"), *b = slots_origin_share(s, "http://b");
    cr_assert_not_null(a);
    cr_assert_eq(slots_origin_share(s, "http://a"), a, "one share per origin");
    struct owner o[5];
    ask(&o[0], a, NULL);
    ask(&o[1], a, NULL);
    ask(&o[2], a, NULL); /* a's share is used up: waits */
    cr_assert_eq(o[2].went, 0);
    ask(&o[3], b, NULL); /* others wait: it queues behind, then goes past the parked one */
    cr_assert_eq(o[3].went, 0);
    turn();
    cr_assert_eq(o[3].went, 3, "b's attempt went past a's used-up share");
    cr_assert_eq(o[2].went, 0);
    slots_release(s, &o[0].hold);
    turn();
    cr_assert_eq(o[2].went, 4, "a's waiting attempt went once its share had room");
    for (int i = 1; i < 4; i++)
        slots_release(s, &o[i].hold);
}

/* Issue 37: cap 4, an origin 3 (75 %), a connection 2 (50 %). A connection holds two slots and
 * waits for a third behind a full origin; another client's attempt to that origin waits behind
 * it. When the origin frees, the connection's is still blocked by its own share: the other
 * one goes at once, not when the connection's attempts end. */
Test(slots, a_waiter_that_fits_goes_whatever_share_the_one_ahead_waits_on)
{
    slots_set_cap(s, 4);
    slots_set_shares(s, 75, 50);
    struct share *a = slots_origin_share(s, "http://a"), *c = share_new_conn(),
                 *e = share_new_conn();
    cr_assert(a && c && e);
    struct owner o[5];
    ask(&o[0], a, c);
    ask(&o[1], a, c);
    ask(&o[2], a, NULL); /* the origin is used up */
    ask(&o[3], a, c);    /* the connection too */
    ask(&o[4], a, e);
    turn();
    cr_assert_eq(o[3].went + o[4].went, 0);
    slots_release(s, &o[2].hold);
    turn();
    cr_expect_eq(o[4].went, 4, "the other connection's attempt went as the origin freed");
    cr_expect_eq(o[3].went, 0, "its connection's share is still used up");
    slots_release(s, &o[0].hold);
    turn();
    cr_expect_eq(o[3].went, 5, "the connection's went once both its shares had room");
    slots_release(s, &o[1].hold);
    slots_release(s, &o[3].hold);
    slots_release(s, &o[4].hold);
    cr_expect_eq(a->held + c->held + e->held, 0);
    share_unref(c);
    share_unref(e);
}

/* The same with the order of the shares turned round: two classes wait on a connection's
 * share, the first of them also blocked by its origin once that fills. When the connection
 * frees, the second goes. */
Test(slots, every_class_parked_on_a_share_is_looked_at_when_it_frees)
{
    slots_set_cap(s, 4);
    slots_set_shares(s, 50, 50); /* an origin 2, a connection 2 */
    struct share *a = slots_origin_share(s, "http://a"), *b = slots_origin_share(s, "http://b"),
                 *c = share_new_conn();
    cr_assert(a && b && c);
    struct owner o[5];
    ask(&o[0], a, c);
    ask(&o[1], b, c);    /* the connection is used up */
    ask(&o[2], a, c);    /* waits for the connection */
    ask(&o[3], b, c);    /* and so does this one, behind it */
    ask(&o[4], a, NULL); /* goes past them: origin a is used up now */
    turn();
    cr_assert_eq(o[4].went, 3);
    slots_release(s, &o[1].hold);
    turn();
    cr_expect_eq(o[3].went, 4, "b's went as the connection freed, a's waits for its origin");
    cr_expect_eq(o[2].went, 0);
    slots_release(s, &o[4].hold);
    turn();
    cr_expect_eq(o[2].went, 0, "the connection is used up again");
    slots_release(s, &o[3].hold);
    turn();
    cr_expect_eq(o[2].went, 5);
    slots_release(s, &o[0].hold);
    slots_release(s, &o[2].hold);
    share_unref(c);
}

/* Whoever fits goes in arrival order, whatever its class: the cap alone, five classes. */
Test(slots, of_those_that_fit_the_oldest_goes_first)
{
    slots_set_cap(s, 1);
    slots_set_shares(s, 100, 100);
    struct share *a = slots_origin_share(s, "http://a"), *b = slots_origin_share(s, "http://b"),
                 *c = share_new_conn();
    cr_assert(a && b && c);
    struct owner o[6];
    ask(&o[0], a, NULL);
    ask(&o[1], b, NULL);
    ask(&o[2], a, c);
    ask(&o[3], b, NULL);
    ask(&o[4], NULL, c);
    ask(&o[5], a, NULL);
    for (int i = 1; i < 6; i++) {
        slots_release(s, &o[i - 1].hold);
        turn();
        for (int j = i + 1; j < 6; j++)
            cr_expect_eq(o[j].went, 0);
        cr_expect_eq(o[i].went, i + 1, "owner %d went %d", i, o[i].went);
    }
    slots_release(s, &o[5].hold);
    share_unref(c);
}

/* A random run of arrivals, releases and owners leaving the queue over two origins and three
 * connections (and none), a dozen owners waiting or holding at a time, checked after every
 * turn: while a slot is free no waiting owner has room in both its shares (none waits for
 * nothing), and whoever goes is the oldest of those that fit; at the end every owner went or
 * left. */
#define RUN_OWNERS 3000
static struct owner run[RUN_OWNERS];
static enum { NOT_YET, WAITING, HOLDING, DONE } run_state[RUN_OWNERS];
static size_t run_cap, run_held;
static unsigned run_pct[2];

static bool run_fits(int i)
{
    if (run_held >= run_cap)
        return false;
    for (int k = 0; k < 2; k++) {
        const struct share *sh = run[i].wt.share[k];
        size_t limit = (run_cap * run_pct[k] + 99) / 100;
        if (sh && sh->held >= (limit ? limit : 1))
            return false;
    }
    return true;
}

static void run_go(struct upstream_wait *wt)
{
    struct owner *o = (struct owner *)(void *)wt;
    int i = (int)(o - run);
    for (int j = 0; j < i; j++)
        cr_assert(run_state[j] != WAITING || !run_fits(j), "%d went before %d, which fit", i, j);
    run_state[i] = HOLDING;
    run_held++;
    slots_take(s, &o->hold);
}

/* xorshift32: the run is the same every time. */
static uint32_t run_rand(void)
{
    static uint32_t x = 2463534242u;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return x;
}

/* An owner in 'state', picked at random, or -1. */
static int run_pick(int state, int asked)
{
    int i = asked ? (int)(run_rand() % (uint32_t)asked) : 0;
    for (int k = 0; k < asked; k++, i = (i + 1) % asked)
        if ((int)run_state[i] == state)
            return i;
    return -1;
}

Test(slots, no_owner_waits_while_it_fits_and_the_oldest_that_fits_goes_first)
{
    run_cap = 6;
    run_pct[0] = 50; /* an origin 3 */
    run_pct[1] = 34; /* a connection 3 */
    slots_set_cap(s, run_cap);
    slots_set_shares(s, run_pct[0], run_pct[1]);
    struct share *origin[2] = { slots_origin_share(s, "http://a"),
                                slots_origin_share(s, "http://b") };
    struct share *conn[4] = { share_new_conn(), share_new_conn(), share_new_conn(), NULL };
    cr_assert(origin[0] && origin[1] && conn[0] && conn[1] && conn[2]);
    int asked = 0, active = 0;
    while (asked < RUN_OWNERS || active) {
        uint32_t r = run_rand();
        int i;
        if (asked < RUN_OWNERS && active < 4 + (int)(r % 12)) {
            struct owner *o = &run[asked];
            memset(o, 0, sizeof(*o));
            o->wt.share[0] = o->hold.share[0] = origin[(r >> 8) % 2];
            o->wt.share[1] = o->hold.share[1] = conn[(r >> 12) % 4];
            run_state[asked++] = WAITING;
            active++;
            if (slots_full(s, o->wt.share))
                slots_wait(s, &o->wt, run_go);
            else
                run_go(&o->wt);
        } else if ((r >> 20) % 8 && (i = run_pick(HOLDING, asked)) >= 0) {
            slots_release(s, &run[i].hold);
            run_state[i] = DONE;
            run_held--;
            active--;
        } else if ((i = run_pick(WAITING, asked)) >= 0) {
            slots_unwait(s, &run[i].wt); /* its request ended while it waited */
            run_state[i] = DONE;
            active--;
        }
        turn();
        for (int k = 0; k < asked; k++)
            cr_assert(run_state[k] != WAITING || !run_fits(k), "owner %d waits and fits", k);
    }
    for (int k = 0; k < 3; k++) {
        cr_expect_eq(conn[k]->held, 0);
        cr_expect_eq(conn[k]->refs, 1);
        share_unref(conn[k]);
    }
}

Test(slots, a_connection_share_holds_a_reference_while_it_waits_or_holds)
{
    slots_set_cap(s, 2);
    slots_set_shares(s, 100, 50); /* a connection holds 1 of 2 */
    struct share *c = share_new_conn();
    cr_assert_not_null(c);
    struct owner o[2];
    ask(&o[0], NULL, c);
    cr_assert_eq(c->refs, 2);
    ask(&o[1], NULL, c);
    cr_assert_eq(o[1].went, 0);
    cr_assert_eq(c->refs, 3);
    slots_unwait(s, &o[1].wt);
    cr_assert_eq(c->refs, 2);
    slots_release(s, &o[0].hold);
    cr_assert_eq(c->refs, 1);
    cr_assert_eq(c->held, 0);
    share_unref(c);
}

Test(slots, no_cap_no_limit)
{
    struct owner o[3];
    for (int i = 0; i < 3; i++) {
        ask(&o[i], NULL, NULL);
        cr_assert_eq(o[i].went, i + 1);
    }
    for (int i = 0; i < 3; i++)
        slots_release(s, &o[i].hold);
}

/* Issue 38 part 8: a share per endpoint, the upstream's origin at one address. Two targets of
 * one endpoint (an old and a new config snapshot's) find the same share and count in it
 * together; another address of the same upstream has its own, which goes on when the first is
 * used up. */
Test(slots, two_targets_of_one_endpoint_count_in_one_share_its_sibling_in_another)
{
    slots_set_cap(s, 4);
    slots_set_shares(s, 50, 100); /* an endpoint holds 2 of 4 at most */
    struct share *old = slots_endpoint_share(s, "http://svc:80 10.0.0.1"),
                 *now = slots_endpoint_share(s, "http://svc:80 10.0.0.1"),
                 *sibling = slots_endpoint_share(s, "http://svc:80 10.0.0.2");
    cr_assert(old && sibling);
    cr_assert_eq(now, old, "one share per endpoint, whichever target asks");
    cr_assert_neq(sibling, old);
    cr_assert_neq(slots_origin_share(s, "http://svc:80"), old, "an origin's is another");
    struct owner o[5];
    ask(&o[0], old, NULL);
    ask(&o[1], now, NULL);
    ask(&o[2], now, NULL); /* the endpoint's share is used up: waits */
    ask(&o[3], sibling, NULL);
    turn();
    cr_expect_eq(o[2].went, 0, "the endpoint holds %zu, its share 2", old->held);
    cr_expect_eq(o[3].went, 3, "its sibling's attempt went past it");
    ask(&o[4], sibling, NULL);
    cr_expect_eq(o[4].went, 4, "its sibling's second attempt went at once, the last slot");
    slots_release(s, &o[0].hold);
    turn();
    cr_expect_eq(o[2].went, 5, "the waiting one went once its endpoint had room");
    for (int i = 1; i < 5; i++)
        slots_release(s, &o[i].hold);
    slots_share_let_go(old);
    slots_share_let_go(now);
    slots_share_let_go(sibling);
}

/* An endpoint's share goes once nothing uses it (its targets let go, no slot held, nothing
 * waiting), not before; an origin's stays with the worker. */
Test(slots, an_endpoint_share_goes_when_nothing_uses_it)
{
    slots_set_cap(s, 1);
    slots_set_shares(s, 100, 100);
    cr_assert_not_null(slots_origin_share(s, "http://a"));
    struct share *e = slots_endpoint_share(s, "http://svc:80 10.0.0.1");
    cr_assert_not_null(e);
    struct owner o[2];
    ask(&o[0], e, NULL);
    ask(&o[1], e, NULL);   /* waits for the cap */
    slots_share_let_go(e); /* its target is freed with its snapshot */
    slots_trim(s);
    cr_expect_eq(slots_shares(s), 2, "a share held and waited for stays");
    slots_release(s, &o[0].hold);
    turn();
    cr_assert_eq(o[1].went, 2);
    slots_trim(s);
    cr_expect_eq(slots_shares(s), 2, "a share held stays");
    slots_release(s, &o[1].hold);
    slots_trim(s);
    cr_expect_eq(slots_shares(s), 1, "the endpoint's share went, the origin's stayed");
    struct share *again = slots_endpoint_share(s, "http://svc:80 10.0.0.1");
    cr_assert_not_null(again);
    cr_expect_eq(again->held + again->refs, 1, "a new one, made afresh");
    slots_share_let_go(again);
}

/* Pods roll: 10,000 endpoints come, are used and go, one after another; the map keeps a few
 * shares, not one per endpoint ever seen (no trim from the worker meanwhile). */
Test(slots, the_shares_follow_endpoints_as_they_come_and_go)
{
    slots_set_cap(s, 4);
    slots_set_shares(s, 50, 100);
    struct share *live = slots_endpoint_share(s, "http://svc:80 10.1.0.1");
    size_t most = 0;
    for (int i = 0; i < 10000; i++) {
        char key[64];
        snprintf(key, sizeof(key), "http://svc:80 10.0.%d.%d", i / 250, i % 250 + 1);
        struct share *e = slots_endpoint_share(s, key);
        cr_assert_not_null(e);
        struct owner o;
        ask(&o, e, NULL);
        slots_release(s, &o.hold);
        slots_share_let_go(e);
        if (slots_shares(s) > most)
            most = slots_shares(s);
    }
    cr_expect_leq(most, 20, "the map held %zu shares", most);
    cr_expect_eq(slots_endpoint_share(s, "http://svc:80 10.1.0.1"), live, "one in use stayed");
    slots_share_let_go(live);
    slots_share_let_go(live);
}

/* The config snapshot that owns a target may outlive the worker (it is freed after it): the
 * target's share is freed by whichever lets go last. ASan says whether it is freed twice or
 * never. */
Test(slots, a_target_lets_go_of_its_share_after_the_worker_is_gone)
{
    struct slots *w = slots_new(l);
    cr_assert_not_null(w);
    struct share *e = slots_endpoint_share(w, "http://svc:80 10.0.0.1");
    struct share *f = slots_endpoint_share(w, "http://svc:80 10.0.0.2");
    cr_assert(e && f);
    slots_share_let_go(f); /* before: the map frees it */
    slots_free(w);
    slots_share_let_go(e); /* after: the target does */
}
