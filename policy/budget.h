/* budget -- retry budgets that stop retry storms (docs/budgets.md). Pure: the caller
 * passes "now"; thread-safe with atomics, no locks.
 *
 * Two limits, checked for every retry against the process-wide budget and the route's:
 *  - concurrency: retries in flight, counted from the decision to retry until that retry's
 *    attempt ends, backoff wait included (a waiting retry is still a retry in flight);
 *  - ratio (Linkerd's budget): over a sliding window, retries may not exceed
 *    retry_ratio * first_attempts + min_retries_per_second * window_seconds.
 *
 * The window is policy/window.h's: BUDGET_BUCKETS slices counted without a lock.
 */
#ifndef RETRYPROXY_POLICY_BUDGET_H
#define RETRYPROXY_POLICY_BUDGET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "policy/window.h"

#define BUDGET_BUCKETS WINDOW_BUCKETS

/* A budget's settings: the config's "budget" objects are held in this type (config/cfg.h). */
struct budget_limits {
    int64_t max_concurrent_retries; /* -1: no cap */
    double retry_ratio;
    double min_retries_per_second;
    uint32_t window_ms; /* > 0 */
};

struct budget {
    atomic_int_fast64_t in_flight;
    struct window_slices slices;
    struct window_ring requests; /* first attempts */
    struct window_ring retries;
};

/* Sets up 'b' (all zero) for a window of 'window_ms'. */
void budget_init(struct budget *b, uint32_t window_ms);

/* Adopts a new window length (a reload): counts kept under the old slicing age out. */
void budget_set_window(struct budget *b, uint32_t window_ms);

/* A first attempt: the base of the ratio. */
void budget_note_request(struct budget *b, uint64_t now_ms);

/* Takes a concurrency slot if fewer than 'max' (-1: no cap) retries are in flight. False if
 * none is free (and nothing was taken). */
bool budget_acquire(struct budget *b, int64_t max);
/* Gives a slot back (the retry's attempt ended, or the retry was abandoned). */
void budget_release(struct budget *b);
int64_t budget_in_flight(const struct budget *b);

/* Whether one more retry fits the ratio over the window ending at 'now_ms'. Read-only: call
 * budget_note_retry() once the retry is decided. */
bool budget_ratio_allows(const struct budget *b, const struct budget_limits *l, uint64_t now_ms);
void budget_note_retry(struct budget *b, uint64_t now_ms);

/* First attempts and retries counted in the window ending at 'now_ms' (for tests and /config). */
uint64_t budget_window_requests(const struct budget *b, uint64_t now_ms);
uint64_t budget_window_retries(const struct budget *b, uint64_t now_ms);

#endif
