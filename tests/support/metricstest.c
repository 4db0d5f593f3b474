/* metricstest -- what the suites of the metrics registry (tests/unit/test_metrics*.c) share:
 * readers over the rendered exposition text and the families every registry exports. Plain C
 * but mt_render() and the expect macros (Criterion), so that the concurrency scenario also
 * builds under ThreadSanitizer (test_metrics_load.c). */
#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/metricstest.h"

char *mt_render(struct metrics *m)
{
    size_t len = 0;
    char *text = metrics_render(m, &len);
    cr_assert_not_null(text, "metrics_render returned NULL");
    cr_assert_eq(len, strlen(text), "reported length %zu, text length %zu", len, strlen(text));
    cr_assert(len == 0 || text[len - 1] == '\n', "exposition does not end with a newline");
    return text;
}

/* Whether 'line' is one whole line of 'text'. */
bool mt_has_line(const char *text, const char *line)
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
const char *mt_find_series(const char *text, const char *series)
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
long long mt_value_of(const char *text, const char *series)
{
    const char *p = mt_find_series(text, series);
    if (!p)
        return -1;
    return strtoll(p + strlen(series) + 1, NULL, 10);
}

/* Lines that start with 'prefix'. */
size_t mt_count_lines(const char *text, const char *prefix)
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

/* expect_line() for each of 'lines'. */
void mt_expect_lines(const char *text, const char *const *lines, size_t n)
{
    for (size_t i = 0; i < n; i++)
        expect_line(text, lines[i]);
}

const struct mt_family mt_families[] = {
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
const size_t mt_nfamilies = sizeof(mt_families) / sizeof(mt_families[0]);
