#include "proxy/core/eject.h"

#include "proxy/telemetry/log.h"

uint64_t eject_mask(const struct rt_route *x, size_t n_upstreams, uint64_t now_ms)
{
    if (!x->health)
        return 0;
    uint64_t mask = 0;
    for (size_t i = 0; i < n_upstreams && i < 64; i++)
        if (!live_upstream_available(x->health[i], now_ms))
            mask |= 1ULL << i;
    return mask;
}

void eject_record(const struct rt_route *x, const struct cfg_route *r, const struct cfg_upstream *u,
                  enum retry_outcome o, int status, const struct hlist *head, int grpc,
                  uint64_t now_ms, struct rng *rng)
{
    if (!x->health || !u)
        return;
    const struct cfg_ejection *e = &r->ejection;
    bool failed = retry_match_on(e->on, e->n_on, o, status, head, grpc) != NULL;
    struct live_upstream *lu = x->health[u - r->upstreams];
    if (!live_upstream_record(lu, &e->health, failed, now_ms, rng))
        return;
    /* rare: an operator wants to see each ejection as it happens, not only in the metrics */
    struct health h;
    live_upstream_read(lu, &h);
    log_event(CFG_LOG_WARN, "upstream ejected", "route", r->name, "upstream", u->url,
              LOG_NUM("for_ms", h.ejected_until_ms - now_ms), LOG_NUM("ejection", h.ejections),
              NULL);
}
