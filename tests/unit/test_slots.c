/* slots: a worker's upstream attempt slots (proxy/upstream/slots.h): the cap, the queue in arrival
 * order, handing a freed slot on in the next turn of the loop, and the origin and connection
 * shares. */
#include <criterion/criterion.h>
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
