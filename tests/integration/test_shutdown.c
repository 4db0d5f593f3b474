/* Graceful shutdown (docs/logs.md), end to end: the real binary, signalled by the test, against
 * the test upstream on 127.0.0.1.
 *
 * SIGTERM or SIGINT: /readyz turns 503 and retryproxy_draining 1, the listener stops accepting,
 * requests in flight (backoff waits included) get drain_timeout_ms to finish; those still
 * waiting then get their last upstream response or a JSON 503 "draining", with X-Retry-Stop:
 * draining, and the process exits 0. A second signal exits at once with 128 + signal.
 *
 * px_stop() sends SIGTERM itself, and a second signal ends a draining proxy at once, so these
 * tests send their own signal with kill() and watch for the exit with waitid(WNOWAIT), which
 * leaves the process a zombie: px_stop() then only reaps it (a signal to a zombie does
 * nothing, and its pid cannot be reused before it is reaped) and returns its status.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/fixture.h"

#define T 20000 /* ms: upper bound for any single request in these tests */
/* How late an answer or an exit may come after the moment it is due: event-loop turns, the
 * 20 ms drain check, a loaded 2-core machine, sanitizers. */
#define MARGIN_MS 500

static const char *hdr(const struct http_resp *r, const char *name)
{
    const char *s = http_hdr(r, name);
    return s ? s : "(none)";
}

/* A string member of a JSON object, "(none)" when absent or not a string. */
static const char *jstr(const json_t *j, const char *key)
{
    const char *s = json_str(j, key);
    return s ? s : "(none)";
}

/* ---- suite set-up ---- */

static void setup(void)
{
    fx_init_curl(); /* before the call threads run libcurl */
    fx_upstreams(1);
}

/* A test that failed half-way may leave the proxy running: fx_stop_any ends it (at once if it
 * was draining), which also ends the calls (fx_calls) still waiting on it. */
TestSuite(shutdown, .init = setup, .fini = fx_stop_any, .timeout = 60);

/* Starts the proxy with route "r" to tup: 'top' are top-level members, 'retry' the route's
 * "retry" object. */
static void start(const char *top, const char *retry)
{
    char route[512];
    snprintf(route, sizeof(route), "\"retry\": %s", retry);
    fx_start_r(top, route, "--workers", "2", NULL);
}

#define FIXED(ms) "{" CFG_FIXED(ms) "}"

/* ---- signals and the exit ---- */

static void signal_proxy(int sig)
{
    cr_assert_eq(kill(px->pid, sig), 0, "kill: %s", strerror(errno));
}

/* Whether the proxy has exited (left a zombie: not reaped). */
static bool exited(void)
{
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    return waitid(P_PID, (id_t)px->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           si.si_pid == px->pid;
}

/* Waits up to 'timeout_ms' for the proxy to exit; milliseconds since 't0', or -1. */
static int64_t wait_exit(int64_t t0, int timeout_ms)
{
    while (!exited()) {
        if (now_ms() - t0 > timeout_ms)
            return -1;
        sleep_ms(2);
    }
    return now_ms() - t0;
}

/* Reaps the exited proxy and frees it: its exit status. */
static int reap(void)
{
    int st = px_stop(px, 2000);
    px = NULL;
    return st;
}

/* The retries_in_flight gauge, -1 if it cannot be read. */
static double in_flight(void)
{
    double v;
    return fx_scrape_metric("retryproxy_retries_in_flight", &v) == 0 && !isnan(v) ? v : -1;
}

/* Waits until 'n' retries are in flight: the requests that failed once are in backoff. */
static void wait_in_flight(double n)
{
    int64_t deadline = now_ms() + 5000;
    double v;
    while ((v = in_flight()) != n && now_ms() < deadline)
        sleep_ms(5);
    cr_assert_eq(v, n, "retries_in_flight %.0f, want %.0f", v, n);
}

/* Status of an admin GET, 0 when it got no answer. */
static long admin_status(const char *path)
{
    char url[128];
    struct http_resp r;
    http_do("GET", px_admin_url(px, path, url, sizeof(url)), NULL, NULL, 0, 2000, &r);
    long s = r.rc == 0 ? r.status : 0;
    http_free(&r);
    return s;
}

/* A plain TCP connect to the proxy listener: 0 when accepted, else the errno. */
static int connect_proxy(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons(px->port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    int e = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 ? 0 : errno;
    close(fd);
    return e;
}

/* ================================ the tests ================================ */

Test(shutdown, requests_in_flight_complete_after_sigterm)
{
    start("\"drain_timeout_ms\": 5000", FIXED(200));
    http_call_start(&fx_calls[0], fx_url("/x"), "held", "delay=500");
    http_call_start(&fx_calls[1], fx_url("/x"), "backoff", "fail=1;status=503");
    fx_wait_upstream("held", 1);
    fx_wait_upstream("backoff", 1);
    wait_in_flight(1); /* "backoff" waits its 200 ms, "held" is held by the upstream */
    int64_t t0 = now_ms();
    cr_assert_eq(tup_count_id(up, "backoff"), 1, "the backoff was over before the signal");
    signal_proxy(SIGTERM);
    int64_t took = wait_exit(t0, 5000 + 2000);
    http_call_join(&fx_calls[0]);
    http_call_join(&fx_calls[1]);
    cr_log_info("in flight: SIGTERM -> exit in %lld ms; held %ld after %lld ms, backoff %ld "
                "after %lld ms",
                (long long)took, fx_calls[0].r.status, (long long)(fx_calls[0].t_end - t0),
                fx_calls[1].r.status, (long long)(fx_calls[1].t_end - t0));

    cr_expect_eq(fx_calls[0].r.rc, 0, "held: curl error %d", fx_calls[0].r.rc);
    cr_expect_eq(fx_calls[0].r.status, 200, "held: status %ld", fx_calls[0].r.status);
    cr_expect_str_eq(hdr(&fx_calls[0].r, "X-Retry-Stop"), "(none)");
    cr_expect_eq(fx_calls[1].r.rc, 0, "backoff: curl error %d", fx_calls[1].r.rc);
    cr_expect_eq(fx_calls[1].r.status, 200, "backoff: status %ld", fx_calls[1].r.status);
    cr_expect_str_eq(hdr(&fx_calls[1].r, "X-Retry-Attempts"), "2");
    cr_expect_str_eq(hdr(&fx_calls[1].r, "X-Retry-Stop"), "(none)");
    cr_expect_eq(tup_count_id(up, "backoff"), 2, "the retry after the signal was not made");
    cr_assert_geq(took, 0, "the proxy did not exit within the drain timeout");
    /* nothing left to wait for once both are answered: no need to sit out the 5 s timeout */
    cr_expect_lt(took, 500 + MARGIN_MS + 500, "exit %lld ms after SIGTERM", (long long)took);
    cr_expect_eq(reap(), 0, "exit status");
}

Test(shutdown, readyz_is_503_and_new_connections_are_refused_while_draining)
{
    start("\"drain_timeout_ms\": 5000", FIXED(10));
    cr_assert_eq(admin_status("/readyz"), 200);
    cr_assert_eq(fx_metric("retryproxy_draining"), 0, "retryproxy_draining before the signal");
    cr_assert_eq(connect_proxy(), 0, "the proxy listener does not accept before the signal");
    http_call_start(&fx_calls[0], fx_url("/x"), "held",
                    "delay=1500"); /* keeps the proxy draining */
    fx_wait_upstream("held", 1);
    int64_t t0 = now_ms();
    signal_proxy(SIGTERM);

    long ready = 0;
    while ((ready = admin_status("/readyz")) != 503 && now_ms() - t0 < 2000)
        sleep_ms(5);
    int64_t t_ready = now_ms() - t0;
    int refused = 0;
    while ((refused = connect_proxy()) != ECONNREFUSED && now_ms() - t0 < 2000)
        sleep_ms(5);
    int64_t t_refused = now_ms() - t0;
    long healthz = admin_status("/healthz");
    /* the admin listener still answers /metrics, and says so (the drain alert reads it) */
    double draining = NAN;
    int scraped = fx_scrape_metric("retryproxy_draining", &draining);
    bool still_up = !exited();
    cr_log_info("draining: /readyz 503 after %lld ms, connections refused after %lld ms",
                (long long)t_ready, (long long)t_refused);
    cr_expect(still_up, "the proxy exited while a request was in flight");
    cr_expect_eq(ready, 503, "/readyz %ld while draining", ready);
    cr_expect_lt(t_ready, MARGIN_MS, "/readyz turned 503 only after %lld ms", (long long)t_ready);
    cr_expect_eq(refused, ECONNREFUSED, "a new connection was not refused while draining: %s",
                 refused ? strerror(refused) : "accepted");
    cr_expect_lt(t_refused, MARGIN_MS, "refused only after %lld ms", (long long)t_refused);
    cr_expect_eq(healthz, 200, "/healthz %ld while the process runs", healthz);
    cr_expect_eq(scraped, 0, "no /metrics while draining");
    cr_expect_eq(draining, 1, "retryproxy_draining %g while draining", draining);

    http_call_join(&fx_calls[0]);
    cr_expect_eq(fx_calls[0].r.rc, 0, "held: curl error %d", fx_calls[0].r.rc);
    cr_expect_eq(fx_calls[0].r.status, 200, "held: status %ld", fx_calls[0].r.status);
    int64_t took = wait_exit(t0, 5000 + 2000);
    cr_log_info("draining: exit %lld ms after SIGTERM", (long long)took);
    cr_assert_geq(took, 0, "no exit");
    cr_expect_eq(reap(), 0, "exit status");
}

#define DRAIN_MS              800 /* drain_timeout_ms of the tests that reach the deadline */
#define STR(x)                #x
#define XSTR(x)               STR(x)
#define DRAINING_FOR_DRAIN_MS "\"drain_timeout_ms\": " XSTR(DRAIN_MS)

Test(shutdown, requests_in_a_long_backoff_get_their_last_response_at_the_deadline)
{
    start(DRAINING_FOR_DRAIN_MS, FIXED(5000));
    /* four of them, so that both workers have some */
    const char *ids[] = { "wait-0", "wait-1", "wait-2", "wait-3" };
    for (size_t i = 0; i < 4; i++)
        http_call_start(&fx_calls[i], fx_url("/x"), ids[i], "fail=1;status=503");
    for (size_t i = 0; i < 4; i++)
        fx_wait_upstream(ids[i], 1);
    wait_in_flight(4);
    int64_t t0 = now_ms();
    signal_proxy(SIGTERM);
    int64_t took = wait_exit(t0, DRAIN_MS + 2000);
    for (size_t i = 0; i < 4; i++) {
        struct http_call *c = &fx_calls[i];
        http_call_join(c);
        int64_t at = c->t_end - t0;
        cr_log_info("%s: %ld %s after %lld ms", ids[i], c->r.status, hdr(&c->r, "X-Retry-Stop"),
                    (long long)at);
        cr_expect_eq(c->r.rc, 0, "%s: curl error %d", ids[i], c->r.rc);
        cr_expect_eq(c->r.status, 503, "%s: status %ld", ids[i], c->r.status);
        cr_expect_str_eq(hdr(&c->r, "X-Retry-Stop"), "draining", "%s", ids[i]);
        cr_expect_str_eq(hdr(&c->r, "X-Retry-Attempts"), "1", "%s", ids[i]);
        /* the upstream's own answer, not one made up by the proxy */
        cr_expect_str_eq(hdr(&c->r, "X-Tup-Attempt"), "1", "%s", ids[i]);
        cr_expect_str_eq(c->r.body ? (char *)c->r.body : "",
                         "tup: attempt 1 fails on purpose (fail=1)\n", "%s", ids[i]);
        /* answered at the deadline: not before (it was in flight), not much after */
        cr_expect_geq(at, DRAIN_MS - 20, "%s answered %lld ms after SIGTERM, before the deadline",
                      ids[i], (long long)at);
        cr_expect_lt(at, DRAIN_MS + MARGIN_MS, "%s answered %lld ms after SIGTERM", ids[i],
                     (long long)at);
        cr_expect_eq(tup_count_id(up, ids[i]), 1, "%s was retried while draining", ids[i]);
    }
    cr_log_info("long backoff: exit %lld ms after SIGTERM (drain_timeout_ms %d)", (long long)took,
                DRAIN_MS);
    cr_assert_geq(took, 0, "no exit within drain_timeout_ms + 2 s");
    cr_expect_eq(reap(), 0, "exit status");
}

Test(shutdown, request_without_an_upstream_answer_gets_a_json_503_draining)
{
    start(DRAINING_FOR_DRAIN_MS, FIXED(10));
    http_call_start(&fx_calls[0], fx_url("/x"), "hung", "fail=1;action=hang");
    fx_wait_upstream("hung", 1);
    int64_t t0 = now_ms();
    signal_proxy(SIGTERM);
    int64_t took = wait_exit(t0, DRAIN_MS + 2000);
    http_call_join(&fx_calls[0]);
    struct http_resp *r = &fx_calls[0].r;
    int64_t at = fx_calls[0].t_end - t0;
    cr_log_info("hung: %ld after %lld ms, exit after %lld ms: %.*s", r->status, (long long)at,
                (long long)took, (int)r->body_len, r->body ? (char *)r->body : "");
    cr_expect_eq(r->rc, 0, "curl error %d", r->rc);
    cr_expect_eq(r->status, 503, "status %ld", r->status);
    cr_expect_str_eq(hdr(r, "X-Retry-Stop"), "draining");
    cr_expect_str_eq(hdr(r, "Content-Type"), "application/json");
    json_error_t err;
    json_t *j = json_loadb(r->body ? (const char *)r->body : "", r->body_len, 0, &err);
    cr_expect_not_null(j, "body is not JSON: %s", err.text);
    cr_expect_str_eq(jstr(j, "error"), "draining");
    cr_expect_str_eq(jstr(j, "route"), "r");
    cr_expect_eq(json_integer_value(json_object_get(j, "attempts")), 1);
    json_decref(j);
    cr_expect_geq(at, DRAIN_MS - 20, "answered %lld ms after SIGTERM, before the deadline",
                  (long long)at);
    cr_expect_lt(at, DRAIN_MS + MARGIN_MS, "answered %lld ms after SIGTERM", (long long)at);
    cr_assert_geq(took, 0, "no exit within drain_timeout_ms + 2 s");
    /* the event lines say so, their numbers as JSON numbers (docs/logs.md) */
    char *out = px_stdout(px);
    json_t *ev = fx_log_line(out, "draining");
    cr_expect_str_eq(json_str(ev, "signal"), "SIGTERM", "%s", out);
    cr_expect(json_is_integer(json_object_get(ev, "drain_timeout_ms")), "%s", out);
    cr_expect_eq(json_integer_value(json_object_get(ev, "drain_timeout_ms")), DRAIN_MS);
    json_decref(ev);
    ev = fx_log_line(out, "drain timeout: answering the requests still waiting");
    cr_expect(json_is_integer(json_object_get(ev, "requests")), "%s", out);
    cr_expect_eq(json_integer_value(json_object_get(ev, "requests")), 1);
    json_decref(ev);
    free(out);
    cr_expect_eq(reap(), 0, "exit status");
}

Test(shutdown, second_signal_exits_at_once)
{
    start("\"drain_timeout_ms\": 10000", FIXED(5000));
    http_call_start(&fx_calls[0], fx_url("/x"), "waiting", "fail=1;status=503");
    fx_wait_upstream("waiting", 1);
    wait_in_flight(1);
    signal_proxy(SIGTERM);
    sleep_ms(200);
    cr_assert(!exited(), "the proxy exited on the first signal with a request waiting");
    int64_t t0 = now_ms();
    signal_proxy(SIGINT);
    int64_t took = wait_exit(t0, 3000);
    cr_log_info("second signal: exit %lld ms after SIGINT", (long long)took);
    cr_assert_geq(took, 0, "still running 3 s after the second signal");
    cr_expect_lt(took, 1000, "exit %lld ms after the second signal", (long long)took);
    int st = reap();
    cr_expect_eq(st, 128 + SIGINT, "exit status %d, want %d", st, 128 + SIGINT);
    http_call_join(&fx_calls[0]); /* its connection died with the process */
}

Test(shutdown, zero_drain_timeout_answers_waiting_requests_at_once)
{
    start("\"drain_timeout_ms\": 0", FIXED(5000));
    http_call_start(&fx_calls[0], fx_url("/x"), "now", "fail=1;status=503");
    fx_wait_upstream("now", 1);
    wait_in_flight(1);
    int64_t t0 = now_ms();
    signal_proxy(SIGTERM);
    int64_t took = wait_exit(t0, 2000);
    http_call_join(&fx_calls[0]);
    struct http_resp *r = &fx_calls[0].r;
    int64_t at = fx_calls[0].t_end - t0;
    cr_log_info("drain 0: %ld %s after %lld ms, exit after %lld ms", r->status,
                hdr(r, "X-Retry-Stop"), (long long)at, (long long)took);
    cr_expect_eq(r->rc, 0, "curl error %d", r->rc);
    cr_expect_eq(r->status, 503, "status %ld", r->status);
    cr_expect_str_eq(hdr(r, "X-Retry-Stop"), "draining");
    cr_expect_str_eq(hdr(r, "X-Tup-Attempt"), "1");
    cr_expect_lt(at, MARGIN_MS, "answered %lld ms after SIGTERM", (long long)at);
    cr_expect_eq(tup_count_id(up, "now"), 1);
    cr_assert_geq(took, 0, "no exit within 2 s");
    cr_expect_lt(took, MARGIN_MS + 500, "exit %lld ms after SIGTERM", (long long)took);
    cr_expect_eq(reap(), 0, "exit status");
}

/* A response the upstream has started to send when the drain deadline comes is that request's
 * answer: what came goes to the client, and the rest is cut short when the process exits,
 * never replaced by the earlier attempt's kept response. A client told 503 would send again a
 * POST the upstream has carried out. Here a retryable POST got "503" from one upstream, then a
 * 200 from the other that sent 10 of its 20 body bytes and stalled. */
Test(shutdown, a_response_begun_at_the_drain_deadline_is_not_replaced)
{
    fx_upstreams(2);
    tup_set_default_plan(fx_up(0), "fail=9;status=503");
    tup_set_default_plan(fx_up(1), "fail=9;action=stall-mid;body=20");
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"drain_timeout_ms\": 1000");
    cfgb_route(b, "r",
               "\"upstreams\": [\"%s\", \"%s\"], \"balance\": \"round_robin\", "
               "\"retry\": {\"max_attempts\": 2, " CFG_FAST "}",
               fx_up_url(0), fx_up_url(1));
    fx_start_b(b, "--workers", "1", NULL);
    int fd = fx_hold(raw_dial(px->port));
    static const char post[] = "POST /x HTTP/1.1\r\nHost: t\r\nX-Request-Id: begun\r\n"
                               "Idempotency-Key: k-begun\r\nContent-Length: 2\r\n\r\nhi";
    cr_assert(raw_send_all(fd, post, sizeof(post) - 1));
    cr_assert_eq(tup_wait_count(fx_up(1), 1, 5000), 0, "the retry did not reach upstream 1");
    cr_assert_eq(tup_count(fx_up(0)), 1);
    sleep_ms(300); /* its head and first 10 bytes reach the proxy */
    int64_t t0 = now_ms();
    signal_proxy(SIGTERM);
    char buf[4096];
    size_t got = 0;
    for (ssize_t n; got < sizeof(buf) - 1 && now_ms() - t0 < 1000 + 1000 + 2000; got += (size_t)n)
        if ((n = raw_recv(fd, buf + got, sizeof(buf) - 1 - got, 100)) == 0 || n == -1)
            break;
        else if (n == -2)
            n = 0;
    buf[got] = '\0';
    int64_t took = wait_exit(t0, 1000 + 1000 + 2000);
    cr_log_info("begun: %zu bytes, exit %lld ms after SIGTERM: %s", got, (long long)took, buf);
    cr_expect(strncmp(buf, "HTTP/1.1 200", 12) == 0, "not the 200 begun: %s", buf);
    cr_expect_null(strstr(buf, "X-Retry-Stop"), "%s", buf);
    const char *body = strstr(buf, "\r\n\r\n");
    cr_expect(body && strlen(body + 4) == 10, "the 10 bytes sent, cut short: %s", buf);
    cr_expect_eq(tup_count(fx_up(1)), 1);
    cr_assert_geq(took, 0, "no exit");
    cr_expect_lt(took, 1000 + 1000 + MARGIN_MS, "exit %lld ms after SIGTERM", (long long)took);
    /* logged as the 200 it was, cut by the exit: not as a client that left */
    char *out = px_stdout(px);
    const char *line = strstr(out, "\"request_id\":\"begun\"");
    cr_expect(line && strstr(out, "\"status\":200") && !strstr(out, "client-closed"), "%s", out);
    free(out);
    char *err = px_stderr(px); /* a response streaming at exit once made libmicrohttpd abort */
    int st = reap();
    cr_expect_eq(st, 0, "exit status %d: %s", st, err);
    free(err);
}
