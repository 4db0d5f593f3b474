#include "tests/support/tup.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define IN_INIT         4096
#define PIECE           16384        /* body bytes generated per refill of the out buffer */
#define WRITE_BUDGET    (256 * 1024) /* bytes per connection per wakeup, for fairness */
#define LINE_LIMIT      4096         /* chunk-size and trailer lines */
#define MAX_EVENTS      256
#define LINGER_NS       INT64_C(2000000000)
#define RSTWAIT_MAX_NS  INT64_C(2000000000)
#define RSTWAIT_POLL_NS INT64_C(1000000)
#define PAUSE_NS        INT64_C(100000000)
#define KEY_BUCKETS     1024
#define RESET_MID_BODY  65536
#define MAX_BODY_PARAM  (UINT64_C(1) << 40)
#define MAX_DELAY_MS    600000

enum action { ACT_STATUS, ACT_HANG, ACT_RESET, ACT_CLOSE, ACT_RESET_MID, ACT_STALL_MID };

struct plan {
    uint64_t fail;
    enum action action;
    unsigned status;
    unsigned ok;
    char *retry_after; /* owned, NULL if none */
    char *header;      /* "Name: value" of header=NAME:VALUE, owned, NULL if none */
    uint64_t body;
    bool body_set;
    bool chunked;
    bool echo;
    bool close_after;
    bool stale;
    unsigned delay_ms;
};

/* The public record plus what backs its strings. */
struct rec {
    struct tup_req pub;
    char *strings;
};

enum state {
    ST_HEAD,    /* reading a request head */
    ST_BODY,    /* reading a request body */
    ST_DELAY,   /* waiting for the timer before 'pending' */
    ST_WRITE,   /* sending a response */
    ST_HANG,    /* never answering; draining input until the peer goes */
    ST_LINGER,  /* our FIN is sent; draining input until the peer's FIN or the timer */
    ST_RSTWAIT, /* reset-mid: waiting for the peer to ack what was sent, then RST */
};

enum body_mode { BM_NONE, BM_CL, BM_CHUNK_SIZE, BM_CHUNK_DATA, BM_CHUNK_CRLF, BM_TRAILER };

enum pending { PEND_WRITE, PEND_RESET, PEND_CLOSE };

enum after { AFTER_KEEP, AFTER_CLOSE, AFTER_RST, AFTER_HANG };

enum src { SRC_NONE, SRC_BUF, SRC_PATTERN };

/* The request being read on a connection. */
struct cur {
    struct rec *rec;
    struct plan plan;
    bool plan_ok;
    char plan_err[256];
    enum body_mode mode;
    uint64_t left; /* Content-Length or chunk bytes still to come */
    bool keep_alive;
    bool http10;
    bool head_method;
    uint64_t body_len;
    uint64_t hash;
    size_t kept_cap;
    unsigned char *echo;
    size_t echo_len;
    size_t echo_cap;
    bool echo_overflow;
};

struct conn {
    int fd;
    uint64_t id;
    char local[48]; /* the address the client connected to */
    unsigned n_reqs;
    enum state state;
    uint32_t events;
    struct conn *prev;
    struct conn *next;
    size_t heap_idx; /* SIZE_MAX when no timer is armed */
    int64_t deadline;
    int64_t rst_give_up;
    enum pending pending;

    char *in;
    size_t in_len;
    size_t in_cap;
    size_t scan; /* where the search for the end of the head resumes */
    bool eof;
    int64_t last_read_ns; /* when the newest buffered bytes arrived */

    struct cur cur;

    char *out;
    size_t out_len;
    size_t out_off;
    size_t out_cap;
    enum src src;
    unsigned char *src_buf;
    uint64_t src_len;  /* declared body length */
    uint64_t src_stop; /* bytes of it actually sent */
    uint64_t src_off;
    bool src_chunked;
    bool src_final;
    enum after after;
};

struct key {
    struct key *next;
    unsigned count;
    char id[];
};

struct tup {
    int listen_fd;
    int epfd;
    int wake_fd;
    uint16_t port;
    pthread_t thread;
    bool thread_started;

    /* Server thread only. */
    struct conn *conns;
    struct conn **heap;
    size_t heap_n;
    size_t heap_cap;
    struct key *keys[KEY_BUCKETS];
    uint64_t next_conn_id;
    int64_t listen_paused_until; /* 0 when listening */

    /* Shared: guarded by mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct rec **recs;
    size_t n_recs;
    size_t cap_recs;
    uint64_t accepted;
    uint64_t bytes_in; /* every byte read from any connection */
    size_t open;
    char *default_plan;
    FILE *log;
    char where[32]; /* "127.0.0.1:PORT": each log line starts with it */
};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("tup: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory (%zu bytes)", n);
    return p;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        die("out of memory (%zu x %zu bytes)", n, size);
    return p;
}

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        die("out of memory (%zu bytes)", n);
    return q;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = xmalloc(n);
    memcpy(d, s, n);
    return d;
}

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- hashing and the body pattern ---- */

uint64_t tup_hash_update(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

uint64_t tup_hash(const void *data, size_t n)
{
    return tup_hash_update(TUP_HASH_INIT, data, n);
}

static const char pattern_alphabet[65] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

unsigned char tup_pattern_byte(uint64_t i)
{
    if (i % 64 == 63)
        return '\n';
    /* Top bits of a Weyl sequence: no short period, so offsets matter. */
    return (unsigned char)pattern_alphabet[(i * UINT64_C(0x9e3779b97f4a7c15)) >> 58];
}

void tup_pattern_fill(unsigned char *dst, uint64_t offset, size_t n)
{
    for (size_t k = 0; k < n; k++)
        dst[k] = tup_pattern_byte(offset + k);
}

uint64_t tup_pattern_hash(uint64_t n)
{
    unsigned char buf[16384];
    uint64_t h = TUP_HASH_INIT;
    for (uint64_t off = 0; off < n;) {
        size_t k = n - off < sizeof buf ? (size_t)(n - off) : sizeof buf;
        tup_pattern_fill(buf, off, k);
        h = tup_hash_update(h, buf, k);
        off += k;
    }
    return h;
}

/* ---- plans ---- */

static void plan_init(struct plan *p)
{
    memset(p, 0, sizeof *p);
    p->action = ACT_STATUS;
    p->status = 503;
    p->ok = 200;
}

static void plan_free(struct plan *p)
{
    free(p->retry_after);
    p->retry_after = NULL;
    free(p->header);
    p->header = NULL;
}

static bool is_ows(char ch)
{
    return ch == ' ' || ch == '\t';
}

/* Trims [*s, *e) of spaces and tabs. */
static void trim(const char **s, const char **e)
{
    while (*s < *e && is_ows(**s))
        (*s)++;
    while (*e > *s && is_ows((*e)[-1]))
        (*e)--;
}

static bool parse_u64(const char *s, const char *e, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (s == e)
        return false;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9')
            return false;
        unsigned d = (unsigned)(*s - '0');
        if (d > max || v > (max - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

static bool token_is(const char *s, const char *e, const char *word)
{
    size_t n = strlen(word);
    return (size_t)(e - s) == n && memcmp(s, word, n) == 0;
}

static int plan_parse(const char *text, struct plan *p, char *err, size_t errlen)
{
    plan_init(p);
    const char *s = text;
    for (;;) {
        const char *end = strchr(s, ';');
        if (!end)
            end = s + strlen(s);
        const char *ks = s;
        const char *ke = end;
        trim(&ks, &ke);
        if (ks < ke) {
            const char *eq = memchr(ks, '=', (size_t)(ke - ks));
            if (!eq) {
                snprintf(err, errlen, "directive '%.*s' has no '='", (int)(ke - ks), ks);
                goto bad;
            }
            const char *vs = eq + 1;
            const char *ve = ke;
            ke = eq;
            trim(&ks, &ke);
            trim(&vs, &ve);
            uint64_t v = 0;
            bool ok = true;
            if (token_is(ks, ke, "fail")) {
                ok = parse_u64(vs, ve, UINT32_MAX, &v);
                p->fail = v;
            } else if (token_is(ks, ke, "action")) {
                if (token_is(vs, ve, "status"))
                    p->action = ACT_STATUS;
                else if (token_is(vs, ve, "hang"))
                    p->action = ACT_HANG;
                else if (token_is(vs, ve, "reset"))
                    p->action = ACT_RESET;
                else if (token_is(vs, ve, "close"))
                    p->action = ACT_CLOSE;
                else if (token_is(vs, ve, "reset-mid"))
                    p->action = ACT_RESET_MID;
                else if (token_is(vs, ve, "stall-mid"))
                    p->action = ACT_STALL_MID;
                else
                    ok = false;
            } else if (token_is(ks, ke, "status") || token_is(ks, ke, "ok")) {
                ok = parse_u64(vs, ve, 599, &v) && v >= 200;
                if (*ks == 's')
                    p->status = (unsigned)v;
                else
                    p->ok = (unsigned)v;
            } else if (token_is(ks, ke, "retry-after")) {
                for (const char *q = vs; q < ve; q++)
                    if ((unsigned char)*q < 0x20 && *q != '\t')
                        ok = false;
                if (vs == ve)
                    ok = false;
                if (ok) {
                    free(p->retry_after);
                    p->retry_after = xmalloc((size_t)(ve - vs) + 1);
                    memcpy(p->retry_after, vs, (size_t)(ve - vs));
                    p->retry_after[ve - vs] = '\0';
                }
            } else if (token_is(ks, ke, "header")) {
                const char *colon = memchr(vs, ':', (size_t)(ve - vs));
                for (const char *q = vs; q < ve; q++)
                    if ((unsigned char)*q < 0x20 && *q != '\t')
                        ok = false;
                if (!colon || colon == vs)
                    ok = false;
                if (ok) {
                    size_t nl = (size_t)(colon - vs), vl = (size_t)(ve - colon - 1);
                    free(p->header);
                    p->header = xmalloc(nl + vl + 3);
                    memcpy(p->header, vs, nl);
                    memcpy(p->header + nl, ": ", 2);
                    memcpy(p->header + nl + 2, colon + 1, vl);
                    p->header[nl + 2 + vl] = '\0';
                }
            } else if (token_is(ks, ke, "body")) {
                ok = parse_u64(vs, ve, MAX_BODY_PARAM, &v);
                p->body = v;
                p->body_set = true;
            } else if (token_is(ks, ke, "delay")) {
                ok = parse_u64(vs, ve, MAX_DELAY_MS, &v);
                p->delay_ms = (unsigned)v;
            } else if (token_is(ks, ke, "chunked") || token_is(ks, ke, "echo") ||
                       token_is(ks, ke, "close-after") || token_is(ks, ke, "stale")) {
                ok = parse_u64(vs, ve, 1, &v);
                bool b = v == 1;
                if (*ks == 'e')
                    p->echo = b;
                else if (*ks == 's')
                    p->stale = b;
                else if (token_is(ks, ke, "chunked"))
                    p->chunked = b;
                else
                    p->close_after = b;
            } else {
                snprintf(err, errlen, "unknown key '%.*s'", (int)(ke - ks), ks);
                goto bad;
            }
            if (!ok) {
                snprintf(err, errlen, "bad value '%.*s' for '%.*s'", (int)(ve - vs), vs,
                         (int)(ke - ks), ks);
                goto bad;
            }
        }
        if (!*end)
            break;
        s = end + 1;
    }
    return 0;
bad:
    plan_free(p);
    return -1;
}

int tup_plan_check(const char *plan, char *err, size_t errlen)
{
    struct plan p;
    char buf[256];
    if (!err || !errlen) {
        err = buf;
        errlen = sizeof buf;
    }
    if (plan_parse(plan, &p, err, errlen) < 0)
        return -1;
    plan_free(&p);
    return 0;
}

/* ---- records ---- */

static void rec_free(struct rec *r)
{
    if (!r)
        return;
    free(r->pub.headers);
    for (size_t i = 0; i < r->pub.n_trailers; i++) {
        free(r->pub.trailers[i].name);
        free(r->pub.trailers[i].value);
    }
    free(r->pub.trailers);
    free(r->pub.body);
    free(r->strings);
    free(r);
}

static void publish(struct tup *t, struct rec *r)
{
    pthread_mutex_lock(&t->mu);
    if (t->n_recs == t->cap_recs) {
        t->cap_recs = t->cap_recs ? t->cap_recs * 2 : 64;
        t->recs = xrealloc(t->recs, t->cap_recs * sizeof *t->recs);
    }
    r->pub.seq = t->n_recs;
    t->recs[t->n_recs++] = r;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

size_t tup_count(struct tup *t)
{
    pthread_mutex_lock(&t->mu);
    size_t n = t->n_recs;
    pthread_mutex_unlock(&t->mu);
    return n;
}

const struct tup_req *tup_get(struct tup *t, size_t i)
{
    const struct tup_req *r = NULL;
    pthread_mutex_lock(&t->mu);
    if (i < t->n_recs)
        r = &t->recs[i]->pub;
    pthread_mutex_unlock(&t->mu);
    return r;
}

static void deadline_after(struct timespec *ts, int timeout_ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

int tup_wait_count(struct tup *t, size_t n, int timeout_ms)
{
    struct timespec ts;
    int rc = 0;
    deadline_after(&ts, timeout_ms < 0 ? 0 : timeout_ms);
    pthread_mutex_lock(&t->mu);
    while (t->n_recs < n) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&t->cv, &t->mu);
        } else if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT) {
            rc = t->n_recs >= n ? 0 : -1;
            break;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int tup_wait_open_at_most(struct tup *t, size_t n, int timeout_ms)
{
    struct timespec ts;
    int rc = 0;
    deadline_after(&ts, timeout_ms < 0 ? 0 : timeout_ms);
    pthread_mutex_lock(&t->mu);
    while (t->open > n) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&t->cv, &t->mu);
        } else if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT) {
            rc = t->open <= n ? 0 : -1;
            break;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

size_t tup_count_id(struct tup *t, const char *request_id)
{
    size_t n = 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->n_recs; i++)
        if (strcmp(t->recs[i]->pub.request_id, request_id) == 0)
            n++;
    pthread_mutex_unlock(&t->mu);
    return n;
}

const char *tup_req_header(const struct tup_req *r, const char *name)
{
    for (size_t i = 0; i < r->n_headers; i++)
        if (strcasecmp(r->headers[i].name, name) == 0)
            return r->headers[i].value;
    return NULL;
}

const char *tup_req_trailer(const struct tup_req *r, const char *name)
{
    for (size_t i = 0; i < r->n_trailers; i++)
        if (strcasecmp(r->trailers[i].name, name) == 0)
            return r->trailers[i].value;
    return NULL;
}

/* Keeps the trailer line 'line' ('len' bytes, no terminator) with the request. */
static void keep_trailer(struct rec *r, const char *line, size_t len)
{
    const char *colon = memchr(line, ':', len);
    if (!colon)
        return;
    const char *v = colon + 1, *ve = line + len;
    while (v < ve && is_ows(*v))
        v++;
    while (ve > v && is_ows(ve[-1]))
        ve--;
    struct tup_req *q = &r->pub;
    q->trailers = xrealloc(q->trailers, (q->n_trailers + 1) * sizeof(*q->trailers));
    q->trailers[q->n_trailers].name = strndup(line, (size_t)(colon - line));
    q->trailers[q->n_trailers].value = strndup(v, (size_t)(ve - v));
    q->n_trailers++;
}

size_t tup_req_header_count(const struct tup_req *r, const char *name)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n_headers; i++)
        if (strcasecmp(r->headers[i].name, name) == 0)
            n++;
    return n;
}

uint64_t tup_connections(struct tup *t)
{
    pthread_mutex_lock(&t->mu);
    uint64_t n = t->accepted;
    pthread_mutex_unlock(&t->mu);
    return n;
}

uint64_t tup_bytes_in(struct tup *t)
{
    pthread_mutex_lock(&t->mu);
    uint64_t n = t->bytes_in;
    pthread_mutex_unlock(&t->mu);
    return n;
}

size_t tup_open_connections(struct tup *t)
{
    pthread_mutex_lock(&t->mu);
    size_t n = t->open;
    pthread_mutex_unlock(&t->mu);
    return n;
}

uint16_t tup_port(const struct tup *t)
{
    return t->port;
}

void tup_set_default_plan(struct tup *t, const char *plan)
{
    char *copy = xstrdup(plan ? plan : "");
    pthread_mutex_lock(&t->mu);
    free(t->default_plan);
    t->default_plan = copy;
    pthread_mutex_unlock(&t->mu);
}

void tup_set_log(struct tup *t, FILE *f)
{
    pthread_mutex_lock(&t->mu);
    t->log = f;
    pthread_mutex_unlock(&t->mu);
}

static void tlog(struct tup *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void tlog(struct tup *t, const char *fmt, ...)
{
    pthread_mutex_lock(&t->mu);
    FILE *f = t->log;
    pthread_mutex_unlock(&t->mu);
    if (!f)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One fprintf per line so concurrent writers do not interleave within it; the address
     * tells apart two upstreams logging into one terminal (make demo-upstream). */
    fprintf(f, "%s %s\n", t->where, line);
    fflush(f);
}

/* ---- attempt counters per request key (server thread only) ---- */

static unsigned key_bump(struct tup *t, const char *id)
{
    uint64_t h = tup_hash(id, strlen(id));
    struct key **slot = &t->keys[h % KEY_BUCKETS];
    for (struct key *k = *slot; k; k = k->next) {
        if (strcmp(k->id, id) == 0)
            return ++k->count;
    }
    size_t n = strlen(id) + 1;
    struct key *k = xmalloc(sizeof *k + n);
    memcpy(k->id, id, n);
    k->count = 1;
    k->next = *slot;
    *slot = k;
    return 1;
}

/* ---- timers: a binary min-heap of connections by deadline ---- */

static bool heap_less(struct tup *t, size_t a, size_t b)
{
    return t->heap[a]->deadline < t->heap[b]->deadline;
}

static void heap_swap(struct tup *t, size_t a, size_t b)
{
    struct conn *c = t->heap[a];
    t->heap[a] = t->heap[b];
    t->heap[b] = c;
    t->heap[a]->heap_idx = a;
    t->heap[b]->heap_idx = b;
}

static void heap_up(struct tup *t, size_t i)
{
    while (i > 0 && heap_less(t, i, (i - 1) / 2)) {
        heap_swap(t, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_down(struct tup *t, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1;
        size_t m = i;
        if (l < t->heap_n && heap_less(t, l, m))
            m = l;
        if (l + 1 < t->heap_n && heap_less(t, l + 1, m))
            m = l + 1;
        if (m == i)
            return;
        heap_swap(t, i, m);
        i = m;
    }
}

static void timer_cancel(struct tup *t, struct conn *c)
{
    size_t i = c->heap_idx;
    if (i == SIZE_MAX)
        return;
    t->heap_n--;
    if (i != t->heap_n) {
        t->heap[i] = t->heap[t->heap_n];
        t->heap[i]->heap_idx = i;
        heap_up(t, i);
        heap_down(t, i);
    }
    c->heap_idx = SIZE_MAX;
}

static void timer_arm(struct tup *t, struct conn *c, int64_t deadline)
{
    timer_cancel(t, c);
    if (t->heap_n == t->heap_cap) {
        t->heap_cap = t->heap_cap ? t->heap_cap * 2 : 64;
        t->heap = xrealloc(t->heap, t->heap_cap * sizeof *t->heap);
    }
    c->deadline = deadline;
    c->heap_idx = t->heap_n;
    t->heap[t->heap_n++] = c;
    heap_up(t, c->heap_idx);
}

/* ---- connections ---- */

static void set_interest(struct tup *t, struct conn *c, uint32_t events)
{
    if (c->events == events)
        return;
    struct epoll_event ev = { .events = events, .data.ptr = c };
    if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, c->fd, &ev) < 0)
        die("epoll_ctl(MOD): %s", strerror(errno));
    c->events = events;
}

static void cur_reset(struct conn *c)
{
    rec_free(c->cur.rec);
    plan_free(&c->cur.plan);
    free(c->cur.echo);
    memset(&c->cur, 0, sizeof c->cur);
}

static void resp_reset(struct conn *c)
{
    free(c->out);
    free(c->src_buf);
    c->out = NULL;
    c->out_len = c->out_off = c->out_cap = 0;
    c->src = SRC_NONE;
    c->src_buf = NULL;
    c->src_len = c->src_stop = c->src_off = 0;
    c->src_chunked = c->src_final = false;
    c->after = AFTER_KEEP;
}

static void conn_free_fd(struct tup *t, struct conn *c, bool rst)
{
    if (rst) {
        struct linger lg = { .l_onoff = 1, .l_linger = 0 };
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    timer_cancel(t, c);
    /* close() also removes the fd from the epoll set: it is never dup'ed. */
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        t->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    cur_reset(c);
    resp_reset(c);
    free(c->in);
    free(c);
}

static void conn_close(struct tup *t, struct conn *c, bool rst)
{
    conn_free_fd(t, c, rst);
    pthread_mutex_lock(&t->mu);
    t->open--;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* Our FIN now; keep reading (and dropping) until the peer's FIN, so that unread input does
 * not turn our close into an RST that could destroy what we sent. */
static void start_linger(struct tup *t, struct conn *c)
{
    shutdown(c->fd, SHUT_WR);
    c->state = ST_LINGER;
    c->in_len = 0;
    c->scan = 0;
    timer_arm(t, c, mono_ns() + LINGER_NS);
}

static void start_rstwait(struct tup *t, struct conn *c)
{
    c->state = ST_RSTWAIT;
    c->rst_give_up = mono_ns() + RSTWAIT_MAX_NS;
    timer_arm(t, c, mono_ns() + RSTWAIT_POLL_NS);
}

static void out_reserve(struct conn *c, size_t more)
{
    if (c->out_len + more <= c->out_cap)
        return;
    size_t cap = c->out_cap ? c->out_cap : 512;
    while (cap < c->out_len + more)
        cap *= 2;
    c->out = xrealloc(c->out, cap);
    c->out_cap = cap;
}

static void out_printf(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void out_printf(struct conn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        die("vsnprintf failed");
    out_reserve(c, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(c->out + c->out_len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    c->out_len += (size_t)n;
}

static void out_append(struct conn *c, const void *p, size_t n)
{
    out_reserve(c, n);
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
}

/* Refills the out buffer from the body source; false when the body is all out. */
static bool out_fill(struct conn *c)
{
    if (c->src_off >= c->src_stop) {
        if (c->src_chunked && !c->src_final) {
            out_append(c, "0\r\n\r\n", 5);
            c->src_final = true;
            return true;
        }
        return false;
    }
    uint64_t left = c->src_stop - c->src_off;
    size_t n = left < PIECE ? (size_t)left : PIECE;
    if (c->src_chunked)
        out_printf(c, "%zx\r\n", n);
    out_reserve(c, n + 7);
    if (c->src == SRC_PATTERN)
        tup_pattern_fill((unsigned char *)c->out + c->out_len, c->src_off, n);
    else
        memcpy(c->out + c->out_len, c->src_buf + c->src_off, n);
    c->out_len += n;
    c->src_off += n;
    if (c->src_chunked) {
        out_append(c, "\r\n", 2);
        if (c->src_off == c->src_stop) {
            out_append(c, "0\r\n\r\n", 5);
            c->src_final = true;
        }
    }
    return true;
}

/* 1: response fully sent; 0: the socket is full (or the budget spent); -1: peer is gone. */
static int conn_write(struct conn *c, bool fill)
{
    size_t budget = WRITE_BUDGET;
    for (;;) {
        if (c->out_off == c->out_len) {
            c->out_off = c->out_len = 0;
            if (!fill || !out_fill(c))
                return 1;
        }
        if (budget == 0)
            return 0;
        size_t n = c->out_len - c->out_off;
        if (n > budget)
            n = budget;
        ssize_t w = send(c->fd, c->out + c->out_off, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        c->out_off += (size_t)w;
        budget -= (size_t)w;
    }
}

static const char *reason(unsigned status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 206:
        return "Partial Content";
    case 301:
        return "Moved Permanently";
    case 302:
        return "Found";
    case 304:
        return "Not Modified";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 413:
        return "Content Too Large";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    default:
        return "Status";
    }
}

struct answer {
    unsigned status;
    unsigned attempt;
    uint64_t seq;
    const char *retry_after;
    const char *header; /* one more "Name: value" field, or NULL */
    bool close;
    bool chunked;
    enum src src;
    const char *text;   /* SRC_BUF from a string */
    unsigned char *buf; /* SRC_BUF taking ownership (echo) */
    uint64_t len;       /* declared body length */
    uint64_t stop;      /* bytes of it to send */
    enum after after;
};

/* Puts the response head in the out buffer and sets up the body source. */
static void answer_begin(struct conn *c, const struct answer *a)
{
    bool no_body = a->status == 204 || a->status == 304;
    bool chunked = a->chunked && !c->cur.http10 && !no_body;
    out_printf(c, "HTTP/1.1 %u %s\r\n", a->status, reason(a->status));
    out_printf(c, "X-Tup-Attempt: %u\r\nX-Tup-Conn: %" PRIu64 "\r\nX-Tup-Seq: %" PRIu64 "\r\n",
               a->attempt, c->id, a->seq);
    if (a->retry_after)
        out_printf(c, "Retry-After: %s\r\n", a->retry_after);
    if (a->header)
        out_printf(c, "%s\r\n", a->header);
    if (!no_body) {
        out_printf(c, "Content-Type: text/plain\r\n");
        if (chunked)
            out_printf(c, "Transfer-Encoding: chunked\r\n");
        else
            out_printf(c, "Content-Length: %" PRIu64 "\r\n", a->len);
    }
    if (a->close)
        out_printf(c, "Connection: close\r\n");
    else if (c->cur.http10)
        out_printf(c, "Connection: keep-alive\r\n");
    out_printf(c, "\r\n");

    c->src = a->src;
    c->src_len = a->len;
    c->src_stop = (no_body || c->cur.head_method) ? 0 : a->stop;
    c->src_off = 0;
    c->src_chunked = chunked && !c->cur.head_method;
    c->src_final = false;
    if (a->buf) {
        c->src_buf = a->buf;
    } else if (a->text) {
        c->src_buf = xmalloc(a->len);
        memcpy(c->src_buf, a->text, a->len);
    }
    c->after = a->close && a->after == AFTER_KEEP ? AFTER_CLOSE : a->after;
}

/* Answers a request that could not be parsed, then closes; nothing is recorded. */
static void answer_error(struct tup *t, struct conn *c, unsigned status, const char *why)
{
    char text[256];
    int n = snprintf(text, sizeof text, "tup: %s\n", why);
    struct answer a = {
        .status = status,
        .close = true,
        .src = SRC_BUF,
        .text = text,
        .len = (size_t)n,
        .stop = (size_t)n,
        .after = AFTER_CLOSE,
    };
    tlog(t, "conn %" PRIu64 ": %u %s (not recorded)", c->id, status, why);
    cur_reset(c);
    c->in_len = 0;
    c->scan = 0;
    answer_begin(c, &a);
    c->state = ST_WRITE;
}

/* ---- request parsing ---- */

static bool is_tchar(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static void consume(struct conn *c, size_t n)
{
    memmove(c->in, c->in + n, c->in_len - n);
    c->in_len -= n;
    c->scan = c->scan > n ? c->scan - n : 0;
}

/* Offset just past the blank line ending the head, or 0 if it has not arrived. */
static size_t find_head_end(struct conn *c)
{
    size_t i = c->scan;
    while (i < c->in_len) {
        char *nl = memchr(c->in + i, '\n', c->in_len - i);
        if (!nl)
            break;
        size_t p = (size_t)(nl - c->in);
        if (p + 1 >= c->in_len) {
            c->scan = p;
            return 0;
        }
        if (c->in[p + 1] == '\n')
            return p + 2;
        if (c->in[p + 1] == '\r') {
            if (p + 2 >= c->in_len) {
                c->scan = p;
                return 0;
            }
            if (c->in[p + 2] == '\n')
                return p + 3;
        }
        i = p + 1;
    }
    c->scan = c->in_len;
    return 0;
}

/* True if the comma-separated header value holds token (case-insensitive). */
static bool has_token(const char *value, const char *token)
{
    size_t n = strlen(token);
    const char *s = value;
    while (*s) {
        const char *e = strchr(s, ',');
        if (!e)
            e = s + strlen(s);
        const char *a = s;
        const char *b = e;
        trim(&a, &b);
        if ((size_t)(b - a) == n && strncasecmp(a, token, n) == 0)
            return true;
        s = *e ? e + 1 : e;
    }
    return false;
}

/* Parses the head in c->in[0, len) into a new record; NULL and why on malformed input. */
static struct rec *parse_head(struct conn *c, size_t len, const char **why)
{
    struct rec *r = xcalloc(1, sizeof *r);
    /* One copy of the head holds every string of the record, NUL-terminated in place; the
     * extra byte at the end is the "" for a missing request id. */
    char *s = xmalloc(len + 2);
    memcpy(s, c->in, len);
    s[len] = '\0';
    s[len + 1] = '\0';
    r->strings = s;
    r->pub.request_id = s + len + 1;

    for (size_t i = 0; i < len; i++) {
        if (s[i] == '\0') {
            *why = "NUL byte in request head";
            goto bad;
        }
    }
    size_t n_lines = 0;
    for (size_t i = 0; i < len; i++)
        n_lines += s[i] == '\n';
    /* The last two line ends close the head; the first line is the request line. */
    r->pub.headers = xcalloc(n_lines, sizeof *r->pub.headers);

    char *line = s;
    char *nl = strchr(line, '\n');
    *nl = '\0';
    if (nl > line && nl[-1] == '\r')
        nl[-1] = '\0';
    char *sp1 = strchr(line, ' ');
    char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (!sp1 || !sp2 || strchr(sp2 + 1, ' ')) {
        *why = "malformed request line";
        goto bad;
    }
    *sp1 = '\0';
    *sp2 = '\0';
    size_t mlen = (size_t)(sp1 - line);
    if (mlen == 0 || mlen >= sizeof r->pub.method) {
        *why = "bad or too long method";
        goto bad;
    }
    for (size_t i = 0; i < mlen; i++) {
        if (!is_tchar((unsigned char)line[i])) {
            *why = "bad method";
            goto bad;
        }
    }
    memcpy(r->pub.method, line, mlen + 1);
    r->pub.target = sp1 + 1;
    if (!*r->pub.target) {
        *why = "empty request target";
        goto bad;
    }
    for (const char *q = r->pub.target; *q; q++) {
        if ((unsigned char)*q <= 0x20 || *q == 0x7f) {
            *why = "bad request target";
            goto bad;
        }
    }
    const char *version = sp2 + 1;
    if (strcmp(version, "HTTP/1.1") == 0) {
        c->cur.http10 = false;
    } else if (strcmp(version, "HTTP/1.0") == 0) {
        c->cur.http10 = true;
    } else {
        *why = "unsupported HTTP version";
        goto bad;
    }

    size_t nh = 0;
    for (line = nl + 1; *line;) {
        nl = strchr(line, '\n');
        *nl = '\0';
        if (nl > line && nl[-1] == '\r')
            nl[-1] = '\0';
        char *next = nl + 1;
        if (!*line)
            break;
        if (is_ows(*line)) {
            *why = "obsolete header line folding";
            goto bad;
        }
        char *colon = strchr(line, ':');
        if (!colon || colon == line) {
            *why = "header line without a name";
            goto bad;
        }
        for (char *q = line; q < colon; q++) {
            if (!is_tchar((unsigned char)*q)) {
                *why = "bad header name";
                goto bad;
            }
        }
        *colon = '\0';
        char *v = colon + 1;
        char *ve = v + strlen(v);
        while (is_ows(*v))
            v++;
        while (ve > v && is_ows(ve[-1]))
            ve--;
        *ve = '\0';
        for (char *q = v; *q; q++) {
            if (*q == '\r' || *q == 0x7f) {
                *why = "bad byte in header value";
                goto bad;
            }
        }
        r->pub.headers[nh].name = line;
        r->pub.headers[nh].value = v;
        nh++;
        line = next;
    }
    r->pub.n_headers = nh;
    const char *id = tup_req_header(&r->pub, "X-Request-Id");
    if (id)
        r->pub.request_id = (char *)id;
    return r;
bad:
    rec_free(r);
    return NULL;
}

/* Sets the body framing and connection persistence from the headers. */
static int body_framing(struct conn *c, const char **why)
{
    const struct tup_req *r = &c->cur.rec->pub;
    const char *te = NULL;
    bool have_cl = false;
    uint64_t cl = 0;
    bool close = false;
    bool keep = false;
    for (size_t i = 0; i < r->n_headers; i++) {
        const struct tup_header *h = &r->headers[i];
        if (strcasecmp(h->name, "Content-Length") == 0) {
            uint64_t v;
            const char *e = h->value + strlen(h->value);
            if (!parse_u64(h->value, e, UINT64_MAX / 2, &v) || (have_cl && v != cl)) {
                *why = "bad Content-Length";
                return -1;
            }
            have_cl = true;
            cl = v;
        } else if (strcasecmp(h->name, "Transfer-Encoding") == 0) {
            te = h->value;
        } else if (strcasecmp(h->name, "Connection") == 0) {
            close |= has_token(h->value, "close");
            keep |= has_token(h->value, "keep-alive");
        }
    }
    c->cur.keep_alive = c->cur.http10 ? keep && !close : !close;
    if (te) {
        /* The last coding must be chunked, or the body's end cannot be found. */
        const char *last = strrchr(te, ',');
        last = last ? last + 1 : te;
        while (is_ows(*last))
            last++;
        if (strcasecmp(last, "chunked") != 0) {
            *why = "Transfer-Encoding without final chunked";
            return -1;
        }
        c->cur.mode = BM_CHUNK_SIZE;
        if (have_cl)
            c->cur.keep_alive = false; /* both framings: do not trust the connection */
    } else if (have_cl && cl > 0) {
        c->cur.mode = BM_CL;
        c->cur.left = cl;
    } else {
        c->cur.mode = BM_NONE;
    }
    return 0;
}

static void body_feed(struct conn *c, const unsigned char *p, size_t n)
{
    struct cur *cu = &c->cur;
    cu->hash = tup_hash_update(cu->hash, p, n);
    if (cu->body_len < TUP_BODY_KEEP) {
        size_t room = TUP_BODY_KEEP - (size_t)cu->body_len;
        size_t k = n < room ? n : room;
        struct tup_req *r = &cu->rec->pub;
        if (r->body_kept + k > cu->kept_cap) {
            size_t cap = cu->kept_cap ? cu->kept_cap : 1024;
            while (cap < r->body_kept + k)
                cap *= 2;
            if (cap > TUP_BODY_KEEP)
                cap = TUP_BODY_KEEP;
            r->body = xrealloc(r->body, cap);
            cu->kept_cap = cap;
        }
        memcpy(r->body + r->body_kept, p, k);
        r->body_kept += k;
    }
    if (cu->plan_ok && cu->plan.echo && !cu->echo_overflow) {
        if (cu->echo_len + n > TUP_ECHO_MAX) {
            cu->echo_overflow = true;
            free(cu->echo);
            cu->echo = NULL;
            cu->echo_len = cu->echo_cap = 0;
        } else {
            if (cu->echo_len + n > cu->echo_cap) {
                size_t cap = cu->echo_cap ? cu->echo_cap : 4096;
                while (cap < cu->echo_len + n)
                    cap *= 2;
                cu->echo = xrealloc(cu->echo, cap);
                cu->echo_cap = cap;
            }
            memcpy(cu->echo + cu->echo_len, p, n);
            cu->echo_len += n;
        }
    }
    cu->body_len += n;
}

/* Decides and starts what happens to a complete request. */
static void request_complete(struct tup *t, struct conn *c)
{
    struct cur *cu = &c->cur;
    struct rec *r = cu->rec;
    cu->rec = NULL;
    r->pub.body_len = cu->body_len;
    r->pub.body_hash = cu->hash;
    r->pub.key_attempt = key_bump(t, r->pub.request_id);
    publish(t, r);
    const struct tup_req *q = &r->pub;
    const struct plan *p = &cu->plan;

    char what[512];
    char text[400];
    struct answer a = {
        .attempt = q->key_attempt,
        .seq = q->seq,
        .close = !cu->keep_alive,
        .src = SRC_BUF,
        .after = AFTER_KEEP,
    };
    bool answer = true;
    enum pending pend = PEND_WRITE;

    if (!cu->plan_ok) {
        int n = snprintf(text, sizeof text, "tup: bad X-Test-Plan: %s\n", cu->plan_err);
        a.status = 400;
        a.text = text;
        a.len = a.stop = (size_t)n;
        snprintf(what, sizeof what, "400 bad plan: %s", cu->plan_err);
        goto act;
    }
    a.close |= p->close_after;
    if (p->stale && q->conn_index > 1) {
        snprintf(what, sizeof what, "stale: FIN without an answer");
        answer = false;
        pend = PEND_CLOSE;
        goto act;
    }
    if (q->key_attempt <= p->fail) {
        switch (p->action) {
        case ACT_STATUS: {
            int n =
                snprintf(text, sizeof text, "tup: attempt %u fails on purpose (fail=%" PRIu64 ")\n",
                         q->key_attempt, p->fail);
            a.status = p->status;
            a.retry_after = p->retry_after;
            a.header = p->header;
            a.text = text;
            a.len = a.stop = (size_t)n;
            snprintf(what, sizeof what, "%u (fail %u/%" PRIu64 ")%s%s", a.status, q->key_attempt,
                     p->fail, p->retry_after ? " retry-after " : "",
                     p->retry_after ? p->retry_after : "");
            break;
        }
        case ACT_HANG:
            snprintf(what, sizeof what, "hang (fail %u/%" PRIu64 ")", q->key_attempt, p->fail);
            c->state = ST_HANG;
            c->in_len = 0;
            c->scan = 0;
            goto log;
        case ACT_RESET:
            snprintf(what, sizeof what, "reset (fail %u/%" PRIu64 ")", q->key_attempt, p->fail);
            answer = false;
            pend = PEND_RESET;
            break;
        case ACT_CLOSE:
            snprintf(what, sizeof what, "close (fail %u/%" PRIu64 ")", q->key_attempt, p->fail);
            answer = false;
            pend = PEND_CLOSE;
            break;
        case ACT_RESET_MID:
        case ACT_STALL_MID:
            a.status = 200;
            a.src = SRC_PATTERN;
            a.len = p->body_set ? p->body : RESET_MID_BODY;
            a.stop = a.len / 2;
            a.after = p->action == ACT_RESET_MID ? AFTER_RST : AFTER_HANG;
            a.close = false;
            snprintf(what, sizeof what,
                     "%s after %" PRIu64 " of %" PRIu64 " bytes (fail %u/%" PRIu64 ")",
                     p->action == ACT_RESET_MID ? "reset-mid" : "stall-mid", a.stop, a.len,
                     q->key_attempt, p->fail);
            break;
        }
    } else {
        a.status = p->ok;
        a.chunked = p->chunked;
        if (p->echo && cu->echo_overflow) {
            int n = snprintf(text, sizeof text, "tup: echo body over %u bytes\n", TUP_ECHO_MAX);
            a.status = 413;
            a.chunked = false;
            a.text = text;
            a.len = a.stop = (size_t)n;
        } else if (p->echo) {
            a.buf = cu->echo;
            a.len = a.stop = cu->echo_len;
            cu->echo = NULL;
        } else if (p->body_set) {
            a.src = SRC_PATTERN;
            a.len = a.stop = p->body;
        } else {
            a.text = "ok\n";
            a.len = a.stop = 3;
        }
        snprintf(what, sizeof what, "%u%s body %" PRIu64 "%s", a.status,
                 a.status == 413 ? " (echo too large)" : "", a.len, a.chunked ? " chunked" : "");
    }
act:
    if (answer) {
        if (a.status == 0)
            die("internal: no status");
        answer_begin(c, &a);
        pend = PEND_WRITE;
    }
    if (cu->plan_ok && p->delay_ms > 0) {
        size_t k = strlen(what);
        snprintf(what + k, sizeof what - k, " after %u ms", p->delay_ms);
        c->state = ST_DELAY;
        c->pending = pend;
        timer_arm(t, c, mono_ns() + (int64_t)p->delay_ms * 1000000);
    } else if (pend == PEND_WRITE) {
        c->state = ST_WRITE;
    } else {
        c->state = ST_DELAY;
        c->pending = pend;
        timer_arm(t, c, mono_ns());
    }
log:
    /* X-Retry-Attempt: the proxy's count of the attempt; seen: tup's own count of the
     * requests with this id, which its plan's fail=N goes by */
    const char *retry_attempt = tup_req_header(q, "X-Retry-Attempt");
    tlog(t,
         "#%" PRIu64 " conn %" PRIu64 "/%u %s %s id=%s X-Retry-Attempt=%s seen=%u body=%" PRIu64
         " -> %s",
         q->seq, q->conn_id, q->conn_index, q->method, q->target,
         *q->request_id ? q->request_id : "-", retry_attempt ? retry_attempt : "-", q->key_attempt,
         q->body_len, what);
}

/* Reads one CRLF or LF line from the input; its length (terminator included) or 0. */
static size_t get_line(struct conn *c, size_t *content)
{
    char *nl = memchr(c->in, '\n', c->in_len);
    if (!nl)
        return 0;
    size_t n = (size_t)(nl - c->in);
    *content = n > 0 && c->in[n - 1] == '\r' ? n - 1 : n;
    return n + 1;
}

/* 1: the state changed; 0: more input is needed. */
static int parse_body(struct tup *t, struct conn *c)
{
    struct cur *cu = &c->cur;
    for (;;) {
        size_t len;
        size_t n;
        switch (cu->mode) {
        case BM_NONE:
            request_complete(t, c);
            return 1;
        case BM_CL:
        case BM_CHUNK_DATA:
            if (cu->left == 0) {
                cu->mode = cu->mode == BM_CL ? BM_NONE : BM_CHUNK_CRLF;
                continue;
            }
            if (c->in_len == 0)
                return 0;
            n = cu->left < c->in_len ? (size_t)cu->left : c->in_len;
            body_feed(c, (unsigned char *)c->in, n);
            consume(c, n);
            cu->left -= n;
            continue;
        case BM_CHUNK_SIZE:
        case BM_CHUNK_CRLF:
        case BM_TRAILER:
            n = get_line(c, &len);
            if (n == 0) {
                if (c->in_len > LINE_LIMIT) {
                    answer_error(t, c, 400, "chunk line too long");
                    return 1;
                }
                return 0;
            }
            if (cu->mode == BM_CHUNK_CRLF) {
                if (len != 0) {
                    answer_error(t, c, 400, "chunk data not followed by CRLF");
                    return 1;
                }
                cu->mode = BM_CHUNK_SIZE;
            } else if (cu->mode == BM_TRAILER) {
                /* Trailers are kept with the request; the blank line ends the body. */
                if (len == 0)
                    cu->mode = BM_NONE;
                else
                    keep_trailer(cu->rec, c->in, len);
            } else {
                uint64_t size = 0;
                size_t i = 0;
                for (; i < len; i++) {
                    char ch = c->in[i];
                    int d;
                    if (ch >= '0' && ch <= '9')
                        d = ch - '0';
                    else if (ch >= 'a' && ch <= 'f')
                        d = ch - 'a' + 10;
                    else if (ch >= 'A' && ch <= 'F')
                        d = ch - 'A' + 10;
                    else
                        break;
                    if (size >> 59) {
                        answer_error(t, c, 400, "chunk size too large");
                        return 1;
                    }
                    size = size * 16 + (uint64_t)d;
                }
                if (i == 0 || (i < len && c->in[i] != ';' && !is_ows(c->in[i]))) {
                    answer_error(t, c, 400, "bad chunk size");
                    return 1;
                }
                if (size == 0) {
                    cu->mode = BM_TRAILER;
                } else {
                    cu->mode = BM_CHUNK_DATA;
                    cu->left = size;
                }
            }
            consume(c, n);
            continue;
        }
    }
}

static int parse_head_complete(struct tup *t, struct conn *c, size_t end)
{
    const char *why = NULL;
    struct cur *cu = &c->cur;
    cur_reset(c);
    cu->rec = parse_head(c, end, &why);
    if (!cu->rec) {
        answer_error(t, c, 400, why);
        return 1;
    }
    if (body_framing(c, &why) < 0) {
        answer_error(t, c, 400, why);
        return 1;
    }
    struct tup_req *r = &cu->rec->pub;
    /* No reads happen between a head's last bytes and its parsing, except that a pipelined
     * head may have come in an earlier read than the newest: then this is a little late. */
    r->arrival_ns = c->last_read_ns;
    r->conn_id = c->id;
    memcpy(r->local, c->local, sizeof(r->local));
    r->conn_index = ++c->n_reqs;
    cu->head_method = strcmp(r->method, "HEAD") == 0;
    cu->hash = TUP_HASH_INIT;
    consume(c, end);

    const char *plan = tup_req_header(r, "X-Test-Plan");
    if (plan) {
        cu->plan_ok = plan_parse(plan, &cu->plan, cu->plan_err, sizeof cu->plan_err) == 0;
    } else {
        pthread_mutex_lock(&t->mu);
        cu->plan_ok =
            plan_parse(t->default_plan, &cu->plan, cu->plan_err, sizeof cu->plan_err) == 0;
        pthread_mutex_unlock(&t->mu);
    }
    if (!cu->plan_ok)
        plan_init(&cu->plan);

    const char *expect = tup_req_header(r, "Expect");
    if (expect && !cu->http10 && cu->mode != BM_NONE && strcasecmp(expect, "100-continue") == 0)
        out_append(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    c->state = ST_BODY;
    return 1;
}

/* 1: the state changed; 0: more input is needed. */
static int conn_parse(struct tup *t, struct conn *c)
{
    if (c->state == ST_BODY)
        return parse_body(t, c);
    /* Blank lines before a request line are tolerated (RFC 9112, 2.2). */
    size_t skip = 0;
    while (skip < c->in_len && (c->in[skip] == '\r' || c->in[skip] == '\n'))
        skip++;
    if (skip)
        consume(c, skip);
    size_t end = find_head_end(c);
    if (end == 0) {
        if (c->in_len >= TUP_HEAD_MAX) {
            answer_error(t, c, 431, "request head over 64 KiB");
            return 1;
        }
        return 0;
    }
    return parse_head_complete(t, c, end);
}

/* What to do once a response is fully sent. Returns -1 if the connection is gone. */
static int response_done(struct tup *t, struct conn *c)
{
    enum after after = c->after;
    resp_reset(c);
    switch (after) {
    case AFTER_KEEP:
        c->state = ST_HEAD;
        return 0;
    case AFTER_CLOSE:
        start_linger(t, c);
        return 0;
    case AFTER_RST:
        start_rstwait(t, c);
        return 0;
    case AFTER_HANG:
        c->state = ST_HANG; /* until the peer closes */
        c->in_len = 0;
        c->scan = 0;
        return 0;
    }
    return 0;
}

/* Runs the connection's state machine as far as it goes without blocking. */
static void conn_drive(struct tup *t, struct conn *c)
{
    for (;;) {
        switch (c->state) {
        case ST_HEAD:
        case ST_BODY: {
            /* A 100 Continue may be waiting to go out. */
            if (c->out_off < c->out_len && conn_write(c, false) < 0) {
                conn_close(t, c, false);
                return;
            }
            if (conn_parse(t, c))
                continue;
            if (c->eof) {
                conn_close(t, c, false);
                return;
            }
            set_interest(t, c, EPOLLIN | (c->out_off < c->out_len ? EPOLLOUT : 0));
            return;
        }
        case ST_WRITE: {
            int r = conn_write(c, true);
            if (r < 0) {
                conn_close(t, c, false);
                return;
            }
            if (r == 0) {
                set_interest(t, c, EPOLLOUT);
                return;
            }
            response_done(t, c);
            continue;
        }
        case ST_DELAY:
        case ST_RSTWAIT:
            set_interest(t, c, 0);
            return;
        case ST_HANG:
        case ST_LINGER:
            set_interest(t, c, EPOLLIN);
            return;
        }
    }
}

/* Reads what is available. Returns -1 if the connection was closed. */
static void count_in(struct tup *t, ssize_t n)
{
    pthread_mutex_lock(&t->mu);
    t->bytes_in += (uint64_t)n;
    pthread_mutex_unlock(&t->mu);
}

static int conn_read(struct tup *t, struct conn *c)
{
    if (c->state == ST_HANG || c->state == ST_LINGER) {
        char sink[16384];
        for (;;) {
            ssize_t n = read(c->fd, sink, sizeof sink);
            if (n > 0) {
                count_in(t, n);
                continue;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return 0;
            conn_close(t, c, false);
            return -1;
        }
    }
    if (c->state != ST_HEAD && c->state != ST_BODY)
        return 0;
    if (c->in_len == c->in_cap) {
        if (c->in_cap >= TUP_HEAD_MAX)
            return 0;
        c->in_cap = c->in_cap ? c->in_cap * 2 : IN_INIT;
        c->in = xrealloc(c->in, c->in_cap);
    }
    ssize_t n;
    do {
        n = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        conn_close(t, c, false);
        return -1;
    }
    if (n > 0)
        count_in(t, n);
    if (n == 0) {
        c->eof = true;
        /* Nothing more will come: no need to listen for input. */
        return 0;
    }
    c->in_len += (size_t)n;
    c->last_read_ns = mono_ns();
    /* A read that filled the buffer means data is streaming: read bigger pieces. */
    if (c->in_len == c->in_cap && c->in_cap < TUP_HEAD_MAX) {
        c->in_cap *= 2;
        c->in = xrealloc(c->in, c->in_cap);
    }
    return 0;
}

static void conn_event(struct tup *t, struct conn *c, uint32_t events)
{
    if (events & (EPOLLERR | EPOLLHUP)) {
        conn_close(t, c, false);
        return;
    }
    if ((events & EPOLLIN) && conn_read(t, c) < 0)
        return;
    /* After EOF, conn_drive answers what is buffered and then closes. */
    conn_drive(t, c);
}

static void conn_timer(struct tup *t, struct conn *c)
{
    switch (c->state) {
    case ST_DELAY:
        if (c->pending == PEND_RESET) {
            conn_close(t, c, true);
            return;
        }
        if (c->pending == PEND_CLOSE) {
            start_linger(t, c);
            conn_drive(t, c);
            return;
        }
        c->state = ST_WRITE;
        conn_drive(t, c);
        return;
    case ST_LINGER:
        conn_close(t, c, false);
        return;
    case ST_RSTWAIT: {
        int unacked = 0;
        int64_t now = mono_ns();
        if (ioctl(c->fd, SIOCOUTQ, &unacked) < 0 || unacked == 0 || now >= c->rst_give_up) {
            conn_close(t, c, true);
            return;
        }
        timer_arm(t, c, now + RSTWAIT_POLL_NS);
        return;
    }
    default:
        return;
    }
}

static void do_accept(struct tup *t)
{
    for (;;) {
        int fd = accept4(t->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Out of descriptors: stop accepting for a moment instead of spinning. */
                fprintf(stderr, "tup: accept: %s; pausing accepts\n", strerror(errno));
                struct epoll_event ev = { .events = 0, .data.ptr = &t->listen_fd };
                epoll_ctl(t->epfd, EPOLL_CTL_MOD, t->listen_fd, &ev);
                t->listen_paused_until = mono_ns() + PAUSE_NS;
                return;
            }
            die("accept: %s", strerror(errno));
        }
        int one = 1;
        /* Small writes must leave at once: tests measure timing. */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct conn *c = xcalloc(1, sizeof *c);
        c->fd = fd;
        c->id = ++t->next_conn_id;
        struct sockaddr_in la;
        socklen_t lalen = sizeof(la);
        if (getsockname(fd, (struct sockaddr *)&la, &lalen) == 0 && la.sin_family == AF_INET)
            inet_ntop(AF_INET, &la.sin_addr, c->local, sizeof(c->local));
        c->state = ST_HEAD;
        c->heap_idx = SIZE_MAX;
        c->events = EPOLLIN;
        c->next = t->conns;
        if (t->conns)
            t->conns->prev = c;
        t->conns = c;
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
        if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
            die("epoll_ctl(ADD): %s", strerror(errno));
        pthread_mutex_lock(&t->mu);
        t->accepted++;
        t->open++;
        pthread_mutex_unlock(&t->mu);
    }
}

static int next_timeout_ms(struct tup *t, int64_t now)
{
    int64_t at = INT64_MAX;
    if (t->heap_n)
        at = t->heap[0]->deadline;
    if (t->listen_paused_until && t->listen_paused_until < at)
        at = t->listen_paused_until;
    if (at == INT64_MAX)
        return -1;
    if (at <= now)
        return 0;
    int64_t ms = (at - now + 999999) / 1000000;
    return ms > 60000 ? 60000 : (int)ms;
}

static void run_timers(struct tup *t)
{
    int64_t now = mono_ns();
    if (t->listen_paused_until && t->listen_paused_until <= now) {
        t->listen_paused_until = 0;
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &t->listen_fd };
        epoll_ctl(t->epfd, EPOLL_CTL_MOD, t->listen_fd, &ev);
    }
    while (t->heap_n && t->heap[0]->deadline <= now) {
        struct conn *c = t->heap[0];
        timer_cancel(t, c);
        conn_timer(t, c);
    }
}

static void *server_main(void *arg)
{
    struct tup *t = arg;
    struct epoll_event evs[MAX_EVENTS];
    bool running = true;
    while (running) {
        int n = epoll_wait(t->epfd, evs, MAX_EVENTS, next_timeout_ms(t, mono_ns()));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait: %s", strerror(errno));
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &t->wake_fd) {
                running = false;
            } else if (p == &t->listen_fd) {
                do_accept(t);
            } else {
                /* Each fd appears once per batch and only its own handler closes it, so
                 * no later event in this batch refers to a freed connection. */
                conn_event(t, p, evs[i].events);
            }
        }
        run_timers(t);
    }
    return NULL;
}

/* ---- start and stop ---- */

static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static void tup_free(struct tup *t)
{
    while (t->conns)
        conn_free_fd(t, t->conns, false);
    if (t->listen_fd >= 0)
        close(t->listen_fd);
    if (t->epfd >= 0)
        close(t->epfd);
    if (t->wake_fd >= 0)
        close(t->wake_fd);
    for (size_t i = 0; i < t->n_recs; i++)
        rec_free(t->recs[i]);
    free(t->recs);
    free(t->heap);
    for (size_t i = 0; i < KEY_BUCKETS; i++) {
        struct key *k = t->keys[i];
        while (k) {
            struct key *next = k->next;
            free(k);
            k = next;
        }
    }
    free(t->default_plan);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

struct tup *tup_try_start_at(const char *ip, uint16_t port, const char *default_plan, FILE *log,
                             char *err, size_t errlen)
{
    char dummy[8];
    if (!err || !errlen) {
        err = dummy;
        errlen = sizeof dummy;
    }
    raise_nofile();
    struct tup *t = xcalloc(1, sizeof *t);
    t->listen_fd = t->epfd = t->wake_fd = -1;
    t->default_plan = xstrdup(default_plan ? default_plan : "");
    t->log = log;
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);

    const char *step = "socket";
    t->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (t->listen_fd < 0)
        goto fail;
    int one = 1;
    step = "setsockopt(SO_REUSEADDR)";
    if (setsockopt(t->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
        goto fail;
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    step = "inet_pton";
    if (ip && inet_pton(AF_INET, ip, &sa.sin_addr) != 1)
        goto fail;
    step = "bind";
    if (bind(t->listen_fd, (struct sockaddr *)&sa, sizeof sa) < 0)
        goto fail;
    step = "listen";
    if (listen(t->listen_fd, 4096) < 0)
        goto fail;
    socklen_t sl = sizeof sa;
    step = "getsockname";
    if (getsockname(t->listen_fd, (struct sockaddr *)&sa, &sl) < 0)
        goto fail;
    t->port = ntohs(sa.sin_port);
    char ip_text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, ip_text, sizeof ip_text);
    snprintf(t->where, sizeof t->where, "%s:%u", ip_text, t->port);
    step = "epoll_create1";
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (t->epfd < 0)
        goto fail;
    step = "eventfd";
    t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->wake_fd < 0)
        goto fail;
    step = "epoll_ctl(ADD)";
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &t->listen_fd };
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->listen_fd, &ev) < 0)
        goto fail;
    ev.data.ptr = &t->wake_fd;
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->wake_fd, &ev) < 0)
        goto fail;

    /* The server thread takes no signals: SIGINT/SIGTERM go to a sigwait in the caller. */
    sigset_t all;
    sigset_t old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&t->thread, NULL, server_main, t);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        errno = rc;
        step = "pthread_create";
        goto fail;
    }
    t->thread_started = true;
    return t;
fail:
    snprintf(err, errlen, "%s on %s:%u: %s", step, ip ? ip : "127.0.0.1", port, strerror(errno));
    tup_free(t);
    return NULL;
}

struct tup *tup_try_start(uint16_t port, const char *default_plan, FILE *log, char *err,
                          size_t errlen)
{
    return tup_try_start_at(NULL, port, default_plan, log, err, errlen);
}

struct tup *tup_start_port(uint16_t port)
{
    char err[256];
    struct tup *t = tup_try_start(port, NULL, NULL, err, sizeof err);
    if (!t)
        die("cannot start: %s", err);
    return t;
}

struct tup *tup_start(void)
{
    return tup_start_port(0);
}

void tup_stop(struct tup *t)
{
    if (!t)
        return;
    if (t->thread_started) {
        uint64_t one = 1;
        ssize_t w;
        do {
            w = write(t->wake_fd, &one, sizeof one);
        } while (w < 0 && errno == EINTR);
        if (w != (ssize_t)sizeof one)
            die("eventfd write: %s", strerror(errno));
        pthread_join(t->thread, NULL);
    }
    tup_free(t);
}
