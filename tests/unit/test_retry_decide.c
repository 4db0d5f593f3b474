/* retry_decide(): every rule of CONTRACT §3/§4 that turns an attempt's end into "retry after
 * D ms" or "stop, because ...", exact and without a network. */
#include <criterion/criterion.h>

#include <string.h>

#include "config/cfg.h"
#include "proxy/decide.h"

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
                                 .backoff_ms = 100 };
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
        "draining"
    };
    for (int s = RETRY_STOP_NONE; s <= RETRY_STOP_DRAINING; s++)
        cr_expect_str_eq(retry_stop_name((enum retry_stop)s), want[s]);
}
