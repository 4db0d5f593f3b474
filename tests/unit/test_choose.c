/* choose_balanced: which endpoint the next attempt goes to (docs/endpoints.md): preferring one
 * neither tried nor ejected, then one not ejected, then (every endpoint ejected: panic mode) one
 * not tried; among those round-robin, random, or the less loaded of two (least_request). */
#include <criterion/criterion.h>

#include "proxy/core/choose.h"

#define B(i) (1ULL << (i))

/* Round-robin from position 'rr' over 'n' upstreams. */
static size_t pick(uint64_t tried, uint64_t ejected, size_t n, uint32_t rr)
{
    return choose_balanced(CFG_BALANCE_ROUND_ROBIN, tried, ejected, n, NULL, &rr, NULL);
}

Test(choose, nothing_ejected_is_round_robin_skipping_the_tried)
{
    cr_expect_eq(pick(0, 0, 3, 0), 0);
    cr_expect_eq(pick(0, 0, 3, 4), 1);
    cr_expect_eq(pick(B(1), 0, 3, 1), 2);
    cr_expect_eq(pick(B(0) | B(1) | B(2), 0, 3, 1), 1, "all tried: the one in turn");
}

Test(choose, an_ejected_upstream_is_skipped)
{
    cr_expect_eq(pick(0, B(0), 2, 0), 1);
    cr_expect_eq(pick(0, B(0), 2, 1), 1);
    cr_expect_eq(pick(0, B(1), 3, 1), 2);
}

Test(choose, a_tried_upstream_in_rotation_before_an_ejected_untried_one)
{
    /* 0 tried, 1 ejected: back to 0 rather than to the ejected one */
    cr_expect_eq(pick(B(0), B(1), 2, 1), 0);
    cr_expect_eq(pick(B(0), B(1) | B(2), 3, 1), 0);
}

Test(choose, neither_tried_nor_ejected_comes_first)
{
    cr_expect_eq(pick(B(0), B(1), 3, 0), 2);
}

Test(choose, every_upstream_ejected_prefers_the_untried_in_turn)
{
    cr_expect_eq(pick(0, B(0) | B(1), 2, 1), 1, "panic: the one in turn");
    cr_expect_eq(pick(B(1), B(0) | B(1) | B(2), 3, 1), 2, "panic: the untried next");
    cr_expect_eq(pick(B(0) | B(1), B(0) | B(1), 2, 1), 1, "all tried and ejected");
}

Test(choose, every_pick_skips_the_ejected_whatever_the_position)
{
    uint32_t rr = 0;
    size_t got[4];
    for (int i = 0; i < 4; i++)
        got[i] = choose_balanced(CFG_BALANCE_ROUND_ROBIN, 0, B(0), 2, NULL, &rr, NULL);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(got[i], 1, "pick %d", i);
}

/* least_request: the one in turn and one other at random; fewer in flight wins, the one in
 * turn on a tie (so requests one after another go round-robin). */
Test(choose, least_request_is_round_robin_when_nothing_waits)
{
    struct rng rng;
    rng_seed(&rng, 1);
    const int64_t idle[3] = { 0, 0, 0 };
    uint32_t rr = 0;
    for (size_t i = 0; i < 9; i++)
        cr_expect_eq(choose_balanced(CFG_BALANCE_LEAST_REQUEST, 0, 0, 3, idle, &rr, &rng), i % 3);
}

Test(choose, least_request_spares_the_loaded_one)
{
    struct rng rng;
    rng_seed(&rng, 2);
    const int64_t load[3] = { 5, 0, 0 }; /* 0 is busy */
    size_t got[3] = { 0 };
    uint32_t rr = 0;
    for (size_t i = 0; i < 300; i++)
        got[choose_balanced(CFG_BALANCE_LEAST_REQUEST, 0, 0, 3, load, &rr, &rng)]++;
    cr_expect_eq(got[0], 0, "the loaded one loses every comparison: picked %zu times", got[0]);
    cr_expect_gt(got[1], 100);
    cr_expect_gt(got[2], 100);
}

Test(choose, least_request_still_avoids_the_tried_and_ejected)
{
    struct rng rng;
    rng_seed(&rng, 3);
    const int64_t load[3] = { 0, 9, 0 };
    for (uint32_t start = 0; start < 30; start++) {
        uint32_t rr = start;
        /* 0 tried, 2 ejected: 1 is the only one left, however loaded */
        cr_expect_eq(choose_balanced(CFG_BALANCE_LEAST_REQUEST, B(0), B(2), 3, load, &rr, &rng), 1);
    }
}

Test(choose, random_picks_every_candidate_but_the_avoided)
{
    struct rng rng;
    rng_seed(&rng, 4);
    size_t got[4] = { 0 };
    for (size_t i = 0; i < 400; i++)
        got[choose_balanced(CFG_BALANCE_RANDOM, B(3), 0, 4, NULL, NULL, &rng)]++;
    cr_expect_eq(got[3], 0);
    for (size_t i = 0; i < 3; i++)
        cr_expect_gt(got[i], 80, "candidate %zu: %zu of 400", i, got[i]);
}

Test(choose, one_candidate_whatever_the_bits)
{
    uint32_t rr = 7;
    cr_expect_eq(choose_balanced(CFG_BALANCE_LEAST_REQUEST, B(0), B(0), 1, NULL, &rr, NULL), 0);
}

Test(choose, sixty_four_candidates_at_most)
{
    struct rng rng;
    rng_seed(&rng, 5);
    uint32_t rr = 0;
    for (size_t i = 0; i < 200; i++)
        cr_expect_lt(choose_balanced(CFG_BALANCE_ROUND_ROBIN, 0, 0, 100, NULL, &rr, &rng), 64);
}
