#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "policy/budget.h"
#include "proxy/core/live.h"
#include "proxy/telemetry/metrics.h"
#include "proxy/telemetry/version.h"

/* ---- helpers over the rendered text ---- */

static char *render(struct metrics *m)
{
    size_t len = 0;
    char *text = metrics_render(m, &len);
    cr_assert_not_null(text, "metrics_render returned NULL");
    cr_assert_eq(len, strlen(text), "reported length %zu, text length %zu", len, strlen(text));
    cr_assert(len == 0 || text[len - 1] == '\n', "exposition does not end with a newline");
    return text;
}

/* Whether 'line' is one whole line of 'text'. */
static bool has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        if (len == n && memcmp(p, line, n) == 0)
            return true;
        if (!eol)
            break;
        p = eol + 1;
    }
    return false;
}

/* Start of the line whose series (everything before the value) is exactly 'series', or NULL. */
static const char *find_series(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; *p;) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return p;
        const char *eol = strchr(p, '\n');
        if (!eol)
            break;
        p = eol + 1;
    }
    return NULL;
}

/* The integer value of 'series', or -1 when it is not rendered. */
static long long value_of(const char *text, const char *series)
{
    const char *p = find_series(text, series);
    if (!p)
        return -1;
    return strtoll(p + strlen(series) + 1, NULL, 10);
}

/* Lines that start with 'prefix'. */
static size_t count_lines(const char *text, const char *prefix)
{
    size_t n = 0, plen = strlen(prefix);
    for (const char *p = text; *p;) {
        if (strncmp(p, prefix, plen) == 0)
            n++;
        const char *eol = strchr(p, '\n');
        if (!eol)
            break;
        p = eol + 1;
    }
    return n;
}

#define expect_line(text, line) cr_expect(has_line(text, line), "missing line: %s", line)

/* expect_line() for each of 'lines'. */
static void expect_lines(const char *text, const char *const *lines, size_t n)
{
    for (size_t i = 0; i < n; i++)
        expect_line(text, lines[i]);
}

/* expect_line() for each line that follows. */
#define EXPECT_LINES(text, ...)                                                                    \
    do {                                                                                           \
        static const char *const lines_[] = { __VA_ARGS__ };                                       \
        expect_lines((text), lines_, sizeof(lines_) / sizeof(lines_[0]));                          \
    } while (0)

static const char *const outcomes[] = { "1xx",   "2xx",     "3xx",
                                        "4xx",   "5xx",     "connect_failure",
                                        "reset", "timeout", "cancelled" };
static const char *const denied[] = { "max-attempts", "budget",        "concurrency",    "deadline",
                                      "retry-after",  "not-retryable", "body-too-large", "draining",
                                      "pushback",     "throttled" };
static const char *const le[] = { "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01",
                                  "0.025",  "0.05",    "0.1",    "0.25",  "0.5",    "1",     "2.5",
                                  "5",      "10",      "30",     "60",    "+Inf" };

static const struct {
    const char *name, *type;
} families[] = {
    { "requests_total", "counter" },
    { "requests_by_protocol_total", "counter" },
    { "grpc_responses_total", "counter" },
    { "upgrades_total", "counter" },
    { "tunnel_bytes_total", "counter" },
    { "attempts_total", "counter" },
    { "retries_total", "counter" },
    { "retry_success_total", "counter" },
    { "retries_denied_total", "counter" },
    { "retries_in_flight", "gauge" },
    { "delivery_accepts_total", "counter" },
    { "delivery_attempts_total", "counter" },
    { "dead_letters_total", "counter" },
    { "deliveries_discarded_total", "counter" },
    { "dead_letters_refused_total", "counter" },
    { "retry_after_honored_total", "counter" },
    { "throttled_total", "counter" },
    { "hedges_total", "counter" },
    { "client_gone_total", "counter" },
    { "backoff_seconds", "histogram" },
    { "attempt_duration_seconds", "histogram" },
    { "request_duration_seconds", "histogram" },
    { "config_reloads_total", "counter" },
    { "config_generation", "gauge" },
    { "config_last_reload_success_timestamp_seconds", "gauge" },
    { "config_last_reload_successful", "gauge" },
    { "budget_retry_ratio", "gauge" },
    { "budget_min_retries_per_second", "gauge" },
    { "budget_max_concurrent_retries", "gauge" },
    { "upstream_ejections_total", "counter" },
    { "upstream_ejected", "gauge" },
    { "upstream_endpoints", "gauge" },
    { "upstream_endpoint_failure_ratio", "gauge" },
    { "dns_resolutions_total", "counter" },
    { "dns_stale", "gauge" },
    { "deliveries", "gauge" },
    { "delivery_oldest_seconds", "gauge" },
    { "store_bytes", "gauge" },
    { "store_rows", "gauge" },
    { "store_commit_seconds", "histogram" },
    { "store_up", "gauge" },
    { "store_disconnects_total", "counter" },
    { "connections_active", "gauge" },
    { "tunnels_open", "gauge" },
    { "upstream_h2_connections", "gauge" },
    { "upstream_h2_connections_total", "counter" },
    { "draining", "gauge" },
    { "upstream_requests_waiting", "gauge" },
    { "connections_limit_reached_total", "counter" },
    { "buffered_body_bytes", "gauge" },
    { "limit", "gauge" },
    { "build_info", "gauge" },
    /* Prometheus' standard names, without the prefix */
    { "process_cpu_seconds_total", "counter" },
    { "process_resident_memory_bytes", "gauge" },
    { "process_open_fds", "gauge" },
    { "process_max_fds", "gauge" },
    { "process_start_time_seconds", "gauge" },
};
#define NFAMILIES (sizeof(families) / sizeof(families[0]))

/* ---- exact values ---- */

Test(metrics, known_scenario_renders_exact_lines)
{
    struct metrics *m = metrics_new(2);
    cr_assert_not_null(m);
    struct metrics_route *r = metrics_route(m, "r");
    cr_assert_not_null(r);
    unsigned gw = metrics_reason(r, "gateway-error");
    struct metrics_target *u = metrics_target(r, "http://u:1");
    cr_assert_not_null(u);

    metrics_request(r, 0, 200);
    metrics_attempt(u, 0, METRICS_OUT_5XX, 0.01);
    metrics_attempt(u, 0, METRICS_OUT_5XX, 0.01);
    metrics_attempt(u, 0, METRICS_OUT_2XX, 0.01);
    metrics_retry(r, 0, gw);
    metrics_retry(r, 0, gw);
    metrics_retry_success(r, 0);

    char *t = render(m);
    EXPECT_LINES(t, "retryproxy_requests_total{route=\"r\",code=\"200\"} 1",
                 "retryproxy_attempts_total{route=\"r\",upstream=\"http://u:1\",outcome=\"5xx\"} 2",
                 "retryproxy_attempts_total{route=\"r\",upstream=\"http://u:1\",outcome=\"2xx\"} 1",
                 "retryproxy_attempt_duration_seconds_count{route=\"r\",upstream=\"http://u:1\"} 3",
                 "retryproxy_retries_total{route=\"r\",reason=\"gateway-error\"} 2",
                 "retryproxy_retry_success_total{route=\"r\"} 1",
                 "retryproxy_retry_after_honored_total{route=\"r\"} 0");
    /* Only the code seen, and only the reason registered. */
    cr_expect_eq(count_lines(t, "retryproxy_requests_total{"), 1);
    cr_expect_eq(count_lines(t, "retryproxy_retries_total{"), 1);

    /* All eight outcomes, zeros included, in contract order. */
    const char *prev = t;
    for (size_t i = 0; i < 8; i++) {
        char series[128];
        snprintf(series, sizeof(series),
                 "retryproxy_attempts_total{route=\"r\",upstream=\"http://u:1\",outcome=\"%s\"}",
                 outcomes[i]);
        const char *at = find_series(t, series);
        cr_expect_not_null(at, "missing %s", series);
        cr_expect(at == NULL || at > prev, "%s out of order", series);
        if (at)
            prev = at;
        long long want = i == 4 ? 2 : i == 1 ? 1 : 0;
        cr_expect_eq(value_of(t, series), want, "%s = %lld", series, value_of(t, series));
    }
    free(t);
    metrics_free(m);
}

/* attempts_total and attempt_duration_seconds by upstream (its URL as written): one pointer per
 * URL of a route, kept for the registry's life, series in URL order; the same URL on another
 * route is another series. */
Test(metrics, attempts_are_counted_by_upstream)
{
    struct metrics *m = metrics_new(2);
    struct metrics_route *r = metrics_route(m, "r"), *o = metrics_route(m, "o");
    struct metrics_target *b = metrics_target(r, "http://b:2");
    struct metrics_target *a = metrics_target(r, "http://a:1/");
    struct metrics_target *ob = metrics_target(o, "http://b:2");
    cr_assert(a && b && ob);
    cr_expect_eq(metrics_target(r, "http://b:2"), b);
    cr_expect_eq(metrics_target(r, "http://a:1/"), a);
    cr_expect_neq(ob, b);
    metrics_attempt(a, 0, METRICS_OUT_2XX, 0.002);
    metrics_attempt(b, 1, METRICS_OUT_TIMEOUT, 1.5);
    metrics_attempt(b, 0, METRICS_OUT_TIMEOUT, 0.5);
    char *t = render(m);
    EXPECT_LINES(
        t, "retryproxy_attempts_total{route=\"r\",upstream=\"http://a:1/\",outcome=\"2xx\"} 1",
        "retryproxy_attempts_total{route=\"r\",upstream=\"http://a:1/\",outcome=\"timeout\"} 0",
        "retryproxy_attempts_total{route=\"r\",upstream=\"http://b:2\",outcome=\"timeout\"} 2",
        "retryproxy_attempts_total{route=\"o\",upstream=\"http://b:2\",outcome=\"timeout\"} 0",
        "retryproxy_attempt_duration_seconds_sum{route=\"r\",upstream=\"http://a:1/\"} 0.002000",
        "retryproxy_attempt_duration_seconds_count{route=\"r\",upstream=\"http://b:2\"} 2",
        "retryproxy_attempt_duration_seconds_sum{route=\"r\",upstream=\"http://b:2\"} 2.000000");
    /* nine outcomes for each of the three pairs, none by route alone */
    cr_expect_eq(count_lines(t, "retryproxy_attempts_total{"), 27);
    cr_expect_eq(count_lines(t, "retryproxy_attempts_total{route=\"r\",outcome"), 0);
    const char *first = find_series(
        t, "retryproxy_attempts_total{route=\"r\",upstream=\"http://a:1/\",outcome=\"1xx\"}");
    const char *second = find_series(
        t, "retryproxy_attempts_total{route=\"r\",upstream=\"http://b:2\",outcome=\"1xx\"}");
    cr_expect(first && second && first < second, "upstreams not in URL order");
    free(t);
    metrics_free(m);
}

Test(metrics, slots_are_summed_across_workers)
{
    struct metrics *m = metrics_new(4);
    cr_assert_not_null(m);
    struct metrics_route *r = metrics_route(m, "api");
    unsigned reason = metrics_reason(r, "429");
    struct metrics_target *u = metrics_target(r, "h2c://api:80");
    for (unsigned w = 0; w < 4; w += 3) { /* workers 0 and 3 */
        metrics_request(r, w, 503);
        metrics_attempt(u, w, METRICS_OUT_TIMEOUT, 1);
        metrics_retry(r, w, reason);
        metrics_retry_success(r, w);
        metrics_denied(r, w, METRICS_DENIED_BUDGET);
        metrics_retry_after_honored(r, w);
        metrics_observe(r, w, METRICS_HIST_BACKOFF, 0.05);
        metrics_connections_add(m, w, 1);
    }
    metrics_request(r, 3, 503);

    char *t = render(m);
    EXPECT_LINES(
        t, "retryproxy_requests_total{route=\"api\",code=\"503\"} 3",
        "retryproxy_attempts_total{route=\"api\",upstream=\"h2c://api:80\",outcome=\"timeout\"} 2",
        "retryproxy_attempt_duration_seconds_sum{route=\"api\",upstream=\"h2c://api:80\"} 2.000000",
        "retryproxy_retries_total{route=\"api\",reason=\"429\"} 2",
        "retryproxy_retry_success_total{route=\"api\"} 2",
        "retryproxy_retries_denied_total{route=\"api\",reason=\"budget\"} 2",
        "retryproxy_retry_after_honored_total{route=\"api\"} 2",
        "retryproxy_backoff_seconds_bucket{route=\"api\",le=\"0.05\"} 2",
        "retryproxy_backoff_seconds_sum{route=\"api\"} 0.100000",
        "retryproxy_backoff_seconds_count{route=\"api\"} 2", "retryproxy_connections_active 2");
    free(t);
    metrics_free(m);
}

Test(metrics, registry_supports_256_workers)
{
    struct metrics *m = metrics_new(256);
    cr_assert_not_null(m);
    struct metrics_route *r = metrics_route(m, "wide");
    cr_assert_not_null(r);
    for (unsigned w = 0; w < 256; w++) {
        metrics_request(r, w, 204);
        metrics_observe(r, w, METRICS_HIST_REQUEST, 1.0);
        metrics_connections_add(m, w, 2);
    }
    metrics_connections_add(m, 255, -1);
    char *t = render(m);
    EXPECT_LINES(t, "retryproxy_requests_total{route=\"wide\",code=\"204\"} 256",
                 "retryproxy_request_duration_seconds_bucket{route=\"wide\",le=\"0.5\"} 0",
                 "retryproxy_request_duration_seconds_bucket{route=\"wide\",le=\"1\"} 256",
                 "retryproxy_request_duration_seconds_sum{route=\"wide\"} 256.000000",
                 "retryproxy_connections_active 511");
    free(t);
    metrics_free(m);
}

/* ---- real concurrency: one writer per slot, a scraper alongside ---- */

/* The scenario is plain C with no Criterion calls, so that it also runs under ThreadSanitizer:
 * Criterion cannot start there (its BoxFort arena wants address space TSan reserves,
 * Snaipe/Criterion#274), so building with -DMETRICS_TEST_MAIN adds a main() that runs only this
 * (see the end of the file). */

#define WRITERS    4
#define ITERATIONS 1000000
#define TOTAL      ((long long)WRITERS * ITERATIONS)

struct hammer {
    struct metrics *m;
    atomic_bool done;
    /* Written by the scraper, read after it is joined. */
    unsigned renders, failed_renders;
    char problem[256];
};

struct writer_arg {
    struct hammer *h;
    unsigned w;
};

static void *writer(void *p)
{
    struct writer_arg *a = p;
    struct metrics *m = a->h->m;
    /* Looked up here, through the mutex, as a worker would get them from a config snapshot. */
    struct metrics_route *r = metrics_route(m, "hot");
    unsigned gw = metrics_reason(r, "gateway-error");
    struct metrics_target *u = metrics_target(r, "http://hot");
    for (unsigned i = 0; i < ITERATIONS; i++) {
        metrics_request(r, a->w, 200);
        metrics_attempt(u, a->w, METRICS_OUT_2XX, 0.002);
        metrics_retry(r, a->w, gw);
        metrics_observe(r, a->w, METRICS_HIST_REQUEST, 0.002);
        metrics_connections_add(m, a->w, 1);
        metrics_connections_add(m, a->w, -1);
        /* Now and then a config install adds series while scrapes walk the list. */
        if (i % 200000 == 0) {
            char name[32];
            snprintf(name, sizeof(name), "new-%u-%u", a->w, i);
            struct metrics_route *n = metrics_route(m, name);
            metrics_retry(n, a->w, metrics_reason(n, "429"));
        }
    }
    return NULL;
}

static const char *const watched[] = {
    "retryproxy_requests_total{route=\"hot\",code=\"200\"}",
    "retryproxy_attempts_total{route=\"hot\",upstream=\"http://hot\",outcome=\"2xx\"}",
    "retryproxy_retries_total{route=\"hot\",reason=\"gateway-error\"}",
    "retryproxy_request_duration_seconds_bucket{route=\"hot\",le=\"0.0025\"}",
    "retryproxy_request_duration_seconds_count{route=\"hot\"}",
};
#define NWATCHED (sizeof(watched) / sizeof(watched[0]))

static void *scraper(void *p)
{
    struct hammer *h = p;
    long long last[NWATCHED] = { 0 };
    bool stop = false;
    while (!stop && !h->problem[0]) {
        /* One more scrape after the writers finish, so the last one sees every update. */
        stop = atomic_load(&h->done);
        char *t = metrics_render(h->m, NULL);
        if (!t) {
            h->failed_renders++;
            continue;
        }
        h->renders++;
        for (size_t i = 0; i < NWATCHED && !h->problem[0]; i++) {
            const char *at = find_series(t, watched[i]);
            /* Series may be missing until the writers have created or counted them. */
            long long v = at ? strtoll(at + strlen(watched[i]) + 1, NULL, 10) : 0;
            if (v < last[i] || v > TOTAL)
                snprintf(h->problem, sizeof(h->problem), "%s went from %lld to %lld", watched[i],
                         last[i], v);
            last[i] = v;
        }
        free(t);
    }
    return NULL;
}

/* Runs the scenario; NULL when every check held, else what went wrong. */
static const char *hammer_run(struct hammer *h)
{
    memset(h, 0, sizeof(*h));
    atomic_init(&h->done, false);
    h->m = metrics_new(WRITERS);
    if (!h->m)
        return "metrics_new failed";

    pthread_t st, wt[WRITERS];
    struct writer_arg wa[WRITERS];
    if (pthread_create(&st, NULL, scraper, h) != 0)
        return "pthread_create failed";
    for (unsigned w = 0; w < WRITERS; w++) {
        wa[w] = (struct writer_arg){ .h = h, .w = w };
        if (pthread_create(&wt[w], NULL, writer, &wa[w]) != 0)
            abort();
    }
    for (unsigned w = 0; w < WRITERS; w++)
        pthread_join(wt[w], NULL);
    atomic_store(&h->done, true);
    pthread_join(st, NULL);

    if (!h->problem[0] && h->failed_renders)
        snprintf(h->problem, sizeof(h->problem), "%u renders failed", h->failed_renders);
    if (!h->problem[0] && h->renders < 2)
        snprintf(h->problem, sizeof(h->problem), "the scraper ran only %u times", h->renders);

    static const char *const want[] = {
        "retryproxy_requests_total{route=\"hot\",code=\"200\"} 4000000",
        "retryproxy_attempts_total{route=\"hot\",upstream=\"http://hot\",outcome=\"2xx\"} 4000000",
        "retryproxy_retries_total{route=\"hot\",reason=\"gateway-error\"} 4000000",
        "retryproxy_request_duration_seconds_bucket{route=\"hot\",le=\"0.001\"} 0",
        "retryproxy_request_duration_seconds_bucket{route=\"hot\",le=\"0.0025\"} 4000000",
        "retryproxy_request_duration_seconds_sum{route=\"hot\"} 8000.000000",
        "retryproxy_request_duration_seconds_count{route=\"hot\"} 4000000",
        "retryproxy_retries_total{route=\"new-3-800000\",reason=\"429\"} 1",
        "retryproxy_connections_active 0",
    };
    char *t = metrics_render(h->m, NULL);
    for (size_t i = 0; t && !h->problem[0] && i < sizeof(want) / sizeof(want[0]); i++) {
        if (!has_line(t, want[i]))
            snprintf(h->problem, sizeof(h->problem), "final scrape lacks: %s", want[i]);
    }
    if (!t && !h->problem[0])
        snprintf(h->problem, sizeof(h->problem), "final render failed");
    free(t);
    metrics_free(h->m);
    return h->problem[0] ? h->problem : NULL;
}

Test(metrics, concurrent_writers_and_scraper, .timeout = 600)
{
    struct hammer h;
    const char *problem = hammer_run(&h);
    cr_expect_null(problem, "%s", problem);
    cr_log_info("the scraper rendered %u times during the run", h.renders);
}

/* ---- histograms ---- */

Test(metrics, histogram_buckets_are_cumulative)
{
    struct metrics *m = metrics_new(1);
    struct metrics_route *r = metrics_route(m, "h");
    const double obs[] = { 0.00005, 0.0004, 0.0007, 0.003, 0.2, 100 };
    for (size_t i = 0; i < 6; i++)
        metrics_observe(r, 0, METRICS_HIST_REQUEST, obs[i]);

    /* 50 us -> le 0.0001 (a loopback attempt); 0.0004 -> le 0.0005; 0.0007 -> le 0.001;
     * 0.003 -> le 0.005; 0.2 -> le 0.25; 100 -> +Inf only. */
    const long long want[19] = { 1, 1, 2, 3, 3, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6 };
    char *t = render(m);
    const char *prev = t;
    for (size_t i = 0; i < 19; i++) {
        char series[128];
        snprintf(series, sizeof(series),
                 "retryproxy_request_duration_seconds_bucket{route=\"h\",le=\"%s\"}", le[i]);
        const char *at = find_series(t, series);
        cr_expect_not_null(at, "missing %s", series);
        cr_expect(at == NULL || at > prev, "%s out of order", series);
        if (at)
            prev = at;
        cr_expect_eq(value_of(t, series), want[i], "%s = %lld, want %lld", series,
                     value_of(t, series), want[i]);
    }
    expect_line(t, "retryproxy_request_duration_seconds_sum{route=\"h\"} 100.204150");
    expect_line(t, "retryproxy_request_duration_seconds_count{route=\"h\"} 6");
    cr_expect_eq(count_lines(t, "retryproxy_request_duration_seconds_bucket{route=\"h\""), 19);
    /* The other histogram of the route is there, empty; no upstream: no attempt series. */
    EXPECT_LINES(t, "retryproxy_backoff_seconds_bucket{route=\"h\",le=\"+Inf\"} 0",
                 "retryproxy_backoff_seconds_sum{route=\"h\"} 0.000000");
    cr_expect_eq(count_lines(t, "retryproxy_attempt_duration_seconds_bucket{"), 0);
    free(t);
    metrics_free(m);
}

Test(metrics, histogram_bounds_are_inclusive_and_odd_values_are_safe)
{
    struct metrics *m = metrics_new(1);
    struct metrics_route *r = metrics_route(m, "b");
    metrics_observe(r, 0, METRICS_HIST_BACKOFF, 0.001); /* exactly on a bound: le="0.001" */
    metrics_observe(r, 0, METRICS_HIST_BACKOFF, 60);
    metrics_observe(r, 0, METRICS_HIST_BACKOFF, -1); /* clock trouble: counted as 0 */
    metrics_observe(r, 0, METRICS_HIST_BACKOFF, 1e300);
    char *t = render(m);
    EXPECT_LINES(t, "retryproxy_backoff_seconds_bucket{route=\"b\",le=\"0.001\"} 2",
                 "retryproxy_backoff_seconds_bucket{route=\"b\",le=\"60\"} 3",
                 "retryproxy_backoff_seconds_bucket{route=\"b\",le=\"+Inf\"} 4",
                 "retryproxy_backoff_seconds_count{route=\"b\"} 4");
    free(t);
    metrics_free(m);
}

/* ---- series and reasons ---- */

Test(metrics, same_name_same_series)
{
    struct metrics *m = metrics_new(2);
    struct metrics_route *a = metrics_route(m, "alpha");
    struct metrics_route *b = metrics_route(m, "beta");
    struct metrics_route *none = metrics_route(m, "");
    cr_assert_not_null(a);
    cr_assert_not_null(b);
    cr_assert_not_null(none);
    cr_expect_eq(metrics_route(m, "alpha"), a);
    cr_expect_eq(metrics_route(m, "beta"), b);
    cr_expect_eq(metrics_route(m, ""), none);
    cr_expect_neq(a, b);
    cr_expect_neq(a, none);
    /* Many more names (the list grows and stays sorted) do not move the first ones. */
    for (int i = 0; i < 100; i++) {
        char name[32];
        snprintf(name, sizeof(name), "route-%03d", 99 - i);
        cr_assert_not_null(metrics_route(m, name));
    }
    cr_expect_eq(metrics_route(m, "alpha"), a);
    cr_expect_eq(metrics_route(m, "beta"), b);
    metrics_free(m);
}

Test(metrics, reasons_are_deduplicated_per_route)
{
    struct metrics *m = metrics_new(1);
    struct metrics_route *r = metrics_route(m, "r");
    struct metrics_route *s = metrics_route(m, "s");
    unsigned gw = metrics_reason(r, "gateway-error");
    unsigned tm = metrics_reason(r, "429");
    unsigned cf = metrics_reason(r, "connect-failure");
    cr_expect_neq(gw, tm);
    cr_expect_neq(gw, cf);
    cr_expect_neq(tm, cf);
    cr_expect_eq(metrics_reason(r, "gateway-error"), gw);
    cr_expect_eq(metrics_reason(r, "429"), tm);
    cr_expect_lt(gw, METRICS_MAX_REASONS - 1);
    /* Another route has its own labels. */
    cr_expect_eq(metrics_reason(s, "connect-failure"), 0);

    metrics_retry(r, 0, tm);
    char *t = render(m);
    /* Every registered reason renders, zeros included, in registration order. */
    const char *g =
        find_series(t, "retryproxy_retries_total{route=\"r\",reason=\"gateway-error\"}");
    const char *q = find_series(t, "retryproxy_retries_total{route=\"r\",reason=\"429\"}");
    const char *c =
        find_series(t, "retryproxy_retries_total{route=\"r\",reason=\"connect-failure\"}");
    cr_expect(g && q && c && g < q && q < c, "registered reasons missing or out of order");
    expect_line(t, "retryproxy_retries_total{route=\"r\",reason=\"429\"} 1");
    expect_line(t, "retryproxy_retries_total{route=\"s\",reason=\"connect-failure\"} 0");
    cr_expect_eq(count_lines(t, "retryproxy_retries_total{route=\"r\""), 3);
    cr_expect(!strstr(t, "reason=\"other\""), "no overflow, so no \"other\"");
    free(t);
    metrics_free(m);
}

Test(metrics, reason_overflow_goes_to_other)
{
    struct metrics *m = metrics_new(1);
    struct metrics_route *r = metrics_route(m, "r");
    char token[32];
    for (unsigned i = 0; i < METRICS_MAX_REASONS - 1; i++) {
        snprintf(token, sizeof(token), "tok%u", i);
        cr_expect_eq(metrics_reason(r, token), i);
    }
    unsigned over1 = metrics_reason(r, "one-too-many");
    unsigned over2 = metrics_reason(r, "two-too-many");
    cr_expect_eq(over1, METRICS_MAX_REASONS - 1);
    cr_expect_eq(over2, METRICS_MAX_REASONS - 1);
    cr_expect_eq(metrics_reason(r, "tok5"), 5); /* earlier tokens keep their slots */

    metrics_retry(r, 0, over1);
    metrics_retry(r, 0, over2);
    metrics_retry(r, 0, 5);
    char *t = render(m);
    EXPECT_LINES(t, "retryproxy_retries_total{route=\"r\",reason=\"other\"} 2",
                 "retryproxy_retries_total{route=\"r\",reason=\"tok5\"} 1",
                 "retryproxy_retries_total{route=\"r\",reason=\"tok30\"} 0");
    cr_expect(!strstr(t, "one-too-many"));
    cr_expect_eq(count_lines(t, "retryproxy_retries_total{route=\"r\""), METRICS_MAX_REASONS);
    free(t);
    metrics_free(m);
}

Test(metrics, literal_other_token_shares_the_other_series)
{
    struct metrics *m = metrics_new(1);
    struct metrics_route *r = metrics_route(m, "r");
    unsigned o = metrics_reason(r, "other");
    cr_expect_eq(o, METRICS_MAX_REASONS - 1);
    metrics_retry(r, 0, o);
    char *t = render(m);
    expect_line(t, "retryproxy_retries_total{route=\"r\",reason=\"other\"} 1");
    cr_expect_eq(count_lines(t, "retryproxy_retries_total{route=\"r\",reason=\"other\"}"), 1);
    free(t);
    metrics_free(m);
}

Test(metrics, denied_renders_all_reasons_in_order)
{
    struct metrics *m = metrics_new(1);
    struct metrics_route *r = metrics_route(m, "d");
    metrics_denied(r, 0, METRICS_DENIED_DEADLINE);
    metrics_denied(r, 0, METRICS_DENIED_DRAINING);
    metrics_denied(r, 0, METRICS_DENIED_DRAINING);
    char *t = render(m);
    const char *prev = t;
    for (size_t i = 0; i < METRICS_DENIED_COUNT; i++) {
        char series[128];
        snprintf(series, sizeof(series),
                 "retryproxy_retries_denied_total{route=\"d\",reason=\"%s\"}", denied[i]);
        const char *at = find_series(t, series);
        cr_expect(at && at > prev, "%s missing or out of order", series);
        if (at)
            prev = at;
        long long want = i == METRICS_DENIED_DEADLINE ? 1 : i == METRICS_DENIED_DRAINING ? 2 : 0;
        cr_expect_eq(value_of(t, series), want);
    }
    free(t);
    metrics_free(m);
}

/* ---- rendering rules ---- */

Test(metrics, routes_render_sorted_by_name)
{
    struct metrics *m = metrics_new(1);
    metrics_route(m, "charlie");
    metrics_route(m, "alpha");
    metrics_route(m, "bravo");
    char *t = render(m);
    const char *a = find_series(t, "retryproxy_retry_success_total{route=\"alpha\"}");
    const char *b = find_series(t, "retryproxy_retry_success_total{route=\"bravo\"}");
    const char *c = find_series(t, "retryproxy_retry_success_total{route=\"charlie\"}");
    cr_expect(a && b && c && a < b && b < c, "routes not sorted by name");
    free(t);
    metrics_free(m);
}

Test(metrics, requests_total_renders_only_codes_seen)
{
    struct metrics *m = metrics_new(1);
    struct metrics_route *r = metrics_route(m, "c");
    metrics_request(r, 0, 100);
    metrics_request(r, 0, 599);
    metrics_request(r, 0, 504);
    metrics_request(r, 0, 99); /* out of range: not rendered */
    metrics_request(r, 0, 600);
    metrics_request(r, 0, -1);
    metrics_request(r, 0, 0);
    char *t = render(m);
    const char *c100 = find_series(t, "retryproxy_requests_total{route=\"c\",code=\"100\"}");
    const char *c504 = find_series(t, "retryproxy_requests_total{route=\"c\",code=\"504\"}");
    const char *c599 = find_series(t, "retryproxy_requests_total{route=\"c\",code=\"599\"}");
    cr_expect(c100 && c504 && c599 && c100 < c504 && c504 < c599, "codes missing or unsorted");
    cr_expect_eq(count_lines(t, "retryproxy_requests_total{"), 3);
    free(t);
    metrics_free(m);
}

Test(metrics, unmatched_route_renders_once_counted)
{
    struct metrics *m = metrics_new(1);
    struct metrics_route *none = metrics_route(m, "");
    metrics_route(m, "a");
    char *t = render(m);
    cr_expect(!strstr(t, "route=\"\""), "route=\"\" rendered without counts");
    free(t);

    metrics_request(none, 0, 404);
    t = render(m);
    EXPECT_LINES(t, "retryproxy_requests_total{route=\"\",code=\"404\"} 1",
                 "retryproxy_backoff_seconds_count{route=\"\"} 0",
                 "retryproxy_request_duration_seconds_count{route=\"\"} 0");
    /* "" sorts before every other name. */
    const char *e = find_series(t, "retryproxy_retry_success_total{route=\"\"}");
    const char *a = find_series(t, "retryproxy_retry_success_total{route=\"a\"}");
    cr_expect(e && a && e < a);
    free(t);
    metrics_free(m);
}

Test(metrics, label_values_are_escaped)
{
    struct metrics *m = metrics_new(1);
    struct metrics_route *r = metrics_route(m, "a\"b\\c\nd");
    cr_assert_not_null(r);
    unsigned k = metrics_reason(r, "x\"y");
    metrics_request(r, 0, 200);
    metrics_retry(r, 0, k);
    char *t = render(m);
    EXPECT_LINES(t, "retryproxy_requests_total{route=\"a\\\"b\\\\c\\nd\",code=\"200\"} 1",
                 "retryproxy_retry_success_total{route=\"a\\\"b\\\\c\\nd\"} 0",
                 "retryproxy_retries_total{route=\"a\\\"b\\\\c\\nd\",reason=\"x\\\"y\"} 1",
                 "retryproxy_backoff_seconds_bucket{route=\"a\\\"b\\\\c\\nd\",le=\"+Inf\"} 0");
    /* The raw newline never reaches the output: no line starts with the rest of the name. */
    cr_expect_eq(count_lines(t, "d\""), 0);
    free(t);
    metrics_free(m);
}

Test(metrics, empty_registry_has_every_family)
{
    struct metrics *m = metrics_new(1);
    char *t = render(m);
    const char *prev = t;
    for (size_t i = 0; i < NFAMILIES; i++) {
        char help[128], type[128];
        const char *prefix = strncmp(families[i].name, "process_", 8) ? "retryproxy_" : "";
        snprintf(help, sizeof(help), "# HELP %s%s ", prefix, families[i].name);
        snprintf(type, sizeof(type), "# TYPE %s%s %s", prefix, families[i].name, families[i].type);
        cr_expect_eq(count_lines(t, help), 1, "no single %s", help);
        expect_line(t, type);
        /* In the order of the contract's table, HELP right before TYPE. */
        const char *h = strstr(t, help);
        const char *ty = strstr(t, type);
        cr_expect(h && ty && h >= prev && strchr(h, '\n') + 1 == ty, "%s misplaced",
                  families[i].name);
        if (ty)
            prev = ty;
    }
    cr_expect_eq(count_lines(t, "# TYPE "), NFAMILIES);
    EXPECT_LINES(t, "retryproxy_retries_in_flight 0",
                 "retryproxy_config_reloads_total{result=\"success\"} 0",
                 "retryproxy_config_reloads_total{result=\"failure\"} 0",
                 "retryproxy_config_generation 0",
                 "retryproxy_config_last_reload_success_timestamp_seconds 0.000",
                 "retryproxy_config_last_reload_successful 0", "retryproxy_connections_active 0",
                 "retryproxy_draining 0", "retryproxy_upstream_requests_waiting 0",
                 "retryproxy_connections_limit_reached_total 0");
    /* the version is the one --version prints; no limit nor held bytes before they are set */
    cr_expect_eq(count_lines(t, "retryproxy_build_info{version=\"" RETRYPROXY_VERSION "\"} 1"), 1);
    cr_expect_eq(count_lines(t, "retryproxy_limit{"), 0);
    cr_expect_eq(count_lines(t, "retryproxy_buffered_body_bytes "), 0);
    cr_expect(!strstr(t, "route="), "an empty registry has no route series");
    cr_expect(!strstr(t, "scope="), "no budget is shown before one is installed");
    free(t);
    metrics_free(m);
}

Test(metrics, reloads_and_generation)
{
    struct metrics *m = metrics_new(1);
    metrics_reload(m, true, 1, 1700000000.25);
    char *t = render(m);
    expect_line(t, "retryproxy_config_last_reload_successful 1"); /* the initial load */
    free(t);
    metrics_reload(m, false, 1, 1700000100.0);
    t = render(m);
    expect_line(t, "retryproxy_config_last_reload_successful 0");
    free(t);
    metrics_reload(m, false, 1, 1700000200.0);
    metrics_reload(m, true, 2, 1700000300.5);
    t = render(m);
    EXPECT_LINES(t, "retryproxy_config_reloads_total{result=\"success\"} 2",
                 "retryproxy_config_reloads_total{result=\"failure\"} 2",
                 "retryproxy_config_generation 2",
                 "retryproxy_config_last_reload_success_timestamp_seconds 1700000300.500",
                 "retryproxy_config_last_reload_successful 1");
    free(t);

    /* A failure leaves the last success time alone, and says the last load failed. */
    metrics_reload(m, false, 2, 1700000400.0);
    t = render(m);
    expect_line(t, "retryproxy_config_reloads_total{result=\"failure\"} 3");
    expect_line(t, "retryproxy_config_last_reload_success_timestamp_seconds 1700000300.500");
    expect_line(t, "retryproxy_config_last_reload_successful 0");
    free(t);
    metrics_free(m);
}

Test(metrics, draining_turns_1_and_stays)
{
    struct metrics *m = metrics_new(1);
    char *t = render(m);
    expect_line(t, "retryproxy_draining 0");
    free(t);
    metrics_set_draining(m);
    metrics_set_draining(m); /* a second signal changes nothing */
    metrics_reload(m, true, 2, 1700000000.0);
    t = render(m);
    expect_line(t, "retryproxy_draining 1");
    cr_expect_eq(count_lines(t, "retryproxy_draining "), 1);
    free(t);
    metrics_free(m);
}

/* The upstreams' health source of upstreams_render_sorted_rows_of_the_source: rows out of
 * order, a label that needs escaping; the array is the scrape's to free. */
static size_t fake_upstreams(void *arg, struct metrics_upstream **rows)
{
    static const struct metrics_upstream src[] = {
        { "r", "http://10.0.0.2:80", true, 0, { 2, 0, 0 }, 0, { { "", 0 } } },
        { "a", "http://b.internal/x\"y", true, 7, { 0, 1, 0 }, 0, { { "", 0 } } },
        { "r", "http://10.0.0.1:80", true, 3, { 0, 1, 1 }, 0, { { "", 0 } } },
        /* no ejection: endpoints, and its worst ones by failure ratio */
        { "n",
          "http://svc:80",
          false,
          0,
          { 3, 0, 0 },
          2,
          { { "10.0.3.1", 0.95 }, { "10.0.3.2", 0.25 } } },
    };
    ++*(int *)arg;
    *rows = malloc(sizeof(src));
    cr_assert_not_null(*rows);
    memcpy(*rows, src, sizeof(src));
    return 4;
}

/* One series per upstream in each family, by route and then URL, read at every scrape. */
Test(metrics, upstreams_render_sorted_rows_of_the_source)
{
    struct metrics *m = metrics_new(1);
    int calls = 0;
    char *t = render(m);
    cr_expect(!strstr(t, "upstream=\""), "no source: no upstream series");
    free(t);
    metrics_set_upstreams(m, fake_upstreams, &calls);
    t = render(m);
    cr_expect_eq(calls, 1);
    static const char *const want[] = {
        "retryproxy_upstream_ejections_total{route=\"a\",upstream=\"http://b.internal/x\\\"y\"} 7",
        "retryproxy_upstream_ejections_total{route=\"r\",upstream=\"http://10.0.0.1:80\"} 3",
        "retryproxy_upstream_ejections_total{route=\"r\",upstream=\"http://10.0.0.2:80\"} 0",
        "retryproxy_upstream_ejected{route=\"a\",upstream=\"http://b.internal/x\\\"y\"} 1",
        "retryproxy_upstream_ejected{route=\"r\",upstream=\"http://10.0.0.1:80\"} 1",
        "retryproxy_upstream_ejected{route=\"r\",upstream=\"http://10.0.0.2:80\"} 0",
        "retryproxy_upstream_endpoints{route=\"a\",upstream=\"http://b.internal/x\\\"y\",state="
        "\"ejected\"} 1",
        "retryproxy_upstream_endpoints{route=\"n\",upstream=\"http://svc:80\",state=\"healthy\"} 3",
        "retryproxy_upstream_endpoints{route=\"r\",upstream=\"http://"
        "10.0.0.1:80\",state=\"leaving\"} 1",
        "retryproxy_upstream_endpoints{route=\"r\",upstream=\"http://"
        "10.0.0.2:80\",state=\"healthy\"} 2",
        "retryproxy_upstream_endpoint_failure_ratio{route=\"n\",upstream=\"http://svc:80\","
        "endpoint=\"10.0.3.1\"} 0.950",
        "retryproxy_upstream_endpoint_failure_ratio{route=\"n\",upstream=\"http://svc:80\","
        "endpoint=\"10.0.3.2\"} 0.250",
    };
    const char *prev = t;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const char *at = strstr(t, want[i]);
        cr_expect(at && at >= prev, "missing or out of order: %s", want[i]);
        if (at)
            prev = at;
    }
    cr_expect_eq(count_lines(t, "retryproxy_upstream_eject"), 6, "route n has no ejection");
    cr_expect_eq(count_lines(t, "retryproxy_upstream_endpoints{"), 12, "three states each");
    free(t);
    metrics_free(m);
}

/* The process-wide budget first under scope="process" (no route label), then each route's in
 * name order; values as the shortest decimal, no cap as +Inf. */
Test(metrics, budgets_render_exact_lines)
{
    struct metrics *m = metrics_new(1);
    struct metrics_route *b = metrics_route(m, "b/v1");
    struct metrics_route *a = metrics_route(m, "a");
    struct metrics_route *none = metrics_route(m, "");
    metrics_route(m, "unset"); /* series, but no budget installed for it */
    metrics_request(none, 0, 404);
    const struct budget_limits process = { .max_concurrent_retries = 100,
                                           .retry_ratio = 0.2,
                                           .min_retries_per_second = 10,
                                           .window_ms = 10000 };
    const struct budget_limits lb = { .max_concurrent_retries = -1,
                                      .retry_ratio = 0.35,
                                      .min_retries_per_second = 2.5,
                                      .window_ms = 1000 };
    const struct budget_limits la = { .max_concurrent_retries = 1000000000,
                                      .retry_ratio = 0,
                                      .min_retries_per_second = 0.001,
                                      .window_ms = 1 };
    metrics_process_budget(m, &process);
    metrics_route_budget(b, &lb);
    metrics_route_budget(a, &la);
    char *t = render(m);
    static const char *const want[] = {
        "retryproxy_budget_retry_ratio{scope=\"process\"} 0.2",
        "retryproxy_budget_retry_ratio{route=\"a\",scope=\"route\"} 0",
        "retryproxy_budget_retry_ratio{route=\"b/v1\",scope=\"route\"} 0.35",
        "retryproxy_budget_min_retries_per_second{scope=\"process\"} 10",
        "retryproxy_budget_min_retries_per_second{route=\"a\",scope=\"route\"} 0.001",
        "retryproxy_budget_min_retries_per_second{route=\"b/v1\",scope=\"route\"} 2.5",
        "retryproxy_budget_max_concurrent_retries{scope=\"process\"} 100",
        "retryproxy_budget_max_concurrent_retries{route=\"a\",scope=\"route\"} 1000000000",
        "retryproxy_budget_max_concurrent_retries{route=\"b/v1\",scope=\"route\"} +Inf",
    };
    const char *prev = t;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const char *at = strstr(t, want[i]);
        cr_expect(at && at[strlen(want[i])] == '\n' && (at == t || at[-1] == '\n'),
                  "missing line: %s", want[i]);
        cr_expect(!at || at > prev, "out of order: %s", want[i]);
        if (at)
            prev = at;
    }
    /* three families of three series: neither route="" nor a route never given a budget */
    cr_expect_eq(count_lines(t, "retryproxy_budget_"), 9);
    free(t);

    /* A reload sets them again; a route it drops keeps its last values, as its counters do. */
    const struct budget_limits lb2 = { .max_concurrent_retries = 5,
                                       .retry_ratio = 1.5,
                                       .min_retries_per_second = 0,
                                       .window_ms = 1000 };
    const struct budget_limits process2 = { .max_concurrent_retries = -1,
                                            .retry_ratio = 0.123456789,
                                            .min_retries_per_second = 3,
                                            .window_ms = 10000 };
    metrics_process_budget(m, &process2);
    metrics_route_budget(b, &lb2);
    t = render(m);
    EXPECT_LINES(t, "retryproxy_budget_retry_ratio{scope=\"process\"} 0.123456789",
                 "retryproxy_budget_max_concurrent_retries{scope=\"process\"} +Inf",
                 "retryproxy_budget_min_retries_per_second{scope=\"process\"} 3",
                 "retryproxy_budget_retry_ratio{route=\"b/v1\",scope=\"route\"} 1.5",
                 "retryproxy_budget_min_retries_per_second{route=\"b/v1\",scope=\"route\"} 0",
                 "retryproxy_budget_max_concurrent_retries{route=\"b/v1\",scope=\"route\"} 5",
                 "retryproxy_budget_retry_ratio{route=\"a\",scope=\"route\"} 0");
    cr_expect_eq(count_lines(t, "retryproxy_budget_"), 9);
    free(t);
    metrics_free(m);
}

Test(metrics, retries_in_flight_adds_and_subtracts)
{
    struct metrics *m = metrics_new(1);
    cr_expect_eq(metrics_retries_in_flight(m), 0);
    metrics_retries_in_flight_add(m, 1);
    metrics_retries_in_flight_add(m, 1);
    metrics_retries_in_flight_add(m, 1);
    cr_expect_eq(metrics_retries_in_flight(m), 3);
    metrics_retries_in_flight_add(m, -1);
    cr_expect_eq(metrics_retries_in_flight(m), 2);
    char *t = render(m);
    expect_line(t, "retryproxy_retries_in_flight 2");
    free(t);
    metrics_retries_in_flight_add(m, -2);
    cr_expect_eq(metrics_retries_in_flight(m), 0);
    metrics_free(m);
}

Test(metrics, bad_arguments_are_ignored)
{
    struct metrics *m = metrics_new(2);
    struct metrics_route *r = metrics_route(m, "r");
    /* No route: nothing happens. */
    metrics_request(NULL, 0, 200);
    metrics_attempt(NULL, 0, METRICS_OUT_2XX, 1);
    cr_expect_null(metrics_target(NULL, "http://u"));
    cr_expect_null(metrics_target(r, NULL));
    metrics_retry(NULL, 0, 0);
    metrics_retry_success(NULL, 0);
    metrics_denied(NULL, 0, METRICS_DENIED_BUDGET);
    metrics_retry_after_honored(NULL, 0);
    metrics_observe(NULL, 0, METRICS_HIST_REQUEST, 1);
    /* A worker index past the registry: not counted, no write out of bounds. */
    metrics_request(r, 2, 200);
    struct metrics_target *u = metrics_target(r, "http://u");
    metrics_attempt(u, 2, METRICS_OUT_2XX, 1);
    metrics_attempt(u, 1000, METRICS_OUT_2XX, 1);
    metrics_attempt(u, 0, METRICS_OUT_COUNT, 1);
    metrics_connections_add(m, 2, 1);
    const struct budget_limits l = { .max_concurrent_retries = 1, .window_ms = 1 };
    metrics_route_budget(NULL, &l);
    metrics_route_budget(r, NULL);
    metrics_process_budget(NULL, &l);
    metrics_process_budget(m, NULL);
    metrics_set_draining(NULL);
    metrics_free(NULL);
    cr_expect_null(metrics_route(m, NULL));

    char *t = render(m);
    cr_expect_eq(count_lines(t, "retryproxy_requests_total{"), 0);
    expect_line(t,
                "retryproxy_attempts_total{route=\"r\",upstream=\"http://u\",outcome=\"2xx\"} 0");
    expect_line(t,
                "retryproxy_attempt_duration_seconds_count{route=\"r\",upstream=\"http://u\"} 0");
    expect_line(t, "retryproxy_connections_active 0");
    cr_expect(!strstr(t, "scope="), "a NULL budget was installed");
    free(t);
    metrics_free(m);
}

/* ---- the whole exposition is valid text format ---- */

/* Fills every family, across several routes, including a name that needs escaping. */
static struct metrics *populated(void)
{
    struct metrics *m = metrics_new(3);
    cr_assert_not_null(m);
    const char *names[] = { "payments", "", "search", "odd \"name\" \\ with\nnewline" };
    for (size_t i = 0; i < 4; i++) {
        struct metrics_route *r = metrics_route(m, names[i]);
        cr_assert_not_null(r);
        unsigned gw = metrics_reason(r, "gateway-error");
        unsigned tm = metrics_reason(r, "429");
        metrics_reason(r, "connect-failure");
        struct metrics_target *u[2] = { metrics_target(r, "https://b.example/\"q\"\\"),
                                        metrics_target(r, "http://a.example:8080") };
        cr_assert(u[0] && u[1]);
        for (unsigned w = 0; w < 3; w++) {
            metrics_request(r, w, 200);
            metrics_request(r, w, 503);
            for (int o = 0; o < METRICS_OUT_COUNT; o++)
                metrics_attempt(u[o % 2], w, (enum metrics_outcome)o, 0.0123 * (w + 1));
            metrics_retry(r, w, gw);
            metrics_retry(r, w, tm);
            metrics_retry_success(r, w);
            for (int d = 0; d < METRICS_DENIED_COUNT; d++)
                metrics_denied(r, w, (enum metrics_denied)d);
            metrics_retry_after_honored(r, w);
            for (int h = 0; h < METRICS_HIST_COUNT; h++) {
                metrics_observe(r, w, (enum metrics_hist)h, 0.0123 * (w + 1));
                metrics_observe(r, w, (enum metrics_hist)h, 75);
            }
            metrics_connections_add(m, w, 3);
        }
    }
    /* One route runs out of reason slots: 3 + 34 tokens, 31 named, 6 counted as "other". */
    struct metrics_route *r = metrics_route(m, "payments");
    char token[32];
    for (unsigned i = 0; i < METRICS_MAX_REASONS + 2; i++) {
        snprintf(token, sizeof(token), "extra-%u", i);
        metrics_retry(r, 1, metrics_reason(r, token));
    }
    metrics_retries_in_flight_add(m, 4);
    const struct budget_limits process = { .max_concurrent_retries = 100,
                                           .retry_ratio = 0.2,
                                           .min_retries_per_second = 10,
                                           .window_ms = 10000 };
    const struct budget_limits route = { .max_concurrent_retries = -1,
                                         .retry_ratio = 0.05,
                                         .min_retries_per_second = 0.5,
                                         .window_ms = 10000 };
    metrics_process_budget(m, &process);
    metrics_route_budget(metrics_route(m, "payments"), &route);
    metrics_route_budget(metrics_route(m, "odd \"name\" \\ with\nnewline"), &route);
    metrics_set_draining(m);
    metrics_reload(m, true, 1, 1700000000.0);
    metrics_reload(m, false, 1, 1700000060.0);
    metrics_reload(m, true, 2, 1700000120.0);
    return m;
}

/* Our own structural check, which runs with or without promtool: every sample line is
 * NAME{labels} VALUE or NAME VALUE, and each family's lines come right after its TYPE line. */
static void check_structure(const char *text)
{
    char family[128] = "";
    size_t lines = 0;
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        cr_assert_not_null(eol, "last line has no newline");
        size_t len = (size_t)(eol - p);
        char line[1024];
        cr_assert_lt(len, sizeof(line));
        memcpy(line, p, len);
        line[len] = '\0';
        lines++;
        if (strncmp(line, "# TYPE ", 7) == 0) {
            cr_assert_eq(sscanf(line + 7, "%127s", family), 1);
        } else if (strncmp(line, "# HELP ", 7) != 0) {
            cr_assert_neq(family[0], '\0', "sample before any TYPE: %s", line);
            cr_expect_eq(strncmp(line, family, strlen(family)), 0, "%s outside family %s", line,
                         family);
            const char *sp = strrchr(line, ' ');
            cr_assert_not_null(sp, "no value: %s", line);
            char *end;
            strtod(sp + 1, &end);
            cr_expect_eq(*end, '\0', "bad value: %s", line);
            const char *brace = strchr(line, '{');
            if (brace && brace < sp)
                cr_expect_eq(sp[-1], '}', "labels not closed: %s", line);
        }
        p = eol + 1;
    }
    cr_expect_gt(lines, NFAMILIES * 2);
}

Test(metrics, exposition_passes_promtool)
{
    struct metrics *m = populated();
    char *t = render(m);
    check_structure(t);
    expect_line(t, "retryproxy_retries_total{route=\"payments\",reason=\"other\"} 6");
    expect_line(t, "retryproxy_connections_active 36");
    expect_line(
        t, "retryproxy_budget_max_concurrent_retries{route=\"payments\",scope=\"route\"} +Inf");
    expect_line(t, "retryproxy_draining 1");

    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        cr_log_warn("promtool is not on PATH: the exposition was NOT checked with "
                    "`promtool check metrics` (apt-get install -y prometheus provides it)");
        free(t);
        metrics_free(m);
        return;
    }

    char path[] = "/tmp/retryproxy-metrics-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0, "mkstemp failed");
    FILE *f = fdopen(fd, "w");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(t, 1, strlen(t), f), strlen(t));
    cr_assert_eq(fclose(f), 0);

    char cmd[256];
    snprintf(cmd, sizeof(cmd), "promtool check metrics < '%s' 2>&1", path);
    FILE *out = popen(cmd, "r");
    cr_assert_not_null(out, "popen failed");
    char buf[1024];
    size_t complaints = 0;
    while (fgets(buf, sizeof(buf), out)) {
        buf[strcspn(buf, "\r\n")] = '\0';
        const char *s = buf + strspn(buf, " \t");
        /* promtool prints nothing (or an OK/SUCCESS line) when the metrics are clean; anything
         * else is a lint finding. */
        if (*s == '\0' || strncmp(s, "OK", 2) == 0 || strncmp(s, "SUCCESS", 7) == 0)
            continue;
        complaints++;
        cr_log_error("promtool: %s", s);
    }
    int status = pclose(out);
    unlink(path);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "promtool check metrics failed (%d)",
              status);
    cr_expect_eq(complaints, 0, "promtool reported %zu problem(s)", complaints);
    free(t);
    metrics_free(m);
}

#ifdef METRICS_TEST_MAIN
/* The concurrency scenario on its own, for ThreadSanitizer, where Criterion cannot run:
 *   gcc -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=thread -DMETRICS_TEST_MAIN -I. \
 *       tests/unit/test_metrics.c proxy/telemetry/metrics.c -lcriterion -lpthread -lm
 * This main() takes the place of Criterion's, so none of the Test()s above run. */
int main(void)
{
    struct hammer h;
    const char *problem = hammer_run(&h);
    printf("metrics concurrency: %u scrapes during the run: %s\n", h.renders,
           problem ? problem : "ok");
    return problem ? 1 : 0;
}
#endif

/* The process's CPU seconds, user and system. */
static void cpu_times(double *user, double *sys)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *user = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6;
    *sys = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* A reload of a config with tens of thousands of routes registers each name with the metrics
 * and the live route state: one hash lookup each, not a scan or a shift of everything before.
 * Names in descending order were the worst case of the sorted insert. CPU time, so a busy
 * machine does not fail it; quadratic costs took tens of seconds here. */
/* CPU seconds, user and system together, to register 'n' route names twice, in a registry and
 * a live table of their own (the system seconds alone in *sys); the last pair is kept in *m
 * and *l when they are not NULL. */
static double register_names(int n, double *sys, struct metrics **keep_m, struct live **keep_l)
{
    struct metrics *m = metrics_new(1);
    struct live *l = live_new();
    char name[32];
    double u0, s0, u1, s1;
    cpu_times(&u0, &s0);
    for (int round = 0; round < 2; round++)
        for (int i = n; i > 0; i--) {
            snprintf(name, sizeof(name), "route-%06d", i);
            cr_assert(metrics_route(m, name) != NULL);
            cr_assert(live_route(l, name, 10000) != NULL);
        }
    cpu_times(&u1, &s1);
    *sys = s1 - s0;
    if (keep_m) {
        *keep_m = m;
        *keep_l = l;
    } else {
        live_free(l);
        metrics_free(m);
    }
    return (u1 - u0) + *sys;
}

/* Linear, not quadratic: four times the names cost about four times the CPU (sixteen times
 * if each registration walked the ones before). A ratio, not a time: it holds on a slow or
 * busy machine and under the sanitizers alike.
 *
 * Both sizes are measured the same way: user and system time together, from the same
 * allocator state. Memory is cleared either by the kernel (fresh pages: system time) or by
 * calloc (freed memory: user time); counting user time alone, the first, small run got fresh
 * pages and the large one freed memory: 0.56-0.76 s against 0.019-0.032 s, 30 times, for a
 * cost that is linear (issue 37). A first run fills the heap, and glibc's malloc is asked to
 * keep it (no trimming, no mmap of large blocks), so that each measured run reuses memory;
 * the sanitizers' allocators ignore mallopt(), and the sum holds without it. */
Test(metrics, many_route_names_register_in_linear_time)
{
    enum { N = 60000 };
    (void)mallopt(M_TRIM_THRESHOLD, 1 << 30); /* best effort: see above */
    (void)mallopt(M_MMAP_THRESHOLD, 32 << 20);
    struct metrics *m;
    struct live *l;
    double sys, quarter_sys, warm_sys;
    double warm = register_names(N, &warm_sys, NULL, NULL);
    /* the lesser of two runs each: a run that shared the cores with others (CI, a build)
     * takes more CPU than it needs, through the caches (seen: 1.22 s against 0.10 s) */
    double quarter = register_names(N / 4, &quarter_sys, NULL, NULL);
    double cpu = register_names(N, &sys, NULL, NULL);
    double q = register_names(N / 4, &quarter_sys, NULL, NULL);
    double c = register_names(N, &sys, &m, &l);
    quarter = q < quarter ? q : quarter;
    cpu = c < cpu ? c : cpu;
    cr_log_info("%d names twice: %.3f s of CPU (%.3f s system), %d: %.3f s (%.3f s); the "
                "first run, onto fresh pages: %.3f s (%.3f s)",
                N, cpu, sys, N / 4, quarter, quarter_sys, warm, warm_sys);
    double floor = quarter > 0.02 ? quarter : 0.02; /* the clock's grain on a fast run */
    cr_expect(cpu < 8 * floor, "registering %d route names took %.2f s of CPU, %d took %.2f s", N,
              cpu, N / 4, quarter);
    /* the same name gives the same series, and a scrape prints them sorted */
    cr_expect_eq(metrics_route(m, "route-000001"), metrics_route(m, "route-000001"));
    size_t len = 0;
    char *text = metrics_render(m, &len);
    cr_assert(text);
    const char *a = strstr(text, "route=\"route-000001\"");
    const char *b = strstr(text, "route=\"route-060000\"");
    cr_expect(a == NULL || b == NULL || a < b, "routes printed in name order");
    free(text);
    live_free(l);
    metrics_free(m);
}

/* limit{limit}: what was installed last, METRICS_LIMIT_KEEP leaving one as it was (a reload
 * does not change max_connections); the waiting gauge and the limit counter sum the workers. */
Test(metrics, limits_and_what_is_held_against_them)
{
    struct metrics *m = metrics_new(2);
    const uint64_t first[METRICS_LIMIT_COUNT] = { 10, 20, 0 };
    const uint64_t next[METRICS_LIMIT_COUNT] = { METRICS_LIMIT_KEEP, 25, 4096 };
    metrics_limits(m, first);
    metrics_limits(m, next);
    atomic_store(metrics_upstream_waiting(m, 0), 2);
    atomic_store(metrics_upstream_waiting(m, 1), 3);
    cr_expect_null(metrics_upstream_waiting(m, 2));
    metrics_connections_limited(m, 1);
    metrics_connections_limited(m, 0);
    metrics_connections_limited(m, 7); /* no such worker: not counted */
    atomic_uint_fast64_t held = 777;
    metrics_set_body_bytes(m, &held);
    char *t = render(m);
    EXPECT_LINES(t, "retryproxy_limit{limit=\"max_connections\"} 10",
                 "retryproxy_limit{limit=\"max_upstream_requests\"} 25",
                 "retryproxy_limit{limit=\"max_buffered_body_bytes\"} 4096",
                 "retryproxy_upstream_requests_waiting 5",
                 "retryproxy_connections_limit_reached_total 2",
                 "retryproxy_buffered_body_bytes 777");
    free(t);
    metrics_free(m);
}
