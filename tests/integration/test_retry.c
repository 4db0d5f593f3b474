/* Retrying, end to end: the real binary against the test upstream on 127.0.0.1. */
#include <criterion/criterion.h>
#include <curl/curl.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <string.h>
#include <time.h>

#include "tests/support/fixture.h"

#define T 20000 /* ms: upper bound for any single request in these tests */

/* A test upstream and a proxy (two workers) with route "r" to it; 'route_extra' are the
 * route's members. */
static void start(const char *route_extra)
{
    fx_start_r("", route_extra, "--workers", "2", NULL);
}

/* The TLS test server of the https test, when it runs. */
static pid_t tls_pid = -1;
static char tls_dir[64];

static void stop(void)
{
    fx_stop();
    if (tls_pid > 0) {
        /* whatever the test's assertions did, the server goes, and its files */
        kill(tls_pid, SIGTERM);
        waitpid(tls_pid, NULL, 0);
        tls_pid = -1;
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", tls_dir);
        if (system(cmd) != 0)
            cr_log_warn("could not remove %s", tls_dir);
    }
}

TestSuite(retry, .fini = stop, .timeout = 60);

Test(retry, two_503s_then_200_is_three_attempts_and_a_200)
{
    start("\"retry\": {\"max_attempts\": 3, \"backoff\": {\"base_ms\": 10, \"jitter\": \"none\"}}");
    char url[128], v[64];
    const char *h[] = { "X-Test-Plan: fail=2;status=503", "X-Request-Id: two-503", NULL };
    struct http_resp r;
    http_do("GET", px_url(px, "/a?b=1", url, sizeof(url)), h, NULL, 0, T, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_header(&r, "X-Retry-Attempts", v, sizeof(v)), "3");
    cr_expect_null(http_header(&r, "X-Retry-Stop", v, sizeof(v)));
    cr_expect_eq(tup_count_id(up, "two-503"), 3);
    for (size_t i = 0; i < 3; i++) {
        const struct tup_req *q = tup_get(up, i);
        char want[8];
        snprintf(want, sizeof(want), "%zu", i + 1);
        cr_expect_str_eq(tup_req_header(q, "X-Retry-Attempt"), want);
        cr_expect_str_eq(q->target, "/a?b=1");
    }
    http_free(&r);
}

/* Sends one request with the given headers; the caller frees. */
static struct http_resp send_req(const char *method, const char *path, const char *const *h,
                                 const char *body)
{
    char url[128];
    struct http_resp r;
    http_do(method, px_url(px, path, url, sizeof(url)), h, body, body ? strlen(body) : 0, T, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    return r;
}

Test(retry, always_failing_returns_the_last_response_as_it_is)
{
    start("\"retry\": {" CFG_FAST "}");
    const char *h[] = { "X-Test-Plan: fail=9;status=503", "X-Request-Id: all-503", NULL };
    struct http_resp r = send_req("GET", "/", h, NULL);
    cr_expect_eq(r.status, 503);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "3");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Stop"), "max-attempts");
    cr_expect_str_eq(http_hdr(&r, "X-Tup-Attempt"), "3"); /* the third response, not a copy */
    cr_expect_str_eq((char *)r.body, "tup: attempt 3 fails on purpose (fail=9)\n");
    cr_expect_eq(tup_count_id(up, "all-503"), 3);
    http_free(&r);
}

Test(retry, client_may_lower_but_not_raise_max_attempts_and_the_header_stays_here)
{
    start("\"retry\": {" CFG_FAST "}");
    const char *lower[] = { "X-Test-Plan: fail=9", "X-Request-Id: low", "X-Retry-Max-Attempts: 2",
                            NULL };
    struct http_resp r = send_req("GET", "/", lower, NULL);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    cr_expect_eq(tup_count_id(up, "low"), 2);
    http_free(&r);
    const char *raise[] = { "X-Test-Plan: fail=9", "X-Request-Id: high", "X-Retry-Max-Attempts: 10",
                            NULL };
    r = send_req("GET", "/", raise, NULL);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "3");
    cr_expect_eq(tup_count_id(up, "high"), 3);
    for (size_t i = 0; i < tup_count(up); i++)
        cr_expect_null(tup_req_header(tup_get(up, i), "X-Retry-Max-Attempts"));
    http_free(&r);
}

Test(retry, post_is_not_retried_once_sent)
{
    start("\"retry\": {" CFG_FAST "}");
    const char *h[] = { "X-Test-Plan: fail=1;status=503", "X-Request-Id: post", NULL };
    struct http_resp r = send_req("POST", "/", h, "payload");
    cr_expect_eq(r.status, 503);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "1");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Stop"), "not-retryable");
    cr_expect_eq(tup_count_id(up, "post"), 1);
    http_free(&r);
}

Test(retry, idempotency_key_makes_post_retryable)
{
    start("\"retry\": {" CFG_FAST "}");
    const char *h[] = { "X-Test-Plan: fail=1;status=503", "X-Request-Id: idem",
                        "Idempotency-Key: k-1", NULL };
    struct http_resp r = send_req("POST", "/", h, "payload");
    cr_expect_eq(r.status, 200);
    cr_expect_eq(tup_count_id(up, "idem"), 2);
    cr_expect_eq(tup_get(up, 1)->body_hash, tup_hash("payload", 7));
    http_free(&r);
}

/* A key the client's Connection names is not forwarded (hop-by-hop), so the upstream could
 * not tell the retry from a new request: it does not make the POST retryable. */
Test(retry, idempotency_key_named_in_connection_does_not_make_post_retryable)
{
    start("\"retry\": {" CFG_FAST "}");
    const char *h[] = { "X-Test-Plan: fail=1;status=503", "X-Request-Id: idem-hop",
                        "Connection: Idempotency-Key", "Idempotency-Key: k-2", NULL };
    struct http_resp r = send_req("POST", "/", h, "payload");
    cr_expect_eq(r.status, 503);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Stop"), "not-retryable");
    cr_assert_eq(tup_count_id(up, "idem-hop"), 1);
    cr_expect_null(tup_req_header(tup_get(up, 0), "Idempotency-Key"));
    http_free(&r);
}

Test(retry, status_not_in_retry_on_passes_through_without_stop_reason)
{
    start("\"retry\": {" CFG_FAST "}");
    const char *h[] = { "X-Test-Plan: fail=1;status=500", "X-Request-Id: s500", NULL };
    struct http_resp r = send_req("GET", "/", h, NULL);
    cr_expect_eq(r.status, 500);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "1");
    cr_expect_null(http_hdr(&r, "X-Retry-Stop"));
    http_free(&r);
}

Test(retry, status_and_range_tokens_fire)
{
    start("\"retry\": {\"retry_on\": [\"429\", \"500-501\"], " CFG_FAST "}");
    const char *a[] = { "X-Test-Plan: fail=1;status=429", "X-Request-Id: t429", NULL };
    struct http_resp r = send_req("GET", "/", a, NULL);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    const char *b[] = { "X-Test-Plan: fail=1;status=501", "X-Request-Id: t501", NULL };
    r = send_req("GET", "/", b, NULL);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    const char *c[] = { "X-Test-Plan: fail=1;status=503", "X-Request-Id: t503", NULL };
    r = send_req("GET", "/", c, NULL);
    cr_expect_eq(r.status, 503); /* gateway-error is not listed here */
    cr_expect_eq(tup_count(up), 5);
    http_free(&r);
}

Test(retry, connect_failure_is_retried_even_for_post)
{
    fx_start_b(fx_cfg_closed_then_up(), "--workers", "1", NULL);
    for (int i = 0; i < 4; i++) {
        char id[32], idh[48];
        snprintf(id, sizeof(id), "cf-%d", i);
        snprintf(idh, sizeof(idh), "X-Request-Id: %s", id);
        const char *h[] = { idh, NULL };
        struct http_resp r = send_req("POST", "/", h, "once");
        cr_expect_eq(r.status, 200, "request %d", i);
        cr_expect_eq(tup_count_id(up, id), 1, "request %d reached the upstream %zu times", i,
                     tup_count_id(up, id));
        http_free(&r);
    }
}

Test(retry, no_response_from_any_attempt_is_a_json_502)
{
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "dead", "\"upstreams\": [\"http://127.0.0.1:%u\"], \"retry\": {" CFG_FAST "}",
               fx_closed_port());
    fx_start_b(b, NULL);
    struct http_resp r = send_req("GET", "/x", NULL, NULL);
    cr_expect_eq(r.status, 502);
    cr_expect_str_eq(http_hdr(&r, "Content-Type"), "application/json");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "3");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Stop"), "max-attempts");
    cr_expect(strstr((char *)r.body, "\"error\": \"upstream_unavailable\""), "%s", r.body);
    cr_expect(strstr((char *)r.body, "\"route\": \"dead\""), "%s", r.body);
    cr_expect(strstr((char *)r.body, "\"attempts\": 3"), "%s", r.body);
    http_free(&r);
}

Test(retry, reset_before_headers_is_retried)
{
    start("\"retry\": {" CFG_FAST "}");
    const char *h[] = { "X-Test-Plan: fail=1;action=reset", "X-Request-Id: rst", NULL };
    struct http_resp r = send_req("GET", "/", h, NULL);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    cr_expect_eq(tup_count_id(up, "rst"), 2);
    http_free(&r);
}

Test(retry, per_try_timeout_abandons_a_hung_attempt_and_retries)
{
    start("\"per_try_timeout_ms\": 300, \"retry\": {" CFG_FAST "}");
    const char *h[] = { "X-Test-Plan: fail=1;action=hang", "X-Request-Id: hang1", NULL };
    struct http_resp r = send_req("GET", "/", h, NULL);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    cr_expect_geq(r.seconds, 0.29);
    cr_expect_lt(r.seconds, 5.0);
    cr_expect_eq(tup_count_id(up, "hang1"), 2);
    http_free(&r);
}

Test(retry, overall_deadline_gives_a_json_504)
{
    start("\"timeout_ms\": 500, \"retry\": {" CFG_FAST "}");
    const char *h[] = { "X-Test-Plan: fail=9;action=hang", "X-Request-Id: dl", NULL };
    struct http_resp r = send_req("GET", "/", h, NULL);
    cr_expect_eq(r.status, 504);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Stop"), "deadline");
    cr_expect(strstr((char *)r.body, "\"error\": \"upstream_timeout\""), "%s", r.body);
    cr_expect_geq(r.seconds, 0.49);
    cr_expect_lt(r.seconds, 5.0);
    http_free(&r);
}

Test(retry, wait_that_would_pass_the_deadline_is_not_taken)
{
    start("\"timeout_ms\": 1000, \"retry\": {\"backoff\": {\"policy\": \"fixed\", "
          "\"base_ms\": 2000, \"cap_ms\": 2000, \"jitter\": \"none\"}}");
    const char *h[] = { "X-Test-Plan: fail=9;status=503", "X-Request-Id: far", NULL };
    struct http_resp r = send_req("GET", "/", h, NULL);
    cr_expect_eq(r.status, 503);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Stop"), "deadline");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "1");
    cr_expect_lt(r.seconds, 0.9); /* answered at once, not after waiting */
    http_free(&r);
}

static double gap_s(size_t a, size_t b)
{
    return (double)(tup_get(up, b)->arrival_ns - tup_get(up, a)->arrival_ns) / 1e9;
}

Test(retry, retry_after_seconds_replaces_the_backoff)
{
    start("\"retry\": {" CFG_FAST "}");
    const char *h[] = { "X-Test-Plan: fail=1;status=503;retry-after=1", "X-Request-Id: ra", NULL };
    struct http_resp r = send_req("GET", "/", h, NULL);
    cr_expect_eq(r.status, 200);
    cr_assert_eq(tup_count_id(up, "ra"), 2);
    cr_expect_geq(gap_s(0, 1), 0.95, "gap %.3f s", gap_s(0, 1));
    cr_expect_lt(gap_s(0, 1), 3.0, "gap %.3f s", gap_s(0, 1));
    http_free(&r);
}

Test(retry, retry_after_http_date_replaces_the_backoff)
{
    start("\"retry\": {" CFG_FAST "}");
    char date[64], plan[128];
    time_t when = time(NULL) + 2;
    struct tm tm;
    gmtime_r(&when, &tm);
    strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    snprintf(plan, sizeof(plan), "X-Test-Plan: fail=1;status=503;retry-after=%s", date);
    const char *h[] = { plan, "X-Request-Id: ra-date", NULL };
    struct http_resp r = send_req("GET", "/", h, NULL);
    cr_expect_eq(r.status, 200);
    cr_assert_eq(tup_count_id(up, "ra-date"), 2);
    /* a whole-second date 2 s ahead is 1 to 2 s away */
    cr_expect_geq(gap_s(0, 1), 0.9, "gap %.3f s", gap_s(0, 1));
    cr_expect_lt(gap_s(0, 1), 4.0, "gap %.3f s", gap_s(0, 1));
    http_free(&r);
}

Test(retry, retry_after_above_max_ms_ends_retrying)
{
    start("\"retry\": {\"retry_after\": {\"max_ms\": 1000}, " CFG_FAST "}");
    const char *h[] = { "X-Test-Plan: fail=1;status=503;retry-after=5", "X-Request-Id: ra-max",
                        NULL };
    struct http_resp r = send_req("GET", "/", h, NULL);
    cr_expect_eq(r.status, 503);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Stop"), "retry-after");
    cr_expect_str_eq(http_hdr(&r, "Retry-After"), "5");
    cr_expect_lt(r.seconds, 0.9);
    cr_expect_eq(tup_count_id(up, "ra-max"), 1);
    http_free(&r);
}

Test(retry, pushback_header_sets_the_next_wait_or_stops_retrying)
{
    start("\"retry\": {\"pushback_header\": \"X-Retry-Pushback\", \"backoff\": {\"policy\": "
          "\"fixed\", \"base_ms\": 5000, \"jitter\": \"none\"}}");
    /* 400 ms instead of the policy's 5 s, and before Retry-After's 3 s */
    const char *wait[] = {
        "X-Test-Plan: fail=1;status=503;retry-after=3;header=X-Retry-Pushback:400",
        "X-Request-Id: pb", NULL
    };
    struct http_resp r = send_req("GET", "/", wait, NULL);
    cr_expect_eq(r.status, 200);
    cr_assert_eq(tup_count_id(up, "pb"), 2);
    cr_expect_geq(gap_s(0, 1), 0.39, "gap %.3f s", gap_s(0, 1));
    cr_expect_lt(gap_s(0, 1), 2.5, "gap %.3f s", gap_s(0, 1));
    http_free(&r);

    /* a value that is not a whole number of milliseconds: no retry, the response as it is */
    const char *stop[] = { "X-Test-Plan: fail=1;status=503;header=X-Retry-Pushback:-1",
                           "X-Request-Id: pb-stop", NULL };
    r = send_req("GET", "/", stop, NULL);
    cr_expect_eq(r.status, 503);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Stop"), "pushback");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Pushback"), "-1");
    cr_expect_eq(tup_count_id(up, "pb-stop"), 1);
    http_free(&r);
    cr_expect_eq(fx_metric("retryproxy_retries_denied_total{route=\"r\",reason=\"pushback\"}"), 1);
}

Test(retry, a_header_in_retry_on_retries_a_response_that_carries_it)
{
    start("\"retry\": {\"retry_on\": [\"header:X-Retry-Me\"], " CFG_FAST "}");
    /* a 200 that says "retry me" is retried; the next, without the field, is the answer */
    const char *h[] = { "X-Test-Plan: fail=1;status=200;header=X-Retry-Me:yes", "X-Request-Id: hdr",
                        NULL };
    struct http_resp r = send_req("GET", "/", h, NULL);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    cr_expect_null(http_hdr(&r, "X-Retry-Me"));
    cr_expect_eq(tup_count_id(up, "hdr"), 2);
    http_free(&r);
    cr_expect_eq(fx_metric("retryproxy_retries_total{route=\"r\",reason=\"header:X-Retry-Me\"}"),
                 1);

    /* a 503 without the field is not retried: only the header condition is listed */
    const char *plain[] = { "X-Test-Plan: fail=1;status=503", "X-Request-Id: hdr-no", NULL };
    r = send_req("GET", "/", plain, NULL);
    cr_expect_eq(r.status, 503);
    cr_expect_eq(tup_count_id(up, "hdr-no"), 1);
    http_free(&r);
}

Test(retry, client_side_throttling_sends_a_failing_upstream_fewer_attempts)
{
    start("\"throttle\": {\"k\": 2, \"window_ms\": 2000}, \"retry\": {\"max_attempts\": 1}");
    /* every answer a 503 (a failure retry_on names): nothing is accepted, so the rejection
     * probability climbs towards 1 */
    const char *h[] = { "X-Test-Plan: fail=1000;status=503", "X-Request-Id: failing", NULL };
    unsigned throttled = 0, sent_503 = 0;
    for (int i = 0; i < 60; i++) {
        struct http_resp r = send_req("GET", "/", h, NULL);
        cr_assert_eq(r.status, 503);
        const char *p = http_hdr(&r, "X-Retry-Throttled");
        if (p) {
            double v = strtod(p, NULL);
            cr_expect(v > 0 && v < 1, "X-Retry-Throttled: %s", p);
            throttled++;
            cr_expect(strstr((const char *)r.body, "\"error\": \"throttled\""), "%s", r.body);
            cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "0");
        } else {
            sent_503++;
        }
        http_free(&r);
    }
    size_t reached = tup_count_id(up, "failing");
    cr_expect_eq(reached, sent_503, "every 503 not throttled came from the upstream");
    cr_expect_gt(throttled, 30, "only %u of 60 throttled", throttled);
    cr_expect_eq(fx_metric("retryproxy_throttled_total{route=\"r\"}"), throttled);

    /* the failures age out of the window: an upstream that answers again gets everything,
     * and with accepts counted k = 2 times, nothing is rejected */
    sleep_ms(2200);
    const char *ok[] = { "X-Request-Id: healthy", NULL };
    for (int i = 0; i < 50; i++) {
        struct http_resp r = send_req("GET", "/", ok, NULL);
        cr_expect_eq(r.status, 200, "request %d after the window", i);
        cr_expect_null(http_hdr(&r, "X-Retry-Throttled"));
        http_free(&r);
    }
    cr_expect_eq(tup_count_id(up, "healthy"), 50);
}

Test(retry, a_throttled_retry_is_not_made_and_says_so)
{
    start("\"throttle\": {\"k\": 2}, \"retry\": {\"max_attempts\": 5, " CFG_FAST "}");
    const char *h[] = { "X-Test-Plan: fail=1000;status=503", NULL };
    bool seen = false;
    for (int i = 0; i < 40 && !seen; i++) {
        struct http_resp r = send_req("GET", "/", h, NULL);
        const char *stop = http_hdr(&r, "X-Retry-Stop");
        if (stop && strcmp(stop, "throttled") == 0) {
            seen = true;
            cr_expect_eq(r.status, 503, "the last upstream answer, as it is");
            cr_expect_not_null(http_hdr(&r, "X-Retry-Throttled"));
            cr_expect_neq(strcmp(http_hdr(&r, "X-Retry-Attempts"), "0"), 0);
        }
        http_free(&r);
    }
    cr_expect(seen, "no retry was ever throttled");
    cr_expect_gt(fx_metric("retryproxy_retries_denied_total{route=\"r\",reason=\"throttled\"}"), 0);
}

Test(retry, backoff_gaps_follow_the_policy)
{
    start("\"retry\": {\"max_attempts\": 4, \"backoff\": {\"policy\": \"exponential\", "
          "\"base_ms\": 100, \"factor\": 2, \"jitter\": \"none\"}}");
    const char *h[] = { "X-Test-Plan: fail=3;status=503", "X-Request-Id: gaps", NULL };
    struct http_resp r = send_req("GET", "/", h, NULL);
    cr_expect_eq(r.status, 200);
    cr_assert_eq(tup_count_id(up, "gaps"), 4);
    const double want[] = { 0.1, 0.2, 0.4 };
    for (size_t i = 0; i < 3; i++) {
        double g = gap_s(i, i + 1);
        cr_expect(g >= want[i] - 0.005 && g < want[i] + 0.4, "gap %zu: %.3f s, want %.1f s", i, g,
                  want[i]);
    }
    http_free(&r);
}

/* Four requests at once over two upstreams, one worker: their first attempts take the
 * round-robin positions 0, 1, 0, 1, so when their retries come, plain round-robin would send
 * each of them back to the upstream it just tried. Each must go to the other one instead. */
Test(retry, retry_goes_to_an_upstream_not_yet_tried)
{
    fx_upstreams(2);
    struct tup *a = fx_up(0), *b = fx_up(1);
    char url[128];
    struct cfgb *cb = cfgb_new();
    cfgb_route(cb, "rr",
               "\"upstreams\": [\"%s\", \"%s\"], "
               "\"retry\": {\"max_attempts\": 2, " CFG_FIXED(200) "}",
               fx_up_url(0), fx_up_url(1));
    fx_start_b(cb, "--workers", "1", NULL);
    px_url(px, "/", url, sizeof(url));

    CURLM *m = curl_multi_init();
    CURL *e[4];
    struct curl_slist *h[4];
    for (int i = 0; i < 4; i++) {
        char idh[48];
        snprintf(idh, sizeof(idh), "X-Request-Id: nt-%d", i);
        h[i] = curl_slist_append(NULL, idh);
        h[i] = curl_slist_append(h[i], "X-Test-Plan: fail=1;status=503");
        e[i] = proc_multi_get(m, url, h[i], T, NULL);
        cr_assert_not_null(e[i]);
    }
    int running = 1;
    while (running) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    for (int i = 0; i < 4; i++) {
        long code = 0;
        curl_easy_getinfo(e[i], CURLINFO_RESPONSE_CODE, &code);
        /* each upstream fails its own first attempt of an id: both attempts fail */
        cr_expect_eq(code, 503, "request %d", i);
        curl_multi_remove_handle(m, e[i]);
        curl_easy_cleanup(e[i]);
        curl_slist_free_all(h[i]);
        char id[16];
        snprintf(id, sizeof(id), "nt-%d", i);
        cr_expect_eq(tup_count_id(a, id), 1, "%s reached upstream A %zu times", id,
                     tup_count_id(a, id));
        cr_expect_eq(tup_count_id(b, id), 1, "%s reached upstream B %zu times", id,
                     tup_count_id(b, id));
    }
    curl_multi_cleanup(m);
    cr_expect_eq(px_stop(px, 10000), 0);
    px = NULL;
}

/* A listener whose accept queue is full: the kernel drops further SYNs, so a connection to it
 * hangs in the handshake until the connect timeout. */
static int full_listener(unsigned *port, int *filler)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(ls >= 0 && bind(ls, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(ls, 0) == 0);
    getsockname(ls, (struct sockaddr *)&a, &len);
    *port = ntohs(a.sin_port);
    *filler = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(connect(*filler, (struct sockaddr *)&a, sizeof(a)), 0);
    return ls;
}

Test(retry, connect_timeout_bounds_each_connection_attempt)
{
    unsigned port;
    int filler, ls = full_listener(&port, &filler);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "slow",
               "\"upstreams\": [\"http://127.0.0.1:%u\"], \"connect_timeout_ms\": 200, "
               "\"retry\": {\"max_attempts\": 2, " CFG_FAST "}",
               port);
    fx_start_b(b, NULL);
    struct http_resp r = send_req("POST", "/", NULL, "x"); /* connect failures retry POST */
    cr_expect_eq(r.status, 502);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    cr_expect(strstr((char *)r.body, "\"error\": \"upstream_unavailable\""), "%s", r.body);
    cr_expect_geq(r.seconds, 0.39, "two 200 ms connect timeouts took %.3f s", r.seconds);
    cr_expect_lt(r.seconds, 3.0);
    http_free(&r);
    close(filler);
    close(ls);
}

/* An https upstream with a self-signed certificate: the TLS server itself works (a client that
 * skips verification gets a 200), but retryproxy verifies certificates by default, so the
 * handshake fails, nothing is sent, and the answer is a 502 with no upstream response. */
Test(retry, https_upstream_certificate_is_verified_by_default)
{
    char *dir = tls_dir, cmd[1024], url[128];
    snprintf(tls_dir, sizeof(tls_dir), "/tmp/retryproxy-tls-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd),
             "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
             "-keyout %s/key.pem -out %s/cert.pem >/dev/null 2>&1",
             dir, dir);
    cr_assert_eq(fx_sh(cmd), 0, "openssl could not make a certificate (is openssl installed?)");
    unsigned port = fx_free_port();
    /* started directly (not through a shell, whose PID would not be the server's), and
     * stopped by the suite's fini */
    char accept[32], cert[96], key[96];
    snprintf(accept, sizeof(accept), "127.0.0.1:%u", port);
    snprintf(cert, sizeof(cert), "%s/cert.pem", dir);
    snprintf(key, sizeof(key), "%s/key.pem", dir);
    tls_pid = fork();
    cr_assert_geq(tls_pid, 0);
    if (tls_pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        execlp("openssl", "openssl", "s_server", "-quiet", "-www", "-accept", accept, "-cert", cert,
               "-key", key, (char *)NULL);
        _exit(127);
    }

    /* The TLS server answers a client that does not verify. */
    snprintf(url, sizeof(url), "https://127.0.0.1:%u/", port);
    long code = 0;
    for (int i = 0; i < 100 && code != 200; i++) {
        CURL *e = curl_easy_init();
        curl_easy_setopt(e, CURLOPT_URL, url);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, http_discard);
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 2000L);
        if (curl_easy_perform(e) == CURLE_OK)
            curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
        curl_easy_cleanup(e);
        if (code != 200)
            usleep(50000);
    }
    cr_assert_eq(code, 200, "the TLS test server did not come up");

    struct cfgb *b = cfgb_new();
    cfgb_route(b, "tls", "\"upstreams\": [\"%s\"], \"retry\": {\"max_attempts\": 1}", url);
    fx_start_b(b, NULL);
    struct http_resp r = send_req("GET", "/", NULL, NULL);
    cr_expect_eq(r.status, 502);
    cr_expect(strstr((char *)r.body, "\"error\": \"upstream_unavailable\""), "%s", r.body);
    http_free(&r);
}
