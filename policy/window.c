#include "policy/window.h"

/* A slot word: the epoch (slice number) in the high 24 bits, the count in the low 40. 2^40
 * counts per slice and epochs compared modulo 2^24 are far beyond any real use. */
#define COUNT_BITS 40
#define COUNT_MASK ((UINT64_C(1) << COUNT_BITS) - 1)
#define EPOCH_MASK ((UINT64_C(1) << (64 - COUNT_BITS)) - 1)

static uint64_t epoch_of(uint64_t word)
{
    return word >> COUNT_BITS;
}

static uint32_t slice_ms(uint32_t window_ms)
{
    uint32_t ms = window_ms / WINDOW_BUCKETS;
    return ms ? ms : 1;
}

void window_slices_init(struct window_slices *s, uint32_t window_ms)
{
    atomic_init(&s->ms, slice_ms(window_ms));
}

void window_slices_set(struct window_slices *s, uint32_t window_ms)
{
    atomic_store_explicit(&s->ms, slice_ms(window_ms), memory_order_relaxed);
}

uint64_t window_epoch(const struct window_slices *s, uint64_t now_ms)
{
    return (now_ms / atomic_load_explicit(&s->ms, memory_order_relaxed)) & EPOCH_MASK;
}

void window_ring_init(struct window_ring *r)
{
    for (int i = 0; i < WINDOW_BUCKETS; i++)
        atomic_init(&r->slot[i], 0);
}

void window_add(struct window_ring *r, uint64_t epoch)
{
    _Atomic uint64_t *w = &r->slot[epoch % WINDOW_BUCKETS];
    uint64_t old = atomic_load_explicit(w, memory_order_relaxed), next;
    do {
        /* A slot holding another slice is stale: this add starts it afresh. */
        if (epoch_of(old) == epoch && (old & COUNT_MASK) < COUNT_MASK)
            next = old + 1;
        else if (epoch_of(old) == epoch)
            next = old; /* saturated */
        else
            next = (epoch << COUNT_BITS) | 1;
    } while (!atomic_compare_exchange_weak_explicit(w, &old, next, memory_order_relaxed,
                                                    memory_order_relaxed));
}

uint64_t window_sum(const struct window_ring *r, uint64_t epoch)
{
    uint64_t total = 0;
    for (int i = 0; i < WINDOW_BUCKETS; i++) {
        uint64_t word = atomic_load_explicit(&r->slot[i], memory_order_relaxed);
        uint64_t age = (epoch - epoch_of(word)) & EPOCH_MASK;
        if (age < WINDOW_BUCKETS)
            total += word & COUNT_MASK;
    }
    return total;
}
