#include "policy/throttle.h"

void throttle_init(struct throttle *t, uint32_t window_ms)
{
    window_slices_init(&t->slices, window_ms);
    window_ring_init(&t->requests);
    window_ring_init(&t->accepts);
}

void throttle_set_window(struct throttle *t, uint32_t window_ms)
{
    window_slices_set(&t->slices, window_ms);
}

static uint64_t epoch_at(const struct throttle *t, uint64_t now_ms)
{
    return window_epoch(&t->slices, now_ms);
}

double throttle_probability(const struct throttle *t, double k, uint64_t now_ms)
{
    uint64_t epoch = epoch_at(t, now_ms);
    double requests = (double)window_sum(&t->requests, epoch);
    double accepts = (double)window_sum(&t->accepts, epoch);
    double p = (requests - k * accepts) / (requests + 1.0);
    return p > 0 ? p : 0;
}

bool throttle_admit(struct throttle *t, double k, uint64_t now_ms, struct rng *r, double *p)
{
    double prob = throttle_probability(t, k, now_ms);
    window_add(&t->requests, epoch_at(t, now_ms));
    if (p)
        *p = prob;
    return prob <= 0 || rng_unit(r) >= prob;
}

void throttle_note_accept(struct throttle *t, uint64_t now_ms)
{
    window_add(&t->accepts, epoch_at(t, now_ms));
}
