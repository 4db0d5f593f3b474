/* live: a route-scoped backoff sequence shared by every worker moves only for retries taken. */
#include <criterion/criterion.h>

#include "policy/rng.h"
#include "proxy/live.h"

static const struct backoff_spec exp100 = { .policy = BACKOFF_EXPONENTIAL,
                                            .jitter = JITTER_NONE,
                                            .scope = BACKOFF_SCOPE_ROUTE,
                                            .base_ms = 100,
                                            .cap_ms = 100000,
                                            .factor = 2 };

Test(live, a_peek_alone_leaves_the_route_sequence_where_it_was)
{
    struct live *l = live_new();
    struct live_route *lr = live_route(l, "r", 10000);
    cr_assert_not_null(lr);
    struct rng rng;
    rng_seed(&rng, 1);
    struct live_backoff_mark m;
    cr_expect_eq(live_route_backoff_peek(lr, &exp100, 0, &rng, &m), 100);
    cr_expect_eq(live_route_backoff_peek(lr, &exp100, 0, &rng, &m), 100,
                 "a refused retry moved it");
    live_route_backoff_take(lr, &exp100, 0, &rng, &m);
    cr_expect_eq(live_route_backoff_peek(lr, &exp100, 0, &rng, &m), 200);
    live_free(l);
}

/* Two workers look at the same state; both retries are taken: the sequence moves twice, the
 * second from where the first left it. */
Test(live, two_retries_taken_from_one_look_move_it_twice)
{
    struct live *l = live_new();
    struct live_route *lr = live_route(l, "r", 10000);
    cr_assert_not_null(lr);
    struct rng rng;
    rng_seed(&rng, 1);
    struct live_backoff_mark a, b;
    cr_expect_eq(live_route_backoff_peek(lr, &exp100, 0, &rng, &a), 100);
    cr_expect_eq(live_route_backoff_peek(lr, &exp100, 0, &rng, &b), 100);
    live_route_backoff_take(lr, &exp100, 0, &rng, &a);
    live_route_backoff_take(lr, &exp100, 0, &rng, &b);
    struct live_backoff_mark c;
    cr_expect_eq(live_route_backoff_peek(lr, &exp100, 0, &rng, &c), 400);
    live_free(l);
}
