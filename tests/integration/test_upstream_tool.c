/* Self-test of the test upstream (tests/support/tup.h) and of build/tests/upstream.
 *
 * Every directive and record field is exercised for real over 127.0.0.1: libcurl as the
 * client where a normal client is wanted, raw sockets where the bytes on the wire matter.
 */
#include "tests/support/tup.h"

#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static struct tup *T;
/* A spawned tool not yet reaped: teardown kills it if an assertion cut the test short. */
static pid_t tool_pid;

static void setup(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    T = tup_start();
}

static void teardown(void)
{
    if (tool_pid > 0) {
        kill(tool_pid, SIGKILL);
        waitpid(tool_pid, NULL, 0);
        tool_pid = 0;
    }
    tup_stop(T);
    T = NULL;
    curl_global_cleanup();
}

TestSuite(upstream_tool, .init = setup, .fini = teardown);

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double ms_since(int64_t start)
{
    return (double)(now_ns() - start) / 1e6;
}

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kb = strtol(line + 6, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kb;
}

/* ---- libcurl client ---- */

#define KEEP_MAX (16u * 1024 * 1024)

struct resp {
    CURLcode rc;
    long status;
    uint64_t body_len;
    uint64_t body_hash;
    unsigned char *body; /* first KEEP_MAX bytes */
    size_t body_cap;
    char attempt[32];
    char conn[32];
    char retry_after[256];
    char te[64];
    char connection[64];
    char content_length[32];
    double ms;
    bool no_keep; /* hash and count only */
    bool sample_rss;
    long rss_max_kb;
    uint64_t next_sample;
};

struct req {
    const char *method;
    const char *path;
    const char *plan;
    const char *id;
    const void *body;
    size_t body_len;
    bool chunked_upload;
    const char *extra[8];
    long timeout_ms;
};

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    struct resp *r = ud;
    size_t len = size * n;
    r->body_hash = tup_hash_update(r->body_hash, p, len);
    if (!r->no_keep && r->body_len < KEEP_MAX) {
        size_t k = KEEP_MAX - r->body_len < len ? KEEP_MAX - r->body_len : len;
        if (r->body_len + k > r->body_cap) {
            size_t cap = r->body_cap ? r->body_cap : 4096;
            while (cap < r->body_len + k)
                cap *= 2;
            r->body = realloc(r->body, cap);
            cr_assert(r->body != NULL);
            r->body_cap = cap;
        }
        memcpy(r->body + r->body_len, p, k);
    }
    r->body_len += len;
    if (r->sample_rss && r->body_len >= r->next_sample) {
        long kb = rss_kb();
        if (kb > r->rss_max_kb)
            r->rss_max_kb = kb;
        r->next_sample += 4u * 1024 * 1024;
    }
    return len;
}

static void copy_value(char *dst, size_t cap, const char *v, size_t n)
{
    while (n > 0 && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
        n--;
    while (n > 0 && *v == ' ') {
        v++;
        n--;
    }
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = '\0';
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
    struct resp *r = ud;
    size_t len = size * n;
    static const struct {
        const char *name;
        size_t off;
        size_t cap;
    } want[] = {
        { "X-Tup-Attempt:", offsetof(struct resp, attempt), sizeof r->attempt },
        { "X-Tup-Conn:", offsetof(struct resp, conn), sizeof r->conn },
        { "Retry-After:", offsetof(struct resp, retry_after), sizeof r->retry_after },
        { "Transfer-Encoding:", offsetof(struct resp, te), sizeof r->te },
        { "Connection:", offsetof(struct resp, connection), sizeof r->connection },
        { "Content-Length:", offsetof(struct resp, content_length), sizeof r->content_length },
    };
    if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) {
        /* A new status line (after a 100 Continue, say): forget earlier headers. */
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
            ((char *)r + want[i].off)[0] = '\0';
    }
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        size_t k = strlen(want[i].name);
        if (len > k && strncasecmp(p, want[i].name, k) == 0)
            copy_value((char *)r + want[i].off, want[i].cap, p + k, len - k);
    }
    return len;
}

struct upload {
    const unsigned char *p;
    size_t len;
    size_t off;
};

static size_t on_read(char *dst, size_t size, size_t n, void *ud)
{
    struct upload *u = ud;
    size_t k = size * n;
    if (k > u->len - u->off)
        k = u->len - u->off;
    memcpy(dst, u->p + u->off, k);
    u->off += k;
    return k;
}

static void resp_free(struct resp *r)
{
    free(r->body);
    memset(r, 0, sizeof *r);
}

/* Sets up h for q, collecting into r; the returned list is freed by the caller. */
static struct curl_slist *prepare(CURL *h, const struct req *q, struct resp *r, struct upload *u)
{
    char url[512];
    char line[1024];
    struct curl_slist *hl = NULL;
    memset(r, 0, sizeof *r);
    r->body_hash = TUP_HASH_INIT;
    r->rss_max_kb = -1;
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", tup_port(T), q->path ? q->path : "/");
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_PROXY, "");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, q->timeout_ms ? q->timeout_ms : 10000L);
    curl_easy_setopt(h, CURLOPT_EXPECT_100_TIMEOUT_MS, 5000L);
    if (q->plan) {
        snprintf(line, sizeof line, "X-Test-Plan: %s", q->plan);
        hl = curl_slist_append(hl, line);
    }
    if (q->id) {
        snprintf(line, sizeof line, "X-Request-Id: %s", q->id);
        hl = curl_slist_append(hl, line);
    }
    for (size_t i = 0; i < sizeof q->extra / sizeof q->extra[0] && q->extra[i]; i++)
        hl = curl_slist_append(hl, q->extra[i]);
    if (q->chunked_upload) {
        u->p = q->body;
        u->len = q->body_len;
        u->off = 0;
        hl = curl_slist_append(hl, "Transfer-Encoding: chunked");
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, u);
    } else if (q->body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->body);
    }
    if (q->method)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, q->method);
    if (q->method && strcmp(q->method, "HEAD") == 0) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, NULL);
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    return hl;
}

/* One request on h (kept connections are reused), or on a fresh handle if h is NULL. */
static void perform_on(CURL *h, const struct req *q, struct resp *r)
{
    CURL *own = NULL;
    struct upload u;
    if (!h)
        h = own = curl_easy_init();
    cr_assert(h != NULL);
    struct curl_slist *hl = prepare(h, q, r, &u);
    int64_t t0 = now_ns();
    r->rc = curl_easy_perform(h);
    r->ms = ms_since(t0);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(hl);
    if (own)
        curl_easy_cleanup(own);
}

static void perform(const struct req *q, struct resp *r)
{
    perform_on(NULL, q, r);
}

static void get_plan(const char *plan, const char *id, struct resp *r)
{
    struct req q = { .plan = plan, .id = id };
    perform(&q, r);
}

static unsigned char *random_bytes(size_t n, unsigned seed)
{
    unsigned char *p = malloc(n);
    uint64_t x = seed * UINT64_C(0x9e3779b97f4a7c15) + 1;
    cr_assert(p != NULL);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (unsigned char)x;
    }
    return p;
}

/* ---- raw socket client ---- */

struct raw {
    int fd;
    char buf[1 << 17];
    size_t len;
};

struct raw_resp {
    int status;
    char head[8192];
    uint64_t body_len;
    uint64_t body_hash;
    char body[4096];
};

static void raw_open(struct raw *c)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(tup_port(T)) };
    struct timeval tv = { .tv_sec = 5 };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c->len = 0;
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(c->fd >= 0, "socket: %s", strerror(errno));
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    cr_assert(connect(c->fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect: %s",
              strerror(errno));
}

static struct raw *raw_new(void)
{
    struct raw *c = malloc(sizeof *c);
    cr_assert(c != NULL);
    raw_open(c);
    return c;
}

static void raw_free(struct raw *c)
{
    if (c->fd >= 0)
        close(c->fd);
    free(c);
}

static void raw_send(struct raw *c, const void *p, size_t n)
{
    const char *s = p;
    while (n > 0) {
        ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL);
        cr_assert(w > 0, "send: %s", strerror(errno));
        s += w;
        n -= (size_t)w;
    }
}

static void raw_sends(struct raw *c, const char *s)
{
    raw_send(c, s, strlen(s));
}

/* Reads more into the buffer: bytes read, 0 on EOF, -1 on error (errno kept). */
static ssize_t raw_fill(struct raw *c)
{
    cr_assert(c->len < sizeof c->buf, "raw buffer full");
    ssize_t n;
    do {
        n = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
    } while (n < 0 && errno == EINTR);
    if (n > 0)
        c->len += (size_t)n;
    return n;
}

static void raw_take(struct raw *c, size_t n)
{
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
}

static const char *raw_header(const struct raw_resp *r, const char *name, char *out, size_t cap)
{
    size_t n = strlen(name);
    for (const char *p = strstr(r->head, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n")) {
        const char *line = p + 2;
        if (strncasecmp(line, name, n) == 0 && line[n] == ':') {
            const char *v = line + n + 1;
            const char *e = strstr(v, "\r\n");
            copy_value(out, cap, v, (size_t)(e - v));
            return out;
        }
    }
    return NULL;
}

/* Reads one Content-Length-framed response (HEAD answers: head only). */
static void raw_read(struct raw *c, struct raw_resp *r, bool head_only)
{
    char *end;
    memset(r, 0, sizeof *r);
    while (!(end = memmem(c->buf, c->len, "\r\n\r\n", 4))) {
        ssize_t n = raw_fill(c);
        cr_assert(n > 0, "connection ended before a response head (%zd, %s)", n,
                  n < 0 ? strerror(errno) : "EOF");
    }
    size_t hl = (size_t)(end - c->buf) + 4;
    cr_assert(hl < sizeof r->head);
    memcpy(r->head, c->buf, hl);
    r->head[hl] = '\0';
    raw_take(c, hl);
    cr_assert(sscanf(r->head, "HTTP/1.1 %d ", &r->status) == 1, "bad status line: %s", r->head);
    char v[64];
    uint64_t len = 0;
    if (!head_only && raw_header(r, "Content-Length", v, sizeof v))
        len = strtoull(v, NULL, 10);
    r->body_hash = TUP_HASH_INIT;
    while (r->body_len < len) {
        if (c->len == 0)
            cr_assert(raw_fill(c) > 0, "connection ended inside a body");
        size_t k = len - r->body_len < c->len ? (size_t)(len - r->body_len) : c->len;
        if (r->body_len < sizeof r->body - 1) {
            size_t room = sizeof r->body - 1 - (size_t)r->body_len;
            memcpy(r->body + r->body_len, c->buf, k < room ? k : room);
        }
        r->body_hash = tup_hash_update(r->body_hash, c->buf, k);
        r->body_len += k;
        raw_take(c, k);
    }
}

/* Bytes received until the peer closed (FIN or RST); asserts it does within the timeout. */
static size_t raw_until_closed(struct raw *c)
{
    size_t total = c->len;
    c->len = 0;
    for (;;) {
        ssize_t n = recv(c->fd, c->buf, sizeof c->buf, 0);
        if (n > 0) {
            total += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        cr_assert(n == 0 || errno == ECONNRESET, "expected close, got %s", strerror(errno));
        return total;
    }
}

/* ---- hash and pattern ---- */

Test(upstream_tool, hash_and_pattern, .timeout = 30)
{
    cr_assert_eq(tup_hash("", 0), TUP_HASH_INIT);
    /* Published FNV-1a 64 test vectors. */
    cr_assert_eq(tup_hash("a", 1), UINT64_C(0xaf63dc4c8601ec8c));
    cr_assert_eq(tup_hash("foobar", 6), UINT64_C(0x85944171f73967e8));
    uint64_t h = tup_hash_update(TUP_HASH_INIT, "foo", 3);
    cr_assert_eq(tup_hash_update(h, "bar", 3), tup_hash("foobar", 6));

    unsigned char buf[5000];
    tup_pattern_fill(buf, 0, sizeof buf);
    cr_assert_eq(tup_pattern_hash(sizeof buf), tup_hash(buf, sizeof buf));
    cr_assert_eq(tup_pattern_hash(0), TUP_HASH_INIT);
    for (size_t i = 0; i < sizeof buf; i++) {
        cr_assert_eq(buf[i], tup_pattern_byte(i));
        if (i % 64 == 63)
            cr_assert_eq(buf[i], '\n');
        else
            cr_assert(buf[i] >= '+' && buf[i] <= 'z', "byte %zu is %d", i, buf[i]);
    }
    /* A pattern shifted by a block must differ: lost or repeated data changes the hash. */
    unsigned char off[4096];
    tup_pattern_fill(off, 4096, sizeof off);
    cr_assert(memcmp(buf, off, sizeof off) != 0);
    cr_assert_neq(tup_pattern_hash(100000), tup_pattern_hash(100001));
}

Test(upstream_tool, plan_check, .timeout = 30)
{
    char err[256];
    cr_assert_eq(tup_plan_check("", err, sizeof err), 0);
    cr_assert_eq(tup_plan_check(" fail = 2 ; action = reset-mid ; body = 10 ;", err, sizeof err),
                 0);
    cr_assert_eq(tup_plan_check("retry-after=Wed, 21 Oct 2015 07:28:00 GMT", err, sizeof err), 0);
    cr_assert_eq(tup_plan_check("fial=2", err, sizeof err), -1);
    cr_assert(strstr(err, "fial") != NULL, "%s", err);
    cr_assert_eq(tup_plan_check("fail=two", err, sizeof err), -1);
    cr_assert(strstr(err, "fail") && strstr(err, "two"), "%s", err);
    cr_assert_eq(tup_plan_check("action=explode", err, sizeof err), -1);
    cr_assert_eq(tup_plan_check("status=99", err, sizeof err), -1);
    cr_assert_eq(tup_plan_check("status=600", err, sizeof err), -1);
    cr_assert_eq(tup_plan_check("chunked=2", err, sizeof err), -1);
    cr_assert_eq(tup_plan_check("delay", err, sizeof err), -1);
    cr_assert_eq(tup_plan_check("retry-after=", err, sizeof err), -1);
    cr_assert_eq(tup_plan_check("body=-1", err, sizeof err), -1);
}

/* ---- directives ---- */

Test(upstream_tool, fail_counts_per_request_id, .timeout = 30)
{
    struct resp r;
    const char *plan = "fail=2;status=503";
    long want[] = { 503, 503, 200, 200 };
    for (int i = 0; i < 4; i++) {
        get_plan(plan, "id-a", &r);
        cr_assert_eq(r.rc, CURLE_OK, "%s", curl_easy_strerror(r.rc));
        cr_assert_eq(r.status, want[i], "attempt %d: %ld", i + 1, r.status);
        cr_assert_eq(atoi(r.attempt), i + 1);
        resp_free(&r);
    }
    get_plan(plan, "id-b", &r);
    cr_assert_eq(r.status, 503);
    cr_assert_str_eq(r.attempt, "1");
    resp_free(&r);
    get_plan(plan, NULL, &r);
    cr_assert_eq(r.status, 503);
    resp_free(&r);

    cr_assert_eq(tup_count(T), 6);
    cr_assert_eq(tup_count_id(T, "id-a"), 4);
    cr_assert_eq(tup_count_id(T, "id-b"), 1);
    cr_assert_eq(tup_count_id(T, ""), 1);
    cr_assert_eq(tup_count_id(T, "nope"), 0);
    for (size_t i = 0; i < 4; i++) {
        const struct tup_req *q = tup_get(T, i);
        cr_assert_eq(q->seq, i);
        cr_assert_str_eq(q->request_id, "id-a");
        cr_assert_eq(q->key_attempt, i + 1);
        cr_assert_str_eq(q->method, "GET");
        cr_assert_str_eq(q->target, "/");
        cr_assert_eq(q->body_len, 0);
        cr_assert_eq(q->body_hash, TUP_HASH_INIT);
        cr_assert_eq(q->body_kept, 0);
    }
    cr_assert_eq(tup_get(T, 4)->key_attempt, 1);
    cr_assert_str_eq(tup_get(T, 5)->request_id, "");
    cr_assert_null(tup_get(T, 6));
    /* Arrival times follow the order of the requests. */
    for (size_t i = 1; i < 6; i++)
        cr_assert(tup_get(T, i)->arrival_ns > tup_get(T, i - 1)->arrival_ns);
}

Test(upstream_tool, status_and_retry_after, .timeout = 30)
{
    struct resp r;
    get_plan("fail=1;status=429;retry-after=7", "ra-1", &r);
    cr_assert_eq(r.status, 429);
    cr_assert_str_eq(r.retry_after, "7");
    resp_free(&r);
    get_plan("fail=1;status=429;retry-after=7", "ra-1", &r);
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.retry_after, "", "success answers carry no Retry-After");
    resp_free(&r);

    get_plan(" status = 503 ; retry-after = Wed, 21 Oct 2015 07:28:00 GMT ; fail = 1 ", "ra-2", &r);
    cr_assert_eq(r.status, 503);
    cr_assert_str_eq(r.retry_after, "Wed, 21 Oct 2015 07:28:00 GMT");
    resp_free(&r);

    get_plan("fail=1;status=502", "ra-3", &r);
    cr_assert_eq(r.status, 502);
    cr_assert_str_eq(r.retry_after, "");
    resp_free(&r);
}

Test(upstream_tool, hang_until_client_gives_up, .timeout = 30)
{
    struct resp r;
    struct req q = { .plan = "fail=1;action=hang", .id = "hang-1", .timeout_ms = 300 };
    perform(&q, &r);
    cr_assert_eq(r.rc, CURLE_OPERATION_TIMEDOUT, "%s", curl_easy_strerror(r.rc));
    cr_assert(r.ms >= 250, "gave up after %.0f ms", r.ms);
    cr_assert_eq(r.body_len, 0);
    cr_assert_eq(tup_wait_count(T, 1, 2000), 0);
    cr_assert_str_eq(tup_get(T, 0)->request_id, "hang-1");
    /* curl closed its side; tup notices and lets go of the connection. */
    cr_assert_eq(tup_wait_open_at_most(T, 0, 5000), 0);
    resp_free(&r);

    /* The second attempt of the same key succeeds. */
    get_plan("fail=1;action=hang", "hang-1", &r);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
}

Test(upstream_tool, reset_and_close_send_nothing, .timeout = 30)
{
    struct resp r;
    get_plan("fail=1;action=reset", "rst", &r);
    cr_assert(r.rc == CURLE_GOT_NOTHING || r.rc == CURLE_RECV_ERROR, "reset: %d %s", r.rc,
              curl_easy_strerror(r.rc));
    cr_assert_eq(r.body_len, 0);
    resp_free(&r);
    get_plan("fail=1;action=close", "cls", &r);
    cr_assert(r.rc == CURLE_GOT_NOTHING || r.rc == CURLE_RECV_ERROR, "close: %d %s", r.rc,
              curl_easy_strerror(r.rc));
    cr_assert_eq(r.body_len, 0);
    resp_free(&r);
    cr_assert_eq(tup_count(T), 2);
    cr_assert_str_eq(tup_get(T, 0)->request_id, "rst");
    cr_assert_str_eq(tup_get(T, 1)->request_id, "cls");

    /* On the wire: reset is an RST or an empty read, close is a clean EOF, no bytes either. */
    struct raw *c = raw_new();
    raw_sends(c, "GET /r HTTP/1.1\r\nHost: x\r\nX-Request-Id: rst\r\n"
                 "X-Test-Plan: fail=2;action=reset\r\n\r\n");
    cr_assert_eq(raw_until_closed(c), 0);
    raw_free(c);
    c = raw_new();
    raw_sends(c, "GET /c HTTP/1.1\r\nHost: x\r\nX-Request-Id: cls\r\n"
                 "X-Test-Plan: fail=2;action=close\r\n\r\n");
    char b;
    cr_assert_eq(recv(c->fd, &b, 1, 0), 0, "close must be a FIN without bytes");
    raw_free(c);
}

Test(upstream_tool, reset_mid_body, .timeout = 30)
{
    struct resp r;
    get_plan("fail=1;action=reset-mid;body=200000", "rm", &r);
    cr_assert(r.rc == CURLE_PARTIAL_FILE || r.rc == CURLE_RECV_ERROR, "%d %s", r.rc,
              curl_easy_strerror(r.rc));
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.content_length, "200000");
    cr_assert(r.body_len <= 100000, "got %" PRIu64 " bytes", r.body_len);
    /* What did arrive is the start of the pattern. */
    cr_assert_eq(r.body_hash, tup_pattern_hash(r.body_len));
    resp_free(&r);

    /* Raw: exactly half the declared body arrives before the reset. */
    struct raw *c = raw_new();
    raw_sends(c, "GET /rm HTTP/1.1\r\nHost: x\r\nX-Test-Plan: fail=1;action=reset-mid\r\n"
                 "X-Request-Id: rm2\r\n\r\n");
    size_t total = raw_until_closed(c);
    raw_free(c);
    cr_assert(total > 32768 && total < 32768 + 1024, "received %zu bytes", total);
    cr_assert_eq(tup_count(T), 2);
}

/* stall-mid: half the declared body, then nothing, until the peer closes. */
Test(upstream_tool, stall_mid_body, .timeout = 30)
{
    struct raw *c = raw_new();
    raw_sends(c, "GET /sm HTTP/1.1\r\nHost: x\r\nX-Test-Plan: fail=1;action=stall-mid;body=2000\r\n"
                 "X-Request-Id: sm\r\n\r\n");
    char buf[4096];
    size_t total = 0;
    struct pollfd p = { .fd = c->fd, .events = POLLIN };
    while (total < sizeof buf && poll(&p, 1, 500) == 1) {
        ssize_t n = recv(c->fd, buf + total, sizeof buf - total, 0);
        cr_assert_gt(n, 0, "the stalled answer ended");
        total += (size_t)n;
    }
    const char *body = memmem(buf, total, "\r\n\r\n", 4);
    cr_assert_not_null(body);
    cr_assert_eq(total - (size_t)(body + 4 - buf), 1000, "received %zu bytes", total);
    cr_assert_eq(tup_open_connections(T), 1);
    raw_free(c);
    cr_assert_eq(tup_wait_open_at_most(T, 0, 5000), 0, "the peer's close was not seen");
}

Test(upstream_tool, delay_before_answer, .timeout = 30)
{
    struct resp r;
    get_plan("delay=200", "d1", &r);
    cr_assert_eq(r.status, 200);
    cr_assert(r.ms >= 180, "answered after %.0f ms", r.ms);
    resp_free(&r);
    get_plan("fail=1;status=503;delay=200", "d2", &r);
    cr_assert_eq(r.status, 503);
    cr_assert(r.ms >= 180, "failed after %.0f ms", r.ms);
    resp_free(&r);
    /* Without delay it is quick (generous bound for a loaded machine). */
    get_plan("", "d3", &r);
    cr_assert(r.ms < 150, "took %.0f ms", r.ms);
    resp_free(&r);
}

Test(upstream_tool, ok_body_chunked, .timeout = 30)
{
    struct resp r;
    get_plan("", NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_eq(r.body_len, 3);
    cr_assert(memcmp(r.body, "ok\n", 3) == 0);
    cr_assert_str_eq(r.content_length, "3");
    resp_free(&r);

    get_plan("ok=201;body=100000", NULL, &r);
    cr_assert_eq(r.status, 201);
    cr_assert_eq(r.body_len, 100000);
    cr_assert_eq(r.body_hash, tup_pattern_hash(100000));
    cr_assert_str_eq(r.te, "");
    resp_free(&r);

    get_plan("body=100000;chunked=1", NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.te, "chunked");
    cr_assert_str_eq(r.content_length, "");
    cr_assert_eq(r.body_len, 100000);
    cr_assert_eq(r.body_hash, tup_pattern_hash(100000));
    resp_free(&r);

    get_plan("chunked=1", NULL, &r);
    cr_assert_str_eq(r.te, "chunked");
    cr_assert_eq(r.body_len, 3);
    cr_assert(memcmp(r.body, "ok\n", 3) == 0);
    resp_free(&r);

    get_plan("body=0;chunked=1", NULL, &r);
    cr_assert_eq(r.rc, CURLE_OK);
    cr_assert_eq(r.body_len, 0);
    resp_free(&r);

    get_plan("ok=204", NULL, &r);
    cr_assert_eq(r.rc, CURLE_OK);
    cr_assert_eq(r.status, 204);
    cr_assert_eq(r.body_len, 0);
    resp_free(&r);

    struct req q = { .method = "HEAD", .plan = "body=5000" };
    perform(&q, &r);
    cr_assert_eq(r.rc, CURLE_OK, "%s", curl_easy_strerror(r.rc));
    cr_assert_str_eq(r.content_length, "5000");
    cr_assert_eq(r.body_len, 0);
    cr_assert_str_eq(tup_get(T, 6)->method, "HEAD");
    resp_free(&r);
}

Test(upstream_tool, echo_bodies, .timeout = 30)
{
    size_t n = 300000;
    unsigned char *data = random_bytes(n, 1);
    struct resp r;
    struct req q = { .path = "/echo", .plan = "echo=1", .body = data, .body_len = n };
    perform(&q, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_eq(r.body_len, n);
    cr_assert(memcmp(r.body, data, n) == 0);
    resp_free(&r);

    q.plan = "echo=1;chunked=1;ok=202";
    q.chunked_upload = true;
    perform(&q, &r);
    cr_assert_eq(r.status, 202);
    cr_assert_str_eq(r.te, "chunked");
    cr_assert_eq(r.body_len, n);
    cr_assert_eq(r.body_hash, tup_hash(data, n));
    resp_free(&r);

    /* An empty body echoes as empty. */
    struct req e = { .path = "/echo", .plan = "echo=1", .body = "", .body_len = 0 };
    perform(&e, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_eq(r.body_len, 0);
    resp_free(&r);
    free(data);
}

Test(upstream_tool, echo_refuses_over_8mib, .timeout = 30)
{
    size_t n = TUP_ECHO_MAX + 4096;
    unsigned char *data = random_bytes(n, 2);
    struct resp r;
    struct req q = { .path = "/big", .plan = "echo=1", .id = "e413", .body = data, .body_len = n };
    perform(&q, &r);
    cr_assert_eq(r.rc, CURLE_OK, "%s", curl_easy_strerror(r.rc));
    cr_assert_eq(r.status, 413);
    resp_free(&r);
    const struct tup_req *rec = tup_get(T, 0);
    cr_assert_eq(rec->body_len, n);
    cr_assert_eq(rec->body_hash, tup_hash(data, n));
    cr_assert_eq(rec->body_kept, TUP_BODY_KEEP);
    cr_assert(memcmp(rec->body, data, TUP_BODY_KEEP) == 0);
    /* The connection stays usable for the next request. */
    get_plan("", "after", &r);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    free(data);
}

Test(upstream_tool, post_1mib_recorded, .timeout = 30)
{
    size_t n = 1024 * 1024;
    unsigned char *data = random_bytes(n, 3);
    struct resp r;
    struct req q = {
        .method = "POST", .path = "/upload?x=1", .id = "p1", .body = data, .body_len = n
    };
    perform(&q, &r);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    q.id = "p2";
    q.chunked_upload = true;
    perform(&q, &r);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    /* Expect: 100-continue is answered at once (curl would wait 5 s otherwise). */
    q.id = "p3";
    q.chunked_upload = false;
    q.extra[0] = "Expect: 100-continue";
    perform(&q, &r);
    cr_assert_eq(r.status, 200);
    cr_assert(r.ms < 4000, "Expect: 100-continue took %.0f ms", r.ms);
    resp_free(&r);

    cr_assert_eq(tup_count(T), 3);
    for (size_t i = 0; i < 3; i++) {
        const struct tup_req *rec = tup_get(T, i);
        cr_assert_str_eq(rec->method, "POST");
        cr_assert_str_eq(rec->target, "/upload?x=1");
        cr_assert_eq(rec->body_len, n);
        cr_assert_eq(rec->body_hash, tup_hash(data, n));
        cr_assert_eq(rec->body_kept, TUP_BODY_KEEP);
        cr_assert(memcmp(rec->body, data, TUP_BODY_KEEP) == 0);
    }
    cr_assert_str_eq(tup_req_header(tup_get(T, 0), "content-length"), "1048576");
    cr_assert_str_eq(tup_req_header(tup_get(T, 1), "Transfer-Encoding"), "chunked");
    cr_assert_null(tup_req_header(tup_get(T, 1), "Content-Length"));
    cr_assert_str_eq(tup_req_header(tup_get(T, 2), "Expect"), "100-continue");
    free(data);
}

Test(upstream_tool, streams_100mib_in_constant_memory, .timeout = 30)
{
    uint64_t n = UINT64_C(100) * 1024 * 1024;
    struct resp r;
    CURL *h = curl_easy_init();
    struct upload u;
    struct req q = { .plan = "body=104857600", .timeout_ms = 25000 };
    struct curl_slist *hl = prepare(h, &q, &r, &u);
    /* Hash as it streams and keep nothing, so any growth is tup's (or curl's). */
    r.no_keep = true;
    r.sample_rss = true;
    long before = rss_kb();
    r.rss_max_kb = before;
    int64_t t0 = now_ns();
    CURLcode rc = curl_easy_perform(h);
    double ms = ms_since(t0);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    cr_assert_eq(rc, CURLE_OK, "%s", curl_easy_strerror(rc));
    cr_assert_eq(r.status, 200);
    cr_assert_eq(r.body_len, n);
    cr_assert_eq(r.body_hash, tup_pattern_hash(n));
    long after = rss_kb();
    if (after > r.rss_max_kb)
        r.rss_max_kb = after;
    long growth = r.rss_max_kb - before;
    cr_log_info("100 MiB in %.0f ms, RSS %ld kB -> peak %ld kB (+%ld kB)", ms, before, r.rss_max_kb,
                growth);
    cr_assert(growth < 64 * 1024, "RSS grew by %ld kB", growth);
    resp_free(&r);
}

Test(upstream_tool, headers_in_order_with_duplicates, .timeout = 30)
{
    struct resp r;
    struct req q = { .path = "/h/p?q=1&r=2",
                     .plan = "ok=200",
                     .id = "hdr",
                     .extra = { "X-Dup: first", "X-Other:   spaced value   ", "x-dup: second",
                                "X-Empty;" } };
    perform(&q, &r);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    const struct tup_req *rec = tup_get(T, 0);
    cr_assert_str_eq(rec->target, "/h/p?q=1&r=2");
    cr_assert_eq(tup_req_header_count(rec, "X-DUP"), 2);
    cr_assert_str_eq(tup_req_header(rec, "x-Dup"), "first");
    cr_assert_str_eq(tup_req_header(rec, "X-Other"), "spaced value");
    cr_assert_str_eq(tup_req_header(rec, "X-Empty"), "");
    cr_assert_null(tup_req_header(rec, "X-Missing"));
    cr_assert_eq(tup_req_header_count(rec, "X-Missing"), 0);
    char host[64];
    snprintf(host, sizeof host, "127.0.0.1:%u", tup_port(T));
    cr_assert_str_eq(tup_req_header(rec, "Host"), host);
    /* Received order: find the positions of the three custom headers. */
    int first = -1, other = -1, second = -1;
    for (size_t i = 0; i < rec->n_headers; i++) {
        const struct tup_header *h = &rec->headers[i];
        if (strcmp(h->name, "X-Dup") == 0)
            first = (int)i;
        else if (strcmp(h->name, "X-Other") == 0)
            other = (int)i;
        else if (strcmp(h->name, "x-dup") == 0)
            second = (int)i;
    }
    cr_assert(first >= 0 && other == first + 1 && second == other + 1, "%d %d %d", first, other,
              second);
    cr_assert_str_eq(rec->headers[second].value, "second");
    cr_assert_str_eq(tup_req_header(rec, "X-Test-Plan"), "ok=200");
}

Test(upstream_tool, keep_alive_reuse, .timeout = 30)
{
    CURL *h = curl_easy_init();
    struct resp r1, r2;
    struct req q = { .path = "/one", .id = "ka" };
    perform_on(h, &q, &r1);
    q.path = "/two";
    perform_on(h, &q, &r2);
    curl_easy_cleanup(h);
    cr_assert_eq(r1.status, 200);
    cr_assert_eq(r2.status, 200);
    cr_assert_str_eq(r1.conn, r2.conn);
    cr_assert_str_eq(r2.attempt, "2");
    cr_assert_eq(tup_connections(T), 1);
    const struct tup_req *a = tup_get(T, 0);
    const struct tup_req *b = tup_get(T, 1);
    cr_assert_eq(a->conn_id, b->conn_id);
    cr_assert_eq(a->conn_id, strtoull(r1.conn, NULL, 10));
    cr_assert_eq(a->conn_index, 1);
    cr_assert_eq(b->conn_index, 2);
    cr_assert_str_eq(b->target, "/two");
    resp_free(&r1);
    resp_free(&r2);
    /* curl_easy_cleanup closed the connection. */
    cr_assert_eq(tup_wait_open_at_most(T, 0, 5000), 0);

    /* A new handle opens a new connection. */
    get_plan("", "ka2", &r1);
    cr_assert_eq(tup_connections(T), 2);
    cr_assert_eq(tup_get(T, 2)->conn_index, 1);
    cr_assert_neq(tup_get(T, 2)->conn_id, a->conn_id);
    resp_free(&r1);
}

Test(upstream_tool, close_after_and_connection_close, .timeout = 30)
{
    struct raw *c = raw_new();
    struct raw_resp rr;
    char v[64];
    raw_sends(c, "GET /a HTTP/1.1\r\nHost: x\r\nX-Test-Plan: close-after=1\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    cr_assert_str_eq(raw_header(&rr, "Connection", v, sizeof v), "close");
    cr_assert_eq(raw_until_closed(c), 0);
    raw_free(c);

    c = raw_new();
    raw_sends(c, "GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    cr_assert_str_eq(raw_header(&rr, "Connection", v, sizeof v), "close");
    cr_assert_eq(raw_until_closed(c), 0);
    raw_free(c);

    /* HTTP/1.0: closes unless keep-alive was asked for. */
    c = raw_new();
    raw_sends(c, "GET /c HTTP/1.0\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    cr_assert_eq(raw_until_closed(c), 0);
    raw_free(c);

    c = raw_new();
    raw_sends(c, "GET /d HTTP/1.0\r\nConnection: keep-alive\r\nX-Test-Plan: body=10\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    cr_assert_eq(rr.body_len, 10);
    cr_assert_str_eq(raw_header(&rr, "Connection", v, sizeof v), "keep-alive");
    raw_sends(c, "GET /e HTTP/1.0\r\nConnection: keep-alive\r\nX-Test-Plan: chunked=1\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    cr_assert_str_eq(raw_header(&rr, "Content-Length", v, sizeof v), "3",
                     "no chunked answers to HTTP/1.0");
    raw_free(c);
    cr_assert_eq(tup_count(T), 5);
    cr_assert_eq(tup_get(T, 4)->conn_index, 2);
}

Test(upstream_tool, stale_connection, .timeout = 30)
{
    struct raw *c = raw_new();
    struct raw_resp rr;
    const char *req = "POST /s HTTP/1.1\r\nHost: x\r\nX-Request-Id: st\r\n"
                      "X-Test-Plan: stale=1\r\nContent-Length: 4\r\n\r\nbody";
    raw_sends(c, req);
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200, "the first request on a connection is answered");
    raw_sends(c, req);
    cr_assert_eq(raw_until_closed(c), 0, "the second gets no answer");
    raw_free(c);
    cr_assert_eq(tup_count(T), 2);
    const struct tup_req *q = tup_get(T, 1);
    cr_assert_eq(q->conn_index, 2);
    cr_assert_eq(q->body_len, 4);
    cr_assert_eq(q->key_attempt, 2);
    cr_assert_eq(tup_count_id(T, "st"), 2);
    cr_assert_eq(tup_connections(T), 1);
}

/* Not a tup feature but a fact the proxy's tests rely on: libcurl itself silently re-sends
 * a request (even a POST) that got nothing back on a reused connection. */
Test(upstream_tool, curl_resends_on_stale_connection, .timeout = 30)
{
    CURL *h = curl_easy_init();
    struct resp r;
    struct req q = { .plan = "stale=1", .id = "cs", .body = "data", .body_len = 4 };
    perform_on(h, &q, &r);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    perform_on(h, &q, &r);
    curl_easy_cleanup(h);
    cr_assert_eq(r.rc, CURLE_OK, "%s", curl_easy_strerror(r.rc));
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    cr_assert_eq(tup_count_id(T, "cs"), 3, "the POST reached the upstream three times");
    cr_assert_eq(tup_get(T, 1)->conn_index, 2);
    cr_assert_eq(tup_get(T, 2)->conn_index, 1);
    cr_assert_eq(tup_connections(T), 2);
}

Test(upstream_tool, bad_plan_is_400, .timeout = 30)
{
    const char *plans[] = { "fial=1", "fail=x", "action=explode", "status=99", "delay" };
    const char *names[] = { "fial", "fail", "explode", "status", "delay" };
    for (size_t i = 0; i < 5; i++) {
        struct resp r;
        get_plan(plans[i], "bad", &r);
        cr_assert_eq(r.status, 400, "%s", plans[i]);
        cr_assert_eq(atoi(r.attempt), (int)i + 1, "bad plans count as attempts");
        char body[512] = "";
        memcpy(body, r.body, r.body_len < sizeof body - 1 ? r.body_len : sizeof body - 1);
        cr_assert(strstr(body, names[i]) != NULL, "body '%s' does not name '%s'", body, names[i]);
        resp_free(&r);
    }
    cr_assert_eq(tup_count(T), 5);

    /* The default plan applies without X-Test-Plan; the header overrides it. */
    tup_set_default_plan(T, "ok=202");
    struct resp r;
    get_plan(NULL, "dp", &r);
    cr_assert_eq(r.status, 202);
    resp_free(&r);
    get_plan("ok=203", "dp", &r);
    cr_assert_eq(r.status, 203);
    resp_free(&r);
    tup_set_default_plan(T, "nonsense");
    get_plan(NULL, "dp", &r);
    cr_assert_eq(r.status, 400);
    resp_free(&r);
}

Test(upstream_tool, raw_http_parsing, .timeout = 30)
{
    struct raw *c = raw_new();
    struct raw_resp rr;
    char v[64];
    /* Pipelined: three requests in one write, answered in order. */
    raw_sends(c, "GET /p1 HTTP/1.1\r\nHost: x\r\n\r\n"
                 "POST /p2 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nX-Test-Plan: echo=1\r\n\r\n"
                 "hello"
                 "\r\nGET /p3 HTTP/1.1\r\nhost: x\r\nX-Test-Plan: body=7\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    cr_assert_str_eq(rr.body, "ok\n");
    raw_read(c, &rr, false);
    cr_assert_str_eq(rr.body, "hello");
    cr_assert_str_eq(raw_header(&rr, "X-Tup-Seq", v, sizeof v), "1");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.body_len, 7);
    cr_assert_eq(rr.body_hash, tup_pattern_hash(7));

    /* Chunked request with extensions and trailers; LF-only line ends are accepted. */
    raw_sends(c, "PUT /ch HTTP/1.1\nHost: x\nTransfer-Encoding: chunked\nX-Test-Plan: echo=1\n\n"
                 "5;ext=1\r\nhello\r\n6\r\n world\r\nA\r\n0123456789\r\n0\r\n"
                 "X-Trailer: t\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    cr_assert_str_eq(rr.body, "hello world0123456789");

    /* Expect: 100-continue comes before the body is sent. */
    raw_sends(c, "POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n"
                 "X-Test-Plan: echo=1\r\n\r\n");
    const char *cont = "HTTP/1.1 100 Continue\r\n\r\n";
    while (c->len < strlen(cont))
        cr_assert(raw_fill(c) > 0);
    cr_assert(memcmp(c->buf, cont, strlen(cont)) == 0);
    raw_take(c, strlen(cont));
    raw_sends(c, "abc");
    raw_read(c, &rr, false);
    cr_assert_str_eq(rr.body, "abc");

    /* HEAD gets Content-Length but no body, and the connection stays in sync. */
    raw_sends(c, "HEAD /hd HTTP/1.1\r\nHost: x\r\nX-Test-Plan: body=100\r\n\r\n"
                 "GET /after HTTP/1.1\r\nHost: x\r\n\r\n");
    raw_read(c, &rr, true);
    cr_assert_str_eq(raw_header(&rr, "Content-Length", v, sizeof v), "100");
    raw_read(c, &rr, false);
    cr_assert_str_eq(rr.body, "ok\n");
    raw_free(c);

    cr_assert_eq(tup_count(T), 7);
    const struct tup_req *p2 = tup_get(T, 1);
    cr_assert_str_eq(p2->method, "POST");
    cr_assert_eq(p2->conn_index, 2);
    cr_assert_eq(p2->body_kept, 5);
    cr_assert(memcmp(p2->body, "hello", 5) == 0);
    const struct tup_req *ch = tup_get(T, 3);
    cr_assert_str_eq(ch->method, "PUT");
    cr_assert_eq(ch->body_len, 21);
    cr_assert_eq(ch->body_hash, tup_hash("hello world0123456789", 21));
    cr_assert_null(tup_req_header(ch, "X-Trailer"), "trailers are not headers");
    for (size_t i = 0; i < 7; i++)
        cr_assert_eq(tup_get(T, i)->conn_index, i + 1);
}

Test(upstream_tool, pipelined_delays_keep_order, .timeout = 30)
{
    struct raw *c = raw_new();
    struct raw_resp rr;
    char v[64];
    int64_t t0 = now_ns();
    raw_sends(c, "GET /d1 HTTP/1.1\r\nX-Test-Plan: delay=200;body=5\r\n\r\n"
                 "GET /d2 HTTP/1.1\r\nX-Test-Plan: delay=200;body=6\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.body_len, 5);
    cr_assert(ms_since(t0) >= 180);
    raw_read(c, &rr, false);
    cr_assert_eq(rr.body_len, 6);
    cr_assert_str_eq(raw_header(&rr, "X-Tup-Seq", v, sizeof v), "1");
    /* Answers are serial: the second delay starts once the first answer is out. */
    cr_assert(ms_since(t0) >= 360, "both answered after %.0f ms", ms_since(t0));
    raw_free(c);
    /* Both heads arrived in one read: both arrival times are that read's. */
    int64_t d = tup_get(T, 1)->arrival_ns - tup_get(T, 0)->arrival_ns;
    cr_assert(d >= 0 && d < 100 * 1000000LL, "arrivals %" PRId64 " ns apart", d);
}

Test(upstream_tool, bad_requests_not_recorded, .timeout = 30)
{
    struct raw *c = raw_new();
    struct raw_resp rr;
    raw_sends(c, "NONSENSE\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 400);
    cr_assert_eq(raw_until_closed(c), 0);
    raw_free(c);

    c = raw_new();
    raw_sends(c, "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 400);
    raw_free(c);

    c = raw_new();
    raw_sends(c, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 400);
    raw_free(c);

    /* A head over 64 KiB: 431, then the connection is closed. */
    size_t big = 70000;
    char *req = malloc(big + 64);
    cr_assert(req != NULL);
    int k = snprintf(req, 64, "GET / HTTP/1.1\r\nX-Big: ");
    memset(req + k, 'a', big);
    memcpy(req + k + big, "\r\n\r\n", 5);
    c = raw_new();
    raw_sends(c, req);
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 431);
    cr_assert_eq(raw_until_closed(c), 0);
    raw_free(c);
    free(req);

    /* A head just under the limit is fine. */
    req = malloc(TUP_HEAD_MAX);
    cr_assert(req != NULL);
    const char *start = "GET /fits HTTP/1.1\r\nX-Big: ";
    size_t pad = TUP_HEAD_MAX - strlen(start) - 4;
    memcpy(req, start, strlen(start));
    memset(req + strlen(start), 'b', pad);
    memcpy(req + strlen(start) + pad, "\r\n\r\n", 4);
    c = raw_new();
    raw_send(c, req, TUP_HEAD_MAX);
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    raw_free(c);
    free(req);

    cr_assert_eq(tup_wait_count(T, 1, 2000), 0);
    cr_assert_eq(tup_count(T), 1, "only the well-formed request is recorded");
    cr_assert_str_eq(tup_get(T, 0)->target, "/fits");
    cr_assert_eq(strlen(tup_req_header(tup_get(T, 0), "X-Big")), pad);
}

Test(upstream_tool, wait_count_times_out_and_wakes, .timeout = 30)
{
    int64_t t0 = now_ns();
    cr_assert_eq(tup_wait_count(T, 1, 150), -1);
    cr_assert(ms_since(t0) >= 140, "returned after %.0f ms", ms_since(t0));
    cr_assert_eq(tup_wait_count(T, 0, 0), 0);

    struct raw *c = raw_new();
    struct raw_resp rr;
    raw_sends(c, "GET /w HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(tup_wait_count(T, 1, 5000), 0);
    raw_read(c, &rr, false);
    /* Arrival times are CLOCK_MONOTONIC and fall within the test's clock. */
    int64_t arr = tup_get(T, 0)->arrival_ns;
    cr_assert(arr > t0 && arr <= now_ns());
    cr_assert_eq(tup_open_connections(T), 1);
    raw_free(c);
    cr_assert_eq(tup_wait_open_at_most(T, 0, 5000), 0);
}

Test(upstream_tool, arrival_times_measure_gaps, .timeout = 30)
{
    struct resp r;
    get_plan("", "gap", &r);
    resp_free(&r);
    usleep(120 * 1000);
    get_plan("", "gap", &r);
    resp_free(&r);
    int64_t gap = tup_get(T, 1)->arrival_ns - tup_get(T, 0)->arrival_ns;
    cr_assert(gap >= 110 * 1000000LL, "gap %" PRId64 " ns", gap);
}

/* ---- load ---- */

Test(upstream_tool, five_hundred_concurrent_requests, .timeout = 30)
{
    enum { N = 500 };
    CURLM *m = curl_multi_init();
    CURL **hs = calloc(N, sizeof *hs);
    struct curl_slist **hl = calloc(N, sizeof *hl);
    struct resp *rs = calloc(N, sizeof *rs);
    struct upload *us = calloc(N, sizeof *us);
    cr_assert(m && hs && hl && rs && us);
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof id, "c-%d", i);
        struct req q = { .plan = "delay=200;body=1000", .id = id, .timeout_ms = 20000 };
        hs[i] = curl_easy_init();
        hl[i] = prepare(hs[i], &q, &rs[i], &us[i]);
        curl_easy_setopt(hs[i], CURLOPT_PRIVATE, &rs[i]);
        curl_multi_add_handle(m, hs[i]);
    }
    int64_t t0 = now_ns();
    int running = 1;
    size_t peak = 0;
    while (running) {
        cr_assert_eq(curl_multi_perform(m, &running), CURLM_OK);
        size_t open = tup_open_connections(T);
        if (open > peak)
            peak = open;
        if (running)
            curl_multi_poll(m, NULL, 0, 50, NULL);
        cr_assert(ms_since(t0) < 20000, "500 requests still running after 20 s");
    }
    double ms = ms_since(t0);
    int done = 0;
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left))) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        struct resp *r;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
        curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &r->status);
        cr_assert_eq(msg->data.result, CURLE_OK, "%s", curl_easy_strerror(msg->data.result));
        cr_assert_eq(r->status, 200);
        cr_assert_eq(r->body_hash, tup_pattern_hash(1000));
        done++;
    }
    cr_assert_eq(done, N);
    cr_assert_eq(tup_count(T), N);
    cr_log_info("500 concurrent: %.0f ms, peak %zu open connections, %" PRIu64 " accepted", ms,
                peak, tup_connections(T));
    /* Every request had its own id, so every one was a first attempt. */
    for (size_t i = 0; i < N; i++)
        cr_assert_eq(tup_get(T, i)->key_attempt, 1);
    cr_assert(peak >= 100, "peak of %zu open connections: requests did not overlap", peak);
    for (int i = 0; i < N; i++) {
        curl_multi_remove_handle(m, hs[i]);
        curl_easy_cleanup(hs[i]);
        curl_slist_free_all(hl[i]);
        resp_free(&rs[i]);
    }
    curl_multi_cleanup(m);
    free(hs);
    free(hl);
    free(rs);
    free(us);
}

Test(upstream_tool, two_thousand_connections, .timeout = 30)
{
    enum { N = 2000 };
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(tup_port(T)) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* tup_start raised the soft limit to the hard one; both ends live in this process. */
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    cr_assert(rl.rlim_cur >= 2 * N + 200, "RLIMIT_NOFILE is %llu: too low for %d connections",
              (unsigned long long)rl.rlim_cur, N);
    int *fds = calloc(N, sizeof *fds);
    cr_assert(fds != NULL);
    struct timeval tv = { .tv_sec = 10 };
    for (int i = 0; i < N; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        cr_assert(fds[i] >= 0, "socket %d: %s", i, strerror(errno));
        setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        cr_assert(connect(fds[i], (struct sockaddr *)&sa, sizeof sa) == 0, "connect %d: %s", i,
                  strerror(errno));
        char req[128];
        int n = snprintf(req, sizeof req,
                         "GET /%d HTTP/1.1\r\nX-Request-Id: k%d\r\nX-Test-Plan: delay=100\r\n\r\n",
                         i, i);
        cr_assert_eq(send(fds[i], req, (size_t)n, MSG_NOSIGNAL), n);
    }
    cr_assert_eq(tup_wait_count(T, N, 15000), 0, "only %zu of %d requests arrived", tup_count(T),
                 N);
    cr_assert_eq(tup_open_connections(T), N);
    cr_assert_eq(tup_connections(T), N);
    for (int i = 0; i < N; i++) {
        char buf[1024];
        size_t len = 0;
        while (!memmem(buf, len, "\r\n\r\nok\n", 7)) {
            ssize_t n = recv(fds[i], buf + len, sizeof buf - len, 0);
            cr_assert(n > 0, "connection %d: %s", i, n < 0 ? strerror(errno) : "EOF");
            len += (size_t)n;
        }
        cr_assert(strncmp(buf, "HTTP/1.1 200 ", 13) == 0);
        close(fds[i]);
    }
    free(fds);
    cr_assert_eq(tup_wait_open_at_most(T, 0, 10000), 0);
}

Test(upstream_tool, stop_with_open_connections, .timeout = 30)
{
    struct raw *c[5];
    for (int i = 0; i < 5; i++)
        c[i] = raw_new();
    raw_sends(c[0],
              "GET /h HTTP/1.1\r\nX-Request-Id: h0\r\nX-Test-Plan: fail=1;action=hang\r\n\r\n");
    raw_sends(c[1],
              "GET /h HTTP/1.1\r\nX-Request-Id: h1\r\nX-Test-Plan: fail=1;action=hang\r\n\r\n");
    /* A response the client never reads, a long delay, a half-sent request. */
    raw_sends(c[2], "GET /big HTTP/1.1\r\nX-Test-Plan: body=1000000000\r\n\r\n");
    raw_sends(c[3], "GET /slow HTTP/1.1\r\nX-Test-Plan: delay=60000\r\n\r\n");
    raw_sends(c[4], "POST /half HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly some");
    cr_assert_eq(tup_wait_count(T, 4, 5000), 0);
    cr_assert_eq(tup_open_connections(T), 5);
    int64_t t0 = now_ns();
    tup_stop(T);
    T = NULL;
    double ms = ms_since(t0);
    cr_assert(ms < 2000, "tup_stop took %.0f ms", ms);
    for (int i = 0; i < 5; i++) {
        if (i != 2)
            cr_assert_eq(raw_until_closed(c[i]), 0, "connection %d", i);
        raw_free(c[i]);
    }
}

/* ---- the standalone tool ---- */

static void tool_path(char *out, size_t cap)
{
    const char *dir = getenv("RETRYPROXY_TOOLS");
    if (dir && *dir) {
        snprintf(out, cap, "%s/upstream", dir);
        return;
    }
    /* build/tests/integration/test_upstream_tool -> build/tests/upstream */
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    cr_assert(n > 0);
    exe[n] = '\0';
    for (int i = 0; i < 2; i++) {
        char *slash = strrchr(exe, '/');
        cr_assert(slash != NULL);
        *slash = '\0';
    }
    snprintf(out, cap, "%s/upstream", exe);
}

struct proc {
    pid_t pid;
    int out_fd;
    char err_path[64];
};

static void tool_spawn(struct proc *p, char *const argv[])
{
    char path[4200];
    tool_path(path, sizeof path);
    cr_assert(access(path, X_OK) == 0, "%s is not built", path);
    int pfd[2];
    cr_assert(pipe2(pfd, O_CLOEXEC) == 0);
    snprintf(p->err_path, sizeof p->err_path, "/tmp/tup-tool-err.XXXXXX");
    int efd = mkstemp(p->err_path);
    cr_assert(efd >= 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
    posix_spawn_file_actions_adddup2(&fa, efd, 2);
    char *args[8];
    args[0] = path;
    int i = 0;
    for (; argv[i] && i < 6; i++)
        args[i + 1] = argv[i];
    args[i + 1] = NULL;
    cr_assert_eq(posix_spawn(&p->pid, path, &fa, NULL, args, environ), 0);
    tool_pid = p->pid;
    posix_spawn_file_actions_destroy(&fa);
    close(pfd[1]);
    close(efd);
    p->out_fd = pfd[0];
}

/* Reads stdout until a newline (or EOF) within timeout_ms. */
static void read_line(int fd, char *buf, size_t cap, int timeout_ms)
{
    size_t len = 0;
    int64_t t0 = now_ns();
    while (len + 1 < cap && !memchr(buf, '\n', len)) {
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        int left = timeout_ms - (int)ms_since(t0);
        cr_assert(left > 0, "no line from the tool within %d ms", timeout_ms);
        if (poll(&pfd, 1, left) <= 0)
            continue;
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
}

static int wait_exit(pid_t pid, int timeout_ms)
{
    int64_t t0 = now_ns();
    int st = 0;
    pid_t r;
    while ((r = waitpid(pid, &st, WNOHANG)) == 0) {
        cr_assert(ms_since(t0) < timeout_ms, "the tool did not exit within %d ms", timeout_ms);
        usleep(10000);
    }
    cr_assert_eq(r, pid, "waitpid: %s", strerror(errno));
    tool_pid = 0;
    return st;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert(f != NULL);
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

Test(upstream_tool, tool_serves_and_exits_on_sigterm, .timeout = 30)
{
    struct proc p;
    char *argv[] = { "--port", "0", "--plan", "fail=1;status=502;retry-after=3", NULL };
    tool_spawn(&p, argv);
    char line[256];
    read_line(p.out_fd, line, sizeof line, 10000);
    unsigned port = 0;
    cr_assert_eq(sscanf(line, "listening on 127.0.0.1:%u", &port), 1, "stdout: '%s'", line);
    cr_assert(port > 0 && port < 65536);

    CURL *h = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/tool", port);
    struct curl_slist *hl = curl_slist_append(NULL, "X-Request-Id: tool-1");
    hl = curl_slist_append(hl, "X-Retry-Attempt: 7"); /* as a proxy would count */
    struct resp r;
    long status[2];
    for (int i = 0; i < 2; i++) {
        memset(&r, 0, sizeof r);
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_PROXY, "");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, &r);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
        cr_assert_eq(curl_easy_perform(h), CURLE_OK);
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status[i]);
        if (i == 0)
            cr_assert_str_eq(r.retry_after, "3");
        resp_free(&r);
    }
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    cr_assert_eq(status[0], 502);
    cr_assert_eq(status[1], 200);

    cr_assert_eq(kill(p.pid, SIGTERM), 0);
    int st = wait_exit(p.pid, 10000);
    close(p.out_fd);
    char *err = slurp(p.err_path);
    unlink(p.err_path);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d, stderr:\n%s", st, err);
    /* each line starts with the upstream's address and shows the X-Retry-Attempt received
     * beside its own count (issue 37: two upstreams in one terminal, and attempt=N was not the
     * proxy's count) */
    char want[160];
    snprintf(want, sizeof(want),
             "127.0.0.1:%u #0 conn 1/1 GET /tool id=tool-1 X-Retry-Attempt=7 seen=1", port);
    cr_assert(strstr(err, want) && strstr(err, "-> 502"), "no '%s' in stderr:\n%s", want, err);
    snprintf(want, sizeof(want),
             "127.0.0.1:%u #1 conn 1/2 GET /tool id=tool-1 X-Retry-Attempt=7 seen=2", port);
    cr_assert(strstr(err, want) && strstr(err, "-> 200"), "no '%s' in stderr:\n%s", want, err);
}

Test(upstream_tool, tool_sigint_help_and_bad_args, .timeout = 30)
{
    struct proc p;
    char line[4096];
    char *run[] = { "--port=0", NULL };
    tool_spawn(&p, run);
    read_line(p.out_fd, line, sizeof line, 10000);
    cr_assert(strncmp(line, "listening on 127.0.0.1:", 23) == 0, "'%s'", line);
    cr_assert_eq(kill(p.pid, SIGINT), 0);
    int st = wait_exit(p.pid, 10000);
    close(p.out_fd);
    unlink(p.err_path);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);

    char *help[] = { "--help", NULL };
    tool_spawn(&p, help);
    read_line(p.out_fd, line, sizeof line, 10000);
    st = wait_exit(p.pid, 10000);
    close(p.out_fd);
    unlink(p.err_path);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    cr_assert(strstr(line, "usage: upstream") != NULL, "'%s'", line);

    char *bad[] = { "--plan", "fail=zz", NULL };
    tool_spawn(&p, bad);
    st = wait_exit(p.pid, 10000);
    close(p.out_fd);
    char *err = slurp(p.err_path);
    unlink(p.err_path);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d", st);
    cr_assert(strstr(err, "zz") != NULL, "stderr: %s", err);

    /* A port in use is a clear error, not a crash. */
    char port[16];
    snprintf(port, sizeof port, "%u", tup_port(T));
    char *busy[] = { "--port", port, NULL };
    tool_spawn(&p, busy);
    st = wait_exit(p.pid, 10000);
    close(p.out_fd);
    err = slurp(p.err_path);
    unlink(p.err_path);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d", st);
    cr_assert(strstr(err, "cannot listen") != NULL, "stderr: %s", err);
}
