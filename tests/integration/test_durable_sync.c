/* Sync routes that keep dead letters (routes[].delivery.dead_letter, docs/delivery.md): the
 * caller's answer at once, the request kept with each attempt, a route made sync, and a dead
 * letter the full store refuses. The real binary, a real SQLite file, the test upstream. */
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

/* The proxy with sync route "r" keeping dead letters (2 attempts, POST retried) and 'store'
 * members besides the store's path; with 'plain', route "plain" (at /plain, keeping none)
 * first. */
static void start_sync_dead(const char *store, bool plain)
{
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"%s}", dur_store_path, store);
    if (plain)
        cfgb_route(b, "plain",
                   "\"match\": {\"path_prefix\": \"/plain\"}, \"retry\": {" CFG_FAST "}");
    cfgb_route(b, "r",
               "\"delivery\": {\"dead_letter\": true}, \"retry\": {\"max_attempts\": 2, "
               "\"methods\": [\"POST\"], " CFG_FAST "}");
    char *json = cfgb_text(b);
    fx_start(json, "--workers", "2", NULL);
    free(json);
}

/* A sync route with dead_letter: the caller's answer is what it would be, at once; a request
 * whose retries ran out is kept dead with its attempts, its body and the final answer. A
 * request that succeeded, or one on a route without dead_letter, leaves nothing. */
Test(durable, a_sync_route_keeps_a_request_whose_retries_ran_out_as_a_dead_letter)
{
    start_sync_dead("", true);
    struct http_resp r;
    const char *plan[] = { "X-Test-Plan: fail=100; status=503; header=X-Why:down", NULL };
    dur_post("sync-dead", "the payment", plan, &r);
    cr_assert_eq(r.status, 503, "the caller gets the last answer, unchanged");
    cr_assert_str_eq(http_hdr(&r, "X-Retry-Stop"), "max-attempts");
    cr_assert_null(http_hdr(&r, "X-Delivery-Id"));
    http_free(&r);
    const char *ok[] = { "X-Test-Plan: fail=0", NULL };
    dur_post("sync-ok", "fine", ok, &r);
    cr_assert_eq(r.status, 200);
    http_free(&r);
    const char *h[] = { "X-Request-Id: plain-dead", "X-Test-Plan: fail=100", NULL };
    http_do("POST", fx_url("/plain"), h, "x", 1, DUR_T, &r);
    cr_assert_eq(r.status, 503);
    http_free(&r);
    cr_assert_eq(
        fx_wait_metric("retryproxy_dead_letters_total{route=\"r\",reason=\"attempts\"}", 1, 5000),
        1);
    cr_assert_eq(dur_db_int("SELECT count(*) FROM deliveries", NULL), 1,
                 "one dead letter, no more");
    char *id = dur_db_text("SELECT id FROM deliveries WHERE route = ?1", "r");
    cr_assert_eq(dur_state_of(id), 3);
    cr_assert_eq(dur_db_int("SELECT attempts FROM deliveries WHERE id = ?1", id), 2);
    char *reason = dur_db_text("SELECT reason FROM deliveries WHERE id = ?1", id);
    cr_assert_str_eq(reason, "max-attempts");
    free(reason);
    char *body = dur_db_text("SELECT body FROM deliveries WHERE id = ?1", id);
    cr_assert_str_eq(body, "the payment");
    free(body);
    char *head = dur_db_text("SELECT final_head FROM deliveries WHERE id = ?1", id);
    cr_assert_not_null(strstr(head, "HTTP/1.1 503"), "%s", head);
    cr_assert_not_null(strstr(head, "X-Why: down"), "%s", head);
    free(head);
    /* each attempt its own row: its start, duration, status and outcome, in order */
    cr_assert_eq(dur_db_int("SELECT count(*) FROM attempts WHERE delivery = ?1", id), 2);
    cr_assert_eq(
        dur_db_int("SELECT count(*) FROM attempts WHERE delivery = ?1 AND status = 503 AND "
                   "outcome = '5xx' AND at > 0 AND duration_ms >= 0",
                   id),
        2);
    cr_assert_eq(dur_db_int("SELECT max(at) - min(at) >= 0 FROM attempts WHERE delivery = ?1", id),
                 1);
    free(id);
}

/* POSTs 'body' as 'rid' to sync route "r" (dead_letter true), whose upstream answers 503: the
 * caller gets the 503, and the route's first dead letter is kept and counted. Its id, malloc'd. */
static char *post_first_sync_dead(const char *rid, const char *body)
{
    const char *plan[] = { "X-Test-Plan: fail=100; status=503", NULL };
    struct http_resp r;
    dur_post(rid, body, plan, &r);
    cr_assert_eq(r.status, 503);
    http_free(&r);
    cr_assert_eq(
        fx_wait_metric("retryproxy_dead_letters_total{route=\"r\",reason=\"attempts\"}", 1, 5000),
        1);
    return dur_db_text("SELECT id FROM deliveries WHERE route = ?1", "r");
}

/* A request whose first attempt found no upstream (connection refused) and whose second was
 * answered 503 keeps both, each with its own outcome: the dead letter says what each did. */
Test(durable, a_sync_dead_letter_keeps_each_attempt_with_its_own_outcome)
{
    char route[512];
    snprintf(route, sizeof(route),
             "\"upstreams\": [\"http://127.0.0.1:%u\", \"%s\"], \"delivery\": "
             "{\"dead_letter\": true}, \"retry\": {\"max_attempts\": 3, \"methods\": "
             "[\"POST\"], " CFG_FAST "}",
             (unsigned)fx_closed_port(), fx_up_url(0));
    dur_start_route(route);
    char *id = post_first_sync_dead("sync-each", "x");
    cr_assert_eq(dur_db_int("SELECT count(*) FROM attempts WHERE delivery = ?1", id), 3);
    cr_assert_geq(dur_db_int("SELECT count(*) FROM attempts WHERE delivery = ?1 AND status = 0 AND "
                             "outcome = 'connect_failure'",
                             id),
                  1);
    cr_assert_geq(
        dur_db_int("SELECT count(*) FROM attempts WHERE delivery = ?1 AND status = 503 AND "
                   "outcome = '5xx'",
                   id),
        1);
    /* each with the upstream it went to, and the row with its last one's */
    char *last =
        dur_db_text("SELECT upstream FROM attempts WHERE delivery = ?1 ORDER BY rowid DESC "
                    "LIMIT 1",
                    id);
    char *row = dur_db_text("SELECT upstream FROM deliveries WHERE id = ?1", id);
    cr_assert_str_eq(row, last);
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM attempts WHERE delivery = ?1 AND (status = 503) = (upstream = "
             "'%s')",
             fx_up_url(0));
    cr_assert_eq(dur_db_int(sql, id), 3, "the 503s came from %s, the failures to connect not",
                 fx_up_url(0));
    free(last);
    free(row);
    free(id);
}

/* A delivery of a route that is no longer durable (a restart on a config that made it sync,
 * keeping dead letters) is delivered as its route is, and its attempts are the courier's: none
 * is also kept as a synchronous dead letter. */
Test(durable, a_delivery_of_a_route_made_sync_is_delivered_and_not_kept_twice)
{
    char *before = dur_cfg("", ", \"max_attempts\": 10", "", "");
    fx_start(before, "--workers", "2", NULL);
    free(before);
    const char *plan[] = { "X-Test-Plan: fail=3", NULL };
    char id[33];
    dur_post_accepted("to-sync", "x", plan, id);
    cr_assert_eq(tup_wait_count(up, 1, 10000), 0);
    px_stop(px, 10000);
    px = NULL;
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"}", dur_store_path);
    cfgb_route(
        b, "r",
        "\"delivery\": {\"dead_letter\": true}, \"retry\": {\"max_attempts\": 10, " CFG_FIXED(
            300) "}");
    char *after = cfgb_text(b);
    fx_start(after, "--workers", "2", NULL);
    free(after);
    dur_wait_state(id, 2, 15000);
    cr_assert_eq(tup_count_id(up, "to-sync"), 4);
    cr_assert_eq(dur_db_int("SELECT count(*) FROM deliveries", NULL), 1, "kept once");
}

/* A sync route's dead letter beyond store.max_count is refused: its caller still gets its answer
 * at once, a warn line and dead_letters_refused_total say so, and the dead letter kept before
 * stays (nothing is evicted). */
Test(durable, a_dead_letter_the_full_store_refuses_is_logged_and_counted)
{
    start_sync_dead(", \"max_count\": 1", false);
    char *kept = post_first_sync_dead("kept-1", "first");
    const char *plan[] = { "X-Test-Plan: fail=100; status=503", NULL };
    struct http_resp r;
    const char *series = "retryproxy_dead_letters_refused_total{route=\"r\"}";
    for (int n = 1; n <= 2; n++) {
        char rid[32];
        snprintf(rid, sizeof(rid), "refused-%d", n);
        dur_post(rid, "later", plan, &r);
        cr_assert_eq(r.status, 503, "the caller gets its final answer");
        cr_assert_str_eq(http_hdr(&r, "X-Retry-Stop"), "max-attempts");
        http_free(&r);
        cr_assert_eq(fx_wait_metric(series, n, 5000), n, "%s", series);
        json_t *line = fx_logged("dead letter not kept", "request_id", rid);
        cr_assert_not_null(line, "no 'dead letter not kept' line for %s", rid);
        cr_expect_str_eq(json_str(line, "level"), "warn");
        cr_expect_str_eq(json_str(line, "route"), "r");
        json_decref(line);
    }
    cr_assert_eq(dur_db_int("SELECT count(*) FROM deliveries", NULL), 1, "nothing more was kept");
    cr_assert_eq(dur_db_int("SELECT count(*) FROM deliveries WHERE id = ?1", kept), 1,
                 "and nothing was evicted");
    cr_assert_eq(fx_metric("retryproxy_dead_letters_total{route=\"r\",reason=\"attempts\"}"), 1);
    free(kept);
}
