/* The reload suites' shared config files and admin readers (reloadtest.h). */
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

#define T 20000 /* ms: upper bound for any single request of these helpers */

char rl_dir[64]; /* the config's directory */

const char *rl_cfg_path = fx_cfg_path; /* rl_dir/config.json */

/* The request of request_in_flight_keeps_the_policy_it_started_with, sent from its own thread so
 * that the config can change while it waits. */
struct http_call rl_flight;

void rl_setup(void)
{
    /* The in-flight test runs libcurl in two threads: initialise it once, before any of them. */
    fx_init_curl();
    fx_upstreams(1);
    snprintf(rl_dir, sizeof(rl_dir), "%s", fx_config_dir("reload"));
}

void rl_teardown(void)
{
    http_call_join(&rl_flight);
    http_free(&rl_flight.r);
    fx_stop();
    rl_dir[0] = '\0';
}

/* ---- config files ---- */

/* The config text: route "r" to tup, 'max_attempts', a fixed backoff of 'base_ms' under the
 * key 'base_key' ("base_ms", or a typo), and 'top' (complete members with a trailing comma, or
 * "") first. Several lines, so that error positions have a line and a column to check. */
void cfg_text(char *buf, size_t cap, int max_attempts, int base_ms, const char *base_key,
              const char *top)
{
    int n = snprintf(buf, cap,
                     "{\n"
                     "  %s\n"
                     "  \"routes\": [\n"
                     "    {\n"
                     "      \"name\": \"r\",\n"
                     "      \"upstreams\": [\"http://127.0.0.1:%u\"],\n"
                     "      \"retry\": {\"max_attempts\": %d,\n"
                     "                \"backoff\": {\"policy\": \"fixed\", \"%s\": %d, "
                     "\"jitter\": \"none\"}}\n"
                     "    }\n"
                     "  ]\n"
                     "}\n",
                     top, tup_port(up), max_attempts, base_key, base_ms);
    cr_assert(n > 0 && (size_t)n < cap, "config text does not fit");
}

void cfg_simple(char *buf, size_t cap, int max_attempts, int base_ms)
{
    cfg_text(buf, cap, max_attempts, base_ms, "base_ms", "");
}

/* open(O_TRUNC) + write: the file keeps its inode and is briefly empty or partial. */
void write_in_place(const char *path, const char *text, size_t len)
{
    cfg_write_in_place(path, text, len);
}

/* An editor's save: the whole new content under a temporary name in the same directory, then
 * rename(2) over the config (a new inode appears atomically). */
void write_renamed(const char *path, const char *text)
{
    cfg_write_renamed(path, text);
}

/* ---- the proxy and its admin API ---- */

/* Starts the proxy on rl_cfg_path, with the listeners on free ports given on the command line
 * ('pin_listeners') or taken from the file. */
void rl_launch(bool pin_listeners)
{
    const char *pinned[] = { "-c",          rl_cfg_path, "--listen", "127.0.0.1:0", "--admin",
                             "127.0.0.1:0", "--workers", "2",        NULL };
    const char *unpinned[] = { "-c", rl_cfg_path, "--workers", "2", NULL };
    fx_start_argv(pin_listeners ? pinned : unpinned);
}

json_t *rl_get_config(void)
{
    return fx_admin_get_json("/config");
}

long generation_of(const json_t *c)
{
    json_t *g = json_object_get(c, "generation");
    cr_assert(json_is_integer(g), "/config has no integer generation");
    return (long)json_integer_value(g);
}

/* routes[0].retry.backoff.base_ms of the effective config, -1 if absent. */
long base_ms_of(const json_t *c)
{
    json_t *route = json_array_get(json_object_get(json_object_get(c, "config"), "routes"), 0);
    json_t *b =
        json_object_get(json_object_get(json_object_get(route, "retry"), "backoff"), "base_ms");
    return json_is_integer(b) ? (long)json_integer_value(b) : -1;
}

/* /config's last_error (NULL when it is JSON null), copied into 'buf'. */
const char *last_error_of(const json_t *c, char *buf, size_t cap)
{
    json_t *e = json_object_get(c, "last_error");
    cr_assert(json_is_null(e) || json_is_string(e), "last_error is neither null nor a string");
    if (json_is_null(e))
        return NULL;
    snprintf(buf, cap, "%s", json_string_value(e));
    return buf;
}

long generation_now(void)
{
    json_t *c = rl_get_config();
    long g = generation_of(c);
    json_decref(c);
    return g;
}

long base_ms_now(void)
{
    json_t *c = rl_get_config();
    long b = base_ms_of(c);
    json_decref(c);
    return b;
}

/* The two delays /schedule gives route r with a fixed seed. Checked apart from /config
 * because it goes through the published runtime's policy, not the config's JSON rendering. */
void schedule2(long *d1, long *d2)
{
    json_t *s = fx_admin_get_json("/schedule?route=r&retries=2&seed=7");
    cr_expect_eq(json_integer_value(json_object_get(s, "seed")), 7);
    json_t *d = json_object_get(s, "delays_ms");
    cr_assert(json_is_array(d) && json_array_size(d) == 2, "delays_ms is not 2 delays");
    *d1 = (long)json_integer_value(json_array_get(d, 0));
    *d2 = (long)json_integer_value(json_array_get(d, 1));
    json_decref(s);
}

/* The first delay of route r's fixed policy without jitter: exactly base_ms, both times. */
long schedule_delay(void)
{
    long first, second;
    schedule2(&first, &second);
    cr_expect_eq(second, first, "fixed policy, no jitter");
    return first;
}

/* Polls /config every 20 ms until 'ok' holds for it. Returns the milliseconds since 't0'
 * (the write), or -1 after 'timeout_ms'. */
int64_t poll_config(int64_t t0, int timeout_ms, bool (*ok)(json_t *c, void *arg), void *arg)
{
    for (;;) {
        json_t *c = rl_get_config();
        bool done = ok(c, arg);
        json_decref(c);
        int64_t now = now_ms();
        if (done)
            return now - t0;
        if (now - t0 > timeout_ms)
            return -1;
        sleep_ms(20);
    }
}

bool config_is(json_t *c, void *arg)
{
    const struct want_config *w = arg;
    return (w->gen < 0 || generation_of(c) >= w->gen) && (w->base < 0 || base_ms_of(c) == w->base);
}

/* Waits until 'generation' reaches 'gen' (if >= 0) and base_ms equals 'base' (if >= 0). */
int64_t wait_config(int64_t t0, long gen, long base, int timeout_ms)
{
    struct want_config w = { gen, base };
    return poll_config(t0, timeout_ms, config_is, &w);
}

/* fx_wait_metric() for 'timeout_ms' from 't0': the milliseconds since 't0' when 'series'
 * reached 'want', or -1. */
int64_t rl_wait_metric(int64_t t0, const char *series, double want, int timeout_ms)
{
    bool ok = fx_wait_metric(series, want, (int)(t0 + timeout_ms - now_ms())) == want;
    return ok ? now_ms() - t0 : -1;
}

/* ---- the reload log ---- */

/* The "trigger" of the "config reloaded" log line for generation 'gen' (copied into 'buf'),
 * polled from the proxy's stdout for up to EVENT_MS (the line follows the publication the
 * test saw in /config), or NULL if there is none: "replaced" (the watch saw a complete change
 * and read it at once), "changed" (a change in progress, read after the debounce), "poll" or
 * "forced". */
const char *reload_trigger(long gen, char *buf, size_t cap)
{
    int64_t t0 = now_ms();
    for (;;) {
        char *out = px_stdout(px);
        const char *found = NULL;
        char *save = NULL;
        for (char *line = strtok_r(out, "\n", &save); line && !found;
             line = strtok_r(NULL, "\n", &save)) {
            json_t *j = json_loads(line, 0, NULL);
            const char *msg = json_string_value(json_object_get(j, "msg"));
            json_t *g = json_object_get(j, "generation"); /* a JSON number (docs/logs.md) */
            if (msg && strcmp(msg, "config reloaded") == 0 && json_is_integer(g) &&
                json_integer_value(g) == gen) {
                const char *t = json_string_value(json_object_get(j, "trigger"));
                snprintf(buf, cap, "%s", t ? t : "(none)");
                found = buf;
            }
            json_decref(j);
        }
        free(out);
        if (found || now_ms() - t0 > EVENT_MS)
            return found;
        sleep_ms(20);
    }
}

/* Generation 'gen' was published through the path 'want' ("replaced" or "changed"). The 2 s
 * content poll may get there first, in the moment between a change and the reading of its
 * event (a race of microseconds per 2 s), so "poll" passes too: it never stands for the
 * debounce. */
void expect_trigger(long gen, const char *want, const char *what)
{
    char t[32];
    const char *got = reload_trigger(gen, t, sizeof(t));
    cr_assert_not_null(got, "%s: no \"config reloaded\" line for generation %ld", what, gen);
    cr_expect(strcmp(got, want) == 0 || strcmp(got, "poll") == 0,
              "%s: generation %ld was reloaded by \"%s\", want \"%s\"", what, gen, got, want);
}

/* ---- requests through the proxy ---- */

/* GET through the proxy with request id 'id' and tup plan 'plan'; returns X-Retry-Attempts
 * (-1 if missing) and the status in '*status'. */
int rl_attempts(const char *id, const char *plan, long *status)
{
    char url[128], idh[96], planh[96], v[32];
    snprintf(idh, sizeof(idh), "X-Request-Id: %s", id);
    snprintf(planh, sizeof(planh), "X-Test-Plan: %s", plan);
    const char *h[] = { idh, planh, NULL };
    struct http_resp r;
    http_do("GET", px_url(px, "/x", url, sizeof(url)), h, NULL, 0, T, &r);
    cr_assert_eq(r.rc, 0, "request %s: curl error %d", id, r.rc);
    const char *a = http_header(&r, "X-Retry-Attempts", v, sizeof(v));
    int n = a ? atoi(a) : -1;
    *status = r.status;
    http_free(&r);
    return n;
}

/* An always-failing request: shows the max_attempts in force (and its tup count agrees). */
void expect_max_attempts(const char *id, int want)
{
    long status;
    int n = rl_attempts(id, "fail=5;status=503", &status);
    cr_expect_eq(n, want, "%s: X-Retry-Attempts %d, want %d", id, n, want);
    cr_expect_eq(status, 503, "%s: status %ld", id, status);
    cr_expect_eq(tup_count_id(up, id), (size_t)want, "%s: upstream saw %zu attempts, want %d", id,
                 tup_count_id(up, id), want);
}

/* Writes the initial config (max_attempts, base_ms) and starts the proxy on it. */
void rl_start(int max_attempts, int base_ms)
{
    char text[2048];
    cfg_simple(text, sizeof(text), max_attempts, base_ms);
    write_in_place(rl_cfg_path, text, strlen(text));
    rl_launch(true);
    json_t *c = rl_get_config();
    cr_assert_eq(generation_of(c), 1, "the config read at start is generation 1");
    cr_assert_eq(base_ms_of(c), base_ms);
    cr_assert_str_eq(json_string_value(json_object_get(c, "source")), rl_cfg_path);
    json_decref(c);
}
