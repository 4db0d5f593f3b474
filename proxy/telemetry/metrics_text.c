/* metrics_text -- the registry (proxy/telemetry/metrics_int.h) in Prometheus' text format 0.0.4,
 * from one row per family (proxy/telemetry/metrics_fam.h), as the table of docs/metrics.md is.
 */
#include "proxy/telemetry/metrics.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/base/escape.h"
#include "proxy/telemetry/metrics_fam.h"
#include "proxy/telemetry/metrics_int.h"
#include "proxy/telemetry/procstat.h"
#include "proxy/telemetry/version.h"

/* Routes in name order, as a scrape prints them. */
static int by_name(const void *a, const void *b)
{
    return strcmp((*(struct metrics_route *const *)a)->name,
                  (*(struct metrics_route *const *)b)->name);
}

/* ---- rendering ---- */

/* Adds n slot counters into totals; returns their bitwise OR (nonzero: something counted). */
static uint64_t add_counts(uint64_t *totals, const _Atomic uint64_t *slot, size_t n)
{
    uint64_t any = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = peek(&slot[i]);
        totals[i] += v;
        any |= v;
    }
    return any;
}

static void route_sum(const struct metrics_route *r, struct route_totals *t)
{
    memset(t, 0, sizeof(*t));
    uint64_t any = 0;
    for (unsigned w = 0; w < r->nslots; w++) {
        const struct route_slot *s = &r->slots[w];
        any |= add_counts(t->codes, s->codes, CODE_COUNT);
        any |= add_counts(t->retries, s->retries, METRICS_MAX_REASONS);
        any |= add_counts(t->denied, s->denied, METRICS_DENIED_COUNT);
        any |= add_counts(&t->retry_success, &s->retry_success, 1);
        any |= add_counts(&t->retry_after_honored, &s->retry_after_honored, 1);
        any |= add_counts(&t->throttled, &s->throttled, 1);
        any |= add_counts(&t->hedges, &s->hedges, 1);
        any |= add_counts(&t->client_gone, &s->client_gone, 1);
        any |= add_counts(t->protocol, s->protocol, METRICS_PROTO_COUNT);
        any |= add_counts(t->grpc, s->grpc, METRICS_GRPC_COUNT);
        any |= add_counts(t->upgrades, s->upgrades, METRICS_UPGRADE_COUNT);
        any |= add_counts(t->tunnel_bytes, s->tunnel_bytes, 2);
        any |= add_counts(t->accepts, s->accepts, METRICS_ACCEPT_COUNT);
        any |= add_counts(t->deliveries, s->deliveries, METRICS_DELIVERY_COUNT);
        any |= add_counts(t->dead, s->dead, METRICS_DEAD_COUNT);
        any |= add_counts(t->discarded, s->discarded, METRICS_DEAD_COUNT);
        any |= add_counts(&t->dead_refused, &s->dead_refused, 1);
        for (size_t h = 0; h < METRICS_HIST_COUNT; h++) {
            any |= add_counts(t->buckets[h], s->hist[h].buckets, HIST_BUCKETS);
            t->sum_us[h] += peek(&s->hist[h].sum_us);
        }
    }
    t->any = any != 0;
}

/* A label value per text format 0.0.4: backslash, double quote and newline are escaped. */
static void put_label(FILE *f, const char *s)
{
    static const char *const escaped[] = { "\\\\", "\\\"", "\\n" };
    escape_fputs(f, s, "\\\"\n", escaped);
}

/* The # HELP and # TYPE lines of family 'fam'; returns its name (after the prefix). */
static const char *put_family(FILE *f, enum family fam)
{
    const struct family_def *d = &metrics_families[fam];
    const char *prefix = d->bare ? "" : "retryproxy_";
    fprintf(f, "# HELP %s%s %s\n# TYPE %s%s %s\n", prefix, d->name, d->help, prefix, d->name,
            d->type);
    return d->name;
}

/* Starts a series line of 'name' (with 'suffix': _bucket...) for route 'route' and, when
 * 'url' is not NULL, upstream 'url' -- the caller closes the labels. */
static void put_series(FILE *f, const char *name, const char *suffix, const char *route,
                       const char *url)
{
    fprintf(f, "retryproxy_%s%s{route=\"", name, suffix);
    put_label(f, route);
    if (url) {
        fputs("\",upstream=\"", f);
        put_label(f, url);
    }
    fputc('"', f);
}

/* Starts a series line: retryproxy_<name>{route="<route>" -- the caller closes the labels. */
static void put_route_series(FILE *f, const char *name, const struct metrics_route *r)
{
    put_series(f, name, "", r->name, NULL);
}

struct scrape {
    struct metrics_route **routes; /* the routes to print, in name order */
    struct route_totals *totals;
    size_t n;
    struct metrics_upstream *ups; /* the upstreams' health, by route and then URL */
    size_t n_ups;
};

static void render_requests(FILE *f, const struct scrape *sc)
{
    const char *name = put_family(f, FAM_REQUESTS);
    for (size_t i = 0; i < sc->n; i++) {
        for (size_t c = 0; c < CODE_COUNT; c++) {
            if (!sc->totals[i].codes[c])
                continue;
            put_route_series(f, name, sc->routes[i]);
            fprintf(f, ",code=\"%zu\"} %" PRIu64 "\n", c + CODE_MIN, sc->totals[i].codes[c]);
        }
    }
}

/* A route family with one label of fixed values: the counts at 'field' of each route's
 * totals, one per value (the family's table row names the label and its values). */
static void render_labeled(FILE *f, const struct scrape *sc, enum family fam, const char *label,
                           size_t field)
{
    const char *name = put_family(f, fam);
    for (size_t i = 0; i < sc->n; i++) {
        const uint64_t *v = (const uint64_t *)(const void *)((const char *)&sc->totals[i] + field);
        for (size_t k = 0; k < metrics_families[fam].n_values; k++) {
            put_route_series(f, name, sc->routes[i]);
            fprintf(f, ",%s=\"%s\"} %" PRIu64 "\n", label, metrics_families[fam].values[k], v[k]);
        }
    }
}

/* Only the statuses seen: most routes carry no gRPC at all. */
static void render_grpc(FILE *f, const struct scrape *sc)
{
    const char *name = put_family(f, FAM_GRPC);
    for (size_t i = 0; i < sc->n; i++) {
        for (size_t g = 0; g < METRICS_GRPC_COUNT; g++) {
            if (!sc->totals[i].grpc[g])
                continue;
            put_route_series(f, name, sc->routes[i]);
            fprintf(f, ",grpc_status=\"%s\"} %" PRIu64 "\n", grpc_names[g], sc->totals[i].grpc[g]);
        }
    }
}

static void render_retries(FILE *f, const struct scrape *sc)
{
    const char *name = put_family(f, FAM_RETRIES);
    for (size_t i = 0; i < sc->n; i++) {
        const struct metrics_route *r = sc->routes[i];
        const struct route_totals *t = &sc->totals[i];
        for (unsigned k = 0; k < r->nreasons; k++) {
            put_route_series(f, name, r);
            fputs(",reason=\"", f);
            put_label(f, r->reasons[k]);
            fprintf(f, "\"} %" PRIu64 "\n", t->retries[k]);
        }
        /* Slots with no name (an index the route never handed out) are folded into "other"
         * rather than dropped, so the family total stays right. */
        uint64_t other = 0;
        for (unsigned k = r->nreasons; k < METRICS_MAX_REASONS; k++)
            other += t->retries[k];
        if (r->other_used || other) {
            put_route_series(f, name, r);
            fprintf(f, ",reason=\"other\"} %" PRIu64 "\n", other);
        }
    }
}

static void render_route_counter(FILE *f, const struct scrape *sc, enum family fam, size_t field)
{
    const char *name = put_family(f, fam);
    for (size_t i = 0; i < sc->n; i++) {
        uint64_t v;
        memcpy(&v, (const char *)&sc->totals[i] + field, sizeof(v));
        put_route_series(f, name, sc->routes[i]);
        fprintf(f, "} %" PRIu64 "\n", v);
    }
}

/* One histogram's _bucket, _sum and _count lines from its non-cumulative 'buckets'. */
static void put_hist(FILE *f, const char *name, const char *route, const char *url,
                     const uint64_t *buckets, uint64_t sum_us)
{
    uint64_t cum = 0;
    for (size_t b = 0; b < HIST_BUCKETS; b++) {
        cum += buckets[b];
        put_series(f, name, "_bucket", route, url);
        fprintf(f, ",le=\"%s\"} %" PRIu64 "\n", hist_le[b], cum);
    }
    /* Exact decimal seconds from integer microseconds: no binary rounding on the way. */
    put_series(f, name, "_sum", route, url);
    fprintf(f, "} %" PRIu64 ".%06" PRIu64 "\n", sum_us / 1000000, sum_us % 1000000);
    put_series(f, name, "_count", route, url);
    fprintf(f, "} %" PRIu64 "\n", cum);
}

static void render_hist(FILE *f, const struct scrape *sc, enum metrics_hist h, enum family fam)
{
    const char *name = put_family(f, fam);
    for (size_t i = 0; i < sc->n; i++)
        put_hist(f, name, sc->routes[i]->name, NULL, sc->totals[i].buckets[h],
                 sc->totals[i].sum_us[h]);
}

/* attempts_total or attempt_duration_seconds: each route's upstreams, in URL order. */
static void render_targets(FILE *f, const struct scrape *sc, enum family fam)
{
    const char *name = put_family(f, fam);
    for (size_t i = 0; i < sc->n; i++) {
        const struct metrics_route *r = sc->routes[i];
        for (size_t k = 0; k < r->ntargets; k++) {
            const struct metrics_target *t = r->targets[k];
            uint64_t attempts[METRICS_OUT_COUNT] = { 0 }, buckets[HIST_BUCKETS] = { 0 }, sum = 0;
            for (unsigned w = 0; w < t->nslots; w++) {
                add_counts(attempts, t->slots[w].attempts, METRICS_OUT_COUNT);
                add_counts(buckets, t->slots[w].hist.buckets, HIST_BUCKETS);
                sum += peek(&t->slots[w].hist.sum_us);
            }
            if (fam == FAM_ATTEMPT_DURATION) {
                put_hist(f, name, r->name, t->url, buckets, sum);
                continue;
            }
            for (size_t o = 0; o < METRICS_OUT_COUNT; o++) {
                put_series(f, name, "", r->name, t->url);
                fprintf(f, ",outcome=\"%s\"} %" PRIu64 "\n", outcome_names[o], attempts[o]);
            }
        }
    }
}

static void render_in_flight(FILE *f, const struct metrics *m)
{
    const char *name = put_family(f, FAM_IN_FLIGHT);
    fprintf(f, "retryproxy_%s %" PRId64 "\n", name, metrics_retries_in_flight(m));
}

/* A gauge's value: a whole number as one, else the shortest decimal that reads back as 'v'
 * (0.2, not 0.20000000000000001); +Inf, -Inf, NaN. */
static void put_double(FILE *f, double v)
{
    if (isnan(v)) {
        fputs("NaN", f);
        return;
    }
    if (isinf(v)) {
        fputs(v > 0 ? "+Inf" : "-Inf", f);
        return;
    }
    /* Whole numbers as such: %g alone would write 10 as 1e+01. */
    if (fabs(v) < 1e15 && v == trunc(v)) {
        fprintf(f, "%.0f", v);
        return;
    }
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    fputs(buf, f);
}

/* The value of budget family 'fam' in 'l'. */
static double budget_value(enum family fam, const struct budget_limits *l)
{
    switch (fam) {
    case FAM_BUDGET_RATIO:
        return l->retry_ratio;
    case FAM_BUDGET_MIN_RPS:
        return l->min_retries_per_second;
    default:
        return l->max_concurrent_retries < 0 ? INFINITY : (double)l->max_concurrent_retries;
    }
}

/* One budget family: the process-wide budget, then each route's in name order. */
static void render_budget(FILE *f, const struct metrics *m, const struct scrape *sc,
                          enum family fam)
{
    const char *name = put_family(f, fam);
    if (m->has_budget) {
        fprintf(f, "retryproxy_%s{scope=\"%s\"} ", name, scope_names[0]);
        put_double(f, budget_value(fam, &m->budget));
        fputc('\n', f);
    }
    for (size_t i = 0; i < sc->n; i++) {
        const struct metrics_route *r = sc->routes[i];
        if (!r->has_budget)
            continue;
        put_route_series(f, name, r);
        fprintf(f, ",scope=\"%s\"} ", scope_names[1]);
        put_double(f, budget_value(fam, &r->budget));
        fputc('\n', f);
    }
}

static void render_config(FILE *f, struct metrics *m)
{
    const char *name = put_family(f, FAM_RELOADS);
    const uint64_t reloads[2] = { m->reloads_ok, m->reloads_failed }; /* as result_names */
    for (size_t i = 0; i < 2; i++)
        fprintf(f, "retryproxy_%s{result=\"%s\"} %" PRIu64 "\n", name, result_names[i], reloads[i]);

    name = put_family(f, FAM_GENERATION);
    fprintf(f, "retryproxy_%s %" PRIu64 "\n", name, m->generation);

    name = put_family(f, FAM_LAST_SUCCESS);
    fprintf(f, "retryproxy_%s %.3f\n", name, m->last_success);

    name = put_family(f, FAM_LAST_OK);
    fprintf(f, "retryproxy_%s %d\n", name, m->last_ok ? 1 : 0);
}

static void render_process(FILE *f, struct metrics *m)
{
    int64_t conns = 0;
    for (unsigned w = 0; w < m->workers; w++)
        conns += atomic_load_explicit(&m->wslots[w].connections, memory_order_relaxed);
    const char *name = put_family(f, FAM_CONNECTIONS);
    fprintf(f, "retryproxy_%s %" PRId64 "\n", name, conns);

    int64_t h2open = 0, h2opened[METRICS_H2UP_COUNT] = { 0 };
    for (unsigned w = 0; w < m->workers; w++) {
        const struct metrics_h2up *c = &m->wslots[w].h2up;
        h2open += atomic_load_explicit(&c->open, memory_order_relaxed);
        for (int k = 0; k < METRICS_H2UP_COUNT; k++)
            h2opened[k] += atomic_load_explicit(&c->opened[k], memory_order_relaxed);
    }
    int64_t tunnels = 0;
    for (unsigned w = 0; w < m->workers; w++)
        tunnels += atomic_load_explicit(&m->wslots[w].tunnels, memory_order_relaxed);
    name = put_family(f, FAM_TUNNELS_OPEN);
    fprintf(f, "retryproxy_%s %" PRId64 "\n", name, tunnels);
    name = put_family(f, FAM_H2UP_OPEN);
    fprintf(f, "retryproxy_%s %" PRId64 "\n", name, h2open);
    name = put_family(f, FAM_H2UP_OPENED);
    for (int k = 0; k < METRICS_H2UP_COUNT; k++)
        fprintf(f, "retryproxy_%s{result=\"%s\"} %" PRId64 "\n", name, h2up_result_names[k],
                h2opened[k]);

    name = put_family(f, FAM_DRAINING);
    fprintf(f, "retryproxy_%s %d\n", name, m->draining ? 1 : 0);
}

/* The limits and what is held against them; build_info. */
static void render_limits(FILE *f, struct metrics *m)
{
    int64_t waiting = 0;
    uint64_t reached = 0;
    for (unsigned w = 0; w < m->workers; w++) {
        waiting += atomic_load_explicit(&m->wslots[w].upstream_waiting, memory_order_relaxed);
        reached += peek(&m->wslots[w].limit_reached);
    }
    const char *name = put_family(f, FAM_UPSTREAM_WAITING);
    fprintf(f, "retryproxy_%s %" PRId64 "\n", name, waiting);
    name = put_family(f, FAM_LIMIT_REACHED);
    fprintf(f, "retryproxy_%s %" PRIu64 "\n", name, reached);
    name = put_family(f, FAM_BODY_BYTES);
    if (m->body_bytes)
        fprintf(f, "retryproxy_%s %" PRIu64 "\n", name,
                (uint64_t)atomic_load_explicit(m->body_bytes, memory_order_relaxed));
    name = put_family(f, FAM_LIMIT);
    for (size_t i = 0; m->has_limits && i < METRICS_LIMIT_COUNT; i++)
        fprintf(f, "retryproxy_%s{limit=\"%s\"} %" PRIu64 "\n", name, limit_names[i], m->limits[i]);
    name = put_family(f, FAM_BUILD_INFO);
    fprintf(f, "retryproxy_%s{version=\"%s\"} 1\n", name, RETRYPROXY_VERSION);
}

/* process_*: Prometheus' standard process series, read from /proc now. */
static void render_proc(FILE *f)
{
    struct procstat p;
    procstat_read(&p);
    const char *name = put_family(f, FAM_PROC_CPU);
    if (p.ok) {
        fprintf(f, "%s ", name);
        put_double(f, p.cpu_seconds);
        fputc('\n', f);
    }
    name = put_family(f, FAM_PROC_RSS);
    if (p.ok)
        fprintf(f, "%s %" PRIu64 "\n", name, p.resident_bytes);
    name = put_family(f, FAM_PROC_OPEN_FDS);
    if (p.open_fds >= 0)
        fprintf(f, "%s %" PRId64 "\n", name, p.open_fds);
    name = put_family(f, FAM_PROC_MAX_FDS);
    if (p.max_fds >= 0)
        fprintf(f, "%s %" PRId64 "\n", name, p.max_fds);
    name = put_family(f, FAM_PROC_START);
    if (p.ok) {
        fprintf(f, "%s ", name);
        put_double(f, p.start_time_seconds);
        fputc('\n', f);
    }
}

static int by_route_url(const void *a, const void *b)
{
    const struct metrics_upstream *x = a, *y = b;
    int c = strcmp(x->route, y->route);
    return c ? c : strcmp(x->url, y->url);
}

/* upstream_ejections_total and upstream_ejected, one series per row whose route ejects, and
 * upstream_endpoints, three per row. */
static void render_upstreams(FILE *f, const struct scrape *sc)
{
    for (enum family fam = FAM_UPSTREAM_EJECTIONS; fam <= FAM_UPSTREAM_ENDPOINTS; fam++) {
        const char *name = put_family(f, fam);
        for (size_t i = 0; i < sc->n_ups; i++) {
            const struct metrics_upstream *u = &sc->ups[i];
            for (size_t s = 0; s < 3; s++) {
                if ((fam != FAM_UPSTREAM_ENDPOINTS && (s || !u->ejection)))
                    continue;
                fprintf(f, "retryproxy_%s{route=\"", name);
                put_label(f, u->route);
                fputs("\",upstream=\"", f);
                put_label(f, u->url);
                if (fam == FAM_UPSTREAM_ENDPOINTS)
                    fprintf(f, "\",state=\"%s", endpoint_states[s]);
                fprintf(f, "\"} %" PRIu64 "\n",
                        fam == FAM_UPSTREAM_EJECTIONS ? u->ejections
                        : fam == FAM_UPSTREAM_EJECTED ? (uint64_t)u->endpoints[1]
                                                      : (uint64_t)u->endpoints[s]);
            }
        }
    }
}

/* upstream_endpoint_failure_ratio: the worst endpoints of each upstream, at most
 * METRICS_WORST_ENDPOINTS a row. */
static void render_worst(FILE *f, const struct scrape *sc)
{
    const char *name = put_family(f, FAM_UPSTREAM_ENDPOINT_FAILURE);
    for (size_t i = 0; i < sc->n_ups; i++) {
        const struct metrics_upstream *u = &sc->ups[i];
        for (size_t k = 0; k < u->n_worst; k++) {
            fprintf(f, "retryproxy_%s{route=\"", name);
            put_label(f, u->route);
            fputs("\",upstream=\"", f);
            put_label(f, u->url);
            fputs("\",endpoint=\"", f);
            put_label(f, u->worst[k].ip);
            fprintf(f, "\"} %.3f\n", u->worst[k].failure_ratio);
        }
    }
}

/* dns_resolutions_total and dns_stale, one series per host name asked (m->lock held). */
static void render_dns(FILE *f, const struct metrics *m)
{
    const char *name = put_family(f, FAM_DNS_RESOLUTIONS);
    for (size_t i = 0; i < m->nnames; i++)
        for (size_t r = 0; r < METRICS_DNS_COUNT; r++) {
            fprintf(f, "retryproxy_%s{name=\"", name);
            put_label(f, m->names[i]->name);
            fprintf(f, "\",result=\"%s\"} %" PRIu64 "\n", dns_result_names[r],
                    peek(&m->names[i]->results[r]));
        }
    name = put_family(f, FAM_DNS_STALE);
    for (size_t i = 0; i < m->nnames; i++) {
        fprintf(f, "retryproxy_%s{name=\"", name);
        put_label(f, m->names[i]->name);
        fprintf(f, "\"} %d\n", atomic_load_explicit(&m->names[i]->stale, memory_order_relaxed));
    }
}

/* The store's families: series only when there is a store (the view says so). */
static void render_store(FILE *f, struct metrics *m, const struct metrics_store_view *v)
{
    const char *name = put_family(f, FAM_DELIVERIES);
    for (size_t i = 0; v && i < v->n; i++)
        for (size_t s = 0; s < 4; s++) {
            fprintf(f, "retryproxy_%s{route=\"", name);
            put_label(f, v->rows[i].route);
            fprintf(f, "\",state=\"%s\"} %" PRIu64 "\n", delivery_states[s], v->rows[i].n[s]);
        }
    name = put_family(f, FAM_DELIVERY_OLDEST);
    for (size_t i = 0; v && i < v->n; i++) {
        fprintf(f, "retryproxy_%s{route=\"", name);
        put_label(f, v->rows[i].route);
        double age = v->rows[i].oldest_seconds;
        fprintf(f, "\"} %.3f\n", age > 0 ? age : 0);
    }
    name = put_family(f, FAM_STORE_BYTES);
    if (v)
        fprintf(f, "retryproxy_%s %" PRIu64 "\n", name, v->bytes);
    name = put_family(f, FAM_STORE_ROWS);
    if (v)
        fprintf(f, "retryproxy_%s %" PRIu64 "\n", name, v->rows_total);
    name = put_family(f, FAM_STORE_COMMIT);
    if (v) {
        /* put_hist()'s lines without a route label */
        uint64_t cum = 0, sum_us = peek(&m->store_commit.sum_us);
        for (size_t b = 0; b < HIST_BUCKETS; b++) {
            cum += peek(&m->store_commit.buckets[b]);
            fprintf(f, "retryproxy_%s_bucket{le=\"%s\"} %" PRIu64 "\n", name, hist_le[b], cum);
        }
        fprintf(f, "retryproxy_%s_sum %" PRIu64 ".%06" PRIu64 "\n", name, sum_us / 1000000,
                sum_us % 1000000);
        fprintf(f, "retryproxy_%s_count %" PRIu64 "\n", name, cum);
    }
    name = put_family(f, FAM_STORE_UP);
    if (v)
        fprintf(f, "retryproxy_%s %d\n", name, v->up ? 1 : 0);
    name = put_family(f, FAM_STORE_DISCONNECTS);
    if (v)
        fprintf(f, "retryproxy_%s %" PRIu64 "\n", name, v->disconnects);
}

/* Every family in enum family order, the order of the table above. */
static void render_all(FILE *f, struct metrics *m, const struct scrape *sc,
                       const struct metrics_store_view *store)
{
    render_requests(f, sc);
    render_labeled(f, sc, FAM_PROTOCOL, "protocol", offsetof(struct route_totals, protocol));
    render_grpc(f, sc);
    render_labeled(f, sc, FAM_UPGRADES, "outcome", offsetof(struct route_totals, upgrades));
    render_labeled(f, sc, FAM_TUNNEL_BYTES, "direction",
                   offsetof(struct route_totals, tunnel_bytes));
    render_targets(f, sc, FAM_ATTEMPTS);
    render_retries(f, sc);
    render_route_counter(f, sc, FAM_RETRY_SUCCESS, offsetof(struct route_totals, retry_success));
    render_labeled(f, sc, FAM_DENIED, "reason", offsetof(struct route_totals, denied));
    render_in_flight(f, m);
    render_labeled(f, sc, FAM_DELIVERY_ACCEPTS, "result", offsetof(struct route_totals, accepts));
    render_labeled(f, sc, FAM_DELIVERY_ATTEMPTS, "outcome",
                   offsetof(struct route_totals, deliveries));
    render_labeled(f, sc, FAM_DEAD_LETTERS, "reason", offsetof(struct route_totals, dead));
    render_labeled(f, sc, FAM_DISCARDED, "reason", offsetof(struct route_totals, discarded));
    render_route_counter(f, sc, FAM_DEAD_REFUSED, offsetof(struct route_totals, dead_refused));
    render_route_counter(f, sc, FAM_RETRY_AFTER,
                         offsetof(struct route_totals, retry_after_honored));
    render_route_counter(f, sc, FAM_THROTTLED, offsetof(struct route_totals, throttled));
    render_route_counter(f, sc, FAM_HEDGES, offsetof(struct route_totals, hedges));
    render_route_counter(f, sc, FAM_CLIENT_GONE, offsetof(struct route_totals, client_gone));
    render_hist(f, sc, METRICS_HIST_BACKOFF, FAM_BACKOFF);
    render_targets(f, sc, FAM_ATTEMPT_DURATION);
    render_hist(f, sc, METRICS_HIST_REQUEST, FAM_REQUEST_DURATION);
    render_config(f, m);
    render_budget(f, m, sc, FAM_BUDGET_RATIO);
    render_budget(f, m, sc, FAM_BUDGET_MIN_RPS);
    render_budget(f, m, sc, FAM_BUDGET_CONCURRENT);
    render_upstreams(f, sc);
    render_worst(f, sc);
    render_dns(f, m);
    render_store(f, m, store);
    render_process(f, m);
    render_limits(f, m);
    render_proc(f);
}

char *metrics_render(struct metrics *m, size_t *len)
{
    if (len)
        *len = 0;
    if (!m)
        return NULL;
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    if (!f)
        return NULL;

    /* Read before the lock: the source takes locks of its own. */
    struct metrics_upstream *ups = NULL;
    size_t n_ups = m->upstreams_fn ? m->upstreams_fn(m->upstreams_arg, &ups) : 0;
    if (n_ups)
        qsort(ups, n_ups, sizeof(*ups), by_route_url);
    struct metrics_store_view store = { 0 };
    bool has_store = m->store_fn && m->store_fn(m->store_arg, &store);

    /* The lock keeps the route list and reason names still while they are printed; workers
     * never take it, so a scrape only ever delays a config install. */
    pthread_mutex_lock(&m->lock);
    if (m->unsorted) {
        qsort(m->routes, m->nroutes, sizeof(*m->routes), by_name);
        m->unsorted = false;
    }
    struct scrape sc = { .ups = ups, .n_ups = n_ups };
    bool failed = false;
    if (m->nroutes) {
        sc.routes = malloc(m->nroutes * sizeof(*sc.routes));
        sc.totals = malloc(m->nroutes * sizeof(*sc.totals));
        failed = !sc.routes || !sc.totals;
    }
    for (size_t i = 0; !failed && i < m->nroutes; i++) {
        struct metrics_route *r = m->routes[i];
        route_sum(r, &sc.totals[sc.n]);
        /* The no-route series exists from the first config install on; it only shows once a
         * request actually fell through, so a proxy where every request matches has no
         * route="" noise. */
        if (r->name[0] == '\0' && !sc.totals[sc.n].any)
            continue;
        sc.routes[sc.n++] = r;
    }
    if (!failed)
        render_all(f, m, &sc, has_store ? &store : NULL);
    pthread_mutex_unlock(&m->lock);
    free(sc.routes);
    free(sc.totals);
    free(ups);

    failed = ferror(f) != 0 || failed;
    if (fclose(f) != 0 || failed) {
        free(buf);
        return NULL;
    }
    if (len)
        *len = size;
    return buf;
}
