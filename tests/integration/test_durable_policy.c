/* Durable routes end to end (docs/delivery.md): the route's policy applied to deliveries. A
 * reload that changes the backoff, decorrelated backoff across reschedules, routes a reload or a
 * restart removes, pacing (max_per_second, max_in_flight, per upstream) and retry budgets. */
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
    char *before = dur_cfg("", ", \"max_attempts\": 20", "", "");
    start_on_file(before);
    free(before);
    const char *plan[] = { "X-Test-Plan: fail=100", NULL };
    char id[33];
    dur_post_accepted("reload-1", "x", plan, id);
    cr_assert_eq(tup_wait_count(up, 2, 10000), 0, "two attempts 300 ms apart");
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"}", dur_store_path);
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
    int64_t g = dur_between_ms(seen, seen + 1);
    cr_assert_geq(g, 1900, "the delay after the reload was %lld ms, not 2000", (long long)g);
    for (size_t i = 1; i + 1 < seen; i++)
        cr_assert_lt(dur_between_ms(i - 1, i), 1900, "a delay before the reload was already long");
}

/* The delay a reschedule decided for delivery 'id' after its attempt 'n' (the row is scheduled
 * again and has made n attempts): next_at less the end of its last attempt, as the store has
 * them (a few ms more than the delay: the attempt's end is taken before the decision); -1 when
 * the row is not so now. */
static long long delay_after(const char *id, long long n)
{
    sqlite3 *db = dur_db_open();
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
    dur_start_route(
        "\"delivery\": {\"mode\": \"durable\"}, \"retry\": {\"max_attempts\": 5, "
        "\"backoff\": {\"policy\": \"decorrelated\", \"base_ms\": 300, \"cap_ms\": 1500, "
        "\"jitter\": \"none\"}}");
    const char *plan[] = { "X-Test-Plan: fail=100", NULL };
    char id[33];
    dur_post_accepted("decor-1", "x", plan, id);
    long long delays[5] = { -1, -1, -1, -1, -1 };
    /* each delay is read while the row waits for its next attempt (300 ms at least); bounded */
    for (int i = 0; i < 600 && dur_state_of(id) != 3; i++) {
        for (long long n = 1; n < 5; n++)
            if (delays[n] < 0)
                delays[n] = delay_after(id, n);
        usleep(20 * 1000);
    }
    dur_wait_dead(id, "attempts");
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
    char *before = dur_cfg("", ", \"max_attempts\": 10", "", "");
    start_on_file(before);
    free(before);
    const char *plan[] = { "X-Test-Plan: fail=3", NULL };
    char id[33];
    dur_post_accepted("removed-1", "x", plan, id);
    cr_assert_eq(tup_wait_count(up, 1, 10000), 0);
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"}", dur_store_path);
    cfgb_route(b, "other", "\"match\": {\"path_prefix\": \"/other\"}");
    char *after = cfgb_text(b);
    cfg_write_renamed(fx_cfg_path, after);
    free(after);
    cr_assert(fx_wait(generation_2, NULL, 10000, 50), "the reload was not seen");
    dur_wait_state(id, 2, 15000);
    cr_assert_eq(tup_count_id(up, "removed-1"), 4, "three failures, then delivered");
}

/* A delivery whose route is in no config any more (a restart on a config without it) is a dead
 * letter, "route_gone", at once: nothing could deliver it. */
Test(durable, a_delivery_of_a_route_gone_after_a_restart_is_dead)
{
    char route[96];
    snprintf(route, sizeof(route), ", \"upstreams\": [\"http://127.0.0.1:%u\"]",
             (unsigned)fx_closed_port());
    dur_start("", "", "", route);
    char id[33];
    dur_post_accepted("gone-1", "x", NULL, id);
    px_stop(px, 10000);
    px = NULL;
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"}", dur_store_path);
    cfgb_route(b, "other", "\"delivery\": {\"mode\": \"durable\"}");
    char *json = cfgb_text(b);
    fx_start(json, "--workers", "2", NULL);
    free(json);
    dur_wait_dead(id, "route_gone");
}

/* ---- bounds on the way out ---- */

/* A backlog due at once reaches the upstream paced: max_per_second attempts a second (a
 * second's worth at once), and never more than max_in_flight of them running. */
Test(durable, a_backlog_is_paced_by_max_per_second)
{
    dur_start("", "", ", \"max_per_second\": 5", "");
    dur_post_many("pace", 15);
    cr_assert_eq(tup_wait_count(up, 15, 20000), 0, "not all delivered");
    int64_t span = dur_between_ms(0, 14);
    /* 5 at once, then 5 a second: the 15th about 2 s after the first */
    cr_assert_geq(span, 1500, "15 deliveries in %lld ms at 5 a second", (long long)span);
    cr_log_info("15 deliveries at max_per_second 5: %lld ms from the first to the last",
                (long long)span);
}

Test(durable, no_more_than_max_in_flight_attempts_run_at_once)
{
    dur_start("", "", ", \"max_in_flight\": 2", "");
    tup_set_default_plan(up, "delay=600");
    dur_post_many("infl", 4);
    cr_assert_eq(tup_wait_count(up, 4, 20000), 0, "not all delivered");
    /* the third starts once one of the first two has ended */
    int64_t gap = dur_between_ms(0, 2);
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
    dur_start_route(members);
    dur_post_many("perup", 16);
    for (int i = 0;
         i < 300 && dur_db_int("SELECT count(*) FROM deliveries WHERE state = 2", NULL) < 16; i++)
        usleep(100 * 1000);
    cr_assert_eq(dur_db_int("SELECT count(*) FROM deliveries WHERE state = 2", NULL), 16,
                 "not all delivered");
    size_t n_slow = tup_count(slow), n_fast = tup_count(up);
    cr_assert_eq(n_slow + n_fast, 16, "each delivery reached one upstream once: %zu + %zu", n_slow,
                 n_fast);
    cr_assert_geq(n_slow, 3, "the slow one had a backlog to bound (%zu)", n_slow);
    int64_t slow_gap = at_most_two_at_once(slow, 1000), fast_gap = at_most_two_at_once(up, 300);
    cr_assert_gt(n_fast, n_slow, "the quicker upstream took more: %zu, %zu", n_fast, n_slow);
    cr_assert_eq(dur_db_int("SELECT count(*) FROM attempts", NULL), 16, "one attempt each");
    cr_assert_eq(dur_db_int("SELECT max(attempts) FROM deliveries", NULL), 1);
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
    char *json = dur_cfg("", ", \"max_attempts\": 20", delivery, route);
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
        dur_post_accepted(rid, "x", plan, id);
    }
    cr_assert_eq(tup_wait_count(up, 12, 10000), 0, "10 first attempts and the 2 retries allowed");
    /* many backoff periods (300 ms): without the budget each would have been tried again */
    sleep_ms(2000);
    size_t held = tup_count(up);
    cr_assert_eq(held, 12, "%zu attempts: the budget allows 10 + 0.2 * 10", held);
    cr_assert_eq(dur_db_int("SELECT count(*) FROM attempts", NULL), 12, "a refusal is no attempt");
    cr_assert_eq(dur_db_int("SELECT sum(attempts) FROM deliveries", NULL), 12);
    cr_assert_eq(dur_db_int("SELECT count(*) FROM deliveries WHERE state IN (0, 1)", NULL), 10,
                 "every delivery still pending, none dead");
    double denied = fx_metric("retryproxy_retries_denied_total{route=\"r\",reason=\"budget\"}");
    cr_assert_geq(denied, 8, "refusals counted: %g", denied);
    json_t *line = fx_logged("delivery re-attempts refused by the retry budget", "route", "r");
    cr_assert_not_null(line, "no log line for the refusals");
    cr_expect_str_eq(json_str(line, "reason"), "budget");
    json_decref(line);
    cr_log_info("budget 0.2 of 10: %zu attempts held over 2 s, %g refusals", held, denied);

    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"}", dur_store_path);
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
    dur_post_accepted("budget-age", "x", plan, id);
    dur_wait_dead(id, "age");
    cr_assert_eq(tup_count_id(up, "budget-age"), 1, "no retry: the budget allows none");
    cr_assert_eq(dur_db_int("SELECT attempts FROM deliveries WHERE id = ?1", id), 1);
    cr_assert_geq(fx_metric("retryproxy_retries_denied_total{route=\"r\",reason=\"budget\"}"), 1);
}

/* ---- dead letters of synchronous routes ---- */
