/* The metrics registry (proxy/telemetry/metrics.h): what is read at a scrape (the upstreams'
 * health, the budgets, retries in flight, the limits and what is held against them), bad
 * arguments, and a populated exposition's structure, also against promtool. */
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
    char *t = mt_render(m);
    cr_expect(!strstr(t, "upstream=\""), "no source: no upstream series");
    free(t);
    metrics_set_upstreams(m, fake_upstreams, &calls);
    t = mt_render(m);
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
    cr_expect_eq(mt_count_lines(t, "retryproxy_upstream_eject"), 6, "route n has no ejection");
    cr_expect_eq(mt_count_lines(t, "retryproxy_upstream_endpoints{"), 12, "three states each");
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
    char *t = mt_render(m);
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
    cr_expect_eq(mt_count_lines(t, "retryproxy_budget_"), 9);
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
    t = mt_render(m);
    EXPECT_LINES(t, "retryproxy_budget_retry_ratio{scope=\"process\"} 0.123456789",
                 "retryproxy_budget_max_concurrent_retries{scope=\"process\"} +Inf",
                 "retryproxy_budget_min_retries_per_second{scope=\"process\"} 3",
                 "retryproxy_budget_retry_ratio{route=\"b/v1\",scope=\"route\"} 1.5",
                 "retryproxy_budget_min_retries_per_second{route=\"b/v1\",scope=\"route\"} 0",
                 "retryproxy_budget_max_concurrent_retries{route=\"b/v1\",scope=\"route\"} 5",
                 "retryproxy_budget_retry_ratio{route=\"a\",scope=\"route\"} 0");
    cr_expect_eq(mt_count_lines(t, "retryproxy_budget_"), 9);
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
    char *t = mt_render(m);
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

    char *t = mt_render(m);
    cr_expect_eq(mt_count_lines(t, "retryproxy_requests_total{"), 0);
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
    cr_expect_gt(lines, mt_nfamilies * 2);
}

Test(metrics, exposition_passes_promtool)
{
    struct metrics *m = populated();
    char *t = mt_render(m);
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
    char *t = mt_render(m);
    EXPECT_LINES(t, "retryproxy_limit{limit=\"max_connections\"} 10",
                 "retryproxy_limit{limit=\"max_upstream_requests\"} 25",
                 "retryproxy_limit{limit=\"max_buffered_body_bytes\"} 4096",
                 "retryproxy_upstream_requests_waiting 5",
                 "retryproxy_connections_limit_reached_total 2",
                 "retryproxy_buffered_body_bytes 777");
    free(t);
    metrics_free(m);
}
