/* live: a route-scoped backoff sequence shared by every worker moves only for retries taken. */
#include <criterion/criterion.h>

#include "policy/rng.h"
#include "proxy/core/live.h"

static const struct backoff_spec exp100 = { .policy = BACKOFF_EXPONENTIAL,
                                            .jitter = JITTER_NONE,
                                            .scope = BACKOFF_SCOPE_ROUTE,
                                            .base_ms = 100,
                                            .cap_ms = 100000,
                                            .factor = 2 };

static struct live *l;
static struct live_route *lr;
static struct rng rng;

static void setup(void)
{
    l = live_new();
    lr = live_route(l, "r", 10000);
    cr_assert_not_null(lr);
    rng_seed(&rng, 1);
}

static void teardown(void)
{
    live_free(l);
}

TestSuite(live, .init = setup, .fini = teardown);

static uint32_t peek(struct live_backoff_mark *m)
{
    return live_route_backoff_peek(lr, &exp100, 0, &rng, m);
}

static void take(const struct live_backoff_mark *m)
{
    live_route_backoff_take(lr, &exp100, 0, &rng, m);
}

Test(live, a_peek_alone_leaves_the_route_sequence_where_it_was)
{
    struct live_backoff_mark m;
    cr_expect_eq(peek(&m), 100);
    cr_expect_eq(peek(&m), 100, "a refused retry moved it");
    take(&m);
    cr_expect_eq(peek(&m), 200);
}

/* Two workers look at the same state; both retries are taken: the sequence moves twice, the
 * second from where the first left it. */
Test(live, two_retries_taken_from_one_look_move_it_twice)
{
    struct live_backoff_mark a, b, c;
    cr_expect_eq(peek(&a), 100);
    cr_expect_eq(peek(&b), 100);
    take(&a);
    take(&b);
    cr_expect_eq(peek(&c), 400);
}
