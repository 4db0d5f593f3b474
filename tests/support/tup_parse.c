/* The test upstream's requests (tup.h): the HTTP/1.1 head and body parsed byte by byte (bad
 * ones answered 400 or 431 and not recorded), and each complete request acted on as its plan
 * says. */
#include "tests/support/tup.h"
#include "tests/support/tup_int.h"

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
        tup_trim(&a, &b);
        if ((size_t)(b - a) == n && strncasecmp(a, token, n) == 0)
            return true;
        s = *e ? e + 1 : e;
    }
    return false;
}

/* Parses the head in c->in[0, len) into a new record; NULL and why on malformed input. */
static struct rec *parse_head(struct conn *c, size_t len, const char **why)
{
    struct rec *r = tup_xcalloc(1, sizeof *r);
    /* One copy of the head holds every string of the record, NUL-terminated in place; the
     * extra byte at the end is the "" for a missing request id. */
    char *s = tup_xmalloc(len + 2);
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
    r->pub.headers = tup_xcalloc(n_lines, sizeof *r->pub.headers);

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
        if (tup_is_ows(*line)) {
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
        while (tup_is_ows(*v))
            v++;
        while (ve > v && tup_is_ows(ve[-1]))
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
    tup_rec_free(r);
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
            if (!tup_parse_u64(h->value, e, UINT64_MAX / 2, &v) || (have_cl && v != cl)) {
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
        while (tup_is_ows(*last))
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
            r->body = tup_xrealloc(r->body, cap);
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
                cu->echo = tup_xrealloc(cu->echo, cap);
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
    r->pub.key_attempt = tup_key_bump(t, r->pub.request_id);
    tup_publish(t, r);
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
            tup_die("internal: no status");
        tup_answer_begin(c, &a);
        pend = PEND_WRITE;
    }
    if (cu->plan_ok && p->delay_ms > 0) {
        size_t k = strlen(what);
        snprintf(what + k, sizeof what - k, " after %u ms", p->delay_ms);
        c->state = ST_DELAY;
        c->pending = pend;
        tup_timer_arm(t, c, tup_mono_ns() + (int64_t)p->delay_ms * 1000000);
    } else if (pend == PEND_WRITE) {
        c->state = ST_WRITE;
    } else {
        c->state = ST_DELAY;
        c->pending = pend;
        tup_timer_arm(t, c, tup_mono_ns());
    }
log:
    /* X-Retry-Attempt: the proxy's count of the attempt; seen: tup's own count of the
     * requests with this id, which its plan's fail=N goes by */
    const char *retry_attempt = tup_req_header(q, "X-Retry-Attempt");
    tup_tlog(t,
             "#%" PRIu64 " conn %" PRIu64 "/%u %s %s id=%s X-Retry-Attempt=%s seen=%u body=%" PRIu64
             " -> %s",
             q->seq, q->conn_id, q->conn_index, q->method, q->target,
             *q->request_id ? q->request_id : "-", retry_attempt ? retry_attempt : "-",
             q->key_attempt, q->body_len, what);
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
                    tup_answer_error(t, c, 400, "chunk line too long");
                    return 1;
                }
                return 0;
            }
            if (cu->mode == BM_CHUNK_CRLF) {
                if (len != 0) {
                    tup_answer_error(t, c, 400, "chunk data not followed by CRLF");
                    return 1;
                }
                cu->mode = BM_CHUNK_SIZE;
            } else if (cu->mode == BM_TRAILER) {
                /* Trailers are kept with the request; the blank line ends the body. */
                if (len == 0)
                    cu->mode = BM_NONE;
                else
                    tup_keep_trailer(cu->rec, c->in, len);
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
                        tup_answer_error(t, c, 400, "chunk size too large");
                        return 1;
                    }
                    size = size * 16 + (uint64_t)d;
                }
                if (i == 0 || (i < len && c->in[i] != ';' && !tup_is_ows(c->in[i]))) {
                    tup_answer_error(t, c, 400, "bad chunk size");
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
    tup_cur_reset(c);
    cu->rec = parse_head(c, end, &why);
    if (!cu->rec) {
        tup_answer_error(t, c, 400, why);
        return 1;
    }
    if (body_framing(c, &why) < 0) {
        tup_answer_error(t, c, 400, why);
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
        cu->plan_ok = tup_plan_parse(plan, &cu->plan, cu->plan_err, sizeof cu->plan_err) == 0;
    } else {
        pthread_mutex_lock(&t->mu);
        cu->plan_ok =
            tup_plan_parse(t->default_plan, &cu->plan, cu->plan_err, sizeof cu->plan_err) == 0;
        pthread_mutex_unlock(&t->mu);
    }
    if (!cu->plan_ok)
        tup_plan_init(&cu->plan);

    const char *expect = tup_req_header(r, "Expect");
    if (expect && !cu->http10 && cu->mode != BM_NONE && strcasecmp(expect, "100-continue") == 0)
        tup_out_append(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
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
            tup_answer_error(t, c, 431, "request head over 64 KiB");
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
    tup_resp_reset(c);
    switch (after) {
    case AFTER_KEEP:
        c->state = ST_HEAD;
        return 0;
    case AFTER_CLOSE:
        tup_start_linger(t, c);
        return 0;
    case AFTER_RST:
        tup_start_rstwait(t, c);
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
void tup_conn_drive(struct tup *t, struct conn *c)
{
    for (;;) {
        switch (c->state) {
        case ST_HEAD:
        case ST_BODY: {
            /* A 100 Continue may be waiting to go out. */
            if (c->out_off < c->out_len && tup_conn_write(c, false) < 0) {
                tup_conn_close(t, c, false);
                return;
            }
            if (conn_parse(t, c))
                continue;
            if (c->eof) {
                tup_conn_close(t, c, false);
                return;
            }
            tup_set_interest(t, c, EPOLLIN | (c->out_off < c->out_len ? EPOLLOUT : 0));
            return;
        }
        case ST_WRITE: {
            int r = tup_conn_write(c, true);
            if (r < 0) {
                tup_conn_close(t, c, false);
                return;
            }
            if (r == 0) {
                tup_set_interest(t, c, EPOLLOUT);
                return;
            }
            response_done(t, c);
            continue;
        }
        case ST_DELAY:
        case ST_RSTWAIT:
            tup_set_interest(t, c, 0);
            return;
        case ST_HANG:
        case ST_LINGER:
            tup_set_interest(t, c, EPOLLIN);
            return;
        }
    }
}

/* Reads what is available. Returns -1 if the connection was closed. */
void tup_count_in(struct tup *t, ssize_t n)
{
    pthread_mutex_lock(&t->mu);
    t->bytes_in += (uint64_t)n;
    pthread_mutex_unlock(&t->mu);
}
