/* A route whose names have no address (docs/endpoints.md, "A name without addresses"), end to
 * end, with a real DNS server (dnsmasq, tests/support/dnsmasq.h): the request is answered at
 * once, 503 no_address naming the host and why, without an attempt or a backoff wait (the route
 * waits 2 s and 4 s between attempts, so a wait would show); a gRPC call gets UNAVAILABLE; and
 * a route with another upstream that has an address uses it, without an error.
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/cfgb.h"
#include "tests/support/dnsmasq.h"
#include "tests/support/fixture.h"
#include "tests/support/proc.h"

#define T 20000 /* ms: upper bound for any single request */
/* Slow backoff: 2 s then 4 s, without jitter. An answer within WAITLESS ms spent none. */
#define SLOW                                                                                       \
    "\"retry\": {\"max_attempts\": 3, \"retry_on\": [\"connect-failure\", \"unavailable\"], "      \
    "\"backoff\": {\"base_ms\": 2000, \"jitter\": \"none\"}}"
#define WAITLESS 1000

static struct dnsm *dns;

static void teardown(void)
{
    fx_stop();
    dnsm_stop(dns);
    dns = NULL;
}

TestSuite(no_address, .fini = teardown, .timeout = 60);

/* dnsmasq answering svc.test with 127.0.0.1 (the test upstream's) and NXDOMAIN for any other
 * .test name; the proxy with route "r" to http://nope.test, and http://svc.test after it when
 * 'with_svc' (both on the upstream's port), and a slow backoff. */
static void start(bool with_svc)
{
    fx_upstreams(1);
    dns = dnsm_start();
    cr_assert_not_null(dns);
    const char *lo[] = { "127.0.0.1" };
    cr_assert_eq(dnsm_set(dns, "svc.test", lo, 1), 0);
    unsigned port = tup_port(up);
    char ups[256];
    snprintf(ups, sizeof(ups), "\"http://nope.test:%u\"", port);
    if (with_svc)
        snprintf(ups + strlen(ups), sizeof(ups) - strlen(ups), ", \"http://svc.test:%u\"", port);
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"resolver\": {\"servers\": [\"%s\"], \"timeout_ms\": 500}", dns->server);
    cfgb_route(b, "r", "\"upstreams\": [%s], " SLOW, ups);
    fx_start_b(b, "--workers", "1", NULL);
}

/* One request (a gRPC call when 'grpc'), its answer in *r and how long it took. */
static int64_t ask(bool grpc, struct http_resp *r)
{
    const char *h[] = { grpc ? "Content-Type: application/grpc" : NULL, "TE: trailers", NULL };
    static const char msg[5] = { 0 };
    int64_t t0 = now_ms();
    http_do(grpc ? "POST" : "GET", fx_url("/"), h, grpc ? msg : NULL, grpc ? sizeof(msg) : 0, T, r);
    cr_assert_eq(r->rc, 0, "curl error %d", r->rc);
    return now_ms() - t0;
}

/* The answer is a no_address error of no attempt, at once, and its message has 'want' and
 * names 'host'. */
static void expect_no_address(const char *host, const char *want)
{
    struct http_resp r;
    int64_t ms = ask(false, &r);
    cr_expect_eq(r.status, 503, "status %ld: %.*s", r.status, (int)r.body_len, (char *)r.body);
    cr_expect_lt(ms, WAITLESS, "answered after %lld ms: a backoff wait was spent", (long long)ms);
    json_t *j = json_loadb((const char *)r.body, r.body_len, 0, NULL);
    cr_assert_not_null(j, "not JSON: %.*s", (int)r.body_len, (char *)r.body);
    cr_expect_str_eq(json_string_value(json_object_get(j, "error")), "no_address");
    cr_expect_str_eq(json_string_value(json_object_get(j, "route")), "r");
    cr_expect_eq(json_integer_value(json_object_get(j, "attempts")), 0);
    const char *m = json_string_value(json_object_get(j, "message"));
    cr_expect(m && strstr(m, host) && strstr(m, want), "message: %s", m ? m : "(none)");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "0");
    json_decref(j);
    http_free(&r);
    cr_expect_eq(tup_count(up), 0, "something reached the upstream");
}

Test(no_address, a_name_that_does_not_exist_is_answered_at_once)
{
    start(false);
    expect_no_address("nope.test", "NXDOMAIN");
    /* counted as answered, with no attempt */
    cr_expect_eq(fx_metric("retryproxy_requests_total{route=\"r\",code=\"503\"}"), 1);
    cr_expect_eq(fx_metric("retryproxy_retries_total{route=\"r\",reason=\"connect-failure\"}"), 0);
}

Test(no_address, a_grpc_call_gets_unavailable_at_once)
{
    start(false);
    struct http_resp r;
    int64_t ms = ask(true, &r);
    cr_expect_eq(r.status, 200, "a Trailers-Only response");
    cr_expect_str_eq(http_hdr(&r, "grpc-status"), "14", "UNAVAILABLE");
    const char *m = http_hdr(&r, "grpc-message");
    cr_expect(m && strstr(m, "nope.test"), "grpc-message: %s", m ? m : "(none)");
    cr_expect_lt(ms, WAITLESS, "answered after %lld ms", (long long)ms);
    http_free(&r);
}

/* The DNS server is gone: the name's first lookup failed (the proxy started after waiting
 * resolver.timeout_ms for it), and the answer says so. */
Test(no_address, a_name_whose_dns_fails_says_so)
{
    fx_upstreams(1);
    dns = dnsm_start();
    cr_assert_not_null(dns);
    dnsm_kill(dns);
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"resolver\": {\"servers\": [\"%s\"], \"timeout_ms\": 500}", dns->server);
    cfgb_route(b, "r", "\"upstreams\": [\"http://gone.test:%u\"], " SLOW, tup_port(up));
    fx_start_b(b, "--workers", "1", NULL);
    expect_no_address("gone.test", "DNS failing");
}

/* One name without an address and one with: every request goes to the one with, none fails. */
Test(no_address, the_other_upstream_with_an_address_is_used)
{
    start(true);
    for (int i = 0; i < 6; i++) {
        struct http_resp r;
        ask(false, &r);
        cr_expect_eq(r.status, 200, "request %d: %ld %.*s", i, r.status, (int)r.body_len,
                     (char *)r.body);
        http_free(&r);
    }
    cr_expect_eq(tup_count(up), 6);
}

/* The name loses its address while a request waits to retry it (resolver.nxdomain_keep_ms 0):
 * the retry is not made, and the request is answered as its wait ends (3 s), not after the
 * next wait (6 s more) and a third attempt, each failing for want of an address. */
Test(no_address, a_retry_that_finds_no_address_is_not_made)
{
    fx_upstreams(1);
    dns = dnsm_start();
    cr_assert_not_null(dns);
    const char *lo[] = { "127.0.0.1" };
    cr_assert_eq(dnsm_set(dns, "svc.test", lo, 1), 0);
    struct cfgb *b = cfgb_new();
    cfgb_top(b,
             "\"resolver\": {\"servers\": [\"%s\"], \"timeout_ms\": 500, \"nxdomain_keep_ms\": 0}",
             dns->server);
    cfgb_route(b, "r",
               "\"upstreams\": [\"http://svc.test:%u\"], \"retry\": {\"max_attempts\": 3, "
               "\"retry_on\": [\"connect-failure\"], \"backoff\": {\"base_ms\": 3000, "
               "\"jitter\": \"none\"}}",
               fx_closed_port());
    fx_start_b(b, "--workers", "1", NULL);
    struct http_call *c = &fx_calls[0];
    http_call_start(c, fx_url("/"), "gone", NULL);
    sleep_ms(300); /* its first attempt is refused at once: it waits 3 s */
    cr_assert_eq(dnsm_set(dns, "svc.test", NULL, 0), 0);
    http_call_join(c);
    int64_t ms = c->t_end - c->t_start;
    cr_assert_eq(c->r.rc, 0);
    cr_expect_eq(c->r.status, 503, "%ld after %lld ms", c->r.status, (long long)ms);
    cr_expect_lt(ms, 7000, "answered after %lld ms: a second wait was spent", (long long)ms);
    cr_expect_str_eq(http_hdr(&c->r, "X-Retry-Attempts"), "1", "the one attempt made");
    cr_expect(c->r.body_len && strstr((const char *)c->r.body, "\"no_address\""), "%.*s",
              (int)c->r.body_len, (char *)c->r.body);
    http_free(&c->r);
    cr_expect_eq(fx_metric("retryproxy_retries_in_flight"), 0, "the retry's slots went back");
}
