/* Endpoints for HTTP/2, gRPC, https and upgrades (docs/endpoints.md): dnsmasq answers svc.test
 * with 127.0.0.2 and 127.0.0.3, two upstreams listen there on one port, and a route to
 * "SCHEME://svc.test:PORT" spreads the calls of one client connection over both. Each upstream
 * keeps its own records, so the test sees which endpoint got what. The HTTP/1.1 cases (a record
 * followed, retries, DNS failing, ejection) are test_endpoints.c's.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/dnsmasq.h"
#include "tests/support/fixture.h"
#include "tests/support/h2u.h"
#include "tests/support/wsu.h"

#define PY "/usr/bin/python3"
#define N  20 /* calls per test: generous, so that "both got some" never hangs on luck */

static const char *const pods[] = { "127.0.0.2", "127.0.0.3" };

static struct dnsm *dns;
static char dir[64]; /* certificates */
static pid_t grpc_pid[2] = { -1, -1 };
static int grpc_in[2] = { -1, -1 };
static char grpc_rec[2][96];

static void stop(void)
{
    for (int i = 0; i < 2; i++)
        if (grpc_pid[i] > 0) {
            proc_helper_stop(grpc_pid[i], grpc_in[i]);
            unlink(grpc_rec[i]);
        }
    h2u_stop_all();
    wsu_stop_all();
    fx_stop();
    dnsm_stop(dns);
    if (dir[0])
        rm_tree(dir);
}

TestSuite(endpoints_h2, .fini = stop, .timeout = 120);

/* dnsmasq answering svc.test with both pods. */
static void dns_both(void)
{
    dns = dnsm_start();
    cr_assert_not_null(dns, "cannot start dnsmasq (dnsmasq-base missing?)");
    cr_assert_eq(dnsm_set(dns, "svc.test", pods, 2), 0);
}

/* The proxy (one worker) with route "r" to 'url', the route members 'more' ("" or ", ...") and
 * the retry members 'retry' (the same), resolving through dnsmasq. */
static void start_proxy_retry(const char *url, const char *more, const char *retry)
{
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"resolver\": {\"servers\": [\"%s\"]}", dns->server);
    cfgb_route(b, "r", "\"upstreams\": [\"%s\"], \"retry\": {" CFG_FAST "%s}%s", url, retry, more);
    fx_start_b(b, "--workers", "1", NULL);
}

static void start_proxy(const char *url, const char *more)
{
    start_proxy_retry(url, more, "");
}

/* Two scripted HTTP/2 upstreams, one per pod, on one port; TLS with certificate NAME.pem when
 * 'cert' is not NULL. */
static void two_h2u(struct h2u *u[2], const char *cert, const char *alpn)
{
    char pem[128] = "", key[128] = "";
    if (cert) {
        snprintf(pem, sizeof(pem), "%s/%s.pem", dir, cert);
        snprintf(key, sizeof(key), "%s/%s.key", dir, cert);
    }
    u[0] = h2u_start_at(pods[0], 0, cert ? pem : NULL, key, alpn);
    u[1] = h2u_start_at(pods[1], h2u_port(u[0]), cert ? pem : NULL, key, alpn);
}

/* Self-signed certificates in dir: svc.pem for svc.test, other.pem for other.test. */
static void make_certs(void)
{
    snprintf(dir, sizeof(dir), "/tmp/retryproxy-eph2-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    fx_make_cert(dir, "svc", "DNS:svc.test");
    fx_make_cert(dir, "other", "DNS:other.test");
}

/* Records of 'u' whose "event" is 'ev' (and member 'key' the string 'value', unless NULL). */
static size_t events(const struct h2u *u, const char *ev, const char *key, const char *value)
{
    json_t *all = h2u_records(u), *r;
    size_t i, n = 0;
    json_array_foreach(all, i, r)
    {
        const char *e = json_str(r, "event"), *v = key ? json_str(r, key) : NULL;
        n += e && strcmp(e, ev) == 0 && (!key || (v && strcmp(v, value) == 0));
    }
    json_decref(all);
    return n;
}

/* 'n' GETs of 'path' over one client HTTP/2 connection with prior knowledge, four streams at
 * once (h2load -c 1; curl 7.88's command line fails to reuse such a connection); asserts each
 * got a 2xx. */
static void h2c_calls(const char *path, int n)
{
    char cmd[256], line[256], all[96], codes[64];
    snprintf(cmd, sizeof(cmd), "timeout -s KILL 60 h2load -n %d -c 1 -m 4 %s 2>&1", n,
             fx_url(path));
    snprintf(all, sizeof(all), "requests: %d total, %d started, %d done, %d succeeded", n, n, n, n);
    snprintf(codes, sizeof(codes), "status codes: %d 2xx", n);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    bool done = false, ok = false;
    while (fgets(line, sizeof(line), p)) {
        done |= strstr(line, all) != NULL;
        ok |= strstr(line, codes) != NULL;
    }
    cr_expect_eq(pclose(p), 0, "h2load failed");
    cr_assert(done && ok, "h2load did not get %d answers 2xx", n);
}

/* h2c: the calls of one client HTTP/2 connection go to both pods, each over a session of its
 * own, with the URL's authority. */
Test(endpoints_h2, h2c_calls_of_one_connection_spread_over_both_endpoints)
{
    dns_both();
    struct h2u *u[2];
    two_h2u(u, NULL, NULL);
    char url[96];
    snprintf(url, sizeof(url), "h2c://svc.test:%u/base", h2u_port(u[0]));
    start_proxy(url, "");
    h2c_calls("/x", N);
    size_t a = h2u_count(u[0], "action", "answered"), b = h2u_count(u[1], "action", "answered");
    cr_expect_gt(a, 0, "127.0.0.2 got none (127.0.0.3: %zu)", b);
    cr_expect_gt(b, 0, "127.0.0.3 got none (127.0.0.2: %zu)", a);
    cr_expect_eq(a + b, N);
    char auth[64];
    snprintf(auth, sizeof(auth), "svc.test:%u", h2u_port(u[0]));
    cr_expect_eq(h2u_count(u[0], "authority", auth) + h2u_count(u[1], "authority", auth), N,
                 "the name, not the address, in :authority");
    cr_expect_eq(h2u_connections(u[0]), 1);
    cr_expect_eq(h2u_connections(u[1]), 1);
}

/* A grpcio server on 'ip' and 'port' (0: one the kernel picks), recording into grpc_rec[i];
 * its port. */
static uint16_t grpc_server(int i, const char *ip, uint16_t port)
{
    snprintf(grpc_rec[i], sizeof(grpc_rec[i]), "/tmp/retryproxy-eph2-grpc-%d-%d.jsonl",
             (int)getpid(), i);
    unlink(grpc_rec[i]);
    char bind[32];
    snprintf(bind, sizeof(bind), "%s:%u", ip, port);
    char *argv[] = {
        PY, "tests/tools/grpc_peer.py", "server", "--record", grpc_rec[i], "--bind", bind, NULL
    };
    char buf[64];
    grpc_pid[i] = proc_helper_start(argv, &grpc_in[i], buf, sizeof(buf), 15000);
    cr_assert_gt(grpc_pid[i], 0, "cannot start grpc_peer.py");
    unsigned p = 0;
    cr_assert_eq(sscanf(buf, "port %u", &p), 1, "grpc_peer.py server printed \"%s\"", buf);
    return (uint16_t)p;
}

static size_t lines_of(const char *path)
{
    json_t *all = fx_read_jsonl(path);
    size_t n = json_array_size(all);
    json_decref(all);
    return n;
}

/* gRPC: the calls of one grpcio channel (one connection to the proxy) go to both pods. */
Test(endpoints_h2, grpc_calls_of_one_channel_spread_over_both_endpoints)
{
    dns_both();
    uint16_t port = grpc_server(0, pods[0], 0);
    cr_assert_eq(grpc_server(1, pods[1], port), port);
    char url[96];
    snprintf(url, sizeof(url), "h2c://svc.test:%u", port);
    start_proxy(url, ", \"match\": {\"path_prefix\": \"/test.Echo/\"}");
    char target[32], repeat[8];
    snprintf(target, sizeof(target), "127.0.0.1:%u", px->port);
    snprintf(repeat, sizeof(repeat), "%d", N);
    char *argv[] = { PY,
                     "tests/tools/grpc_peer.py",
                     "call",
                     "--target",
                     target,
                     "--method",
                     "/test.Echo/Unary",
                     "--message",
                     "hello",
                     "--repeat",
                     repeat,
                     NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 60000, &r), 0);
    cr_assert_eq(r.status, 0, "grpc_peer.py call: %d\n%s", r.status, r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j, "not JSON: %s", r.out);
    proc_result_free(&r);
    json_t *codes = json_object_get(j, "codes");
    cr_expect_eq(json_integer_value(json_object_get(codes, "OK")), N, "every call OK");
    json_decref(j);
    size_t a = lines_of(grpc_rec[0]), b = lines_of(grpc_rec[1]);
    cr_expect_gt(a, 0, "127.0.0.2 got none (127.0.0.3: %zu)", b);
    cr_expect_gt(b, 0, "127.0.0.3 got none (127.0.0.2: %zu)", a);
    cr_expect_eq(a + b, N);
}

/* 'n' GETs of 'path' over HTTP/1.1; the statuses that were 'want'. */
static int h1_calls(const char *path, int n, long want)
{
    int ok = 0;
    for (int i = 0; i < n; i++) {
        struct http_resp r;
        http_do("GET", fx_url(path), NULL, NULL, 0, 20000, &r);
        cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
        ok += r.status == want;
        http_free(&r);
    }
    return ok;
}

/* The https route over two TLS pods whose certificate is 'cert', with 'http2' and ALPN
 * 'alpn'. */
static void start_https(struct h2u *u[2], const char *cert, const char *alpn, const char *http2)
{
    make_certs();
    dns_both();
    two_h2u(u, cert, alpn);
    char url[96], more[256];
    snprintf(url, sizeof(url), "https://svc.test:%u/base", h2u_port(u[0]));
    snprintf(more, sizeof(more), ", \"tls\": {\"http2\": \"%s\", \"ca_file\": \"%s/%s.pem\"}",
             http2, dir, cert);
    start_proxy(url, more);
}

/* https with h2 chosen by ALPN: both pods get calls, each session's handshake sent the name
 * in SNI and the name's certificate was accepted. */
Test(endpoints_h2, https_h2_spreads_over_both_endpoints_checking_the_name)
{
    struct h2u *u[2];
    start_https(u, "svc", "h2", "auto");
    cr_expect_eq(h1_calls("/x", N, 200), N);
    size_t a = h2u_count(u[0], "action", "answered"), b = h2u_count(u[1], "action", "answered");
    cr_expect_gt(a, 0, "127.0.0.2 got none (127.0.0.3: %zu)", b);
    cr_expect_gt(b, 0, "127.0.0.3 got none (127.0.0.2: %zu)", a);
    cr_expect_eq(a + b, N);
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(events(u[i], "tls", "alpn", "h2"), 1, "one h2 session per pod");
        cr_expect_eq(events(u[i], "tls", "sni", "svc.test"), 1, "the name in SNI");
    }
}

/* https over HTTP/1.1 (libcurl pinned to each address): both pods get calls, SNI is the
 * name. */
Test(endpoints_h2, https_http1_spreads_over_both_endpoints_checking_the_name)
{
    struct h2u *u[2];
    start_https(u, "svc", "http/1.1", "off");
    cr_expect_eq(h1_calls("/x", N, 200), N);
    size_t a = events(u[0], "http1", "path", "/base/x"),
           b = events(u[1], "http1", "path", "/base/x");
    cr_expect_gt(a, 0, "127.0.0.2 got none (127.0.0.3: %zu)", b);
    cr_expect_gt(b, 0, "127.0.0.3 got none (127.0.0.2: %zu)", a);
    cr_expect_eq(a + b, N);
    for (int i = 0; i < 2; i++) {
        cr_expect_gt(events(u[i], "tls", "sni", "svc.test"), 0, "the name in SNI");
        cr_expect_eq(events(u[i], "tls", "alpn", "h2"), 0);
    }
}

/* Pods whose certificate is for another name: every attempt, over h2 or HTTP/1.1, is a connect
 * failure (502), though the handshakes reached both pods. */
static void wrong_name(const char *alpn, const char *http2)
{
    struct h2u *u[2];
    start_https(u, "other", alpn, http2);
    /* trust other.pem, so that only the name can be what fails */
    cr_expect_eq(h1_calls("/x", 4, 502), 4);
    double cf = fx_metric("retryproxy_attempts_total{route=\"r\",outcome=\"connect_failure\"}");
    cr_expect_geq(cf, 4, "connect failures: %g", cf);
    cr_expect_eq(h2u_count(u[0], "action", "answered") + h2u_count(u[1], "action", "answered"), 0);
    cr_expect_eq(events(u[0], "http1", NULL, NULL) + events(u[1], "http1", NULL, NULL), 0);
    cr_expect_gt(events(u[0], "accepted", NULL, NULL) + events(u[1], "accepted", NULL, NULL), 0,
                 "no handshake reached a pod");
}

Test(endpoints_h2, https_h2_certificate_for_another_name_is_a_connect_failure)
{
    wrong_name("h2", "auto");
}

Test(endpoints_h2, https_http1_certificate_for_another_name_is_a_connect_failure)
{
    wrong_name("http/1.1", "off");
}

/* Upgrades: WebSocket tunnels go to both pods. */
Test(endpoints_h2, websocket_tunnels_spread_over_both_endpoints)
{
    dns_both();
    struct wsu *u0 = wsu_start_at(pods[0], 0);
    struct wsu *u1 = wsu_start_at(pods[1], wsu_port(u0));
    char url[96];
    snprintf(url, sizeof(url), "http://svc.test:%u", wsu_port(u0));
    start_proxy(url, "");
    char ws[128];
    snprintf(ws, sizeof(ws), "ws://127.0.0.1:%u/chat", px->port);
    for (int i = 0; i < 8; i++) {
        json_t *res = wsu_client(ws, "text");
        cr_expect(json_is_true(json_object_get(res, "ok")), "tunnel %d failed", i);
        json_decref(res);
    }
    size_t a = wsu_count(u0, "handshake", "/chat"), b = wsu_count(u1, "handshake", "/chat");
    cr_expect_gt(a, 0, "127.0.0.2 got none (127.0.0.3: %zu)", b);
    cr_expect_gt(b, 0, "127.0.0.3 got none (127.0.0.2: %zu)", a);
    cr_expect_eq(a + b, 8);
}

struct goaway_wait {
    const struct h2u *u;
    const char *ev;
};

static bool saw(void *arg)
{
    struct goaway_wait *g = arg;
    return events(g->u, g->ev, NULL, NULL) > 0;
}

/* An h2c pod that leaves the record while idle: its session gets a GOAWAY (NO_ERROR) and
 * closes within a few seconds, and the next calls all go to the pod that stayed. */
Test(endpoints_h2, an_idle_h2c_endpoint_that_leaves_gets_goaway_and_no_new_calls)
{
    dns_both();
    struct h2u *u[2];
    two_h2u(u, NULL, NULL);
    char url[96];
    snprintf(url, sizeof(url), "h2c://svc.test:%u/base", h2u_port(u[0]));
    start_proxy(url, "");
    h2c_calls("/before", 6);
    cr_assert_gt(h2u_count(u[1], "path", "/base/before"), 0, "127.0.0.3 was never used");
    cr_assert_eq(events(u[1], "goaway", NULL, NULL), 0);
    cr_assert_eq(dnsm_set(dns, "svc.test", pods, 1), 0);
    /* TTL 1 s, min_refresh_ms 1 s: the lookup comes back within about 2 s; generous */
    struct goaway_wait g = { u[1], "goaway" };
    cr_assert(fx_wait(saw, &g, 10000, 50), "no GOAWAY to the pod that left");
    json_t *rec = NULL, *all = h2u_records(u[1]), *r;
    size_t i;
    json_array_foreach(all, i, r) if (!rec && json_str(r, "event") &&
                                      strcmp(json_str(r, "event"), "goaway") == 0) rec = r;
    cr_expect_eq(json_integer_value(json_object_get(rec, "error_code")), 0, "NO_ERROR");
    json_decref(all);
    g.ev = "closed";
    cr_expect(fx_wait(saw, &g, 10000, 50), "the session to the pod that left stayed open");
    h2c_calls("/after", 6);
    cr_expect_eq(h2u_count(u[0], "path", "/base/after"), 6);
    cr_expect_eq(h2u_count(u[1], "path", "/base/after"), 0);
    cr_expect_eq(h2u_connections(u[1]), 1, "no new connection to the pod that left");
}

/* A gRPC call that fails UNAVAILABLE on one pod is retried on the other, never on the same
 * one: with "random" balance a retry that ignored where the call had been would land on the
 * same pod half the time. */
Test(endpoints_h2, a_grpc_retry_over_h2c_goes_to_the_other_endpoint)
{
    dns_both();
    struct h2u *u[2];
    two_h2u(u, NULL, NULL);
    char url[96];
    snprintf(url, sizeof(url), "h2c://svc.test:%u", h2u_port(u[0]));
    start_proxy_retry(url, ", \"balance\": \"random\"",
                      ", \"max_attempts\": 2, \"retry_on\": [\"unavailable\"]");
    static const char msg[8] = { 0, 0, 0, 0, 3, 'a', 'b', 'c' };
    for (int i = 0; i < 10; i++) {
        char id[64];
        snprintf(id, sizeof(id), "X-Request-Id: ep-grpc-%d", i);
        const char *h[] = { id, "Content-Type: application/grpc", "x-h2-scenario: trailers",
                            "x-h2-grpc-status: 14", NULL };
        struct http_resp r;
        http_do("POST", fx_url("/test.Echo/Unary"), h, msg, sizeof(msg), 20000, &r);
        cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
        cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2", "call %d", i);
        http_free(&r);
        cr_expect_eq(h2u_count(u[0], "request_id", id + 14), 1, "call %d on 127.0.0.2", i);
        cr_expect_eq(h2u_count(u[1], "request_id", id + 14), 1, "call %d on 127.0.0.3", i);
    }
}

/* A slow GET on its own thread, with x-h2-delay-ms. */
struct slow {
    pthread_t th;
    char url[128];
    struct http_resp r;
};

static void *slow_run(void *arg)
{
    struct slow *s = arg;
    const char *h[] = { "x-h2-delay-ms: 6000", NULL };
    http_do("GET", s->url, h, NULL, 0, 30000, &s->r);
    return NULL;
}

/* The endpoint 'addr' of route r's first upstream in the admin view: its in_flight, and its
 * state in state[cap] ("" when it is not listed). */
static long endpoint_view(const char *addr, char *state, size_t cap)
{
    json_t *v = fx_admin_get_json("/upstreams"), *e;
    json_t *eps = json_object_get(
        json_array_get(
            json_object_get(json_array_get(json_object_get(v, "routes"), 0), "upstreams"), 0),
        "endpoints");
    size_t i;
    long in_flight = -1;
    state[0] = '\0';
    json_array_foreach(eps, i, e)
    {
        const char *a = json_str(e, "address");
        if (a && strcmp(a, addr) == 0) {
            in_flight = (long)json_integer_value(json_object_get(e, "in_flight"));
            snprintf(state, cap, "%s", json_str(e, "state") ? json_str(e, "state") : "?");
        }
    }
    json_decref(v);
    return in_flight;
}

/* An h2c pod that leaves the record while calls are in flight on it: they finish (200), it is
 * "leaving" meanwhile, and its session gets the GOAWAY only once they are done. */
Test(endpoints_h2, an_h2c_endpoint_that_leaves_with_calls_in_flight_finishes_them_then_goaway)
{
    dns_both();
    struct h2u *u[2];
    two_h2u(u, NULL, NULL);
    char url[96], leaving[32], state[32];
    snprintf(url, sizeof(url), "h2c://svc.test:%u/base", h2u_port(u[0]));
    snprintf(leaving, sizeof(leaving), "127.0.0.3:%u", h2u_port(u[0]));
    start_proxy(url, "");
    struct slow s[4];
    for (int i = 0; i < 4; i++) {
        snprintf(s[i].url, sizeof(s[i].url), "%s", fx_url("/slow"));
        cr_assert_eq(pthread_create(&s[i].th, NULL, slow_run, &s[i]), 0);
    }
    int64_t until = now_ms() + 3000;
    while (endpoint_view(leaving, state, sizeof(state)) < 1 && now_ms() < until)
        sleep_ms(50);
    cr_assert_geq(endpoint_view(leaving, state, sizeof(state)), 1, "no call in flight on it");
    cr_assert_eq(dnsm_set(dns, "svc.test", pods, 1), 0);
    until = now_ms() + 5000;
    long in_flight = 0;
    while (now_ms() < until) {
        in_flight = endpoint_view(leaving, state, sizeof(state));
        if (strcmp(state, "leaving") == 0)
            break;
        sleep_ms(50);
    }
    cr_expect_str_eq(state, "leaving");
    cr_expect_geq(in_flight, 1, "its calls ended before it was seen leaving");
    cr_expect_eq(events(u[1], "goaway", NULL, NULL), 0, "a GOAWAY while calls were in flight");
    for (int i = 0; i < 4; i++) {
        pthread_join(s[i].th, NULL);
        cr_expect_eq(s[i].r.rc, 0, "curl error %d", s[i].r.rc);
        cr_expect_eq(s[i].r.status, 200, "call %d", i);
        const char *n = http_hdr(&s[i].r, "X-Retry-Attempts");
        cr_expect(n && strcmp(n, "1") == 0, "call %d took %s attempts", i, n ? n : "?");
        http_free(&s[i].r);
    }
    size_t done = h2u_count(u[1], "path", "/base/slow");
    cr_expect_geq(done, 1);
    struct goaway_wait g = { u[1], "goaway" };
    cr_expect(fx_wait(saw, &g, 10000, 50), "no GOAWAY once its calls were done");
    h2c_calls("/after", 6);
    cr_expect_eq(h2u_count(u[1], "path", "/base/after"), 0);
    cr_expect_eq(h2u_count(u[0], "path", "/base/after"), 6);
}
