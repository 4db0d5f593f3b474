/* The admin suites' shared proxy and readers (admintest.h). */
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

#define T 20000 /* ms: upper bound for any single request of these helpers */

/* A tup and a proxy (two workers) with route "r" to it. 'top' holds extra top-level members,
 * 'route' extra members of route "r", 'more' a further route object (each of the three may be
 * ""); 'arg' and 'val' are one extra command-line option, or NULL. */
void adm_start_with(const char *top, const char *route, const char *more, const char *arg,
                    const char *val)
{
    fx_upstreams(1);
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "%s", top);
    cfgb_route(b, "r", "%s", route);
    if (*more) {
        /* a complete route object: its members go in as they are */
        size_t n = strlen(more);
        cr_assert(n >= 2 && more[0] == '{' && more[n - 1] == '}', "not an object: %s", more);
        cfgb_route(b, "", "%.*s", (int)(n - 2), more + 1);
    }
    fx_start_b(b, "--workers", "2", arg, val, NULL);
}

void adm_start(const char *route)
{
    adm_start_with("", route, "", NULL, NULL);
}

/* Rewrites the config file in place, as an operator's editor might. The proxy's watcher would
 * reload it some 100 ms later (debounce); the tests POST /reload at once, so theirs is the
 * reload that counts and the watcher then finds that content already tried. */
void adm_write_cfg(const char *json)
{
    FILE *f = fopen(px->cfg_path, "w");
    cr_assert_not_null(f, "cannot write %s", px->cfg_path);
    fputs(json, f);
    cr_assert_eq(fclose(f), 0);
}

/* The route "r" config of adm_start() with 'route' as its extra members. */
void adm_route_cfg(char *buf, size_t cap, const char *route)
{
    char *json = cfg_r("", route);
    cr_assert_lt(strlen(json), cap, "config text does not fit");
    snprintf(buf, cap, "%s", json);
    free(json);
}

/* ---- HTTP helpers ---- */

void admin_do(const char *method, const char *path, struct http_resp *r)
{
    char url[512];
    /* Methods other than GET and HEAD carry an empty body, so that the request has a
     * Content-Length and is unambiguous. */
    bool bodyless = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    http_do(method, px_admin_url(px, path, url, sizeof(url)), NULL, bodyless ? NULL : "", 0, T, r);
    cr_assert_eq(r->rc, 0, "%s %s: curl error %d", method, path, r->rc);
}

/* Parses a JSON answer, checking its status and Content-Type; the caller decrefs. */
json_t *admin_json(const char *method, const char *path, long want_status)
{
    struct http_resp r;
    admin_do(method, path, &r);
    cr_expect_eq(r.status, want_status, "%s %s: status %ld, want %ld (%s)", method, path, r.status,
                 want_status, r.body ? (char *)r.body : "");
    const char *ct = http_hdr(&r, "Content-Type");
    cr_expect(ct && strncmp(ct, "application/json", 16) == 0, "%s %s: Content-Type %s", method,
              path, ct ? ct : "(none)");
    json_error_t e;
    json_t *j = r.body ? json_loadb((const char *)r.body, r.body_len, 0, &e) : NULL;
    cr_assert_not_null(j, "%s %s: body is not JSON: %s", method, path,
                       r.body ? (char *)r.body : "(empty)");
    http_free(&r);
    return j;
}

/* Sends one proxied request; the caller frees. */
struct http_resp adm_send_req(const char *method, const char *path, const char *const *h,
                              const char *body)
{
    char url[512];
    struct http_resp r;
    http_do(method, px_url(px, path, url, sizeof(url)), h, body, body ? strlen(body) : 0, T, &r);
    cr_assert_eq(r.rc, 0, "%s %s: curl error %d", method, path, r.rc);
    return r;
}

/* A proxied request with a test plan and request id (a POST carries a one-byte body),
 * expecting 'want' as the final status. */
void adm_send_plan(const char *method, const char *path, const char *plan, const char *id,
                   long want)
{
    char ph[128], ih[128];
    snprintf(ph, sizeof(ph), "X-Test-Plan: %s", plan);
    snprintf(ih, sizeof(ih), "X-Request-Id: %s", id);
    const char *h[] = { ph, ih, NULL };
    bool post = strcmp(method, "POST") == 0;
    struct http_resp r = adm_send_req(method, path, h, post ? "x" : NULL);
    cr_expect_eq(r.status, want, "%s %s (%s): status %ld, want %ld", method, path, plan, r.status,
                 want);
    http_free(&r);
}

/* A blocking TCP connection to the proxy's listener. */
int adm_connect_proxy(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons(px->port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0, "socket: %s", strerror(errno));
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0, "connect: %s", strerror(errno));
    struct timeval tv = { .tv_sec = 5 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* ---- time ---- */

/* True when 's' is RFC 3339 UTC with milliseconds (2026-11-21T10:15:30.123Z) naming a real
 * instant; its Unix seconds go to *out. */
bool rfc3339_ms(const char *s, time_t *out)
{
    regex_t re;
    cr_assert_eq(regcomp(&re, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z$",
                         REG_EXTENDED | REG_NOSUB),
                 0);
    bool ok = s && regexec(&re, s, 0, NULL, 0) == 0;
    regfree(&re);
    if (!ok)
        return false;
    struct tm tm = { 0 };
    sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
           &tm.tm_min, &tm.tm_sec);
    int mon = tm.tm_mon, mday = tm.tm_mday, hour = tm.tm_hour, min = tm.tm_min, sec = tm.tm_sec;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t t = timegm(&tm);
    /* timegm normalises out-of-range fields: a changed field means it was not a real date */
    if (tm.tm_mon != mon - 1 || tm.tm_mday != mday || tm.tm_hour != hour || tm.tm_min != min ||
        tm.tm_sec != sec)
        return false;
    *out = t;
    return true;
}

/* The time field is a recent instant: guards against an epoch-zero or local-time stamp. */
void expect_recent_time(const char *what, const char *s)
{
    time_t t = 0;
    cr_expect(rfc3339_ms(s, &t), "%s is not RFC 3339 with milliseconds: %s", what,
              s ? s : "(null)");
    time_t now = time(NULL);
    cr_expect(t > now - 120 && t <= now + 5, "%s %s is not within the last two minutes", what,
              s ? s : "(null)");
}

/* ---- metrics ---- */

char *adm_scrape(void)
{
    struct http_resp r;
    admin_do("GET", "/metrics", &r);
    cr_assert_eq(r.status, 200, "GET /metrics: %ld", r.status);
    cr_assert_not_null(r.body, "GET /metrics: empty body");
    char *text = (char *)r.body;
    r.body = NULL;
    http_free(&r);
    return text;
}

/* The value of series name{labels} ("" for none) as prom_sum() reads it: label order does not
 * matter (it does not in the format), labels left out are summed over; NAN if none matches. */
double adm_metric(const char *text, const char *name, const char *labels)
{
    char series[1024];
    snprintf(series, sizeof(series), "%s%s%s%s", name, *labels ? "{" : "", labels,
             *labels ? "}" : "");
    return prom_sum(text, series);
}

void adm_expect_metric(const char *text, const char *name, const char *labels, double want)
{
    double v = adm_metric(text, name, labels);
    if (isnan(v))
        cr_expect_fail("%s{%s} is missing from /metrics, want %g", name, labels, want);
    else
        cr_expect(v == want, "%s{%s} = %g, want %g", name, labels, v, want);
}

/* Polls /metrics until the series equals 'want'; returns the last value seen. */
double adm_wait_metric(const char *name, const char *labels, double want, int timeout_ms)
{
    int64_t deadline = now_ms() + timeout_ms;
    double v;
    for (;;) {
        char *text = adm_scrape();
        v = adm_metric(text, name, labels);
        free(text);
        if (v == want || now_ms() >= deadline)
            return v;
        usleep(20000);
    }
}

/* ---- logs ---- */

/* Every complete stdout line parsed as JSON, in order; *bad counts lines that are not a JSON
 * object. The caller decrefs. */
json_t *adm_log_lines(size_t *bad)
{
    char *out = px_stdout(px);
    json_t *arr = json_array();
    *bad = 0;
    for (char *line = out, *end; (end = strchr(line, '\n')) != NULL; line = end + 1) {
        *end = '\0';
        json_error_t e;
        json_t *j = json_loads(line, JSON_REJECT_DUPLICATES, &e);
        if (json_is_object(j)) {
            json_array_append_new(arr, j);
        } else {
            json_decref(j);
            cr_log_error("stdout line is not a JSON object: %s", line);
            (*bad)++;
        }
    }
    free(out);
    return arr;
}

/* Lines whose msg is 'msg' (and request_id 'rid', unless NULL); the first goes to *first. */
size_t adm_count_msg(const json_t *lines, const char *msg, const char *rid, json_t **first)
{
    size_t n = 0, i;
    json_t *l;
    if (first)
        *first = NULL;
    json_array_foreach(lines, i, l)
    {
        const char *m = json_str(l, "msg"), *id = json_str(l, "request_id");
        if (!m || strcmp(m, msg) != 0 || (rid && (!id || strcmp(id, rid) != 0)))
            continue;
        if (first && !*first)
            *first = l;
        n++;
    }
    return n;
}

/* Polls stdout until at least n lines match (msg, rid), for up to ADM_SETTLE_MS; returns the
 * lines (the caller decrefs) with the number of non-JSON lines in *bad. */
json_t *adm_wait_logs(const char *msg, const char *rid, size_t n, size_t *bad)
{
    int64_t deadline = now_ms() + ADM_SETTLE_MS;
    for (;;) {
        json_t *lines = adm_log_lines(bad);
        if (adm_count_msg(lines, msg, rid, NULL) >= n || now_ms() >= deadline)
            return lines;
        json_decref(lines);
        usleep(20000);
    }
}

/* Lines of stdout containing 'needle'. */
size_t adm_count_raw(const char *out, const char *needle)
{
    size_t n = 0;
    for (const char *line = out, *end; *line; line = end ? end + 1 : line + strlen(line)) {
        end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (memmem(line, len, needle, strlen(needle)))
            n++;
        if (!end)
            break;
    }
    return n;
}

/* Two mistakes an operator makes: a typo'd key and an out-of-range value. */
void adm_write_invalid_cfg(void)
{
    char cfg[1024];
    adm_route_cfg(cfg, sizeof(cfg),
                  "\"retry\": {\"max_attempts\": 0, \"backoff\": {\"bsae_ms\": 10}}");
    adm_write_cfg(cfg);
}
