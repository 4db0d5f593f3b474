/* choose_balanced: which endpoint the next attempt goes to (docs/endpoints.md): preferring one
 * neither tried nor ejected, then one not ejected, then (every endpoint ejected: panic mode) one
 * not tried; among those round-robin, random, or the less loaded of two (least_request). A
 * request's first attempt takes the route's turn; a retry takes none and goes to any untried
 * endpoint at random. The random number generator is seeded: every run picks the same. */
#include <criterion/criterion.h>

#include "policy/score.h"
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
    return choose_balanced(CFG_BALANCE_ROUND_ROBIN, tried, ejected, n, NULL, NULL, &rr, &rng);
}

Test(choose, a_first_attempt_takes_the_turn)
{
    cr_expect_eq(pick(0, 0, 3, 0), 0);
    cr_expect_eq(pick(0, 0, 3, 4), 1);
    uint32_t rr = 5;
    cr_expect_eq(choose_balanced(CFG_BALANCE_ROUND_ROBIN, 0, 0, 3, NULL, NULL, &rr, &rng), 2);
    cr_expect_eq(choose_balanced(CFG_BALANCE_ROUND_ROBIN, 0, 0, 3, NULL, NULL, &rr, &rng), 0,
                 "the turn moves on by one");
}

Test(choose, a_retry_goes_to_an_untried_one_and_leaves_the_turn)
{
    for (int i = 0; i < 50; i++) {
        uint32_t rr = 1;
        size_t got = choose_balanced(CFG_BALANCE_ROUND_ROBIN, B(1), 0, 3, NULL, NULL, &rr, &rng);
        cr_expect(got == 0 || got == 2, "went back to the tried one");
        cr_expect_eq(rr, 1, "a retry moved the turn");
        got = choose_balanced(CFG_BALANCE_LEAST_REQUEST, B(0) | B(1) | B(2), 0, 3,
                              (const int64_t[]){ 0, 0, 0 }, NULL, &rr, &rng);
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
        got[i] = choose_balanced(CFG_BALANCE_ROUND_ROBIN, 0, B(0), 2, NULL, NULL, &rr, NULL);
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
        cr_expect_eq(choose_balanced(CFG_BALANCE_LEAST_REQUEST, 0, 0, 3, idle, NULL, &rr, &rng),
                     i % 3);
}

Test(choose, least_request_spares_the_loaded_one)
{
    const int64_t load[3] = { 5, 0, 0 }; /* 0 is busy */
    size_t got[3] = { 0 };
    uint32_t rr = 0;
    for (size_t i = 0; i < 300; i++)
        got[choose_balanced(CFG_BALANCE_LEAST_REQUEST, 0, 0, 3, load, NULL, &rr, &rng)]++;
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
        cr_expect_eq(
            choose_balanced(CFG_BALANCE_LEAST_REQUEST, B(0), B(2), 3, load, NULL, &rr, &rng), 1);
    }
}

Test(choose, random_picks_every_candidate_but_the_avoided)
{
    size_t got[4] = { 0 };
    for (size_t i = 0; i < 400; i++)
        got[choose_balanced(CFG_BALANCE_RANDOM, B(3), 0, 4, NULL, NULL, NULL, &rng)]++;
    cr_expect_eq(got[3], 0);
    for (size_t i = 0; i < 3; i++)
        cr_expect_gt(got[i], 80, "candidate %zu: %zu of 400", i, got[i]);
}

Test(choose, one_candidate_whatever_the_bits)
{
    uint32_t rr = 7;
    cr_expect_eq(choose_balanced(CFG_BALANCE_LEAST_REQUEST, B(0), B(0), 1, NULL, NULL, &rr, NULL),
                 0);
}

/* The mask form takes CHOOSE_MASK_MAX candidates at most; balance.c gives more to choose_many()
 * (tests/unit/test_choose_many.c). */
Test(choose, sixty_four_candidates_at_most)
{
    uint32_t rr = 0;
    for (size_t i = 0; i < 200; i++)
        cr_expect_lt(choose_balanced(CFG_BALANCE_ROUND_ROBIN, 0, 0, 100, NULL, NULL, &rr, &rng),
                     64);
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
        size_t i = choose_balanced(b, tried, 0, n, idle, NULL, &r.rr, &rng);
        r.first[i]++;
        r.attempts++;
        while (i == 0) {
            tried |= B(i);
            i = choose_balanced(b, tried, 0, n, idle, NULL, &r.rr, &rng);
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
            size_t i = choose_balanced(policies[p], 0, 0, 4, idle, NULL, &rr, &rng);
            cr_assert_eq(i, q % 4, "policy %zu, request %zu: first attempt on %zu", p, q, i);
            uint64_t tried = B(i);
            for (uint64_t k = rng_between(&rng, 0, 3); k > 0; k--)
                tried |= B(choose_balanced(policies[p], tried, B(rng_between(&rng, 0, 3)), 4, idle,
                                           NULL, &rr, &rng));
        }
    }
}

/* An ejected endpoint's turn is not handed to the one after it: the others share evenly. */
Test(choose, first_attempts_share_evenly_over_the_endpoints_not_ejected)
{
    uint32_t rr = 0;
    size_t got[3] = { 0 };
    for (size_t q = 0; q < 300; q++)
        got[choose_balanced(CFG_BALANCE_ROUND_ROBIN, 0, B(0), 3, NULL, NULL, &rr, &rng)]++;
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
            got[choose_balanced(policies[p], B(0), 0, 3, idle, NULL, &rr, &rng)]++;
        cr_expect_eq(got[0], 0);
        for (size_t i = 1; i < 3; i++)
            cr_expect(got[i] > 1350 && got[i] < 1650, "policy %zu: endpoint %zu got %zu of 3000", p,
                      i, got[i]);
    }
}

/* ---- weights from the endpoints' scores (policy/score.h), on a fake clock ---- */

/* Endpoints as proxy/core/balance.c shows them to the choice: each with its score, its requests
 * in flight and how it answers: 'fails' every attempt or none, after 'took_ms'. */
struct fake_ep {
    struct score s;
    int64_t load;
    bool fails;
    uint64_t took_ms;
};

struct fleet {
    size_t n;
    struct fake_ep ep[8];
    uint64_t now_ms;
    uint32_t rr;
    size_t first[8], attempts, failed_requests;
};

/* The pick balance_pick() makes: the weights from the scores, relative to the fastest. */
static size_t fleet_pick(struct fleet *f, enum cfg_balance b, uint64_t tried, bool turn)
{
    uint32_t weight[8], fastest = 0;
    int64_t load[8];
    for (size_t i = 0; i < f->n; i++)
        if (f->ep[i].s.lat_us && (!fastest || f->ep[i].s.lat_us < fastest))
            fastest = f->ep[i].s.lat_us;
    for (size_t i = 0; i < f->n; i++) {
        weight[i] = score_weight(f->ep[i].s.fail_q16, f->ep[i].s.lat_us, f->ep[i].s.at_ms,
                                 f->now_ms, fastest);
        load[i] = f->ep[i].load;
    }
    return choose_balanced(b, tried, 0, f->n, load, weight, turn ? &f->rr : NULL, &rng);
}

/* Requests one after another, one every 'gap_ms': each tried up to three times, every attempt
 * recorded in its endpoint's score as eject_record() does. */
static void one_after_another(struct fleet *f, enum cfg_balance b, size_t requests, uint64_t gap_ms)
{
    for (size_t q = 0; q < requests; q++) {
        uint64_t tried = 0;
        bool ok = false;
        for (size_t a = 0; a < 3 && !ok; a++) {
            size_t i = fleet_pick(f, b, tried, tried == 0);
            if (tried == 0)
                f->first[i]++;
            tried |= B(i);
            f->attempts++;
            struct fake_ep *e = &f->ep[i];
            f->now_ms += e->took_ms;
            score_record(&e->s, e->fails, e->took_ms * 1000, f->now_ms);
            ok = !e->fails;
        }
        f->failed_requests += !ok;
        f->now_ms += gap_ms;
    }
}

/* Three endpoints answering in 2 ms, the second failing every attempt. */
static struct fleet one_of_three_failing(void)
{
    struct fleet f = { .n = 3 };
    for (size_t i = 0; i < 3; i++)
        f.ep[i].took_ms = 2;
    f.ep[1].fails = true;
    return f;
}

static const enum cfg_balance turn_policies[] = { CFG_BALANCE_ROUND_ROBIN,
                                                  CFG_BALANCE_LEAST_REQUEST };

/* Three endpoints, one answering 503 at once to everything: it gets at most a fifth of first
 * attempts (here about 1 in 30: its floor, and the first few before its score falls), and no
 * request fails: the retries land on the two others. With even weights it got a third. */
Test(choose, a_failing_one_of_three_gets_at_most_a_fifth_one_after_another)
{
    for (size_t p = 0; p < 2; p++) {
        struct fleet f = one_of_three_failing();
        f.ep[1].took_ms = 0;
        one_after_another(&f, turn_policies[p], 3000, 10);
        cr_log_info("policy %zu: the failing one got %zu of 3000 first attempts, %zu attempts", p,
                    f.first[1], f.attempts);
        cr_expect_leq(f.first[1], 600, "policy %zu: %zu of 3000", p, f.first[1]);
        cr_expect_eq(f.failed_requests, 0);
        /* over the first 30 requests too: it learns within a few */
        struct fleet g = one_of_three_failing();
        g.ep[1].took_ms = 0;
        one_after_another(&g, turn_policies[p], 30, 10);
        cr_expect_leq(g.first[1], 6, "policy %zu: %zu of the first 30", p, g.first[1]);
    }
}

/* As concurrent callers would: four at once, each starting its next request as soon as its last
 * one ends, the healthy endpoints taking 20 ms an attempt and the failing one 1 ms (it fails fast,
 * so it has fewer in flight: least_request on load alone sent it most of them). */
Test(choose, a_failing_one_of_three_gets_at_most_a_fifth_with_callers_at_once)
{
    for (size_t p = 0; p < 2; p++) {
        struct fleet f = { .n = 3 };
        f.ep[0].took_ms = f.ep[2].took_ms = 20;
        f.ep[1].took_ms = 1;
        f.ep[1].fails = true;
        struct caller {
            uint64_t done_ms, tried;
            size_t ep, attempt;
        } c[4] = { 0 };
        size_t requests = 0;
        /* start each caller's first request */
        for (size_t k = 0; k < 4; k++) {
            c[k].ep = fleet_pick(&f, turn_policies[p], 0, true);
            f.first[c[k].ep]++;
            f.ep[c[k].ep].load++;
            c[k].tried = B(c[k].ep);
            c[k].done_ms = f.now_ms + f.ep[c[k].ep].took_ms;
            c[k].attempt = 1;
            requests++;
        }
        while (requests < 4000) {
            size_t k = 0;
            for (size_t j = 1; j < 4; j++)
                if (c[j].done_ms < c[k].done_ms)
                    k = j;
            struct fake_ep *e = &f.ep[c[k].ep];
            f.now_ms = c[k].done_ms;
            e->load--;
            score_record(&e->s, e->fails, e->took_ms * 1000, f.now_ms);
            bool retry = e->fails && c[k].attempt < 3;
            if (e->fails && !retry)
                f.failed_requests++;
            if (!retry) {
                c[k].tried = 0;
                c[k].attempt = 0;
                requests++;
            }
            c[k].ep = fleet_pick(&f, turn_policies[p], c[k].tried, c[k].tried == 0);
            if (c[k].tried == 0)
                f.first[c[k].ep]++;
            c[k].tried |= B(c[k].ep);
            c[k].attempt++;
            f.ep[c[k].ep].load++;
            c[k].done_ms = f.now_ms + f.ep[c[k].ep].took_ms;
        }
        size_t all = f.first[0] + f.first[1] + f.first[2];
        cr_log_info("policy %zu: the failing one got %zu of %zu first attempts", p, f.first[1],
                    all);
        cr_expect_leq(f.first[1] * 5, all, "policy %zu: %zu of %zu", p, f.first[1], all);
        cr_expect_eq(f.failed_requests, 0);
    }
}

/* A slow endpoint (100 ms where the others take 2) gets less: its weight falls with its latency
 * past twice the fastest's and 5 ms. */
Test(choose, a_slow_endpoint_gets_fewer_first_attempts)
{
    for (size_t p = 0; p < 2; p++) {
        struct fleet f = { .n = 3 };
        f.ep[0].took_ms = f.ep[1].took_ms = 2;
        f.ep[2].took_ms = 100;
        one_after_another(&f, turn_policies[p], 3000, 10);
        cr_log_info("policy %zu: the slow one got %zu of 3000 first attempts", p, f.first[2]);
        cr_expect_leq(f.first[2], 300, "policy %zu: %zu of 3000", p, f.first[2]);
        cr_expect_geq(f.first[2], 10, "policy %zu: still tried now and then", p);
    }
}

/* An endpoint that stops failing is still tried at its floor and regains its share: within 20 s
 * of the fake clock (requests every 10 ms) it gets at least a quarter of first attempts again. */
Test(choose, a_recovered_endpoint_regains_its_share_in_bounded_time)
{
    for (size_t p = 0; p < 2; p++) {
        struct fleet f = one_of_three_failing();
        one_after_another(&f, turn_policies[p], 2000, 10);
        f.ep[1].fails = false;
        uint64_t healed = f.now_ms, back = 0;
        for (size_t window = 0; window < 100 && !back; window++) {
            size_t before = f.first[1];
            one_after_another(&f, turn_policies[p], 100, 10);
            if ((f.first[1] - before) * 4 >= 100)
                back = f.now_ms - healed;
        }
        cr_log_info("policy %zu: back to a quarter of first attempts %llu ms after it healed", p,
                    (unsigned long long)back);
        cr_expect(back > 0 && back <= 20000, "policy %zu: back after %llu ms", p,
                  (unsigned long long)back);
    }
}

/* The weights do not change a plain rotation while every endpoint is healthy: each pick is one
 * pass over the candidates (O(n)), and equal weights are the rotation of before. */
Test(choose, equal_scores_keep_the_plain_rotation)
{
    struct fleet f = { .n = 4 };
    for (size_t i = 0; i < 4; i++)
        f.ep[i].took_ms = 1 + i; /* within twice the fastest and 5 ms: not slow */
    for (size_t q = 0; q < 400; q++) {
        size_t i = fleet_pick(&f, CFG_BALANCE_LEAST_REQUEST, 0, true);
        cr_assert_eq(i, q % 4, "request %zu went to %zu", q, i);
        score_record(&f.ep[i].s, false, f.ep[i].took_ms * 1000, f.now_ms += 10);
    }
}
