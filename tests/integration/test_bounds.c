/* Bounds a crowd of HTTP/2 clients meets (docs/hardening.md): a slow upstream, a slow endpoint
 * of an upstream or one client connection with many streams cannot take every upstream attempt
 * slot, nor hold up a request that fits when slots free, and the memory of a burst of
 * connections goes back when they close.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/cfgb.h"
#include "tests/support/dnsmasq.h"
#include "tests/support/fixture.h"
#include "tests/support/pods.h"

TestSuite(bounds, .fini = fx_stop, .timeout = 120);

static bool rss_back(void *arg)
{
    return px_rss_kb(px) <= *(long *)arg;
}

/* The client preface and an empty SETTINGS frame. */
static const char PREFACE[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0";

/* 3,000 idle HTTP/2 connections on one worker (about 13 KiB each), then closed: their memory
 * is given back within a few seconds. glibc's heap only: a sanitizer build keeps freed memory
 * in its own allocator. */
Test(bounds, memory_of_a_burst_of_http2_connections_goes_back)
{
    enum { N = 3000 };
    fx_start_r("", "", "--workers", "1", NULL);
    char url[128];
    struct http_resp r;
    http_do("GET", px_url(px, "/x", url, sizeof(url)), NULL, NULL, 0, 5000, &r);
    http_free(&r);
    sleep_ms(300);
    long idle = px_rss_kb(px);
    static int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = raw_dial(px->port);
        cr_assert(raw_send_all(fds[i], PREFACE, sizeof(PREFACE) - 1));
    }
    /* every connection has its session when the proxy's SETTINGS came on the last one */
    char buf[256];
    cr_assert_gt(raw_recv(fds[N - 1], buf, sizeof(buf), 10000), 0);
    sleep_ms(300);
    long held = px_rss_kb(px);
    cr_assert_gt(held, idle + 16 * 1024,
                 "RSS %ld KiB with %d connections, %ld idle: the test measures nothing", held, N,
                 idle);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    /* what stays is the heap's fragments (the build before kept all of it) */
    long bound = idle + (held - idle) / 4;
    if (!fx_under_sanitizer())
        cr_expect(fx_wait(rss_back, &bound, 4000, 50),
                  "RSS %ld KiB 4 s after %d HTTP/2 connections closed (%ld idle, %ld with them)",
                  px_rss_kb(px), N, idle, held);
}

/* Route "slow" to upstream 0, route "fast" to upstream 1, one worker with 'cap' slots; 'top'
 * adds to "limits". */
static void start_two(unsigned cap, const char *limits)
{
    fx_upstreams(2);
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"limits\": {\"max_upstream_requests\": %u%s}", cap, limits);
    cfgb_route(b, "slow", "\"match\": {\"path_prefix\": \"/slow\"}, \"timeout_ms\": 20000");
    cfgb_route(b, "fast", "\"match\": {\"path_prefix\": \"/fast\"}, \"upstreams\": [\"%s\"]",
               fx_up_url(1));
    fx_start_b(b, "--workers", "1", NULL);
}

/* h2load: 'n' requests over 'conns' connections, 'streams' at once on each, to the slow route
 * (each answered after 6 s, so that none has ended while the test looks); stopped after 8 s,
 * by pclose() at the latest. */
static FILE *slow_load(int n, int conns, int streams)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "timeout -s KILL 8 h2load -n %d -c %d -m %d -H 'x-test-plan: delay=6000' "
             "http://127.0.0.1:%u/slow/x >/dev/null 2>&1",
             n, conns, streams, px->port);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    return p;
}

/* A request to the fast route over HTTP/2: how long it took (asserts a 200). */
static long probe(void)
{
    char url[128];
    struct http_resp r;
    int64_t t0 = now_ms();
    http_do_h2("GET", px_url(px, "/fast/probe", url, sizeof(url)), NULL, NULL, 0, 10000, &r);
    long ms = (long)(now_ms() - t0);
    cr_expect_eq(r.rc, 0);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    return ms;
}

/* 3 connections with 20 streams each to a slow upstream, 40 slots: its share (75 %, 30) leaves
 * slots to the other upstream, whose request goes at once instead of waiting 6 s for one. */
Test(bounds, a_slow_upstream_leaves_slots_to_another)
{
    start_two(40, "");
    FILE *load = slow_load(60, 3, 20);
    cr_assert_eq(tup_wait_count(fx_up(0), 30, 10000), 0, "the slow streams did not arrive");
    usleep(200 * 1000);
    size_t held = tup_count(fx_up(0));
    long ms = probe();
    cr_expect_leq(held, 30, "the slow upstream holds %zu of 40 slots", held);
    cr_expect_lt(ms, 2000, "the other upstream's request took %ld ms", ms);
    pclose(load);
}

/* One connection with 40 streams, 40 slots, no bound per upstream: its share (25 %, 10) leaves
 * slots to another connection's request. */
Test(bounds, one_connection_leaves_slots_to_another)
{
    start_two(40, ", \"upstream_share_percent\": 100");
    FILE *load = slow_load(40, 1, 40);
    cr_assert_eq(tup_wait_count(fx_up(0), 10, 10000), 0, "the slow streams did not arrive");
    usleep(200 * 1000);
    size_t held = tup_count(fx_up(0));
    long ms = probe();
    cr_expect_leq(held, 10, "one connection holds %zu of 40 slots", held);
    cr_expect_lt(ms, 2000, "another connection's request took %ld ms", ms);
    pclose(load);
}

/* A HEADERS frame ending stream 'sid': GET 'path' with X-Test-Plan 'plan', each field a
 * literal without indexing (RFC 7541 6.2.2), so no HPACK state is needed. */
static void h2_get(int fd, uint32_t sid, const char *path, const char *plan)
{
    const char *f[] = { ":method", "GET",        ":scheme",   "http",        ":path",
                        path,      ":authority", "127.0.0.1", "x-test-plan", plan };
    unsigned char b[512];
    size_t n = 9;
    for (size_t i = 0; i < sizeof(f) / sizeof(*f); i++) {
        size_t len = strlen(f[i]);
        cr_assert_lt(len, 127);
        if (i % 2 == 0)
            b[n++] = 0; /* literal, new name */
        b[n++] = (unsigned char)len;
        memcpy(b + n, f[i], len);
        n += len;
    }
    size_t len = n - 9;
    unsigned char head[9] = { (unsigned char)(len >> 16),
                              (unsigned char)(len >> 8),
                              (unsigned char)len,
                              1 /* HEADERS */,
                              5 /* END_STREAM, END_HEADERS */,
                              (unsigned char)(sid >> 24),
                              (unsigned char)(sid >> 16),
                              (unsigned char)(sid >> 8),
                              (unsigned char)sid };
    memcpy(b, head, 9);
    cr_assert(raw_send_all(fd, b, n));
}

/* Issue 37: one worker, 4 slots, 75 % an upstream (3), 50 % a connection (2). An HTTP/2
 * connection holds two slow requests (its share) and asks a third while another client's
 * 0.9 s request holds the upstream's last slot; a third client's request to that upstream
 * waits behind. When the 0.9 s one ends, 2 of 4 slots and both of its shares are free: it goes
 * then, not when the connection's requests end: measured 0.90 s, and 7.96 s before the fix. */
Test(bounds, a_request_that_fits_goes_when_slots_free_behind_a_busy_connection)
{
    fx_upstreams(1);
    fx_start_r("\"limits\": {\"max_upstream_requests\": 4, \"upstream_share_percent\": 75, "
               "\"connection_share_percent\": 50}",
               "\"timeout_ms\": 30000", "--workers", "1", NULL);
    int c = fx_hold(raw_dial(px->port));
    cr_assert(raw_send_all(c, PREFACE, sizeof(PREFACE) - 1));
    h2_get(c, 1, "/slow/1", "delay=8000");
    h2_get(c, 3, "/slow/2", "delay=8000");
    cr_assert_eq(tup_wait_count(up, 2, 5000), 0, "the connection's two requests did not arrive");
    http_call_start(&fx_calls[0], fx_url("/medium"), "medium", "delay=900");
    cr_assert_eq(tup_wait_count(up, 3, 5000), 0, "the 0.9 s request did not arrive");
    h2_get(c, 5, "/slow/3", "delay=8000"); /* the upstream's share is used up, and its own */
    cr_assert_eq(fx_wait_metric("retryproxy_upstream_requests_waiting", 1, 5000), 1);
    http_call_start(&fx_calls[1], fx_url("/fast"), "fast", NULL);
    http_call_join(&fx_calls[1]);
    long ms = (long)(fx_calls[1].t_end - fx_calls[1].t_start);
    cr_expect_eq(fx_calls[1].r.status, 200);
    cr_expect_lt(ms, 4000, "the request that fits waited %ld ms", ms);
    http_call_join(&fx_calls[0]);
    cr_expect_eq(fx_calls[0].r.status, 200);
    fx_release(c);
    close(c);
}

/* Two pods of one service: svc.test's addresses 127.0.0.2 and .3 (tests/support/pods.h). */
static struct dnsm *dns;
static struct tup *pod[2];

/* The pods stop first: the requests a test left at the slow one end at once, and the proxy's
 * drain with them. */
static void pods_teardown(void)
{
    for (size_t i = 0; i < 2; i++) {
        tup_stop(pod[i]);
        pod[i] = NULL;
    }
    fx_stop();
    dnsm_stop(dns);
    dns = NULL;
}

/* Whether the pods got *arg requests between them. */
static bool pods_got(void *arg)
{
    return tup_count(pod[0]) + tup_count(pod[1]) >= *(size_t *)arg;
}

/* A GET of 'path' with X-Test-Plan 'plan' (NULL: none) to the proxy: how long it took
 * (asserts a 200). */
static long get_ms(const char *path, const char *plan)
{
    char ph[96];
    snprintf(ph, sizeof(ph), "X-Test-Plan: %s", plan ? plan : "");
    const char *h[] = { plan ? ph : NULL, NULL };
    struct http_resp r;
    int64_t t0 = now_ms();
    http_do("GET", fx_url(path), h, NULL, 0, 20000, &r);
    long ms = (long)(now_ms() - t0);
    cr_expect_eq(r.rc, 0);
    cr_expect_eq(r.status, 200, "%s: %ld", path, r.status);
    http_free(&r);
    return ms;
}

/* Issue 38 part 8: the share is an endpoint's, not the upstream's. One upstream name with two
 * addresses, 4 slots, 50 %: an endpoint holds 2. Round-robin (weights off) sends the slow
 * requests (6 s) to one pod and the quick ones to the other: while the slow pod holds its 2
 * slots and a third request waits for it, its sibling's requests go at once (on the share per
 * upstream URL they waited the 6 s), and the slow pod never holds more than 2. */
/* svc.test with the two pods' addresses; the proxy (one worker, 4 slots, 50 %: an endpoint
 * holds 2) with route "r" to it, round-robin, weights off, so that attempts alternate. */
static void two_pods(void)
{
    fx_init_curl();
    uint16_t port = pods_start(pod, 2);
    dns = dnsm_start();
    cr_assert_not_null(dns);
    const char *ips[] = { pods_ip(0), pods_ip(1) };
    cr_assert_eq(dnsm_set(dns, "svc.test", ips, 2), 0);
    struct cfgb *b = cfgb_new();
    cfgb_top(b,
             "\"resolver\": {\"servers\": [\"%s\"]}, \"limits\": {\"max_upstream_requests\": 4, "
             "\"upstream_share_percent\": 50}",
             dns->server);
    cfgb_route(b, "r",
               "\"upstreams\": [\"http://svc.test:%u\"], \"balance\": \"round_robin\", "
               "\"weigh_endpoints\": false, \"timeout_ms\": 30000",
               port);
    fx_start_b(b, "--workers", "1", NULL);
}

Test(bounds, a_slow_endpoint_leaves_slots_to_its_siblings, .fini = pods_teardown)
{
    two_pods();
    long quick[3];
    for (int i = 0; i < 3; i++) {
        http_call_start(&fx_calls[i], fx_url("/slow"), NULL, "delay=6000");
        /* the slow ones arrive (the third waits once two are there) */
        if (i < 2)
            cr_assert(fx_wait(pods_got, &(size_t){ 2 * (size_t)i + 1 }, 5000, 10),
                      "slow request %d did not arrive", i);
        else
            cr_expect_eq(fx_wait_metric("retryproxy_upstream_requests_waiting", 1, 5000), 1,
                         "the third slow request does not wait for its endpoint's share");
        quick[i] = get_ms("/quick", NULL);
    }
    size_t slow = tup_count(pod[0]) == 2 ? 0 : 1;
    cr_log_info("quick requests beside the slow pod: %ld, %ld, %ld ms", quick[0], quick[1],
                quick[2]);
    for (int i = 0; i < 3; i++)
        cr_expect_lt(quick[i], 3000, "quick request %d took %ld ms behind the slow pod", i,
                     quick[i]);
    cr_expect_eq(tup_count(pod[slow]), 2, "the slow pod holds %zu of 4 slots, its share 2",
                 tup_count(pod[slow]));
    cr_expect_eq(tup_count(pod[1 - slow]), 3, "the quick pod had %zu", tup_count(pod[1 - slow]));
    for (int i = 0; i < 3; i++) {
        http_call_join(&fx_calls[i]);
        cr_expect_eq(fx_calls[i].r.status, 200, "slow request %d: %ld", i, fx_calls[i].r.status);
    }
    cr_expect_eq(tup_count(pod[slow]), 3, "the waiting one went to the slow pod once it had room");
}

/* What get_async() waits for: the pods got *arg requests between them, or one waits for a
 * slot. */
static bool arrived_or_waits(void *arg)
{
    return pods_got(arg) || fx_metric("retryproxy_upstream_requests_waiting") >= 1;
}

/* GET 'path' on a connection of its own, the answer left unread (fx_stop closes it); returns
 * once the request reached a pod or waits for a slot. */
static void get_async(const char *path)
{
    size_t n = tup_count(pod[0]) + tup_count(pod[1]) + 1;
    int fd = fx_hold(raw_dial(px->port));
    char req[128];
    int len = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: svc\r\n\r\n", path);
    cr_assert(raw_send_all(fd, req, (size_t)len));
    cr_assert(fx_wait(arrived_or_waits, &n, 5000, 10), "%s went nowhere", path);
}

/* The share is the endpoint's whatever config snapshot its requests started under: after a
 * reload, the new snapshot's target of the slow pod (which holds its 2 slots under the old
 * one) finds the same share, so a request to it waits rather than making it 3. */
Test(bounds, an_endpoint_keeps_its_share_across_a_reload, .fini = pods_teardown)
{
    two_pods();
    tup_set_default_plan(pod[0], "delay=6000");
    for (int i = 0; i < 8 && tup_count(pod[0]) < 2; i++)
        get_async("/before");
    cr_assert_eq(tup_count(pod[0]), 2, "the slow pod got %zu", tup_count(pod[0]));
    cr_assert_eq(kill(px->pid, SIGHUP), 0);
    cr_assert_eq(fx_wait_metric("retryproxy_config_generation", 2, 5000), 2, "no reload");
    for (int i = 0; i < 8 && fx_metric("retryproxy_upstream_requests_waiting") < 1; i++)
        get_async("/after");
    cr_expect_eq(fx_metric("retryproxy_upstream_requests_waiting"), 1,
                 "no request of the new config waits for the slow pod");
    cr_expect_eq(tup_count(pod[0]), 2, "the slow pod holds %zu after the reload, its share 2",
                 tup_count(pod[0]));
}
