#include "policy/budget.h"

#include <string.h>

void budget_init(struct budget *b, uint32_t window_ms)
{
    memset(b, 0, sizeof(*b));
    atomic_init(&b->in_flight, 0);
    window_slices_init(&b->slices, window_ms);
    window_ring_init(&b->requests);
    window_ring_init(&b->retries);
}

void budget_set_window(struct budget *b, uint32_t window_ms)
{
    window_slices_set(&b->slices, window_ms);
}

static uint64_t epoch_at(const struct budget *b, uint64_t now_ms)
{
    return window_epoch(&b->slices, now_ms);
}

void budget_note_request(struct budget *b, uint64_t now_ms)
{
    window_add(&b->requests, epoch_at(b, now_ms));
}

void budget_note_retry(struct budget *b, uint64_t now_ms)
{
    window_add(&b->retries, epoch_at(b, now_ms));
}

uint64_t budget_window_requests(const struct budget *b, uint64_t now_ms)
{
    return window_sum(&b->requests, epoch_at(b, now_ms));
}

uint64_t budget_window_retries(const struct budget *b, uint64_t now_ms)
{
    return window_sum(&b->retries, epoch_at(b, now_ms));
}

bool budget_ratio_allows(const struct budget *b, const struct budget_limits *l, uint64_t now_ms)
{
    uint64_t epoch = epoch_at(b, now_ms);
    double allowed = l->retry_ratio * (double)window_sum(&b->requests, epoch) +
                     l->min_retries_per_second * ((double)l->window_ms / 1000.0);
    return (double)window_sum(&b->retries, epoch) + 1.0 <= allowed;
}

/* A compare-and-swap loop rather than add-then-undo: the count never exceeds 'max', even for
 * an instant, so a gauge sampled from it never shows more retries than allowed. */
bool budget_acquire(struct budget *b, int64_t max)
{
    int_fast64_t n = atomic_load_explicit(&b->in_flight, memory_order_relaxed);
    do {
        if (max >= 0 && n >= max)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&b->in_flight, &n, n + 1, memory_order_relaxed,
                                                    memory_order_relaxed));
    return true;
}

void budget_release(struct budget *b)
{
    atomic_fetch_sub_explicit(&b->in_flight, 1, memory_order_relaxed);
}

int64_t budget_in_flight(const struct budget *b)
{
    return atomic_load_explicit(&b->in_flight, memory_order_relaxed);
}
