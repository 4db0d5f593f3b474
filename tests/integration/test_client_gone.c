/* A client that goes away while its request is in flight (docs/forwarding.md, docs/logs.md,
 * docs/metrics.md), end to end: an HTTP/1.1 connection closed, reset or half-closed during the
 * attempt, the wait for an upstream slot or a backoff wait, and an HTTP/2 client that gives up.
 * Its attempts are cancelled (the test upstream, which hangs, sees its connection closed at
 * once), no further attempt goes, the request is logged once with status 0
 * (499 in a backoff wait) and counted in client_gone_total, and connections_active comes back
 * down. Bytes of a next request on a kept-alive connection are not a departure.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/fixture.h"

#define T 20000 /* ms: upper bound for any single request in these tests */
/* What "promptly" means on a loaded 2-core machine. */
#define PROMPT_MS 1200

TestSuite(client_gone, .fini = fx_stop, .timeout = 60);

#define GONE      "retryproxy_client_gone_total{route=\"r\"}"
#define CONNS     "retryproxy_connections_active"
#define IN_FLIGHT "retryproxy_retries_in_flight"

/* How the client leaves. */
enum leave { CLOSE, RESET, HALF_CLOSE };

static void leave(int fd, enum leave how)
{
    if (how == RESET) {
        struct linger lg = { .l_onoff = 1, .l_linger = 0 };
        cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    }
    if (how == HALF_CLOSE) {
        cr_assert_eq(shutdown(fd, SHUT_WR), 0);
        return; /* the test closes it later */
    }
    fx_release(fd);
    close(fd);
}

/* Sends a GET with X-Request-Id 'id' and X-Test-Plan 'plan' on a new raw connection (held). */
static int send_get(const char *id, const char *plan)
{
    int fd = fx_hold(raw_dial(px->port));
    char req[256];
    int n = snprintf(req, sizeof(req),
                     "GET /x HTTP/1.1\r\nHost: t\r\nX-Request-Id: %s\r\nX-Test-Plan: %s\r\n\r\n",
                     id, plan);
    cr_assert(raw_send_all(fd, req, (size_t)n));
    return fd;
}

/* The request log lines of request 'id' so far, and the status of the last one. */
static int logged(const char *id, long *status)
{
    char *out = px_stdout(px);
    int n = 0;
    for (const char *line = out; line && *line;) {
        const char *end = strchr(line, '\n');
        json_t *j = json_loadb(line, end ? (size_t)(end - line) : strlen(line), 0, NULL);
        const char *m = json_str(j, "msg"), *v = json_str(j, "request_id");
        if (m && v && strcmp(m, "request") == 0 && strcmp(v, id) == 0) {
            n++;
            *status = (long)json_integer_value(json_object_get(j, "status"));
        }
        json_decref(j);
        line = end ? end + 1 : NULL;
    }
    free(out);
    return n;
}

/* Waits up to 'ms' for a log line of 'id', then asserts it is the only one and has 'status'. */
static void expect_logged_once(const char *id, long status)
{
    long got = -1;
    int n = 0;
    for (int64_t t0 = now_ms(); (n = logged(id, &got)) == 0 && now_ms() - t0 < 2000;)
        sleep_ms(20);
    cr_expect_eq(n, 1, "request %s logged %d times", id, n);
    cr_expect_eq(got, status, "request %s logged with status %ld", id, got);
}

static bool upstream_idle(void *arg)
{
    (void)arg;
    return tup_open_connections(up) == 0;
}

/* A client that leaves while its attempt runs: the attempt is cancelled (the connection of
 * the upstream, which would never answer, closes at once), the request is logged once with status 0
 * and counted in client_gone_total, not in requests_total, and its connection is no longer counted.
 * The same whether it closes, resets or half-closes its connection (nginx's 499 too). */
Test(client_gone, leaving_during_the_attempt_cancels_it)
{
    fx_start_r("", "\"retry\": {\"max_attempts\": 1}", "--workers", "1", NULL);
    static const char *const ids[] = { "close", "reset", "half-close" };
    for (int how = CLOSE; how <= HALF_CLOSE; how++) {
        const char *id = ids[how];
        int fd = send_get(id, "fail=1;action=hang");
        fx_wait_upstream(id, 1);
        cr_expect_eq(fx_metric(CONNS), 1);
        int64_t t0 = now_ms();
        leave(fd, (enum leave)how);
        cr_expect(fx_wait(upstream_idle, NULL, PROMPT_MS, 10),
                  "%s: the upstream's connection is still open %lld ms after the client left", id,
                  (long long)(now_ms() - t0));
        cr_log_info("%s: upstream connection closed %lld ms after the client left", id,
                    (long long)(now_ms() - t0));
        if (how == HALF_CLOSE) {
            fx_release(fd);
            close(fd);
        }
        cr_expect_eq(fx_wait_metric(CONNS, 0, PROMPT_MS), 0, "%s: connections_active", id);
        cr_expect_eq(fx_wait_metric(GONE, how + 1, PROMPT_MS), how + 1, "%s: client_gone_total",
                     id);
        expect_logged_once(id, 0);
    }
    sleep_ms(500); /* nothing more is logged or counted */
    long st;
    for (int how = CLOSE; how <= HALF_CLOSE; how++)
        cr_expect_eq(logged(ids[how], &st), 1, "%s logged again", ids[how]);
    cr_expect(isnan(fx_metric("retryproxy_requests_total{route=\"r\",code=\"200\"}")),
              "a request nobody got an answer to was counted as answered");
    cr_expect_eq(fx_metric("retryproxy_attempts_total{route=\"r\",outcome=\"cancelled\"}"), 3);
    cr_expect_eq(fx_metric(GONE), 3);
    cr_expect_eq(tup_count(up), 3, "an attempt went again");
}

/* An attempt that would have been retried (per-try timeout) or hedged is not, once its client
 * has left: the upstream sees one attempt only, and the retry slot is not taken. The retry
 * comes without a wait (a random delay below 1 ms), which nothing watched before. */
#define NO_WAIT                                                                                    \
    "\"backoff\": {\"policy\": \"random\", \"base_ms\": 0, \"cap_ms\": 1, \"jitter\": \"none\"}"
Test(client_gone, no_retry_or_hedge_after_the_client_left)
{
    fx_start_r("",
               "\"per_try_timeout_ms\": 600, \"retry\": {\"max_attempts\": 3, "
               "\"retry_on\": [\"timeout\"], " NO_WAIT "}",
               "--workers", "1", NULL);
    int fd = send_get("retry", "fail=5;action=hang");
    fx_wait_upstream("retry", 1);
    leave(fd, CLOSE);
    cr_expect_eq(fx_wait_metric(GONE, 1, PROMPT_MS), 1);
    sleep_ms(1500); /* past the per-try timeout the retry would have come at */
    cr_expect_eq(tup_count_id(up, "retry"), 1, "%zu attempts after the client left",
                 tup_count_id(up, "retry"));
    cr_expect_eq(fx_metric(IN_FLIGHT), 0);
    expect_logged_once("retry", 0);
    fx_stop();

    fx_start_r("",
               "\"per_try_timeout_ms\": 600, \"retry\": {\"max_attempts\": 3, "
               "\"hedge_on_per_try_timeout\": true, \"retry_on\": [\"timeout\"], " NO_WAIT "}",
               "--workers", "1", NULL);
    fd = send_get("hedge", "fail=5;action=hang");
    fx_wait_upstream("hedge", 1);
    leave(fd, RESET);
    cr_expect_eq(fx_wait_metric(GONE, 1, PROMPT_MS), 1);
    sleep_ms(1500);
    cr_expect_eq(tup_count_id(up, "hedge"), 1, "%zu attempts after the client left",
                 tup_count_id(up, "hedge"));
    expect_logged_once("hedge", 0);
}

/* A request waiting for an upstream slot (limits.max_upstream_requests) whose client leaves
 * never reaches the upstream, and the one holding the slot is answered as usual. */
Test(client_gone, leaving_while_waiting_for_a_slot)
{
    fx_start_r("\"limits\": {\"max_upstream_requests\": 1}", "\"retry\": {\"max_attempts\": 1}",
               "--workers", "1", NULL);
    int holder = send_get("holder", "delay=2000");
    fx_wait_upstream("holder", 1);
    int fd = send_get("queued", "");
    sleep_ms(600); /* it is read and waits for the slot (room for a loaded machine) */
    leave(fd, CLOSE);
    cr_expect_eq(fx_wait_metric(GONE, 1, PROMPT_MS), 1);
    expect_logged_once("queued", 0);
    char buf[512];
    ssize_t n = raw_recv(holder, buf, sizeof(buf) - 1, T);
    cr_assert_gt(n, 12);
    cr_expect(strncmp(buf, "HTTP/1.1 200", 12) == 0, "holder: %.*s", (int)n, buf);
    sleep_ms(300);
    cr_expect_eq(tup_count_id(up, "queued"), 0, "the request of a client gone went upstream");
    expect_logged_once("holder", 200);
    cr_expect_eq(fx_metric(GONE), 1);
}

/* Reads from 'fd' until 'n' bytes came (or 'timeout_ms' passed, or the stream ended): how many. */
static size_t read_at_least(int fd, size_t n, int timeout_ms)
{
    static char buf[64 * 1024];
    size_t got = 0;
    for (int64_t t0 = now_ms(); got < n && now_ms() - t0 < timeout_ms;) {
        ssize_t k = raw_recv(fd, buf, sizeof(buf), 100);
        if (k == 0 || k == -1)
            break;
        if (k > 0)
            got += (size_t)k;
    }
    return got;
}

/* The request log line of 'id' (polled for up to 2 s; asserted), its status and stop. */
static void expect_logged_cut(const char *id, long status)
{
    expect_logged_once(id, status);
    json_t *j = fx_request_logged("request_id", id);
    cr_expect_str_eq(json_str(j, "stop") ? json_str(j, "stop") : "(null)", "client-closed",
                     "%s: the log does not show the client leaving", id);
    json_decref(j);
}

/* A client that leaves in the middle of its response, the upstream silent meanwhile (the
 * response's connection suspended until more comes): the upstream transfer ends at once, not
 * at timeout_ms, and the request is logged once with the status sent and "stop":
 * "client-closed", counted once in requests_total (when its head went) and in
 * client_gone_total. A short response (that would once have been held whole) and a long one,
 * whether the client closes, resets or half-closes. */
Test(client_gone, leaving_mid_body_ends_the_upstream_transfer)
{
    fx_start_r("", "\"retry\": {\"max_attempts\": 1}", "--workers", "1", NULL);
    static const char *const ids[] = { "close", "reset", "half-close" };
    static const size_t sizes[] = { 20000, 200000 };
    int n = 0;
    for (size_t k = 0; k < 2; k++) {
        for (int how = CLOSE; how <= HALF_CLOSE; how++) {
            char id[64], plan[64];
            snprintf(id, sizeof(id), "%s-%zu", ids[how], sizes[k]);
            snprintf(plan, sizeof(plan), "fail=1;action=stall-mid;body=%zu", sizes[k]);
            int fd = send_get(id, plan);
            /* its head and half its body: the upstream sends no more */
            size_t got = read_at_least(fd, sizes[k] / 2, 5000);
            cr_assert_geq(got, sizes[k] / 2, "%s: %zu bytes came", id, got);
            int64_t t0 = now_ms();
            leave(fd, (enum leave)how);
            cr_expect(fx_wait(upstream_idle, NULL, PROMPT_MS, 10),
                      "%s: the upstream's connection is still open %lld ms after the client "
                      "left",
                      id, (long long)(now_ms() - t0));
            cr_log_info("%s: upstream connection closed %lld ms after the client left", id,
                        (long long)(now_ms() - t0));
            if (how == HALF_CLOSE) {
                fx_release(fd);
                close(fd);
            }
            n++;
            cr_expect_eq(fx_wait_metric(GONE, n, PROMPT_MS), n, "%s: client_gone_total", id);
            expect_logged_cut(id, 200);
        }
    }
    cr_expect_eq(fx_wait_metric(CONNS, 0, PROMPT_MS), 0);
    cr_expect_eq(fx_metric("retryproxy_requests_total{route=\"r\",code=\"200\"}"), n);
    cr_expect(isnan(fx_metric("retryproxy_requests_total{route=\"r\",code=\"499\"}")));
    cr_expect_eq(tup_count(up), (size_t)n, "an attempt went again");
}

/* The same while the upstream is paused because the client reads nothing (the proxy's buffer
 * and the sockets' are full): a client that half-closes, which the proxy's writes would never
 * notice, ends the transfer at once too. */
Test(client_gone, leaving_while_the_upstream_waits_for_the_client)
{
    fx_start_r("", "\"retry\": {\"max_attempts\": 1}", "--workers", "1", NULL);
    static const char *const ids[] = { "full-close", "full-reset", "full-half-close" };
    for (int how = CLOSE; how <= HALF_CLOSE; how++) {
        int fd = send_get(ids[how], "body=1000000000");
        fx_wait_upstream(ids[how], 1);
        sleep_ms(500); /* the buffers on the way fill up */
        int64_t t0 = now_ms();
        leave(fd, (enum leave)how);
        cr_expect(fx_wait(upstream_idle, NULL, PROMPT_MS, 10),
                  "%s: the upstream's connection is still open %lld ms after the client left",
                  ids[how], (long long)(now_ms() - t0));
        cr_log_info("%s: upstream connection closed %lld ms after the client left", ids[how],
                    (long long)(now_ms() - t0));
        if (how == HALF_CLOSE) {
            fx_release(fd);
            close(fd);
        }
        cr_expect_eq(fx_wait_metric(GONE, how + 1, PROMPT_MS), how + 1, "%s", ids[how]);
        expect_logged_cut(ids[how], 200);
    }
    cr_expect_eq(fx_wait_metric(CONNS, 0, PROMPT_MS), 0);
}

/* An HTTP/2 client that gives up mid-body is logged and counted the same way (its stream's
 * reset ended the transfer at once before too). */
Test(client_gone, an_http2_client_leaving_mid_body_is_logged_the_same)
{
    fx_start_r("", "\"retry\": {\"max_attempts\": 1}", "--workers", "1", NULL);
    const char *h[] = { "X-Request-Id: h2-mid", "X-Test-Plan: fail=1;action=stall-mid;body=200000",
                        NULL };
    struct http_resp r;
    http_do_h2("GET", fx_url("/x"), h, NULL, 0, 1000, &r); /* curl gives up after 1 s */
    cr_expect_neq(r.rc, 0, "curl got the whole answer");
    http_free(&r);
    cr_expect(fx_wait(upstream_idle, NULL, PROMPT_MS, 10), "the transfer was not ended");
    cr_expect_eq(fx_wait_metric(GONE, 1, PROMPT_MS), 1);
    expect_logged_cut("h2-mid", 200);
}

/* During a backoff wait it was noticed before: still a 499 in requests_total and the log, and
 * now counted in client_gone_total too. */
Test(client_gone, leaving_during_a_backoff_wait_is_counted_too)
{
    fx_start_r("", "\"retry\": {\"max_attempts\": 3, " CFG_FIXED(1500) "}", "--workers", "1", NULL);
    int fd = send_get("wait", "fail=5;status=503");
    fx_wait_upstream("wait", 1);
    cr_expect_eq(fx_wait_metric(IN_FLIGHT, 1, 2000), 1);
    leave(fd, CLOSE);
    cr_expect_eq(fx_wait_metric(GONE, 1, PROMPT_MS), 1);
    cr_expect_eq(fx_metric("retryproxy_requests_total{route=\"r\",code=\"499\"}"), 1);
    cr_expect_eq(fx_wait_metric(IN_FLIGHT, 0, PROMPT_MS), 0);
    expect_logged_once("wait", 499);
}

/* Over HTTP/2 a client that gives up is counted the same way: status 0, client_gone_total. */
Test(client_gone, an_http2_client_giving_up_is_counted_the_same)
{
    fx_start_r("", "\"retry\": {\"max_attempts\": 1}", "--workers", "1", NULL);
    const char *h[] = { "X-Request-Id: h2", "X-Test-Plan: fail=1;action=hang", NULL };
    struct http_resp r;
    http_do_h2("GET", fx_url("/x"), h, NULL, 0, 400, &r); /* curl gives up after 0.4 s */
    cr_expect_neq(r.rc, 0, "curl got an answer: %ld", r.status);
    http_free(&r);
    cr_expect_eq(fx_wait_metric(GONE, 1, PROMPT_MS), 1);
    expect_logged_once("h2", 0);
    cr_expect(fx_wait(upstream_idle, NULL, PROMPT_MS, 10), "the attempt was not cancelled");
    cr_expect_eq(fx_wait_metric(CONNS, 0, PROMPT_MS), 0);
}

/* A client that sends its next request before the first is answered (pipelining) has not left:
 * both are answered, in order, and nothing is counted as gone. */
Test(client_gone, a_pipelined_request_is_not_a_departure)
{
    fx_start_r("", "\"retry\": {\"max_attempts\": 1}", "--workers", "1", NULL);
    int fd = fx_hold(raw_dial(px->port));
    static const char two[] = "GET /x HTTP/1.1\r\nHost: t\r\nX-Request-Id: first\r\n"
                              "X-Test-Plan: delay=500\r\n\r\n"
                              "GET /x HTTP/1.1\r\nHost: t\r\nX-Request-Id: second\r\n\r\n";
    cr_assert(raw_send_all(fd, two, sizeof(two) - 1));
    char buf[4096];
    size_t got = 0;
    for (int64_t t0 = now_ms(); now_ms() - t0 < 5000 && got < sizeof(buf) - 1;) {
        buf[got] = '\0';
        const char *first = strstr(buf, "HTTP/1.1 200");
        if (first && strstr(first + 1, "HTTP/1.1 200") && strstr(buf, "ok\n") &&
            strstr(strstr(first + 1, "HTTP/1.1 200"), "ok\n"))
            break;
        ssize_t n = raw_recv(fd, buf + got, sizeof(buf) - 1 - got, 1000);
        if (n <= 0 && n != -2)
            break;
        if (n > 0)
            got += (size_t)n;
    }
    buf[got] = '\0';
    const char *first = strstr(buf, "HTTP/1.1 200");
    cr_expect_not_null(first, "no answer: %s", buf);
    cr_expect(first && strstr(first + 1, "HTTP/1.1 200"), "one answer only: %s", buf);
    expect_logged_once("first", 200);
    expect_logged_once("second", 200);
    cr_expect_eq(fx_metric(GONE), 0);
    cr_expect_eq(fx_metric(CONNS), 1, "the connection is kept alive");
}
