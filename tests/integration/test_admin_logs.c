/* The proxy's logs end to end (docs/logs.md): one JSON line per request, levels, the text
 * format, reloads logged; the real binary against the test upstream on 127.0.0.1, its stdout
 * read back as log lines (tests/support/admintest.h). */
#include "tests/support/admintest.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <regex.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/promtext.h"

TestSuite(admin, .fini = fx_stop, .timeout = 60);

static double gap_ms(const char *id, size_t a, size_t b)
{
    const struct tup_req *ra = NULL, *rb = NULL;
    for (size_t i = 0, k = 0; i < tup_count(up); i++) {
        const struct tup_req *q = tup_get(up, i);
        if (strcmp(q->request_id, id) != 0)
            continue;
        if (k == a)
            ra = q;
        if (k == b)
            rb = q;
        k++;
    }
    cr_assert(ra && rb, "attempts %zu and %zu of %s were not recorded", a, b, id);
    return (double)(rb->arrival_ns - ra->arrival_ns) / 1e6;
}

Test(admin, request_line_is_one_complete_json_object)
{
    adm_start("\"retry\": {" FAST "}");
    adm_send_plan("GET", "/a/b?x=2&y=z", "fail=2;status=503", "log-ok", 200);
    adm_send_plan("GET", "/c", "fail=9;status=503", "log-stop", 503);

    size_t bad;
    json_decref(adm_wait_logs("request", "log-ok", 1, &bad));
    json_t *lines = adm_wait_logs("request", "log-stop", 1, &bad);
    cr_expect_eq(bad, 0, "%zu stdout lines are not JSON objects", bad);
    json_t *l;
    cr_assert_eq(adm_count_msg(lines, "request", "log-ok", &l), 1,
                 "want one request line for log-ok");
    expect_recent_time("time", json_str(l, "time"));
    cr_expect_str_eq(json_str(l, "level"), "info");
    cr_expect_str_eq(json_str(l, "route"), "r");
    cr_expect_str_eq(json_str(l, "method"), "GET");
    cr_expect_str_eq(json_str(l, "path"), "/a/b?x=2&y=z");
    cr_expect(json_is_integer(json_object_get(l, "status")), "status is not an integer");
    cr_expect_eq(json_integer_value(json_object_get(l, "status")), 200);
    cr_expect_eq(json_integer_value(json_object_get(l, "attempts")), 3);
    cr_expect_str_eq(json_str(l, "upstream"), fx_up_url(0));
    cr_expect(json_is_null(json_object_get(l, "stop")), "stop of a success is not null");
    cr_expect_str_eq(json_str(l, "request_id"), "log-ok");
    json_t *d = json_object_get(l, "delays_ms");
    cr_assert(json_is_array(d) && json_array_size(d) == 2, "delays_ms is not a 2-element array");
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_array_get(d, i);
        double want = 10.0 * (double)(1u << i), got = json_number_value(v);
        cr_expect(json_is_number(v) && got == want, "delays_ms[%zu] = %g, want %g", i, got, want);
        /* the logged wait is the one taken: the next attempt came no sooner */
        double g = gap_ms("log-ok", i, i + 1);
        cr_expect(g >= got - 1 && g < got + 400, "gap %zu: %.1f ms for a logged wait of %g ms", i,
                  g, got);
    }
    json_t *dur = json_object_get(l, "duration_ms");
    cr_expect(json_is_number(dur), "duration_ms is not a number");
    cr_expect(json_number_value(dur) >= 30 && json_number_value(dur) < 5000,
              "duration_ms = %g for waits of 30 ms", json_number_value(dur));

    cr_assert_eq(adm_count_msg(lines, "request", "log-stop", &l), 1);
    cr_expect_eq(json_integer_value(json_object_get(l, "status")), 503);
    cr_expect_eq(json_integer_value(json_object_get(l, "attempts")), 3);
    cr_expect_str_eq(json_str(l, "stop"), "max-attempts");
    cr_expect_str_eq(json_str(l, "path"), "/c");
    /* info level: no attempt detail */
    cr_expect_eq(adm_count_msg(lines, "attempt", NULL, NULL), 0);
    json_decref(lines);
}

Test(admin, hostile_path_is_one_valid_line)
{
    adm_start("\"retry\": {" FAST "}");
    const char *h[] = { "X-Request-Id: hostile", NULL };
    struct http_resp r = adm_send_req("GET", "/a%22b?x=%0A", h, NULL);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    cr_expect_str_eq(tup_get(up, 0)->target, "/a%22b?x=%0A");

    /* Quote and backslash as raw bytes too, which a JSON writer must escape. */
    int fd = adm_connect_proxy();
    fx_hold(fd);
    const char req[] = "GET /q\"b\\c?d=\"} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       "X-Request-Id: raw-hostile\r\nConnection: close\r\n\r\n";
    cr_assert_eq(send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL), (ssize_t)(sizeof(req) - 1));
    char resp[4096];
    ssize_t n, got = 0;
    while ((n = recv(fd, resp + got, sizeof(resp) - 1 - (size_t)got, 0)) > 0)
        got += n;
    resp[got] = '\0';
    cr_expect(strncmp(resp, "HTTP/1.1 ", 9) == 0, "no answer to the raw request: %s", resp);

    size_t bad;
    json_decref(adm_wait_logs("request", "hostile", 1, &bad));
    json_t *lines = adm_wait_logs("request", "raw-hostile", 1, &bad);
    cr_expect_eq(bad, 0, "%zu stdout lines are not JSON objects", bad);
    json_t *l;
    cr_expect_eq(adm_count_msg(lines, "request", "hostile", &l), 1);
    if (l)
        cr_expect_str_eq(json_str(l, "path"), "/a%22b?x=%0A");
    cr_expect_eq(adm_count_msg(lines, "request", "raw-hostile", &l), 1,
                 "no request line for the raw request (answer: %.40s)", resp);
    if (l)
        cr_expect_str_eq(json_str(l, "path"), "/q\"b\\c?d=\"}");
    json_decref(lines);
    char *out = px_stdout(px);
    cr_expect_eq(adm_count_raw(out, "hostile"), 2, "the two requests did not log two lines:\n%s",
                 out);
    free(out);
}

/* A failed reload: its error lines are written at once, so once they show, every earlier
 * request line has been flushed too (the caller waited for the responses). */
static json_t *fail_a_reload(size_t *bad)
{
    adm_write_invalid_cfg();
    json_t *j = admin_json("POST", "/reload", 422);
    json_decref(j);
    int64_t deadline = now_ms() + ADM_SETTLE_MS;
    for (;;) {
        json_t *lines = adm_log_lines(bad);
        size_t i, n = 0;
        json_t *l;
        json_array_foreach(lines, i, l)
        {
            const char *lv = json_str(l, "level");
            n += lv && strcmp(lv, "error") == 0;
        }
        if (n > 0 || now_ms() >= deadline) {
            cr_expect_gt(n, 0, "a failed reload logged no error line");
            return lines;
        }
        json_decref(lines);
        usleep(20000);
    }
}

Test(admin, warn_level_logs_no_request_lines)
{
    adm_start_with("\"log\": {\"level\": \"warn\"}", "\"retry\": {" FAST "}", "", NULL, NULL);
    adm_send_plan("GET", "/w", "fail=1;status=503", "quiet", 200);
    usleep(200000); /* one more chance for a buffered line to reach stdout */
    size_t bad;
    json_t *lines = fail_a_reload(&bad);
    cr_expect_eq(bad, 0);
    cr_expect_eq(adm_count_msg(lines, "request", NULL, NULL), 0, "a request line at level warn");
    cr_expect_eq(adm_count_msg(lines, "attempt", NULL, NULL), 0, "an attempt line at level warn");
    size_t i;
    json_t *l;
    json_array_foreach(lines, i, l)
    {
        const char *lv = json_str(l, "level");
        cr_expect(lv && (strcmp(lv, "warn") == 0 || strcmp(lv, "error") == 0),
                  "a %s line at level warn: %s", lv ? lv : "(no level)", json_str(l, "msg"));
    }
    json_decref(lines);
}

Test(admin, debug_level_logs_each_attempt)
{
    adm_start_with("", "\"retry\": {" FAST "}", "", "--log-level", "debug");
    adm_send_plan("GET", "/d", "fail=2;status=503", "dbg", 200);
    size_t bad;
    json_decref(adm_wait_logs("attempt", "dbg", 3, &bad));
    /* the request line may reach stdout a loop turn after the last attempt line */
    json_t *lines = adm_wait_logs("request", "dbg", 1, &bad);
    cr_expect_eq(bad, 0);
    cr_assert_eq(adm_count_msg(lines, "attempt", "dbg", NULL), 3,
                 "want one attempt line per attempt");
    static const char *const outcome[] = { "503", "503", "200" };
    static const char *const decision[] = { "retry", "retry", "final" };
    static const long delay[] = { 10, 20, 0 };
    size_t i, k = 0;
    json_t *l;
    json_array_foreach(lines, i, l)
    {
        const char *m = json_str(l, "msg"), *id = json_str(l, "request_id");
        if (!m || strcmp(m, "attempt") != 0 || !id || strcmp(id, "dbg") != 0 || k >= 3)
            continue;
        cr_expect_str_eq(json_str(l, "level"), "debug");
        cr_expect_str_eq(json_str(l, "route"), "r");
        cr_expect_eq(json_integer_value(json_object_get(l, "attempt")), (json_int_t)k + 1);
        cr_expect_str_eq(json_str(l, "outcome"), outcome[k], "attempt %zu", k + 1);
        cr_expect_str_eq(json_str(l, "decision"), decision[k], "attempt %zu", k + 1);
        cr_expect_eq(json_integer_value(json_object_get(l, "delay_ms")), delay[k], "attempt %zu",
                     k + 1);
        cr_expect_str_eq(json_str(l, "upstream"), fx_up_url(0));
        expect_recent_time("attempt time", json_str(l, "time"));
        k++;
    }
    cr_expect_eq(adm_count_msg(lines, "request", "dbg", NULL), 1,
                 "debug includes the request line");
    json_decref(lines);
}

Test(admin, text_format_is_one_line_per_request)
{
    adm_start_with("\"log\": {\"format\": \"text\"}", "\"retry\": {" FAST "}", "", NULL, NULL);
    adm_send_plan("GET", "/t1", "fail=1;status=503", "txt-1", 200);
    adm_send_plan("GET", "/t2", "fail=9;status=503", "txt-2", 503);
    char *out = NULL;
    int64_t deadline = now_ms() + ADM_SETTLE_MS;
    for (;;) {
        out = px_stdout(px);
        if (adm_count_raw(out, "route=r") >= 2 || now_ms() >= deadline)
            break;
        free(out);
        usleep(20000);
    }
    cr_expect_eq(adm_count_raw(out, "route=r"), 2, "want two request lines:\n%s", out);
    static const struct {
        const char *id, *status;
    } want[] = { { "txt-1", "200" }, { "txt-2", "503" } };
    for (size_t k = 0; k < 2; k++) {
        cr_expect_eq(adm_count_raw(out, want[k].id), 1, "%s is not on exactly one line:\n%s",
                     want[k].id, out);
        const char *at = strstr(out, want[k].id);
        if (!at)
            continue;
        const char *bol = at;
        while (bol > out && bol[-1] != '\n')
            bol--;
        const char *eol = strchr(at, '\n');
        char line[1024];
        snprintf(line, sizeof(line), "%.*s", (int)(eol ? eol - bol : (long)strlen(bol)), bol);
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        cr_expect_null(j, "a text line parses as JSON: %s", line);
        json_decref(j);
        cr_expect(strstr(line, "route=r"), "no route=r in: %s", line);
        /* the status as a word of its own ("200", "status=200", "-> 200") */
        bool found = false;
        char copy[1024];
        snprintf(copy, sizeof(copy), "%s", line);
        for (char *save, *w = strtok_r(copy, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
            const char *eq = strrchr(w, '=');
            found |= strcmp(eq ? eq + 1 : w, want[k].status) == 0;
        }
        cr_expect(found, "status %s is not in: %s", want[k].status, line);
    }
    free(out);
}

Test(admin, reload_success_and_failure_are_logged)
{
    adm_start("\"retry\": {" FAST "}");
    char cfg[1024];
    adm_route_cfg(cfg, sizeof(cfg),
                  "\"retry\": {\"backoff\": {\"base_ms\": 20, \"jitter\": \"none\"}}");
    adm_write_cfg(cfg);
    json_t *j = admin_json("POST", "/reload", 200);
    json_decref(j);
    size_t bad;
    json_t *lines = adm_wait_logs("config reloaded", NULL, 1, &bad);
    json_t *l;
    cr_expect_eq(bad, 0);
    cr_assert_eq(adm_count_msg(lines, "config reloaded", NULL, &l), 1,
                 "want one \"config reloaded\" line for one reload");
    cr_expect_str_eq(json_str(l, "level"), "info");
    expect_recent_time("reload time", json_str(l, "time"));
    json_decref(lines);

    adm_write_invalid_cfg();
    j = admin_json("POST", "/reload", 422);
    size_t n_errs = json_array_size(json_object_get(j, "errors"));
    json_decref(j);
    cr_assert_geq(n_errs, 2);
    int64_t deadline = now_ms() + ADM_SETTLE_MS;
    size_t n_lines;
    for (;;) {
        lines = adm_log_lines(&bad);
        n_lines = 0;
        size_t i;
        json_array_foreach(lines, i, l)
        {
            const char *lv = json_str(l, "level");
            n_lines += lv && strcmp(lv, "error") == 0;
        }
        if (n_lines >= n_errs || now_ms() >= deadline)
            break;
        json_decref(lines);
        usleep(20000);
    }
    cr_expect_eq(bad, 0);
    cr_expect_eq(n_lines, n_errs, "%zu error lines for %zu config errors", n_lines, n_errs);
    /* each error line names what is wrong, with its JSON path */
    size_t i, with_path = 0;
    json_array_foreach(lines, i, l)
    {
        const char *lv = json_str(l, "level");
        if (!lv || strcmp(lv, "error") != 0)
            continue;
        char *text = json_dumps(l, JSON_COMPACT);
        with_path += strstr(text, "$.routes[0].retry") != NULL;
        free(text);
    }
    cr_expect_eq(with_path, n_errs, "%zu of %zu error lines name a $.routes[0].retry path",
                 with_path, n_errs);
    cr_expect_eq(adm_count_msg(lines, "config reloaded", NULL, NULL), 1,
                 "a failed reload logged \"config reloaded\"");
    json_decref(lines);
}
