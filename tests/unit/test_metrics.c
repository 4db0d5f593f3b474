/* The metrics registry (proxy/telemetry/metrics.h) rendered: exact lines of known scenarios,
 * attempts by upstream, slots summed across workers, histograms, series and their labels,
 * reasons, routes, every family of an empty registry, reloads and draining.
 * test_metrics_sources.c has the upstreams, budgets and limits read at a scrape and the
 * exposition against promtool, test_metrics_load.c writers and a scraper at once and many
 * route names; what they share is tests/support/metricstest. */
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
#include "tests/support/metricstest.h"

static const char *const outcomes[] = { "1xx",   "2xx",     "3xx",
                                        "4xx",   "5xx",     "connect_failure",
                                        "reset", "timeout", "cancelled" };
static const char *const denied[] = { "max-attempts", "budget",        "concurrency",    "deadline",
                                      "retry-after",  "not-retryable", "body-too-large", "draining",
                                      "pushback",     "throttled" };
static const char *const le[] = { "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01",
                                  "0.025",  "0.05",    "0.1",    "0.25",  "0.5",    "1",     "2.5",
                                  "5",      "10",      "30",     "60",    "+Inf" };

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

    char *t = mt_render(m);
    EXPECT_LINES(t, "retryproxy_requests_total{route=\"r\",code=\"200\"} 1",
                 "retryproxy_attempts_total{route=\"r\",upstream=\"http://u:1\",outcome=\"5xx\"} 2",
                 "retryproxy_attempts_total{route=\"r\",upstream=\"http://u:1\",outcome=\"2xx\"} 1",
                 "retryproxy_attempt_duration_seconds_count{route=\"r\",upstream=\"http://u:1\"} 3",
                 "retryproxy_retries_total{route=\"r\",reason=\"gateway-error\"} 2",
                 "retryproxy_retry_success_total{route=\"r\"} 1",
                 "retryproxy_retry_after_honored_total{route=\"r\"} 0");
    /* Only the code seen, and only the reason registered. */
    cr_expect_eq(mt_count_lines(t, "retryproxy_requests_total{"), 1);
    cr_expect_eq(mt_count_lines(t, "retryproxy_retries_total{"), 1);

    /* All eight outcomes, zeros included, in contract order. */
    const char *prev = t;
    for (size_t i = 0; i < 8; i++) {
        char series[128];
        snprintf(series, sizeof(series),
                 "retryproxy_attempts_total{route=\"r\",upstream=\"http://u:1\",outcome=\"%s\"}",
                 outcomes[i]);
        const char *at = mt_find_series(t, series);
        cr_expect_not_null(at, "missing %s", series);
        cr_expect(at == NULL || at > prev, "%s out of order", series);
        if (at)
            prev = at;
        long long want = i == 4 ? 2 : i == 1 ? 1 : 0;
        cr_expect_eq(mt_value_of(t, series), want, "%s = %lld", series, mt_value_of(t, series));
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
    char *t = mt_render(m);
    EXPECT_LINES(
        t, "retryproxy_attempts_total{route=\"r\",upstream=\"http://a:1/\",outcome=\"2xx\"} 1",
        "retryproxy_attempts_total{route=\"r\",upstream=\"http://a:1/\",outcome=\"timeout\"} 0",
        "retryproxy_attempts_total{route=\"r\",upstream=\"http://b:2\",outcome=\"timeout\"} 2",
        "retryproxy_attempts_total{route=\"o\",upstream=\"http://b:2\",outcome=\"timeout\"} 0",
        "retryproxy_attempt_duration_seconds_sum{route=\"r\",upstream=\"http://a:1/\"} 0.002000",
        "retryproxy_attempt_duration_seconds_count{route=\"r\",upstream=\"http://b:2\"} 2",
        "retryproxy_attempt_duration_seconds_sum{route=\"r\",upstream=\"http://b:2\"} 2.000000");
    /* nine outcomes for each of the three pairs, none by route alone */
    cr_expect_eq(mt_count_lines(t, "retryproxy_attempts_total{"), 27);
    cr_expect_eq(mt_count_lines(t, "retryproxy_attempts_total{route=\"r\",outcome"), 0);
    const char *first = mt_find_series(
        t, "retryproxy_attempts_total{route=\"r\",upstream=\"http://a:1/\",outcome=\"1xx\"}");
    const char *second = mt_find_series(
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

    char *t = mt_render(m);
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
    char *t = mt_render(m);
    EXPECT_LINES(t, "retryproxy_requests_total{route=\"wide\",code=\"204\"} 256",
                 "retryproxy_request_duration_seconds_bucket{route=\"wide\",le=\"0.5\"} 0",
                 "retryproxy_request_duration_seconds_bucket{route=\"wide\",le=\"1\"} 256",
                 "retryproxy_request_duration_seconds_sum{route=\"wide\"} 256.000000",
                 "retryproxy_connections_active 511");
    free(t);
    metrics_free(m);
}

/* ---- real concurrency: one writer per slot, a scraper alongside ---- */

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
    char *t = mt_render(m);
    const char *prev = t;
    for (size_t i = 0; i < 19; i++) {
        char series[128];
        snprintf(series, sizeof(series),
                 "retryproxy_request_duration_seconds_bucket{route=\"h\",le=\"%s\"}", le[i]);
        const char *at = mt_find_series(t, series);
        cr_expect_not_null(at, "missing %s", series);
        cr_expect(at == NULL || at > prev, "%s out of order", series);
        if (at)
            prev = at;
        cr_expect_eq(mt_value_of(t, series), want[i], "%s = %lld, want %lld", series,
                     mt_value_of(t, series), want[i]);
    }
    expect_line(t, "retryproxy_request_duration_seconds_sum{route=\"h\"} 100.204150");
    expect_line(t, "retryproxy_request_duration_seconds_count{route=\"h\"} 6");
    cr_expect_eq(mt_count_lines(t, "retryproxy_request_duration_seconds_bucket{route=\"h\""), 19);
    /* The other histogram of the route is there, empty; no upstream: no attempt series. */
    EXPECT_LINES(t, "retryproxy_backoff_seconds_bucket{route=\"h\",le=\"+Inf\"} 0",
                 "retryproxy_backoff_seconds_sum{route=\"h\"} 0.000000");
    cr_expect_eq(mt_count_lines(t, "retryproxy_attempt_duration_seconds_bucket{"), 0);
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
    char *t = mt_render(m);
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
    char *t = mt_render(m);
    /* Every registered reason renders, zeros included, in registration order. */
    const char *g =
        mt_find_series(t, "retryproxy_retries_total{route=\"r\",reason=\"gateway-error\"}");
    const char *q = mt_find_series(t, "retryproxy_retries_total{route=\"r\",reason=\"429\"}");
    const char *c =
        mt_find_series(t, "retryproxy_retries_total{route=\"r\",reason=\"connect-failure\"}");
    cr_expect(g && q && c && g < q && q < c, "registered reasons missing or out of order");
    expect_line(t, "retryproxy_retries_total{route=\"r\",reason=\"429\"} 1");
    expect_line(t, "retryproxy_retries_total{route=\"s\",reason=\"connect-failure\"} 0");
    cr_expect_eq(mt_count_lines(t, "retryproxy_retries_total{route=\"r\""), 3);
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
    char *t = mt_render(m);
    EXPECT_LINES(t, "retryproxy_retries_total{route=\"r\",reason=\"other\"} 2",
                 "retryproxy_retries_total{route=\"r\",reason=\"tok5\"} 1",
                 "retryproxy_retries_total{route=\"r\",reason=\"tok30\"} 0");
    cr_expect(!strstr(t, "one-too-many"));
    cr_expect_eq(mt_count_lines(t, "retryproxy_retries_total{route=\"r\""), METRICS_MAX_REASONS);
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
    char *t = mt_render(m);
    expect_line(t, "retryproxy_retries_total{route=\"r\",reason=\"other\"} 1");
    cr_expect_eq(mt_count_lines(t, "retryproxy_retries_total{route=\"r\",reason=\"other\"}"), 1);
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
    char *t = mt_render(m);
    const char *prev = t;
    for (size_t i = 0; i < METRICS_DENIED_COUNT; i++) {
        char series[128];
        snprintf(series, sizeof(series),
                 "retryproxy_retries_denied_total{route=\"d\",reason=\"%s\"}", denied[i]);
        const char *at = mt_find_series(t, series);
        cr_expect(at && at > prev, "%s missing or out of order", series);
        if (at)
            prev = at;
        long long want = i == METRICS_DENIED_DEADLINE ? 1 : i == METRICS_DENIED_DRAINING ? 2 : 0;
        cr_expect_eq(mt_value_of(t, series), want);
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
    char *t = mt_render(m);
    const char *a = mt_find_series(t, "retryproxy_retry_success_total{route=\"alpha\"}");
    const char *b = mt_find_series(t, "retryproxy_retry_success_total{route=\"bravo\"}");
    const char *c = mt_find_series(t, "retryproxy_retry_success_total{route=\"charlie\"}");
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
    char *t = mt_render(m);
    const char *c100 = mt_find_series(t, "retryproxy_requests_total{route=\"c\",code=\"100\"}");
    const char *c504 = mt_find_series(t, "retryproxy_requests_total{route=\"c\",code=\"504\"}");
    const char *c599 = mt_find_series(t, "retryproxy_requests_total{route=\"c\",code=\"599\"}");
    cr_expect(c100 && c504 && c599 && c100 < c504 && c504 < c599, "codes missing or unsorted");
    cr_expect_eq(mt_count_lines(t, "retryproxy_requests_total{"), 3);
    free(t);
    metrics_free(m);
}

Test(metrics, unmatched_route_renders_once_counted)
{
    struct metrics *m = metrics_new(1);
    struct metrics_route *none = metrics_route(m, "");
    metrics_route(m, "a");
    char *t = mt_render(m);
    cr_expect(!strstr(t, "route=\"\""), "route=\"\" rendered without counts");
    free(t);

    metrics_request(none, 0, 404);
    t = mt_render(m);
    EXPECT_LINES(t, "retryproxy_requests_total{route=\"\",code=\"404\"} 1",
                 "retryproxy_backoff_seconds_count{route=\"\"} 0",
                 "retryproxy_request_duration_seconds_count{route=\"\"} 0");
    /* "" sorts before every other name. */
    const char *e = mt_find_series(t, "retryproxy_retry_success_total{route=\"\"}");
    const char *a = mt_find_series(t, "retryproxy_retry_success_total{route=\"a\"}");
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
    char *t = mt_render(m);
    EXPECT_LINES(t, "retryproxy_requests_total{route=\"a\\\"b\\\\c\\nd\",code=\"200\"} 1",
                 "retryproxy_retry_success_total{route=\"a\\\"b\\\\c\\nd\"} 0",
                 "retryproxy_retries_total{route=\"a\\\"b\\\\c\\nd\",reason=\"x\\\"y\"} 1",
                 "retryproxy_backoff_seconds_bucket{route=\"a\\\"b\\\\c\\nd\",le=\"+Inf\"} 0");
    /* The raw newline never reaches the output: no line starts with the rest of the name. */
    cr_expect_eq(mt_count_lines(t, "d\""), 0);
    free(t);
    metrics_free(m);
}

Test(metrics, empty_registry_has_every_family)
{
    struct metrics *m = metrics_new(1);
    char *t = mt_render(m);
    const char *prev = t;
    for (size_t i = 0; i < mt_nfamilies; i++) {
        char help[128], type[128];
        const char *prefix = strncmp(mt_families[i].name, "process_", 8) ? "retryproxy_" : "";
        snprintf(help, sizeof(help), "# HELP %s%s ", prefix, mt_families[i].name);
        snprintf(type, sizeof(type), "# TYPE %s%s %s", prefix, mt_families[i].name,
                 mt_families[i].type);
        cr_expect_eq(mt_count_lines(t, help), 1, "no single %s", help);
        expect_line(t, type);
        /* In the order of the contract's table, HELP right before TYPE. */
        const char *h = strstr(t, help);
        const char *ty = strstr(t, type);
        cr_expect(h && ty && h >= prev && strchr(h, '\n') + 1 == ty, "%s misplaced",
                  mt_families[i].name);
        if (ty)
            prev = ty;
    }
    cr_expect_eq(mt_count_lines(t, "# TYPE "), mt_nfamilies);
    EXPECT_LINES(t, "retryproxy_retries_in_flight 0",
                 "retryproxy_config_reloads_total{result=\"success\"} 0",
                 "retryproxy_config_reloads_total{result=\"failure\"} 0",
                 "retryproxy_config_generation 0",
                 "retryproxy_config_last_reload_success_timestamp_seconds 0.000",
                 "retryproxy_config_last_reload_successful 0", "retryproxy_connections_active 0",
                 "retryproxy_draining 0", "retryproxy_upstream_requests_waiting 0",
                 "retryproxy_connections_limit_reached_total 0");
    /* the version is the one --version prints; no limit nor held bytes before they are set */
    cr_expect_eq(mt_count_lines(t, "retryproxy_build_info{version=\"" RETRYPROXY_VERSION "\"} 1"),
                 1);
    cr_expect_eq(mt_count_lines(t, "retryproxy_limit{"), 0);
    cr_expect_eq(mt_count_lines(t, "retryproxy_buffered_body_bytes "), 0);
    cr_expect(!strstr(t, "route="), "an empty registry has no route series");
    cr_expect(!strstr(t, "scope="), "no budget is shown before one is installed");
    free(t);
    metrics_free(m);
}

Test(metrics, reloads_and_generation)
{
    struct metrics *m = metrics_new(1);
    metrics_reload(m, true, 1, 1700000000.25);
    char *t = mt_render(m);
    expect_line(t, "retryproxy_config_last_reload_successful 1"); /* the initial load */
    free(t);
    metrics_reload(m, false, 1, 1700000100.0);
    t = mt_render(m);
    expect_line(t, "retryproxy_config_last_reload_successful 0");
    free(t);
    metrics_reload(m, false, 1, 1700000200.0);
    metrics_reload(m, true, 2, 1700000300.5);
    t = mt_render(m);
    EXPECT_LINES(t, "retryproxy_config_reloads_total{result=\"success\"} 2",
                 "retryproxy_config_reloads_total{result=\"failure\"} 2",
                 "retryproxy_config_generation 2",
                 "retryproxy_config_last_reload_success_timestamp_seconds 1700000300.500",
                 "retryproxy_config_last_reload_successful 1");
    free(t);

    /* A failure leaves the last success time alone, and says the last load failed. */
    metrics_reload(m, false, 2, 1700000400.0);
    t = mt_render(m);
    expect_line(t, "retryproxy_config_reloads_total{result=\"failure\"} 3");
    expect_line(t, "retryproxy_config_last_reload_success_timestamp_seconds 1700000300.500");
    expect_line(t, "retryproxy_config_last_reload_successful 0");
    free(t);
    metrics_free(m);
}

Test(metrics, draining_turns_1_and_stays)
{
    struct metrics *m = metrics_new(1);
    char *t = mt_render(m);
    expect_line(t, "retryproxy_draining 0");
    free(t);
    metrics_set_draining(m);
    metrics_set_draining(m); /* a second signal changes nothing */
    metrics_reload(m, true, 2, 1700000000.0);
    t = mt_render(m);
    expect_line(t, "retryproxy_draining 1");
    cr_expect_eq(mt_count_lines(t, "retryproxy_draining "), 1);
    free(t);
    metrics_free(m);
}
