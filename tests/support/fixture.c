#include "tests/support/fixture.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/promtext.h"

struct px *px;
struct tup *up;
struct http_call fx_calls[FX_CALLS];
char fx_cfg_path[128];

static struct tup *ups[FX_UPSTREAMS];
static char dir[64];
static int held[FX_HELD];
static size_t n_held;
static bool curl_inited;

void fx_upstreams(size_t n)
{
    cr_assert_leq(n, FX_UPSTREAMS, "at most %d test upstreams", FX_UPSTREAMS);
    for (size_t i = 0; i < n; i++)
        if (!ups[i])
            ups[i] = tup_start();
    up = ups[0];
}

struct tup *fx_up(size_t i)
{
    return i < FX_UPSTREAMS ? ups[i] : NULL;
}

const char *fx_up_url(size_t i)
{
    static char urls[FX_UPSTREAMS][40];
    cr_assert(i < FX_UPSTREAMS && ups[i], "upstream %zu is not running", i);
    snprintf(urls[i], sizeof(urls[i]), "http://127.0.0.1:%u", tup_port(ups[i]));
    return urls[i];
}

void fx_start(const char *json, ...)
{
    va_list ap;
    va_start(ap, json);
    px = px_startv(json, ap);
    va_end(ap);
}

void fx_start_r(const char *top, const char *route, ...)
{
    fx_upstreams(1);
    char *json = cfg_r(top, route);
    va_list ap;
    va_start(ap, route);
    px = px_startv(json, ap);
    va_end(ap);
    free(json);
}

void fx_start_b(struct cfgb *b, ...)
{
    char *json = cfgb_text(b);
    va_list ap;
    va_start(ap, b);
    px = px_startv(json, ap);
    va_end(ap);
    free(json);
}

void fx_start_argv(const char *const *args)
{
    px = px_start_argv(args);
}

const char *fx_config_dir(const char *name)
{
    snprintf(dir, sizeof(dir), "/tmp/retryproxy-%s-XXXXXX", name);
    cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    snprintf(fx_cfg_path, sizeof(fx_cfg_path), "%s/config.json", dir);
    return dir;
}

int fx_hold(int fd)
{
    cr_assert_lt(n_held, FX_HELD, "more than %d held sockets", FX_HELD);
    held[n_held++] = fd;
    return fd;
}

void fx_release(int fd)
{
    for (size_t i = 0; i < n_held; i++)
        if (held[i] == fd)
            held[i] = -1;
}

void fx_init_curl(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    curl_inited = true;
}

static void join_calls(void)
{
    for (size_t i = 0; i < FX_CALLS; i++) {
        http_call_join(&fx_calls[i]);
        http_free(&fx_calls[i].r);
    }
}

/* Everything but the proxy and the calls. */
static void stop_rest(void)
{
    for (size_t i = 0; i < n_held; i++)
        if (held[i] >= 0)
            close(held[i]);
    n_held = 0;
    for (size_t i = 0; i < FX_UPSTREAMS; i++) {
        tup_stop(ups[i]);
        ups[i] = NULL;
    }
    up = NULL;
    if (dir[0])
        rm_tree(dir);
    dir[0] = '\0';
    fx_cfg_path[0] = '\0';
    if (curl_inited)
        curl_global_cleanup();
    curl_inited = false;
}

void fx_stop(void)
{
    join_calls();
    if (px)
        px_stop_clean(px);
    px = NULL;
    stop_rest();
}

void fx_stop_any(void)
{
    if (px)
        px_stop(px, 10000);
    px = NULL;
    join_calls();
    stop_rest();
}

/* ---- helpers ---- */

const char *fx_url(const char *path)
{
    static char url[512];
    return px_url(px, path, url, sizeof(url));
}

bool fx_under_sanitizer(void)
{
    const char *b = getenv("RETRYPROXY_BIN");
    return fx_under_asan() || (b && strstr(b, "tsan") != NULL);
}

bool fx_under_asan(void)
{
    /* make asan builds in build-asan/, a developer's own ASan build may be build-NAME-asan/ */
    const char *b = getenv("RETRYPROXY_BIN");
    return b && strstr(b, "asan") != NULL;
}

uint16_t fx_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

uint16_t fx_closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    /* kept bound, never listening, until the test's process ends: a connect to it is refused,
     * and no other process (a proxy or upstream of a test running beside it) can take the port
     * meanwhile, which a closed port allowed */
    return ntohs(a.sin_port);
}

int fx_listen(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert_eq(listen(fd, 8), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    *port = ntohs(sa.sin_port);
    return fd;
}

int fx_accept(int lfd, volatile int *stop)
{
    while (!*stop) {
        struct pollfd p = { lfd, POLLIN, 0 };
        int c = poll(&p, 1, 50) > 0 ? accept(lfd, NULL, NULL) : -1;
        if (c >= 0)
            return c;
    }
    return -1;
}

struct cfgb *fx_cfg_closed_then_up(void)
{
    fx_upstreams(1);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r",
               "\"upstreams\": [\"http://127.0.0.1:%u\", \"%s\"], "
               "\"retry\": {\"max_attempts\": 2, " CFG_FAST "}",
               fx_closed_port(), fx_up_url(0));
    return b;
}

int fx_sh(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int fx_cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

bool fx_wait(bool (*cond)(void *arg), void *arg, int timeout_ms, int step_ms)
{
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        if (cond(arg))
            return true;
        if (now_ms() >= deadline)
            return false;
        sleep_ms(step_ms);
    }
}

struct id_count {
    const char *id;
    size_t n;
};

static bool upstream_saw(void *arg)
{
    const struct id_count *w = arg;
    return tup_count_id(up, w->id) >= w->n;
}

void fx_wait_upstream(const char *id, size_t n)
{
    struct id_count w = { id, n };
    fx_wait(upstream_saw, &w, 5000, 2);
    cr_assert_geq(tup_count_id(up, id), n, "upstream saw %zu attempts of %s, want %zu",
                  tup_count_id(up, id), id, n);
}

/* ---- the admin API ---- */

double metric_in(const char *text, const char *series)
{
    return prom_sum(text, series);
}

int fx_scrape_metric(const char *series, double *v)
{
    char url[128];
    struct http_resp r;
    http_do("GET", px_admin_url(px, "/metrics", url, sizeof(url)), NULL, NULL, 0, 5000, &r);
    int rc = r.rc == 0 && r.status == 200 && r.body ? 0 : -1;
    if (rc == 0)
        *v = metric_in((const char *)r.body, series);
    http_free(&r);
    return rc;
}

double fx_metric(const char *series)
{
    double v = NAN;
    cr_assert_eq(fx_scrape_metric(series, &v), 0, "GET /metrics failed");
    return v;
}

double fx_wait_metric(const char *series, double want, int timeout_ms)
{
    int64_t deadline = now_ms() + timeout_ms;
    double v;
    while ((v = fx_metric(series)) != want && now_ms() < deadline)
        sleep_ms(10);
    return v;
}

/* fx_admin_json(), asserting the status first when 'want' is not 0. */
static json_t *admin_json(const char *method, const char *path, long want, long *status)
{
    char url[256];
    struct http_resp r;
    http_do(method, px_admin_url(px, path, url, sizeof(url)), NULL, NULL, 0, 5000, &r);
    cr_assert_eq(r.rc, 0, "%s %s: curl error %d", method, path, r.rc);
    if (want)
        cr_assert_eq(r.status, want, "%s %s: %ld", method, path, r.status);
    json_error_t err;
    json_t *j = json_loadb((const char *)r.body, r.body_len, 0, &err);
    cr_assert_not_null(j, "%s %s: not JSON (%s): %.*s", method, path, err.text, (int)r.body_len,
                       r.body ? (const char *)r.body : "");
    if (status)
        *status = r.status;
    http_free(&r);
    return j;
}

long fx_get_id(const char *id)
{
    return fx_get_id_plan(id, NULL);
}

long fx_get_id_plan(const char *id, const char *plan)
{
    char ih[96], ph[128], url[256];
    snprintf(ih, sizeof(ih), "X-Request-Id: %s", id);
    snprintf(ph, sizeof(ph), "X-Test-Plan: %s", plan ? plan : "");
    const char *h[] = { ih, plan ? ph : NULL, NULL };
    struct http_resp r;
    http_do("GET", px_url(px, "/", url, sizeof(url)), h, NULL, 0, 20000, &r);
    cr_assert_eq(r.rc, 0, "%s: curl error %d", id, r.rc);
    long status = r.status;
    http_free(&r);
    return status;
}

json_t *fx_admin_get_json(const char *path)
{
    return admin_json("GET", path, 200, NULL);
}

json_t *fx_admin_json(const char *method, const char *path, long *status)
{
    return admin_json(method, path, 0, status);
}

const char *json_str(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

json_t *fx_log_line(const char *out, const char *msg)
{
    for (const char *line = out; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        json_t *j = json_loadb(line, len, 0, NULL);
        const char *m = json_str(j, "msg");
        if (m && strcmp(m, msg) == 0)
            return j;
        json_decref(j);
        line = end ? end + 1 : NULL;
    }
    return NULL;
}

json_t *fx_request_logged(const char *key, const char *value)
{
    return fx_logged("request", key, value);
}

json_t *fx_logged(const char *msg, const char *key, const char *value)
{
    /* generous: a line is written after the answer it follows, on a machine maybe loaded */
    for (int64_t t0 = now_ms(); now_ms() - t0 < 10000; sleep_ms(20)) {
        char *out = px_stdout(px);
        json_t *found = NULL;
        for (const char *line = out; line && *line && !found;) {
            const char *end = strchr(line, '\n');
            json_t *j = json_loadb(line, end ? (size_t)(end - line) : strlen(line), 0, NULL);
            const char *m = json_str(j, "msg"), *v = json_str(j, key);
            if (m && v && strcmp(m, msg) == 0 && strcmp(v, value) == 0)
                found = json_incref(j);
            json_decref(j);
            line = end ? end + 1 : NULL;
        }
        free(out);
        if (found)
            return found;
    }
    return NULL;
}

/* ---- a raw client ---- */

int raw_dial(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0, "socket: %s", strerror(errno));
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "connect: %s",
                 strerror(errno));
    return fd;
}

bool raw_send_all(int fd, const void *p, size_t n)
{
    const char *s = p;
    while (n) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k <= 0)
            return false;
        s += k;
        n -= (size_t)k;
    }
    return true;
}

ssize_t raw_recv(int fd, char *buf, size_t cap, int timeout_ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    int n = poll(&p, 1, timeout_ms);
    if (n == 0)
        return -2;
    if (n < 0)
        return -1;
    return recv(fd, buf, cap, 0);
}

int raw_send_status(int fd, const void *p, size_t n, int timeout_ms)
{
    cr_assert(raw_send_all(fd, p, n));
    char buf[64];
    ssize_t got = raw_recv(fd, buf, sizeof(buf) - 1, timeout_ms);
    if (got < 12 || strncmp(buf, "HTTP/1.", 7) != 0)
        return -1;
    buf[got] = '\0';
    return atoi(buf + 9);
}

json_t *fx_read_jsonl(const char *path)
{
    json_t *all = json_array();
    char *text = proc_read_file(path);
    for (char *line = text, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        else
            break; /* a line still being written */
        json_t *j = json_loads(line, 0, NULL);
        if (j)
            json_array_append_new(all, j);
    }
    free(text);
    return all;
}

void fx_make_cert(const char *in, const char *name, const char *san)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test "
             "-addext subjectAltName=%s -keyout %s/%s.key -out %s/%s.pem >/dev/null 2>&1",
             san, in, name, in, name);
    cr_assert_eq(fx_sh(cmd), 0, "openssl could not make a certificate");
}
