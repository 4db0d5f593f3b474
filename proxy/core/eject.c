#include "proxy/core/eject.h"

#include <arpa/inet.h>
#include <stdio.h>

#include "proxy/core/balance.h"
#include "proxy/telemetry/log.h"

/* The score of 'e' takes the attempt, unless its slot went to another address meanwhile. */
static void score_take(const struct endpoint *e, bool failed, uint64_t took_us, uint64_t now_ms)
{
    struct live_endpoint *le = e->le;
    pthread_mutex_lock(&le->mu);
    if (atomic_load_explicit(&le->epoch, memory_order_relaxed) == e->epoch)
        score_record(&le->h.score, failed, took_us, now_ms);
    pthread_mutex_unlock(&le->mu);
}

void eject_record(const struct cfg_route *r, const struct endpoint *e, enum retry_outcome o,
                  int status, const struct hlist *head, int grpc, uint64_t took_us, uint64_t now_ms,
                  struct rng *rng)
{
    if (!e)
        return;
    /* a failure as the route's retries see it: a 503 it retries is one, a 404 is not */
    score_take(e, retry_match_on(r->retry.on, r->retry.n_on, o, status, head, grpc) != NULL,
               took_us, now_ms);
    const struct cfg_ejection *ej = &r->ejection;
    if (ej->health.consecutive_failures == 0)
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
