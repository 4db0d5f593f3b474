/* retry_decide() and decide_attempt(): every rule of docs/config.md "retry", docs/budgets.md
 * and docs/forwarding.md that turns an attempt's end into "retry after D ms" or "stop,
 * because ...", exact and without a network (this suite links neither libmicrohttpd nor
 * libcurl). */
#include <criterion/criterion.h>

#include <string.h>

#include "config/cfg.h"
#include "proxy/core/decide.h"

static struct cfg *cfg;
static const struct cfg_retry *policy;

/* Default policy: retry_on connect-failure, reset, timeout, gateway-error, 429; max 3;
 * methods GET HEAD OPTIONS PUT DELETE TRACE; retry_after honor, max_ms 30000. */
static void load(const char *retry_json)
{
    char text[2048];
    snprintf(text, sizeof(text),
             "{\"routes\": [{\"name\": \"r\", \"upstreams\": [\"http://h:1\"]%s%s}]}",
             *retry_json ? ", \"retry\": " : "", retry_json);
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    cfg = cfg_load_buffer(text, strlen(text), "t", &errs);
    cr_assert_not_null(cfg, "%s", errs.n ? errs.v[0].msg : "?");
    cfg_errs_clear(&errs);
    policy = &cfg->routes[0].retry;
}

static void unload(void)
{
    cfg_unref(cfg);
}

TestSuite(decide, .fini = unload);

/* A retryable GET on its first attempt, 1 s before the deadline, backoff 100 ms. */
static struct retry_facts facts(enum retry_outcome o, int status)
{
    return (struct retry_facts){ .outcome = o,
                                 .status = status,
                                 .method_retryable = true,
                                 .body_replayable = true,
                                 .attempts = 1,
                                 .max_attempts = 3,
                                 .now_ms = 10000,
                                 .deadline_ms = 11000,
                                 .backoff_ms = 100,
                                 .grpc_status = -1 };
}

static struct retry_verdict decide(const struct retry_facts *f)
{
    struct retry_verdict v;
    retry_decide(policy, f, &v);
    return v;
}

Test(decide, gateway_error_is_retried_after_the_backoff)
{
    load("");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 503);
    struct retry_verdict v = decide(&f);
    cr_assert_not_null(v.fired);
    cr_expect_str_eq(v.fired->token, "gateway-error");
    cr_expect_eq(v.stop, RETRY_STOP_NONE);
    cr_expect_eq(v.delay_ms, 100);
    cr_expect_not(v.retry_after_used);
}

Test(decide, status_not_in_retry_on_is_a_final_success)
{
    load("");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 500);
    struct retry_verdict v = decide(&f);
    cr_expect_null(v.fired);
    cr_expect_eq(v.stop, RETRY_STOP_NONE);
    f.status = 200;
    v = decide(&f);
    cr_expect_null(v.fired);
}

Test(decide, first_matching_condition_in_file_order_names_the_retry)
{
    load("{\"retry_on\": [\"500-599\", \"5xx\", \"503\"]}");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 503);
    cr_expect_str_eq(decide(&f).fired->token, "500-599");
}

Test(decide, connect_reset_and_timeout_match_their_tokens)
{
    load("{\"retry_on\": [\"timeout\", \"reset\", \"connect-failure\"]}");
    struct retry_facts f = facts(RETRY_OUT_CONNECT_FAILURE, 0);
    cr_expect_str_eq(decide(&f).fired->token, "connect-failure");
    f.outcome = RETRY_OUT_RESET;
    cr_expect_str_eq(decide(&f).fired->token, "reset");
    f.outcome = RETRY_OUT_TIMEOUT;
    cr_expect_str_eq(decide(&f).fired->token, "timeout");
}

Test(decide, failure_not_named_by_retry_on_is_not_retried_and_has_no_stop_reason)
{
    load("{\"retry_on\": [\"5xx\"]}");
    struct retry_facts f = facts(RETRY_OUT_RESET, 0);
    struct retry_verdict v = decide(&f);
    cr_expect_null(v.fired);
    cr_expect_eq(v.stop, RETRY_STOP_NONE);
}

Test(decide, non_retryable_method_stops_after_bytes_were_sent)
{
    load("");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 503);
    f.method_retryable = false;
    cr_expect_eq(decide(&f).stop, RETRY_STOP_NOT_RETRYABLE);
    f.outcome = RETRY_OUT_RESET;
    cr_expect_eq(decide(&f).stop, RETRY_STOP_NOT_RETRYABLE);
}

Test(decide, connect_failure_is_retried_for_any_method_and_body)
{
    load("");
    struct retry_facts f = facts(RETRY_OUT_CONNECT_FAILURE, 0);
    f.method_retryable = false;
    f.body_replayable = false;
    struct retry_verdict v = decide(&f);
    cr_expect_eq(v.stop, RETRY_STOP_NONE);
    cr_expect_eq(v.delay_ms, 100);
}

Test(decide, streamed_body_stops_with_body_too_large)
{
    load("");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 502);
    f.body_replayable = false;
    cr_expect_eq(decide(&f).stop, RETRY_STOP_BODY_TOO_LARGE);
}

Test(decide, last_attempt_stops_with_max_attempts)
{
    load("");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 503);
    f.attempts = 3;
    cr_expect_eq(decide(&f).stop, RETRY_STOP_MAX_ATTEMPTS);
    f.attempts = 2;
    cr_expect_eq(decide(&f).stop, RETRY_STOP_NONE);
    f.max_attempts = 2; /* lowered by X-Retry-Max-Attempts */
    cr_expect_eq(decide(&f).stop, RETRY_STOP_MAX_ATTEMPTS);
}

Test(decide, wait_reaching_the_deadline_stops_with_deadline)
{
    load("");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 503);
    f.backoff_ms = 999; /* 10000 + 999 < 11000: there is still 1 ms left */
    cr_expect_eq(decide(&f).stop, RETRY_STOP_NONE);
    f.backoff_ms = 1000; /* the wait would end exactly at the deadline */
    cr_expect_eq(decide(&f).stop, RETRY_STOP_DEADLINE);
}

Test(decide, retry_after_replaces_the_backoff_and_ignores_cap)
{
    load("{\"backoff\": {\"cap_ms\": 200}}");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 429);
    f.deadline_ms = 100000;
    f.has_retry_after = true;
    f.retry_after_ms = 5000;
    struct retry_verdict v = decide(&f);
    cr_expect_eq(v.stop, RETRY_STOP_NONE);
    cr_expect_eq(v.delay_ms, 5000);
    cr_expect(v.retry_after_used);
}

Test(decide, retry_after_above_max_ms_stops_with_retry_after)
{
    load("{\"retry_after\": {\"max_ms\": 2000}}");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 503);
    f.deadline_ms = 100000;
    f.has_retry_after = true;
    f.retry_after_ms = 2000;
    cr_expect_eq(decide(&f).stop, RETRY_STOP_NONE);
    f.retry_after_ms = 2001;
    cr_expect_eq(decide(&f).stop, RETRY_STOP_RETRY_AFTER);
}

Test(decide, retry_after_past_the_deadline_stops_with_deadline)
{
    load("");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 503);
    f.has_retry_after = true;
    f.retry_after_ms = 1000; /* deadline is 1000 ms away */
    cr_expect_eq(decide(&f).stop, RETRY_STOP_DEADLINE);
}

Test(decide, retry_after_is_ignored_when_not_honoured)
{
    load("{\"retry_after\": {\"honor\": false, \"max_ms\": 10}}");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 503);
    f.has_retry_after = true;
    f.retry_after_ms = 60000;
    struct retry_verdict v = decide(&f);
    cr_expect_eq(v.stop, RETRY_STOP_NONE);
    cr_expect_eq(v.delay_ms, 100);
    cr_expect_not(v.retry_after_used);
}

Test(decide, rules_apply_in_order_method_then_body_then_attempts)
{
    load("");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 503);
    f.method_retryable = false;
    f.body_replayable = false;
    f.attempts = 3;
    cr_expect_eq(decide(&f).stop, RETRY_STOP_NOT_RETRYABLE);
    f.method_retryable = true;
    cr_expect_eq(decide(&f).stop, RETRY_STOP_BODY_TOO_LARGE);
    f.body_replayable = true;
    cr_expect_eq(decide(&f).stop, RETRY_STOP_MAX_ATTEMPTS);
}

Test(decide, stop_names_match_the_contract)
{
    static const char *const want[] = {
        "",         "max-attempts", "budget",        "concurrency",
        "deadline", "retry-after",  "not-retryable", "body-too-large",
        "draining", "pushback"
    };
    for (int s = RETRY_STOP_NONE; s <= RETRY_STOP_PUSHBACK; s++)
        cr_expect_str_eq(retry_stop_name((enum retry_stop)s), want[s]);
}

/* ---- response headers: retry_on "header:..." and the pushback header ---- */

/* A response head of "name: value" pairs (NULL-terminated list). */
static struct hlist head_of(const char *const *fields)
{
    struct hlist h = { 0 };
    for (size_t i = 0; fields[i]; i += 2)
        cr_assert_eq(
            hlist_add(&h, fields[i], strlen(fields[i]), fields[i + 1], strlen(fields[i + 1])), 0);
    return h;
}

Test(decide, a_header_condition_retries_a_response_that_carries_the_field)
{
    load("{\"retry_on\": [\"header:X-Retry-Me\", \"header:X-Upstream=overloaded\"]}");
    struct hlist h = head_of((const char *const[]){ "x-retry-me", "1", NULL });
    struct retry_facts f = facts(RETRY_OUT_STATUS, 200);
    f.head = &h;
    struct retry_verdict v = decide(&f);
    cr_assert_not_null(v.fired, "the field, in any case, fires whatever the status");
    cr_expect_str_eq(v.fired->token, "header:X-Retry-Me");
    cr_expect_eq(v.stop, RETRY_STOP_NONE);
    hlist_free(&h);

    h = head_of((const char *const[]){ "X-Upstream", "Overloaded", NULL });
    f.head = &h;
    cr_expect_null(decide(&f).fired, "a value is compared exactly");
    hlist_free(&h);
    h = head_of((const char *const[]){ "X-Upstream", "busy", "X-Upstream", "overloaded", NULL });
    f.head = &h;
    v = decide(&f);
    cr_assert_not_null(v.fired, "any of the field's lines may hold the value");
    cr_expect_str_eq(v.fired->token, "header:X-Upstream=overloaded");
    hlist_free(&h);

    f.head = NULL; /* no response: a header condition cannot fire */
    f.outcome = RETRY_OUT_RESET;
    cr_expect_null(decide(&f).fired);
}

Test(decide, pushback_sets_the_wait_or_stops_before_retry_after)
{
    load("{\"pushback_header\": \"X-Retry-Pushback\"}");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 503);
    f.has_retry_after = true;
    f.retry_after_ms = 500;
    f.has_pushback = true;
    f.pushback_ms = 250;
    struct retry_verdict v = decide(&f);
    cr_expect_eq(v.stop, RETRY_STOP_NONE);
    cr_expect_eq(v.delay_ms, 250, "the pushback, not Retry-After's 500 nor the backoff's 100");
    cr_expect(v.pushback_used);
    cr_expect_not(v.retry_after_used);

    f.pushback_stops = true;
    v = decide(&f);
    cr_expect_eq(v.stop, RETRY_STOP_PUSHBACK);

    f.pushback_stops = false;
    f.pushback_ms = 5000; /* past the deadline, 1 s away */
    cr_expect_eq(decide(&f).stop, RETRY_STOP_DEADLINE);

    f.attempts = 3; /* no attempt left: that comes first */
    cr_expect_eq(decide(&f).stop, RETRY_STOP_MAX_ATTEMPTS);
}

/* ---- decide_attempt(): the policy, then the budgets, then the sequence ---- */

static struct live *live;
static struct budget global;
static struct rng rng;
static struct backoff_seq seq;

/* A route "r" with exponential backoff from 100 ms without jitter, and the top-level budget
 * 'budget_json'; 'drain' is the drain deadline (0: not draining). */
static struct decide_req whole(const char *budget_json, uint64_t drain)
{
    char text[1024];
    snprintf(text, sizeof(text),
             "{\"budget\": %s, \"routes\": [{\"name\": \"r\", \"upstreams\": [\"http://h:1\"], "
             "\"retry\": {\"backoff\": {\"policy\": \"exponential\", \"base_ms\": 100, "
             "\"jitter\": \"none\"}}}]}",
             budget_json);
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    cfg = cfg_load_buffer(text, strlen(text), "t", &errs);
    cr_assert_not_null(cfg, "%s", errs.n ? errs.v[0].msg : "?");
    cfg_errs_clear(&errs);
    live = live_new();
    struct live_route *lr = live_route(live, "r", cfg->routes[0].budget.window_ms);
    cr_assert_not_null(lr);
    budget_init(&global, cfg->budget.window_ms);
    rng_seed(&rng, 1);
    backoff_seq_reset(&seq);
    return (struct decide_req){ .policy = &cfg->routes[0].retry,
                                .seq = &seq,
                                .live = lr,
                                .rng = &rng,
                                .budgets = { .global = &global,
                                             .global_limits = &cfg->budget,
                                             .route = &lr->budget,
                                             .route_limits = &cfg->routes[0].budget,
                                             .drain_deadline_ms = drain } };
}

static void unload_whole(void)
{
    live_free(live);
    cfg_unref(cfg);
}

TestSuite(decide_attempt, .fini = unload_whole);

Test(decide_attempt, a_taken_retry_holds_a_slot_in_both_budgets_until_released)
{
    struct decide_req d = whole("{\"max_concurrent_retries\": 1}", 0);
    struct retry_facts f = facts(RETRY_OUT_CONNECT_FAILURE, 0);
    struct retry_verdict v;
    decide_attempt(&d, &f, &v);
    cr_assert_eq(v.stop, RETRY_STOP_NONE);
    cr_assert_eq(v.delay_ms, 100);
    cr_assert_eq(budget_in_flight(&global), 1);
    cr_assert_eq(budget_in_flight(d.budgets.route), 1);

    decide_attempt(&d, &f, &v); /* another request, while the first retry is in flight */
    cr_assert_eq(v.stop, RETRY_STOP_CONCURRENCY);
    cr_assert_eq(budget_in_flight(&global), 1, "a refused retry kept a slot");
    cr_assert_eq(budget_in_flight(d.budgets.route), 1);

    decide_release(&d);
    cr_assert_eq(budget_in_flight(&global), 0);
    cr_assert_eq(budget_in_flight(d.budgets.route), 0);
}

Test(decide_attempt, a_refused_retry_leaves_the_request_sequence_where_it_was)
{
    struct decide_req d = whole("{\"max_concurrent_retries\": 1}", 0);
    struct retry_facts f = facts(RETRY_OUT_CONNECT_FAILURE, 0);
    struct retry_verdict v;
    decide_attempt(&d, &f, &v);
    cr_assert_eq(v.delay_ms, 100);
    decide_attempt(&d, &f, &v); /* refused: the first retry holds the only slot */
    cr_assert_eq(v.stop, RETRY_STOP_CONCURRENCY);
    decide_release(&d);
    f.attempts = 2;
    decide_attempt(&d, &f, &v);
    cr_assert_eq(v.stop, RETRY_STOP_NONE);
    cr_assert_eq(v.delay_ms, 200, "the refused retry moved the sequence (200 ms expected)");
    decide_release(&d);
}

Test(decide_attempt, the_ratio_budget_refuses_once_its_share_is_spent)
{
    struct decide_req d =
        whole("{\"retry_ratio\": 0.5, \"min_retries_per_second\": 0, \"window_ms\": 1000}", 0);
    struct retry_facts f = facts(RETRY_OUT_CONNECT_FAILURE, 0);
    struct retry_verdict v;
    for (int i = 0; i < 4; i++) {
        budget_note_request(&global, f.now_ms);
        budget_note_request(d.budgets.route, f.now_ms);
    }
    for (int i = 0; i < 2; i++) {
        backoff_seq_reset(&seq);
        decide_attempt(&d, &f, &v);
        cr_assert_eq(v.stop, RETRY_STOP_NONE, "retry %d of 4 requests at ratio 0.5", i + 1);
        decide_release(&d);
    }
    decide_attempt(&d, &f, &v);
    cr_assert_eq(v.stop, RETRY_STOP_BUDGET);
    cr_assert_eq(budget_in_flight(&global), 0);
    cr_assert_eq(budget_in_flight(d.budgets.route), 0);
}

Test(decide_attempt, while_draining_a_wait_past_the_drain_deadline_is_refused)
{
    struct retry_facts f = facts(RETRY_OUT_CONNECT_FAILURE, 0);
    struct decide_req d = whole("{}", f.now_ms + 100); /* the wait would end right at it */
    struct retry_verdict v;
    decide_attempt(&d, &f, &v);
    cr_assert_eq(v.stop, RETRY_STOP_DRAINING);
    cr_assert_eq(budget_in_flight(&global), 0);
    d.budgets.drain_deadline_ms = f.now_ms + 101;
    decide_attempt(&d, &f, &v);
    cr_assert_eq(v.stop, RETRY_STOP_NONE);
    decide_release(&d);
}

/* ---- gRPC statuses (docs/grpc.md) ---- */

/* A gRPC call: a POST (not in retry.methods) whose 200 response carries 'grpc'. */
static struct retry_facts grpc_call(int grpc)
{
    struct retry_facts f = facts(RETRY_OUT_STATUS, 200);
    f.method_retryable = false;
    f.grpc_status = grpc;
    return f;
}

Test(decide, a_grpc_status_named_in_retry_on_is_retried_though_the_call_is_a_post)
{
    load("{\"retry_on\": [\"unavailable\", \"grpc:1-2\"]}");
    struct retry_facts f = grpc_call(14);
    struct retry_verdict v = decide(&f);
    cr_assert_not_null(v.fired);
    cr_expect_str_eq(v.fired->token, "unavailable");
    cr_expect_eq(v.stop, RETRY_STOP_NONE, "retried by its status, whatever retry.methods says");
    cr_expect_eq(v.delay_ms, 100);
    f = grpc_call(2);
    v = decide(&f);
    cr_assert_not_null(v.fired);
    cr_expect_str_eq(v.fired->token, "grpc:1-2");
}

Test(decide, a_grpc_status_retry_on_does_not_name_is_final)
{
    load("{\"retry_on\": [\"unavailable\", \"5xx\"]}");
    int finals[] = { 0, 4, 13, -1 };
    for (size_t i = 0; i < sizeof(finals) / sizeof(finals[0]); i++) {
        struct retry_facts f = grpc_call(finals[i]);
        struct retry_verdict v = decide(&f);
        cr_expect_null(v.fired, "grpc-status %d", finals[i]);
        cr_expect_eq(v.stop, RETRY_STOP_NONE);
    }
}

Test(decide, grpc_conditions_never_match_an_http_status_nor_http_ones_a_grpc_status)
{
    load("{\"retry_on\": [\"grpc:14\"]}");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 14 + 500);
    cr_expect_null(decide(&f).fired);
    unload();
    load("{\"retry_on\": [\"5xx\"]}");
    f = grpc_call(14);
    cr_expect_null(decide(&f).fired, "a 200 with grpc-status 14 is not a 5xx");
}

Test(decide, a_grpc_retry_still_needs_its_body_whole_and_attempts_left)
{
    load("{\"retry_on\": [\"unavailable\"]}");
    struct retry_facts f = grpc_call(14);
    f.body_replayable = false;
    struct retry_verdict v = decide(&f);
    cr_expect_eq(v.stop, RETRY_STOP_BODY_TOO_LARGE);
    f = grpc_call(14);
    f.attempts = 3;
    cr_expect_eq(decide(&f).stop, RETRY_STOP_MAX_ATTEMPTS);
}

Test(decide, an_http_status_on_a_post_stays_not_retryable)
{
    load("{\"retry_on\": [\"unavailable\", \"503\"]}");
    struct retry_facts f = facts(RETRY_OUT_STATUS, 503);
    f.method_retryable = false;
    f.grpc_status = 14;
    struct retry_verdict v = decide(&f);
    cr_assert_not_null(v.fired);
    cr_expect_str_eq(v.fired->token, "unavailable", "the first condition in file order fires");
    f.grpc_status = -1;
    v = decide(&f);
    cr_expect_str_eq(v.fired->token, "503");
    cr_expect_eq(v.stop, RETRY_STOP_NOT_RETRYABLE, "only a gRPC status vouches for a POST");
}

Test(decide, a_reset_the_upstream_left_unprocessed_goes_again_whatever_the_method)
{
    load("");
    struct retry_facts f = facts(RETRY_OUT_RESET, 0);
    f.method_retryable = false; /* a POST */
    f.unprocessed = true;       /* HTTP/2 REFUSED_STREAM, or a GOAWAY below the stream */
    struct retry_verdict v = decide(&f);
    cr_assert_not_null(v.fired);
    cr_expect_str_eq(v.fired->token, "reset");
    cr_expect_eq(v.stop, RETRY_STOP_NONE);
    f.body_replayable = false; /* its streamed body went out in part: it cannot go again */
    cr_expect_eq(decide(&f).stop, RETRY_STOP_BODY_TOO_LARGE);
    f = facts(RETRY_OUT_RESET, 0);
    f.method_retryable = false;
    cr_expect_eq(decide(&f).stop, RETRY_STOP_NOT_RETRYABLE,
                 "a reset the application may have seen");
}
