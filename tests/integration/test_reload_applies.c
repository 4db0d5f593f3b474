/* Hot reload (docs/reload.md), end to end: what a new config changes and what waits for a
 * restart (budgets, a request in flight, SIGHUP and POST /reload, the listeners, the header
 * limit, the cap), observed through the admin API and requests to the test upstream
 * (tests/support/reloadtest.h). */
#include "tests/support/reloadtest.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <curl/curl.h>
#include <jansson.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/fixture.h"

TestSuite(reload, .init = rl_setup, .fini = rl_teardown, .timeout = 60);

static void position_of(const char *text, const char *needle, unsigned *line, unsigned *col)
{
    const char *at = strstr(text, needle);
    cr_assert_not_null(at);
    *line = 1;
    const char *bol = text;
    for (const char *p = text; p < at; p++)
        if (*p == '\n') {
            (*line)++;
            bol = p + 1;
        }
    *col = (unsigned)(at - bol) + 1;
}

static double budget_gauge(const char *setting, const char *scope)
{
    char series[160];
    if (strcmp(scope, "process") == 0)
        snprintf(series, sizeof(series), "retryproxy_budget_%s{scope=\"process\"}", setting);
    else
        snprintf(series, sizeof(series), "retryproxy_budget_%s{route=\"r\",scope=\"route\"}",
                 setting);
    return fx_metric(series);
}

struct budget_want {
    double ratio, min_rps, concurrent;
};

static void expect_budget(const char *scope, struct budget_want w, const char *when)
{
    double ratio = budget_gauge("retry_ratio", scope);
    double min_rps = budget_gauge("min_retries_per_second", scope);
    double concurrent = budget_gauge("max_concurrent_retries", scope);
    cr_expect_eq(ratio, w.ratio, "%s: %s retry_ratio %g, want %g", when, scope, ratio, w.ratio);
    cr_expect_eq(min_rps, w.min_rps, "%s: %s min_retries_per_second %g, want %g", when, scope,
                 min_rps, w.min_rps);
    cr_expect_eq(concurrent, w.concurrent, "%s: %s max_concurrent_retries %g, want %g", when, scope,
                 concurrent, w.concurrent);
}

/* The budget gauges show the config in effect: set at start, set again by a reload that
 * changes them (null is +Inf, an omitted key its default), left alone by a refused file. */
Test(reload, budget_gauges_follow_the_config_in_effect)
{
    char text[2048];
    cfg_text(
        text, sizeof(text), 3, 20, "base_ms",
        "\"budget\": {\"retry_ratio\": 0.5, \"min_retries_per_second\": 2, "
        "\"max_concurrent_retries\": 7},\n"
        "  \"defaults\": {\"budget\": {\"retry_ratio\": 0.25, \"max_concurrent_retries\": 3}},");
    write_in_place(rl_cfg_path, text, strlen(text));
    rl_launch(true);
    expect_budget("process", (struct budget_want){ 0.5, 2, 7 }, "at start");
    expect_budget("route", (struct budget_want){ 0.25, 10, 3 }, "at start");

    cfg_text(text, sizeof(text), 3, 20, "base_ms",
             "\"budget\": {\"retry_ratio\": 0.1, \"max_concurrent_retries\": null},\n"
             "  \"defaults\": {\"budget\": {\"retry_ratio\": 1.5, "
             "\"min_retries_per_second\": 0.5}},");
    int64_t t0 = now_ms();
    write_renamed(rl_cfg_path, text);
    cr_assert_geq(wait_config(t0, 2, -1, VISIBLE_MS), 0, "the new budgets were not applied");
    expect_budget("process", (struct budget_want){ 0.1, 10, INFINITY }, "after the reload");
    expect_budget("route", (struct budget_want){ 1.5, 0.5, INFINITY }, "after the reload");

    /* a refused file changes nothing: the gauges are the config served, not the file */
    cfg_text(text, sizeof(text), 3, 20, "base_ms",
             "\"budget\": {\"retry_ratio\": 0.9, \"max_concurrent_retries\": 1},\n"
             "  \"defaults\": {\"budget\": {\"retry_ratio\": -1}},");
    t0 = now_ms();
    write_renamed(rl_cfg_path, text);
    cr_assert_geq(rl_wait_metric(t0, FAILURES, 1, VISIBLE_MS), 0,
                  "the invalid budget was not refused");
    cr_expect_eq(fx_metric(LAST_OK), 0);
    expect_budget("process", (struct budget_want){ 0.1, 10, INFINITY }, "after a refused file");
    expect_budget("route", (struct budget_want){ 1.5, 0.5, INFINITY }, "after a refused file");
}

Test(reload, request_in_flight_keeps_the_policy_it_started_with)
{
    rl_start(3, 800);
    char url[128];
    http_call_start(&rl_flight, px_url(px, "/x", url, sizeof(url)), "inflight",
                    "fail=2;status=503");
    cr_assert_eq(tup_wait_count(up, 1, 5000), 0, "the first attempt never arrived");

    char text[2048];
    cfg_simple(text, sizeof(text), 1, 10);
    int64_t t0 = now_ms();
    write_renamed(rl_cfg_path, text);
    int64_t lat = wait_config(t0, 2, 10, VISIBLE_MS);
    cr_log_info("reload during an 800 ms backoff: visible after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "the new config was not applied within %d ms", VISIBLE_MS);
    /* Otherwise the reload did not happen while the request was waiting, and proves nothing. */
    cr_assert_eq(tup_count_id(up, "inflight"), 1, "the reload came too late to overlap");

    /* A new request, while the old one still waits, gets the new snapshot. */
    expect_max_attempts("new", 1);

    http_call_join(&rl_flight);
    char v[32];
    cr_assert_eq(rl_flight.r.rc, 0, "in-rl_flight request: curl error %d", rl_flight.r.rc);
    cr_expect_eq(rl_flight.r.status, 200, "in-rl_flight request ended %ld", rl_flight.r.status);
    const char *a = http_header(&rl_flight.r, "X-Retry-Attempts", v, sizeof(v));
    cr_expect(a && strcmp(a, "3") == 0, "in-rl_flight request: X-Retry-Attempts %s, want 3",
              a ? a : "(none)");
    cr_expect_eq(tup_count_id(up, "inflight"), 3);

    /* And its waits are the old policy's 800 ms, not the new 10 ms. */
    int64_t at[4] = { 0 };
    for (size_t i = 0; i < tup_count(up); i++) {
        const struct tup_req *q = tup_get(up, i);
        if (strcmp(q->request_id, "inflight") == 0 && q->key_attempt <= 3)
            at[q->key_attempt] = q->arrival_ns;
    }
    for (int k = 2; k <= 3; k++) {
        int64_t gap = (at[k] - at[k - 1]) / 1000000;
        cr_expect(at[k] && gap >= 780,
                  "in-rl_flight retry %d came %lld ms after the previous "
                  "attempt, want the old 800 ms backoff",
                  k - 1, (long long)gap);
    }
}

Test(reload, sighup_and_post_reload_force_a_reload)
{
    rl_start(3, 20);
    cr_assert_eq(kill(px->pid, SIGHUP), 0);
    int64_t t0 = now_ms();
    int64_t lat = wait_config(t0, 2, -1, VISIBLE_MS);
    cr_log_info("SIGHUP: generation 2 after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "SIGHUP with unchanged content did not publish generation 2");
    cr_expect_eq(generation_now(), 2);

    long status;
    json_t *j = fx_admin_json("POST", "/reload", &status);
    cr_expect_eq(status, 200, "POST /reload: %ld", status);
    cr_expect_eq(json_integer_value(json_object_get(j, "generation")), 3,
                 "POST /reload answers the new generation");
    json_decref(j);
    cr_expect_eq(generation_now(), 3);
    cr_expect_eq(fx_metric(FAILURES), 0);

    char bad[2048];
    cfg_text(bad, sizeof(bad), 1, 40, "bsae_ms", "");
    t0 = now_ms();
    write_in_place(rl_cfg_path, bad, strlen(bad));
    /* Let the watch's own attempt finish first, so that the 422 below is POST's. */
    cr_assert_geq(rl_wait_metric(t0, FAILURES, 1, VISIBLE_MS), 0,
                  "the invalid write went unnoticed");
    j = fx_admin_json("POST", "/reload", &status);
    cr_expect_eq(status, 422, "POST /reload of an invalid file: %ld", status);
    cr_expect_eq(json_integer_value(json_object_get(j, "generation")), 3);
    json_t *errs = json_object_get(j, "errors");
    cr_assert(json_is_array(errs) && json_array_size(errs) >= 1, "no errors array");
    const char *first = json_string_value(json_array_get(errs, 0));
    cr_assert_not_null(first, "errors[0] is not a string");

    /* FILE:LINE:COL: $.path: message, the position being the typo key's opening quote. */
    unsigned line, col;
    position_of(bad, "\"bsae_ms\"", &line, &col);
    char want[512];
    snprintf(want, sizeof(want), "%s:%u:%u: $.routes[0].retry.backoff.bsae_ms: ", rl_cfg_path, line,
             col);
    cr_expect(strncmp(first, want, strlen(want)) == 0, "errors[0] is '%s', want '%s<message>'",
              first, want);
    cr_expect_gt(strlen(first), strlen(want), "errors[0] has no message: %s", first);
    json_decref(j);
    cr_expect_eq(generation_now(), 3, "a refused forced reload publishes nothing");
    cr_expect_eq(fx_metric(FAILURES), 2, "the forced attempt is a failed reload too");
    expect_max_attempts("still", 3);
}

/* True if something accepts TCP connections on 127.0.0.1:'port'. */
static bool listening(unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(fd);
    return ok;
}

Test(reload, listen_change_is_reported_and_the_rest_applies)
{
    static const char top[] = "\"listen\": \"127.0.0.1:0\", \"admin\": \"127.0.0.1:0\",";
    char text[2048];
    cfg_text(text, sizeof(text), 3, 20, "base_ms", top);
    write_in_place(rl_cfg_path, text, strlen(text));
    rl_launch(false);
    json_t *c = rl_get_config();
    cr_assert_eq(generation_of(c), 1);
    json_t *rr = json_object_get(c, "restart_required");
    cr_assert(json_is_array(rr), "/config has no restart_required array");
    cr_expect_eq(json_array_size(rr), 0, "nothing needs a restart yet");
    json_decref(c);

    static const char moved[] = "\"listen\": \"127.0.0.1:1\", \"admin\": \"127.0.0.1:0\",";
    cfg_text(text, sizeof(text), 1, 40, "base_ms", moved);
    int64_t t0 = now_ms();
    write_renamed(rl_cfg_path, text);
    int64_t lat = wait_config(t0, 2, 40, VISIBLE_MS);
    cr_log_info("listen change: the rest applied after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "base_ms change next to a listen change not applied within %d ms",
              VISIBLE_MS);
    c = rl_get_config();
    rr = json_object_get(c, "restart_required");
    cr_assert(json_is_array(rr));
    cr_expect_eq(json_array_size(rr), 1, "only listen changed");
    cr_expect_str_eq(json_string_value(json_array_get(rr, 0)), "listen");
    /* the config in force names the address still served, not the file's new one */
    char bound[64];
    snprintf(bound, sizeof(bound), "127.0.0.1:%u", (unsigned)px->port);
    cr_expect_str_eq(json_str(json_object_get(c, "config"), "listen"), bound);
    char err[4096];
    cr_expect_null(last_error_of(c, err, sizeof(err)), "a restart-only change is an error: %s",
                   err);
    json_decref(c);

    long status;
    cr_expect_eq(rl_attempts("same-port", "", &status), 1);
    cr_expect_eq(status, 200, "the original listener stopped serving");
    expect_max_attempts("new-policy", 1);
    cr_expect_not(listening(1), "the proxy bound the new listen address without a restart");
}

/* The listeners from the file, on free ports: without them the defaults, 127.0.0.1:15001
 * and :15000, which any other retryproxy on the machine (make run, another suite) may hold
 * (issue 37: the suite failed once with four other jobs running, exit 3 at start-up) */
#define FREE_PORTS "\"listen\": \"127.0.0.1:0\", \"admin\": \"127.0.0.1:0\", "

/* libmicrohttpd's per-connection memory is sized from limits.max_header_bytes when the daemon
 * starts: a change waits for a restart, and says so; the rest of the file applies. */
Test(reload, header_limit_change_needs_a_restart)
{
    char text[2048];
    cfg_text(text, sizeof(text), 3, 20, "base_ms",
             FREE_PORTS "\"limits\": {\"max_header_bytes\": 8192},");
    write_in_place(rl_cfg_path, text, strlen(text));
    rl_launch(false);
    cfg_text(text, sizeof(text), 1, 40, "base_ms",
             FREE_PORTS "\"limits\": {\"max_header_bytes\": 16384},");
    int64_t t0 = now_ms();
    write_renamed(rl_cfg_path, text);
    cr_assert(wait_config(t0, 2, 40, VISIBLE_MS) >= 0, "the rest of the change was not applied");
    json_t *c = rl_get_config();
    json_t *rr = json_object_get(c, "restart_required");
    cr_assert(json_is_array(rr));
    cr_expect_eq(json_array_size(rr), 1);
    cr_expect_str_eq(json_string_value(json_array_get(rr, 0)), "limits.max_header_bytes");
    json_t *limits = json_object_get(json_object_get(c, "config"), "limits");
    cr_expect_eq(json_integer_value(json_object_get(limits, "max_header_bytes")), 8192,
                 "the config in force holds the value read at start until a restart");
    json_decref(c);
    expect_max_attempts("header-limit", 1);
}

/* restart_required as a list of strings. */
static void restart_required(char *buf, size_t cap)
{
    json_t *c = rl_get_config();
    json_t *rr = json_object_get(c, "restart_required");
    cr_assert(json_is_array(rr), "/config has no restart_required array");
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < json_array_size(rr); i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? "," : "",
                              json_string_value(json_array_get(rr, i)));
    json_decref(c);
}

/* Which keys wait for a restart is read from the schema table: a file that moves both
 * listeners and changes every limit reports the two connection limits, in the reference's
 * order, but not the listeners the command line set (the file's values were never in force)
 * nor limits.max_upstream_requests (read again on reload); putting the start values back
 * clears the list. */
Test(reload, restart_required_lists_the_schemas_start_only_keys_not_pinned_ones)
{
    char text[2048];
    cfg_text(text, sizeof(text), 3, 20, "base_ms",
             "\"limits\": {\"max_connections\": 100, \"max_header_bytes\": 8192},");
    write_in_place(rl_cfg_path, text, strlen(text));
    rl_launch(true);
    char rr[256];
    restart_required(rr, sizeof(rr));
    cr_expect_str_eq(rr, "", "nothing needs a restart yet");

    cfg_text(text, sizeof(text), 1, 40, "base_ms",
             "\"listen\": \"127.0.0.1:1\", \"admin\": \"127.0.0.1:2\", \"limits\": "
             "{\"max_connections\": 200, \"max_header_bytes\": 16384, "
             "\"max_upstream_requests\": 7},");
    int64_t t0 = now_ms();
    write_renamed(rl_cfg_path, text);
    cr_assert(wait_config(t0, 2, 40, VISIBLE_MS) >= 0, "the rest of the change was not applied");
    restart_required(rr, sizeof(rr));
    cr_expect_str_eq(rr, "limits.max_connections,limits.max_header_bytes");
    expect_max_attempts("restart-keys", 1);

    cfg_text(text, sizeof(text), 1, 50, "base_ms",
             "\"listen\": \"127.0.0.1:1\", \"admin\": \"127.0.0.1:2\", \"limits\": "
             "{\"max_connections\": 100, \"max_header_bytes\": 8192, "
             "\"max_upstream_requests\": 7},");
    t0 = now_ms();
    write_renamed(rl_cfg_path, text);
    cr_assert(wait_config(t0, 3, 50, VISIBLE_MS) >= 0, "the change back was not applied");
    restart_required(rr, sizeof(rr));
    cr_expect_str_eq(rr, "", "the start values are back: nothing waits for a restart");
}

static void cfg_capped(char *buf, size_t cap, int cap_ms)
{
    int n =
        snprintf(buf, cap,
                 "{\"routes\": [{\"name\": \"r\", \"upstreams\": [\"http://127.0.0.1:%u\"],\n"
                 "  \"retry\": {\"max_attempts\": 3, \"backoff\": {\"policy\": \"exponential\","
                 " \"base_ms\": 100, \"factor\": 4, \"cap_ms\": %d, \"jitter\": \"none\"}}}]}\n",
                 tup_port(up), cap_ms);
    cr_assert(n > 0 && (size_t)n < cap);
}

Test(reload, cap_ms_change_shows_in_schedule_and_metrics_within_a_second)
{
    char text[1024];
    long d1, d2, status;
    cfg_capped(text, sizeof(text), 100);
    write_in_place(rl_cfg_path, text, strlen(text));
    rl_launch(true);
    schedule2(&d1, &d2);
    cr_assert(d1 == 100 && d2 == 100, "cap 100: /schedule gives %ld %ld", d1, d2);
    cr_assert_eq(rl_attempts("cap-before", "fail=2", &status), 3);
    cr_assert_eq(status, 200);
    cr_expect_eq(fx_metric("retryproxy_backoff_seconds_count{route=\"r\"}"), 2);
    double sum = fx_metric("retryproxy_backoff_seconds_sum{route=\"r\"}");
    cr_expect(fabs(sum - 0.2) < 1e-9, "backoff_seconds_sum %g after waits of 100 and 100", sum);

    cfg_capped(text, sizeof(text), 400);
    int64_t t0 = now_ms(), lat = -1;
    write_renamed(rl_cfg_path, text);
    while (now_ms() - t0 <= VISIBLE_MS) {
        schedule2(&d1, &d2);
        if (d2 == 400) {
            lat = now_ms() - t0;
            break;
        }
        sleep_ms(20);
    }
    cr_log_info("cap_ms 100 -> 400: /schedule changed after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "/schedule still gives %ld %ld %d ms after the write", d1, d2, VISIBLE_MS);
    cr_expect_eq(d1, 100);

    cr_assert_eq(rl_attempts("cap-after", "fail=2", &status), 3);
    cr_assert_eq(status, 200);
    cr_expect_eq(fx_metric("retryproxy_backoff_seconds_count{route=\"r\"}"), 4);
    sum = fx_metric("retryproxy_backoff_seconds_sum{route=\"r\"}");
    cr_expect(fabs(sum - 0.7) < 1e-9, "backoff_seconds_sum %g, want 0.2 + 0.1 + 0.4", sum);
}
