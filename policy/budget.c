#include "policy/budget.h"

#include <string.h>

/* A bucket word: the epoch (slice number) in the high 24 bits, the count in the low 40. 2^40
 * counts per slice and epochs compared modulo 2^24 are far beyond any real use. */
#define COUNT_BITS 40
#define COUNT_MASK ((UINT64_C(1) << COUNT_BITS) - 1)
#define EPOCH_MASK ((UINT64_C(1) << (64 - COUNT_BITS)) - 1)

static uint64_t epoch_of(uint64_t word)
{
    return word >> COUNT_BITS;
}

static uint32_t bucket_ms_for(uint32_t window_ms)
{
    uint32_t ms = window_ms / BUDGET_BUCKETS;
    return ms ? ms : 1;
}

void budget_init(struct budget *b, uint32_t window_ms)
{
    memset(b, 0, sizeof(*b));
    atomic_init(&b->in_flight, 0);
    atomic_init(&b->bucket_ms, bucket_ms_for(window_ms));
    for (int i = 0; i < BUDGET_BUCKETS; i++) {
        atomic_init(&b->requests[i], 0);
        atomic_init(&b->retries[i], 0);
    }
}

void budget_set_window(struct budget *b, uint32_t window_ms)
{
    atomic_store_explicit(&b->bucket_ms, bucket_ms_for(window_ms), memory_order_relaxed);
}

/* The slice 'now' falls in, as stored in a word. */
static uint64_t epoch_at(const struct budget *b, uint64_t now_ms)
{
    uint32_t ms = atomic_load_explicit(&b->bucket_ms, memory_order_relaxed);
    return (now_ms / ms) & EPOCH_MASK;
}

static void add(_Atomic uint64_t *ring, uint64_t epoch)
{
    _Atomic uint64_t *w = &ring[epoch % BUDGET_BUCKETS];
    uint64_t old = atomic_load_explicit(w, memory_order_relaxed), next;
    do {
        /* A bucket holding another slice is stale: this add starts it afresh. */
        if (epoch_of(old) == epoch && (old & COUNT_MASK) < COUNT_MASK)
            next = old + 1;
        else if (epoch_of(old) == epoch)
            next = old; /* saturated */
        else
            next = (epoch << COUNT_BITS) | 1;
    } while (!atomic_compare_exchange_weak_explicit(w, &old, next, memory_order_relaxed,
                                                    memory_order_relaxed));
}

/* The counts of the BUDGET_BUCKETS slices ending with 'epoch' (the window). */
static uint64_t sum(const _Atomic uint64_t *ring, uint64_t epoch)
{
    uint64_t total = 0;
    for (int i = 0; i < BUDGET_BUCKETS; i++) {
        uint64_t word = atomic_load_explicit(&ring[i], memory_order_relaxed);
        uint64_t age = (epoch - epoch_of(word)) & EPOCH_MASK;
        if (age < BUDGET_BUCKETS)
            total += word & COUNT_MASK;
    }
    return total;
}

void budget_note_request(struct budget *b, uint64_t now_ms)
{
    add(b->requests, epoch_at(b, now_ms));
}

void budget_note_retry(struct budget *b, uint64_t now_ms)
{
    add(b->retries, epoch_at(b, now_ms));
}

uint64_t budget_window_requests(const struct budget *b, uint64_t now_ms)
{
    return sum(b->requests, epoch_at(b, now_ms));
}

uint64_t budget_window_retries(const struct budget *b, uint64_t now_ms)
{
    return sum(b->retries, epoch_at(b, now_ms));
}

bool budget_ratio_allows(const struct budget *b, const struct budget_limits *l, uint64_t now_ms)
{
    uint64_t epoch = epoch_at(b, now_ms);
    double allowed = l->retry_ratio * (double)sum(b->requests, epoch) +
                     l->min_retries_per_second * ((double)l->window_ms / 1000.0);
    return (double)sum(b->retries, epoch) + 1.0 <= allowed;
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
