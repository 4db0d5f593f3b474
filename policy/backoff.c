#include "policy/backoff.h"

#include <math.h>
#include <string.h>

const char *const backoff_policy_names[BACKOFF_POLICY_COUNT] = {
    [BACKOFF_FIXED] = "fixed",
    [BACKOFF_RANDOM] = "random",
    [BACKOFF_FIBONACCI] = "fibonacci",
    [BACKOFF_EXPONENTIAL] = "exponential",
    [BACKOFF_DECORRELATED] = "decorrelated",
};

const char *const backoff_jitter_names[BACKOFF_JITTER_COUNT] = {
    [JITTER_NONE] = "none",         [JITTER_FULL] = "full",
    [JITTER_EQUAL] = "equal",       [JITTER_PROPORTIONAL] = "proportional",
    [JITTER_ADDITIVE] = "additive", [JITTER_BOUNDED] = "bounded",
    [JITTER_CONSTANT] = "constant",
};

const char *const backoff_scope_names[BACKOFF_SCOPE_COUNT] = {
    [BACKOFF_SCOPE_REQUEST] = "request",
    [BACKOFF_SCOPE_ROUTE] = "route",
};

/* U[lo, hi): the whole numbers i with lo <= i < hi; lo when the interval is empty. */
static uint64_t uniform_half_open(struct rng *r, uint64_t lo, uint64_t hi)
{
    return hi > lo ? rng_between(r, lo, hi - 1) : lo;
}

/* base * F(k), saturating at 'limit' (F(k) passes any 32-bit cap before k reaches 50, so the
 * loop is short even for a route sequence that has taken millions of retries). */
static uint64_t fibonacci(uint64_t base, uint32_t k, uint64_t limit)
{
    uint64_t a = base, b = base; /* base*F(i), base*F(i+1) */
    for (uint32_t i = 1; i < k; i++) {
        uint64_t next = a + b;
        a = b;
        b = next;
        if (a >= limit)
            return limit;
    }
    return a < limit ? a : limit;
}

/* The delay before jitter, already limited to cap_ms. */
static uint64_t raw_delay(const struct backoff_spec *b, uint32_t n, uint32_t prev_ms, struct rng *r)
{
    uint64_t base = b->base_ms, cap = b->cap_ms;
    uint32_t k = n;
    if (b->steps > 0 && k > b->steps + 1)
        k = b->steps + 1;

    switch (b->policy) {
    case BACKOFF_FIXED:
        return base < cap ? base : cap;
    case BACKOFF_RANDOM:
        return uniform_half_open(r, base, cap);
    case BACKOFF_FIBONACCI:
        return fibonacci(base, k, cap);
    case BACKOFF_EXPONENTIAL: {
        /* factor <= 100 and k <= 2^32 can overflow a double to +inf; the cap catches it. */
        double d = (double)base * pow(b->factor, (double)k - 1.0);
        if (!(d < (double)cap))
            return cap;
        return (uint64_t)llround(d);
    }
    case BACKOFF_DECORRELATED: {
        uint64_t d = n <= 1 ? base : uniform_half_open(r, base, 3 * (uint64_t)prev_ms);
        return d < cap ? d : cap;
    }
    }
    return cap;
}

static uint64_t jittered(const struct backoff_spec *b, uint64_t d, struct rng *r)
{
    switch (b->jitter) {
    case JITTER_NONE:
        return d;
    case JITTER_FULL:
        return rng_between(r, 0, d);
    case JITTER_EQUAL:
        /* d - d/2 rather than d/2 keeps the top of the range at d for odd d. */
        return (d - d / 2) + rng_between(r, 0, d / 2);
    case JITTER_PROPORTIONAL: {
        double spread = b->jitter_ratio * (double)d;
        double lo = ceil((double)d - spread), hi = floor((double)d + spread);
        if (lo < 0)
            lo = 0;
        return rng_between(r, (uint64_t)lo, (uint64_t)hi);
    }
    case JITTER_ADDITIVE: {
        /* U[0, x) holds the integers below x: 0 .. ceil(x) - 1. */
        uint64_t top = (uint64_t)ceil(b->jitter_ratio * (double)d);
        return d + uniform_half_open(r, 0, top);
    }
    case JITTER_BOUNDED:
        return uniform_half_open(r, b->base_ms, d);
    case JITTER_CONSTANT:
        return d + uniform_half_open(r, 0, b->jitter_ms);
    }
    return d;
}

uint32_t backoff_delay(const struct backoff_spec *b, uint32_t n, uint32_t prev_ms, struct rng *r)
{
    if (n == 0)
        n = 1;
    uint64_t d = jittered(b, raw_delay(b, n, prev_ms, r), r);
    return (uint32_t)(d < b->cap_ms ? d : b->cap_ms);
}

void backoff_seq_reset(struct backoff_seq *s)
{
    memset(s, 0, sizeof(*s));
}

uint32_t backoff_seq_next(struct backoff_seq *s, const struct backoff_spec *b, uint64_t now_ms,
                          struct rng *r)
{
    if (b->scope == BACKOFF_SCOPE_ROUTE && b->reset_after_ms > 0 && s->n > 0 &&
        now_ms >= s->last_at_ms && now_ms - s->last_at_ms >= b->reset_after_ms)
        backoff_seq_reset(s);
    if (s->n < UINT32_MAX)
        s->n++;
    s->prev_ms = backoff_delay(b, s->n, s->prev_ms, r);
    s->last_at_ms = now_ms;
    return s->prev_ms;
}

void backoff_schedule(const struct backoff_spec *b, uint32_t n, struct rng *r, uint32_t *out)
{
    struct backoff_seq s;
    backoff_seq_reset(&s);
    for (uint32_t i = 0; i < n; i++)
        out[i] = backoff_seq_next(&s, b, 0, r);
}
