/* window -- event counts over a sliding time window, lock-free: what the retry budget's ratio
 * and client-side throttling measure. Pure: the caller passes "now".
 *
 * A window is WINDOW_BUCKETS time slices of equal length. Each slice's counter packs its epoch
 * (which slice of time it counts) with its count in one 64-bit word, so adding to it is one
 * compare-and-swap that also resets a counter left over from an older slice: exact counts, no
 * lock, no separate reset race.
 */
#ifndef RETRYPROXY_POLICY_WINDOW_H
#define RETRYPROXY_POLICY_WINDOW_H

#include <stdatomic.h>
#include <stdint.h>

#define WINDOW_BUCKETS 20

/* One kind of event counted over the window; several rings may share one slicing. */
struct window_ring {
    _Atomic uint64_t slot[WINDOW_BUCKETS];
};

/* How a window is cut into slices: window_ms / WINDOW_BUCKETS, at least 1 ms. Changing the
 * window's length (a reload) lets the counts taken under the old slicing age out. */
struct window_slices {
    _Atomic uint32_t ms;
};

void window_slices_init(struct window_slices *s, uint32_t window_ms);
void window_slices_set(struct window_slices *s, uint32_t window_ms);
/* The slice 'now_ms' falls in. */
uint64_t window_epoch(const struct window_slices *s, uint64_t now_ms);

void window_ring_init(struct window_ring *r);
/* One event in slice 'epoch'. */
void window_add(struct window_ring *r, uint64_t epoch);
/* The events of the WINDOW_BUCKETS slices ending with 'epoch'. */
uint64_t window_sum(const struct window_ring *r, uint64_t epoch);

#endif
