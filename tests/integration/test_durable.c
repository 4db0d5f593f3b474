/* Durable routes end to end (docs/delivery.md): the real binary, a real SQLite file in the
 * test's own directory, the test upstream. What a caller gets (202 and its id, 413, 422, 503),
 * what the upstream received (the body, the id header), and what the store kept (the row's
 * state, its attempts, a dead letter's reason and final head), read from the file itself.
 *
 * Policies are short (fixed backoffs of a few hundred ms, no jitter); the courier looks for due
 * deliveries every 200 ms, so spacings are asserted with that much slack and more (a loaded
 * machine), and every wait is bounded.
 *
 * Restarts and the crash test are test_durable_restarts.c's, the route's policy applied to
 * deliveries (reloads, backoff, pacing, budgets) test_durable_policy.c's, a sync route's dead
 * letters test_durable_sync.c's; what they share is tests/support/durabletest.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/durabletest.h"

TestSuite(durable, .init = dur_setup, .fini = fx_stop);

Test(durable, accepted_then_delivered_with_its_body_and_id)
{
    dur_start("", "", "", "");
    const char *body = "{\"event\": \"paid\", \"order\": 42}";
    char id[33];
    dur_post_accepted("dlv-1", body, NULL, id);
    fx_wait_upstream("dlv-1", 1);
    const struct tup_req *q = tup_get(up, 0);
    cr_assert_str_eq(q->method, "POST");
    cr_assert_str_eq(q->target, "/hook");
    cr_assert_eq(q->body_len, strlen(body));
    cr_assert_eq(q->body_hash, tup_hash(body, strlen(body)), "the body delivered differs");
    cr_assert_str_eq(tup_req_header(q, "webhook-id"), id);
    dur_wait_state(id, 2, 5000);
    cr_assert_eq(dur_db_int("SELECT count(*) FROM attempts WHERE delivery = ?1", id), 1);
    cr_assert_eq(dur_db_int("SELECT status FROM attempts WHERE delivery = ?1", id), 200);
    cr_assert_eq(fx_metric("retryproxy_delivery_accepts_total{route=\"r\",result=\"accepted\"}"),
                 1);
    cr_assert_eq(
        fx_wait_metric("retryproxy_delivery_attempts_total{route=\"r\",outcome=\"delivered\"}", 1,
                       5000),
        1);
}

/* An HTTP/2 caller is accepted the same way: the core answers, the front end only relays. */
Test(durable, accepted_over_http2)
{
    dur_start("", "", "", "");
    struct http_resp r;
    const char *h[] = { "X-Request-Id: dlv-h2", NULL };
    http_do_h2("POST", fx_url("/hook"), h, "h2 body", 7, DUR_T, &r);
    char id[33];
    dur_accepted(&r, id);
    http_free(&r);
    fx_wait_upstream("dlv-h2", 1);
    cr_assert_str_eq(tup_req_header(tup_get(up, 0), "webhook-id"), id);
    dur_wait_state(id, 2, 5000);
}

/* ---- retried by the route's policy ---- */

Test(durable, retried_by_the_policy_then_delivered)
{
    dur_start("", ", \"max_attempts\": 5", "", "");
    const char *plan[] = { "X-Test-Plan: fail=2", NULL };
    char id[33];
    dur_post_accepted("dlv-retry", "x", plan, id);
    dur_wait_state(id, 2, 10000);
    cr_assert_eq(tup_count_id(up, "dlv-retry"), 3);
    /* spaced by the policy's 300 ms: at least that, at most that and the courier's poll and a
     * loaded machine's slack */
    for (size_t i = 1; i < 3; i++) {
        int64_t gap_ms = dur_between_ms(i - 1, i);
        cr_assert_geq(gap_ms, 280, "attempt %zu came %lld ms after the one before", i + 1,
                      (long long)gap_ms);
        cr_assert_leq(gap_ms, 3000, "attempt %zu came %lld ms after", i + 1, (long long)gap_ms);
    }
    cr_assert_eq(dur_db_int("SELECT count(*) FROM attempts WHERE delivery = ?1", id), 3);
    cr_assert_eq(
        dur_db_int("SELECT count(*) FROM attempts WHERE delivery = ?1 AND status = 503", id), 2);
    cr_assert_eq(dur_db_int("SELECT attempts FROM deliveries WHERE id = ?1", id), 3);
    cr_assert_eq(
        fx_metric("retryproxy_delivery_attempts_total{route=\"r\",outcome=\"rescheduled\"}"), 2);
}

/* ---- dead letters ---- */

Test(durable, dead_after_max_attempts_with_every_attempt_and_the_final_head)
{
    dur_start("", ", \"max_attempts\": 3", "", "");
    const char *plan[] = { "X-Test-Plan: fail=100; status=503; header=X-Why:down", NULL };
    char id[33];
    dur_post_accepted("dlv-dead", "x", plan, id);
    dur_wait_dead(id, "attempts");
    cr_assert_eq(tup_count_id(up, "dlv-dead"), 3);
    cr_assert_eq(
        dur_db_int("SELECT count(*) FROM attempts WHERE delivery = ?1 AND status = 503", id), 3);
    cr_assert_eq(dur_db_int("SELECT min(duration_ms) >= 0 AND min(at) > 0 FROM attempts WHERE "
                            "delivery = ?1",
                            id),
                 1);
    cr_assert_eq(fx_metric("retryproxy_delivery_attempts_total{route=\"r\",outcome=\"dead\"}"), 1);
    char *head = dur_db_text("SELECT final_head FROM deliveries WHERE id = ?1", id);
    cr_assert_not_null(strstr(head, "503"), "final head: %s", head);
    cr_assert_not_null(strstr(head, "X-Why: down"), "final head: %s", head);
    free(head);
}

Test(durable, dead_at_once_on_a_final_4xx)
{
    dur_start("", "", "", "");
    const char *plan[] = { "X-Test-Plan: fail=100; status=400", NULL };
    char id[33];
    dur_post_accepted("dlv-400", "x", plan, id);
    dur_wait_dead(id, "final");
    cr_assert_eq(tup_count_id(up, "dlv-400"), 1, "a final answer is not retried");
    char *body = dur_db_text("SELECT final_body FROM deliveries WHERE id = ?1", id);
    cr_assert_gt(strlen(body), 0, "the final body's first bytes are kept");
    free(body);
}

Test(durable, dead_when_its_age_runs_out)
{
    dur_start("", ", \"max_attempts\": 50", ", \"max_age_ms\": 700", "");
    const char *plan[] = { "X-Test-Plan: fail=100", NULL };
    char id[33];
    dur_post_accepted("dlv-age", "x", plan, id);
    dur_wait_dead(id, "age");
    size_t n = tup_count_id(up, "dlv-age");
    cr_assert(n >= 2 && n <= 3, "%zu attempts in 700 ms at 300 ms apart", n);
}

/* dead_letter false on a durable route: a delivery whose attempts are spent is deleted, not
 * kept, and never silently: a warn line names it and why, and a counter counts it. */
Test(durable, dead_letter_false_deletes_a_spent_delivery_with_a_log_line_and_a_count)
{
    dur_start("", ", \"max_attempts\": 2", ", \"dead_letter\": false", "");
    const char *plan[] = { "X-Test-Plan: fail=100", NULL };
    char id[33];
    dur_post_accepted("discard-1", "x", plan, id);
    cr_assert_eq(
        fx_wait_metric("retryproxy_deliveries_discarded_total{route=\"r\",reason=\"attempts\"}", 1,
                       10000),
        1);
    json_t *line = fx_logged("delivery discarded", "id", id);
    cr_assert_not_null(line, "no 'delivery discarded' line for %s", id);
    cr_expect_str_eq(json_str(line, "level"), "warn");
    cr_expect_str_eq(json_str(line, "reason"), "attempts");
    cr_expect_eq(json_integer_value(json_object_get(line, "attempts")), 2);
    json_decref(line);
    cr_assert_eq(tup_count_id(up, "discard-1"), 2);
    /* counted and logged when decided; the delete commits a moment later */
    for (int64_t until = now_ms() + 10000;
         dur_db_int("SELECT count(*) FROM deliveries", NULL) != 0 && now_ms() < until;)
        sleep_ms(20);
    cr_assert_eq(dur_db_int("SELECT count(*) FROM deliveries", NULL), 0, "nothing is kept");
    cr_assert_eq(dur_db_int("SELECT count(*) FROM attempts", NULL), 0, "nor its attempts");
    double dead = fx_metric("retryproxy_dead_letters_total{route=\"r\",reason=\"attempts\"}");
    cr_assert(dead != dead || dead == 0, "counted as a dead letter kept: %g", dead);
}

/* The upstream of each attempt is kept, and the operators filter by it: the list, a replay by
 * filter (dry run) and the CLI see only the deliveries whose last attempt went to it. */
Test(durable, deliveries_are_filtered_by_the_upstream_their_last_attempt_went_to)
{
    char closed[64], a_id[33], b_id[33];
    snprintf(closed, sizeof(closed), "http://127.0.0.1:%u", (unsigned)fx_closed_port());
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"}", dur_store_path);
    cfgb_route(b, "a",
               "\"match\": {\"path_prefix\": \"/a\"}, \"delivery\": {\"mode\": \"durable\"}, "
               "\"retry\": {\"max_attempts\": 1}");
    cfgb_route(b, "b",
               "\"match\": {\"path_prefix\": \"/b\"}, \"upstreams\": [\"%s\"], \"delivery\": "
               "{\"mode\": \"durable\"}, \"retry\": {\"max_attempts\": 1}",
               closed);
    char *json = cfgb_text(b);
    cfg_write_renamed(fx_cfg_path, json); /* for the CLI */
    fx_start(json, "--workers", "2", NULL);
    free(json);
    const char *h[] = { "X-Request-Id: up-a", "X-Test-Plan: fail=100", NULL };
    struct http_resp r;
    http_do("POST", fx_url("/a"), h, "x", 1, DUR_T, &r);
    dur_accepted(&r, a_id);
    http_free(&r);
    http_do("POST", fx_url("/b"), NULL, "x", 1, DUR_T, &r);
    dur_accepted(&r, b_id);
    http_free(&r);
    dur_wait_state(a_id, 3, 10000);
    dur_wait_state(b_id, 3, 10000);

    char path[256];
    snprintf(path, sizeof(path), "/deliveries?upstream=%s", fx_up_url(0));
    long status = 0;
    json_t *j = fx_admin_json("GET", path, &status);
    cr_assert_eq(status, 200);
    json_t *list = json_object_get(j, "deliveries");
    cr_assert_eq(json_array_size(list), 1, "one delivery went to %s", fx_up_url(0));
    cr_expect_str_eq(json_str(json_array_get(list, 0), "id"), a_id);
    cr_expect_str_eq(json_str(json_array_get(list, 0), "upstream"), fx_up_url(0));
    json_decref(j);
    snprintf(path, sizeof(path), "/deliveries/%s", b_id);
    j = fx_admin_json("GET", path, &status);
    json_t *tries = json_object_get(j, "attempts_made");
    cr_assert_eq(json_array_size(tries), 1);
    cr_expect_str_eq(json_str(json_array_get(tries, 0), "upstream"), closed);
    json_decref(j);
    snprintf(path, sizeof(path), "/deliveries/replay?upstream=%s&dry_run=1", closed);
    j = fx_admin_json("POST", path, &status);
    cr_assert_eq(status, 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "count")), 1);
    json_decref(j);
    snprintf(path, sizeof(path), "/deliveries?upstream=%s", "http://nowhere:1");
    j = fx_admin_json("GET", path, &status);
    cr_expect_eq(json_array_size(json_object_get(j, "deliveries")), 0);
    json_decref(j);

    /* the CLI, on the same file */
    char cmd[1024], out[4096] = "";
    snprintf(cmd, sizeof(cmd), "%s deliveries list -c %s --upstream %s --json", proc_bin(),
             fx_cfg_path, closed);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t got = fread(out, 1, sizeof(out) - 1, p);
    out[got] = '\0';
    cr_assert_eq(pclose(p), 0, "%s: %s", cmd, out);
    cr_expect_not_null(strstr(out, b_id), "%s", out);
    cr_expect_null(strstr(out, a_id), "%s", out);
}

/* ---- what is refused, before anything is stored ---- */

Test(durable, too_large_is_413_and_nothing_is_stored)
{
    dur_start("", "", ", \"max_body_bytes\": 16", "");
    struct http_resp r;
    dur_post("big-cl", "0123456789abcdefXYZ", NULL, &r);
    cr_assert_eq(r.status, 413);
    http_free(&r);
    /* a chunked body is refused once it grows past the bound */
    const char *chunked[] = { "Transfer-Encoding: chunked", NULL };
    dur_post("big-chunked", "0123456789abcdefXYZ", chunked, &r);
    cr_assert_eq(r.status, 413);
    http_free(&r);
    dur_post("small", "0123456789", NULL, &r);
    cr_assert_eq(r.status, 202);
    http_free(&r);
    cr_assert_eq(dur_db_int("SELECT count(*) FROM deliveries", NULL), 1);
    cr_assert_eq(fx_metric("retryproxy_delivery_accepts_total{route=\"r\",result=\"too_large\"}"),
                 2);
}

Test(durable, same_idempotency_key_same_id_other_body_422)
{
    dur_start("", "", "", "");
    struct http_resp r;
    const char *key[] = { "Idempotency-Key: k-1", NULL };
    dur_post("idem-a", "same body", key, &r);
    char id1[33], id2[33];
    dur_accepted(&r, id1);
    http_free(&r);
    dur_post("idem-b", "same body", key, &r);
    dur_accepted(&r, id2);
    http_free(&r);
    cr_assert_str_eq(id1, id2, "the same key and body: the same delivery");
    dur_post("idem-c", "another body", key, &r);
    cr_assert_eq(r.status, 422);
    cr_assert_null(http_hdr(&r, "X-Delivery-Id"));
    http_free(&r);
    dur_wait_state(id1, 2, 5000);
    cr_assert_eq(dur_db_int("SELECT count(*) FROM deliveries", NULL), 1);
    cr_assert_eq(tup_count_id(up, "idem-a"), 1);
    cr_assert_str_eq(tup_req_header(tup_get(up, 0), "Idempotency-Key"), "k-1");
    cr_assert_eq(fx_metric("retryproxy_delivery_accepts_total{route=\"r\",result=\"duplicate\"}"),
                 1);
    cr_assert_eq(fx_metric("retryproxy_delivery_accepts_total{route=\"r\",result=\"conflict\"}"),
                 1);
}

Test(durable, full_store_is_503_with_retry_after)
{
    char route[96];
    snprintf(route, sizeof(route), ", \"upstreams\": [\"http://127.0.0.1:%u\"]",
             (unsigned)fx_closed_port());
    dur_start(", \"max_count\": 1", "", "", route);
    struct http_resp r;
    dur_post("full-1", "x", NULL, &r);
    cr_assert_eq(r.status, 202);
    http_free(&r);
    dur_post("full-2", "x", NULL, &r);
    cr_assert_eq(r.status, 503, "status %ld", r.status);
    cr_assert_not_null(http_hdr(&r, "Retry-After"));
    cr_assert_gt(atoi(http_hdr(&r, "Retry-After")), 0);
    cr_assert_not_null(memmem(r.body, r.body_len, "store_full", 10));
    http_free(&r);
    cr_assert_eq(fx_metric("retryproxy_delivery_accepts_total{route=\"r\",result=\"full\"}"), 1);
    cr_assert_eq(dur_db_int("SELECT count(*) FROM deliveries", NULL), 1);
}

/* ---- the process's own file ---- */

Test(durable, a_second_proxy_on_the_same_store_exits_naming_it)
{
    dur_start("", "", "", "");
    char *json = dur_cfg("", "", "", "");
    char cfg[256];
    snprintf(cfg, sizeof(cfg), "%s.second.json", dur_store_path);
    FILE *f = fopen(cfg, "w");
    cr_assert_not_null(f);
    fputs(json, f);
    fclose(f);
    free(json);
    char cmd[600];
    /* bounded: a second proxy that did start would serve until stopped (timeout's 124) */
    snprintf(cmd, sizeof(cmd),
             "timeout -s KILL 10 %s -c %s --listen 127.0.0.1:0 --admin 127.0.0.1:0 >/dev/null "
             "2>%s.err",
             getenv("RETRYPROXY_BIN"), cfg, cfg);
    cr_assert_eq(fx_sh(cmd), 1, "the second proxy must not start");
    snprintf(cmd, sizeof(cmd), "grep -q 'store.db.lock' %s.err", cfg);
    cr_assert_eq(fx_sh(cmd), 0, "its error names the lock file");
}

/* ---- at least once across a crash ---- */
