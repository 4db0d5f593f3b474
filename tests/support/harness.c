#include "tests/support/harness.h"

#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/proc.h"
#include "tests/support/tup.h"

extern char **environ;

static void *call_main(void *arg)
{
    struct http_call *c = arg;
    c->t_start = now_ms();
    http_do("GET", c->url, c->h, NULL, 0, 20000, &c->r);
    c->t_end = now_ms();
    return NULL;
}

void http_call_start(struct http_call *c, const char *url, const char *id, const char *plan)
{
    size_t n = 0;
    snprintf(c->url, sizeof(c->url), "%s", url);
    if (id) {
        snprintf(c->idh, sizeof(c->idh), "X-Request-Id: %s", id);
        c->h[n++] = c->idh;
    }
    if (plan) {
        snprintf(c->planh, sizeof(c->planh), "X-Test-Plan: %s", plan);
        c->h[n++] = c->planh;
    }
    c->h[n] = NULL;
    cr_assert_eq(pthread_create(&c->th, NULL, call_main, c), 0);
    c->started = true;
}

void http_call_join(struct http_call *c)
{
    if (c->started)
        pthread_join(c->th, NULL);
    c->started = false;
}

char *px_stderr(const struct px *p)
{
    return proc_read_file(p->err_path);
}

char *px_stdout(const struct px *p)
{
    return proc_read_file(p->out_path);
}

char *px_stdout_holding(const struct px *p, const char *needle, int timeout_ms)
{
    int64_t deadline = now_ms() + timeout_ms;
    char *out = px_stdout(p);
    while (!strstr(out, needle) && now_ms() < deadline) {
        usleep(10000);
        free(out);
        out = px_stdout(p);
    }
    return out;
}

static struct px *px_new(void)
{
    struct px *p = calloc(1, sizeof(*p));
    cr_assert_not_null(p);
    snprintf(p->dir, sizeof(p->dir), "/tmp/retryproxy-test-XXXXXX");
    cr_assert_not_null(mkdtemp(p->dir), "mkdtemp");
    snprintf(p->cfg_path, sizeof(p->cfg_path), "%s/config.json", p->dir);
    snprintf(p->out_path, sizeof(p->out_path), "%s/stdout", p->dir);
    snprintf(p->err_path, sizeof(p->err_path), "%s/stderr", p->dir);
    return p;
}

/* Spawns argv and waits for the start-up line that names both ports. */
static struct px *launch(struct px *p, char *const argv[])
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, p->out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, p->err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = posix_spawn(&p->pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    cr_assert_eq(e, 0, "cannot start %s: %s", argv[0], strerror(e));

    int64_t deadline = now_ms() + 10000;
    while (now_ms() < deadline) {
        char *err = px_stderr(p);
        const char *at = strstr(err, "listening on 127.0.0.1:");
        const char *adm = strstr(err, "admin on 127.0.0.1:");
        if (at && adm) {
            p->port = (uint16_t)atoi(at + strlen("listening on 127.0.0.1:"));
            p->admin_port = (uint16_t)atoi(adm + strlen("admin on 127.0.0.1:"));
            free(err);
            return p;
        }
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid)
            cr_assert_fail("retryproxy exited at start-up (status %d): %s", st, err);
        free(err);
        usleep(10000);
    }
    kill(p->pid, SIGKILL);
    cr_assert_fail("retryproxy did not report listening within 10 s");
    return NULL;
}

/* With RETRYPROXY_TEST_WORKERS=N in the environment (make tsan), a proxy started without
 * "--workers" gets "--workers N": the integration suites then run multi-threaded however many
 * cores the machine has. */
static size_t add_workers(char **argv, size_t argc, size_t cap)
{
    const char *w = getenv("RETRYPROXY_TEST_WORKERS");
    if (!w || !*w || argc + 2 >= cap)
        return argc;
    for (size_t i = 1; i < argc; i++)
        if (strcmp(argv[i], "--workers") == 0 || strncmp(argv[i], "--workers=", 10) == 0)
            return argc;
    argv[argc++] = "--workers";
    argv[argc++] = (char *)w;
    return argc;
}

struct px *px_start(const char *json, ...)
{
    va_list ap;
    va_start(ap, json);
    struct px *p = px_startv(json, ap);
    va_end(ap);
    return p;
}

struct px *px_startv(const char *json, va_list ap)
{
    struct px *p = px_new();
    FILE *f = fopen(p->cfg_path, "w");
    cr_assert_not_null(f);
    fputs(json, f);
    fclose(f);

    char *argv[20] = { (char *)proc_bin(), "-c",      p->cfg_path,  "--listen",
                       "127.0.0.1:0",      "--admin", "127.0.0.1:0" };
    size_t argc = 7;
    for (const char *a; argc < 18 && (a = va_arg(ap, const char *)) != NULL;)
        argv[argc++] = (char *)a;
    argc = add_workers(argv, argc, 20);
    argv[argc] = NULL;
    return launch(p, argv);
}

struct px *px_start_argv(const char *const *args)
{
    struct px *p = px_new();
    char *argv[24] = { (char *)proc_bin() };
    size_t argc = 1;
    for (size_t i = 0; args[i] && argc < 23; i++)
        argv[argc++] = (char *)args[i];
    argc = add_workers(argv, argc, 24);
    argv[argc] = NULL;
    return launch(p, argv);
}

/* A ThreadSanitizer report from the proxy fails the test that ran it (make tsan): in its
 * stderr, or in the file TSan writes instead when TSAN_OPTIONS sets log_path (PATH.PID, kept
 * for the make target, which lists every one after the suites). Returns true if there was one.
 * Criterion 2.4 ignores failed assertions in a suite's .fini, where most tests stop their
 * proxy, so px_stop() also aborts: a crash fails the suite wherever it happens. */
static bool sanitizer_report(const struct px *p)
{
    bool found = false;
    char *err = px_stderr(p);
    if (strstr(err, "WARNING: ThreadSanitizer:")) {
        fprintf(stderr, "ThreadSanitizer report in the proxy's stderr:\n%s", err);
        cr_expect_fail("ThreadSanitizer report in the proxy's stderr (pid %d)", (int)p->pid);
        found = true;
    }
    /* make asan: a leak, an invalid access or undefined behaviour in the proxy fails the test
     * that ran it, even when the proxy is stopped in a suite's .fini */
    if (strstr(err, "ERROR: AddressSanitizer") || strstr(err, "ERROR: LeakSanitizer") ||
        strstr(err, "runtime error:")) {
        fprintf(stderr, "sanitizer report in the proxy's stderr:\n%s", err);
        cr_expect_fail("sanitizer report in the proxy's stderr (pid %d)", (int)p->pid);
        found = true;
    }
    free(err);
    const char *opts = getenv("TSAN_OPTIONS");
    const char *lp = opts ? strstr(opts, "log_path=") : NULL;
    if (!lp)
        return found;
    lp += strlen("log_path=");
    char path[512];
    int n = (int)strcspn(lp, " :,");
    snprintf(path, sizeof(path), "%.*s.%d", n, lp, (int)p->pid);
    if (access(path, F_OK) == 0) {
        fprintf(stderr, "ThreadSanitizer report from the proxy (pid %d): %s\n", (int)p->pid, path);
        cr_expect_fail("ThreadSanitizer report from the proxy (pid %d): %s", (int)p->pid, path);
        found = true;
    }
    return found;
}

/* A proxy still running 'timeout_ms' after SIGTERM: its last log lines and, where gdb is
 * installed, where each of its threads is, on stderr before it is killed. Each line is marked as
 * Criterion marks its own ("[----] "), so make test's summary of what failed shows them (a CI
 * log keeps only its tail). */
static void report_stuck(const struct px *p, int timeout_ms)
{
    fprintf(stderr,
            "[----] retryproxy (pid %d) still running %d ms after SIGTERM; its last log lines:\n",
            (int)p->pid, timeout_ms);
    char *out = px_stdout(p);
    const char *from = out + strlen(out);
    for (int lines = 0; from > out && lines <= 8; from--)
        lines += from[-1] == '\n';
    for (const char *l = from; *l;) {
        const char *end = strchr(l, '\n');
        int len = end ? (int)(end - l) : (int)strlen(l);
        if (len)
            fprintf(stderr, "[----]   %.*s\n", len > 300 ? 300 : len, l);
        l = end ? end + 1 : l + len;
    }
    free(out);
    fflush(stderr);
    if (access("/usr/bin/gdb", X_OK) != 0)
        return;
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "timeout 10 /usr/bin/gdb -p %d -batch -nx -ex 'thread apply all bt 8' 2>/dev/null"
             " | grep --line-buffered -E '^(#|Thread)' | sed -u 's/^/[----]   /' >&2",
             (int)p->pid);
    if (system(cmd) != 0) {
        /* no backtrace: the lines above are what there is */
    }
}

int px_stop(struct px *p, int timeout_ms)
{
    int st = 0, rc = -1;
    kill(p->pid, SIGTERM);
    int64_t deadline = now_ms() + timeout_ms;
    while (now_ms() < deadline) {
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            break;
        }
        usleep(5000);
    }
    if (rc == -1) {
        report_stuck(p, timeout_ms);
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &st, 0);
    }
    bool report = sanitizer_report(p);
    rm_tree(p->dir);
    free(p);
    if (report)
        abort();
    return rc;
}

void px_stop_clean(struct px *p)
{
    int rc = px_stop(p, 10000);
    if (rc != 0) {
        /* Criterion 2.4 does not count a failed assertion in a suite's .fini: abort, which it
         * reports as a crash of the test */
        fprintf(stderr, "retryproxy did not exit cleanly: status %d\n", rc);
        abort();
    }
}

const char *px_url(const struct px *p, const char *path, char *buf, size_t cap)
{
    snprintf(buf, cap, "http://127.0.0.1:%u%s", p->port, path);
    return buf;
}

const char *px_admin_url(const struct px *p, const char *path, char *buf, size_t cap)
{
    snprintf(buf, cap, "http://127.0.0.1:%u%s", p->admin_port, path);
    return buf;
}

int px_threads(const struct px *p)
{
    return proc_entries(p->pid, "task");
}

int px_fds(const struct px *p)
{
    return proc_entries(p->pid, "fd");
}

long px_rss_kb(const struct px *p)
{
    return proc_status_kb(p->pid, "VmRSS");
}

long px_cpu_ms(const struct px *p)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)p->pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The name in parentheses may hold spaces: fields are counted after its ')'. */
    const char *q = strrchr(buf, ')');
    unsigned long ut, st;
    if (!q || sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (long)((ut + st) * 1000 / (unsigned long)sysconf(_SC_CLK_TCK));
}

/* ---- the client ---- */

struct sink {
    struct http_resp *r;
    size_t keep;
    FILE *hdr;
    char *hdr_buf;
    size_t hdr_len;
};

#define KEEP_BODY (4u << 20)

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    struct sink *s = ud;
    size_t len = size * n;
    struct http_resp *r = s->r;
    r->body_hash = tup_hash_update(r->body_hash, p, len);
    if (r->body_len + len <= KEEP_BODY) {
        unsigned char *b = realloc(r->body, r->body_len + len + 1);
        if (!b)
            return 0;
        memcpy(b + r->body_len, p, len);
        b[r->body_len + len] = '\0';
        r->body = b;
    }
    r->body_len += len;
    return len;
}

static size_t on_hdr(char *p, size_t size, size_t n, void *ud)
{
    struct sink *s = ud;
    fwrite(p, size, n, s->hdr);
    return size * n;
}

static void do_request(const char *method, const char *url, const char *const *headers,
                       const void *body, size_t body_len, long timeout_ms, long version,
                       struct http_resp *out)
{
    memset(out, 0, sizeof(*out));
    out->body_hash = TUP_HASH_INIT;
    struct sink s = { .r = out };
    s.hdr = open_memstream(&s.hdr_buf, &s.hdr_len);
    CURL *e = curl_easy_init();
    struct curl_slist *h = NULL;
    for (size_t i = 0; headers && headers[i]; i++)
        h = curl_slist_append(h, headers[i]);
    h = curl_slist_append(h, "Expect:");
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_hdr);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &s);
    if (version)
        curl_easy_setopt(e, CURLOPT_HTTP_VERSION, version);
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    else if (strcmp(method, "GET") != 0 || body)
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    }
    int64_t t0 = now_ms();
    out->rc = curl_easy_perform(e);
    out->seconds = (double)(now_ms() - t0) / 1000.0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &out->status);
    fclose(s.hdr);
    out->headers = s.hdr_buf;
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
}

void http_do(const char *method, const char *url, const char *const *headers, const void *body,
             size_t body_len, long timeout_ms, struct http_resp *out)
{
    do_request(method, url, headers, body, body_len, timeout_ms, 0, out);
}

void http_do_h2(const char *method, const char *url, const char *const *headers, const void *body,
                size_t body_len, long timeout_ms, struct http_resp *out)
{
    do_request(method, url, headers, body, body_len, timeout_ms,
               CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE, out);
}

const char *http_header(const struct http_resp *r, const char *name, char *buf, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *line = r->headers; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len > nl && strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (*v == ' ')
                v++;
            size_t vl = (size_t)(line + len - v);
            while (vl && (v[vl - 1] == '\r' || v[vl - 1] == ' '))
                vl--;
            snprintf(buf, cap, "%.*s", (int)vl, v);
            return buf;
        }
        line = end ? end + 1 : line + len;
    }
    return NULL;
}

const char *http_hdr(const struct http_resp *r, const char *name)
{
    static char v[512];
    return http_header(r, name, v, sizeof(v));
}

size_t http_discard(char *p, size_t size, size_t n, void *ud)
{
    (void)p;
    (void)ud;
    return size * n;
}

void http_free(struct http_resp *r)
{
    free(r->headers);
    free(r->body);
    memset(r, 0, sizeof(*r));
}
