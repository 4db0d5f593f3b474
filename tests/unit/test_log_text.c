/* The log (proxy/telemetry/log.c, docs/logs.md): text lines, escaping of hostile paths and
 * bytes, and truncation of over-long fields to one valid line (tests/support/logtest.h). */
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

/* ---- text lines ---- */

Test(log, text_request_line)
{
    log_configure(CFG_LOG_INFO, CFG_LOG_TEXT);
    struct log_request r = sample_request();
    expect_request(&r, T_STR " INFO  request route=orders GET /orders/1?x=2 -> 200 attempts=3 "
                             "delays=100,200 312.5ms upstream=http://127.0.0.1:9001 "
                             "upstream_path=/base/orders/1?x=2 stop=- id=abc client=10.1.2.3 "
                             "client_port=50412 ua=curl/8.5.0 bytes_in=12 bytes_out=3456\n");
}

Test(log, text_request_nulls_and_quoting)
{
    log_configure(CFG_LOG_INFO, CFG_LOG_TEXT);
    struct log_request r = { .unix_ms = T_MS, .status = 502, .attempts = 1, .duration_ms = 0.25 };
    expect_request(&r, T_STR " INFO  request route=- - - -> 502 attempts=1 delays=- 0.3ms "
                             "upstream=- upstream_path=- stop=- id=- client=- client_port=- "
                             "ua=- bytes_in=0 bytes_out=0\n");

    /* A value that could be mistaken for another field, or for NULL, is quoted. */
    r = sample_request();
    r.route = "";
    r.stop = "-";
    r.request_id = "a b";
    r.path = "/a b\n\"c\"\\\x01\x7f\xff";
    r.user_agent = "Mozilla/5.0 (X11; \"x\")";
    r.client_addr = "::1";
    expect_request(&r,
                   T_STR " INFO  request route=\"\" GET \"/a b\\n\\\"c\\\"\\\\\\x01\\x7f\\xff\" "
                         "-> 200 attempts=3 delays=100,200 312.5ms "
                         "upstream=http://127.0.0.1:9001 upstream_path=/base/orders/1?x=2 "
                         "stop=\"-\" id=\"a b\" client=::1 client_port=50412 "
                         "ua=\"Mozilla/5.0 (X11; \\\"x\\\")\" bytes_in=12 bytes_out=3456\n");
}

Test(log, text_attempt_line)
{
    log_configure(CFG_LOG_DEBUG, CFG_LOG_TEXT);
    struct log_attempt a = sample_attempt();
    struct log_buf *b = log_buf_new();
    log_attempt(b, &a);
    log_buf_free(b);
    char *out = lt_output(NULL);
    cr_expect_str_eq(out, T_STR " DEBUG attempt route=orders id=abc attempt=2 "
                                "upstream=http://127.0.0.1:9001 outcome=503 1.2ms "
                                "decision=retry delay=200ms\n");
    free(out);
}

Test(log, text_event_line)
{
    log_configure(CFG_LOG_INFO, CFG_LOG_TEXT);
    log_event(CFG_LOG_ERROR, "reload failed", "key", "value", "error", "bad \"x\" at 3", NULL);
    log_event(CFG_LOG_INFO, "evil\nmsg", "k ey", "v\r", NULL);
    struct lines l = read_lines();
    cr_assert_eq(l.n, 2);
    expect_event_line(l.v[0], " ERROR reload failed key=value error=\"bad \\\"x\\\" at 3\"", false);
    expect_event_line(l.v[1], " INFO  evil\\nmsg k ey=\"v\\r\"", false);
    free_lines(&l);
}

Test(log, text_hostile_path_stays_one_line)
{
    log_configure(CFG_LOG_INFO, CFG_LOG_TEXT);
    struct log_request r = sample_request();
    r.path = "/x\r\n2026-11-21T10:15:30.123Z INFO  request route=fake\x1b[2J\xc0\xaf";
    char *line = request_output(&r);
    size_t n = strlen(line);
    cr_assert(n > 0 && line[n - 1] == '\n');
    line[n - 1] = '\0';
    cr_expect(strchr(line, '\n') == NULL);
    expect_no_control(line);
    cr_expect(strstr(line, "\\r\\n2026") != NULL, "%s", line);
    cr_expect(strstr(line, "\\x1b[2J\\xc0\\xaf\"") != NULL, "%s", line);
    free(line);
}

/* ---- escaping ---- */

Test(log, json_hostile_paths_round_trip)
{
    static const char *paths[] = {
        "/a\"b\\c",
        "/x\n{\"time\":\"x\"}\r\n\t",
        "/ctl\x01\x02\x1b\x1f\x7f/end",
        "/x\",\"status\":999,\"y\":\"",
        "/x\\\",\"status\":999}\n",
        "/caf\xc3\xa9/\xe2\x82\xac/\xf0\x9f\x98\x80/\xef\xbf\xbf/\xe2\x80\xa8",
        "\\u0000\\",
        "",
    };
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        struct log_request r = sample_request();
        r.path = paths[i];
        char *line = request_output(&r);
        size_t n = strlen(line);
        cr_assert(n > 0 && line[n - 1] == '\n');
        line[n - 1] = '\0';
        cr_expect(strchr(line, '\n') == NULL, "case %zu", i);
        expect_no_control(line);
        json_t *j = lt_parse(line);
        cr_expect_str_eq(json_string_value(json_object_get(j, "path")), paths[i], "case %zu", i);
        cr_expect_eq(json_integer_value(json_object_get(j, "status")), 200, "case %zu", i);
        cr_expect_eq(json_object_size(j), 19, "case %zu", i);
        json_decref(j);
        free(line);
    }
}

Test(log, json_escape_forms)
{
    struct log_request r = sample_request();
    r.path = "\"\\\n\r\t\x01\x1f\x7f";
    char *line = request_output(&r);
    cr_expect(strstr(line, "\"path\":\"\\\"\\\\\\n\\r\\t\\u0001\\u001f\\u007f\",") != NULL, "%s",
              line);
    free(line);
}

/* Invalid UTF-8: each byte that starts no well-formed character becomes \u00XX of the byte. */
Test(log, json_invalid_utf8_escaped_bytewise)
{
    static const struct {
        const char *path;
        const char *want; /* the JSON string as written */
        const char *decoded;
    } cases[] = {
        { "/a\xff"
          "b",
          "/a\\u00ffb",
          "/a\xc3\xbf"
          "b" },
        { "/\x80", "/\\u0080", "/\xc2\x80" },                    /* lone continuation */
        { "/\xc3", "/\\u00c3", "/\xc3\x83" },                    /* cut at the end */
        { "/\xc3(", "/\\u00c3(", "/\xc3\x83(" },                 /* bad continuation */
        { "/\xc0\xaf", "/\\u00c0\\u00af", "/\xc3\x80\xc2\xaf" }, /* overlong "/" */
        { "/\xed\xa0\x80", "/\\u00ed\\u00a0\\u0080", "/\xc3\xad\xc2\xa0\xc2\x80" }, /* surrogate */
        { "/\xf4\x90\x80\x80", "/\\u00f4\\u0090\\u0080\\u0080",
          "/\xc3\xb4\xc2\x90\xc2\x80\xc2\x80" },                 /* past U+10FFFF */
        { "/\xe2\x82", "/\\u00e2\\u0082", "/\xc3\xa2\xc2\x82" }, /* cut 3-byte */
        { "\xc3\xa9\xff\xc3\xa9", "\xc3\xa9\\u00ff\xc3\xa9", "\xc3\xa9\xc3\xbf\xc3\xa9" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct log_request r = sample_request();
        r.path = cases[i].path;
        char *line = request_output(&r);
        char want[128];
        snprintf(want, sizeof want, "\"path\":\"%s\",", cases[i].want);
        cr_expect(strstr(line, want) != NULL, "case %zu: want %s in %s", i, want, line);
        /* jansson rejects invalid UTF-8 anywhere in its input: parsing proves the line valid. */
        json_t *j = lt_parse(line);
        cr_expect_str_eq(json_string_value(json_object_get(j, "path")), cases[i].decoded,
                         "case %zu", i);
        json_decref(j);
        free(line);
    }
}

/* ---- truncation ---- */

static void expect_truncated_path(const char *line, const char *orig, size_t max_out)
{
    size_t n = strlen(line);
    cr_assert(n > 0 && line[n - 1] == '\n');
    cr_expect_lt(n, BUF_SIZE);
    cr_expect(strchr(line, '\n') == line + n - 1, "more than one line");
    json_t *j = lt_parse(line);
    const char *path = json_string_value(json_object_get(j, "path"));
    cr_assert(path);
    size_t pn = strlen(path);
    cr_assert_gt(pn, 3);
    cr_expect_str_eq(path + pn - 3, "...", "truncation not marked");
    cr_expect_leq(pn, max_out);
    cr_expect(strncmp(path, orig, pn - 3) == 0, "kept part differs from the original");
    cr_expect_eq(json_integer_value(json_object_get(j, "status")), 200);
    cr_expect_str_eq(json_string_value(json_object_get(j, "request_id")), "abc");
    json_decref(j);
}

Test(log, over_long_path_truncated_to_valid_json)
{
    /* Plain bytes, then the worst escapes (2 and 6 output bytes per input byte), then
     * multibyte characters, which must not be cut in the middle. */
    static const struct {
        char c;
        size_t n;
    } fills[] = { { 'a', 70000 }, { 'a', 65536 }, { '"', 64 * 1024 }, { '\x01', 64 * 1024 } };
    for (size_t i = 0; i < sizeof fills / sizeof fills[0]; i++) {
        char *path = lt_fill(fills[i].c, fills[i].n);
        struct log_request r = sample_request();
        r.path = path;
        char *line = request_output(&r);
        expect_truncated_path(line, path, BUF_SIZE);
        free(line);
        free(path);
    }

    size_t n = 30000;
    char *euro = malloc(3 * n + 1);
    for (size_t i = 0; i < n; i++)
        memcpy(euro + 3 * i, "\xe2\x82\xac", 3);
    euro[3 * n] = '\0';
    struct log_request r = sample_request();
    r.path = euro;
    char *line = request_output(&r);
    expect_truncated_path(line, euro, BUF_SIZE);
    free(line);
    free(euro);
}

Test(log, every_field_over_long_still_one_valid_line)
{
    char *big = lt_fill('\x01', 70000);
    uint32_t *delays = malloc(100000 * sizeof *delays);
    for (size_t i = 0; i < 100000; i++)
        delays[i] = 4000000000u;
    struct log_request r = { .unix_ms = T_MS,
                             .route = big,
                             .method = big,
                             .path = big,
                             .status = 200,
                             .attempts = 100001,
                             .delays = delays,
                             .n_delays = 100000,
                             .duration_ms = 1.0,
                             .upstream = big,
                             .upstream_path = big,
                             .stop = big,
                             .request_id = big,
                             .protocol = big,
                             .client_addr = big,
                             .client_port = 65535,
                             .user_agent = big,
                             .bytes_from_client = INT64_MAX,
                             .bytes_to_client = INT64_MAX };
    for (int text = 0; text < 2; text++) {
        log_configure(CFG_LOG_DEBUG, text ? CFG_LOG_TEXT : CFG_LOG_JSON);
        char *line = request_output(&r);
        size_t n = strlen(line);
        cr_expect_lt(n, BUF_SIZE);
        cr_expect(strchr(line, '\n') == line + n - 1);
        if (!text)
            json_decref(lt_parse(line));
        free(line);
    }

    log_configure(CFG_LOG_DEBUG, CFG_LOG_JSON);
    struct log_attempt a = { .unix_ms = T_MS,
                             .route = big,
                             .request_id = big,
                             .upstream = big,
                             .outcome = big,
                             .decision = big };
    struct log_buf *b = log_buf_new();
    log_attempt(b, &a);
    log_buf_free(b);
    struct lines l = read_lines();
    cr_assert_eq(l.n, 3);
    cr_expect_lt(strlen(l.v[2]), BUF_SIZE);
    json_decref(lt_parse(l.v[2]));
    free_lines(&l);

    log_event(CFG_LOG_ERROR, big, big, big, NULL);
    l = read_lines();
    cr_assert_eq(l.n, 4);
    cr_expect_lt(strlen(l.v[3]), BUF_SIZE);
    json_decref(lt_parse(l.v[3]));
    free_lines(&l);
    free(delays);
    free(big);
}

Test(log, long_line_that_fits_is_kept_whole_after_a_flush)
{
    struct log_request small = sample_request();
    char *path = lt_fill('p', 65100);
    struct log_request large = sample_request();
    large.path = path;

    struct log_buf *b = log_buf_new();
    log_request(b, &small);
    size_t len;
    free(lt_output(&len));
    cr_expect_eq(len, 0);
    /* It does not fit after the first line: that one is written first, the long one kept. */
    log_request(b, &large);
    struct lines l = read_lines();
    cr_assert_eq(l.n, 1);
    json_decref(lt_parse(l.v[0]));
    free_lines(&l);

    log_flush(b);
    l = read_lines();
    cr_assert_eq(l.n, 2);
    /* The case meant: each fits alone, both together do not. */
    cr_assert_gt(strlen(l.v[0]) + strlen(l.v[1]) + 2, BUF_SIZE);
    json_t *j = lt_parse(l.v[1]);
    cr_expect_str_eq(json_string_value(json_object_get(j, "path")), path);
    json_decref(j);
    free_lines(&l);
    log_buf_free(b);
    free(path);
}
