/* Hedging on per-try timeout (retry.hedge_on_per_try_timeout), end to end: an attempt past
 * per_try_timeout_ms runs on while the next one goes; what the test upstreams received, and
 * when, shows which attempts went, which answer won and that the loser was cancelled. */
#include <criterion/criterion.h>
#include <curl/curl.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fixture.h"
#include "tests/support/proc.h"

#define T 20000 /* ms: upper bound for any single request in these tests */

TestSuite(hedging, .fini = fx_stop, .timeout = 60);

/* The route's members for hedging after 'per_try_ms', with a 1 ms wait before the hedge;
 * 'more' are further members ("" for none), after a comma. */
#define HEDGING(per_try_ms, more)                                                                  \
    "\"timeout_ms\": 10000, \"per_try_timeout_ms\": " #per_try_ms ", \"retry\": "                  \
    "{\"hedge_on_per_try_timeout\": true, \"backoff\": {\"policy\": \"fixed\", \"base_ms\": 1, "   \
    "\"jitter\": \"none\"}" more "}"

static struct http_resp send_req(const char *method, const char *const *h, const void *body,
                                 size_t len)
{
    char url[128];
    struct http_resp r;
    http_do(method, px_url(px, "/h", url, sizeof(url)), h, body, len, T, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    return r;
}

static double route_metric(const char *family, const char *labels)
{
    char series[192];
    snprintf(series, sizeof(series), "retryproxy_%s{route=\"r\"%s%s}", family, *labels ? "," : "",
             labels);
    return fx_metric(series);
}

/* The first attempt hangs: the hedge, started at the per-try timeout, answers, with the same
 * body the first one got; the hanging attempt's connection is closed. */
Test(hedging, the_hedge_answers_while_the_first_attempt_hangs)
{
    fx_start_r("", HEDGING(300, ""), "--workers", "2", NULL);
    size_t n = 100000;
    unsigned char *body = malloc(n);
    cr_assert_not_null(body);
    tup_pattern_fill(body, 0, n);
    const char *h[] = { "X-Test-Plan: fail=1;action=hang", "X-Request-Id: hang-then-ok", NULL };
    int64_t t0 = now_ms();
    struct http_resp r = send_req("PUT", h, body, n);
    int64_t took = now_ms() - t0;
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    cr_expect_str_eq(http_hdr(&r, "X-Tup-Attempt"), "2");
    cr_expect_null(http_hdr(&r, "X-Retry-Stop"));
    cr_expect_geq(took, 300, "answered before the per-try timeout: %lld ms", (long long)took);
    cr_expect_lt(took, 5000, "the hedge did not answer in time: %lld ms", (long long)took);
    cr_assert_eq(tup_count_id(up, "hang-then-ok"), 2);
    for (size_t i = 0; i < 2; i++) {
        const struct tup_req *q = tup_get(up, i);
        char want[4];
        snprintf(want, sizeof(want), "%zu", i + 1);
        cr_expect_str_eq(tup_req_header(q, "X-Retry-Attempt"), want);
        cr_expect_eq(q->body_len, n);
        cr_expect_eq(q->body_hash, tup_pattern_hash(n), "attempt %zu got another body", i + 1);
    }
    /* the hanging attempt was cancelled: only the hedge's kept-alive connection stays */
    cr_expect_eq(tup_wait_open_at_most(up, 1, 5000), 0, "the hanging attempt's connection is open");
    cr_expect_eq(route_metric("hedges_total", ""), 1);
    cr_expect_eq(route_metric("retries_total", "reason=\"timeout\""), 1);
    cr_expect_eq(route_metric("attempts_total", "outcome=\"2xx\""), 1);
    cr_expect_eq(route_metric("attempts_total", "outcome=\"cancelled\""), 1);
    cr_expect_eq(route_metric("attempts_total", "outcome=\"timeout\""), 0);
    cr_expect_eq(fx_metric("retryproxy_retries_in_flight"), 0);
    http_free(&r);
    free(body);
}

/* The first attempt is slow but answers before the hedge does: its answer is the one, and the
 * hedge is cancelled before it could answer. Without hedging the same request fails. */
Test(hedging, the_slow_first_attempt_wins_when_it_answers_first)
{
    fx_start_r("", HEDGING(400, ", \"max_attempts\": 2"), "--workers", "2", NULL);
    /* every attempt answers 1000 ms after it arrives: the first at about 1000 ms, the hedge at
     * 1400 ms at the earliest (past its own per-try timeout it runs on: no attempt is left) */
    const char *h[] = { "X-Test-Plan: fail=1;status=200;delay=1000", "X-Request-Id: slow-first",
                        NULL };
    struct http_resp r = send_req("GET", h, NULL, 0);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "X-Tup-Attempt"), "1");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    cr_expect_eq(tup_count_id(up, "slow-first"), 2);
    cr_expect_eq(tup_wait_open_at_most(up, 1, 5000), 0, "the hedge's connection is still open");
    cr_expect_eq(route_metric("attempts_total", "outcome=\"cancelled\""), 1);
    cr_expect_eq(route_metric("attempts_total", "outcome=\"2xx\""), 1);
    http_free(&r);

    /* the same without hedging: the per-try timeout ends each attempt */
    fx_stop();
    fx_start_r("",
               "\"timeout_ms\": 10000, \"per_try_timeout_ms\": 400, \"retry\": {\"max_attempts\": "
               "2, \"backoff\": {\"policy\": \"fixed\", \"base_ms\": 1, \"jitter\": \"none\"}}",
               "--workers", "2", NULL);
    const char *h2[] = { "X-Test-Plan: fail=1;status=200;delay=1000", "X-Request-Id: no-hedge",
                         NULL };
    r = send_req("GET", h2, NULL, 0);
    cr_expect_eq(r.status, 504);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Stop"), "max-attempts");
    http_free(&r);
}

/* max_attempts 2: the hedge fails fast with a 503 while the first attempt is still working on
 * its answer. The request waits for it instead of answering the 503. */
Test(hedging, a_failed_hedge_waits_for_the_first_attempt)
{
    fx_upstreams(2);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r", "\"upstreams\": [\"%s\", \"%s\"], " HEDGING(300, ", \"max_attempts\": 2"),
               fx_up_url(0), fx_up_url(1));
    fx_start_b(b, "--workers", "1", NULL);
    tup_set_default_plan(fx_up(0), "delay=1200");                 /* slow, then 200 */
    tup_set_default_plan(fx_up(1), "fail=4000000000;status=503"); /* fails at once */
    const char *h[] = { "X-Request-Id: lag", NULL };
    struct http_resp r = send_req("GET", h, NULL, 0);
    cr_expect_eq(r.status, 200, "the hedge's 503 was answered: the first attempt was not awaited");
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "2");
    cr_expect_null(http_hdr(&r, "X-Retry-Stop"));
    cr_assert_eq(tup_count_id(fx_up(0), "lag"), 1);
    cr_assert_eq(tup_count_id(fx_up(1), "lag"), 1);
    cr_expect_str_eq(tup_req_header(tup_get(fx_up(0), 0), "X-Retry-Attempt"), "1");
    cr_expect_str_eq(tup_req_header(tup_get(fx_up(1), 0), "X-Retry-Attempt"), "2");
    cr_expect_eq(route_metric("attempts_total", "outcome=\"5xx\""), 1);
    cr_expect_eq(route_metric("attempts_total", "outcome=\"2xx\""), 1);
    http_free(&r);
}

/* Hedging sends a request twice at once: never one that may not be retried. A POST past its
 * per-try timeout is ended as without hedging; with an Idempotency-Key it is hedged. */
Test(hedging, only_requests_that_may_go_twice_are_hedged)
{
    fx_start_r("", HEDGING(300, ""), "--workers", "2", NULL);
    const char *post[] = { "X-Test-Plan: fail=1;action=hang", "X-Request-Id: post", NULL };
    struct http_resp r = send_req("POST", post, "order", 5);
    cr_expect_eq(r.status, 504);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Stop"), "not-retryable");
    cr_expect_eq(tup_count_id(up, "post"), 1, "a POST went twice");
    http_free(&r);

    const char *idem[] = { "X-Test-Plan: fail=1;action=hang", "X-Request-Id: idem",
                           "Idempotency-Key: k-1", NULL };
    r = send_req("POST", idem, "order", 5);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(tup_count_id(up, "idem"), 2);
    cr_expect_eq(route_metric("hedges_total", ""), 1);
    http_free(&r);
}

/* A hedge is a retry: the budgets may refuse it. Refused, the first attempt runs on and its
 * answer, however late, is the one; the upstream sees one attempt. */
Test(hedging, a_hedge_the_budget_refuses_leaves_the_first_attempt_running)
{
    fx_start_r("", HEDGING(300, "") ", \"budget\": {\"max_concurrent_retries\": 0}", "--workers",
               "2", NULL);
    const char *h[] = { "X-Test-Plan: fail=1;status=200;delay=1000", "X-Request-Id: refused",
                        NULL };
    struct http_resp r = send_req("GET", h, NULL, 0);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Attempts"), "1");
    cr_expect_eq(tup_count_id(up, "refused"), 1);
    cr_expect_eq(route_metric("retries_denied_total", "reason=\"concurrency\""), 1);
    cr_expect_eq(route_metric("hedges_total", ""), 0);
    http_free(&r);
}

#define N_BURST 200

/* 200 requests at once on two workers, every one hedged: half have a hanging first attempt
 * (the hedge wins), half a slow one that answers first (the hedge loses). Every request is
 * answered 200 by the attempt it should be, each loser is counted cancelled, and the losers'
 * connections are closed (only the winners' can stay open for reuse). */
Test(hedging, a_burst_of_hedged_requests_cancels_every_loser)
{
    fx_start_r("\"budget\": {\"max_concurrent_retries\": null, \"retry_ratio\": 2.0}",
               HEDGING(300, ", \"max_attempts\": 2") ", \"budget\": {\"max_concurrent_retries\": "
                                                     "null, \"retry_ratio\": 2.0}",
               "--workers", "2", NULL);
    CURLM *m = curl_multi_init();
    cr_assert_not_null(m);
    static CURL *easy[N_BURST];
    static struct curl_slist *hdrs[N_BURST];
    static char tup_attempt[N_BURST][8];
    static long status[N_BURST];
    char url[128];
    px_url(px, "/burst", url, sizeof(url));
    for (int i = 0; i < N_BURST; i++) {
        char id[64];
        snprintf(id, sizeof(id), "X-Request-Id: burst-%03d", i);
        hdrs[i] = curl_slist_append(NULL, id);
        hdrs[i] = curl_slist_append(hdrs[i], i % 2 ? "X-Test-Plan: fail=1;status=200;delay=900"
                                                   : "X-Test-Plan: fail=1;action=hang");
        easy[i] = proc_multi_get(m, url, hdrs[i], T, (void *)(intptr_t)i);
        cr_assert_not_null(easy[i]);
    }
    int64_t t0 = now_ms();
    int running = 1, done = 0;
    while (running && now_ms() - t0 < T) {
        curl_multi_perform(m, &running);
        void *priv;
        CURLcode rc;
        for (CURL *e; (e = proc_multi_next_done(m, &priv, &rc)) != NULL;) {
            int i = (int)(intptr_t)priv;
            cr_assert_eq(rc, CURLE_OK, "request %d: curl error %d", i, rc);
            curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status[i]);
            struct curl_header *h;
            if (curl_easy_header(e, "X-Tup-Attempt", 0, CURLH_HEADER, -1, &h) == CURLHE_OK)
                snprintf(tup_attempt[i], sizeof(tup_attempt[i]), "%s", h->value);
            done++;
        }
        curl_multi_poll(m, NULL, 0, 50, NULL);
    }
    cr_assert_eq(done, N_BURST);
    for (int i = 0; i < N_BURST; i++) {
        cr_expect_eq(status[i], 200, "request %d: %ld", i, status[i]);
        /* a hanging first attempt: the hedge's answer; a slow one: its own */
        cr_expect_str_eq(tup_attempt[i], i % 2 ? "1" : "2", "request %d", i);
        curl_multi_remove_handle(m, easy[i]);
        curl_easy_cleanup(easy[i]);
        curl_slist_free_all(hdrs[i]);
    }
    curl_multi_cleanup(m);
    cr_expect_eq(tup_count(up), 2 * N_BURST);
    cr_expect_eq(route_metric("hedges_total", ""), N_BURST);
    cr_expect_eq(route_metric("attempts_total", "outcome=\"2xx\""), N_BURST);
    cr_expect_eq(route_metric("attempts_total", "outcome=\"cancelled\""), N_BURST);
    cr_expect_eq(fx_metric("retryproxy_retries_in_flight"), 0);
    cr_expect_eq(tup_wait_open_at_most(up, N_BURST, 5000), 0,
                 "%zu upstream connections open: losers were not cancelled",
                 tup_open_connections(up));
}

/* An attempt that may be hedged is not cancelled at its per-try timeout: the deadline header
 * tells its upstream the time left before the deadline (10 s here), not the per-try timeout,
 * on the first attempt and on the hedge. */
Test(hedging, an_attempt_that_may_be_hedged_is_told_the_time_left)
{
    fx_start_r("", "\"deadline_header\": \"X-Deadline-Ms\", " HEDGING(300, ""), "--workers", "1",
               NULL);
    const char *h[] = { "X-Test-Plan: fail=1;action=hang", "X-Request-Id: told", NULL };
    struct http_resp r = send_req("PUT", h, "x", 1);
    cr_expect_eq(r.status, 200);
    cr_assert_eq(tup_count_id(up, "told"), 2);
    for (size_t i = 0; i < 2; i++) {
        const char *v = tup_req_header(tup_get(up, i), "X-Deadline-Ms");
        cr_assert_not_null(v);
        cr_expect_gt(atol(v), 5000, "attempt %zu was told %s ms", i + 1, v);
    }
    http_free(&r);
}
