/* choose_many() and the tried set: the choice over thousands of endpoints (docs/endpoints.md, "No
 * cap on endpoints"). The same rule as choose_balanced() (tests/unit/test_choose.c): first
 * attempts take the turn and spread over every endpoint, a retry goes to one not tried while one
 * is left, ejected ones are avoided, a failing one (low weight) gets few first attempts, and
 * least_request spares the loaded; the tried set holds every endpoint a request went to, past
 * its inline one. The random number generator is seeded: every run picks the same. */
#include <criterion/criterion.h>

#include <stdlib.h>

#include "policy/score.h"
#include "proxy/core/choose.h"

#define N 5000

static struct rng rng;

/* N endpoints, each a candidate's identity for the tried set, its weight and its state. */
static struct many {
    char id[N];
    uint32_t weight[N];
    uint64_t cum[N];
    bool ejected[N];
    bool gone[N]; /* tried too, without a tried set of thousands to search */
    int64_t load[N];
    struct choose_tried tried;
    size_t looked; /* state() calls: candidates looked at */
} * m;

static void setup(void)
{
    rng_seed(&rng, 42);
    m = calloc(1, sizeof(*m));
    cr_assert_not_null(m);
}

static void teardown(void)
{
    choose_tried_free(&m->tried);
    free(m);
}

TestSuite(choose_many, .init = setup, .fini = teardown);

static unsigned state(void *ctx, size_t i)
{
    struct many *x = ctx;
    x->looked++;
    return (x->gone[i] || choose_tried_has(&x->tried, &x->id[i]) ? CHOOSE_TRIED : 0) |
           (x->ejected[i] ? CHOOSE_EJECTED : 0);
}

static int64_t load(void *ctx, size_t i)
{
    return ((struct many *)ctx)->load[i];
}

/* The set over 'n' of them, weighed (the weights and their sums as they are) or not. */
static struct choose_set set_of(size_t n, bool weighed)
{
    uint64_t sum = 0;
    for (size_t i = 0; weighed && i < n; i++)
        m->cum[i] = sum += m->weight[i];
    return (struct choose_set){ .n = n,
                                .weight = weighed ? m->weight : NULL,
                                .cum = weighed ? m->cum : NULL,
                                .state = state,
                                .load = load,
                                .ctx = m };
}

/* One request's next attempt, added to its tried set. */
static size_t attempt(enum cfg_balance b, const struct choose_set *s, uint32_t *rr)
{
    size_t i = choose_many(b, s, m->tried.one != NULL, rr, &rng);
    cr_assert_lt(i, s->n);
    choose_tried_add(&m->tried, &m->id[i]);
    return i;
}

/* Three first attempts an endpoint, one after another, under each policy that takes turns: each
 * of the 5,000 gets exactly three with even weights, and with weights (all alike here, as
 * healthy endpoints are, but given) each one at least one and at most six. */
Test(choose_many, first_attempts_spread_over_five_thousand_endpoints)
{
    static unsigned got[N];
    const enum cfg_balance policies[] = { CFG_BALANCE_ROUND_ROBIN, CFG_BALANCE_LEAST_REQUEST };
    for (size_t i = 0; i < N; i++)
        m->weight[i] = SCORE_WEIGHT_MAX;
    for (size_t p = 0; p < 2; p++)
        for (int weighed = 0; weighed < 2; weighed++) {
            struct choose_set s = set_of(N, weighed);
            memset(got, 0, sizeof(got));
            uint32_t rr = 0;
            for (size_t q = 0; q < 3 * N; q++) {
                got[attempt(policies[p], &s, &rr)]++;
                choose_tried_free(&m->tried);
            }
            for (size_t i = 0; i < N; i++)
                if (weighed)
                    cr_assert(got[i] >= 1 && got[i] <= 6, "policy %zu: endpoint %zu got %u", p, i,
                              got[i]);
                else
                    cr_assert_eq(got[i], 3, "policy %zu: endpoint %zu got %u", p, i, got[i]);
        }
}

/* Uneven weights (between 256 and 1,024, at random): over 20 first attempts an endpoint, each
 * endpoint's count is within a few of its share, and none is left out. */
Test(choose_many, first_attempts_follow_uneven_weights)
{
    static unsigned got[N];
    uint64_t sum = 0;
    for (size_t i = 0; i < N; i++)
        sum += m->weight[i] = (uint32_t)rng_between(&rng, 256, SCORE_WEIGHT_MAX);
    struct choose_set s = set_of(N, true);
    uint32_t rr = 0;
    for (size_t q = 0; q < 20 * N; q++) {
        got[attempt(CFG_BALANCE_ROUND_ROBIN, &s, &rr)]++;
        choose_tried_free(&m->tried);
    }
    for (size_t i = 0; i < N; i++) {
        double share = 20.0 * N * m->weight[i] / (double)sum;
        cr_assert(got[i] >= share - 3 && got[i] <= share + 3,
                  "endpoint %zu: %u for a share of %.1f", i, got[i], share);
    }
}

/* A retry never goes back to an endpoint this request tried while an untried one (not ejected)
 * is left: with 100 tried, with all but 10 tried (the draws mostly meet tried ones: the pass
 * over all of them finds the 10), and with every untried one ejected (a tried one in rotation
 * comes before an ejected one, as choose_balanced() prefers). */
Test(choose_many, a_retry_never_goes_to_a_tried_one_while_an_untried_one_is_left)
{
    struct choose_set s = set_of(N, false);
    for (size_t i = 0; i < 100; i++)
        choose_tried_add(&m->tried, &m->id[i * 37]);
    for (int q = 0; q < 2000; q++) {
        size_t i = choose_many(CFG_BALANCE_ROUND_ROBIN, &s, true, NULL, &rng);
        cr_assert(!choose_tried_has(&m->tried, &m->id[i]), "retry %d went back to %zu", q, i);
    }
    choose_tried_free(&m->tried);
    for (size_t i = 0; i < N; i++)
        m->gone[i] = i % 500 != 7;
    for (int q = 0; q < 200; q++) {
        size_t i = choose_many(CFG_BALANCE_LEAST_REQUEST, &s, true, NULL, &rng);
        cr_assert_eq(i % 500, 7, "retry %d went to tried %zu", q, i);
    }
    for (size_t i = 7; i < N; i += 500)
        m->ejected[i] = true;
    for (int q = 0; q < 200; q++) {
        size_t i = choose_many(CFG_BALANCE_RANDOM, &s, true, NULL, &rng);
        cr_assert(!m->ejected[i], "retry %d went to ejected %zu before a tried one", q, i);
    }
}

/* Ejected endpoints get no first attempt while others are left (half of them ejected, and all
 * but one); with every one ejected (panic mode) all are used again. */
Test(choose_many, ejected_endpoints_are_avoided_among_many)
{
    struct choose_set s = set_of(N, false);
    for (size_t i = 0; i < N; i += 2)
        m->ejected[i] = true;
    uint32_t rr = 0;
    for (int q = 0; q < 3 * N; q++) {
        size_t i = attempt(CFG_BALANCE_ROUND_ROBIN, &s, &rr);
        cr_assert(!m->ejected[i], "first attempt %d on ejected %zu", q, i);
        choose_tried_free(&m->tried);
    }
    for (size_t i = 0; i < N; i++)
        m->ejected[i] = i != 4321;
    for (int q = 0; q < 100; q++) {
        cr_assert_eq(attempt(CFG_BALANCE_LEAST_REQUEST, &s, &rr), 4321);
        choose_tried_free(&m->tried);
    }
    /* panic mode picks at random by weight in a pass over all (O(n) a pick): 1,000 of them,
     * 15 picks each */
    m->ejected[4321] = true;
    struct choose_set all = set_of(1000, false);
    static unsigned got[1000];
    for (int q = 0; q < 15 * 1000; q++) {
        got[attempt(CFG_BALANCE_ROUND_ROBIN, &all, &rr)]++;
        choose_tried_free(&m->tried);
    }
    size_t used = 0;
    for (size_t i = 0; i < 1000; i++)
        used += got[i] > 0;
    cr_expect_eq(used, 1000, "panic mode: every endpoint used again");
}

/* 50 failing endpoints among 5,000, at the floor weight an endpoint that always fails has
 * (policy/score.h): their share of first attempts falls from 1 % (even) to about 0.03 %. */
Test(choose_many, failing_endpoints_get_a_small_share_among_many)
{
    for (size_t i = 0; i < N; i++)
        m->weight[i] = i % 100 == 0 ? SCORE_WEIGHT_FLOOR : SCORE_WEIGHT_MAX;
    const enum cfg_balance policies[] = { CFG_BALANCE_ROUND_ROBIN, CFG_BALANCE_LEAST_REQUEST,
                                          CFG_BALANCE_RANDOM };
    for (size_t p = 0; p < 3; p++) {
        struct choose_set s = set_of(N, true);
        uint32_t rr = 0;
        size_t failing = 0, requests = 20 * N;
        for (size_t q = 0; q < requests; q++) {
            failing += attempt(policies[p], &s, &rr) % 100 == 0;
            choose_tried_free(&m->tried);
        }
        cr_expect_lt(failing, requests / 1000, "policy %zu: %zu of %zu first attempts failing", p,
                     failing, requests);
    }
}

/* least_request over many: half the endpoints have 10 requests in flight; of the two choices
 * the idle one wins, so the loaded half gets about a quarter of first attempts. */
Test(choose_many, least_request_spares_the_loaded_among_many)
{
    for (size_t i = 0; i < N; i += 2)
        m->load[i] = 10;
    struct choose_set s = set_of(N, false);
    uint32_t rr = 0;
    size_t loaded = 0, requests = 4 * N;
    for (size_t q = 0; q < requests; q++) {
        loaded += attempt(CFG_BALANCE_LEAST_REQUEST, &s, &rr) % 2 == 0;
        choose_tried_free(&m->tried);
    }
    cr_expect_lt(loaded, requests * 35 / 100, "%zu of %zu on the loaded half", loaded, requests);
    cr_expect_gt(loaded, requests * 15 / 100, "%zu of %zu on the loaded half", loaded, requests);
}

/* A request of 100 attempts (retry.max_attempts' most) over 5,000 endpoints goes to 100
 * distinct ones: the tried set keeps them all past its inline first; its retries leave the turn
 * of first attempts where it was. The choice looks at a few candidates per attempt, not all. */
Test(choose_many, a_hundred_attempts_go_to_a_hundred_endpoints)
{
    struct choose_set s = set_of(N, false);
    uint32_t rr = 17;
    size_t first = attempt(CFG_BALANCE_LEAST_REQUEST, &s, &rr);
    cr_expect_eq(first, 17);
    cr_expect_eq(rr, 18);
    for (int a = 1; a < 100; a++)
        attempt(CFG_BALANCE_LEAST_REQUEST, &s, &rr);
    cr_expect_eq(rr, 18, "retries moved the turn");
    size_t kept = 0;
    for (size_t i = 0; i < N; i++)
        kept += choose_tried_has(&m->tried, &m->id[i]);
    cr_expect_eq(kept, 100, "100 attempts, 100 distinct endpoints");
    cr_expect_lt(m->looked, 100 * 8, "%zu candidates looked at for 100 attempts", m->looked);
    choose_tried_add(&m->tried, &m->id[first]);
    kept = 0;
    for (size_t i = 0; i < N; i++)
        kept += choose_tried_has(&m->tried, &m->id[i]);
    cr_expect_eq(kept, 100, "added twice, kept once");
}

/* The tried set: empty when zeroed, the first inline, the others after it, and empty again once
 * freed. */
Test(choose_many, the_tried_set_keeps_what_it_is_given)
{
    struct choose_tried t = { 0 };
    cr_expect(!choose_tried_has(&t, &m->id[0]));
    choose_tried_add(&t, &m->id[0]);
    cr_expect(choose_tried_has(&t, &m->id[0]));
    cr_expect_null(t.more, "the first is inline");
    for (size_t i = 1; i < 300; i++)
        choose_tried_add(&t, &m->id[i]);
    for (size_t i = 0; i < 300; i++)
        cr_expect(choose_tried_has(&t, &m->id[i]), "%zu", i);
    cr_expect(!choose_tried_has(&t, &m->id[300]));
    choose_tried_free(&t);
    cr_expect(!choose_tried_has(&t, &m->id[0]));
}
