/* The log (proxy/telemetry/log.c, docs/logs.md): request, attempt and event lines in JSON,
 * exactly; the levels; every request field documented (tests/support/logtest.h). Text lines,
 * escaping and truncation: test_log_text.c; buffering and threads: test_log_threads.c. */
#include "tests/support/logtest.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "proxy/telemetry/log.h"

TestSuite(log, .init = lt_setup, .fini = lt_teardown);

/* ---- JSON lines ---- */

Test(log, request_json_exact)
{
    struct log_request r = sample_request();
    expect_request(&r, "{\"time\":\"" T_STR "\",\"level\":\"info\",\"msg\":\"request\","
                       "\"route\":\"orders\",\"method\":\"GET\",\"path\":\"/orders/1?x=2\","
                       "\"status\":200,\"attempts\":3,\"delays_ms\":[100,200],"
                       "\"duration_ms\":312.5,\"upstream\":\"http://127.0.0.1:9001\","
                       "\"upstream_path\":\"/base/orders/1?x=2\",\"stop\":null,"
                       "\"request_id\":\"abc\",\"client_addr\":\"10.1.2.3\",\"client_port\":50412,"
                       "\"user_agent\":\"curl/8.5.0\",\"bytes_from_client\":12,"
                       "\"bytes_to_client\":3456}\n");
}

Test(log, request_json_null_fields)
{
    struct log_request r = { .unix_ms = T_MS, .status = 404, .attempts = 0, .duration_ms = 0.0 };
    expect_request(&r, "{\"time\":\"" T_STR "\",\"level\":\"info\",\"msg\":\"request\","
                       "\"route\":null,\"method\":null,\"path\":null,\"status\":404,"
                       "\"attempts\":0,\"delays_ms\":[],\"duration_ms\":0.0,\"upstream\":null,"
                       "\"upstream_path\":null,\"stop\":null,\"request_id\":null,"
                       "\"client_addr\":null,\"client_port\":null,\"user_agent\":null,"
                       "\"bytes_from_client\":0,\"bytes_to_client\":0}\n");
}

Test(log, request_json_stop_and_empty_strings)
{
    struct log_request r = sample_request();
    r.stop = "max-attempts";
    r.route = "";
    char *line = request_output(&r);
    cr_expect(strstr(line, "\"route\":\"\",") != NULL, "%s", line);
    cr_expect(strstr(line, "\"stop\":\"max-attempts\",") != NULL, "%s", line);
    free(line);
}

Test(log, request_json_delays)
{
    struct log_request r = sample_request();

    r.delays = NULL;
    r.n_delays = 0;
    expect_request_has(&r, "\"delays_ms\":[],");

    /* A count without an array is read as none rather than dereferenced. */
    r.n_delays = 3;
    expect_request_has(&r, "\"delays_ms\":[],");

    const uint32_t one[] = { 7 };
    r.delays = one;
    r.n_delays = 1;
    expect_request_has(&r, "\"delays_ms\":[7],");

    const uint32_t many[] = { 0, 10, 20, 40, 4294967295u };
    r.delays = many;
    r.n_delays = 5;
    char *line = request_output(&r);
    cr_expect(strstr(line, "\"delays_ms\":[0,10,20,40,4294967295],") != NULL, "%s", line);
    json_t *j = lt_parse(line);
    json_t *arr = json_object_get(j, "delays_ms");
    cr_assert(json_is_array(arr));
    cr_assert_eq(json_array_size(arr), 5);
    for (size_t i = 0; i < 5; i++)
        cr_expect_eq(json_integer_value(json_array_get(arr, i)), (json_int_t)many[i]);
    json_decref(j);
    free(line);
}

Test(log, request_json_time_is_utc_rfc3339_ms)
{
    static const struct {
        int64_t ms;
        const char *want;
    } cases[] = {
        { 0, "1970-01-01T00:00:00.000Z" },
        { 1, "1970-01-01T00:00:00.001Z" },
        { INT64_C(1709251199999), "2024-02-29T23:59:59.999Z" },
        { INT64_C(1709251200000), "2024-03-01T00:00:00.000Z" },
        { T_MS, T_STR },
        { INT64_C(253402300799999), "9999-12-31T23:59:59.999Z" },
        /* Out of range: clamped, so the field keeps its width. */
        { -5, "1970-01-01T00:00:00.000Z" },
        { INT64_MAX, "9999-12-31T23:59:59.999Z" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct log_request r = sample_request();
        r.unix_ms = cases[i].ms;
        char *line = request_output(&r);
        char want[64];
        snprintf(want, sizeof want, "{\"time\":\"%s\",", cases[i].want);
        cr_expect(strncmp(line, want, strlen(want)) == 0, "%lld: %s", (long long)cases[i].ms, line);
        free(line);
    }
}

Test(log, request_json_duration_one_decimal)
{
    static const struct {
        double ms;
        const char *want;
    } cases[] = {
        { 312.5, "312.5" },      { 0.0, "0.0" },
        { 0.04, "0.0" },         { 1.04, "1.0" },
        { 1.06, "1.1" },         { 9.96, "10.0" },
        { 12345.67, "12345.7" }, { -2.5, "-2.5" },
        { -0.01, "0.0" },        { 1e300, "1000000000000000.0" },
        { NAN, "null" },         { INFINITY, "null" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct log_request r = sample_request();
        r.duration_ms = cases[i].ms;
        char *line = request_output(&r);
        char want[64];
        snprintf(want, sizeof want, "\"duration_ms\":%s,", cases[i].want);
        cr_expect(strstr(line, want) != NULL, "want %s in %s", want, line);
        json_decref(lt_parse(line));
        free(line);
    }
}

Test(log, attempt_json_only_at_debug)
{
    struct log_attempt a = sample_attempt();
    struct log_buf *b = log_buf_new();
    cr_assert(b);

    log_attempt(b, &a);
    log_flush(b);
    size_t len;
    free(lt_output(&len));
    cr_expect_eq(len, 0, "attempt logged at level info");

    log_configure(CFG_LOG_DEBUG, CFG_LOG_JSON);
    log_attempt(b, &a);
    log_flush(b);
    char *out = lt_output(NULL);
    cr_expect_str_eq(out, "{\"time\":\"" T_STR "\",\"level\":\"debug\",\"msg\":\"attempt\","
                          "\"route\":\"orders\",\"request_id\":\"abc\",\"attempt\":2,"
                          "\"upstream\":\"http://127.0.0.1:9001\",\"outcome\":\"503\","
                          "\"duration_ms\":1.2,\"decision\":\"retry\",\"delay_ms\":200}\n");
    free(out);
    log_buf_free(b);
}

Test(log, attempt_json_null_fields)
{
    log_configure(CFG_LOG_DEBUG, CFG_LOG_JSON);
    struct log_attempt a = { .unix_ms = T_MS, .attempt = 1, .duration_ms = 0.5 };
    struct log_buf *b = log_buf_new();
    log_attempt(b, &a);
    log_buf_free(b);
    char *out = lt_output(NULL);
    cr_expect_str_eq(out, "{\"time\":\"" T_STR "\",\"level\":\"debug\",\"msg\":\"attempt\","
                          "\"route\":null,\"request_id\":null,\"attempt\":1,\"upstream\":null,"
                          "\"outcome\":null,\"duration_ms\":0.5,\"decision\":null,"
                          "\"delay_ms\":0}\n");
    free(out);
}

Test(log, event_json_with_pairs_written_at_once)
{
    log_event(CFG_LOG_ERROR, "reload failed", "file", "/etc/rp.json", "error", "line 3: \"x\"\n",
              NULL);
    struct lines l = read_lines();
    cr_assert_eq(l.n, 1);
    expect_event_line(l.v[0],
                      "\",\"level\":\"error\",\"msg\":\"reload failed\",\"file\":\"/etc/rp.json\","
                      "\"error\":\"line 3: \\\"x\\\"\\n\"}",
                      true);
    json_t *j = lt_parse(l.v[0]);
    cr_expect_str_eq(json_string_value(json_object_get(j, "error")), "line 3: \"x\"\n");
    json_decref(j);
    free_lines(&l);
}

/* Numbers are JSON numbers, as in the request line: a log pipeline types a field by its JSON
 * type. */
Test(log, event_numbers_are_json_numbers)
{
    log_event(CFG_LOG_WARN, "upstream ejected", "route", "r", LOG_NUM("for_ms", 1500),
              LOG_NUM("ejection", 2u), LOG_NUM("big", INT64_MAX), LOG_NUM("neg", -3), "after", "x",
              NULL);
    struct lines l = read_lines();
    cr_assert_eq(l.n, 1);
    expect_event_line(l.v[0],
                      "\",\"level\":\"warn\",\"msg\":\"upstream ejected\",\"route\":\"r\","
                      "\"for_ms\":1500,\"ejection\":2,\"big\":9223372036854775807,\"neg\":-3,"
                      "\"after\":\"x\"}",
                      true);
    json_t *j = lt_parse(l.v[0]);
    cr_expect(json_is_integer(json_object_get(j, "for_ms")), "%s", l.v[0]);
    cr_expect_eq(json_integer_value(json_object_get(j, "for_ms")), 1500);
    cr_expect(json_is_integer(json_object_get(j, "ejection")), "%s", l.v[0]);
    cr_expect_str_eq(json_string_value(json_object_get(j, "after")), "x");
    json_decref(j);
    free_lines(&l);

    log_configure(CFG_LOG_INFO, CFG_LOG_TEXT);
    log_event(CFG_LOG_INFO, "draining", "signal", "SIGTERM", LOG_NUM("drain_timeout_ms", 10000),
              NULL);
    l = read_lines();
    cr_assert_eq(l.n, 2);
    expect_event_line(l.v[1], " INFO  draining signal=SIGTERM drain_timeout_ms=10000", false);
    free_lines(&l);
}

Test(log, event_json_without_pairs_and_null_value)
{
    log_event(CFG_LOG_INFO, "reloaded", NULL);
    log_event(CFG_LOG_WARN, "odd", "key", NULL, NULL);
    struct lines l = read_lines();
    cr_assert_eq(l.n, 2);
    expect_event_line(l.v[0], "\",\"level\":\"info\",\"msg\":\"reloaded\"}", true);
    expect_event_line(l.v[1], "\",\"level\":\"warn\",\"msg\":\"odd\",\"key\":null}", true);
    free_lines(&l);
}

Test(log, event_with_too_many_pairs_is_truncated_whole)
{
    char *big = lt_fill('v', 4000);
#define P4 "k", big, "k", big, "k", big, "k", big
    log_event(CFG_LOG_ERROR, "many", P4, P4, P4, P4, P4, P4, P4, P4, P4, P4, NULL);
#undef P4
    size_t len;
    char *out = lt_output(&len);
    struct lines l = split_lines(out, len);
    cr_assert_eq(l.n, 1);
    cr_expect_lt(len, BUF_SIZE);
    json_t *j = lt_parse(l.v[0]);
    cr_expect(json_is_true(json_object_get(j, "truncated")), "%.300s", l.v[0]);
    cr_expect_str_eq(json_string_value(json_object_get(j, "msg")), "many");
    json_decref(j);
    free_lines(&l);
    free(big);
}

/* ---- levels ---- */

Test(log, level_filtering_every_level)
{
    static const enum cfg_log_level levels[] = { CFG_LOG_DEBUG, CFG_LOG_INFO, CFG_LOG_WARN,
                                                 CFG_LOG_ERROR };
    struct log_request r = sample_request();
    struct log_attempt a = sample_attempt();
    struct log_buf *b = log_buf_new();
    for (size_t c = 0; c < 4; c++) {
        size_t before;
        free(lt_output(&before));
        log_configure(levels[c], CFG_LOG_JSON);
        for (size_t e = 0; e < 4; e++) {
            cr_expect_eq(log_enabled(levels[e]), e >= c, "configured %zu, asked %zu", c, e);
            char msg[32];
            snprintf(msg, sizeof msg, "event-%zu", e);
            log_event(levels[e], msg, NULL);
        }
        log_request(b, &r);
        log_attempt(b, &a);
        log_flush(b);

        size_t len;
        char *all = lt_output(&len);
        char *mine = strdup(all + before);
        free(all);
        struct lines l = split_lines(mine, len - before);
        bool seen_event[4] = { false }, seen_request = false, seen_attempt = false;
        for (size_t i = 0; i < l.n; i++) {
            json_t *j = lt_parse(l.v[i]);
            const char *m = json_string_value(json_object_get(j, "msg"));
            const char *lv = json_string_value(json_object_get(j, "level"));
            if (strncmp(m, "event-", 6) == 0) {
                size_t e = (size_t)(m[6] - '0');
                static const char *names[] = { "debug", "info", "warn", "error" };
                cr_expect_str_eq(lv, names[e]);
                seen_event[e] = true;
            } else if (strcmp(m, "request") == 0) {
                cr_expect_str_eq(lv, "info");
                seen_request = true;
            } else if (strcmp(m, "attempt") == 0) {
                cr_expect_str_eq(lv, "debug");
                seen_attempt = true;
            }
            json_decref(j);
        }
        for (size_t e = 0; e < 4; e++)
            cr_expect_eq(seen_event[e], e >= c, "configured %zu, event %zu", c, e);
        cr_expect_eq(seen_request, c <= 1, "configured %zu: request line", c);
        cr_expect_eq(seen_attempt, c == 0, "configured %zu: attempt line", c);
        cr_expect_eq(l.n, (4 - c) + (c <= 1) + (c == 0));
        free_lines(&l);
    }
    log_buf_free(b);
}

/* ---- docs/logs.md ---- */

/* Every field a request line can carry (a gRPC call's, every member set) has its row in the
 * table of docs/logs.md, "| `name`" first in a cell, so that the page and the code stay
 * together. */
Test(log, every_request_field_is_documented)
{
    FILE *f = fopen("docs/logs.md", "r");
    cr_assert(f, "docs/logs.md: %s (run from the repository's top directory)", strerror(errno));
    static char doc[64 * 1024];
    size_t n = fread(doc, 1, sizeof(doc) - 1, f);
    doc[n] = '\0';
    fclose(f);
    const char *table = strstr(doc, "### The request line");
    const char *end = table ? strstr(table, "### The attempt line") : NULL;
    cr_assert(table && end, "no request line section in docs/logs.md");

    struct log_request r = sample_request();
    r.protocol = "HTTP/2";
    r.grpc = true;
    r.grpc_status = 0;
    char *line = request_output(&r);
    json_t *j = lt_parse(line);
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v)
    {
        if (strcmp(key, "level") == 0 || strcmp(key, "msg") == 0)
            continue; /* every line's, in the section above */
        char cell[64];
        snprintf(cell, sizeof(cell), "`%s`", key);
        const char *at = strstr(table, cell);
        cr_expect(at && at < end, "docs/logs.md has no row for the request field %s", key);
    }
    json_decref(j);
    free(line);
}
