#include "proxy/ops/upstreams.h"

#include <arpa/inet.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "policy/health.h"
#include "policy/score.h"
#include "proxy/core/live.h"
#include "proxy/core/runtime.h"
#include "proxy/dns/resolve.h"

static const char *const state_names[LIVE_EP_STATES] = { "healthy", "ejected", "leaving" };

void upstreams_rfc3339(int64_t unix_ms, char *out, size_t cap)
{
    time_t s = (time_t)(unix_ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    size_t n = strftime(out, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, cap - n, ".%03dZ", (int)(unix_ms % 1000));
}

static json_t *time_or_null(int64_t unix_ms)
{
    char when[40];
    if (unix_ms <= 0)
        return json_null();
    upstreams_rfc3339(unix_ms, when, sizeof(when));
    return json_string(when);
}

/* The upstream's name as the resolver last had it (null without one). */
static json_t *name_json(struct dns_name *n)
{
    if (!n)
        return json_null();
    struct dns_status st;
    dns_name_status(n, &st);
    return json_pack("{s:s, s:s, s:b, s:o, s:I, s:o}", "name", st.host, "result",
                     dns_result_name(st.last), "stale", st.stale, "resolved_at",
                     time_or_null(st.resolved_unix_ms), "ttl_s", (json_int_t)st.ttl_s, "next_at",
                     time_or_null(st.next_unix_ms));
}

/* x rounded to three decimals, as the page shows ratios and milliseconds. */
static double milli(double x)
{
    return round(x * 1000) / 1000;
}

/* One endpoint: its address, state, load, score and health; 'fastest' is the route's fastest
 * endpoint's latency (its weight is relative to it). */
static json_t *endpoint_json(const struct cfg_route *r, const struct live_ep_row *e, unsigned port,
                             uint32_t fastest, uint64_t now, int64_t wall_ms)
{
    const struct score *s = &e->h.score;
    json_t *score =
        json_pack("{s:f, s:f, s:I, s:I, s:I}", "failure_ratio",
                  milli(score_failure(s->fail_q16, s->at_ms, now) / 65535.0), "latency_ms",
                  milli(s->lat_us / 1000.0), "weight",
                  (json_int_t)(r->weigh_endpoints
                                   ? score_weight(s->fail_q16, s->lat_us, s->at_ms, now, fastest)
                                   : SCORE_WEIGHT_MAX),
                  "attempts", (json_int_t)s->attempts, "failures", (json_int_t)s->failures);
    char ip[INET6_ADDRSTRLEN], addr[INET6_ADDRSTRLEN + 16];
    inet_ntop(e->addr.family, &e->addr.u, ip, sizeof(ip));
    snprintf(addr, sizeof(addr), e->addr.family == AF_INET6 ? "[%s]:%u" : "%s:%u", ip, port);
    bool ejected = !health_available(&e->h, now);
    uint64_t left = ejected ? e->h.ejected_until_ms - now : 0;
    return json_pack("{s:s, s:s, s:I, s:I, s:o, s:o, s:I, s:I, s:I, s:I}", "address", addr, "state",
                     state_names[e->state], "in_flight", (json_int_t)e->in_flight, "connections",
                     (json_int_t)e->conns, "score", score, "ejected_until",
                     ejected ? time_or_null(wall_ms + (int64_t)left) : json_null(), "remaining_ms",
                     (json_int_t)left, "consecutive_failures", (json_int_t)e->h.failures,
                     "ejections", (json_int_t)e->h.ejections_total, "ejections_in_sequence",
                     (json_int_t)health_sequence(&e->h, &r->ejection.health, now));
}

/* One upstream: its name, endpoints, and their health taken together (for an upstream of one
 * address, that address's): ejected while every endpoint is, until the first comes back. */
static json_t *upstream_json(const struct cfg_route *r, const struct rt_route *x, size_t k,
                             uint32_t fastest, uint64_t now, int64_t wall_ms, size_t *n_ep,
                             size_t *n_ejected)
{
    struct live_ep_row *rows;
    size_t n = live_upstream_endpoints_all(x->ups[k], now, &rows);
    json_t *eps = json_array();
    size_t in_rotation = 0, ejected = 0;
    uint64_t back = UINT64_MAX, failures = 0, ejections = 0, seq = 0;
    for (size_t i = 0; i < n; i++) {
        const struct live_ep_row *e = &rows[i];
        json_array_append_new(eps,
                              endpoint_json(r, e, r->upstreams[k].port, fastest, now, wall_ms));
        if (e->state == LIVE_EP_LEAVING)
            continue;
        in_rotation++;
        if (e->state == LIVE_EP_EJECTED) {
            ejected++;
            back = e->h.ejected_until_ms < back ? e->h.ejected_until_ms : back;
        }
        failures = e->h.failures > failures ? e->h.failures : failures;
        ejections += e->h.ejections_total;
        uint64_t s = health_sequence(&e->h, &r->ejection.health, now);
        seq = s > seq ? s : seq;
    }
    free(rows);
    bool all = in_rotation && ejected == in_rotation;
    uint64_t left = all ? back - now : 0;
    *n_ep += in_rotation;
    *n_ejected += ejected;
    return json_pack("{s:s, s:o, s:b, s:o, s:I, s:I, s:I, s:I, s:o}", "url", r->upstreams[k].url,
                     "dns", name_json(x->names[k]), "ejected", all, "ejected_until",
                     all ? time_or_null(wall_ms + (int64_t)left) : json_null(), "remaining_ms",
                     (json_int_t)left, "consecutive_failures", (json_int_t)failures, "ejections",
                     (json_int_t)ejections, "ejections_in_sequence", (json_int_t)seq, "endpoints",
                     eps);
}

/* The lowest latency of route 'x''s endpoints, as proxy/core/balance.c weighs them (0: none
 * known). */
static uint32_t fastest_of(const struct cfg_route *r, const struct rt_route *x, uint64_t now)
{
    uint32_t fastest = 0;
    for (size_t k = 0; k < r->n_upstreams; k++) {
        struct live_ep_row *rows;
        size_t n = live_upstream_endpoints_all(x->ups[k], now, &rows);
        for (size_t i = 0; i < n; i++) {
            uint32_t lat = rows[i].h.score.lat_us;
            if (rows[i].state != LIVE_EP_LEAVING && lat && (!fastest || lat < fastest))
                fastest = lat;
        }
        free(rows);
    }
    return fastest;
}

json_t *upstreams_json(const struct rt *rt, uint64_t now, int64_t wall_ms)
{
    static const char *const balance_names[] = { "least_request", "round_robin", "random" };
    json_t *routes = json_array();
    for (size_t i = 0; i < rt->cfg->n_routes; i++) {
        const struct cfg_route *r = &rt->cfg->routes[i];
        const struct rt_route *x = &rt->routes[i];
        json_t *ups = json_array();
        size_t n_ep = 0, n_ejected = 0;
        uint32_t fastest = fastest_of(r, x, now);
        for (size_t k = 0; k < r->n_upstreams; k++)
            json_array_append_new(ups,
                                  upstream_json(r, x, k, fastest, now, wall_ms, &n_ep, &n_ejected));
        json_array_append_new(routes,
                              json_pack("{s:s, s:s, s:b, s:b, s:o}", "route", r->name, "balance",
                                        balance_names[r->balance], "ejection",
                                        r->ejection.health.consecutive_failures > 0, "panic",
                                        n_ep > 0 && n_ejected == n_ep, "upstreams", ups));
    }
    return json_pack("{s:o}", "routes", routes);
}
