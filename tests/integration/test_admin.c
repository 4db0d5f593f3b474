/* The admin listener, metrics and logs, end to end (docs/admin.md, docs/metrics.md,
 * docs/logs.md): the real binary
 * against the test upstream on 127.0.0.1, its admin port queried over HTTP and its stdout read
 * back as log lines. */
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

#define T 20000 /* ms: upper bound for any single request in these tests */
/* Log lines are flushed once per event-loop turn and metrics settle soon after a response:
 * how long to poll for them before asserting. */
#define SETTLE_MS 2000
#define FAST      CFG_FAST

TestSuite(admin, .fini = fx_stop, .timeout = 60);

/* A tup and a proxy (two workers) with route "r" to it. 'top' holds extra top-level members,
 * 'route' extra members of route "r", 'more' a further route object (each of the three may be
 * ""); 'arg' and 'val' are one extra command-line option, or NULL. */
static void start_with(const char *top, const char *route, const char *more, const char *arg,
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

static void start(const char *route)
{
    start_with("", route, "", NULL, NULL);
}

/* Rewrites the config file in place, as an operator's editor might. The proxy's watcher would
 * reload it some 100 ms later (debounce); the tests POST /reload at once, so theirs is the
 * reload that counts and the watcher then finds that content already tried. */
static void write_cfg(const char *json)
{
    FILE *f = fopen(px->cfg_path, "w");
    cr_assert_not_null(f, "cannot write %s", px->cfg_path);
    fputs(json, f);
    cr_assert_eq(fclose(f), 0);
}

/* The route "r" config of start() with 'route' as its extra members. */
static void route_cfg(char *buf, size_t cap, const char *route)
{
    char *json = cfg_r("", route);
    cr_assert_lt(strlen(json), cap, "config text does not fit");
    snprintf(buf, cap, "%s", json);
    free(json);
}

/* ---- HTTP helpers ---- */

static void admin_do(const char *method, const char *path, struct http_resp *r)
{
    char url[512];
    /* Methods other than GET and HEAD carry an empty body, so that the request has a
     * Content-Length and is unambiguous. */
    bool bodyless = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    http_do(method, px_admin_url(px, path, url, sizeof(url)), NULL, bodyless ? NULL : "", 0, T, r);
    cr_assert_eq(r->rc, 0, "%s %s: curl error %d", method, path, r->rc);
}

/* Parses a JSON answer, checking its status and Content-Type; the caller decrefs. */
static json_t *admin_json(const char *method, const char *path, long want_status)
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
static struct http_resp send_req(const char *method, const char *path, const char *const *h,
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
static void send_plan(const char *method, const char *path, const char *plan, const char *id,
                      long want)
{
    char ph[128], ih[128];
    snprintf(ph, sizeof(ph), "X-Test-Plan: %s", plan);
    snprintf(ih, sizeof(ih), "X-Request-Id: %s", id);
    const char *h[] = { ph, ih, NULL };
    bool post = strcmp(method, "POST") == 0;
    struct http_resp r = send_req(method, path, h, post ? "x" : NULL);
    cr_expect_eq(r.status, want, "%s %s (%s): status %ld, want %ld", method, path, plan, r.status,
                 want);
    http_free(&r);
}

/* A blocking TCP connection to the proxy's listener. */
static int connect_proxy(void)
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
static bool rfc3339_ms(const char *s, time_t *out)
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
static void expect_recent_time(const char *what, const char *s)
{
    time_t t = 0;
    cr_expect(rfc3339_ms(s, &t), "%s is not RFC 3339 with milliseconds: %s", what,
              s ? s : "(null)");
    time_t now = time(NULL);
    cr_expect(t > now - 120 && t <= now + 5, "%s %s is not within the last two minutes", what,
              s ? s : "(null)");
}

/* ---- metrics ---- */

static char *scrape(void)
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
static double metric(const char *text, const char *name, const char *labels)
{
    char series[1024];
    snprintf(series, sizeof(series), "%s%s%s%s", name, *labels ? "{" : "", labels,
             *labels ? "}" : "");
    return prom_sum(text, series);
}

static void expect_metric(const char *text, const char *name, const char *labels, double want)
{
    double v = metric(text, name, labels);
    if (isnan(v))
        cr_expect_fail("%s{%s} is missing from /metrics, want %g", name, labels, want);
    else
        cr_expect(v == want, "%s{%s} = %g, want %g", name, labels, v, want);
}

/* Polls /metrics until the series equals 'want'; returns the last value seen. */
static double wait_metric(const char *name, const char *labels, double want, int timeout_ms)
{
    int64_t deadline = now_ms() + timeout_ms;
    double v;
    for (;;) {
        char *text = scrape();
        v = metric(text, name, labels);
        free(text);
        if (v == want || now_ms() >= deadline)
            return v;
        usleep(20000);
    }
}

/* ---- logs ---- */

/* Every complete stdout line parsed as JSON, in order; *bad counts lines that are not a JSON
 * object. The caller decrefs. */
static json_t *log_lines(size_t *bad)
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
static size_t count_msg(const json_t *lines, const char *msg, const char *rid, json_t **first)
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

/* Polls stdout until at least n lines match (msg, rid), for up to SETTLE_MS; returns the
 * lines (the caller decrefs) with the number of non-JSON lines in *bad. */
static json_t *wait_logs(const char *msg, const char *rid, size_t n, size_t *bad)
{
    int64_t deadline = now_ms() + SETTLE_MS;
    for (;;) {
        json_t *lines = log_lines(bad);
        if (count_msg(lines, msg, rid, NULL) >= n || now_ms() >= deadline)
            return lines;
        json_decref(lines);
        usleep(20000);
    }
}

/* Lines of stdout containing 'needle'. */
static size_t count_raw(const char *out, const char *needle)
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

/* ================================ endpoints ================================ */

Test(admin, healthz_readyz_and_metrics_answer)
{
    start("");
    json_t *j = admin_json("GET", "/healthz", 200);
    cr_expect_str_eq(json_str(j, "status"), "ok");
    json_decref(j);

    j = admin_json("GET", "/readyz", 200);
    cr_expect_str_eq(json_str(j, "status"), "ready");
    json_decref(j);

    struct http_resp r;
    admin_do("GET", "/metrics", &r);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_hdr(&r, "Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
    cr_expect(r.body && strstr((char *)r.body, "# TYPE retryproxy_requests_total counter\n"),
              "no requests_total family in:\n%s", r.body ? (char *)r.body : "");
    http_free(&r);
}

/* "config" is the config in force: the listeners' bound addresses (the harness asks for port 0)
 * and the log settings the command line pins, over the file's. */
Test(admin, config_shows_the_addresses_bound_and_the_command_lines_log_level)
{
    start_with("\"log\": {\"level\": \"info\", \"format\": \"json\"}", "", "", "--log-level",
               "warn");
    json_t *j = admin_json("GET", "/config", 200);
    json_t *c = json_object_get(j, "config");
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%u", (unsigned)px->port);
    cr_expect_str_eq(json_str(c, "listen"), want);
    snprintf(want, sizeof(want), "127.0.0.1:%u", (unsigned)px->admin_port);
    cr_expect_str_eq(json_str(c, "admin"), want);
    json_t *log = json_object_get(c, "log");
    cr_expect_str_eq(json_str(log, "level"), "warn", "the command line's, not the file's info");
    cr_expect_str_eq(json_str(log, "format"), "json", "the file's: no --log-format given");
    json_decref(j);
}

Test(admin, config_reports_generation_source_and_filled_defaults)
{
    start("");
    json_t *j = admin_json("GET", "/config", 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "generation")), 1);
    cr_expect(json_is_integer(json_object_get(j, "generation")), "generation is not an integer");
    expect_recent_time("loaded_at", json_str(j, "loaded_at"));
    cr_expect_str_eq(json_str(j, "source"), px->cfg_path);
    cr_expect(json_is_null(json_object_get(j, "last_error")), "last_error is not null");
    json_t *rr = json_object_get(j, "restart_required");
    cr_expect(json_is_array(rr) && json_array_size(rr) == 0, "restart_required is not []");

    json_t *route = json_array_get(json_object_get(json_object_get(j, "config"), "routes"), 0);
    cr_assert_not_null(route, "config.routes[0] is missing");
    cr_expect_str_eq(json_str(route, "name"), "r");
    json_t *b = json_object_get(json_object_get(route, "retry"), "backoff");
    cr_assert(json_is_object(b), "config.routes[0].retry.backoff is not an object");
    /* Every key of the contract's example, with the default it shows. */
    static const struct {
        const char *key;
        const char *s; /* string default, or NULL for a number */
        double n;
    } defs[] = {
        { "policy", "exponential", 0 }, { "base_ms", NULL, 100 }, { "cap_ms", NULL, 10000 },
        { "factor", NULL, 2.0 },        { "steps", NULL, 0 },     { "jitter", "full", 0 },
        { "jitter_ratio", NULL, 0.2 },  { "jitter_ms", NULL, 0 }, { "scope", "request", 0 },
        { "reset_after_ms", NULL, 0 },
    };
    for (size_t i = 0; i < sizeof(defs) / sizeof(defs[0]); i++) {
        json_t *v = json_object_get(b, defs[i].key);
        if (defs[i].s) {
            cr_expect(json_is_string(v) && strcmp(json_string_value(v), defs[i].s) == 0,
                      "backoff.%s is not \"%s\"", defs[i].key, defs[i].s);
        } else {
            cr_expect(json_is_number(v) && fabs(json_number_value(v) - defs[i].n) < 1e-9,
                      "backoff.%s = %g (%s), want %g", defs[i].key, json_number_value(v),
                      v ? "present" : "missing", defs[i].n);
        }
    }
    cr_expect_eq(json_object_size(b), sizeof(defs) / sizeof(defs[0]),
                 "backoff has %zu keys, want %zu", json_object_size(b),
                 sizeof(defs) / sizeof(defs[0]));
    json_decref(j);
}

Test(admin, head_answers_like_get)
{
    start("");
    static const char *const paths[] = { "/healthz", "/readyz", "/metrics", "/config",
                                         "/schedule?route=r&seed=1" };
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        struct http_resp g, h;
        admin_do("GET", paths[i], &g);
        admin_do("HEAD", paths[i], &h);
        cr_expect_eq(g.status, 200, "GET %s: %ld", paths[i], g.status);
        cr_expect_eq(h.status, 200, "HEAD %s: %ld", paths[i], h.status);
        char ct[256];
        snprintf(ct, sizeof(ct), "%s",
                 http_hdr(&g, "Content-Type") ? http_hdr(&g, "Content-Type") : "");
        const char *hct = http_hdr(&h, "Content-Type");
        cr_expect(hct && strcmp(hct, ct) == 0, "HEAD %s: Content-Type %s, GET gave %s", paths[i],
                  hct ? hct : "(none)", ct);
        cr_expect_eq(h.body_len, 0, "HEAD %s sent a body", paths[i]);
        http_free(&g);
        http_free(&h);
    }
}

Test(admin, other_methods_are_405_with_allow)
{
    start("");
    static const char *const paths[] = { "/healthz", "/readyz", "/metrics", "/config",
                                         "/schedule" };
    static const char *const methods[] = { "POST", "PUT", "DELETE" };
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        for (size_t k = 0; k < sizeof(methods) / sizeof(methods[0]); k++) {
            struct http_resp r;
            admin_do(methods[k], paths[i], &r);
            cr_expect_eq(r.status, 405, "%s %s: %ld", methods[k], paths[i], r.status);
            const char *allow = http_hdr(&r, "Allow");
            cr_expect(allow && strstr(allow, "GET") && !strstr(allow, methods[k]),
                      "%s %s: Allow %s", methods[k], paths[i], allow ? allow : "(none)");
            const char *ct = http_hdr(&r, "Content-Type");
            cr_expect(ct && strncmp(ct, "application/json", 16) == 0, "%s %s: Content-Type %s",
                      methods[k], paths[i], ct ? ct : "(none)");
            json_error_t e;
            json_t *j = r.body ? json_loadb((char *)r.body, r.body_len, 0, &e) : NULL;
            cr_expect(json_is_object(j), "%s %s: body is not a JSON object: %s", methods[k],
                      paths[i], r.body ? (char *)r.body : "(empty)");
            json_decref(j);
            http_free(&r);
        }
    }
}

Test(admin, get_reload_is_405_allow_post_and_unknown_path_is_404)
{
    start("");
    struct http_resp r;
    admin_do("GET", "/reload", &r);
    cr_expect_eq(r.status, 405);
    cr_expect_str_eq(http_hdr(&r, "Allow"), "POST");
    http_free(&r);
    json_t *j = admin_json("GET", "/reload", 405);
    json_decref(j);

    j = admin_json("GET", "/nope", 404);
    cr_expect(json_is_object(j), "404 body is not a JSON object");
    json_decref(j);
    j = admin_json("POST", "/nope", 404);
    json_decref(j);
    /* a known name as a prefix is still unknown */
    j = admin_json("GET", "/healthz/x", 404);
    json_decref(j);
}

/* ================================ who may ask ================================ */

/* Not a loopback address (TEST-NET-1): a client from elsewhere, once it is on an interface. */
#define ELSEWHERE "192.0.2.1"

/* 's' into 'out', cut to fit. */
static void copy_str(char *out, size_t cap, const char *s)
{
    size_t n = strlen(s) < cap ? strlen(s) : cap - 1;
    memcpy(out, s, n);
    out[n] = '\0';
}

/* One request over a new connection from source address 'src' to the admin listener, read
 * until the proxy closes it; returns the status, the body goes to 'body' (NUL-terminated) and
 * the header block to 'head'. */
static long raw_admin(const char *src, const char *method, const char *path, char *head,
                      size_t head_cap, char *body, size_t body_cap)
{
    struct sockaddr_in s = { .sin_family = AF_INET };
    struct sockaddr_in d = { .sin_family = AF_INET,
                             .sin_port = htons(px->admin_port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    cr_assert_eq(inet_pton(AF_INET, src, &s.sin_addr), 1, "%s", src);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0, "socket: %s", strerror(errno));
    cr_assert_eq(bind(fd, (struct sockaddr *)&s, sizeof(s)), 0, "bind %s: %s", src,
                 strerror(errno));
    cr_assert_eq(connect(fd, (struct sockaddr *)&d, sizeof(d)), 0, "connect: %s", strerror(errno));
    struct timeval tv = { .tv_sec = 5 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char req[512], resp[65536];
    bool post = strcmp(method, "POST") == 0;
    int n =
        snprintf(req, sizeof(req), "%s %s HTTP/1.1\r\nHost: admin\r\n%sConnection: close\r\n\r\n",
                 method, path, post ? "Content-Length: 0\r\n" : "");
    cr_assert_eq(write(fd, req, (size_t)n), n);
    size_t len = 0;
    ssize_t got;
    while (len < sizeof(resp) - 1 && (got = read(fd, resp + len, sizeof(resp) - 1 - len)) > 0)
        len += (size_t)got;
    close(fd);
    resp[len] = '\0';
    long status = -1;
    cr_assert_eq(sscanf(resp, "HTTP/1.1 %ld ", &status), 1, "%s %s from %s: no status line in %s",
                 method, path, src, resp);
    char *end = strstr(resp, "\r\n\r\n");
    cr_assert_not_null(end, "%s %s from %s: no end of head in %s", method, path, src, resp);
    *end = '\0';
    copy_str(head, head_cap, resp);
    copy_str(body, body_cap, end + 4);
    return status;
}

/* Moves this test (a process of its own) into a new network namespace whose loopback device
 * also holds 'ip', so that a connection from 'ip' is a client that is not on a loopback
 * address while everything stays on this host. False, with the reason, when not permitted. */
static bool netns_with_address(const char *ip, char *why, size_t cap)
{
    if (unshare(CLONE_NEWNET) < 0) {
        snprintf(why, cap, "unshare(CLONE_NEWNET): %s", strerror(errno));
        return false;
    }
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert(s >= 0);
    struct ifreq lo = { 0 }, alias = { 0 };
    snprintf(lo.ifr_name, sizeof(lo.ifr_name), "lo");
    cr_assert_eq(ioctl(s, SIOCGIFFLAGS, &lo), 0, "SIOCGIFFLAGS lo: %s", strerror(errno));
    lo.ifr_flags |= IFF_UP;
    cr_assert_eq(ioctl(s, SIOCSIFFLAGS, &lo), 0, "lo up: %s", strerror(errno));
    snprintf(alias.ifr_name, sizeof(alias.ifr_name), "lo:rp");
    struct sockaddr_in *a = (struct sockaddr_in *)&alias.ifr_addr;
    a->sin_family = AF_INET;
    cr_assert_eq(inet_pton(AF_INET, ip, &a->sin_addr), 1);
    cr_assert_eq(ioctl(s, SIOCSIFADDR, &alias), 0, "add %s to lo: %s", ip, strerror(errno));
    close(s);
    return true;
}

/* A 403 as the admin listener's other errors are: JSON {"error": "forbidden", "message"}. */
static void expect_forbidden(const char *method, const char *path)
{
    char head[4096], body[65536];
    long st = raw_admin(ELSEWHERE, method, path, head, sizeof(head), body, sizeof(body));
    cr_expect_eq(st, 403, "%s %s from " ELSEWHERE ": status %ld, want 403\n%s", method, path, st,
                 body);
    cr_expect(strstr(head, "\r\nContent-Type: application/json"), "%s %s: head\n%s", method, path,
              head);
    if (strcmp(method, "HEAD") == 0) {
        cr_expect_str_eq(body, "", "HEAD %s sent a body", path);
        return;
    }
    json_error_t e;
    json_t *j = json_loads(body, 0, &e);
    cr_expect(json_is_object(j) && json_object_size(j) == 2, "%s %s: body %s", method, path, body);
    cr_expect_str_eq(json_str(j, "error"), "forbidden");
    const char *msg = json_str(j, "message");
    cr_expect(msg && strstr(msg, "loopback"), "%s %s: message %s", method, path,
              msg ? msg : "(none)");
    json_decref(j);
}

/* In Kubernetes the admin listener is on the pod's address (kubelet probes and Prometheus come
 * from outside the pod), where every pod in the cluster reaches it too: those get what probes
 * and scrapers need, and nothing that reads the config or changes it. */
Test(admin, non_loopback_client_gets_probes_and_metrics_only)
{
    char why[256];
    if (!netns_with_address(ELSEWHERE, why, sizeof(why)))
        cr_skip_test("needs a network namespace of its own (root or CAP_SYS_ADMIN): %s", why);
    start("");
    char head[4096], body[65536];
    static const char *const probes[] = { "/healthz", "/readyz", "/metrics" };
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
        long st = raw_admin(ELSEWHERE, "GET", probes[i], head, sizeof(head), body, sizeof(body));
        cr_expect_eq(st, 200, "GET %s from " ELSEWHERE ": %ld", probes[i], st);
    }
    cr_expect(strstr(body, "retryproxy_requests_total"), "/metrics body:\n%s", body);
    /* a wrong method on a public path is still 405, not 403: the path is no secret */
    cr_expect_eq(raw_admin(ELSEWHERE, "POST", "/healthz", head, sizeof(head), body, sizeof(body)),
                 405);

    static const char *const closed[][2] = {
        { "GET", "/config" },  { "HEAD", "/config" },   { "GET", "/schedule?route=r&seed=1" },
        { "POST", "/reload" }, { "GET", "/reload" },    { "DELETE", "/config" },
        { "GET", "/nope" },    { "GET", "/healthz/x" },
    };
    for (size_t i = 0; i < sizeof(closed) / sizeof(closed[0]); i++)
        expect_forbidden(closed[i][0], closed[i][1]);

    /* the refused POST /reload reloaded nothing, and loopback still gets everything */
    cr_expect_eq(raw_admin("127.0.0.1", "GET", "/config", head, sizeof(head), body, sizeof(body)),
                 200);
    json_t *j = json_loads(body, 0, NULL);
    cr_expect_eq(json_integer_value(json_object_get(j, "generation")), 1, "%s", body);
    json_decref(j);
    cr_expect_eq(raw_admin("127.0.0.1", "POST", "/reload", head, sizeof(head), body, sizeof(body)),
                 200);
}

/* Every 127.0.0.0/8 address is loopback, not only 127.0.0.1. */
Test(admin, loopback_clients_get_every_endpoint)
{
    start("");
    static const char *const sources[] = { "127.0.0.1", "127.0.0.2", "127.255.255.254" };
    static const struct {
        const char *method, *path;
        long status;
    } asks[] = {
        { "GET", "/healthz", 200 },
        { "GET", "/config", 200 },
        { "GET", "/schedule?route=r&seed=1", 200 },
        { "POST", "/reload", 200 },
        { "GET", "/reload", 405 },
        { "GET", "/nope", 404 },
    };
    char head[4096], body[65536];
    for (size_t s = 0; s < sizeof(sources) / sizeof(sources[0]); s++)
        for (size_t i = 0; i < sizeof(asks) / sizeof(asks[0]); i++) {
            long st = raw_admin(sources[s], asks[i].method, asks[i].path, head, sizeof(head), body,
                                sizeof(body));
            cr_expect_eq(st, asks[i].status, "%s %s from %s: %ld, want %ld\n%s", asks[i].method,
                         asks[i].path, sources[s], st, asks[i].status, body);
        }
    /* and through libcurl, as every other test here asks */
    json_t *j = admin_json("GET", "/config", 200);
    json_decref(j);
}

/* ================================ /schedule ================================ */

/* delays_ms of /schedule at 'path' into out (up to cap of them); returns how many. */
static size_t schedule(const char *path, long *out, size_t cap)
{
    json_t *j = admin_json("GET", path, 200);
    json_t *d = json_object_get(j, "delays_ms");
    cr_assert(json_is_array(d), "GET %s: no delays_ms array", path);
    size_t n = json_array_size(d);
    for (size_t i = 0; i < n && i < cap; i++) {
        json_t *v = json_array_get(d, i);
        cr_expect(json_is_integer(v), "GET %s: delays_ms[%zu] is not an integer", path, i);
        out[i] = (long)json_integer_value(v);
    }
    json_decref(j);
    return n;
}

Test(admin, schedule_exact_delays_and_default_retries)
{
    start("\"retry\": {\"max_attempts\": 4, \"backoff\": {\"policy\": \"exponential\", "
          "\"base_ms\": 10, \"jitter\": \"none\"}}");
    json_t *j = admin_json("GET", "/schedule?route=r&retries=5", 200);
    cr_expect_str_eq(json_str(j, "route"), "r");
    char *text = json_dumps(json_object_get(j, "delays_ms"), JSON_COMPACT);
    cr_expect_str_eq(text, "[10,20,40,80,160]");
    free(text);
    json_decref(j);

    long d[8];
    size_t n = schedule("/schedule?route=r", d, 8);
    cr_expect_eq(n, 3, "default retries gave %zu delays, want max_attempts-1 = 3", n);
    for (size_t i = 0; i < n && i < 3; i++)
        cr_expect_eq(d[i], 10L << i, "delays_ms[%zu] = %ld", i, d[i]);

    cr_expect_eq(schedule("/schedule?route=r&retries=0", d, 8), 0);
    /* the upper bound is accepted, and answered whole */
    long *big = calloc(1000, sizeof(*big));
    cr_expect_eq(schedule("/schedule?route=r&retries=1000", big, 1000), 1000);
    cr_expect_eq(big[999], 10000, "the cap_ms default (10000) bounds the last delay: %ld",
                 big[999]);
    free(big);
}

Test(admin, schedule_seed_makes_jitter_repeatable)
{
    start("\"retry\": {\"max_attempts\": 10, \"backoff\": {\"base_ms\": 100, \"jitter\": "
          "\"full\"}}");
    long a[16], b[16], c[16];
    size_t na = schedule("/schedule?route=r&seed=42", a, 16);
    size_t nb = schedule("/schedule?route=r&seed=42", b, 16);
    size_t nc = schedule("/schedule?route=r&seed=43", c, 16);
    cr_assert_eq(na, 9);
    cr_assert_eq(nb, 9);
    cr_assert_eq(nc, 9);
    cr_expect_arr_eq(a, b, sizeof(long) * 9, "the same seed gave different delays");
    cr_expect(memcmp(a, c, sizeof(long) * 9) != 0, "seeds 42 and 43 gave the same delays");
    for (size_t i = 0; i < 9; i++) {
        long want_max = 100L << i < 10000 ? 100L << i : 10000;
        cr_expect(a[i] >= 0 && a[i] <= want_max, "full jitter delay %zu = %ld, not in [0, %ld]", i,
                  a[i], want_max);
    }
    json_t *j = admin_json("GET", "/schedule?route=r&seed=42", 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "seed")), 42);
    json_decref(j);
}

/* Issue 27: the CLI took seeds up to 2^64-1, /schedule up to 2^63-1. The largest gives the
 * delays `schedule --seed` prints for it, and is answered as given. */
Test(admin, schedule_takes_the_seeds_the_cli_takes)
{
    start("\"retry\": {\"max_attempts\": 6, \"backoff\": {\"base_ms\": 100, \"jitter\": "
          "\"full\"}}");
    const char *top = "18446744073709551615";
    struct http_resp r;
    admin_do("GET", "/schedule?route=r&seed=18446744073709551615", &r);
    cr_assert_eq(r.status, 200, "%s", r.body ? (char *)r.body : "");
    char *body = strndup((const char *)r.body, r.body_len);
    http_free(&r);
    cr_expect(strstr(body, ",\"seed\":18446744073709551615}\n"), "%s", body);
    char *argv[] = { (char *)proc_bin(), "schedule",  "-c", px->cfg_path, "--route", "r",
                     "--seed",           (char *)top, NULL };
    struct proc_result pr;
    cr_assert_eq(proc_run(argv, NULL, 10000, &pr), 0);
    cr_assert_eq(pr.status, 0, "%s", pr.err);
    /* "100 37 ...\n" against "[100,37,...]" */
    char want[256];
    size_t n = 0;
    for (const char *p = pr.out; *p && *p != '\n' && n + 1 < sizeof(want); p++)
        want[n++] = *p == ' ' ? ',' : *p;
    want[n] = '\0';
    char delays[300];
    snprintf(delays, sizeof(delays), "\"delays_ms\":[%s]", want);
    cr_expect(strstr(body, delays), "CLI printed %s, admin answered %s", pr.out, body);
    proc_result_free(&pr);
    free(body);
    json_decref(admin_json("GET", "/schedule?route=r&seed=18446744073709551616", 400));
}

Test(admin, schedule_rejects_bad_arguments)
{
    start("");
    static const struct {
        const char *path;
        long status;
    } cases[] = {
        { "/schedule", 400 },
        { "/schedule?retries=2", 400 },
        { "/schedule?route=nope", 404 },
        { "/schedule?route=r&retries=abc", 400 },
        { "/schedule?route=r&retries=1001", 400 },
        { "/schedule?route=r&retries=-1", 400 },
        { "/schedule?route=r&seed=-1", 400 },
        { "/schedule?route=r&seed=x1", 400 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *j = admin_json("GET", cases[i].path, cases[i].status);
        cr_expect(json_is_string(json_object_get(j, "error")), "GET %s: no \"error\" string",
                  cases[i].path);
        json_decref(j);
    }
}

/* ================================ POST /reload ================================ */

Test(admin, reload_valid_file_bumps_generation)
{
    start("\"retry\": {" FAST "}");
    char cfg[1024];
    route_cfg(cfg, sizeof(cfg),
              "\"retry\": {\"backoff\": {\"base_ms\": 20, \"jitter\": \"none\"}}");
    write_cfg(cfg);
    json_t *j = admin_json("POST", "/reload", 200);
    cr_expect(json_is_integer(json_object_get(j, "generation")), "no integer generation");
    cr_expect_eq(json_integer_value(json_object_get(j, "generation")), 2);
    json_decref(j);

    j = admin_json("GET", "/config", 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "generation")), 2);
    json_t *route = json_array_get(json_object_get(json_object_get(j, "config"), "routes"), 0);
    json_t *b = json_object_get(json_object_get(route, "retry"), "backoff");
    cr_expect_eq(json_integer_value(json_object_get(b, "base_ms")), 20,
                 "the reloaded base_ms is not in effect");
    json_decref(j);

    char *text = scrape();
    expect_metric(text, "retryproxy_config_generation", "", 2);
    expect_metric(text, "retryproxy_config_reloads_total", "result=\"success\"", 2);
    free(text);
}

/* Two mistakes an operator makes: a typo'd key and an out-of-range value. */
static void write_invalid_cfg(void)
{
    char cfg[1024];
    route_cfg(cfg, sizeof(cfg), "\"retry\": {\"max_attempts\": 0, \"backoff\": {\"bsae_ms\": 10}}");
    write_cfg(cfg);
}

Test(admin, reload_invalid_file_is_422_and_keeps_generation)
{
    start("\"retry\": {" FAST "}");
    write_invalid_cfg();
    json_t *j = admin_json("POST", "/reload", 422);
    json_t *errs = json_object_get(j, "errors");
    cr_assert(json_is_array(errs), "no errors array");
    cr_expect_geq(json_array_size(errs), 2, "%zu errors for two mistakes", json_array_size(errs));
    bool typo = false, range = false;
    size_t i;
    json_t *e;
    json_array_foreach(errs, i, e)
    {
        const char *s = json_string_value(e);
        cr_expect(s && strstr(s, "$."), "errors[%zu] does not name a JSON path: %s", i,
                  s ? s : "(not a string)");
        typo |= s && strstr(s, "$.routes[0].retry.backoff.bsae_ms") != NULL;
        range |= s && strstr(s, "$.routes[0].retry.max_attempts") != NULL;
    }
    cr_expect(typo, "no error names $.routes[0].retry.backoff.bsae_ms");
    cr_expect(range, "no error names $.routes[0].retry.max_attempts");
    json_decref(j);

    j = admin_json("GET", "/config", 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "generation")), 1);
    cr_expect(json_is_string(json_object_get(j, "last_error")), "last_error is not a string");
    json_t *route = json_array_get(json_object_get(json_object_get(j, "config"), "routes"), 0);
    json_t *b = json_object_get(json_object_get(route, "retry"), "backoff");
    cr_expect_eq(json_integer_value(json_object_get(b, "base_ms")), 10, "the old config is gone");
    json_decref(j);

    char *text = scrape();
    expect_metric(text, "retryproxy_config_generation", "", 1);
    expect_metric(text, "retryproxy_config_reloads_total", "result=\"failure\"", 1);
    expect_metric(text, "retryproxy_config_reloads_total", "result=\"success\"", 1);
    free(text);

    /* the failure used no generation number: the next good file is generation 2 */
    char cfg[1024];
    route_cfg(cfg, sizeof(cfg), "\"retry\": {" FAST "}");
    write_cfg(cfg);
    j = admin_json("POST", "/reload", 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "generation")), 2);
    json_decref(j);
    j = admin_json("GET", "/config", 200);
    cr_expect(json_is_null(json_object_get(j, "last_error")), "last_error not cleared");
    json_decref(j);
}

/* An error line longer than any fixed buffer, made of two-byte UTF-8 characters, is reported
 * whole: a line cut in the middle of a character would be refused by jansson and vanish. */
Test(admin, reload_reports_a_long_non_ascii_error_whole)
{
    start("\"retry\": {" FAST "}");
    char key[1200] = "", extra[1400], cfg[4096];
    for (int i = 0; i < 400; i++)
        strcat(key, "\xc3\xa9");
    snprintf(extra, sizeof(extra), "\"retry\": {\"%s\": 1}", key);
    route_cfg(cfg, sizeof(cfg), extra);
    write_cfg(cfg);
    json_t *j = admin_json("POST", "/reload", 422);
    json_t *errs = json_object_get(j, "errors");
    cr_assert_eq(json_array_size(errs), 1, "%zu errors", json_array_size(errs));
    const char *s = json_string_value(json_array_get(errs, 0));
    cr_expect(s && strstr(s, "unknown key") != NULL, "error: %s", s ? s : "(none)");
    json_decref(j);
}

/* ================================ metrics ================================ */

/* Route "r" (default retry policy, fast backoff, paths under /r) and a route "other" that
 * this scenario never matches, so that a request elsewhere matches no route. */
static void start_scenario(void)
{
    start_with("", "\"match\": {\"path_prefix\": \"/r\"}, \"retry\": {" FAST "}",
               "{\"name\": \"other\", \"match\": {\"path_prefix\": \"/other\"}, "
               "\"upstreams\": [\"http://127.0.0.1:1\"]}",
               NULL, NULL);
}

Test(admin, metrics_exact_after_known_scenario)
{
    start_scenario();
    send_plan("GET", "/r/1", "fail=2;status=503", "m-1", 200);
    char *t = scrape();
    expect_metric(t, "retryproxy_attempts_total", "route=\"r\",outcome=\"5xx\"", 2);
    expect_metric(t, "retryproxy_attempts_total", "route=\"r\",outcome=\"2xx\"", 1);
    expect_metric(t, "retryproxy_attempts_total", "route=\"r\",outcome=\"reset\"", 0);
    expect_metric(t, "retryproxy_retries_total", "route=\"r\",reason=\"gateway-error\"", 2);
    expect_metric(t, "retryproxy_retry_success_total", "route=\"r\"", 1);
    expect_metric(t, "retryproxy_requests_total", "route=\"r\",code=\"200\"", 1);
    expect_metric(t, "retryproxy_backoff_seconds_count", "route=\"r\"", 2);
    expect_metric(t, "retryproxy_attempt_duration_seconds_count", "route=\"r\"", 3);
    expect_metric(t, "retryproxy_request_duration_seconds_count", "route=\"r\"", 1);
    expect_metric(t, "retryproxy_retries_in_flight", "", 0);
    expect_metric(t, "retryproxy_config_generation", "", 1);
    expect_metric(t, "retryproxy_config_reloads_total", "result=\"success\"", 1);
    expect_metric(t, "retryproxy_config_reloads_total", "result=\"failure\"", 0);
    expect_metric(t, "retryproxy_retries_denied_total", "route=\"r\",reason=\"max-attempts\"", 0);
    /* waits of 10 and 20 ms */
    double sum = metric(t, "retryproxy_backoff_seconds_sum", "route=\"r\"");
    cr_expect(sum >= 0.029 && sum < 0.5, "backoff_seconds_sum = %g, want about 0.030", sum);
    double ts = metric(t, "retryproxy_config_last_reload_success_timestamp_seconds", "");
    cr_expect(fabs(ts - (double)time(NULL)) < 120, "last reload timestamp %f is not recent", ts);
    expect_metric(t, "retryproxy_config_last_reload_successful", "", 1);
    expect_metric(t, "retryproxy_draining", "", 0);
    /* the budgets of the config: the defaults, a route's without a cap of its own */
    expect_metric(t, "retryproxy_budget_retry_ratio", "scope=\"process\"", 0.2);
    expect_metric(t, "retryproxy_budget_min_retries_per_second", "scope=\"process\"", 10);
    expect_metric(t, "retryproxy_budget_max_concurrent_retries", "scope=\"process\"", 100);
    for (size_t i = 0; i < 2; i++) {
        char l[64];
        snprintf(l, sizeof(l), "route=\"%s\",scope=\"route\"", i ? "other" : "r");
        expect_metric(t, "retryproxy_budget_retry_ratio", l, 0.2);
        expect_metric(t, "retryproxy_budget_min_retries_per_second", l, 10);
        expect_metric(t, "retryproxy_budget_max_concurrent_retries", l, INFINITY);
    }
    /* none for the requests that matched no route */
    cr_expect(!strstr(t, "retryproxy_budget_retry_ratio{route=\"\""), "a budget for route=\"\"");
    /* every family of the contract, with its type */
    static const char *const types[] = {
        "requests_total counter",
        "attempts_total counter",
        "retries_total counter",
        "retry_success_total counter",
        "retries_denied_total counter",
        "retries_in_flight gauge",
        "retry_after_honored_total counter",
        "throttled_total counter",
        "backoff_seconds histogram",
        "attempt_duration_seconds histogram",
        "request_duration_seconds histogram",
        "config_reloads_total counter",
        "config_generation gauge",
        "config_last_reload_success_timestamp_seconds gauge",
        "config_last_reload_successful gauge",
        "budget_retry_ratio gauge",
        "budget_min_retries_per_second gauge",
        "budget_max_concurrent_retries gauge",
        "connections_active gauge",
        "draining gauge",
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        char line[128];
        snprintf(line, sizeof(line), "# TYPE retryproxy_%s\n", types[i]);
        cr_expect(strstr(t, line), "missing: %s", line);
    }
    free(t);

    /* a POST is not retried once sent: the 503 goes back as it is */
    send_plan("POST", "/r/2", "fail=1;status=503", "m-post", 503);
    t = scrape();
    expect_metric(t, "retryproxy_retries_denied_total", "route=\"r\",reason=\"not-retryable\"", 1);
    expect_metric(t, "retryproxy_requests_total", "route=\"r\",code=\"503\"", 1);
    expect_metric(t, "retryproxy_requests_total", "route=\"r\",code=\"200\"", 1);
    expect_metric(t, "retryproxy_attempts_total", "route=\"r\",outcome=\"5xx\"", 3);
    expect_metric(t, "retryproxy_retries_total", "route=\"r\",reason=\"gateway-error\"", 2);
    free(t);

    /* Retry-After: 1 replaces the 10 ms backoff */
    send_plan("GET", "/r/3", "fail=1;status=503;retry-after=1", "m-ra", 200);
    t = scrape();
    expect_metric(t, "retryproxy_retry_after_honored_total", "route=\"r\"", 1);
    expect_metric(t, "retryproxy_retries_total", "route=\"r\",reason=\"gateway-error\"", 3);
    expect_metric(t, "retryproxy_backoff_seconds_count", "route=\"r\"", 3);
    sum = metric(t, "retryproxy_backoff_seconds_sum", "route=\"r\"");
    cr_expect(sum >= 1.029 && sum < 1.5, "backoff_seconds_sum = %g, want about 1.030", sum);
    free(t);

    /* a reset before any response byte */
    send_plan("GET", "/r/4", "fail=1;action=reset", "m-reset", 200);
    t = scrape();
    expect_metric(t, "retryproxy_attempts_total", "route=\"r\",outcome=\"reset\"", 1);
    expect_metric(t, "retryproxy_retries_total", "route=\"r\",reason=\"reset\"", 1);
    free(t);

    /* no route matches /elsewhere */
    struct http_resp r = send_req("GET", "/elsewhere", NULL, NULL);
    cr_expect_eq(r.status, 404);
    http_free(&r);
    t = scrape();
    expect_metric(t, "retryproxy_requests_total", "route=\"\",code=\"404\"", 1);

    /* the totals over all five requests */
    expect_metric(t, "retryproxy_requests_total", "route=\"r\",code=\"200\"", 3);
    expect_metric(t, "retryproxy_attempts_total", "route=\"r\",outcome=\"5xx\"", 4);
    expect_metric(t, "retryproxy_attempts_total", "route=\"r\",outcome=\"2xx\"", 3);
    expect_metric(t, "retryproxy_retry_success_total", "route=\"r\"", 3);
    expect_metric(t, "retryproxy_backoff_seconds_count", "route=\"r\"", 4);
    expect_metric(t, "retryproxy_attempt_duration_seconds_count", "route=\"r\"", 8);
    expect_metric(t, "retryproxy_request_duration_seconds_count", "route=\"r\"", 4);
    expect_metric(t, "retryproxy_retries_in_flight", "", 0);
    expect_metric(t, "retryproxy_attempts_total", "route=\"other\",outcome=\"2xx\"", 0);
    free(t);
}

Test(admin, connections_active_follows_open_client_connections)
{
    start("");
    /* a request first, so that its connection (closed by now) must have been counted down */
    struct http_resp r = send_req("GET", "/", NULL, NULL);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    double v = wait_metric("retryproxy_connections_active", "", 0, SETTLE_MS);
    cr_expect_eq(v, 0, "connections_active = %g with no client connected", v);

    int held[3];
    for (size_t i = 0; i < 3; i++)
        held[i] = fx_hold(connect_proxy());
    v = wait_metric("retryproxy_connections_active", "", 3, SETTLE_MS);
    cr_expect_eq(v, 3, "connections_active = %g with 3 idle client connections open", v);

    for (size_t i = 0; i < 3; i++) {
        fx_release(held[i]);
        close(held[i]);
    }
    v = wait_metric("retryproxy_connections_active", "", 0, SETTLE_MS);
    cr_expect_eq(v, 0, "connections_active = %g 2 s after the 3 connections closed", v);
}

/* Pins the proxy's worker threads and this test to one CPU and its main thread (the control
 * loop, which serves the admin port) to another: a client sharing a core with the worker that
 * answers it, as a sidecar and its service often do. Under this placement a count made after
 * the response is written loses the race to the client's scrape about half the time, where
 * unpinned it does so only now and then. False (nothing pinned) with fewer than two CPUs. */
static bool pin_workers_with_client(void)
{
    cpu_set_t allowed, near, far;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || CPU_COUNT(&allowed) < 2)
        return false;
    int first = -1, second = -1;
    for (int c = 0; c < CPU_SETSIZE && second < 0; c++) {
        if (!CPU_ISSET(c, &allowed))
            continue;
        if (first < 0)
            first = c;
        else
            second = c;
    }
    CPU_ZERO(&near);
    CPU_SET(first, &near);
    CPU_ZERO(&far);
    CPU_SET(second, &far);
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)px->pid);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot list %s", dir);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        pid_t tid = (pid_t)atoi(e->d_name);
        cpu_set_t *set = tid == px->pid ? &far : &near;
        cr_assert_eq(sched_setaffinity(tid, sizeof(*set), set), 0, "pinning thread %d: %s",
                     (int)tid, strerror(errno));
    }
    closedir(d);
    /* Criterion runs each test in its own process: this pins no other test */
    cr_assert_eq(sched_setaffinity(0, sizeof(near), &near), 0);
    return true;
}

/* docs/logs.md: "Metrics for a request are counted by the time its response has been sent". A
 * scrape made right after the client has its whole response must count that request, every
 * time; one round can pass by luck, forty in a row do not. */
Test(admin, request_metrics_are_counted_by_the_time_the_response_is_sent)
{
    start("");
    if (!pin_workers_with_client())
        cr_log_warn("fewer than two CPUs: the race is probed without pinning, less surely");
    int missed = 0, first = 0;
    double seen = 0;
    for (int i = 1; i <= 40; i++) {
        struct http_resp r = send_req("GET", "/", NULL, NULL);
        cr_assert_eq(r.status, 200);
        http_free(&r);
        char *t = scrape();
        double v = metric(t, "retryproxy_requests_total", "route=\"r\",code=\"200\"");
        double d = metric(t, "retryproxy_request_duration_seconds_count", "route=\"r\"");
        free(t);
        if (v != i || d != i) {
            if (!missed++) {
                first = i;
                seen = v;
            }
            /* a late count still has to land, so that the next round sees only its own */
            cr_assert_eq(
                wait_metric("retryproxy_requests_total", "route=\"r\",code=\"200\"", i, SETTLE_MS),
                i, "request %d was never counted", i);
        }
    }
    cr_expect_eq(missed, 0,
                 "%d of 40 scrapes made just after a complete 200 response did not count it yet "
                 "(first: request %d, requests_total{route=\"r\",code=\"200\"} = %g)",
                 missed, first, seen);
}

Test(admin, promtool_accepts_metrics)
{
    start_scenario();
    /* series in every family: retries, a denial, a reset, a no-route request */
    send_plan("GET", "/r/1", "fail=2;status=503", "p-1", 200);
    send_plan("POST", "/r/2", "fail=1;status=503", "p-post", 503);
    send_plan("GET", "/r/3", "fail=1;action=reset", "p-reset", 200);
    struct http_resp r = send_req("GET", "/elsewhere", NULL, NULL);
    cr_expect_eq(r.status, 404);
    http_free(&r);

    if (fx_sh("command -v promtool >/dev/null 2>&1") != 0) {
        cr_log_warn("promtool is not installed: the Prometheus format check was SKIPPED "
                    "(install Debian's prometheus package to run it)");
        return;
    }
    char dir[] = "/tmp/retryproxy-promtool-XXXXXX", path[96], outp[96], cmd[512];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/metrics", dir);
    snprintf(outp, sizeof(outp), "%s/out", dir);
    char *text = scrape();
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    free(text);
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s > %s 2>&1", path, outp);
    int rc = fx_sh(cmd);
    f = fopen(outp, "r");
    char out[4096] = "";
    size_t n = f ? fread(out, 1, sizeof(out) - 1, f) : 0;
    out[n] = '\0';
    if (f)
        fclose(f);
    cr_expect_eq(rc, 0, "promtool check metrics exited %d:\n%s", rc, out);
    cr_expect_eq(n, 0, "promtool check metrics printed:\n%s", out);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    fx_sh(cmd);
}

/* ================================ logs ================================ */

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
    start("\"retry\": {" FAST "}");
    send_plan("GET", "/a/b?x=2&y=z", "fail=2;status=503", "log-ok", 200);
    send_plan("GET", "/c", "fail=9;status=503", "log-stop", 503);

    size_t bad;
    json_decref(wait_logs("request", "log-ok", 1, &bad));
    json_t *lines = wait_logs("request", "log-stop", 1, &bad);
    cr_expect_eq(bad, 0, "%zu stdout lines are not JSON objects", bad);
    json_t *l;
    cr_assert_eq(count_msg(lines, "request", "log-ok", &l), 1, "want one request line for log-ok");
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

    cr_assert_eq(count_msg(lines, "request", "log-stop", &l), 1);
    cr_expect_eq(json_integer_value(json_object_get(l, "status")), 503);
    cr_expect_eq(json_integer_value(json_object_get(l, "attempts")), 3);
    cr_expect_str_eq(json_str(l, "stop"), "max-attempts");
    cr_expect_str_eq(json_str(l, "path"), "/c");
    /* info level: no attempt detail */
    cr_expect_eq(count_msg(lines, "attempt", NULL, NULL), 0);
    json_decref(lines);
}

Test(admin, hostile_path_is_one_valid_line)
{
    start("\"retry\": {" FAST "}");
    const char *h[] = { "X-Request-Id: hostile", NULL };
    struct http_resp r = send_req("GET", "/a%22b?x=%0A", h, NULL);
    cr_expect_eq(r.status, 200);
    http_free(&r);
    cr_expect_str_eq(tup_get(up, 0)->target, "/a%22b?x=%0A");

    /* Quote and backslash as raw bytes too, which a JSON writer must escape. */
    int fd = connect_proxy();
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
    json_decref(wait_logs("request", "hostile", 1, &bad));
    json_t *lines = wait_logs("request", "raw-hostile", 1, &bad);
    cr_expect_eq(bad, 0, "%zu stdout lines are not JSON objects", bad);
    json_t *l;
    cr_expect_eq(count_msg(lines, "request", "hostile", &l), 1);
    if (l)
        cr_expect_str_eq(json_str(l, "path"), "/a%22b?x=%0A");
    cr_expect_eq(count_msg(lines, "request", "raw-hostile", &l), 1,
                 "no request line for the raw request (answer: %.40s)", resp);
    if (l)
        cr_expect_str_eq(json_str(l, "path"), "/q\"b\\c?d=\"}");
    json_decref(lines);
    char *out = px_stdout(px);
    cr_expect_eq(count_raw(out, "hostile"), 2, "the two requests did not log two lines:\n%s", out);
    free(out);
}

/* A failed reload: its error lines are written at once, so once they show, every earlier
 * request line has been flushed too (the caller waited for the responses). */
static json_t *fail_a_reload(size_t *bad)
{
    write_invalid_cfg();
    json_t *j = admin_json("POST", "/reload", 422);
    json_decref(j);
    int64_t deadline = now_ms() + SETTLE_MS;
    for (;;) {
        json_t *lines = log_lines(bad);
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
    start_with("\"log\": {\"level\": \"warn\"}", "\"retry\": {" FAST "}", "", NULL, NULL);
    send_plan("GET", "/w", "fail=1;status=503", "quiet", 200);
    usleep(200000); /* one more chance for a buffered line to reach stdout */
    size_t bad;
    json_t *lines = fail_a_reload(&bad);
    cr_expect_eq(bad, 0);
    cr_expect_eq(count_msg(lines, "request", NULL, NULL), 0, "a request line at level warn");
    cr_expect_eq(count_msg(lines, "attempt", NULL, NULL), 0, "an attempt line at level warn");
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
    start_with("", "\"retry\": {" FAST "}", "", "--log-level", "debug");
    send_plan("GET", "/d", "fail=2;status=503", "dbg", 200);
    size_t bad;
    json_decref(wait_logs("attempt", "dbg", 3, &bad));
    /* the request line may reach stdout a loop turn after the last attempt line */
    json_t *lines = wait_logs("request", "dbg", 1, &bad);
    cr_expect_eq(bad, 0);
    cr_assert_eq(count_msg(lines, "attempt", "dbg", NULL), 3, "want one attempt line per attempt");
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
    cr_expect_eq(count_msg(lines, "request", "dbg", NULL), 1, "debug includes the request line");
    json_decref(lines);
}

Test(admin, text_format_is_one_line_per_request)
{
    start_with("\"log\": {\"format\": \"text\"}", "\"retry\": {" FAST "}", "", NULL, NULL);
    send_plan("GET", "/t1", "fail=1;status=503", "txt-1", 200);
    send_plan("GET", "/t2", "fail=9;status=503", "txt-2", 503);
    char *out = NULL;
    int64_t deadline = now_ms() + SETTLE_MS;
    for (;;) {
        out = px_stdout(px);
        if (count_raw(out, "route=r") >= 2 || now_ms() >= deadline)
            break;
        free(out);
        usleep(20000);
    }
    cr_expect_eq(count_raw(out, "route=r"), 2, "want two request lines:\n%s", out);
    static const struct {
        const char *id, *status;
    } want[] = { { "txt-1", "200" }, { "txt-2", "503" } };
    for (size_t k = 0; k < 2; k++) {
        cr_expect_eq(count_raw(out, want[k].id), 1, "%s is not on exactly one line:\n%s",
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
    start("\"retry\": {" FAST "}");
    char cfg[1024];
    route_cfg(cfg, sizeof(cfg),
              "\"retry\": {\"backoff\": {\"base_ms\": 20, \"jitter\": \"none\"}}");
    write_cfg(cfg);
    json_t *j = admin_json("POST", "/reload", 200);
    json_decref(j);
    size_t bad;
    json_t *lines = wait_logs("config reloaded", NULL, 1, &bad);
    json_t *l;
    cr_expect_eq(bad, 0);
    cr_assert_eq(count_msg(lines, "config reloaded", NULL, &l), 1,
                 "want one \"config reloaded\" line for one reload");
    cr_expect_str_eq(json_str(l, "level"), "info");
    expect_recent_time("reload time", json_str(l, "time"));
    json_decref(lines);

    write_invalid_cfg();
    j = admin_json("POST", "/reload", 422);
    size_t n_errs = json_array_size(json_object_get(j, "errors"));
    json_decref(j);
    cr_assert_geq(n_errs, 2);
    int64_t deadline = now_ms() + SETTLE_MS;
    size_t n_lines;
    for (;;) {
        lines = log_lines(&bad);
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
    cr_expect_eq(count_msg(lines, "config reloaded", NULL, NULL), 1,
                 "a failed reload logged \"config reloaded\"");
    json_decref(lines);
}
