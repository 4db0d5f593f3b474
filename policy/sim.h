/* sim -- what a retry policy does to an upstream in trouble: a discrete-event simulation of
 * clients calling a failing upstream through the route's retry rules (`retryproxy simulate`,
 * docs/cli.md). Pure: the RNG comes in as an argument, time is simulated, no I/O, no globals.
 *
 * The model, in simulated whole milliseconds, all clients starting at 0:
 *  - each client sends its requests one after the other, the next as soon as one ends;
 *  - a request's attempts follow the route's rules as the proxy applies them (proxy/core/decide.c):
 *    max_attempts, the deadline timeout_ms after the first attempt, Retry-After, the backoff
 *    sequence, then the process-wide budget and the route's (concurrency, then ratio);
 *  - the upstream answers each call after latency_ms; a call fails (a 503) when it starts inside
 *    the outage window, with probability failure_rate, or when the capacity window it starts
 *    in has already let 'capacity' calls succeed.
 * Events at the same millisecond are handled in the order they were scheduled, so a run is a
 * function of its inputs and the RNG's seed.
 */
#ifndef RETRYPROXY_POLICY_SIM_H
#define RETRYPROXY_POLICY_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policy/backoff.h"
#include "policy/budget.h"
#include "policy/rng.h"

/* The client side: the route's retry rules. */
struct sim_policy {
    struct backoff_spec backoff;
    uint32_t max_attempts; /* >= 1 */
    uint32_t timeout_ms;   /* the request's deadline, from its first attempt */
    bool retryable;        /* the upstream's failures are retried (retry_on names 503, method) */
    bool retry_after_honor;
    uint32_t retry_after_max_ms;
    struct budget_limits global; /* the process-wide budget */
    struct budget_limits route;  /* the route's budget */
};

/* The upstream: how it fails. The three failure causes combine. */
struct sim_upstream {
    uint64_t outage_start_ms; /* calls starting in [start, end) fail; start == end: no outage */
    uint64_t outage_end_ms;
    double failure_rate;         /* each call fails with this probability, 0 to 1 */
    uint32_t capacity;           /* at most this many calls succeed per window; 0: no limit */
    uint32_t capacity_window_ms; /* fixed windows [k*w, (k+1)*w); > 0 when capacity is set */
    uint32_t latency_ms;         /* every call takes this long */
    bool retry_after;            /* failures carry Retry-After: retry_after_ms */
    uint32_t retry_after_ms;
};

/* The load. */
struct sim_load {
    uint32_t clients;  /* >= 1, all starting at time 0 */
    uint32_t requests; /* per client, >= 1 */
    bool record_calls; /* keep every call's start time in sim_result.call_ms */
};

/* Why a failed request was not retried further. */
enum sim_stop {
    SIM_STOP_NONE,          /* (not stopped: the retry is taken) */
    SIM_STOP_NOT_RETRYABLE, /* the route does not retry the upstream's 503 */
    SIM_STOP_MAX_ATTEMPTS,
    SIM_STOP_RETRY_AFTER, /* Retry-After above retry_after_max_ms */
    SIM_STOP_DEADLINE,    /* the wait, or the attempt, would end at or after timeout_ms */
    SIM_STOP_CONCURRENCY, /* no concurrency slot in the process-wide budget or the route's */
    SIM_STOP_BUDGET,      /* the ratio of either budget refused the retry */
};
#define SIM_STOP_COUNT 7

struct sim_result {
    uint64_t requests;  /* requests sent (clients * requests) */
    uint64_t succeeded; /* requests whose last attempt succeeded */
    uint64_t calls;     /* upstream calls: first attempts and retries */
    uint64_t retries;
    uint64_t stopped[SIM_STOP_COUNT]; /* failed requests by why retrying stopped (NONE: 0) */
    /* completion time (first attempt to final answer) percentiles, nearest rank */
    uint64_t p50_ms, p90_ms, p99_ms, max_ms;
    uint64_t end_ms; /* when the last request ended */
    /* start time of every call, in order (non-decreasing), when load->record_calls */
    uint64_t *call_ms;
    size_t n_calls;
};

/* Runs the simulation; 'r' gives the backoff's randomness, and its first draw seeds the
 * upstream's failures (so the same seed gives every policy the same failure stream to start
 * with). Returns 0 with 'out' filled in (free it with sim_result_free()), or -ENOMEM with
 * nothing to free. The inputs must be valid: clients, requests, max_attempts >= 1, a
 * capacity window > 0 when capacity is set, budget windows > 0. */
int sim_run(const struct sim_policy *p, const struct sim_upstream *u, const struct sim_load *l,
            struct rng *r, struct sim_result *out);

/* Frees what sim_run() allocated; accepts NULL and a zeroed result. */
void sim_result_free(struct sim_result *res);

/* The nearest-rank percentile 'pct' (0 < pct <= 100) of 'n' sorted values; 0 when n == 0. */
uint64_t sim_percentile(const uint64_t *sorted, size_t n, unsigned pct);

#endif
