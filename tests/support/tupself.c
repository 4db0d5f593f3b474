/* The test upstream's self-test clients (tupself.h). */
#include "tests/support/tupself.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

struct tup *tupself;

void tupself_start(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    tupself = tup_start();
}

void tupself_stop(void)
{
    tup_stop(tupself);
    tupself = NULL;
    curl_global_cleanup();
}

int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double ms_since(int64_t start)
{
    return (double)(now_ns() - start) / 1e6;
}

long rss_kb(void)
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

size_t on_body(char *p, size_t size, size_t n, void *ud)
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

size_t on_header(char *p, size_t size, size_t n, void *ud)
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

void resp_free(struct resp *r)
{
    free(r->body);
    memset(r, 0, sizeof *r);
}

struct curl_slist *prepare(CURL *h, const struct req *q, struct resp *r, struct upload *u)
{
    char url[512];
    char line[1024];
    struct curl_slist *hl = NULL;
    memset(r, 0, sizeof *r);
    r->body_hash = TUP_HASH_INIT;
    r->rss_max_kb = -1;
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", tup_port(tupself), q->path ? q->path : "/");
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

void perform_on(CURL *h, const struct req *q, struct resp *r)
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

void perform(const struct req *q, struct resp *r)
{
    perform_on(NULL, q, r);
}

void get_plan(const char *plan, const char *id, struct resp *r)
{
    struct req q = { .plan = plan, .id = id };
    perform(&q, r);
}

unsigned char *random_bytes(size_t n, unsigned seed)
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

static void raw_open(struct raw *c)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(tup_port(tupself)) };
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

struct raw *raw_new(void)
{
    struct raw *c = malloc(sizeof *c);
    cr_assert(c != NULL);
    raw_open(c);
    return c;
}

void raw_free(struct raw *c)
{
    if (c->fd >= 0)
        close(c->fd);
    free(c);
}

void raw_send(struct raw *c, const void *p, size_t n)
{
    const char *s = p;
    while (n > 0) {
        ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL);
        cr_assert(w > 0, "send: %s", strerror(errno));
        s += w;
        n -= (size_t)w;
    }
}

void raw_sends(struct raw *c, const char *s)
{
    raw_send(c, s, strlen(s));
}

/* Reads more into the buffer: bytes read, 0 on EOF, -1 on error (errno kept). */
ssize_t raw_fill(struct raw *c)
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

void raw_take(struct raw *c, size_t n)
{
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
}

const char *raw_header(const struct raw_resp *r, const char *name, char *out, size_t cap)
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
void raw_read(struct raw *c, struct raw_resp *r, bool head_only)
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
size_t raw_until_closed(struct raw *c)
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
