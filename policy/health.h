/* health -- upstream ejection with backoff (docs/forwarding.md "Choosing an upstream"). Pure:
 * the clock and the RNG come in as arguments, no I/O, no globals; the caller serializes access
 * to one struct health.
 *
 * An upstream that fails 'consecutive_failures' times in a row is ejected: left out of its
 * route's rotation until 'ejected_until_ms'. The n-th ejection of a sequence lasts the n-th
 * delay of the spec's backoff policy (Kubernetes' BackoffManager applied to hosts; Envoy's
 * outlier detection and nginx's max_fails/fail_timeout with our policies). The sequence starts
 * over once the upstream has been healthy for 'reset_after_ms': that long after both its last
 * failure and the end of its last ejection.
 *
 *   healthy --failure x N--> ejected --until passes--> healthy (failures counted from 0)
 *      ^                                                   |
 *      +---- reset_after_ms without a failure: next ejection is the first again
 *
 * Outcomes recorded while the upstream is ejected (attempts that began before, or every
 * upstream ejected and used anyway) count for nothing: an ejection ends at its time.
 */
#ifndef RETRYPROXY_POLICY_HEALTH_H
#define RETRYPROXY_POLICY_HEALTH_H

#include <stdbool.h>
#include <stdint.h>

#include "policy/backoff.h"
#include "policy/rng.h"
#include "policy/score.h"

/* A validated spec (config/ guarantees the backoff's invariants, as for retry.backoff). */
struct health_spec {
    uint32_t consecutive_failures; /* failures in a row that eject; 0: never eject */
    uint32_t reset_after_ms;       /* healthy this long: the sequence starts over; 0: never */
    struct backoff_spec backoff;   /* ejection n lasts backoff_delay(n); scope is not read */
};

/* One upstream's state. Zero-initialise. */
struct health {
    uint32_t failures;         /* in a row, since the last success or ejection */
    uint32_t ejections;        /* in the current sequence: the next is number ejections + 1 */
    uint32_t last_ms;          /* length of the last ejection (the decorrelated policy reads it) */
    uint64_t ejected_until_ms; /* available from then on (0: never ejected) */
    uint64_t last_failure_ms;  /* when the last failure that counted was recorded */
    uint64_t ejections_total;  /* every ejection, never reset */
    /* how well it answered lately, whether ejection is on or not: its weight in the choice
     * (policy/score.h); kept here so that it goes with the address as the rest does */
    struct score score;
};

/* Whether the upstream is in rotation at 'now_ms' (not ejected). */
static inline bool health_available(const struct health *h, uint64_t now_ms)
{
    return now_ms >= h->ejected_until_ms;
}

/* Records one attempt's outcome at 'now_ms': 'failed' as the route's ejection "on" list judges
 * it. Returns true when this failure ejected the upstream (then until h->ejected_until_ms). Does
 * nothing when s->consecutive_failures is 0, or while the upstream is ejected. Draws from 'r'
 * only where the backoff policy or its jitter is random. */
bool health_record(struct health *h, const struct health_spec *s, bool failed, uint64_t now_ms,
                   struct rng *r);

/* Ejections in the current sequence as of 'now_ms' (0 once reset_after_ms of health passed):
 * the next ejection would be number health_sequence() + 1. Read-only. */
uint32_t health_sequence(const struct health *h, const struct health_spec *s, uint64_t now_ms);

#endif
