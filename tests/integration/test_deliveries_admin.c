/* The admin API of the delivery store (docs/delivery.md "Admin API", docs/admin.md), against
 * the real binary and a real SQLite file filled beforehand (tests/support/seed.h): list with
 * filters and paging, show with attempts and the final response, replay and drop by id and by
 * filter (dry run, rate), 409 in flight, 404 without a store, the store's gauges, the log
 * lines, and credentials never shown. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <strings.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fixture.h"
#include "tests/support/seed.h"

TestSuite(deliveries_admin, .fini = fx_stop, .timeout = 120);

static struct seeded sd;

/* A store seeded, and the proxy on it. */
static void start(void)
{
    const char *dir = fx_config_dir("deliveries-admin");
    char db[160];
    snprintf(db, sizeof(db), "%s/deliveries.db", dir);
    fx_upstreams(1);
    char *cfg = seed_config(db, seed_key_file(dir), fx_up_url(0));
    fx_start(cfg, NULL);
    free(cfg);
    /* filled beside the running proxy, as the CLI would: seeded before it started, the
     * delivery left in flight would be the proxy's to resume at start (docs/delivery.md) */
    seed_store(db, &sd);
}

/* method path -> JSON with the status asserted; the text must not hold a credential. */
static json_t *call(const char *method, const char *path, long want)
{
    long status = 0;
    json_t *j = fx_admin_json(method, path, &status);
    char *text = json_dumps(j, 0);
    cr_assert_eq(status, want, "%s %s: %ld %s", method, path, status, text);
    cr_expect_null(strstr(text, "sEcReT"), "%s %s shows a credential: %s", method, path, text);
    cr_expect_null(strstr(text, SEED_API_KEY), "%s %s shows a credential", method, path);
    free(text);
    return j;
}

static size_t count_of(const json_t *page)
{
    return json_array_size(json_object_get(page, "deliveries"));
}

static const char *id_at(const json_t *page, size_t i)
{
    return json_str(json_array_get(json_object_get(page, "deliveries"), i), "id");
}

Test(deliveries_admin, list_filters_by_route_state_status_and_time_and_pages)
{
    start();
    json_t *j = call("GET", "/deliveries", 200);
    cr_expect_eq(count_of(j), 5);
    cr_expect_eq(json_integer_value(json_object_get(j, "total")), 5);
    cr_expect_str_eq(id_at(j, 0), sd.dead_a, "oldest first");
    cr_expect(json_is_null(json_object_get(j, "next_cursor")));
    json_decref(j);

    j = call("GET", "/deliveries?route=hooks&state=dead", 200);
    cr_expect_eq(count_of(j), 2);
    json_decref(j);
    j = call("GET", "/deliveries?status=410", 200);
    cr_assert_eq(count_of(j), 1);
    cr_expect_str_eq(id_at(j, 0), sd.dead_b);
    json_decref(j);
    j = call("GET", "/deliveries?state=in_flight", 200);
    cr_assert_eq(count_of(j), 1);
    cr_expect_str_eq(id_at(j, 0), sd.flying);
    json_decref(j);
    char path[160];
    snprintf(path, sizeof(path), "/deliveries?until=%llu", (unsigned long long)sd.t0);
    j = call("GET", path, 200);
    cr_expect_eq(count_of(j), 0, "nothing accepted before t0");
    json_decref(j);
    j = call("GET", "/deliveries?since=2000-01-01T00:00:00Z", 200);
    cr_expect_eq(count_of(j), 5, "RFC 3339 taken");
    json_decref(j);

    /* newest first, two a page, by the cursor: 5 rows in 3 pages, none twice */
    const char *seen[5] = { 0 };
    size_t n = 0;
    char cursor[32] = "";
    for (int page = 0; page < 4; page++) {
        snprintf(path, sizeof(path), "/deliveries?order=newest&limit=2%s%s",
                 cursor[0] ? "&cursor=" : "", cursor);
        j = call("GET", path, 200);
        for (size_t i = 0; i < count_of(j) && n < 5; i++)
            seen[n++] = strdup(id_at(j, i));
        json_t *next = json_object_get(j, "next_cursor");
        bool more = json_is_integer(next);
        if (more)
            snprintf(cursor, sizeof(cursor), "%lld", (long long)json_integer_value(next));
        json_decref(j);
        if (!more)
            break;
    }
    cr_expect_eq(n, 5);
    cr_expect_str_eq(seen[0], sd.pending, "newest first");
    for (size_t i = 0; i < n; i++)
        for (size_t k = i + 1; k < n; k++)
            cr_expect_str_neq(seen[i], seen[k]);
    for (size_t i = 0; i < n; i++)
        free((char *)seen[i]);

    j = call("GET", "/deliveries?state=sleeping", 400);
    cr_expect_not_null(strstr(json_str(j, "message"), "scheduled, in_flight, delivered or dead"));
    json_decref(j);
    json_decref(call("GET", "/deliveries?limit=1001", 400));
    /* a value of any bytes is quoted escaped: raw, jansson refused the message and the
     * connection was closed without an answer */
    j = call("GET", "/deliveries?state=dead%FF%0A", 400);
    cr_expect_not_null(strstr(json_str(j, "message"), "got 'dead\\xff\\n'"), "%s",
                       json_str(j, "message"));
    json_decref(j);
    json_decref(call("GET", "/deliveries?since=2026-02-31T00:00:00Z", 400));
}

Test(deliveries_admin, show_has_attempts_and_the_final_response_with_credentials_redacted)
{
    start();
    char path[96];
    snprintf(path, sizeof(path), "/deliveries/%s", sd.dead_a);
    json_t *j = call("GET", path, 200);
    cr_expect_str_eq(json_str(j, "state"), "dead");
    cr_expect_str_eq(json_str(j, "reason"), "final");
    cr_expect_eq(json_integer_value(json_object_get(j, "last_status")), 503);
    json_t *tries = json_object_get(j, "attempts_made");
    cr_assert_eq(json_array_size(tries), 1);
    cr_expect_eq(json_integer_value(json_object_get(json_array_get(tries, 0), "status")), 503);
    json_t *fields = json_object_get(j, "fields");
    size_t redacted = 0;
    for (size_t i = 0; i < json_array_size(fields); i++) {
        const char *name = json_string_value(json_array_get(json_array_get(fields, i), 0));
        const char *value = json_string_value(json_array_get(json_array_get(fields, i), 1));
        if (strcasecmp(name, "authorization") == 0 || strcasecmp(name, "x-api-key") == 0) {
            cr_expect_str_eq(value, "[redacted]", "%s", name);
            redacted++;
        } else {
            cr_expect_str_eq(value, "application/json");
        }
    }
    cr_expect_eq(redacted, 2);
    cr_expect_str_eq(json_str(json_object_get(j, "body"), "text"), "{\"n\":1}");
    cr_expect_not_null(strstr(json_str(json_object_get(j, "final_head"), "text"), "503 Final"));
    cr_expect_str_eq(json_str(json_object_get(j, "final_body"), "base64"),
                     "/wBhYmM=", "not UTF-8: base64");
    json_decref(j);
    json_decref(call("GET", "/deliveries/0123456789abcdef0123456789abcdef", 404));
    json_decref(call("GET", "/deliveries/not-an-id", 404));
}

Test(deliveries_admin, replay_by_id_keeps_the_id_and_an_in_flight_one_is_409)
{
    start();
    char path[96];
    snprintf(path, sizeof(path), "/deliveries/%s/replay", sd.flying);
    json_decref(call("POST", path, 409));
    snprintf(path, sizeof(path), "/deliveries/%s/replay", sd.dead_b);
    json_t *j = call("POST", path, 200);
    cr_expect_str_eq(json_str(j, "id"), sd.dead_b);
    json_decref(j);
    snprintf(path, sizeof(path), "/deliveries/%s", sd.dead_b);
    j = call("GET", path, 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "replays")), 1);
    cr_expect_str_neq(json_str(j, "state"), "dead");
    json_decref(j);
    json_t *line = fx_logged("delivery replayed", "id", sd.dead_b);
    cr_expect_not_null(line, "a replay is logged");
    json_decref(line);
    json_decref(call("GET", path, 200));
    json_decref(call("PUT", path, 405));
}

Test(deliveries_admin, delete_drops_it_and_logs_it)
{
    start();
    char path[96];
    snprintf(path, sizeof(path), "/deliveries/%s", sd.other);
    json_decref(call("DELETE", path, 200));
    json_decref(call("GET", path, 404));
    json_decref(call("DELETE", path, 404));
    json_t *line = fx_logged("delivery dropped", "id", sd.other);
    cr_expect_not_null(line, "a drop is logged");
    json_decref(line);
}

Test(deliveries_admin, replay_by_filter_counts_in_a_dry_run_and_spaces_due_times_by_the_rate)
{
    start();
    json_t *j = call("POST", "/deliveries/replay?route=hooks&state=dead&dry_run=1", 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "count")), 2);
    json_decref(j);
    j = call("GET", "/deliveries?state=dead", 200);
    cr_expect_eq(count_of(j), 3, "a dry run replays nothing");
    json_decref(j);

    j = call("POST", "/deliveries/replay?route=hooks&state=dead&rate=1", 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "replayed")), 2);
    json_decref(j);
    /* one a second: the second is due a second after the first */
    char path[96];
    snprintf(path, sizeof(path), "/deliveries?route=hooks&state=scheduled");
    j = call("GET", path, 200);
    json_t *a = NULL, *b = NULL;
    for (size_t i = 0; i < count_of(j); i++) {
        json_t *d = json_array_get(json_object_get(j, "deliveries"), i);
        if (strcmp(json_str(d, "id"), sd.dead_a) == 0)
            a = d;
        if (strcmp(json_str(d, "id"), sd.dead_b) == 0)
            b = d;
    }
    if (a && b) { /* both still scheduled (no courier has taken them yet) */
        const char *ta = json_str(a, "next_at"), *tb = json_str(b, "next_at");
        cr_assert(ta && tb);
        int sa = atoi(ta + 17) * 1000 + atoi(ta + 20), sb = atoi(tb + 17) * 1000 + atoi(tb + 20);
        cr_expect_eq((sb - sa + 60000) % 60000, 1000, "%s then %s", ta, tb);
    }
    json_decref(j);
    json_t *line = fx_logged("deliveries replayed by filter", "route", "hooks");
    cr_assert_not_null(line, "the summary line");
    cr_expect_eq(json_integer_value(json_object_get(line, "count")), 2);
    json_decref(line);
    json_decref(call("POST", "/deliveries/replay?rate=1001&state=dead", 400));
}

Test(deliveries_admin, drop_by_filter_needs_a_filter)
{
    start();
    json_t *j = call("POST", "/deliveries/drop", 400);
    cr_expect_not_null(strstr(json_str(j, "message"), "needs a filter"));
    json_decref(j);
    j = call("POST", "/deliveries/drop?route=hooks&state=dead", 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "dropped")), 2);
    json_decref(j);
    j = call("GET", "/deliveries", 200);
    cr_expect_eq(count_of(j), 3);
    json_decref(j);
    json_decref(call("GET", "/deliveries/replay", 405));
}

Test(deliveries_admin, the_store_gauges_show_at_metrics)
{
    start();
    char series[128];
    snprintf(series, sizeof(series), "retryproxy_deliveries{route=\"hooks\",state=\"dead\"}");
    cr_expect_eq(fx_metric(series), 2);
    cr_expect_eq(fx_metric("retryproxy_deliveries{route=\"hooks\",state=\"in_flight\"}"), 1);
    cr_expect_eq(fx_metric("retryproxy_deliveries{route=\"other\",state=\"dead\"}"), 1);
    cr_expect_eq(fx_metric("retryproxy_store_rows"), 5);
    cr_expect_gt(fx_metric("retryproxy_store_bytes"), 0);
    double age = fx_metric("retryproxy_delivery_oldest_seconds{route=\"hooks\"}");
    cr_expect(age >= 0 && age < 600, "the in-flight one's age: %f", age);
    cr_expect_eq(fx_metric("retryproxy_delivery_oldest_seconds{route=\"other\"}"), 0);
    /* a drop shows within a second or two (the gauges are read at most once a second) */
    json_decref(call("POST", "/deliveries/drop?route=other", 200));
    double v = 1;
    for (int i = 0; i < 100 && !isnan(v); i++) {
        v = fx_metric("retryproxy_deliveries{route=\"other\",state=\"dead\"}");
        if (!isnan(v))
            usleep(50000);
    }
    cr_expect(isnan(v), "the route's series go with its last delivery: %f", v);
}

Test(deliveries_admin, without_a_store_every_endpoint_is_404_no_store)
{
    fx_start_r("", "\"retry\": {\"max_attempts\": 1}", NULL);
    json_t *j = call("GET", "/deliveries", 404);
    cr_expect_str_eq(json_str(j, "error"), "no_store");
    json_decref(j);
    json_decref(call("POST", "/deliveries/replay?state=dead", 404));
}
