/* Upstream health with backoff (routes[].ejection), end to end: an upstream that fails
 * consecutive_failures times in a row leaves the route's rotation for a time the ejection's
 * backoff sets; what each test upstream received shows where the attempts went. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fixture.h"
#include "tests/support/proc.h"

#define T 20000 /* ms: upper bound for any single request in these tests */

TestSuite(ejection, .fini = fx_stop, .timeout = 60);

/* An upstream that answers every attempt 503. */
static void always_503(size_t i)
{
    tup_set_default_plan(fx_up(i), "fail=4000000000;status=503");
}

/* One GET through the proxy with request id 'id'; its status. */
static long get(const char *id)
{
    return fx_get_id(id);
}

/* 'n' GETs with ids PREFIX-0 ...; how many were answered 200. */
static int get_n(const char *prefix, int n)
{
    int ok = 0;
    for (int i = 0; i < n; i++) {
        char id[64];
        snprintf(id, sizeof(id), "%s-%d", prefix, i);
        ok += get(id) == 200;
    }
    return ok;
}

/* A series of the upstream families for route "r" and upstream 'url'. */
static double upstream_metric(const char *family, const char *url)
{
    char series[256];
    snprintf(series, sizeof(series), "retryproxy_%s{route=\"r\",upstream=\"%s\"}", family, url);
    return fx_metric(series);
}

/* Upstream 'url' of route "r" in GET /upstreams (new reference), and that route's entry. */
static json_t *upstream_state(const char *url, json_t **route_out)
{
    json_t *j = fx_admin_get_json("/upstreams");
    json_t *routes = json_object_get(j, "routes"), *route = NULL, *found = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(routes, i, e) if (json_str(e, "route") &&
                                         strcmp(json_str(e, "route"), "r") == 0) route = e;
    cr_assert_not_null(route, "route r is not in /upstreams");
    json_array_foreach(json_object_get(route, "upstreams"), i,
                       e) if (json_str(e, "url") && strcmp(json_str(e, "url"), url) == 0) found = e;
    cr_assert_not_null(found, "%s is not in /upstreams", url);
    if (route_out)
        *route_out = json_incref(route);
    json_incref(found);
    json_decref(j);
    return found;
}

static json_int_t int_of(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    cr_assert(json_is_integer(v), "%s is not an integer", key);
    return json_integer_value(v);
}

static bool bool_of(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    cr_assert(json_is_boolean(v), "%s is not a boolean", key);
    return json_is_true(v);
}

/* Route "r" over upstreams 'bad' then 'good', one attempt per request, one worker (round-robin
 * alternates: the endpoints are not weighed by their failures, weigh_endpoints false, so that
 * ejection alone takes the failing one out), with the ejection members 'ejection'. */
static void start_two(const char *bad, const char *good, const char *ejection)
{
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r",
               "\"upstreams\": [\"%s\", \"%s\"], \"retry\": {\"max_attempts\": 1}, "
               "\"weigh_endpoints\": false, \"ejection\": {%s}",
               bad, good, ejection);
    fx_start_b(b, "--workers", "1", NULL);
}

/* Two 503s in a row eject the upstream for 500 ms: every request in that time goes to the
 * other one; after it the upstream is tried again, and the next two 503s eject it for 1000 ms,
 * the second delay of the exponential policy. */
Test(ejection, failing_upstream_is_ejected_then_back_and_ejected_longer)
{
    fx_upstreams(2);
    struct tup *bad = fx_up(0), *good = fx_up(1);
    always_503(0);
    char bad_url[64];
    snprintf(bad_url, sizeof(bad_url), "%s", fx_up_url(0));
    start_two(bad_url, fx_up_url(1),
              "\"consecutive_failures\": 2, \"backoff\": {\"base_ms\": 500, \"cap_ms\": 5000}");

    /* round-robin: bad, good, bad -- the second 503 in a row ejects it */
    cr_expect_eq(get("a-0"), 503);
    cr_expect_eq(get("a-1"), 200);
    cr_expect_eq(get("a-2"), 503);
    cr_assert_eq(tup_count(bad), 2);
    json_t *route, *s = upstream_state(bad_url, &route);
    cr_expect(bool_of(s, "ejected"));
    cr_expect(int_of(s, "remaining_ms") > 0 && int_of(s, "remaining_ms") <= 500,
              "remaining_ms %lld", (long long)int_of(s, "remaining_ms"));
    cr_expect_not_null(json_str(s, "ejected_until"));
    cr_expect_eq(int_of(s, "ejections"), 1);
    cr_expect_eq(int_of(s, "consecutive_failures"), 0);
    cr_expect(bool_of(route, "ejection"));
    cr_expect_not(bool_of(route, "panic"));
    json_decref(s);
    json_decref(route);
    cr_expect_eq(upstream_metric("upstream_ejected", bad_url), 1);
    cr_expect_eq(upstream_metric("upstream_ejections_total", bad_url), 1);
    cr_expect_eq(upstream_metric("upstream_ejected", fx_up_url(1)), 0);

    /* while it is ejected, every first attempt goes to the good one */
    int64_t ejected_at = now_ms();
    cr_expect_eq(get_n("b", 6), 6);
    cr_expect_eq(tup_count(bad), 2, "an ejected upstream got %zu attempts", tup_count(bad) - 2);
    cr_expect_eq(tup_count(good), 7);

    /* after 500 ms it is in rotation again: of two requests, one goes there */
    int64_t back = ejected_at + 600 - now_ms();
    if (back > 0)
        sleep_ms(back);
    cr_expect_eq(upstream_metric("upstream_ejected", bad_url), 0);
    s = upstream_state(bad_url, NULL);
    cr_expect_not(bool_of(s, "ejected"));
    cr_expect(json_is_null(json_object_get(s, "ejected_until")));
    json_decref(s);
    get_n("c", 2);
    cr_expect_eq(tup_count(bad), 3, "the upstream is tried again after its ejection");
    get_n("d", 2); /* its second 503 since it came back: ejected again, twice as long */
    cr_assert_eq(tup_count(bad), 4);
    s = upstream_state(bad_url, NULL);
    cr_expect(bool_of(s, "ejected"));
    cr_expect(int_of(s, "remaining_ms") > 600 && int_of(s, "remaining_ms") <= 1000,
              "second ejection: remaining_ms %lld, want 1000 or a little less",
              (long long)int_of(s, "remaining_ms"));
    cr_expect_eq(int_of(s, "ejections"), 2);
    cr_expect_eq(int_of(s, "ejections_in_sequence"), 2);
    json_decref(s);
    cr_expect_eq(upstream_metric("upstream_ejections_total", bad_url), 2);

    /* 600 ms later, past the first ejection's length, it is still out */
    sleep_ms(600);
    cr_expect_eq(upstream_metric("upstream_ejected", bad_url), 1);
    cr_expect_eq(get_n("e", 4), 4);
    cr_expect_eq(tup_count(bad), 4, "ejected for the second delay, not the first");

    /* each ejection is an event line at warn, with its length and its number (JSON numbers) */
    char *out = px_stdout(px), want[256];
    snprintf(want, sizeof(want),
             "\"msg\":\"upstream ejected\",\"route\":\"r\",\"upstream\":\"%s\",\"for_ms\":500,"
             "\"ejection\":1",
             bad_url);
    cr_expect(strstr(out, want), "no line with %s in\n%s", want, out);
    snprintf(want, sizeof(want),
             "\"msg\":\"upstream ejected\",\"route\":\"r\",\"upstream\":\"%s\",\"for_ms\":1000,"
             "\"ejection\":2",
             bad_url);
    cr_expect(strstr(out, want), "no line with %s", want);
    free(out);
}

/* A port nothing listens on fails with connect failures: ejected the same way, and its retry
 * (the request is retried once) goes to the other upstream. */
Test(ejection, connect_failures_eject_and_the_good_upstream_takes_every_first_attempt)
{
    fx_upstreams(1);
    char bad_url[64];
    snprintf(bad_url, sizeof(bad_url), "http://127.0.0.1:%u", fx_closed_port());
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r",
               "\"upstreams\": [\"%s\", \"%s\"], \"weigh_endpoints\": false, "
               "\"retry\": {\"max_attempts\": 2, " CFG_FAST "}, "
               "\"ejection\": {\"consecutive_failures\": 2, \"backoff\": {\"base_ms\": 5000}}",
               bad_url, fx_up_url(0));
    fx_start_b(b, "--workers", "1", NULL);

    /* bad (connect failure, retried on up), up, bad (again, retried): ejected */
    cr_expect_eq(get_n("a", 3), 3);
    cr_expect_eq(tup_count(up), 3);
    cr_expect_eq(upstream_metric("upstream_ejections_total", bad_url), 1);
    /* from now on each request is one attempt, to up */
    cr_expect_eq(get_n("b", 6), 6);
    cr_expect_eq(tup_count(up), 9);
    cr_expect_eq(fx_metric("retryproxy_attempts_total{route=\"r\",outcome=\"connect_failure\"}"), 2,
                 "no attempt went to the ejected upstream");
}

/* With every upstream ejected, all are used again (Envoy's panic mode): requests still reach
 * them, and /upstreams says so. */
Test(ejection, every_upstream_ejected_all_are_used_again)
{
    fx_upstreams(2);
    always_503(0);
    always_503(1);
    start_two(fx_up_url(0), fx_up_url(1),
              "\"consecutive_failures\": 1, \"backoff\": {\"base_ms\": 10000, \"cap_ms\": 10000}");
    cr_expect_eq(get("a-0"), 503); /* ejects upstream 0 */
    cr_expect_eq(get("a-1"), 503); /* ejects upstream 1: every upstream is out */
    cr_expect_eq(upstream_metric("upstream_ejected", fx_up_url(0)), 1);
    cr_expect_eq(upstream_metric("upstream_ejected", fx_up_url(1)), 1);
    json_t *route, *s = upstream_state(fx_up_url(0), &route);
    cr_expect(bool_of(route, "panic"));
    json_decref(s);
    json_decref(route);
    for (int i = 0; i < 4; i++) {
        char id[16];
        snprintf(id, sizeof(id), "p-%d", i);
        cr_expect_eq(get(id), 503, "the upstream's own answer, not an error of the proxy");
    }
    cr_expect_eq(tup_count(fx_up(0)) + tup_count(fx_up(1)), 6);
    cr_expect_eq(tup_count(fx_up(0)), 3, "panic mode keeps the round-robin");
    cr_expect_eq(upstream_metric("upstream_ejections_total", fx_up_url(0)), 1,
                 "failures while ejected do not eject again");
}

/* Without an ejection key nothing is ejected: an upstream that answers every attempt 503 keeps
 * its round-robin share (its weight not lowered either: weigh_endpoints false), the upstream
 * families have no series and /upstreams says off. */
Test(ejection, off_by_default_round_robin_is_unchanged)
{
    fx_upstreams(2);
    always_503(0);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r",
               "\"upstreams\": [\"%s\", \"%s\"], \"weigh_endpoints\": false, "
               "\"retry\": {\"max_attempts\": 1}",
               fx_up_url(0), fx_up_url(1));
    fx_start_b(b, "--workers", "1", NULL);
    cr_expect_eq(get_n("a", 8), 4);
    cr_expect_eq(tup_count(fx_up(0)), 4);
    cr_expect_eq(tup_count(fx_up(1)), 4);
    cr_expect(isnan(upstream_metric("upstream_ejections_total", fx_up_url(0))));
    json_t *route, *s = upstream_state(fx_up_url(0), &route);
    cr_expect_not(bool_of(route, "ejection"));
    cr_expect_not(bool_of(s, "ejected"));
    cr_expect_eq(int_of(s, "consecutive_failures"), 0);
    json_decref(s);
    json_decref(route);
}

/* A success in between resets the count: upstream 0 answers the first attempt of each request
 * id 503 and the second 200, and each id comes twice, so its failures are never two in a row
 * (requests to upstream 1 in between keep round-robin on it and count only for upstream 1). */
Test(ejection, failures_separated_by_a_success_do_not_eject)
{
    fx_upstreams(2);
    start_two(fx_up_url(0), fx_up_url(1), "\"consecutive_failures\": 2");
    char url[256];
    px_url(px, "/", url, sizeof(url));
    for (int i = 0; i < 4; i++) {
        char ih[64];
        snprintf(ih, sizeof(ih), "X-Request-Id: s-%d", i / 2);
        const char *h[] = { ih, "X-Test-Plan: fail=1;status=503", NULL };
        struct http_resp r;
        http_do("GET", url, h, NULL, 0, T, &r);
        cr_expect_eq(r.status, i % 2 ? 200 : 503, "request %d", i);
        http_free(&r);
        cr_expect_eq(get(i % 2 ? "o-1" : "o-0"), 200);
    }
    cr_expect_eq(tup_count(fx_up(0)), 4);
    cr_expect_eq(tup_count(fx_up(1)), 4);
    cr_expect_eq(upstream_metric("upstream_ejections_total", fx_up_url(0)), 0);
    cr_expect_eq(upstream_metric("upstream_ejected", fx_up_url(0)), 0);
}

/* The health belongs to the route's name and the upstream's URL: a reload that keeps both
 * keeps the ejection. */
Test(ejection, a_reload_keeps_an_ejection)
{
    fx_upstreams(2);
    always_503(0);
    fx_config_dir("ejection-reload");
    char cfg[1024];
/* The config with 'timeout_ms' (what the reload changes) and the two upstreams. */
#define RELOAD_CFG                                                                                 \
    "{\"routes\": [{\"name\": \"r\", \"timeout_ms\": %d, "                                         \
    "\"upstreams\": [\"%s\", \"%s\"], \"retry\": {\"max_attempts\": 1}, "                          \
    "\"ejection\": {\"consecutive_failures\": 1, "                                                 \
    "\"backoff\": {\"base_ms\": 10000, \"cap_ms\": 10000}}}]}"
    char u0[64];
    snprintf(u0, sizeof(u0), "%s", fx_up_url(0));
    snprintf(cfg, sizeof(cfg), RELOAD_CFG, 15000, u0, fx_up_url(1));
    cfg_write_renamed(fx_cfg_path, cfg);
    const char *args[] = { "-c",          fx_cfg_path, "--listen", "127.0.0.1:0", "--admin",
                           "127.0.0.1:0", "--workers", "1",        NULL };
    fx_start_argv(args);
    cr_expect_eq(get("a-0"), 503);
    cr_assert_eq(upstream_metric("upstream_ejected", u0), 1);
    snprintf(cfg, sizeof(cfg), RELOAD_CFG, 14000, u0, fx_up_url(1));
    cfg_write_renamed(fx_cfg_path, cfg);
    cr_assert_eq(fx_wait_metric("retryproxy_config_generation", 2, 10000), 2);
    cr_expect_eq(get_n("b", 4), 4);
    cr_expect_eq(tup_count(fx_up(0)), 1, "still ejected after the reload");
    cr_expect_eq(upstream_metric("upstream_ejections_total", u0), 1);
}

/* attempts_total and attempt_duration_seconds carry the upstream (its URL as written), with or
 * without ejection: the failing one is told from the healthy one on /metrics (docs/metrics.md). */
Test(ejection, attempts_are_counted_by_upstream)
{
    fx_upstreams(2);
    always_503(0);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r",
               "\"upstreams\": [\"%s\", \"%s\"], \"weigh_endpoints\": false, "
               "\"retry\": {\"max_attempts\": 1}",
               fx_up_url(0), fx_up_url(1));
    /* one worker: its turn alternates exactly (each worker keeps its own) */
    fx_start_b(b, "--workers", "1", NULL);
    cr_expect_eq(get_n("a", 6), 3);
    char series[256];
    snprintf(series, sizeof(series),
             "retryproxy_attempts_total{route=\"r\",upstream=\"%s\",outcome=\"5xx\"}",
             fx_up_url(0));
    cr_expect_eq(fx_metric(series), 3, "%s", series);
    snprintf(series, sizeof(series),
             "retryproxy_attempts_total{route=\"r\",upstream=\"%s\",outcome=\"2xx\"}",
             fx_up_url(1));
    cr_expect_eq(fx_metric(series), 3, "%s", series);
    snprintf(series, sizeof(series),
             "retryproxy_attempts_total{route=\"r\",upstream=\"%s\",outcome=\"2xx\"}",
             fx_up_url(0));
    cr_expect_eq(fx_metric(series), 0, "%s", series);
    for (size_t i = 0; i < 2; i++)
        cr_expect_eq(upstream_metric("attempt_duration_seconds_count", fx_up_url(i)), 3);
    /* the route's total is still there for a sum by (route) */
    cr_expect_eq(fx_metric("retryproxy_attempts_total{route=\"r\"}"), 6);
}
