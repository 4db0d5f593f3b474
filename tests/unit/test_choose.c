/* choose_balanced: which endpoint the next attempt goes to (docs/endpoints.md): preferring one
 * neither tried nor ejected, then one not ejected, then (every endpoint ejected: panic mode) one
 * not tried; among those round-robin, random, or the less loaded of two (least_request). A
 * request's first attempt takes the route's turn; a retry takes none and goes to any untried
 * endpoint at random. The random number generator is seeded: every run picks the same. */
#include <criterion/criterion.h>

#include "proxy/core/choose.h"

#define B(i) (1ULL << (i))

static struct rng rng;

static void seed(void)
{
    rng_seed(&rng, 42);
}

TestSuite(choose, .init = seed);

/* Round-robin from position 'rr' over 'n' upstreams. */
static size_t pick(uint64_t tried, uint64_t ejected, size_t n, uint32_t rr)
{
    return choose_balanced(CFG_BALANCE_ROUND_ROBIN, tried, ejected, n, NULL, &rr, &rng);
}

Test(choose, a_first_attempt_takes_the_turn)
{
    cr_expect_eq(pick(0, 0, 3, 0), 0);
    cr_expect_eq(pick(0, 0, 3, 4), 1);
    uint32_t rr = 5;
    cr_expect_eq(choose_balanced(CFG_BALANCE_ROUND_ROBIN, 0, 0, 3, NULL, &rr, &rng), 2);
    cr_expect_eq(choose_balanced(CFG_BALANCE_ROUND_ROBIN, 0, 0, 3, NULL, &rr, &rng), 0,
                 "the turn moves on by one");
}

Test(choose, a_retry_goes_to_an_untried_one_and_leaves_the_turn)
{
    for (int i = 0; i < 50; i++) {
        uint32_t rr = 1;
        size_t got = choose_balanced(CFG_BALANCE_ROUND_ROBIN, B(1), 0, 3, NULL, &rr, &rng);
        cr_expect(got == 0 || got == 2, "went back to the tried one");
        cr_expect_eq(rr, 1, "a retry moved the turn");
        got = choose_balanced(CFG_BALANCE_LEAST_REQUEST, B(0) | B(1) | B(2), 0, 3,
                              (const int64_t[]){ 0, 0, 0 }, &rr, &rng);
        cr_expect_lt(got, 3, "all tried: any");
        cr_expect_eq(rr, 1, "a retry moved the turn");
    }
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

Test(choose, every_upstream_ejected_prefers_the_untried)
{
    cr_expect_eq(pick(0, B(0) | B(1), 2, 1), 1, "panic: the one in turn");
    for (int i = 0; i < 20; i++) {
        cr_expect_neq(pick(B(1), B(0) | B(1) | B(2), 3, 1), 1, "panic: an untried one");
        cr_expect_lt(pick(B(0) | B(1), B(0) | B(1), 2, 1), 2, "all tried and ejected: any");
    }
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
    const int64_t idle[3] = { 0, 0, 0 };
    uint32_t rr = 0;
    for (size_t i = 0; i < 9; i++)
        cr_expect_eq(choose_balanced(CFG_BALANCE_LEAST_REQUEST, 0, 0, 3, idle, &rr, &rng), i % 3);
}

Test(choose, least_request_spares_the_loaded_one)
{
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
    const int64_t load[3] = { 0, 9, 0 };
    for (uint32_t start = 0; start < 30; start++) {
        uint32_t rr = start;
        /* 0 tried, 2 ejected: 1 is the only one left, however loaded */
        cr_expect_eq(choose_balanced(CFG_BALANCE_LEAST_REQUEST, B(0), B(2), 3, load, &rr, &rng), 1);
    }
}

Test(choose, random_picks_every_candidate_but_the_avoided)
{
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
    uint32_t rr = 0;
    for (size_t i = 0; i < 200; i++)
        cr_expect_lt(choose_balanced(CFG_BALANCE_ROUND_ROBIN, 0, 0, 100, NULL, &rr, &rng), 64);
}

/* ---- fairness over sequences of requests ---- */

/* 'requests' one after another over 'n' endpoints of which endpoint 0 fails every attempt,
 * under 'b' with nothing in flight (one after another): each request's first attempt, then, if
 * it failed, retries until one succeeds. first[i]: first attempts on i; retried[i]: retries. */
struct run {
    size_t attempts, first[3], retried[3];
    uint32_t rr;
};

static struct run one_failing(enum cfg_balance b, size_t n, size_t requests)
{
    const int64_t idle[3] = { 0, 0, 0 };
    struct run r = { 0 };
    for (size_t q = 0; q < requests; q++) {
        uint64_t tried = 0;
        size_t i = choose_balanced(b, tried, 0, n, idle, &r.rr, &rng);
        r.first[i]++;
        r.attempts++;
        while (i == 0) {
            tried |= B(i);
            i = choose_balanced(b, tried, 0, n, idle, &r.rr, &rng);
            cr_assert_neq(i, 0, "a retry went back to the endpoint that failed");
            r.retried[i]++;
            r.attempts++;
        }
    }
    return r;
}

/* With one of two endpoints failing, requests alternate between them: those that start on the
 * failing one take two attempts, the others one, 1.5 a request, under both policies that take
 * turns (a retry that moved the turn made it 2.0, every first attempt on the failing one). */
Test(choose, one_of_two_failing_costs_one_and_a_half_attempts)
{
    const enum cfg_balance policies[] = { CFG_BALANCE_ROUND_ROBIN, CFG_BALANCE_LEAST_REQUEST };
    for (size_t p = 0; p < 2; p++) {
        struct run r = one_failing(policies[p], 2, 1000);
        cr_expect_eq(r.attempts, 1500, "policy %zu: %zu attempts for 1000 requests", p, r.attempts);
        cr_expect_eq(r.first[0], 500, "policy %zu: %zu first attempts on the failing one", p,
                     r.first[0]);
    }
}

/* With three endpoints, one failing, each gets a third of first attempts, the failing one too
 * (no more: a retry that took a turn gave it half), and the failing one's retries spread over
 * the two others. */
Test(choose, one_of_three_failing_gets_its_third_of_first_attempts)
{
    const enum cfg_balance policies[] = { CFG_BALANCE_ROUND_ROBIN, CFG_BALANCE_LEAST_REQUEST };
    for (size_t p = 0; p < 2; p++) {
        struct run r = one_failing(policies[p], 3, 3000);
        for (size_t i = 0; i < 3; i++)
            cr_expect_eq(r.first[i], 1000,
                         "policy %zu: endpoint %zu got %zu of 3000 first attempts", p, i,
                         r.first[i]);
        cr_expect_eq(r.retried[1] + r.retried[2], 1000);
        for (size_t i = 1; i < 3; i++)
            cr_expect(r.retried[i] > 400 && r.retried[i] < 600,
                      "policy %zu: endpoint %zu took %zu of the 1000 retries", p, i, r.retried[i]);
    }
}

/* Whatever the retries between them (how many, which endpoints they avoid), first attempts
 * follow the turn: 0, 1, 2, 0, 1, 2... */
Test(choose, retries_leave_the_turn_of_first_attempts_as_it_was)
{
    const int64_t idle[4] = { 0, 0, 0, 0 };
    const enum cfg_balance policies[] = { CFG_BALANCE_ROUND_ROBIN, CFG_BALANCE_LEAST_REQUEST };
    for (size_t p = 0; p < 2; p++) {
        uint32_t rr = 0;
        for (size_t q = 0; q < 400; q++) {
            size_t i = choose_balanced(policies[p], 0, 0, 4, idle, &rr, &rng);
            cr_assert_eq(i, q % 4, "policy %zu, request %zu: first attempt on %zu", p, q, i);
            uint64_t tried = B(i);
            for (uint64_t k = rng_between(&rng, 0, 3); k > 0; k--)
                tried |= B(choose_balanced(policies[p], tried, B(rng_between(&rng, 0, 3)), 4, idle,
                                           &rr, &rng));
        }
    }
}

/* An ejected endpoint's turn is not handed to the one after it: the others share evenly. */
Test(choose, first_attempts_share_evenly_over_the_endpoints_not_ejected)
{
    uint32_t rr = 0;
    size_t got[3] = { 0 };
    for (size_t q = 0; q < 300; q++)
        got[choose_balanced(CFG_BALANCE_ROUND_ROBIN, 0, B(0), 3, NULL, &rr, &rng)]++;
    cr_expect_eq(got[0], 0);
    cr_expect_eq(got[1], 150, "%zu of 300", got[1]);
    cr_expect_eq(got[2], 150, "%zu of 300", got[2]);
}

/* A retry is equally likely to go to each untried endpoint, whatever the policy (a random start
 * followed by the next untried one gave the endpoint after the tried one twice the share). */
Test(choose, a_retry_is_as_likely_to_go_to_each_untried_endpoint)
{
    const enum cfg_balance policies[] = { CFG_BALANCE_ROUND_ROBIN, CFG_BALANCE_RANDOM,
                                          CFG_BALANCE_LEAST_REQUEST };
    const int64_t idle[3] = { 0, 0, 0 };
    for (size_t p = 0; p < 3; p++) {
        size_t got[3] = { 0 };
        uint32_t rr = 0;
        for (size_t q = 0; q < 3000; q++)
            got[choose_balanced(policies[p], B(0), 0, 3, idle, &rr, &rng)]++;
        cr_expect_eq(got[0], 0);
        for (size_t i = 1; i < 3; i++)
            cr_expect(got[i] > 1350 && got[i] < 1650, "policy %zu: endpoint %zu got %zu of 3000", p,
                      i, got[i]);
    }
}
