/* The proxy's metrics end to end (docs/metrics.md): exact counts after a known scenario, the
 * open connections, when a request is counted, and promtool's reading of /metrics; the real
 * binary against the test upstream on 127.0.0.1 (tests/support/admintest.h). */
#include "tests/support/admintest.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <regex.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/promtext.h"

TestSuite(admin, .fini = fx_stop, .timeout = 60);

static void start_scenario(void)
{
    adm_start_with("", "\"match\": {\"path_prefix\": \"/r\"}, \"retry\": {" FAST "}",
                   "{\"name\": \"other\", \"match\": {\"path_prefix\": \"/other\"}, "
                   "\"upstreams\": [\"http://127.0.0.1:1\"]}",
                   NULL, NULL);
}

Test(admin, metrics_exact_after_known_scenario)
{
    start_scenario();
    adm_send_plan("GET", "/r/1", "fail=2;status=503", "m-1", 200);
    char *t = adm_scrape();
    adm_expect_metric(t, "retryproxy_attempts_total", "route=\"r\",outcome=\"5xx\"", 2);
    adm_expect_metric(t, "retryproxy_attempts_total", "route=\"r\",outcome=\"2xx\"", 1);
    adm_expect_metric(t, "retryproxy_attempts_total", "route=\"r\",outcome=\"reset\"", 0);
    adm_expect_metric(t, "retryproxy_retries_total", "route=\"r\",reason=\"gateway-error\"", 2);
    adm_expect_metric(t, "retryproxy_retry_success_total", "route=\"r\"", 1);
    adm_expect_metric(t, "retryproxy_requests_total", "route=\"r\",code=\"200\"", 1);
    adm_expect_metric(t, "retryproxy_backoff_seconds_count", "route=\"r\"", 2);
    adm_expect_metric(t, "retryproxy_attempt_duration_seconds_count", "route=\"r\"", 3);
    adm_expect_metric(t, "retryproxy_request_duration_seconds_count", "route=\"r\"", 1);
    adm_expect_metric(t, "retryproxy_retries_in_flight", "", 0);
    adm_expect_metric(t, "retryproxy_config_generation", "", 1);
    adm_expect_metric(t, "retryproxy_config_reloads_total", "result=\"success\"", 1);
    adm_expect_metric(t, "retryproxy_config_reloads_total", "result=\"failure\"", 0);
    adm_expect_metric(t, "retryproxy_retries_denied_total", "route=\"r\",reason=\"max-attempts\"",
                      0);
    /* waits of 10 and 20 ms */
    double sum = adm_metric(t, "retryproxy_backoff_seconds_sum", "route=\"r\"");
    cr_expect(sum >= 0.029 && sum < 0.5, "backoff_seconds_sum = %g, want about 0.030", sum);
    double ts = adm_metric(t, "retryproxy_config_last_reload_success_timestamp_seconds", "");
    cr_expect(fabs(ts - (double)time(NULL)) < 120, "last reload timestamp %f is not recent", ts);
    adm_expect_metric(t, "retryproxy_config_last_reload_successful", "", 1);
    adm_expect_metric(t, "retryproxy_draining", "", 0);
    /* the budgets of the config: the defaults, a route's without a cap of its own */
    adm_expect_metric(t, "retryproxy_budget_retry_ratio", "scope=\"process\"", 0.2);
    adm_expect_metric(t, "retryproxy_budget_min_retries_per_second", "scope=\"process\"", 10);
    adm_expect_metric(t, "retryproxy_budget_max_concurrent_retries", "scope=\"process\"", 100);
    for (size_t i = 0; i < 2; i++) {
        char l[64];
        snprintf(l, sizeof(l), "route=\"%s\",scope=\"route\"", i ? "other" : "r");
        adm_expect_metric(t, "retryproxy_budget_retry_ratio", l, 0.2);
        adm_expect_metric(t, "retryproxy_budget_min_retries_per_second", l, 10);
        adm_expect_metric(t, "retryproxy_budget_max_concurrent_retries", l, INFINITY);
    }
    /* none for the requests that matched no route */
    cr_expect(!strstr(t, "retryproxy_budget_retry_ratio{route=\"\""), "a budget for route=\"\"");
    /* every family of the contract, with its type */
    static const char *const types[] = {
        "requests_total counter",
        "attempts_total counter",
        "retries_total counter",
        "retry_success_total counter",
        "retries_denied_total counter",
        "retries_in_flight gauge",
        "retry_after_honored_total counter",
        "throttled_total counter",
        "backoff_seconds histogram",
        "attempt_duration_seconds histogram",
        "request_duration_seconds histogram",
        "config_reloads_total counter",
        "config_generation gauge",
        "config_last_reload_success_timestamp_seconds gauge",
        "config_last_reload_successful gauge",
        "budget_retry_ratio gauge",
        "budget_min_retries_per_second gauge",
        "budget_max_concurrent_retries gauge",
        "connections_active gauge",
        "draining gauge",
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        char line[128];
        snprintf(line, sizeof(line), "# TYPE retryproxy_%s\n", types[i]);
        cr_expect(strstr(t, line), "missing: %s", line);
    }
    free(t);

    /* a POST is not retried once sent: the 503 goes back as it is */
    adm_send_plan("POST", "/r/2", "fail=1;status=503", "m-post", 503);
    t = adm_scrape();
    adm_expect_metric(t, "retryproxy_retries_denied_total", "route=\"r\",reason=\"not-retryable\"",
                      1);
    adm_expect_metric(t, "retryproxy_requests_total", "route=\"r\",code=\"503\"", 1);
    adm_expect_metric(t, "retryproxy_requests_total", "route=\"r\",code=\"200\"", 1);
    adm_expect_metric(t, "retryproxy_attempts_total", "route=\"r\",outcome=\"5xx\"", 3);
    adm_expect_metric(t, "retryproxy_retries_total", "route=\"r\",reason=\"gateway-error\"", 2);
    free(t);

    /* Retry-After: 1 replaces the 10 ms backoff */
    adm_send_plan("GET", "/r/3", "fail=1;status=503;retry-after=1", "m-ra", 200);
    t = adm_scrape();
    adm_expect_metric(t, "retryproxy_retry_after_honored_total", "route=\"r\"", 1);
    adm_expect_metric(t, "retryproxy_retries_total", "route=\"r\",reason=\"gateway-error\"", 3);
    adm_expect_metric(t, "retryproxy_backoff_seconds_count", "route=\"r\"", 3);
    sum = adm_metric(t, "retryproxy_backoff_seconds_sum", "route=\"r\"");
    cr_expect(sum >= 1.029 && sum < 1.5, "backoff_seconds_sum = %g, want about 1.030", sum);
    free(t);

    /* a reset before any response byte */
    adm_send_plan("GET", "/r/4", "fail=1;action=reset", "m-reset", 200);
    t = adm_scrape();
    adm_expect_metric(t, "retryproxy_attempts_total", "route=\"r\",outcome=\"reset\"", 1);
    adm_expect_metric(t, "retryproxy_retries_total", "route=\"r\",reason=\"reset\"", 1);
    free(t);

    /* no route matches /elsewhere */
    struct http_resp r = adm_send_req("GET", "/elsewhere", NULL, NULL);
    cr_expect_eq(r.status, 404);
    http_free(&r);
    t = adm_scrape();
    adm_expect_metric(t, "retryproxy_requests_total", "route=\"\",code=\"404\"", 1);

    /* the totals over all five requests */
    adm_expect_metric(t, "retryproxy_requests_total", "route=\"r\",code=\"200\"", 3);
    adm_expect_metric(t, "retryproxy_attempts_total", "route=\"r\",outcome=\"5xx\"", 4);
    adm_expect_metric(t, "retryproxy_attempts_total", "route=\"r\",outcome=\"2xx\"", 3);
    adm_expect_metric(t, "retryproxy_retry_success_total", "route=\"r\"", 3);
    adm_expect_metric(t, "retryproxy_backoff_seconds_count", "route=\"r\"", 4);
    adm_expect_metric(t, "retryproxy_attempt_duration_seconds_count", "route=\"r\"", 8);
    adm_expect_metric(t, "retryproxy_request_duration_seconds_count", "route=\"r\"", 4);
    adm_expect_metric(t, "retryproxy_retries_in_flight", "", 0);
    adm_expect_metric(t, "retryproxy_attempts_total", "route=\"other\",outcome=\"2xx\"", 0);
    free(t);
}

Test(admin, connections_active_follows_open_client_connections)
{
    adm_start("");
    /* a request first, so that its connection (closed by now) must have been counted down */
    struct http_resp r = adm_send_req("GET", "/", NULL, NULL);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    double v = adm_wait_metric("retryproxy_connections_active", "", 0, ADM_SETTLE_MS);
    cr_expect_eq(v, 0, "connections_active = %g with no client connected", v);

    int held[3];
    for (size_t i = 0; i < 3; i++)
        held[i] = fx_hold(adm_connect_proxy());
    v = adm_wait_metric("retryproxy_connections_active", "", 3, ADM_SETTLE_MS);
    cr_expect_eq(v, 3, "connections_active = %g with 3 idle client connections open", v);

    for (size_t i = 0; i < 3; i++) {
        fx_release(held[i]);
        close(held[i]);
    }
    v = adm_wait_metric("retryproxy_connections_active", "", 0, ADM_SETTLE_MS);
    cr_expect_eq(v, 0, "connections_active = %g 2 s after the 3 connections closed", v);
}

/* Pins the proxy's worker threads and this test to one CPU and its main thread (the control
 * loop, which serves the admin port) to another: a client sharing a core with the worker that
 * answers it, as a sidecar and its service often do. Under this placement a count made after
 * the response is written loses the race to the client's scrape about half the time, where
 * unpinned it does so only now and then. False (nothing pinned) with fewer than two CPUs. */
static bool pin_workers_with_client(void)
{
    cpu_set_t allowed, near, far;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || CPU_COUNT(&allowed) < 2)
        return false;
    int first = -1, second = -1;
    for (int c = 0; c < CPU_SETSIZE && second < 0; c++) {
        if (!CPU_ISSET(c, &allowed))
            continue;
        if (first < 0)
            first = c;
        else
            second = c;
    }
    CPU_ZERO(&near);
    CPU_SET(first, &near);
    CPU_ZERO(&far);
    CPU_SET(second, &far);
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)px->pid);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot list %s", dir);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        pid_t tid = (pid_t)atoi(e->d_name);
        cpu_set_t *set = tid == px->pid ? &far : &near;
        cr_assert_eq(sched_setaffinity(tid, sizeof(*set), set), 0, "pinning thread %d: %s",
                     (int)tid, strerror(errno));
    }
    closedir(d);
    /* Criterion runs each test in its own process: this pins no other test */
    cr_assert_eq(sched_setaffinity(0, sizeof(near), &near), 0);
    return true;
}

/* docs/logs.md: "Metrics for a request are counted by the time its response has been sent". A
 * scrape made right after the client has its whole response must count that request, every
 * time; one round can pass by luck, forty in a row do not. */
Test(admin, request_metrics_are_counted_by_the_time_the_response_is_sent)
{
    adm_start("");
    if (!pin_workers_with_client())
        cr_log_warn("fewer than two CPUs: the race is probed without pinning, less surely");
    int missed = 0, first = 0;
    double seen = 0;
    for (int i = 1; i <= 40; i++) {
        struct http_resp r = adm_send_req("GET", "/", NULL, NULL);
        cr_assert_eq(r.status, 200);
        http_free(&r);
        char *t = adm_scrape();
        double v = adm_metric(t, "retryproxy_requests_total", "route=\"r\",code=\"200\"");
        double d = adm_metric(t, "retryproxy_request_duration_seconds_count", "route=\"r\"");
        free(t);
        if (v != i || d != i) {
            if (!missed++) {
                first = i;
                seen = v;
            }
            /* a late count still has to land, so that the next round sees only its own */
            cr_assert_eq(adm_wait_metric("retryproxy_requests_total", "route=\"r\",code=\"200\"", i,
                                         ADM_SETTLE_MS),
                         i, "request %d was never counted", i);
        }
    }
    cr_expect_eq(missed, 0,
                 "%d of 40 scrapes made just after a complete 200 response did not count it yet "
                 "(first: request %d, requests_total{route=\"r\",code=\"200\"} = %g)",
                 missed, first, seen);
}

Test(admin, promtool_accepts_metrics)
{
    start_scenario();
    /* series in every family: retries, a denial, a reset, a no-route request */
    adm_send_plan("GET", "/r/1", "fail=2;status=503", "p-1", 200);
    adm_send_plan("POST", "/r/2", "fail=1;status=503", "p-post", 503);
    adm_send_plan("GET", "/r/3", "fail=1;action=reset", "p-reset", 200);
    struct http_resp r = adm_send_req("GET", "/elsewhere", NULL, NULL);
    cr_expect_eq(r.status, 404);
    http_free(&r);

    if (fx_sh("command -v promtool >/dev/null 2>&1") != 0) {
        cr_log_warn("promtool is not installed: the Prometheus format check was SKIPPED "
                    "(install Debian's prometheus package to run it)");
        return;
    }
    char dir[] = "/tmp/retryproxy-promtool-XXXXXX", path[96], outp[96], cmd[512];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/metrics", dir);
    snprintf(outp, sizeof(outp), "%s/out", dir);
    char *text = adm_scrape();
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    free(text);
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s > %s 2>&1", path, outp);
    int rc = fx_sh(cmd);
    f = fopen(outp, "r");
    char out[4096] = "";
    size_t n = f ? fread(out, 1, sizeof(out) - 1, f) : 0;
    out[n] = '\0';
    if (f)
        fclose(f);
    cr_expect_eq(rc, 0, "promtool check metrics exited %d:\n%s", rc, out);
    cr_expect_eq(n, 0, "promtool check metrics printed:\n%s", out);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    fx_sh(cmd);
}

/* ================================ logs ================================ */
