/* Durable routes end to end (docs/delivery.md): the real binary, a real SQLite file in the
 * test's own directory, the test upstream. What a caller gets (202 and its id, 413, 422, 503),
 * what the upstream received (the body, the id header), and what the store kept (the row's
 * state, its attempts, a dead letter's reason and final head), read from the file itself.
 *
 * Policies are short (fixed backoffs of a few hundred ms, no jitter); the courier looks for due
 * deliveries every 200 ms, so spacings are asserted with that much slack and more (a loaded
 * machine), and every wait is bounded.
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

#define T 20000 /* ms: upper bound for any single request */

static char store_path[160], disk_store[160]; /* the store, and where setup() put it */

static void setup(void)
{
    fx_upstreams(1);
    snprintf(store_path, sizeof(store_path), "%s/store.db", fx_config_dir("durable"));
    snprintf(disk_store, sizeof(disk_store), "%s", store_path);
}

TestSuite(durable, .init = setup, .fini = fx_stop);

/* The config: 'store' members besides its path; route "r" durable, a fixed 300 ms backoff, with
 * 'retry' and 'delivery' members more, and 'route' members (each "" or ", "-led text). */
static char *durable_cfg(const char *store, const char *retry, const char *delivery,
                         const char *route)
{
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"%s}", store_path, store);
    cfgb_route(b, "r",
               "\"delivery\": {\"mode\": \"durable\"%s}, \"retry\": {" CFG_FIXED(300) "%s}%s",
               delivery, retry, route);
    return cfgb_text(b);
}

static void start(const char *store, const char *retry, const char *delivery, const char *route)
{
    char *json = durable_cfg(store, retry, delivery, route);
    fx_start(json, "--workers", "2", NULL);
    free(json);
}

/* The proxy on the store and route "r" of 'members' alone (its JSON members, as written). */
static void start_route(const char *members)
{
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"}", store_path);
    cfgb_route(b, "r", "%s", members);
    char *json = cfgb_text(b);
    fx_start(json, "--workers", "2", NULL);
    free(json);
}

/* POST 'body' to the durable route with X-Request-Id 'id' and 'more' headers (NULL-ended). */
static void post(const char *id, const char *body, const char *const *more, struct http_resp *out)
{
    char idh[128];
    snprintf(idh, sizeof(idh), "X-Request-Id: %s", id);
    const char *h[8] = { idh };
    for (size_t i = 0; more && more[i] && i < 6; i++)
        h[i + 1] = more[i];
    http_do("POST", fx_url("/hook"), h, body, strlen(body), T, out);
    cr_assert_eq(out->rc, 0, "the accept's transfer failed");
}

/* ---- the store's file, read by the test ---- */

static sqlite3 *db_open(void)
{
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open_v2(store_path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK,
                 "cannot open %s", store_path);
    sqlite3_busy_timeout(db, 5000);
    return db;
}

/* One integer of 'sql' (with 'id' bound to ?1 when not NULL); -1 when no row. */
static long long db_int(const char *sql, const char *id)
{
    sqlite3 *db = db_open();
    sqlite3_stmt *st = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql,
                 sqlite3_errmsg(db));
    if (id)
        sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    long long v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* One text of 'sql' for 'id', malloc'd ("" when none). */
static char *db_text(const char *sql, const char *id)
{
    sqlite3 *db = db_open();
    sqlite3_stmt *st = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s", sql);
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    char *v = NULL;
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
        const void *p = sqlite3_column_blob(st, 0);
        int n = sqlite3_column_bytes(st, 0);
        v = strndup(p, (size_t)n);
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v ? v : strdup("");
}

static long long state_of(const char *id)
{
    return db_int("SELECT state FROM deliveries WHERE id = ?1", id);
}

struct state_wait {
    const char *id;
    long long want;
};

static bool has_state(void *arg)
{
    struct state_wait *w = arg;
    return state_of(w->id) == w->want;
}

/* Waits up to 'ms' for delivery 'id' to reach state 'want' (2 delivered, 3 dead); asserts. */
static void wait_state(const char *id, long long want, int ms)
{
    struct state_wait w = { id, want };
    cr_assert(fx_wait(has_state, &w, ms, 50), "delivery %s: state %lld, not %lld after %d ms", id,
              state_of(id), want, ms);
}

/* The delivery's id from a 202, copied to 'id' (33 bytes); asserts the 202's shape. */
static void accepted(struct http_resp *r, char *id)
{
    cr_assert_eq(r->status, 202, "status %ld: %.*s", r->status, (int)r->body_len,
                 (const char *)r->body);
    const char *h = http_hdr(r, "X-Delivery-Id");
    cr_assert_not_null(h, "no X-Delivery-Id");
    cr_assert_eq(strlen(h), 32, "X-Delivery-Id %s", h);
    snprintf(id, 33, "%s", h);
    char loc[64];
    snprintf(loc, sizeof(loc), "/deliveries/%s", id);
    cr_assert_str_eq(http_hdr(r, "Location"), loc);
    char want[128];
    snprintf(want, sizeof(want), "\"id\": \"%s\"", id);
    cr_assert_not_null(memmem(r->body, r->body_len, want, strlen(want)), "body %.*s",
                       (int)r->body_len, (const char *)r->body);
}

/* POSTs as post() does and asserts its 202; the delivery's id into 'id' (33 bytes). */
static void post_accepted(const char *rid, const char *body, const char *const *more, char *id)
{
    struct http_resp r;
    post(rid, body, more, &r);
    accepted(&r, id);
    http_free(&r);
}

/* 'n' requests with ids PREFIX-0 ..., each answered 202. */
static void post_many(const char *prefix, int n)
{
    for (int i = 0; i < n; i++) {
        char rid[32], id[33];
        snprintf(rid, sizeof(rid), "%s-%d", prefix, i);
        post_accepted(rid, "x", NULL, id);
    }
}

/* ms from the upstream's request 'a' to its request 'b' (tup's records, by arrival). */
static int64_t between_ms(size_t a, size_t b)
{
    return (tup_get(up, b)->arrival_ns - tup_get(up, a)->arrival_ns) / 1000000;
}

/* Delivery 'id' of route "r" becomes a dead letter for 'reason' (within 10 s), counted so. */
static void wait_dead(const char *id, const char *reason)
{
    wait_state(id, 3, 10000);
    char *got = db_text("SELECT reason FROM deliveries WHERE id = ?1", id);
    cr_assert_str_eq(got, reason, "delivery %s", id);
    free(got);
    char series[128];
    snprintf(series, sizeof(series), "retryproxy_dead_letters_total{route=\"r\",reason=\"%s\"}",
             reason);
    cr_assert_eq(fx_wait_metric(series, 1, 5000), 1, "%s", series);
}

/* ---- accepted, then delivered ---- */

Test(durable, accepted_then_delivered_with_its_body_and_id)
{
    start("", "", "", "");
    const char *body = "{\"event\": \"paid\", \"order\": 42}";
    char id[33];
    post_accepted("dlv-1", body, NULL, id);
    fx_wait_upstream("dlv-1", 1);
    const struct tup_req *q = tup_get(up, 0);
    cr_assert_str_eq(q->method, "POST");
    cr_assert_str_eq(q->target, "/hook");
    cr_assert_eq(q->body_len, strlen(body));
    cr_assert_eq(q->body_hash, tup_hash(body, strlen(body)), "the body delivered differs");
    cr_assert_str_eq(tup_req_header(q, "webhook-id"), id);
    wait_state(id, 2, 5000);
    cr_assert_eq(db_int("SELECT count(*) FROM attempts WHERE delivery = ?1", id), 1);
    cr_assert_eq(db_int("SELECT status FROM attempts WHERE delivery = ?1", id), 200);
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
    start("", "", "", "");
    struct http_resp r;
    const char *h[] = { "X-Request-Id: dlv-h2", NULL };
    http_do_h2("POST", fx_url("/hook"), h, "h2 body", 7, T, &r);
    char id[33];
    accepted(&r, id);
    http_free(&r);
    fx_wait_upstream("dlv-h2", 1);
    cr_assert_str_eq(tup_req_header(tup_get(up, 0), "webhook-id"), id);
    wait_state(id, 2, 5000);
}

/* ---- retried by the route's policy ---- */

Test(durable, retried_by_the_policy_then_delivered)
{
    start("", ", \"max_attempts\": 5", "", "");
    const char *plan[] = { "X-Test-Plan: fail=2", NULL };
    char id[33];
    post_accepted("dlv-retry", "x", plan, id);
    wait_state(id, 2, 10000);
    cr_assert_eq(tup_count_id(up, "dlv-retry"), 3);
    /* spaced by the policy's 300 ms: at least that, at most that and the courier's poll and a
     * loaded machine's slack */
    for (size_t i = 1; i < 3; i++) {
        int64_t gap_ms = between_ms(i - 1, i);
        cr_assert_geq(gap_ms, 280, "attempt %zu came %lld ms after the one before", i + 1,
                      (long long)gap_ms);
        cr_assert_leq(gap_ms, 3000, "attempt %zu came %lld ms after", i + 1, (long long)gap_ms);
    }
    cr_assert_eq(db_int("SELECT count(*) FROM attempts WHERE delivery = ?1", id), 3);
    cr_assert_eq(db_int("SELECT count(*) FROM attempts WHERE delivery = ?1 AND status = 503", id),
                 2);
    cr_assert_eq(db_int("SELECT attempts FROM deliveries WHERE id = ?1", id), 3);
    cr_assert_eq(
        fx_metric("retryproxy_delivery_attempts_total{route=\"r\",outcome=\"rescheduled\"}"), 2);
}

/* ---- dead letters ---- */

Test(durable, dead_after_max_attempts_with_every_attempt_and_the_final_head)
{
    start("", ", \"max_attempts\": 3", "", "");
    const char *plan[] = { "X-Test-Plan: fail=100; status=503; header=X-Why:down", NULL };
    char id[33];
    post_accepted("dlv-dead", "x", plan, id);
    wait_dead(id, "attempts");
    cr_assert_eq(tup_count_id(up, "dlv-dead"), 3);
    cr_assert_eq(db_int("SELECT count(*) FROM attempts WHERE delivery = ?1 AND status = 503", id),
                 3);
    cr_assert_eq(db_int("SELECT min(duration_ms) >= 0 AND min(at) > 0 FROM attempts WHERE "
                        "delivery = ?1",
                        id),
                 1);
    cr_assert_eq(fx_metric("retryproxy_delivery_attempts_total{route=\"r\",outcome=\"dead\"}"), 1);
    char *head = db_text("SELECT final_head FROM deliveries WHERE id = ?1", id);
    cr_assert_not_null(strstr(head, "503"), "final head: %s", head);
    cr_assert_not_null(strstr(head, "X-Why: down"), "final head: %s", head);
    free(head);
}

Test(durable, dead_at_once_on_a_final_4xx)
{
    start("", "", "", "");
    const char *plan[] = { "X-Test-Plan: fail=100; status=400", NULL };
    char id[33];
    post_accepted("dlv-400", "x", plan, id);
    wait_dead(id, "final");
    cr_assert_eq(tup_count_id(up, "dlv-400"), 1, "a final answer is not retried");
    char *body = db_text("SELECT final_body FROM deliveries WHERE id = ?1", id);
    cr_assert_gt(strlen(body), 0, "the final body's first bytes are kept");
    free(body);
}

Test(durable, dead_when_its_age_runs_out)
{
    start("", ", \"max_attempts\": 50", ", \"max_age_ms\": 700", "");
    const char *plan[] = { "X-Test-Plan: fail=100", NULL };
    char id[33];
    post_accepted("dlv-age", "x", plan, id);
    wait_dead(id, "age");
    size_t n = tup_count_id(up, "dlv-age");
    cr_assert(n >= 2 && n <= 3, "%zu attempts in 700 ms at 300 ms apart", n);
}

/* dead_letter false on a durable route: a delivery whose attempts are spent is deleted, not
 * kept, and never silently: a warn line names it and why, and a counter counts it. */
Test(durable, dead_letter_false_deletes_a_spent_delivery_with_a_log_line_and_a_count)
{
    start("", ", \"max_attempts\": 2", ", \"dead_letter\": false", "");
    const char *plan[] = { "X-Test-Plan: fail=100", NULL };
    char id[33];
    post_accepted("discard-1", "x", plan, id);
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
         db_int("SELECT count(*) FROM deliveries", NULL) != 0 && now_ms() < until;)
        sleep_ms(20);
    cr_assert_eq(db_int("SELECT count(*) FROM deliveries", NULL), 0, "nothing is kept");
    cr_assert_eq(db_int("SELECT count(*) FROM attempts", NULL), 0, "nor its attempts");
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
    cfgb_top(b, "\"store\": {\"path\": \"%s\"}", store_path);
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
    http_do("POST", fx_url("/a"), h, "x", 1, T, &r);
    accepted(&r, a_id);
    http_free(&r);
    http_do("POST", fx_url("/b"), NULL, "x", 1, T, &r);
    accepted(&r, b_id);
    http_free(&r);
    wait_state(a_id, 3, 10000);
    wait_state(b_id, 3, 10000);

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
    start("", "", ", \"max_body_bytes\": 16", "");
    struct http_resp r;
    post("big-cl", "0123456789abcdefXYZ", NULL, &r);
    cr_assert_eq(r.status, 413);
    http_free(&r);
    /* a chunked body is refused once it grows past the bound */
    const char *chunked[] = { "Transfer-Encoding: chunked", NULL };
    post("big-chunked", "0123456789abcdefXYZ", chunked, &r);
    cr_assert_eq(r.status, 413);
    http_free(&r);
    post("small", "0123456789", NULL, &r);
    cr_assert_eq(r.status, 202);
    http_free(&r);
    cr_assert_eq(db_int("SELECT count(*) FROM deliveries", NULL), 1);
    cr_assert_eq(fx_metric("retryproxy_delivery_accepts_total{route=\"r\",result=\"too_large\"}"),
                 2);
}

Test(durable, same_idempotency_key_same_id_other_body_422)
{
    start("", "", "", "");
    struct http_resp r;
    const char *key[] = { "Idempotency-Key: k-1", NULL };
    post("idem-a", "same body", key, &r);
    char id1[33], id2[33];
    accepted(&r, id1);
    http_free(&r);
    post("idem-b", "same body", key, &r);
    accepted(&r, id2);
    http_free(&r);
    cr_assert_str_eq(id1, id2, "the same key and body: the same delivery");
    post("idem-c", "another body", key, &r);
    cr_assert_eq(r.status, 422);
    cr_assert_null(http_hdr(&r, "X-Delivery-Id"));
    http_free(&r);
    wait_state(id1, 2, 5000);
    cr_assert_eq(db_int("SELECT count(*) FROM deliveries", NULL), 1);
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
    start(", \"max_count\": 1", "", "", route);
    struct http_resp r;
    post("full-1", "x", NULL, &r);
    cr_assert_eq(r.status, 202);
    http_free(&r);
    post("full-2", "x", NULL, &r);
    cr_assert_eq(r.status, 503, "status %ld", r.status);
    cr_assert_not_null(http_hdr(&r, "Retry-After"));
    cr_assert_gt(atoi(http_hdr(&r, "Retry-After")), 0);
    cr_assert_not_null(memmem(r.body, r.body_len, "store_full", 10));
    http_free(&r);
    cr_assert_eq(fx_metric("retryproxy_delivery_accepts_total{route=\"r\",result=\"full\"}"), 1);
    cr_assert_eq(db_int("SELECT count(*) FROM deliveries", NULL), 1);
}

/* ---- the process's own file ---- */

Test(durable, a_second_proxy_on_the_same_store_exits_naming_it)
{
    start("", "", "", "");
    char *json = durable_cfg("", "", "", "");
    char cfg[256];
    snprintf(cfg, sizeof(cfg), "%s.second.json", store_path);
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

/* An attempt in flight when the process is killed: at the next start it is made again at once
 * (the lease's 30 s and more are not waited out), the lost one recorded. */
Test(durable, killed_during_an_attempt_then_resumed_at_start)
{
    char *json = durable_cfg("", "", "", ", \"timeout_ms\": 60000");
    fx_start(json, "--workers", "2", NULL);
    const char *plan[] = { "X-Test-Plan: fail=1; action=hang", NULL };
    char id[33];
    post_accepted("crash-1", "x", plan, id);
    fx_wait_upstream("crash-1", 1); /* the first attempt hangs */
    kill(px->pid, SIGKILL);
    px_stop(px, 5000);
    px = NULL;
    cr_assert_eq(state_of(id), 1, "in flight when killed");
    fx_start(json, "--workers", "2", NULL);
    free(json);
    wait_state(id, 2, 10000);
    cr_assert_eq(tup_count_id(up, "crash-1"), 2);
    cr_assert_eq(db_int("SELECT count(*) FROM attempts WHERE delivery = ?1 AND "
                        "outcome = 'lease_expired'",
                        id),
                 1);
}

/* The upstream down at the accept and when the proxy is killed; up when it starts again. */
Test(durable, accepted_while_the_upstream_is_down_delivered_after_a_restart)
{
    uint16_t port = fx_free_port();
    char route[96];
    snprintf(route, sizeof(route), ", \"upstreams\": [\"http://127.0.0.1:%u\"]", (unsigned)port);
    char *json = durable_cfg("", "", "", route);
    fx_start(json, "--workers", "2", NULL);
    char id[33];
    post_accepted("down-1", "payload", NULL, id);
    usleep(500 * 1000); /* an attempt or two refused */
    kill(px->pid, SIGKILL);
    px_stop(px, 5000);
    px = NULL;
    struct tup *later = tup_start_port(port);
    fx_start(json, "--workers", "2", NULL);
    free(json);
    wait_state(id, 2, 10000);
    cr_assert_eq(tup_count_id(later, "down-1"), 1);
    cr_assert_str_eq(tup_req_header(tup_get(later, 0), "webhook-id"), id);
    tup_stop(later);
}

/* A store on tmpfs is lost at every reboot: `check` and the start say so. */
Test(durable, a_store_on_tmpfs_is_warned_of_by_check_and_at_start)
{
    char shm[64];
    snprintf(shm, sizeof(shm), "/dev/shm/retryproxy-durable-XXXXXX");
    cr_assert_not_null(mkdtemp(shm));
    snprintf(store_path, sizeof(store_path), "%s/store.db", shm);
    char *json = durable_cfg("", "", "", "");
    char cfg[192], cmd[600];
    snprintf(cfg, sizeof(cfg), "%s/config.json", shm);
    FILE *f = fopen(cfg, "w");
    cr_assert_not_null(f);
    fputs(json, f);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "%s check -c %s 2>%s/err >/dev/null && grep -q 'is on tmpfs' %s/err",
             getenv("RETRYPROXY_BIN"), cfg, shm, shm);
    cr_expect_eq(fx_sh(cmd), 0, "check warns of tmpfs");
    fx_start(json, "--workers", "1", NULL);
    free(json);
    json_t *line =
        fx_logged("delivery store on tmpfs: lost at reboot, or with its pod", "path", store_path);
    cr_expect_not_null(line, "the start warns of tmpfs");
    json_decref(line);
    px_stop(px, 10000);
    px = NULL;
    snprintf(cmd, sizeof(cmd), "rm -rf %s", shm);
    fx_sh(cmd);
    /* and a store on a disk is not warned of */
    snprintf(store_path, sizeof(store_path), "%s", disk_store); /* fx_stop removes its dir */
    json = durable_cfg("", "", "", "");
    snprintf(cfg, sizeof(cfg), "%s.json", store_path);
    f = fopen(cfg, "w");
    fputs(json, f);
    fclose(f);
    free(json);
    snprintf(cmd, sizeof(cmd), "%s check -c %s 2>&1 | grep -q tmpfs", getenv("RETRYPROXY_BIN"),
             cfg);
    cr_expect_neq(fx_sh(cmd), 0, "no warning for a disk");
}

/* ---- the crash test (issue 39, "How it is checked") ---- */

#define CRASHES   25    /* SIGKILLs, each followed by a start on the same file */
#define CRASH_MAX 20000 /* requests the sender may send at most */

/* The sender: durable requests one after another to whichever proxy runs now, each with an
 * X-Request-Id of its own; those answered 202 are the ones that must arrive. */
static struct {
    pthread_mutex_t mu;
    uint16_t port; /* 0 while the proxy is down */
    atomic_bool stop;
    size_t n, acked;
    char acked_ids[CRASH_MAX][16];
    char delivery[CRASH_MAX][33];
} snd = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void *sender(void *arg)
{
    (void)arg;
    while (!atomic_load(&snd.stop) && snd.n < CRASH_MAX) {
        pthread_mutex_lock(&snd.mu);
        uint16_t port = snd.port;
        pthread_mutex_unlock(&snd.mu);
        if (!port) {
            usleep(5000);
            continue;
        }
        char url[64], idh[48], rid[16];
        snprintf(url, sizeof(url), "http://127.0.0.1:%u/hook", (unsigned)port);
        snprintf(rid, sizeof(rid), "c-%zu", snd.n++);
        snprintf(idh, sizeof(idh), "X-Request-Id: %s", rid);
        const char *h[] = { idh, NULL };
        struct http_resp r;
        http_do("POST", url, h, rid, strlen(rid), 5000, &r);
        const char *dh = r.rc == 0 && r.status == 202 ? http_hdr(&r, "X-Delivery-Id") : NULL;
        if (dh) {
            snprintf(snd.acked_ids[snd.acked], sizeof(snd.acked_ids[0]), "%s", rid);
            snprintf(snd.delivery[snd.acked], sizeof(snd.delivery[0]), "%s", dh);
            snd.acked++;
        } else if (r.rc != 0) {
            usleep(2000); /* the proxy is going or coming */
        }
        http_free(&r);
    }
    return NULL;
}

static bool all_delivered(void *arg)
{
    (void)arg;
    return db_int("SELECT count(*) FROM deliveries WHERE state <> 2", NULL) == 0;
}

/* Requests keep coming while the proxy is killed at random moments and started again: every
 * one that got a 202 reaches the upstream at least once, and none more often than once plus
 * the crashes that came during its attempts (each recorded as a lease_expired attempt). The
 * upstream answers at once: with two workers and a request every few ms, a few attempts are in
 * flight at most kills (4 to 10 of 25 in runs here). */
Test(durable, crash_test_every_202_arrives_and_duplicates_are_bounded, .timeout = 180)
{
    fx_init_curl();
    char *json = durable_cfg("", "", ", \"max_per_second\": 100000, \"max_in_flight\": 256", "");
    unsigned seed = (unsigned)time(NULL);
    srand(seed);
    cr_log_info("crash test seed %u", seed);
    pthread_t th;
    fx_start(json, "--workers", "2", NULL);
    snd.port = px->port;
    pthread_create(&th, NULL, sender, NULL);
    for (int k = 0; k < CRASHES; k++) {
        usleep((useconds_t)(100 + rand() % 400) * 1000);
        pthread_mutex_lock(&snd.mu);
        snd.port = 0;
        pthread_mutex_unlock(&snd.mu);
        kill(px->pid, SIGKILL);
        px_stop(px, 5000);
        px = NULL;
        fx_start(json, "--workers", "2", NULL);
        pthread_mutex_lock(&snd.mu);
        snd.port = px->port;
        pthread_mutex_unlock(&snd.mu);
    }
    atomic_store(&snd.stop, true);
    pthread_join(th, NULL);
    free(json);
    cr_assert_gt(snd.acked, CRASHES, "only %zu accepts in the run", snd.acked);
    cr_assert(fx_wait(all_delivered, NULL, 60000, 100), "%lld deliveries still pending",
              db_int("SELECT count(*) FROM deliveries WHERE state <> 2", NULL));
    size_t dups = 0, lost_attempts = 0;
    for (size_t i = 0; i < snd.acked; i++) {
        size_t got = tup_count_id(up, snd.acked_ids[i]);
        long long crashed = db_int("SELECT count(*) FROM attempts WHERE delivery = ?1 AND "
                                   "outcome = 'lease_expired'",
                                   snd.delivery[i]);
        cr_assert_geq(got, 1, "%s (delivery %s) was accepted and never arrived", snd.acked_ids[i],
                      snd.delivery[i]);
        cr_assert_leq((long long)got, 1 + crashed,
                      "%s arrived %zu times with %lld crashes during its attempts",
                      snd.acked_ids[i], got, crashed);
        dups += got - 1;
        lost_attempts += (size_t)crashed;
    }
    cr_log_info("crash test: %zu sent, %zu accepted, %d crashes, %zu attempts cut by a crash, "
                "%zu duplicates at the upstream",
                snd.n, snd.acked, CRASHES, lost_attempts, dups);
}

/* ---- reloads ---- */

/* The proxy on fx_cfg_path (beside the store), so that a test can rewrite it. */
static void start_on_file(const char *json)
{
    cfg_write_renamed(fx_cfg_path, json);
    const char *args[] = { "-c",          fx_cfg_path, "--listen", "127.0.0.1:0", "--admin",
                           "127.0.0.1:0", "--workers", "2",        NULL };
    fx_start_argv(args);
}

static bool generation_2(void *arg)
{
    (void)arg;
    json_t *c = fx_admin_get_json("/config");
    json_t *g = json_object_get(c, "generation");
    bool ok = json_is_integer(g) && json_integer_value(g) >= 2;
    json_decref(c);
    return ok;
}

/* A reload that raises the route's backoff applies to the next delay of a delivery already
 * pending: its policy is read from the current snapshot at each attempt's end. */
Test(durable, a_reload_raising_the_backoff_changes_the_next_delay_of_a_pending_delivery)
{
    char *before = durable_cfg("", ", \"max_attempts\": 20", "", "");
    start_on_file(before);
    free(before);
    const char *plan[] = { "X-Test-Plan: fail=100", NULL };
    char id[33];
    post_accepted("reload-1", "x", plan, id);
    cr_assert_eq(tup_wait_count(up, 2, 10000), 0, "two attempts 300 ms apart");
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"}", store_path);
    cfgb_route(b, "r",
               "\"delivery\": {\"mode\": \"durable\"}, \"retry\": {\"max_attempts\": 20, "
               "\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 2000, \"cap_ms\": 2000, "
               "\"jitter\": \"none\"}}");
    char *after = cfgb_text(b);
    cfg_write_renamed(fx_cfg_path, after);
    free(after);
    cr_assert(fx_wait(generation_2, NULL, 10000, 50), "the reload was not seen");
    /* the attempt after the reload was waited for by the old policy at most; the one after it
     * by the new */
    size_t seen = tup_count(up);
    cr_assert_eq(tup_wait_count(up, seen + 2, 15000), 0, "no attempts after the reload");
    int64_t g = between_ms(seen, seen + 1);
    cr_assert_geq(g, 1900, "the delay after the reload was %lld ms, not 2000", (long long)g);
    for (size_t i = 1; i + 1 < seen; i++)
        cr_assert_lt(between_ms(i - 1, i), 1900, "a delay before the reload was already long");
}

/* The delay a reschedule decided for delivery 'id' after its attempt 'n' (the row is scheduled
 * again and has made n attempts): next_at less the end of its last attempt, as the store has
 * them (a few ms more than the delay: the attempt's end is taken before the decision); -1 when
 * the row is not so now. */
static long long delay_after(const char *id, long long n)
{
    sqlite3 *db = db_open();
    sqlite3_stmt *st = NULL;
    const char *sql = "SELECT d.next_at - (SELECT at + duration_ms FROM attempts WHERE delivery ="
                      " d.id ORDER BY rowid DESC LIMIT 1) FROM deliveries d WHERE id = ?1 AND"
                      " state = 0 AND attempts = ?2";
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, n);
    long long v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* decorrelated backoff goes on from the delay before across reschedules (the store keeps it):
 * after the first (base_ms), each is drawn from [base_ms, 3 * the one before). Were the previous
 * delay forgotten, every one would be base_ms again; with it, three in a row within 30 ms of
 * base_ms come once in about 30,000 runs. */
Test(durable, decorrelated_backoff_goes_on_from_the_previous_delay_across_reschedules)
{
    start_route("\"delivery\": {\"mode\": \"durable\"}, \"retry\": {\"max_attempts\": 5, "
                "\"backoff\": {\"policy\": \"decorrelated\", \"base_ms\": 300, \"cap_ms\": 1500, "
                "\"jitter\": \"none\"}}");
    const char *plan[] = { "X-Test-Plan: fail=100", NULL };
    char id[33];
    post_accepted("decor-1", "x", plan, id);
    long long delays[5] = { -1, -1, -1, -1, -1 };
    /* each delay is read while the row waits for its next attempt (300 ms at least); bounded */
    for (int i = 0; i < 600 && state_of(id) != 3; i++) {
        for (long long n = 1; n < 5; n++)
            if (delays[n] < 0)
                delays[n] = delay_after(id, n);
        usleep(20 * 1000);
    }
    wait_dead(id, "attempts");
    int seen = 0, off_base = 0;
    for (int n = 1; n < 5; n++) {
        cr_log_info("decorrelated: delay after attempt %d: %lld ms", n, delays[n]);
        if (delays[n] < 0)
            continue;
        cr_assert_geq(delays[n], 290, "delay after attempt %d: %lld ms", n, delays[n]);
        cr_assert_leq(delays[n], 1600, "delay after attempt %d: %lld ms", n, delays[n]);
        if (n >= 2) {
            seen++;
            off_base += delays[n] > 330;
        }
    }
    cr_assert_geq(seen, 2, "too few delays seen");
    cr_assert_gt(off_base, 0, "every delay after the first was base_ms: the previous was lost");
}

/* A route a reload removes keeps its pending deliveries: they are delivered under the last
 * snapshot that had it. */
Test(durable, a_route_removed_by_a_reload_keeps_delivering_what_is_pending)
{
    char *before = durable_cfg("", ", \"max_attempts\": 10", "", "");
    start_on_file(before);
    free(before);
    const char *plan[] = { "X-Test-Plan: fail=3", NULL };
    char id[33];
    post_accepted("removed-1", "x", plan, id);
    cr_assert_eq(tup_wait_count(up, 1, 10000), 0);
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"}", store_path);
    cfgb_route(b, "other", "\"match\": {\"path_prefix\": \"/other\"}");
    char *after = cfgb_text(b);
    cfg_write_renamed(fx_cfg_path, after);
    free(after);
    cr_assert(fx_wait(generation_2, NULL, 10000, 50), "the reload was not seen");
    wait_state(id, 2, 15000);
    cr_assert_eq(tup_count_id(up, "removed-1"), 4, "three failures, then delivered");
}

/* A delivery whose route is in no config any more (a restart on a config without it) is a dead
 * letter, "route_gone", at once: nothing could deliver it. */
Test(durable, a_delivery_of_a_route_gone_after_a_restart_is_dead)
{
    char route[96];
    snprintf(route, sizeof(route), ", \"upstreams\": [\"http://127.0.0.1:%u\"]",
             (unsigned)fx_closed_port());
    start("", "", "", route);
    char id[33];
    post_accepted("gone-1", "x", NULL, id);
    px_stop(px, 10000);
    px = NULL;
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"}", store_path);
    cfgb_route(b, "other", "\"delivery\": {\"mode\": \"durable\"}");
    char *json = cfgb_text(b);
    fx_start(json, "--workers", "2", NULL);
    free(json);
    wait_dead(id, "route_gone");
}

/* ---- bounds on the way out ---- */

/* A backlog due at once reaches the upstream paced: max_per_second attempts a second (a
 * second's worth at once), and never more than max_in_flight of them running. */
Test(durable, a_backlog_is_paced_by_max_per_second)
{
    start("", "", ", \"max_per_second\": 5", "");
    post_many("pace", 15);
    cr_assert_eq(tup_wait_count(up, 15, 20000), 0, "not all delivered");
    int64_t span = between_ms(0, 14);
    /* 5 at once, then 5 a second: the 15th about 2 s after the first */
    cr_assert_geq(span, 1500, "15 deliveries in %lld ms at 5 a second", (long long)span);
    cr_log_info("15 deliveries at max_per_second 5: %lld ms from the first to the last",
                (long long)span);
}

Test(durable, no_more_than_max_in_flight_attempts_run_at_once)
{
    start("", "", ", \"max_in_flight\": 2", "");
    tup_set_default_plan(up, "delay=600");
    post_many("infl", 4);
    cr_assert_eq(tup_wait_count(up, 4, 20000), 0, "not all delivered");
    /* the third starts once one of the first two has ended */
    int64_t gap = between_ms(0, 2);
    cr_assert_geq(gap, 550, "the third attempt came %lld ms after the first", (long long)gap);
}

/* Upstream 't' never had more than 2 requests at once: each is held 'hold_ms' from its arrival,
 * so a third within that after the first of two would make 3. Returns the closest such gap. */
static int64_t at_most_two_at_once(struct tup *t, int64_t hold_ms)
{
    int64_t closest = INT64_MAX;
    for (size_t i = 0; i + 2 < tup_count(t); i++) {
        int64_t g = (tup_get(t, i + 2)->arrival_ns - tup_get(t, i)->arrival_ns) / 1000000;
        cr_assert_geq(g, hold_ms * 9 / 10, "requests %zu and %zu came %lld ms apart (held %lld)",
                      i + 1, i + 3, (long long)g, (long long)hold_ms);
        closest = g < closest ? g : closest;
    }
    return closest;
}

/* max_in_flight_per_upstream holds for each upstream on its own: a backlog over two upstreams
 * (round robin), one holding every request 1 s and one 300 ms, never has more than 2 attempts at
 * either at once (max_in_flight is 8), while the quicker one takes most of the backlog; a
 * delivery put back for a busy upstream records no attempt. */
Test(durable, no_more_than_max_in_flight_per_upstream_attempts_run_at_one_upstream)
{
    fx_upstreams(2);
    struct tup *slow = fx_up(1);
    tup_set_default_plan(up, "delay=300");
    tup_set_default_plan(slow, "delay=1000");
    char members[512];
    snprintf(members, sizeof(members),
             "\"upstreams\": [\"%s\", \"%s\"], \"balance\": \"round_robin\", \"delivery\": "
             "{\"mode\": \"durable\", \"max_in_flight\": 8, \"max_in_flight_per_upstream\": 2}",
             fx_up_url(0), fx_up_url(1));
    start_route(members);
    post_many("perup", 16);
    for (int i = 0; i < 300 && db_int("SELECT count(*) FROM deliveries WHERE state = 2", NULL) < 16;
         i++)
        usleep(100 * 1000);
    cr_assert_eq(db_int("SELECT count(*) FROM deliveries WHERE state = 2", NULL), 16,
                 "not all delivered");
    size_t n_slow = tup_count(slow), n_fast = tup_count(up);
    cr_assert_eq(n_slow + n_fast, 16, "each delivery reached one upstream once: %zu + %zu", n_slow,
                 n_fast);
    cr_assert_geq(n_slow, 3, "the slow one had a backlog to bound (%zu)", n_slow);
    int64_t slow_gap = at_most_two_at_once(slow, 1000), fast_gap = at_most_two_at_once(up, 300);
    cr_assert_gt(n_fast, n_slow, "the quicker upstream took more: %zu, %zu", n_fast, n_slow);
    cr_assert_eq(db_int("SELECT count(*) FROM attempts", NULL), 16, "one attempt each");
    cr_assert_eq(db_int("SELECT max(attempts) FROM deliveries", NULL), 1);
    cr_log_info("per-upstream bound 2: %zu deliveries to the 1 s upstream (closest third %lld ms "
                "after the first), %zu to the 300 ms one (%lld ms)",
                n_slow, (long long)slow_gap, n_fast, (long long)fast_gap);
}

/* ---- retry budgets ---- */

/* Route "r" durable with a fixed 300 ms backoff, 20 attempts, 'delivery' members more and the
 * route's budget 'budget' (JSON), on fx_cfg_path so that a reload may change it. */
static void start_budget(const char *delivery, const char *budget)
{
    char route[256];
    snprintf(route, sizeof(route), ", \"budget\": %s", budget);
    char *json = durable_cfg("", ", \"max_attempts\": 20", delivery, route);
    start_on_file(json);
    free(json);
}

/* A delivery's first attempt is a request for the budgets and each later one a retry, as the
 * sync path counts them: a route budget of retry_ratio 0.2 and no retries a second allows 2
 * retries for 10 first attempts. The others are refused: no attempt, no attempt row, the
 * delivery scheduled again (not dead), counted in retries_denied_total{reason="budget"} and
 * logged (once a second at most). A reload that makes the budget roomy lets them go. */
Test(durable, a_retry_budget_holds_re_attempts_back_without_killing_the_deliveries)
{
    start_budget("", "{\"retry_ratio\": 0.2, \"min_retries_per_second\": 0, "
                     "\"window_ms\": 600000}");
    const char *plan[] = { "X-Test-Plan: fail=100; status=503", NULL };
    char id[33];
    for (int i = 0; i < 10; i++) {
        char rid[32];
        snprintf(rid, sizeof(rid), "budget-%d", i);
        post_accepted(rid, "x", plan, id);
    }
    cr_assert_eq(tup_wait_count(up, 12, 10000), 0, "10 first attempts and the 2 retries allowed");
    /* many backoff periods (300 ms): without the budget each would have been tried again */
    sleep_ms(2000);
    size_t held = tup_count(up);
    cr_assert_eq(held, 12, "%zu attempts: the budget allows 10 + 0.2 * 10", held);
    cr_assert_eq(db_int("SELECT count(*) FROM attempts", NULL), 12, "a refusal is no attempt");
    cr_assert_eq(db_int("SELECT sum(attempts) FROM deliveries", NULL), 12);
    cr_assert_eq(db_int("SELECT count(*) FROM deliveries WHERE state IN (0, 1)", NULL), 10,
                 "every delivery still pending, none dead");
    double denied = fx_metric("retryproxy_retries_denied_total{route=\"r\",reason=\"budget\"}");
    cr_assert_geq(denied, 8, "refusals counted: %g", denied);
    json_t *line = fx_logged("delivery re-attempts refused by the retry budget", "route", "r");
    cr_assert_not_null(line, "no log line for the refusals");
    cr_expect_str_eq(json_str(line, "reason"), "budget");
    json_decref(line);
    cr_log_info("budget 0.2 of 10: %zu attempts held over 2 s, %g refusals", held, denied);

    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"}", store_path);
    cfgb_route(
        b, "r",
        "\"delivery\": {\"mode\": \"durable\"}, \"retry\": {\"max_attempts\": 20, " CFG_FIXED(
            300) "}, \"budget\": {\"retry_ratio\": 10, "
                 "\"min_retries_per_second\": 100}");
    char *roomy = cfgb_text(b);
    cfg_write_renamed(fx_cfg_path, roomy);
    free(roomy);
    cr_assert(fx_wait(generation_2, NULL, 10000, 50), "the reload was not seen");
    cr_assert_eq(tup_wait_count(up, 22, 10000), 0, "a roomy budget lets each be retried");
}

/* A delivery the budget never lets go again still dies when its age runs out: a dead letter,
 * reason "age", with its one attempt. */
Test(durable, a_delivery_held_by_the_budget_is_dead_when_its_age_runs_out)
{
    start_budget(", \"max_age_ms\": 1500", "{\"retry_ratio\": 0, \"min_retries_per_second\": 0}");
    const char *plan[] = { "X-Test-Plan: fail=100", NULL };
    char id[33];
    post_accepted("budget-age", "x", plan, id);
    wait_dead(id, "age");
    cr_assert_eq(tup_count_id(up, "budget-age"), 1, "no retry: the budget allows none");
    cr_assert_eq(db_int("SELECT attempts FROM deliveries WHERE id = ?1", id), 1);
    cr_assert_geq(fx_metric("retryproxy_retries_denied_total{route=\"r\",reason=\"budget\"}"), 1);
}

/* ---- dead letters of synchronous routes ---- */

/* The proxy with sync route "r" keeping dead letters (2 attempts, POST retried) and 'store'
 * members besides the store's path; with 'plain', route "plain" (at /plain, keeping none)
 * first. */
static void start_sync_dead(const char *store, bool plain)
{
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"%s}", store_path, store);
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
    post("sync-dead", "the payment", plan, &r);
    cr_assert_eq(r.status, 503, "the caller gets the last answer, unchanged");
    cr_assert_str_eq(http_hdr(&r, "X-Retry-Stop"), "max-attempts");
    cr_assert_null(http_hdr(&r, "X-Delivery-Id"));
    http_free(&r);
    const char *ok[] = { "X-Test-Plan: fail=0", NULL };
    post("sync-ok", "fine", ok, &r);
    cr_assert_eq(r.status, 200);
    http_free(&r);
    const char *h[] = { "X-Request-Id: plain-dead", "X-Test-Plan: fail=100", NULL };
    http_do("POST", fx_url("/plain"), h, "x", 1, T, &r);
    cr_assert_eq(r.status, 503);
    http_free(&r);
    cr_assert_eq(
        fx_wait_metric("retryproxy_dead_letters_total{route=\"r\",reason=\"attempts\"}", 1, 5000),
        1);
    cr_assert_eq(db_int("SELECT count(*) FROM deliveries", NULL), 1, "one dead letter, no more");
    char *id = db_text("SELECT id FROM deliveries WHERE route = ?1", "r");
    cr_assert_eq(state_of(id), 3);
    cr_assert_eq(db_int("SELECT attempts FROM deliveries WHERE id = ?1", id), 2);
    char *reason = db_text("SELECT reason FROM deliveries WHERE id = ?1", id);
    cr_assert_str_eq(reason, "max-attempts");
    free(reason);
    char *body = db_text("SELECT body FROM deliveries WHERE id = ?1", id);
    cr_assert_str_eq(body, "the payment");
    free(body);
    char *head = db_text("SELECT final_head FROM deliveries WHERE id = ?1", id);
    cr_assert_not_null(strstr(head, "HTTP/1.1 503"), "%s", head);
    cr_assert_not_null(strstr(head, "X-Why: down"), "%s", head);
    free(head);
    /* each attempt its own row: its start, duration, status and outcome, in order */
    cr_assert_eq(db_int("SELECT count(*) FROM attempts WHERE delivery = ?1", id), 2);
    cr_assert_eq(db_int("SELECT count(*) FROM attempts WHERE delivery = ?1 AND status = 503 AND "
                        "outcome = '5xx' AND at > 0 AND duration_ms >= 0",
                        id),
                 2);
    cr_assert_eq(db_int("SELECT max(at) - min(at) >= 0 FROM attempts WHERE delivery = ?1", id), 1);
    free(id);
}

/* POSTs 'body' as 'rid' to sync route "r" (dead_letter true), whose upstream answers 503: the
 * caller gets the 503, and the route's first dead letter is kept and counted. Its id, malloc'd. */
static char *post_first_sync_dead(const char *rid, const char *body)
{
    const char *plan[] = { "X-Test-Plan: fail=100; status=503", NULL };
    struct http_resp r;
    post(rid, body, plan, &r);
    cr_assert_eq(r.status, 503);
    http_free(&r);
    cr_assert_eq(
        fx_wait_metric("retryproxy_dead_letters_total{route=\"r\",reason=\"attempts\"}", 1, 5000),
        1);
    return db_text("SELECT id FROM deliveries WHERE route = ?1", "r");
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
    start_route(route);
    char *id = post_first_sync_dead("sync-each", "x");
    cr_assert_eq(db_int("SELECT count(*) FROM attempts WHERE delivery = ?1", id), 3);
    cr_assert_geq(db_int("SELECT count(*) FROM attempts WHERE delivery = ?1 AND status = 0 AND "
                         "outcome = 'connect_failure'",
                         id),
                  1);
    cr_assert_geq(db_int("SELECT count(*) FROM attempts WHERE delivery = ?1 AND status = 503 AND "
                         "outcome = '5xx'",
                         id),
                  1);
    /* each with the upstream it went to, and the row with its last one's */
    char *last = db_text("SELECT upstream FROM attempts WHERE delivery = ?1 ORDER BY rowid DESC "
                         "LIMIT 1",
                         id);
    char *row = db_text("SELECT upstream FROM deliveries WHERE id = ?1", id);
    cr_assert_str_eq(row, last);
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM attempts WHERE delivery = ?1 AND (status = 503) = (upstream = "
             "'%s')",
             fx_up_url(0));
    cr_assert_eq(db_int(sql, id), 3, "the 503s came from %s, the failures to connect not",
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
    char *before = durable_cfg("", ", \"max_attempts\": 10", "", "");
    fx_start(before, "--workers", "2", NULL);
    free(before);
    const char *plan[] = { "X-Test-Plan: fail=3", NULL };
    char id[33];
    post_accepted("to-sync", "x", plan, id);
    cr_assert_eq(tup_wait_count(up, 1, 10000), 0);
    px_stop(px, 10000);
    px = NULL;
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"}", store_path);
    cfgb_route(
        b, "r",
        "\"delivery\": {\"dead_letter\": true}, \"retry\": {\"max_attempts\": 10, " CFG_FIXED(
            300) "}");
    char *after = cfgb_text(b);
    fx_start(after, "--workers", "2", NULL);
    free(after);
    wait_state(id, 2, 15000);
    cr_assert_eq(tup_count_id(up, "to-sync"), 4);
    cr_assert_eq(db_int("SELECT count(*) FROM deliveries", NULL), 1, "kept once");
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
        post(rid, "later", plan, &r);
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
    cr_assert_eq(db_int("SELECT count(*) FROM deliveries", NULL), 1, "nothing more was kept");
    cr_assert_eq(db_int("SELECT count(*) FROM deliveries WHERE id = ?1", kept), 1,
                 "and nothing was evicted");
    cr_assert_eq(fx_metric("retryproxy_dead_letters_total{route=\"r\",reason=\"attempts\"}"), 1);
    free(kept);
}
