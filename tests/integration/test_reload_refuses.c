/* Hot reload (docs/reload.md), end to end: the files a reload refuses (invalid, a FIFO, over
 * the size limit, thousands of duplicate keys), each refused quickly with the running config
 * kept and the path reported (tests/support/reloadtest.h). */
#include "tests/support/reloadtest.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <curl/curl.h>
#include <jansson.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/fixture.h"

TestSuite(reload, .init = rl_setup, .fini = rl_teardown, .timeout = 60);

Test(reload, invalid_file_keeps_the_running_config_and_reports_the_path)
{
    rl_start(3, 20);
    cr_expect_eq(fx_metric(LAST_OK), 1, "the initial load succeeded");
    char bad[2048], err[4096];
    cfg_text(bad, sizeof(bad), 1, 40, "bsae_ms", "");
    int64_t t0 = now_ms();
    write_renamed(rl_cfg_path, bad);
    int64_t lat = rl_wait_metric(t0, FAILURES, 1, VISIBLE_MS);
    cr_log_info("invalid file: failure counted after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "no failed reload counted within %d ms", VISIBLE_MS);
    cr_expect_eq(fx_metric(LAST_OK), 0, "the refused file is the last one tried");
    sleep_ms(SETTLE_MS); /* a second count for the same content would show up by now */
    cr_expect_eq(fx_metric(FAILURES), 1, "one bad write, one failure");
    cr_expect_eq(fx_metric(LAST_OK), 0, "stays 0 while the refused file is on disk");

    json_t *c = rl_get_config();
    const char *e = last_error_of(c, err, sizeof(err));
    cr_assert_not_null(e, "last_error is null after a failed reload");
    cr_expect(strstr(e, "$.routes[0].retry.backoff.bsae_ms") != NULL,
              "last_error does not name the JSON path: %s", e);
    cr_expect_eq(generation_of(c), 1, "an invalid file must not be published");
    cr_expect_eq(base_ms_of(c), 20);
    json_decref(c);
    expect_max_attempts("during", 3);

    /* "logs every error": a JSON error line on stdout carrying the path. */
    char *out = px_stdout(px);
    bool logged = false;
    for (char *line = strtok(out, "\n"); line && !logged; line = strtok(NULL, "\n")) {
        json_t *j = json_loads(line, 0, NULL);
        const char *level = json_string_value(json_object_get(j, "level"));
        const char *text = json_string_value(json_object_get(j, "error"));
        logged = level && strcmp(level, "error") == 0 && text &&
                 strstr(text, "$.routes[0].retry.backoff.bsae_ms") != NULL;
        json_decref(j);
    }
    free(out);
    cr_expect(logged, "no JSON error log line names $.routes[0].retry.backoff.bsae_ms");

    char good[2048];
    cfg_simple(good, sizeof(good), 1, 40);
    t0 = now_ms();
    write_renamed(rl_cfg_path, good);
    lat = wait_config(t0, 2, 40, VISIBLE_MS);
    cr_log_info("valid file after an invalid one: applied after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "the corrected file was not applied within %d ms", VISIBLE_MS);
    c = rl_get_config();
    cr_expect_eq(generation_of(c), 2, "the invalid file used no generation");
    cr_expect_null(last_error_of(c, err, sizeof(err)), "last_error stays after success: %s", err);
    json_decref(c);
    cr_expect_eq(fx_metric(FAILURES), 1);
    cr_expect_eq(fx_metric(LAST_OK), 1, "the corrected file loaded");
    expect_max_attempts("fixed", 1);
}

/* The budget_* gauges of route r ('scope="route"') or of the process ('scope="process"'). */
/* ---- issue 9: files the reload must refuse quickly, and links it must see through ---- */

/* GET /healthz with a short timeout: the control thread answers within 'limit_ms'. Returns
 * the milliseconds it took. */
static int64_t healthz_ms(int limit_ms)
{
    char url[128];
    struct http_resp r;
    int64_t t0 = now_ms();
    http_do("GET", px_admin_url(px, "/healthz", url, sizeof(url)), NULL, NULL, 0, limit_ms, &r);
    int64_t ms = now_ms() - t0;
    cr_assert_eq(r.rc, 0, "GET /healthz: curl error %d after %lld ms (control thread stuck?)", r.rc,
                 (long long)ms);
    cr_assert_eq(r.status, 200);
    http_free(&r);
    return ms;
}

struct want_error {
    const char *needle;
    char *err;
    size_t cap;
};

static bool error_holds(json_t *c, void *arg)
{
    const struct want_error *w = arg;
    const char *e = last_error_of(c, w->err, w->cap);
    return e && strstr(e, w->needle);
}

/* Waits until /config's last_error holds 'needle'; milliseconds since 't0' or -1. */
static int64_t wait_last_error(int64_t t0, const char *needle, int timeout_ms, char *err,
                               size_t cap)
{
    struct want_error w = { needle, err, cap };
    return poll_config(t0, timeout_ms, error_holds, &w);
}

/* The running config stays after a refused file, and a good file afterwards applies. */
static void expect_recovery(void)
{
    cr_expect_eq(generation_now(), 1, "a refused file must not be published");
    cr_expect_eq(base_ms_now(), 20);
    expect_max_attempts("during", 3);
    char text[2048];
    cfg_simple(text, sizeof(text), 1, 40);
    int64_t t0 = now_ms();
    write_renamed(rl_cfg_path, text);
    int64_t lat = wait_config(t0, 2, 40, VISIBLE_MS);
    cr_assert(lat >= 0, "a good file after the refused one not applied within %d ms", VISIBLE_MS);
    expect_max_attempts("after", 1);
}

/* A FIFO renamed over the config: the watch reloads, and opening a FIFO for reading would
 * wait for a writer, stalling the control thread (admin API, signals, reloads) for good. */
Test(reload, fifo_at_the_config_path_is_refused_without_stalling_the_control_thread)
{
    rl_start(3, 20);
    char fifo[160], err[4096];
    snprintf(fifo, sizeof(fifo), "%s/config.fifo", rl_dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0, "mkfifo: %s", strerror(errno));
    int64_t t0 = now_ms();
    cr_assert_eq(rename(fifo, rl_cfg_path), 0);
    int64_t lat = wait_last_error(t0, "not a regular file (a FIFO)", VISIBLE_MS, err, sizeof(err));
    cr_log_info("FIFO at the config path: refused after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "no 'not a regular file (a FIFO)' in last_error within %d ms: %s",
              VISIBLE_MS, err);
    cr_expect(strstr(err, rl_cfg_path) != NULL, "last_error does not name the file: %s", err);
    cr_expect_eq(fx_metric(FAILURES), 1);

    /* Past the 2 s poll, which reads the path too: the control thread still answers. */
    for (int i = 0; i < 6; i++) {
        cr_expect_lt(healthz_ms(1000), 1000);
        sleep_ms(400);
    }
    long status;
    t0 = now_ms();
    json_t *j = fx_admin_json("POST", "/reload", &status);
    cr_expect_eq(status, 422, "POST /reload of a FIFO: %ld", status);
    cr_expect_lt(now_ms() - t0, 1000, "POST /reload of a FIFO took %lld ms",
                 (long long)(now_ms() - t0));
    json_decref(j);
    cr_assert_eq(kill(px->pid, SIGHUP), 0);
    cr_expect_lt(healthz_ms(1000), 1000);

    cr_assert_eq(unlink(rl_cfg_path), 0);
    expect_recovery();
}

/* A file above the 4 MiB limit: refused on reload with the limit in the message, the running
 * config untouched. */
Test(reload, file_above_the_size_limit_is_refused_and_the_running_config_stays)
{
    rl_start(3, 20);
    char text[2048], err[4096];
    cfg_simple(text, sizeof(text), 1, 40);
    size_t len = (4u << 20) + 1;
    char *big = malloc(len);
    memset(big, ' ', len);
    memcpy(big, text, strlen(text)); /* a valid config, padded */
    char tmp[160];
    snprintf(tmp, sizeof(tmp), "%s.big", rl_cfg_path);
    write_in_place(tmp, big, len);
    free(big);
    int64_t t0 = now_ms();
    cr_assert_eq(rename(tmp, rl_cfg_path), 0);
    int64_t lat =
        wait_last_error(t0, "larger than 4 MiB (4194304 bytes), the limit for a config file",
                        VISIBLE_MS, err, sizeof(err));
    cr_log_info("file above 4 MiB: refused after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "the size limit not reported within %d ms: %s", VISIBLE_MS, err);
    char want[256];
    snprintf(want, sizeof(want), "%s: $: larger than 4 MiB", rl_cfg_path);
    cr_expect(strstr(err, want) != NULL, "last_error does not name the file: %s", err);
    cr_expect_eq(fx_metric(FAILURES), 1);
    expect_recovery();
}

/* Issue 9: the same file that took 30 s to check stalled the control thread 49 s when it
 * was hot-reloaded. Now it is refused at once and health checks never wait. */
Test(reload, file_with_20000_duplicate_entries_is_refused_at_once)
{
    rl_start(3, 20);
    size_t n = 20000;
    static char err[65536]; /* 200 errors and the count of the rest */
    char *text = malloc(n * 8 + 512), *p = text;
    p += sprintf(p,
                 "{\"routes\": [{\"name\": \"r\", \"upstreams\": [\"http://127.0.0.1:%u\"],\n"
                 "  \"retry\": {\"retry_on\": [",
                 tup_port(up));
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%s\"429\"", i ? ", " : "");
    p += sprintf(p, "]}}]}\n");
    char tmp[160];
    snprintf(tmp, sizeof(tmp), "%s.dup", rl_cfg_path);
    write_in_place(tmp, text, (size_t)(p - text));
    free(text);
    int64_t t0 = now_ms();
    cr_assert_eq(rename(tmp, rl_cfg_path), 0);
    int64_t lat = rl_wait_metric(t0, FAILURES, 1, VISIBLE_MS);
    cr_log_info("20,000 duplicate retry_on entries: refused after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "the reload was not refused within %d ms", VISIBLE_MS);
    cr_expect_lt(healthz_ms(1000), 1000);
    json_t *c = rl_get_config();
    const char *e = last_error_of(c, err, sizeof(err));
    cr_assert_not_null(e);
    cr_expect(strstr(e, "$.routes[0].retry.retry_on[1]: \"429\" is listed twice") != NULL, "%.300s",
              e);
    cr_expect(strstr(e, "(19799 more errors not shown)") != NULL, "no count of the rest");
    json_decref(c);
    expect_recovery();
}

/* kubelet's layout, the real file then written in place (what `kubectl cp` or a debugging
 * operator does, and what some config agents do): the write lands in ..TIMESTAMP/, not in the
 * watched directory. Seen through the watch on the link's target, not the 2 s poll: every one
 * of several writes (each at a different phase of the poll) applies within a second. */
