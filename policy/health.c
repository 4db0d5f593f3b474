#include "policy/health.h"

/* Whether reset_after_ms of health have passed at 'now_ms': counted from the later of the last
 * failure and the end of the last ejection, so time spent ejected is not health. */
static bool sequence_expired(const struct health *h, const struct health_spec *s, uint64_t now_ms)
{
    if (h->ejections == 0 || s->reset_after_ms == 0)
        return false;
    uint64_t since =
        h->last_failure_ms > h->ejected_until_ms ? h->last_failure_ms : h->ejected_until_ms;
    return now_ms >= since && now_ms - since >= s->reset_after_ms;
}

uint32_t health_sequence(const struct health *h, const struct health_spec *s, uint64_t now_ms)
{
    return sequence_expired(h, s, now_ms) ? 0 : h->ejections;
}

bool health_record(struct health *h, const struct health_spec *s, bool failed, uint64_t now_ms,
                   struct rng *r)
{
    if (s->consecutive_failures == 0 || !health_available(h, now_ms))
        return false;
    if (sequence_expired(h, s, now_ms)) {
        h->ejections = 0;
        h->last_ms = 0;
    }
    if (!failed) {
        h->failures = 0;
        return false;
    }
    h->last_failure_ms = now_ms;
    if (++h->failures < s->consecutive_failures)
        return false;
    h->failures = 0;
    if (h->ejections < UINT32_MAX)
        h->ejections++;
    h->last_ms = backoff_delay(&s->backoff, h->ejections, h->last_ms, r);
    h->ejected_until_ms = now_ms + h->last_ms;
    h->ejections_total++;
    return true;
}
