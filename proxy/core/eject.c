#include "proxy/core/eject.h"

#include <arpa/inet.h>
#include <stdio.h>

#include "proxy/core/balance.h"
#include "proxy/telemetry/log.h"

void eject_record(const struct cfg_route *r, const struct endpoint *e, enum retry_outcome o,
                  int status, const struct hlist *head, int grpc, uint64_t now_ms, struct rng *rng)
{
    const struct cfg_ejection *ej = &r->ejection;
    if (!e || ej->health.consecutive_failures == 0)
        return;
    bool failed = retry_match_on(ej->on, ej->n_on, o, status, head, grpc) != NULL;
    if (!live_endpoint_record(e->le, e->epoch, &ej->health, failed, now_ms, rng))
        return;
    /* rare: an operator wants to see each ejection as it happens, not only in the metrics */
    struct health h;
    live_endpoint_read(e->le, &h);
    /* the address with the URL's port, as GET /upstreams shows it (docs/logs.md) */
    char ip[INET6_ADDRSTRLEN], addr[INET6_ADDRSTRLEN + 16];
    inet_ntop(e->addr.family, &e->addr.u, ip, sizeof(ip));
    snprintf(addr, sizeof(addr), e->addr.family == AF_INET6 ? "[%s]:%u" : "%s:%u", ip,
             r->upstreams[e->k].port);
    log_event(CFG_LOG_WARN, "upstream ejected", "route", r->name, "upstream",
              r->upstreams[e->k].url, LOG_NUM("for_ms", h.ejected_until_ms - now_ms),
              LOG_NUM("ejection", h.ejections), "endpoint", addr, NULL);
}
