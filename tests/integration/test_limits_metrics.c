/* The process, build and limit series of docs/metrics.md against the running proxy: Prometheus'
 * process_* figures read from /proc at the scrape, retryproxy_build_info, and what is held
 * against limits.max_upstream_requests, limits.max_connections and
 * limits.max_buffered_body_bytes. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/proc.h"

TestSuite(limits_metrics, .init = fx_init_curl, .fini = fx_stop, .timeout = 60);

/* What `retryproxy --version` prints after "retryproxy ". */
static void binary_version(char *out, size_t cap)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "'%s' --version", getenv("RETRYPROXY_BIN"));
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[128] = "";
    cr_assert_not_null(fgets(line, sizeof(line), p));
    pclose(p);
    cr_assert(strncmp(line, "retryproxy ", 11) == 0, "--version printed %s", line);
    snprintf(out, cap, "%.*s", (int)strcspn(line + 11, "\n"), line + 11);
}

Test(limits_metrics, process_and_build_series_are_the_processs_own)
{
    fx_start_r("", "", "--workers", "2", NULL);
    double start = fx_metric("process_start_time_seconds");
    double now = (double)time(NULL);
    cr_expect(start > now - 60 && start <= now + 1, "process_start_time_seconds %f, now %f", start,
              now);
    cr_expect_geq(fx_metric("process_cpu_seconds_total"), 0);
    double rss = fx_metric("process_resident_memory_bytes");
    cr_expect(rss > 1e6 && rss < 1e10, "process_resident_memory_bytes %f", rss);
    /* the proxy inherits this process's limit */
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur != RLIM_INFINITY)
        cr_expect_eq(fx_metric("process_max_fds"), (double)rl.rlim_cur);
    /* open client connections are open descriptors of the proxy */
    double fds = fx_metric("process_open_fds");
    cr_expect(fds >= 5, "process_open_fds %f", fds);
    int held[8];
    for (size_t i = 0; i < 8; i++)
        held[i] = fx_hold(raw_dial(px->port));
    double more = fx_wait_metric("retryproxy_connections_active", 8, 5000);
    cr_expect_eq(more, 8);
    double fds2 = fx_metric("process_open_fds");
    cr_expect(fds2 >= fds + 8, "process_open_fds %f with 8 more connections, %f before", fds2, fds);
    for (size_t i = 0; i < 8; i++) {
        close(held[i]);
        fx_release(held[i]);
    }

    char version[64], series[128];
    binary_version(version, sizeof(version));
    snprintf(series, sizeof(series), "retryproxy_build_info{version=\"%s\"}", version);
    cr_expect_eq(fx_metric(series), 1, "%s", series);
}

/* One worker with one upstream slot: two more requests wait their turn, then none. */
Test(limits_metrics, attempts_waiting_for_an_upstream_slot_are_counted)
{
    fx_start_r("\"limits\": {\"max_upstream_requests\": 1}", "", "--workers", "1", NULL);
    cr_expect_eq(fx_metric("retryproxy_limit{limit=\"max_upstream_requests\"}"), 1);
    cr_expect_eq(fx_metric("retryproxy_upstream_requests_waiting"), 0);
    for (size_t i = 0; i < 3; i++) {
        char id[16];
        snprintf(id, sizeof(id), "wait-%zu", i);
        http_call_start(&fx_calls[i], fx_url("/w"), id, "delay=700");
    }
    cr_expect_eq(fx_wait_metric("retryproxy_upstream_requests_waiting", 2, 5000), 2);
    for (size_t i = 0; i < 3; i++) {
        http_call_join(&fx_calls[i]);
        cr_expect_eq(fx_calls[i].r.status, 200);
    }
    cr_expect_eq(fx_wait_metric("retryproxy_upstream_requests_waiting", 0, 5000), 0);
}

/* One worker with one connection: a second client waits in the backlog, counted once. */
Test(limits_metrics, accepting_stopped_at_max_connections_is_counted)
{
    fx_start_r("\"limits\": {\"max_connections\": 1}", "", "--workers", "1", NULL);
    cr_expect_eq(fx_metric("retryproxy_limit{limit=\"max_connections\"}"), 1);
    cr_expect_eq(fx_metric("retryproxy_connections_limit_reached_total"), 0);
    fx_hold(raw_dial(px->port));
    fx_hold(raw_dial(px->port));
    cr_expect_eq(fx_wait_metric("retryproxy_connections_limit_reached_total", 1, 5000), 1);
    cr_expect_eq(fx_metric("retryproxy_connections_active"), 1);
}

/* A PUT the route may retry keeps its body for replay while its attempt runs: the gauge shows
 * its bytes, then gives them back. */
Test(limits_metrics, replay_bytes_held_are_shown_against_their_limit)
{
    fx_start_r("\"limits\": {\"max_buffered_body_bytes\": 100000}",
               "\"retry\": {\"retry_on\": [\"503\"], \"methods\": [\"PUT\"], " CFG_FAST "}",
               "--workers", "1", NULL);
    cr_expect_eq(fx_metric("retryproxy_limit{limit=\"max_buffered_body_bytes\"}"), 100000);
    cr_expect_eq(fx_metric("retryproxy_buffered_body_bytes"), 0);
    int fd = fx_hold(raw_dial(px->port));
    char head[256], body[5000];
    int n = snprintf(head, sizeof(head),
                     "PUT /b HTTP/1.1\r\nHost: a\r\nX-Test-Plan: delay=700\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     sizeof(body));
    memset(body, 'b', sizeof(body));
    cr_assert(raw_send_all(fd, head, (size_t)n) && raw_send_all(fd, body, sizeof(body)));
    cr_expect_eq(fx_wait_metric("retryproxy_buffered_body_bytes", 5000, 5000), 5000);
    char buf[512];
    cr_expect_gt(read(fd, buf, sizeof(buf)), 0, "no answer");
    close(fd);
    fx_release(fd);
    cr_expect_eq(fx_wait_metric("retryproxy_buffered_body_bytes", 0, 5000), 0);
}
