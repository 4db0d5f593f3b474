/* Endpoints (docs/endpoints.md), end to end over HTTP/1.1 through libcurl: a host name stands for
 * every address a real DNS server (dnsmasq, tests/support/dnsmasq.h) gives it, each request is
 * balanced over them, a retry goes elsewhere, a changed record is followed without a reload and
 * a DNS server that fails leaves the last addresses in use. The pods of one service are test
 * upstreams on 127.0.0.2, .3 and .4, on one port; what each received shows where attempts went.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/cfgb.h"
#include "tests/support/dnsmasq.h"
#include "tests/support/fixture.h"
#include "tests/support/pods.h"
#include "tests/support/proc.h"

#define T    20000 /* ms: upper bound for any single request */
#define PODS 3

static struct dnsm *dns;
static struct tup *pod[PODS]; /* 127.0.0.2 + i */
static uint16_t port;

static void teardown(void)
{
    fx_stop();
    for (size_t i = 0; i < PODS; i++) {
        tup_stop(pod[i]);
        pod[i] = NULL;
    }
    dnsm_stop(dns);
    dns = NULL;
}

TestSuite(endpoints, .fini = teardown, .timeout = 90);

static const char *pod_ip(size_t i)
{
    return pods_ip(i);
}

/* Upstreams on 127.0.0.2.. (the first 'n' of them: the others' address refuses) on one port
 * the kernel gave the first, and dnsmasq answering svc.test with 'n_dns' of the addresses. */
static void pods(size_t n, size_t n_dns)
{
    fx_init_curl();
    port = pods_start(pod, n ? n : 1);
    if (!n) { /* no upstream runs: a port nothing listens on */
        tup_stop(pod[0]);
        pod[0] = NULL;
    }
    dns = dnsm_start();
    cr_assert_not_null(dns);
    const char *ips[PODS] = { pod_ip(0), pod_ip(1), pod_ip(2) };
    cr_assert_eq(dnsm_set(dns, "svc.test", ips, n_dns), 0);
}

/* The proxy with route "r" to http://svc.test:PORT and 'more' route members. */
static void start(const char *more)
{
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"resolver\": {\"servers\": [\"%s\"]}", dns->server);
    cfgb_route(b, "r", "\"upstreams\": [\"http://svc.test:%u\"]%s%s", port, *more ? ", " : "",
               more);
    fx_start_b(b, "--workers", "1", NULL);
}

/* One GET with request id 'id' and plan 'plan' (NULL: the pod's default); its status. */
static long get(const char *id, const char *plan)
{
    return fx_get_id_plan(id, plan);
}

static size_t got(size_t i)
{
    return pod[i] ? tup_count(pod[i]) : 0;
}

/* Endpoint 'ip' in /upstreams (new reference), NULL when it is not listed. */
static json_t *endpoint_of(const char *ip)
{
    return pods_endpoint(ip, port);
}

/* The state of endpoint 'ip' in /upstreams, "" when it is not listed. */
static const char *state_of(const char *ip)
{
    return pods_state(ip, port);
}

/* The in_flight of endpoint 'ip' in /upstreams, -1 when it is not listed. */
static long long in_flight_of(const char *ip)
{
    json_t *e = endpoint_of(ip);
    long long n = e ? (long long)json_integer_value(json_object_get(e, "in_flight")) : -1;
    json_decref(e);
    return n;
}

/* Polls endpoint 'ip''s in_flight until it is 'want' (at most 'ms'); the last value seen. */
static long long wait_in_flight(const char *ip, long long want, int ms)
{
    int64_t until = now_ms() + ms;
    long long n;
    while ((n = in_flight_of(ip)) != want && now_ms() < until)
        sleep_ms(20);
    return n;
}

/* retryproxy_FAMILY{route="r",upstream=svc.test's,LABEL="VALUE"} (NaN: no such series). */
static double svc_metric(const char *family, const char *label, const char *value)
{
    char series[256];
    snprintf(series, sizeof(series),
             "retryproxy_%s{route=\"r\",upstream=\"http://svc.test:%u\",%s=\"%s\"}", family, port,
             label, value);
    return fx_metric(series);
}

static double ep_metric(const char *state)
{
    return svc_metric("upstream_endpoints", "state", state);
}

/* Requests one after another go round the three endpoints (least_request with nothing in
 * flight: the one in turn), each getting a third. */
Test(endpoints, requests_spread_over_every_address_of_the_name)
{
    pods(3, 3);
    start("");
    for (int i = 0; i < 30; i++) {
        char id[32];
        snprintf(id, sizeof(id), "s-%d", i);
        cr_assert_eq(get(id, NULL), 200);
    }
    for (size_t i = 0; i < PODS; i++)
        cr_expect_eq(got(i), 10, "%s got %zu of 30", pod_ip(i), got(i));
    cr_expect_eq(ep_metric("healthy"), 3);
    json_t *j = fx_admin_get_json("/upstreams");
    json_t *u = json_array_get(
        json_object_get(json_array_get(json_object_get(j, "routes"), 0), "upstreams"), 0);
    json_t *name = json_object_get(u, "dns");
    cr_expect_str_eq(json_str(name, "name"), "svc.test");
    cr_expect_str_eq(json_str(name, "result"), "ok");
    cr_expect_eq(json_integer_value(json_object_get(name, "ttl_s")), 1);
    cr_expect_eq(json_array_size(json_object_get(u, "endpoints")), 3);
    json_decref(j);
    char series[128];
    snprintf(series, sizeof(series),
             "retryproxy_dns_resolutions_total{name=\"svc.test\","
             "result=\"ok\"}");
    cr_expect_geq(fx_metric(series), 1);
}

/* least_request: a slow endpoint holds requests in flight, so new ones go to the others. */
Test(endpoints, a_slow_endpoint_gets_fewer_requests)
{
    pods(2, 2);
    tup_set_default_plan(pod[0], "delay=1500");
    start("");
    struct http_call c[8];
    char url[256];
    px_url(px, "/", url, sizeof(url));
    for (int i = 0; i < 8; i++) {
        char id[32];
        snprintf(id, sizeof(id), "lr-%d", i);
        http_call_start(&c[i], url, id, NULL);
        sleep_ms(100); /* each one after the last reached its pod */
    }
    for (int i = 0; i < 8; i++) {
        http_call_join(&c[i]);
        cr_expect_eq(c[i].r.status, 200);
        http_free(&c[i].r);
    }
    /* round-robin would give each 4; the slow one keeps its first in flight */
    cr_expect_leq(got(0), 2, "the slow endpoint got %zu of 8", got(0));
    cr_expect_eq(got(0) + got(1), 8);
}

/* An endpoint that refuses connections: a request that failed there is retried on another,
 * never back on it, whatever its turn (random picks: the turn would not move on by itself). */
Test(endpoints, a_retry_never_goes_back_to_the_endpoint_that_refused)
{
    pods(2, 3); /* 127.0.0.4 is in the record, nothing listens there */
    /* weigh_endpoints false: the refusing one keeps its third of first attempts, which this
     * test counts on to see retries */
    start("\"balance\": \"random\", \"weigh_endpoints\": false, "
          "\"retry\": {\"max_attempts\": 5, \"retry_on\": [\"connect-failure\"], " CFG_FAST "}");
    for (int i = 0; i < 60; i++) {
        char id[32];
        snprintf(id, sizeof(id), "r-%d", i);
        cr_assert_eq(get(id, NULL), 200);
    }
    size_t retried = 0;
    for (size_t p = 0; p < 2; p++)
        for (size_t i = 0; i < got(p); i++) {
            const char *a = tup_req_header(tup_get(pod[p], i), "X-Retry-Attempt");
            cr_assert_not_null(a);
            cr_expect(strcmp(a, "1") == 0 || strcmp(a, "2") == 0,
                      "a request took attempt %s: it went back to the refusing endpoint", a);
            retried += strcmp(a, "2") == 0;
        }
    cr_expect_eq(got(0) + got(1), 60);
    cr_expect_eq(fx_metric("retryproxy_attempts_total{route=\"r\",outcome=\"connect_failure\"}"),
                 (double)retried);
    cr_expect_geq(retried, 5, "a third of first attempts go to the refusing endpoint");
}

/* The record changes: within its TTL (1 s) and about a second, requests go to the new address,
 * and none fails meanwhile. */
Test(endpoints, a_changed_record_is_followed_without_a_reload)
{
    pods(2, 1); /* svc.test is 127.0.0.2 */
    start("");
    cr_assert_eq(get("before", NULL), 200);
    cr_assert_eq(got(0), 1);
    const char *now[] = { pod_ip(1) };
    cr_assert_eq(dnsm_set(dns, "svc.test", now, 1), 0);
    int64_t changed = now_ms(), moved = 0;
    for (int i = 0; i < 60 && !moved; i++) {
        char id[32];
        snprintf(id, sizeof(id), "c-%d", i);
        cr_assert_eq(get(id, NULL), 200, "%s failed while the record changed", id);
        if (tup_count_id(pod[1], id))
            moved = now_ms();
        else
            sleep_ms(50);
    }
    cr_assert(moved, "requests never reached the new address");
    cr_expect_lt(moved - changed, 4000, "followed after %lld ms (TTL 1 s)",
                 (long long)(moved - changed));
    size_t before = got(0);
    for (int i = 0; i < 5; i++)
        cr_expect_eq(get("after", NULL), 200);
    cr_expect_eq(got(0), before, "the address that left got requests");
    cr_expect_eq(fx_metric("retryproxy_config_generation"), 1, "no reload");
}

/* The DNS server dies, or stops answering: the addresses it last gave stay in use, every request
 * is answered in its usual time, and the name is said to be stale. */
static void dns_fails(bool freeze)
{
    pods(2, 2);
    start("");
    if (freeze)
        dnsm_freeze(dns);
    else
        dnsm_kill(dns);
    int64_t until = now_ms() + 4000, worst = 0;
    int n = 0;
    while (now_ms() < until) {
        char id[32];
        snprintf(id, sizeof(id), "d-%d", n++);
        int64_t t0 = now_ms();
        cr_assert_eq(get(id, NULL), 200, "%s failed with DNS down", id);
        worst = now_ms() - t0 > worst ? now_ms() - t0 : worst;
        sleep_ms(50);
    }
    cr_expect_lt(worst, 1000, "a request took %lld ms with DNS down", (long long)worst);
    cr_expect_gt(got(0), 0);
    cr_expect_gt(got(1), 0);
    cr_expect_eq(fx_wait_metric("retryproxy_dns_stale{name=\"svc.test\"}", 1, 5000), 1);
    cr_expect_geq(fx_metric("retryproxy_dns_resolutions_total{name=\"svc.test\","
                            "result=\"failure\"}"),
                  1);
    json_t *line = fx_logged("name lookup failed: keeping its last addresses", "name", "svc.test");
    cr_expect_not_null(line, "no log line says the name is stale");
    json_decref(line);
    if (freeze)
        dnsm_thaw(dns);
}

Test(endpoints, dns_killed_keeps_the_last_addresses)
{
    dns_fails(false);
}

Test(endpoints, dns_frozen_keeps_the_last_addresses)
{
    dns_fails(true);
}

/* An endpoint leaves the record while requests run on it: they finish; it is "leaving" until
 * they did, gets nothing new, then its idle connection closes and it is gone from the view. */
Test(endpoints, an_endpoint_that_leaves_finishes_its_requests)
{
    pods(2, 2);
    start("");
    tup_set_default_plan(pod[0], "delay=2000");
    struct http_call c[4];
    char url[256];
    px_url(px, "/", url, sizeof(url));
    for (int i = 0; i < 4; i++) {
        char id[32];
        snprintf(id, sizeof(id), "l-%d", i);
        http_call_start(&c[i], url, id, NULL);
    }
    cr_assert_eq(tup_wait_count(pod[0], 1, T), 0, "no request reached 127.0.0.2");
    const char *rest[] = { pod_ip(1) };
    cr_assert_eq(dnsm_set(dns, "svc.test", rest, 1), 0);
    /* the change is seen within the TTL; until its requests end, 127.0.0.2 is leaving */
    int64_t until = now_ms() + 4000;
    while (now_ms() < until && strcmp(state_of(pod_ip(0)), "leaving") != 0)
        sleep_ms(50);
    cr_expect_str_eq(state_of(pod_ip(0)), "leaving");
    cr_expect_eq(ep_metric("leaving"), 1);
    size_t slow = got(0);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(get("new", NULL), 200);
    cr_expect_eq(got(0), slow, "an endpoint that left got a new request");
    for (int i = 0; i < 4; i++) {
        http_call_join(&c[i]);
        cr_expect_eq(c[i].r.status, 200, "a request in flight on the leaving endpoint: %ld",
                     c[i].r.status);
        http_free(&c[i].r);
    }
    /* its requests ended, its idle connections close: it leaves the view */
    until = now_ms() + 8000;
    while (now_ms() < until && state_of(pod_ip(0))[0]) {
        get("tick", NULL);
        sleep_ms(100);
    }
    cr_expect_str_eq(state_of(pod_ip(0)), "", "127.0.0.2 is still %s", state_of(pod_ip(0)));
}

/* Ejection is per endpoint: the failing address leaves the rotation, the others stay. */
Test(endpoints, ejection_is_per_endpoint)
{
    pods(3, 3);
    tup_set_default_plan(pod[0], "fail=4000000000;status=503");
    start("\"retry\": {\"max_attempts\": 3, \"retry_on\": [\"5xx\"], " CFG_FAST "}, "
          "\"ejection\": {\"consecutive_failures\": 1, \"backoff\": {\"base_ms\": 30000, "
          "\"jitter\": \"none\"}}");
    for (int i = 0; i < 12; i++) {
        char id[32];
        snprintf(id, sizeof(id), "e-%d", i);
        cr_assert_eq(get(id, NULL), 200);
    }
    cr_expect_eq(got(0), 1, "the failing endpoint got %zu attempts, once ejected none", got(0));
    cr_expect_str_eq(state_of(pod_ip(0)), "ejected");
    cr_expect_str_eq(state_of(pod_ip(1)), "healthy");
    cr_expect_str_eq(state_of(pod_ip(2)), "healthy");
    cr_expect_eq(ep_metric("ejected"), 1);
    cr_expect_eq(ep_metric("healthy"), 2);
    char series[160];
    snprintf(series, sizeof(series),
             "retryproxy_upstream_ejected{route=\"r\",upstream=\"http://svc.test:%u\"}", port);
    cr_expect_eq(fx_metric(series), 1);
    /* the endpoint as /upstreams shows it: address and port (docs/logs.md) */
    char endpoint[64];
    snprintf(endpoint, sizeof(endpoint), "%s:%u", pod_ip(0), port);
    json_t *line = fx_logged("upstream ejected", "endpoint", endpoint);
    cr_expect_not_null(line, "no log line names the ejected endpoint %s", endpoint);
    json_decref(line);
}

/* A name with no address: nothing to connect to, a 503 no_address at once (test_no_address.c);
 * the address that joins is used at once. */
Test(endpoints, a_name_without_addresses_then_one_that_joins)
{
    pods(1, 0);
    start("\"retry\": {\"max_attempts\": 2, " CFG_FAST "}");
    cr_expect_eq(get("none", NULL), 503);
    cr_expect_eq(ep_metric("healthy"), 0);
    const char *one[] = { pod_ip(0) };
    cr_assert_eq(dnsm_set(dns, "svc.test", one, 1), 0);
    int64_t until = now_ms() + 5000;
    long status = 0;
    while (now_ms() < until && (status = get("joined", NULL)) != 200)
        sleep_ms(100);
    cr_expect_eq(status, 200, "the address that joined was not used");
}

/* The records of pod 'p' that were a request's first attempt (X-Retry-Attempt: 1). */
static size_t first_attempts(size_t p)
{
    size_t n = 0;
    for (size_t i = 0; i < got(p); i++) {
        const char *a = tup_req_header(tup_get(pod[p], i), "X-Retry-Attempt");
        n += a && strcmp(a, "1") == 0;
    }
    return n;
}

/* 'n' pods, the first answering 503 to everything, under 'balance' (NULL: the default), retries
 * and nothing else configured; then 'requests' one after another, each answered 200 after a retry
 * where its first attempt failed. */
static void one_failing(size_t n, const char *balance, int requests)
{
    pods(n, n);
    tup_set_default_plan(pod[0], "fail=4000000000;status=503");
    char more[256];
    snprintf(more, sizeof(more),
             "%s%s%s\"retry\": {\"max_attempts\": 3, \"retry_on\": [\"5xx\"], " CFG_FAST "}",
             balance ? "\"balance\": \"" : "", balance ? balance : "", balance ? "\", " : "");
    start(more);
    for (int i = 0; i < requests; i++) {
        char id[32];
        snprintf(id, sizeof(id), "f-%d", i);
        cr_assert_eq(get(id, NULL), 200, "%s", id);
    }
}

/* A retry does not move the turn of first attempts (docs/endpoints.md): with one of two
 * endpoints failing, requests one after another take at most 1.5 attempts each (the failing one
 * gets at most every other first attempt, fewer once its score falls). A retry that took a turn
 * sent every first attempt to the failing endpoint: 2.00 a request. */
static void one_of_two_failing(const char *balance)
{
    one_failing(2, balance, 40);
    size_t attempts = got(0) + got(1);
    cr_log_info("%s: %zu attempts for 40 requests, %zu first attempts on the failing one", balance,
                attempts, first_attempts(0));
    cr_expect(attempts >= 40 && attempts <= 64, "%s: %zu attempts for 40 requests (%.2f each)",
              balance, attempts, attempts / 40.0);
    cr_expect_leq(first_attempts(0), 24, "%s: %zu of 40 first attempts on the failing endpoint",
                  balance, first_attempts(0));
}

Test(endpoints, one_of_two_failing_costs_one_and_a_half_attempts_round_robin)
{
    one_of_two_failing("round_robin");
}

Test(endpoints, one_of_two_failing_costs_one_and_a_half_attempts_least_request)
{
    one_of_two_failing("least_request");
}

/* Failure-aware choice, on by default (docs/endpoints.md "Failing and slow endpoints get fewer
 * attempts"): of three endpoints, the one answering 503 to everything gets at most a fifth of
 * first attempts with nothing configured but retries, requests one after another; every request
 * succeeds (its retries land on the others, never back on it). Even shares gave it a third, a
 * retry that took a turn half. */
static void failing_share_one_after_another(const char *balance)
{
    one_failing(3, balance, 60);
    cr_log_info("%s: the failing one got %zu of 60 first attempts", balance ? balance : "default",
                first_attempts(0));
    cr_expect_leq(first_attempts(0), 12, "%s: %zu of 60 first attempts",
                  balance ? balance : "default", first_attempts(0));
    cr_expect_eq(got(0), first_attempts(0), "a retry went back to the failing endpoint");
    cr_expect_eq(got(0) + got(1) + got(2), 60 + got(0));
}

Test(endpoints, the_failing_one_of_three_gets_at_most_a_fifth_one_after_another)
{
    failing_share_one_after_another(NULL);
}

Test(endpoints, the_failing_one_of_three_gets_at_most_a_fifth_round_robin)
{
    failing_share_one_after_another("round_robin");
}

/* The same with four clients at once, each sending its next request as soon as its last was
 * answered: the failing endpoint answers at once, so it has fewer requests in flight, which drew
 * least_request to it (63-66 % of first attempts measured before). */
Test(endpoints, the_failing_one_of_three_gets_at_most_a_fifth_with_four_clients)
{
    one_failing(3, NULL, 0);
    enum { LANES = 4, REQUESTS = 100 };
    struct http_call c[LANES];
    char url[256];
    px_url(px, "/", url, sizeof(url));
    size_t ok = 0;
    for (int i = 0; i < REQUESTS + LANES; i++) {
        struct http_call *l = &c[i % LANES];
        if (i >= LANES) {
            http_call_join(l);
            ok += l->r.status == 200;
            http_free(&l->r);
        }
        if (i < REQUESTS) {
            char id[32];
            snprintf(id, sizeof(id), "c-%d", i);
            http_call_start(l, url, id, NULL);
        }
    }
    cr_expect_eq(ok, REQUESTS, "%zu of %d answered 200", ok, REQUESTS);
    size_t first = first_attempts(0) + first_attempts(1) + first_attempts(2);
    cr_log_info("four clients: the failing one got %zu of %zu first attempts", first_attempts(0),
                first);
    cr_expect_eq(first, REQUESTS);
    cr_expect_leq(first_attempts(0), REQUESTS / 5, "%zu of %zu first attempts", first_attempts(0),
                  first);
}

/* retryproxy_upstream_endpoint_failure_ratio of endpoint 'ip' (NaN: no series). */
static double failure_metric(const char *ip)
{
    return svc_metric("upstream_endpoint_failure_ratio", "endpoint", ip);
}

/* Which endpoint fails is visible (docs/metrics.md, docs/admin.md): the failing one of three has
 * a series of upstream_endpoint_failure_ratio, the healthy ones none (below 0.1), and /upstreams
 * shows each endpoint's score: its failure ratio, latency, weight and attempts. */
Test(endpoints, the_failing_endpoint_is_named_in_metrics_and_upstreams)
{
    one_failing(3, NULL, 30);
    double bad = failure_metric(pod_ip(0));
    cr_expect(bad >= 0.5 && bad <= 1, "the failing endpoint's ratio %g", bad);
    for (size_t p = 1; p < PODS; p++)
        cr_expect(isnan(failure_metric(pod_ip(p))), "%s has a series", pod_ip(p));
    json_t *e = endpoint_of(pod_ip(0));
    cr_assert_not_null(e);
    json_t *sc = json_object_get(e, "score");
    cr_assert(json_is_object(sc), "no score in /upstreams");
    cr_expect_geq(json_real_value(json_object_get(sc, "failure_ratio")), 0.5);
    cr_expect_lt(json_integer_value(json_object_get(sc, "weight")), 1024);
    cr_expect_eq(json_integer_value(json_object_get(sc, "attempts")), (json_int_t)got(0));
    cr_expect_eq(json_integer_value(json_object_get(sc, "failures")), (json_int_t)got(0));
    json_decref(e);
    e = endpoint_of(pod_ip(1));
    cr_assert_not_null(e);
    sc = json_object_get(e, "score");
    cr_expect_eq(json_real_value(json_object_get(sc, "failure_ratio")), 0);
    cr_expect_eq(json_integer_value(json_object_get(sc, "weight")), 1024);
    cr_expect_gt(json_real_value(json_object_get(sc, "latency_ms")), 0);
    cr_expect_eq(json_integer_value(json_object_get(sc, "failures")), 0);
    json_decref(e);
}

#define LONG_BODY (64u << 20) /* more than every buffer on the way holds */

/* A raw client's GET of a LONG_BODY body (request id "long") on a proxy that gives it 60 s,
 * whose head (and maybe some of the body) it read: the descriptor; the pod streaming it in *s,
 * the body bytes read in *body. */
static int long_download(size_t *s, size_t *body)
{
    pods(2, 2);
    start("\"timeout_ms\": 60000");
    int fd = fx_hold(raw_dial(px->port));
    char req[256];
    int rl = snprintf(req, sizeof(req),
                      "GET / HTTP/1.1\r\nHost: svc.test\r\nX-Request-Id: long\r\n"
                      "X-Test-Plan: body=%u\r\n\r\n",
                      LONG_BODY);
    cr_assert(raw_send_all(fd, req, (size_t)rl));
    char buf[1 << 16];
    size_t have = 0, head = 0;
    while (!head) {
        ssize_t k = raw_recv(fd, buf + have, sizeof(buf) - have - 1, T);
        cr_assert_gt(k, 0, "no response head");
        have += (size_t)k;
        buf[have] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (end)
            head = (size_t)(end + 4 - buf);
        cr_assert(head || have < sizeof(buf) - 1, "a response head of 64 KiB");
    }
    cr_assert(strncmp(buf, "HTTP/1.1 200", 12) == 0, "%.40s", buf);
    *s = tup_count_id(pod[0], "long") ? 0 : 1;
    *body = have - head;
    return fd;
}

/* An attempt is in flight until its transfer ends, not until its response head (docs/admin.md
 * "in_flight"): an endpoint streaming a long body to a client that does not read it holds
 * in_flight 1, so least_request sends every new request to the idle one; once the body is read
 * to its end the count is 0 again. */
Test(endpoints, a_streaming_endpoint_counts_in_flight_until_its_body_ends)
{
    size_t s, body;
    int fd = long_download(&s, &body);
    size_t idle = 1 - s;
    cr_expect_eq(wait_in_flight(pod_ip(s), 1, 5000), 1, "the streaming endpoint's in_flight");
    cr_expect_eq(in_flight_of(pod_ip(idle)), 0);
    size_t before = got(idle);
    for (int i = 0; i < 8; i++) {
        char id[32];
        snprintf(id, sizeof(id), "n-%d", i);
        cr_assert_eq(get(id, NULL), 200);
    }
    cr_expect_eq(got(idle) - before, 8, "the idle endpoint got %zu of 8 new requests",
                 got(idle) - before);
    cr_expect_eq(in_flight_of(pod_ip(s)), 1, "the body has not ended: still in flight");
    /* the rest of the body, to its end */
    static char buf[1 << 16];
    while (body < LONG_BODY) {
        ssize_t k = raw_recv(fd, buf, sizeof(buf), T);
        cr_assert_gt(k, 0, "the body broke off after %zu of %u bytes", body, LONG_BODY);
        body += (size_t)k;
    }
    cr_expect_eq(body, LONG_BODY);
    cr_expect_eq(wait_in_flight(pod_ip(s), 0, 5000), 0, "in_flight after the body ended");
}

/* A client that leaves mid-body ends the upstream transfer (docs/forwarding.md): the attempt
 * leaves flight then, once. */
Test(endpoints, a_download_whose_client_left_leaves_flight)
{
    size_t s, body;
    int fd = long_download(&s, &body);
    cr_expect_eq(wait_in_flight(pod_ip(s), 1, 5000), 1, "the streaming endpoint's in_flight");
    fx_release(fd);
    close(fd);
    cr_expect_eq(wait_in_flight(pod_ip(s), 0, 5000), 0, "in_flight after the client left");
    cr_expect_eq(get("after", NULL), 200);
    cr_expect_eq(wait_in_flight(pod_ip(s), 0, 5000), 0);
    cr_expect_eq(in_flight_of(pod_ip(1 - s)), 0);
}
