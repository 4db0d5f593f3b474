/* The simulation engine (policy/sim.c): exact small cases, and the known result of "Exponential
 * Backoff And Jitter" (AWS Architecture Blog, 2015). Nothing is faked: the engine is pure. */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <string.h>

#include "policy/sim.h"

/* Budgets that never refuse anything. */
static const struct budget_limits unlimited = { -1, 0, 1e9, 10000 };

static struct sim_policy policy(enum backoff_policy pol, enum backoff_jitter j, uint32_t base_ms,
                                uint32_t max_attempts)
{
    return (struct sim_policy){
        .backoff = { .policy = pol,
                     .jitter = j,
                     .base_ms = base_ms,
                     .cap_ms = 10000,
                     .factor = 2.0 },
        .max_attempts = max_attempts,
        .timeout_ms = 600000,
        .retryable = true,
        .global = unlimited,
        .route = unlimited,
    };
}

static struct sim_result run(const struct sim_policy *p, const struct sim_upstream *u,
                             uint32_t clients, uint32_t requests, uint64_t seed)
{
    struct sim_load l = { clients, requests, true };
    struct rng r;
    rng_seed(&r, seed);
    struct sim_result res;
    cr_assert_eq(sim_run(p, u, &l, &r, &res), 0);
    return res;
}

/* ---- exact small cases ---- */

Test(sim, one_client_in_an_outage_calls_after_exactly_the_policy_delays)
{
    struct sim_policy p = policy(BACKOFF_EXPONENTIAL, JITTER_NONE, 10, 5);
    struct sim_upstream u = { .outage_start_ms = 0, .outage_end_ms = 100000 };
    struct sim_result res = run(&p, &u, 1, 1, 1);
    uint64_t want[] = { 0, 10, 30, 70, 150 }; /* delays 10 20 40 80 */
    cr_assert_eq(res.n_calls, 5);
    for (size_t i = 0; i < 5; i++)
        cr_expect_eq(res.call_ms[i], want[i], "call %zu at %lu", i, (unsigned long)res.call_ms[i]);
    cr_expect_eq(res.succeeded, 0);
    cr_expect_eq(res.stopped[SIM_STOP_MAX_ATTEMPTS], 1);
    cr_expect_eq(res.max_ms, 150);
    sim_result_free(&res);
}

Test(sim, jittered_call_times_follow_the_seeded_schedule)
{
    /* The engine's first draw seeds the upstream's failures; the backoff gets the rest. */
    struct sim_policy p = policy(BACKOFF_EXPONENTIAL, JITTER_FULL, 100, 8);
    struct sim_upstream u = { .outage_start_ms = 0, .outage_end_ms = 1000000, .latency_ms = 3 };
    struct sim_result res = run(&p, &u, 1, 1, 42);
    struct rng r;
    rng_seed(&r, 42);
    (void)rng_next(&r);
    uint32_t delays[7];
    backoff_schedule(&p.backoff, 7, &r, delays);
    cr_assert_eq(res.n_calls, 8);
    uint64_t t = 0;
    for (size_t i = 0; i < 8; i++) {
        cr_expect_eq(res.call_ms[i], t, "call %zu", i);
        if (i < 7)
            t += 3 + delays[i]; /* the call's latency, then the wait */
    }
    sim_result_free(&res);
}

Test(sim, failure_rate_zero_is_one_call_per_request)
{
    struct sim_policy p = policy(BACKOFF_EXPONENTIAL, JITTER_FULL, 100, 5);
    struct sim_upstream u = { .failure_rate = 0, .latency_ms = 7 };
    struct sim_result res = run(&p, &u, 10, 4, 3);
    cr_expect_eq(res.requests, 40);
    cr_expect_eq(res.calls, 40);
    cr_expect_eq(res.succeeded, 40);
    cr_expect_eq(res.retries, 0);
    cr_expect_eq(res.p50_ms, 7);
    cr_expect_eq(res.max_ms, 7);
    cr_expect_eq(res.end_ms, 28); /* four requests of 7 ms one after the other */
    sim_result_free(&res);
}

Test(sim, failure_rate_one_is_max_attempts_calls_per_request)
{
    struct sim_policy p = policy(BACKOFF_EXPONENTIAL, JITTER_FULL, 100, 4);
    struct sim_upstream u = { .failure_rate = 1 };
    struct sim_result res = run(&p, &u, 10, 3, 3);
    cr_expect_eq(res.calls, 30 * 4);
    cr_expect_eq(res.retries, 30 * 3);
    cr_expect_eq(res.succeeded, 0);
    cr_expect_eq(res.stopped[SIM_STOP_MAX_ATTEMPTS], 30);
    sim_result_free(&res);
}

Test(sim, ratio_budget_denial_is_counted)
{
    /* Ten first attempts at 0 ms, then their failures: half a retry per first attempt allows
     * five retries, the other five are refused. */
    struct sim_policy p = policy(BACKOFF_FIXED, JITTER_NONE, 10, 2);
    p.route = (struct budget_limits){ -1, 0.5, 0, 10000 };
    struct sim_upstream u = { .outage_start_ms = 0, .outage_end_ms = 1000 };
    struct sim_result res = run(&p, &u, 10, 1, 1);
    cr_expect_eq(res.retries, 5);
    cr_expect_eq(res.stopped[SIM_STOP_BUDGET], 5);
    cr_expect_eq(res.stopped[SIM_STOP_MAX_ATTEMPTS], 5);
    cr_expect_eq(res.calls, 15);
    sim_result_free(&res);
}

Test(sim, concurrency_denial_is_counted_and_slots_come_back)
{
    /* Three slots process-wide: three of ten requests retry at once; the slots come back when
     * those retries' attempts end, and the next failures retry in their turn. */
    struct sim_policy p = policy(BACKOFF_FIXED, JITTER_NONE, 10, 3);
    p.global = (struct budget_limits){ 3, 0, 1e9, 10000 };
    struct sim_upstream u = { .outage_start_ms = 0, .outage_end_ms = 1000 };
    struct sim_result res = run(&p, &u, 10, 1, 1);
    /* at 0: 3 retried, 7 denied; at 10: the 3 retries fail, release, retry again (attempt 3);
     * at 20: they fail at max_attempts */
    cr_expect_eq(res.stopped[SIM_STOP_CONCURRENCY], 7);
    cr_expect_eq(res.stopped[SIM_STOP_MAX_ATTEMPTS], 3);
    cr_expect_eq(res.calls, 10 + 3 + 3);
    sim_result_free(&res);
}

Test(sim, deadline_stops_a_wait_that_would_end_after_it)
{
    struct sim_policy p = policy(BACKOFF_FIXED, JITTER_NONE, 100, 10);
    p.timeout_ms = 250;
    struct sim_upstream u = { .failure_rate = 1 };
    struct sim_result res = run(&p, &u, 1, 1, 1);
    cr_expect_eq(res.calls, 3); /* at 0, 100, 200; a wait to 300 passes the deadline */
    cr_expect_eq(res.stopped[SIM_STOP_DEADLINE], 1);
    sim_result_free(&res);
}

Test(sim, retry_after_replaces_the_delay_and_ends_retrying_above_its_limit)
{
    struct sim_policy p = policy(BACKOFF_FIXED, JITTER_NONE, 100, 3);
    p.retry_after_honor = true;
    p.retry_after_max_ms = 1000;
    struct sim_upstream u = { .failure_rate = 1, .retry_after = true, .retry_after_ms = 500 };
    struct sim_result res = run(&p, &u, 1, 1, 1);
    cr_expect_eq(res.n_calls, 3);
    cr_expect_eq(res.call_ms[1], 500);
    cr_expect_eq(res.call_ms[2], 1000);
    sim_result_free(&res);

    u.retry_after_ms = 1001;
    res = run(&p, &u, 1, 1, 1);
    cr_expect_eq(res.calls, 1);
    cr_expect_eq(res.stopped[SIM_STOP_RETRY_AFTER], 1);
    sim_result_free(&res);
}

Test(sim, capacity_lets_n_calls_succeed_per_window)
{
    /* 10 clients at once against 3 calls per 100 ms, retrying every 100 ms: 3 succeed in each
     * window, the rest retry into the next. */
    struct sim_policy p = policy(BACKOFF_FIXED, JITTER_NONE, 100, 10);
    struct sim_upstream u = { .capacity = 3, .capacity_window_ms = 100 };
    struct sim_result res = run(&p, &u, 10, 1, 1);
    cr_expect_eq(res.succeeded, 10);
    cr_expect_eq(res.calls, 10 + 7 + 4 + 1);
    cr_expect_eq(res.max_ms, 300);
    cr_expect_eq(res.p50_ms, 100);
    sim_result_free(&res);
}

Test(sim, not_retryable_failures_are_final)
{
    struct sim_policy p = policy(BACKOFF_FIXED, JITTER_NONE, 100, 5);
    p.retryable = false;
    struct sim_upstream u = { .failure_rate = 1 };
    struct sim_result res = run(&p, &u, 4, 1, 1);
    cr_expect_eq(res.calls, 4);
    cr_expect_eq(res.stopped[SIM_STOP_NOT_RETRYABLE], 4);
    sim_result_free(&res);
}

Test(sim, route_scope_shares_one_sequence_between_requests)
{
    /* Two clients fail at 0 ms: the first retry taken waits 10 ms, the second (the other
     * client's) 20 ms, the third 40 ms. */
    struct sim_policy p = policy(BACKOFF_EXPONENTIAL, JITTER_NONE, 10, 2);
    p.backoff.scope = BACKOFF_SCOPE_ROUTE;
    struct sim_upstream u = { .outage_start_ms = 0, .outage_end_ms = 1000 };
    struct sim_result res = run(&p, &u, 2, 1, 1);
    cr_assert_eq(res.n_calls, 4);
    cr_expect_eq(res.call_ms[2], 10);
    cr_expect_eq(res.call_ms[3], 20);
    sim_result_free(&res);
}

Test(sim, same_seed_same_run)
{
    struct sim_policy p = policy(BACKOFF_EXPONENTIAL, JITTER_FULL, 10, 6);
    struct sim_upstream u = { .failure_rate = 0.4, .capacity = 4, .capacity_window_ms = 10 };
    struct sim_result a = run(&p, &u, 50, 3, 9), b = run(&p, &u, 50, 3, 9);
    cr_assert_eq(a.n_calls, b.n_calls);
    cr_expect_eq(memcmp(a.call_ms, b.call_ms, a.n_calls * sizeof(*a.call_ms)), 0);
    cr_expect_eq(a.succeeded, b.succeeded);
    cr_expect_eq(a.p99_ms, b.p99_ms);
    sim_result_free(&a);
    sim_result_free(&b);
}

Test(sim, percentile_is_nearest_rank)
{
    uint64_t v[10] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 };
    cr_expect_eq(sim_percentile(v, 10, 50), 5);
    cr_expect_eq(sim_percentile(v, 10, 90), 9);
    cr_expect_eq(sim_percentile(v, 10, 99), 10);
    cr_expect_eq(sim_percentile(v, 10, 100), 10);
    cr_expect_eq(sim_percentile(v, 1, 50), 1);
    cr_expect_eq(sim_percentile(v, 0, 50), 0);
}

/* ---- "Exponential Backoff And Jitter" ---- */

/* 100 clients start at once against an upstream that lets 5 calls per 10 ms succeed, each
 * retrying with exponential backoff from 100 ms (capped at 10 s, 20 attempts): without jitter
 * the clients retry in lockstep and most of every retry wave is shed, so it costs several times
 * the calls; full jitter costs the fewest, equal jitter a little more (its delay never goes
 * below half), decorrelated in between or above. The ordering holds for every seed tried
 * (1 to 50 when this was written); the test checks five. */
static uint64_t aws_calls(enum backoff_policy pol, enum backoff_jitter j, uint64_t seed)
{
    struct sim_policy p = policy(pol, j, 100, 20);
    struct sim_upstream u = { .capacity = 5, .capacity_window_ms = 10 };
    struct sim_result res = run(&p, &u, 100, 1, seed);
    cr_expect_eq(res.succeeded, 100, "seed %lu: every request ends up succeeding",
                 (unsigned long)seed);
    uint64_t calls = res.calls;
    sim_result_free(&res);
    return calls;
}

Test(sim, jitter_cuts_the_calls_of_contending_clients_as_the_aws_study_found)
{
    static const uint64_t seeds[] = { 1, 2, 3, 7, 1234567 };
    for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
        uint64_t s = seeds[i];
        uint64_t none = aws_calls(BACKOFF_EXPONENTIAL, JITTER_NONE, s);
        uint64_t full = aws_calls(BACKOFF_EXPONENTIAL, JITTER_FULL, s);
        uint64_t equal = aws_calls(BACKOFF_EXPONENTIAL, JITTER_EQUAL, s);
        uint64_t decorrelated = aws_calls(BACKOFF_DECORRELATED, JITTER_NONE, s);
        cr_log_info("seed %lu: calls none %lu, full %lu, equal %lu, decorrelated %lu",
                    (unsigned long)s, (unsigned long)none, (unsigned long)full,
                    (unsigned long)equal, (unsigned long)decorrelated);
        cr_expect_gt(none * 2, full * 3, "seed %lu: none %lu vs full %lu", (unsigned long)s,
                     (unsigned long)none, (unsigned long)full);
        cr_expect_gt(none * 2, equal * 3, "seed %lu: none %lu vs equal %lu", (unsigned long)s,
                     (unsigned long)none, (unsigned long)equal);
        cr_expect_gt(none * 2, decorrelated * 3, "seed %lu: none %lu vs decorrelated %lu",
                     (unsigned long)s, (unsigned long)none, (unsigned long)decorrelated);
        cr_expect_leq(full, decorrelated, "seed %lu: full %lu vs decorrelated %lu",
                      (unsigned long)s, (unsigned long)full, (unsigned long)decorrelated);
        cr_expect_lt(full, equal, "seed %lu: full %lu vs equal %lu", (unsigned long)s,
                     (unsigned long)full, (unsigned long)equal);
    }
}
