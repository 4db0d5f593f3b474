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

/* log.c's worker buffer: the bound on every line and every write. */
#define BUF_SIZE (64 * 1024)

#define T_MS  INT64_C(1795256130123)
#define T_STR "2026-11-21T10:15:30.123Z"

/* Every test writes into a fresh unlinked file (a pipe where the test says so). Criterion runs
 * each test in its own process, so the log's process-wide state starts anew each time. */
static int out_fd = -1;

static void setup(void)
{
    char path[] = "/tmp/test_log_XXXXXX";
    out_fd = mkstemp(path);
    cr_assert(out_fd >= 0, "mkstemp: %s", strerror(errno));
    unlink(path);
    log_set_fd(out_fd);
    log_configure(CFG_LOG_INFO, CFG_LOG_JSON);
}

static void teardown(void)
{
    log_set_fd(1);
    close(out_fd);
}

TestSuite(log, .init = setup, .fini = teardown);

/* ---- helpers ---- */

/* Everything written to out_fd so far, NUL-terminated (lines never hold a NUL). */
static char *output(size_t *len)
{
    struct stat st;
    cr_assert(fstat(out_fd, &st) == 0);
    size_t n = (size_t)st.st_size;
    char *p = malloc(n + 1);
    cr_assert(p);
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(out_fd, p + got, n - got, (off_t)got);
        cr_assert(r > 0, "pread: %s", strerror(errno));
        got += (size_t)r;
    }
    p[n] = '\0';
    if (len)
        *len = n;
    return p;
}

struct lines {
    char *all;
    char **v;
    size_t n;
};

/* Splits text (taken over) into lines, checking that it ends with a newline. */
static struct lines split_lines(char *text, size_t len)
{
    struct lines l = { .all = text };
    cr_assert(len == 0 || text[len - 1] == '\n', "output does not end with a newline");
    for (size_t i = 0; i < len; i++)
        l.n += text[i] == '\n';
    l.v = calloc(l.n + 1, sizeof *l.v);
    cr_assert(l.v);
    char *p = text;
    for (size_t i = 0; i < l.n; i++) {
        char *nl = strchr(p, '\n');
        *nl = '\0';
        l.v[i] = p;
        p = nl + 1;
    }
    return l;
}

static struct lines read_lines(void)
{
    size_t len;
    char *text = output(&len);
    return split_lines(text, len);
}

static void free_lines(struct lines *l)
{
    free(l->v);
    free(l->all);
}

static json_t *parse(const char *line)
{
    json_error_t err;
    json_t *j = json_loads(line, 0, &err);
    cr_assert(j, "not JSON (%s at %d): %.200s", err.text, err.position, line);
    cr_assert(json_is_object(j));
    return j;
}

/* No byte a terminal or a line splitter would act on. */
static void expect_no_control(const char *line)
{
    for (const unsigned char *p = (const unsigned char *)line; *p; p++)
        cr_assert(*p >= 0x20 && *p != 0x7F, "control byte 0x%02x in: %.200s", *p, line);
}

static const uint32_t two_delays[] = { 100, 200 };

static struct log_request sample_request(void)
{
    return (struct log_request){ .unix_ms = T_MS,
                                 .route = "orders",
                                 .method = "GET",
                                 .path = "/orders/1?x=2",
                                 .status = 200,
                                 .attempts = 3,
                                 .delays = two_delays,
                                 .n_delays = 2,
                                 .duration_ms = 312.5,
                                 .upstream = "http://127.0.0.1:9001",
                                 .upstream_path = "/base/orders/1?x=2",
                                 .stop = NULL,
                                 .request_id = "abc",
                                 .client_addr = "10.1.2.3",
                                 .client_port = 50412,
                                 .user_agent = "curl/8.5.0",
                                 .bytes_from_client = 12,
                                 .bytes_to_client = 3456 };
}

static struct log_attempt sample_attempt(void)
{
    return (struct log_attempt){ .unix_ms = T_MS,
                                 .route = "orders",
                                 .request_id = "abc",
                                 .attempt = 2,
                                 .upstream = "http://127.0.0.1:9001",
                                 .outcome = "503",
                                 .duration_ms = 1.2,
                                 .decision = "retry",
                                 .delay_ms = 200 };
}

/* Logs r through a fresh buffer and returns everything written (the caller frees it). */
static char *request_output(const struct log_request *r)
{
    size_t before;
    free(output(&before));
    struct log_buf *b = log_buf_new();
    cr_assert(b);
    log_request(b, r);
    log_buf_free(b);
    size_t len;
    char *all = output(&len);
    char *line = strdup(all + before);
    free(all);
    return line;
}

static void expect_request(const struct log_request *r, const char *want)
{
    char *got = request_output(r);
    cr_expect_str_eq(got, want);
    free(got);
}

/* Logs r and checks that its line holds 'want'. */
static void expect_request_has(const struct log_request *r, const char *want)
{
    char *line = request_output(r);
    cr_expect(strstr(line, want) != NULL, "want %s in %s", want, line);
    free(line);
}

static char *fill(char c, size_t n)
{
    char *s = malloc(n + 1);
    cr_assert(s);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

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
    json_t *j = parse(line);
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
        json_decref(parse(line));
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
    free(output(&len));
    cr_expect_eq(len, 0, "attempt logged at level info");

    log_configure(CFG_LOG_DEBUG, CFG_LOG_JSON);
    log_attempt(b, &a);
    log_flush(b);
    char *out = output(NULL);
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
    char *out = output(NULL);
    cr_expect_str_eq(out, "{\"time\":\"" T_STR "\",\"level\":\"debug\",\"msg\":\"attempt\","
                          "\"route\":null,\"request_id\":null,\"attempt\":1,\"upstream\":null,"
                          "\"outcome\":null,\"duration_ms\":0.5,\"decision\":null,"
                          "\"delay_ms\":0}\n");
    free(out);
}

/* Checks an event line: a current time, then exactly 'rest' after it. */
static void expect_event_line(const char *line, const char *rest, bool json)
{
    const char *t = json ? line + strlen("{\"time\":\"") : line;
    if (json)
        cr_assert(strncmp(line, "{\"time\":\"", 9) == 0, "%s", line);
    struct tm tm = { 0 };
    char *end = strptime(t, "%Y-%m-%dT%H:%M:%S", &tm);
    cr_assert(end, "no time in %s", line);
    cr_assert(end[0] == '.' && end[1] >= '0' && end[1] <= '9' && end[2] >= '0' && end[2] <= '9' &&
                  end[3] >= '0' && end[3] <= '9' && end[4] == 'Z',
              "%s", line);
    long long diff = (long long)timegm(&tm) - (long long)time(NULL);
    cr_expect(diff >= -5 && diff <= 5, "event time is %lld s off: %s", diff, line);
    cr_expect_str_eq(end + 5, rest);
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
    json_t *j = parse(l.v[0]);
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
    json_t *j = parse(l.v[0]);
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
    char *big = fill('v', 4000);
#define P4 "k", big, "k", big, "k", big, "k", big
    log_event(CFG_LOG_ERROR, "many", P4, P4, P4, P4, P4, P4, P4, P4, P4, P4, NULL);
#undef P4
    size_t len;
    char *out = output(&len);
    struct lines l = split_lines(out, len);
    cr_assert_eq(l.n, 1);
    cr_expect_lt(len, BUF_SIZE);
    json_t *j = parse(l.v[0]);
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
        free(output(&before));
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
        char *all = output(&len);
        char *mine = strdup(all + before);
        free(all);
        struct lines l = split_lines(mine, len - before);
        bool seen_event[4] = { false }, seen_request = false, seen_attempt = false;
        for (size_t i = 0; i < l.n; i++) {
            json_t *j = parse(l.v[i]);
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
    char *out = output(NULL);
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
        json_t *j = parse(line);
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
        json_t *j = parse(line);
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
    json_t *j = parse(line);
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
        char *path = fill(fills[i].c, fills[i].n);
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
    char *big = fill('\x01', 70000);
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
            json_decref(parse(line));
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
    json_decref(parse(l.v[2]));
    free_lines(&l);

    log_event(CFG_LOG_ERROR, big, big, big, NULL);
    l = read_lines();
    cr_assert_eq(l.n, 4);
    cr_expect_lt(strlen(l.v[3]), BUF_SIZE);
    json_decref(parse(l.v[3]));
    free_lines(&l);
    free(delays);
    free(big);
}

Test(log, long_line_that_fits_is_kept_whole_after_a_flush)
{
    struct log_request small = sample_request();
    char *path = fill('p', 65100);
    struct log_request large = sample_request();
    large.path = path;

    struct log_buf *b = log_buf_new();
    log_request(b, &small);
    size_t len;
    free(output(&len));
    cr_expect_eq(len, 0);
    /* It does not fit after the first line: that one is written first, the long one kept. */
    log_request(b, &large);
    struct lines l = read_lines();
    cr_assert_eq(l.n, 1);
    json_decref(parse(l.v[0]));
    free_lines(&l);

    log_flush(b);
    l = read_lines();
    cr_assert_eq(l.n, 2);
    /* The case meant: each fits alone, both together do not. */
    cr_assert_gt(strlen(l.v[0]) + strlen(l.v[1]) + 2, BUF_SIZE);
    json_t *j = parse(l.v[1]);
    cr_expect_str_eq(json_string_value(json_object_get(j, "path")), path);
    json_decref(j);
    free_lines(&l);
    log_buf_free(b);
    free(path);
}

/* ---- buffering ---- */

Test(log, nothing_written_before_flush)
{
    struct log_request r = sample_request();
    struct log_buf *b = log_buf_new();
    cr_assert(b);
    for (int i = 0; i < 3; i++)
        log_request(b, &r);
    size_t len;
    free(output(&len));
    cr_expect_eq(len, 0, "written before log_flush");

    log_flush(b);
    struct lines l = read_lines();
    cr_expect_eq(l.n, 3);
    free_lines(&l);

    /* An empty flush writes nothing more; log_buf_free writes what is left. */
    log_flush(b);
    log_request(b, &r);
    l = read_lines();
    cr_expect_eq(l.n, 3);
    free_lines(&l);
    log_buf_free(b);
    l = read_lines();
    cr_expect_eq(l.n, 4);
    free_lines(&l);
    log_buf_free(NULL);
    log_flush(NULL);
}

Test(log, full_buffer_writes_whole_lines)
{
    char *path = fill('q', 1000);
    struct log_request r = sample_request();
    r.path = path;
    struct log_buf *b = log_buf_new();
    size_t line_len = 0;
    for (int i = 0; i < 200; i++) {
        size_t before;
        free(output(&before));
        log_request(b, &r);
        size_t after;
        char *out = output(&after);
        if (after != before) {
            /* Each write is whole lines that fitted in one buffer. */
            cr_expect(out[after - 1] == '\n');
            cr_expect_leq(after - before, BUF_SIZE);
        }
        free(out);
        if (i == 0) {
            log_flush(b);
            free(output(&line_len));
        }
    }
    log_buf_free(b);
    size_t len;
    char *out = output(&len);
    cr_expect_eq(len, 200 * line_len);
    struct lines l = split_lines(out, len);
    cr_expect_eq(l.n, 200);
    for (size_t i = 0; i < l.n; i++)
        json_decref(parse(l.v[i]));
    free_lines(&l);
    free(path);
}

Test(log, without_a_buffer_lines_are_written_at_once)
{
    struct log_request r = sample_request();
    log_request(NULL, &r);
    struct lines l = read_lines();
    cr_expect_eq(l.n, 1);
    free_lines(&l);
}

/* ---- threads ----
 *
 * The scenarios are plain C with no Criterion calls, so that they also run under
 * ThreadSanitizer, where Criterion cannot start (its BoxFort arena wants address space TSan
 * reserves, Snaipe/Criterion#274): building with -DLOG_TEST_MAIN adds a main() that runs only
 * them (see the end of the file). */

#define THREADS    4
#define PER_THREAD 10000

struct reader {
    int fd;
    char *data;
    size_t len, cap;
};

static void *read_pipe(void *arg)
{
    struct reader *rd = arg;
    for (;;) {
        if (rd->cap - rd->len < 65536) {
            rd->cap = rd->cap ? rd->cap * 2 : 1 << 20;
            rd->data = realloc(rd->data, rd->cap + 1);
            if (!rd->data)
                abort();
        }
        ssize_t n = read(rd->fd, rd->data + rd->len, rd->cap - rd->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        rd->len += (size_t)n;
    }
    rd->data[rd->len] = '\0';
    return NULL;
}

struct worker_arg {
    int id;
};

static void *log_worker(void *arg)
{
    const struct worker_arg *w = arg;
    struct log_buf *b = log_buf_new();
    if (!b)
        abort();
    char path[600];
    char id[32];
    for (int i = 0; i < PER_THREAD; i++) {
        /* Lines of different lengths, so that buffers also fill up and flush by themselves. */
        int plen = snprintf(path, sizeof path, "/t%d/%d/", w->id, i);
        memset(path + plen, 'a' + i % 26, (size_t)(i % 500));
        path[plen + i % 500] = '\0';
        snprintf(id, sizeof id, "%d-%d", w->id, i);
        struct log_request r = sample_request();
        r.path = path;
        r.request_id = id;
        log_request(b, &r);
        if (i % 37 == 0)
            log_flush(b);
    }
    log_buf_free(b);
    return NULL;
}

static atomic_bool flipping_done;

/* A reload storm: level and format change all the time while workers log. */
static void *flipper(void *arg)
{
    (void)arg;
    unsigned i = 0;
    while (!atomic_load(&flipping_done)) {
        log_configure(i % 3 == 2 ? CFG_LOG_DEBUG : CFG_LOG_INFO,
                      i % 2 ? CFG_LOG_TEXT : CFG_LOG_JSON);
        i++;
    }
    return NULL;
}

struct scenario {
    size_t json_lines, text_lines;
    char problem[512];
};

/* Checks one line written by log_worker (JSON, or text when formats flip) and says which
 * thread and which of its lines it is. */
static bool check_worker_line(struct scenario *sc, char *line, bool text_ok, int *tid, int *seq)
{
    char want[32];
    if (line[0] == '{') {
        json_t *j = json_loads(line, 0, NULL);
        const char *id = json_string_value(json_object_get(j, "request_id"));
        const char *path = json_string_value(json_object_get(j, "path"));
        bool ok = id && path && sscanf(id, "%d-%d", tid, seq) == 2 && *tid >= 0 && *tid < THREADS &&
                  *seq >= 0 && *seq < PER_THREAD;
        if (ok) {
            snprintf(want, sizeof want, "/t%d/%d/", *tid, *seq);
            ok = strncmp(path, want, strlen(want)) == 0 &&
                 strlen(path) == strlen(want) + (size_t)(*seq % 500);
        }
        json_decref(j);
        sc->json_lines++;
        return ok;
    }
    if (!text_ok)
        return false;
    /* 2026-...Z INFO  request route=orders GET /t0/1/a -> 200 ... id=0-1 */
    char *path = strstr(line, " INFO  request route=orders GET ");
    char *arrow = strstr(line, " -> 200 attempts=3 ");
    char *id = strstr(line, " id=");
    if (path != line + 24 || !arrow || !id || sscanf(id, " id=%d-%d", tid, seq) != 2 || *tid < 0 ||
        *tid >= THREADS || *seq < 0 || *seq >= PER_THREAD)
        return false;
    path += strlen(" INFO  request route=orders GET ");
    snprintf(want, sizeof want, "/t%d/%d/", *tid, *seq);
    sc->text_lines++;
    return strncmp(path, want, strlen(want)) == 0 &&
           (size_t)(arrow - path) == strlen(want) + (size_t)(*seq % 500);
}

/* Runs 'workers' log_worker threads (and the flipper if 'flip') writing into one pipe, then
 * checks that every line is whole, each once, in its thread's order. NULL when all held. */
static const char *run_scenario(struct scenario *sc, int workers, bool flip)
{
    memset(sc, 0, sizeof *sc);
    int p[2];
    if (pipe(p) != 0)
        return "pipe failed";
    struct reader rd = { .fd = p[0] };
    pthread_t reader, f, t[THREADS];
    struct worker_arg args[THREADS];
    if (pthread_create(&reader, NULL, read_pipe, &rd) != 0)
        return "pthread_create failed";
    uint64_t dropped = log_dropped_lines();
    log_set_fd(p[1]);
    atomic_store(&flipping_done, false);
    if (flip && pthread_create(&f, NULL, flipper, NULL) != 0)
        abort();
    for (int i = 0; i < workers; i++) {
        args[i].id = i;
        if (pthread_create(&t[i], NULL, log_worker, &args[i]) != 0)
            abort();
    }
    for (int i = 0; i < workers; i++)
        pthread_join(t[i], NULL);
    if (flip) {
        atomic_store(&flipping_done, true);
        pthread_join(f, NULL);
    }
    log_set_fd(1);
    close(p[1]);
    pthread_join(reader, NULL);
    close(p[0]);

    int next[THREADS] = { 0 };
    size_t lines = 0;
    char *line = rd.data;
    char *nl;
    while (!sc->problem[0] && (nl = strchr(line, '\n')) != NULL) {
        *nl = '\0';
        int tid = -1, seq = -1;
        if (!check_worker_line(sc, line, flip, &tid, &seq))
            snprintf(sc->problem, sizeof sc->problem, "line %zu is broken: %.300s", lines, line);
        else if (seq != next[tid])
            snprintf(sc->problem, sizeof sc->problem, "thread %d: line %d after %d", tid, seq,
                     next[tid] - 1);
        else
            next[tid]++;
        lines++;
        line = nl + 1;
    }
    if (!sc->problem[0] && *line != '\0')
        snprintf(sc->problem, sizeof sc->problem, "the output ends inside a line");
    for (int i = 0; i < workers && !sc->problem[0]; i++) {
        if (next[i] != PER_THREAD)
            snprintf(sc->problem, sizeof sc->problem, "thread %d: %d lines, want %d", i, next[i],
                     PER_THREAD);
    }
    if (!sc->problem[0] && log_dropped_lines() != dropped)
        snprintf(sc->problem, sizeof sc->problem, "%llu lines dropped",
                 (unsigned long long)(log_dropped_lines() - dropped));
    free(rd.data);
    return sc->problem[0] ? sc->problem : NULL;
}

Test(log, concurrent_flushes_never_interleave, .timeout = 120)
{
    struct scenario sc;
    const char *problem = run_scenario(&sc, THREADS, false);
    cr_expect(problem == NULL, "%s", problem);
    cr_expect_eq(sc.json_lines, (size_t)THREADS * PER_THREAD);
}

/* Requests are at info, which every setting of the flipper lets through: none is lost, and each
 * line is whole in one format or the other. */
Test(log, configure_while_logging, .timeout = 120)
{
    struct scenario sc;
    const char *problem = run_scenario(&sc, 2, true);
    cr_expect(problem == NULL, "%s", problem);
    cr_expect_eq(sc.json_lines + sc.text_lines, (size_t)2 * PER_THREAD);
}

Test(log, full_nonblocking_pipe_drops_and_counts)
{
    int p[2];
    cr_assert(pipe2(p, O_NONBLOCK) == 0);
    char chunk[4096];
    memset(chunk, 'x', sizeof chunk);
    size_t filled = 0;
    for (;;) {
        ssize_t n = write(p[1], chunk, sizeof chunk);
        if (n <= 0)
            break;
        filled += (size_t)n;
    }
    while (write(p[1], chunk, 1) == 1)
        filled++;
    log_set_fd(p[1]);

    struct log_request r = sample_request();
    struct log_buf *b = log_buf_new();
    for (int i = 0; i < 5; i++)
        log_request(b, &r);
    errno = 12345;
    log_flush(b);
    cr_expect_eq(errno, 12345, "errno changed by log_flush");
    cr_expect_eq(log_dropped_lines(), 5);

    /* Once the reader catches up, logging goes on with whole lines. */
    char sink[65536];
    size_t drained = 0;
    for (;;) {
        ssize_t n = read(p[0], sink, sizeof sink);
        if (n <= 0)
            break;
        drained += (size_t)n;
    }
    cr_expect_eq(drained, filled);
    r.request_id = "after";
    log_request(b, &r);
    log_flush(b);
    ssize_t n = read(p[0], sink, sizeof sink - 1);
    cr_assert_gt(n, 0);
    sink[n] = '\0';
    cr_assert_eq(sink[n - 1], '\n');
    sink[n - 1] = '\0';
    json_t *j = parse(sink);
    cr_expect_str_eq(json_string_value(json_object_get(j, "request_id")), "after");
    json_decref(j);
    cr_expect_eq(log_dropped_lines(), 5);
    log_buf_free(b);
    log_set_fd(out_fd);
    close(p[0]);
    close(p[1]);
}

/* A write that stops within a line (here at the file size limit) leaves a fragment: the next
 * write starts on a new line, so the lines after it are intact. */
Test(log, partial_write_fragment_is_fenced_off)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old;
    cr_assert(getrlimit(RLIMIT_FSIZE, &old) == 0);
    struct rlimit lim = { .rlim_cur = 1000, .rlim_max = old.rlim_max };
    cr_assert(setrlimit(RLIMIT_FSIZE, &lim) == 0);

    struct log_request r = sample_request();
    struct log_buf *b = log_buf_new();
    log_request(b, &r);
    size_t one = 0;
    log_flush(b);
    free(output(&one));
    cr_assert_lt(one, 500);
    cr_assert_neq(1000 % one, 0, "the limit must fall inside a line");
    size_t lines = 20;
    for (size_t i = 0; i < lines; i++)
        log_request(b, &r);
    log_flush(b);
    cr_expect_eq(log_dropped_lines(), lines - (1000 / one - 1));
    lim.rlim_cur = old.rlim_cur;
    cr_assert(setrlimit(RLIMIT_FSIZE, &lim) == 0);

    r.request_id = "after";
    log_request(b, &r);
    log_buf_free(b);
    size_t len;
    char *out = output(&len);
    struct lines l = split_lines(out, len);
    /* The whole lines, the fragment, then the next line. */
    size_t whole = 1000 / one;
    cr_assert_eq(l.n, whole + 2);
    for (size_t i = 0; i < whole; i++)
        json_decref(parse(l.v[i]));
    cr_expect_eq(strlen(l.v[whole]), 1000 - whole * one);
    json_t *j = parse(l.v[whole + 1]);
    cr_expect_str_eq(json_string_value(json_object_get(j, "request_id")), "after");
    json_decref(j);
    free_lines(&l);
}

Test(log, closed_pipe_and_bad_fd_drop_lines)
{
    signal(SIGPIPE, SIG_IGN);
    int p[2];
    cr_assert(pipe(p) == 0);
    close(p[0]);
    log_set_fd(p[1]);
    struct log_request r = sample_request();
    struct log_buf *b = log_buf_new();
    log_request(b, &r);
    log_request(b, &r);
    log_flush(b);
    cr_expect_eq(log_dropped_lines(), 2);
    log_event(CFG_LOG_ERROR, "lost", NULL);
    cr_expect_eq(log_dropped_lines(), 3);
    close(p[1]);

    log_set_fd(-1);
    log_request(b, &r);
    log_flush(b);
    cr_expect_eq(log_dropped_lines(), 4);

    log_set_fd(out_fd);
    log_request(b, &r);
    log_buf_free(b);
    struct lines l = read_lines();
    cr_expect_eq(l.n, 1);
    free_lines(&l);
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
    json_t *j = parse(line);
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

#ifdef LOG_TEST_MAIN
/* The thread scenarios on their own, for ThreadSanitizer, where Criterion cannot run:
 *   gcc -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=thread -DLOG_TEST_MAIN -I. \
 *       tests/unit/test_log.c proxy/telemetry/log.c -lcriterion -ljansson -lpthread
 * This main() takes the place of Criterion's, so none of the Test()s above run. */
int main(void)
{
    struct scenario sc;
    const char *problem = run_scenario(&sc, THREADS, false);
    printf("log: %d threads x %d lines, one pipe: %s\n", THREADS, PER_THREAD,
           problem ? problem : "ok");
    bool failed = problem != NULL;
    problem = run_scenario(&sc, 2, true);
    printf("log: logging while level and format change (%zu JSON, %zu text lines): %s\n",
           sc.json_lines, sc.text_lines, problem ? problem : "ok");
    return failed || problem ? 1 : 0;
}
#endif
