/* backoff -- retry delay policies and jitter (docs/backoff.md). Pure: no clock, no I/O, no globals.
 *
 * All delays are whole milliseconds. Where a formula draws uniformly from an interval, the
 * delay is a uniformly chosen whole number of milliseconds inside that interval: U[a, b] holds
 * the integers i with a <= i <= b, U[a, b) those with a <= i < b. An empty interval (b <= a)
 * yields a. Real-valued intermediate delays (a non-integer exponential factor, a jitter ratio)
 * are rounded to the nearest millisecond before jitter.
 */
#ifndef RETRYPROXY_POLICY_BACKOFF_H
#define RETRYPROXY_POLICY_BACKOFF_H

#include <stdint.h>

#include "policy/rng.h"

enum backoff_policy {
    BACKOFF_FIXED,        /* d = base */
    BACKOFF_RANDOM,       /* d = U[base, cap) */
    BACKOFF_FIBONACCI,    /* d = base * F(k), F(1) = F(2) = 1 */
    BACKOFF_EXPONENTIAL,  /* d = base * factor^(k-1) */
    BACKOFF_DECORRELATED, /* d1 = base, dn = U[base, 3 * d(n-1)) */
};

enum backoff_jitter {
    JITTER_NONE,         /* d */
    JITTER_FULL,         /* U[0, d] */
    JITTER_EQUAL,        /* d/2 + U[0, d/2] */
    JITTER_PROPORTIONAL, /* d * (1 + U[-ratio, +ratio]) */
    JITTER_ADDITIVE,     /* d + U[0, ratio * d) */
    JITTER_BOUNDED,      /* U[base, d) */
    JITTER_CONSTANT,     /* d + U[0, jitter_ms) */
};

enum backoff_scope {
    BACKOFF_SCOPE_REQUEST, /* every request walks its own sequence */
    BACKOFF_SCOPE_ROUTE,   /* one sequence per route, reset after reset_after_ms without a retry */
};

/* A validated policy (config/ guarantees base <= cap, factor in [1, 100], ratio in [0, 1]). */
struct backoff_spec {
    enum backoff_policy policy;
    enum backoff_jitter jitter;
    enum backoff_scope scope;
    uint32_t base_ms;
    uint32_t cap_ms;
    double factor;
    uint32_t steps; /* 0: the delay keeps growing; otherwise it stops after 'steps' retries */
    double jitter_ratio;
    uint32_t jitter_ms;
    uint32_t reset_after_ms; /* scope route only; 0: never reset */
};

#define BACKOFF_POLICY_COUNT 5
#define BACKOFF_JITTER_COUNT 7
#define BACKOFF_SCOPE_COUNT  2

/* Names as they appear in the config, indexed by the enums above. */
extern const char *const backoff_policy_names[BACKOFF_POLICY_COUNT];
extern const char *const backoff_jitter_names[BACKOFF_JITTER_COUNT];
extern const char *const backoff_scope_names[BACKOFF_SCOPE_COUNT];

/* The delay before retry number 'n' (1 for the first retry; 0 is treated as 1). 'prev_ms' is the
 * delay used before retry n-1, as returned by this function; only the decorrelated policy reads
 * it, and ignores it for n == 1. Draws from 'r' only where the policy or jitter is random.
 * The result never exceeds cap_ms. */
uint32_t backoff_delay(const struct backoff_spec *b, uint32_t n, uint32_t prev_ms, struct rng *r);

/* A sequence of delays: one request's retries (scope request), or a whole route's (scope route,
 * where the caller serializes access). Zero-initialise or call backoff_seq_reset(). */
struct backoff_seq {
    uint32_t n;          /* retries taken so far in this sequence */
    uint32_t prev_ms;    /* the last delay returned */
    uint64_t last_at_ms; /* when the last delay was taken (scope route) */
};

void backoff_seq_reset(struct backoff_seq *s);

/* Advances the sequence and returns the delay before its next retry. 'now_ms' is any monotonic
 * clock in milliseconds. With scope route and reset_after_ms > 0, a sequence whose last retry is
 * at least reset_after_ms old starts again from retry 1. */
uint32_t backoff_seq_next(struct backoff_seq *s, const struct backoff_spec *b, uint64_t now_ms,
                          struct rng *r);

/* The delays of 'n' consecutive retries of one sequence (as `schedule` prints them): out[i] is
 * the delay before retry i+1. Route-scoped sequences never reset here, as no time passes. */
void backoff_schedule(const struct backoff_spec *b, uint32_t n, struct rng *r, uint32_t *out);

#endif
