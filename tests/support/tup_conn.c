/* The test upstream's connections (tup.h): closing, lingering and resetting them, their output
 * buffer (generated bodies filled in as it drains) and the answers written into it. */
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

void tup_set_interest(struct tup *t, struct conn *c, uint32_t events)
{
    if (c->events == events)
        return;
    struct epoll_event ev = { .events = events, .data.ptr = c };
    if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, c->fd, &ev) < 0)
        tup_die("epoll_ctl(MOD): %s", strerror(errno));
    c->events = events;
}

void tup_cur_reset(struct conn *c)
{
    tup_rec_free(c->cur.rec);
    tup_plan_free(&c->cur.plan);
    free(c->cur.echo);
    memset(&c->cur, 0, sizeof c->cur);
}

void tup_resp_reset(struct conn *c)
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

void tup_conn_free_fd(struct tup *t, struct conn *c, bool rst)
{
    if (rst) {
        struct linger lg = { .l_onoff = 1, .l_linger = 0 };
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    tup_timer_cancel(t, c);
    /* close() also removes the fd from the epoll set: it is never dup'ed. */
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        t->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    tup_cur_reset(c);
    tup_resp_reset(c);
    free(c->in);
    free(c);
}

void tup_conn_close(struct tup *t, struct conn *c, bool rst)
{
    tup_conn_free_fd(t, c, rst);
    pthread_mutex_lock(&t->mu);
    t->open--;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* Our FIN now; keep reading (and dropping) until the peer's FIN, so that unread input does
 * not turn our close into an RST that could destroy what we sent. */
void tup_start_linger(struct tup *t, struct conn *c)
{
    shutdown(c->fd, SHUT_WR);
    c->state = ST_LINGER;
    c->in_len = 0;
    c->scan = 0;
    tup_timer_arm(t, c, tup_mono_ns() + LINGER_NS);
}

void tup_start_rstwait(struct tup *t, struct conn *c)
{
    c->state = ST_RSTWAIT;
    c->rst_give_up = tup_mono_ns() + RSTWAIT_MAX_NS;
    tup_timer_arm(t, c, tup_mono_ns() + RSTWAIT_POLL_NS);
}

static void out_reserve(struct conn *c, size_t more)
{
    if (c->out_len + more <= c->out_cap)
        return;
    size_t cap = c->out_cap ? c->out_cap : 512;
    while (cap < c->out_len + more)
        cap *= 2;
    c->out = tup_xrealloc(c->out, cap);
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
        tup_die("vsnprintf failed");
    out_reserve(c, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(c->out + c->out_len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    c->out_len += (size_t)n;
}

void tup_out_append(struct conn *c, const void *p, size_t n)
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
            tup_out_append(c, "0\r\n\r\n", 5);
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
        tup_out_append(c, "\r\n", 2);
        if (c->src_off == c->src_stop) {
            tup_out_append(c, "0\r\n\r\n", 5);
            c->src_final = true;
        }
    }
    return true;
}

/* 1: response fully sent; 0: the socket is full (or the budget spent); -1: peer is gone. */
int tup_conn_write(struct conn *c, bool fill)
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

/* Puts the response head in the out buffer and sets up the body source. */
void tup_answer_begin(struct conn *c, const struct answer *a)
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
        c->src_buf = tup_xmalloc(a->len);
        memcpy(c->src_buf, a->text, a->len);
    }
    c->after = a->close && a->after == AFTER_KEEP ? AFTER_CLOSE : a->after;
}

/* Answers a request that could not be parsed, then closes; nothing is recorded. */
void tup_answer_error(struct tup *t, struct conn *c, unsigned status, const char *why)
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
    tup_tlog(t, "conn %" PRIu64 ": %u %s (not recorded)", c->id, status, why);
    tup_cur_reset(c);
    c->in_len = 0;
    c->scan = 0;
    tup_answer_begin(c, &a);
    c->state = ST_WRITE;
}
