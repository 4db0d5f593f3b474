/* The admin listener end to end (docs/admin.md): its endpoints, who may use which, the retry
 * schedule it computes and the reloads it takes; the real binary against the test upstream on
 * 127.0.0.1, its admin port queried over HTTP (tests/support/admintest.h). Its metrics:
 * test_admin_metrics.c; its logs: test_admin_logs.c. */
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

Test(admin, healthz_readyz_and_metrics_answer)
{
    adm_start("");
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
    adm_start_with("\"log\": {\"level\": \"info\", \"format\": \"json\"}", "", "", "--log-level",
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
    adm_start("");
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
    adm_start("");
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
    adm_start("");
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
    adm_start("");
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
    adm_start("");
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
    adm_start("");
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
    adm_start("\"retry\": {\"max_attempts\": 4, \"backoff\": {\"policy\": \"exponential\", "
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
    adm_start("\"retry\": {\"max_attempts\": 10, \"backoff\": {\"base_ms\": 100, \"jitter\": "
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
    adm_start("\"retry\": {\"max_attempts\": 6, \"backoff\": {\"base_ms\": 100, \"jitter\": "
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
    adm_start("");
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
    adm_start("\"retry\": {" FAST "}");
    char cfg[1024];
    adm_route_cfg(cfg, sizeof(cfg),
                  "\"retry\": {\"backoff\": {\"base_ms\": 20, \"jitter\": \"none\"}}");
    adm_write_cfg(cfg);
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

    char *text = adm_scrape();
    adm_expect_metric(text, "retryproxy_config_generation", "", 2);
    adm_expect_metric(text, "retryproxy_config_reloads_total", "result=\"success\"", 2);
    free(text);
}

Test(admin, reload_invalid_file_is_422_and_keeps_generation)
{
    adm_start("\"retry\": {" FAST "}");
    adm_write_invalid_cfg();
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

    char *text = adm_scrape();
    adm_expect_metric(text, "retryproxy_config_generation", "", 1);
    adm_expect_metric(text, "retryproxy_config_reloads_total", "result=\"failure\"", 1);
    adm_expect_metric(text, "retryproxy_config_reloads_total", "result=\"success\"", 1);
    free(text);

    /* the failure used no generation number: the next good file is generation 2 */
    char cfg[1024];
    adm_route_cfg(cfg, sizeof(cfg), "\"retry\": {" FAST "}");
    adm_write_cfg(cfg);
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
    adm_start("\"retry\": {" FAST "}");
    char key[1200] = "", extra[1400], cfg[4096];
    for (int i = 0; i < 400; i++)
        strcat(key, "\xc3\xa9");
    snprintf(extra, sizeof(extra), "\"retry\": {\"%s\": 1}", key);
    adm_route_cfg(cfg, sizeof(cfg), extra);
    adm_write_cfg(cfg);
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
