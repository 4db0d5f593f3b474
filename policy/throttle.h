/* throttle -- client-side throttling ("Handling Overload", Google SRE book, chapter 21): when
 * an upstream keeps failing, every proxy in front of it sends it less, by rejecting requests
 * locally with probability
 *
 *     max(0, (requests - k * accepts) / (requests + 1))
 *
 * over a sliding window, where 'requests' are the attempts the proxy wanted to send (rejected
 * ones included) and 'accepts' those the upstream answered with something the route does not
 * count as a failure. With k = 2 the upstream may fail half of what it gets before anything is
 * rejected; a smaller k throttles sooner. Pure: the caller passes "now" and the RNG.
 */
#ifndef RETRYPROXY_POLICY_THROTTLE_H
#define RETRYPROXY_POLICY_THROTTLE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "policy/rng.h"
#include "policy/window.h"

/* A route's settings (config/cfg.h holds them in this type). */
struct throttle_limits {
    double k;           /* 0: no throttling */
    uint32_t window_ms; /* > 0 */
};

/* The counts, shared by every worker. */
struct throttle {
    struct window_slices slices;
    struct window_ring requests, accepts;
};

void throttle_init(struct throttle *t, uint32_t window_ms);
/* Adopts a new window length (a reload). */
void throttle_set_window(struct throttle *t, uint32_t window_ms);

/* The rejection probability over the window ending at 'now_ms'. */
double throttle_probability(const struct throttle *t, double k, uint64_t now_ms);

/* An attempt the proxy wants to send: counted as a request, then let through or rejected with
 * the probability (returned in *p when not NULL). True: send it. */
bool throttle_admit(struct throttle *t, double k, uint64_t now_ms, struct rng *r, double *p);

/* An attempt the upstream accepted (answered with no failure the route names). */
void throttle_note_accept(struct throttle *t, uint64_t now_ms);

#endif
