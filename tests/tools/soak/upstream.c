/* The soak load's upstream (upstream.h). */
#include "tests/tools/soak/upstream.h"

#include <curl/curl.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/proc.h"

/* ---- the upstream ---- */
#define UP_IN_MAX 16384 /* a request head from the proxy is far smaller */

#define UP_BODY_MAX 65536 /* largest answer body */

#define SLOW_MS 600 /* the "slow" answer's delay */

const char *const kind_name[K_COUNT] = { "ok", "post", "503", "reset", "slow", "backoff" };

enum ustate { U_READ, U_DELAY, U_WRITE };

struct uconn {
    int fd;
    enum ustate st;
    char in[UP_IN_MAX];
    size_t in_len;
    bool have_head;
    uint64_t body_left;
    /* the request being answered */
    int soak; /* enum kind, or -1: plain */
    int attempt;
    size_t size;
    bool close_after;
    int64_t due_ms;
    char *out;
    size_t out_len, out_off;
    struct uconn *prev, *next;
};

static unsigned char pattern[UP_BODY_MAX];

/* After the load: idle connections are closed, every answer closes its connection. */
static bool up_draining(const struct upstream *u)
{
    return atomic_load(&u->drain);
}

static void up_close(struct upstream *u, struct uconn *c, bool rst)
{
    if (rst) {
        struct linger lg = { 1, 0 };
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    }
    close(c->fd); /* also leaves the epoll set */
    if (c->prev)
        c->prev->next = c->next;
    else
        u->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c->out);
    free(c);
    atomic_fetch_sub(&u->open, 1);
}

static void up_interest(struct upstream *u, struct uconn *c, uint32_t ev)
{
    struct epoll_event e = { .events = ev, .data.ptr = c };
    epoll_ctl(u->ep, EPOLL_CTL_MOD, c->fd, &e);
}

/* Value of header 'name' in the head [h, end), or NULL; *len set. */
static const char *head_value(const char *h, const char *end, const char *name, size_t *len)
{
    size_t nl = strlen(name);
    for (const char *line = h; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol)
            eol = end;
        if ((size_t)(eol - line) > nl && strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (v < eol && (*v == ' ' || *v == '\t'))
                v++;
            const char *ve = eol;
            while (ve > v && (ve[-1] == '\r' || ve[-1] == ' '))
                ve--;
            *len = (size_t)(ve - v);
            return v;
        }
        line = eol + 1;
    }
    return NULL;
}

static long head_num(const char *h, const char *end, const char *name, long def)
{
    size_t len;
    const char *v = head_value(h, end, name, &len);
    if (!v || len == 0 || len > 18)
        return def;
    char buf[24];
    memcpy(buf, v, len);
    buf[len] = '\0';
    return strtol(buf, NULL, 10);
}

/* Parses the head in c->in[0, head_len); false if the connection is to be dropped. */
static bool up_parse_head(struct uconn *c, size_t head_len)
{
    const char *h = c->in, *end = c->in + head_len;
    size_t len;
    if (head_value(h, end, "Transfer-Encoding", &len))
        return false; /* the proxy sends buffered bodies with Content-Length */
    long cl = head_num(h, end, "Content-Length", 0);
    if (cl < 0)
        return false;
    c->body_left = (uint64_t)cl;
    c->soak = -1;
    const char *k = head_value(h, end, "X-Soak", &len);
    for (int i = 0; k && i < K_COUNT; i++)
        if (strlen(kind_name[i]) == len && memcmp(k, kind_name[i], len) == 0)
            c->soak = i;
    c->attempt = (int)head_num(h, end, "X-Retry-Attempt", 1);
    long size = head_num(h, end, "X-Soak-Size", 3);
    c->size = size < 0 ? 0 : size > UP_BODY_MAX ? UP_BODY_MAX : (size_t)size;
    const char *conn = head_value(h, end, "Connection", &len);
    c->close_after = conn && len == 5 && strncasecmp(conn, "close", 5) == 0;
    return true;
}

/* Queues an answer; false if the connection had to be dropped instead. */
static bool up_respond(struct upstream *u, struct uconn *c, int status, size_t body)
{
    if (up_draining(u))
        c->close_after = true;
    char head[256];
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n%s\r\n",
                     status, status == 200 ? "OK" : "Service Unavailable", body,
                     c->close_after ? "Connection: close\r\n" : "");
    c->out = malloc((size_t)n + body);
    if (!c->out) {
        up_close(u, c, false);
        return false;
    }
    memcpy(c->out, head, (size_t)n);
    memcpy(c->out + n, pattern, body);
    c->out_len = (size_t)n + body;
    c->out_off = 0;
    c->st = U_WRITE;
    up_interest(u, c, EPOLLOUT);
    atomic_fetch_add(&u->answered, 1);
    return true;
}

/* A complete request: answer it, delay it or reset the connection. Returns false if 'c' is
 * gone. */
static bool up_act(struct upstream *u, struct uconn *c)
{
    bool first = c->attempt <= 1;
    if (c->soak == K_RESET && first) {
        atomic_fetch_add(&u->resets, 1);
        up_close(u, c, true);
        return false;
    }
    if (c->soak == K_SLOW) {
        c->st = U_DELAY;
        c->due_ms = now_ms() + SLOW_MS;
        up_interest(u, c, 0);
        return true;
    }
    if ((c->soak == K_503 || c->soak == K_BACKOFF) && first)
        return up_respond(u, c, 503, 6);
    return up_respond(u, c, 200, c->size);
}

/* Consumes what c->in holds: heads, bodies. False if 'c' is gone. */
static bool up_consume(struct upstream *u, struct uconn *c)
{
    while (c->st == U_READ && c->in_len > 0) {
        if (!c->have_head) {
            char *e = memmem(c->in, c->in_len, "\r\n\r\n", 4);
            if (!e) {
                if (c->in_len == sizeof(c->in)) {
                    up_close(u, c, false);
                    return false;
                }
                return true;
            }
            size_t hl = (size_t)(e + 4 - c->in);
            if (!up_parse_head(c, hl)) {
                up_close(u, c, false);
                return false;
            }
            memmove(c->in, c->in + hl, c->in_len - hl);
            c->in_len -= hl;
            c->have_head = true;
        }
        size_t take = c->body_left < c->in_len ? (size_t)c->body_left : c->in_len;
        memmove(c->in, c->in + take, c->in_len - take);
        c->in_len -= take;
        c->body_left -= take;
        if (c->body_left > 0)
            return true;
        c->have_head = false;
        if (!up_act(u, c))
            return false;
    }
    return true;
}

static void up_write(struct upstream *u, struct uconn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) {
            up_close(u, c, false);
            return;
        }
        c->out_off += (size_t)n;
    }
    free(c->out);
    c->out = NULL;
    if (c->close_after) {
        up_close(u, c, false);
        return;
    }
    c->st = U_READ;
    up_interest(u, c, EPOLLIN);
    up_consume(u, c); /* a request that came in behind the answer */
}

static void up_read(struct upstream *u, struct uconn *c)
{
    for (;;) {
        if (c->in_len == sizeof(c->in)) {
            up_close(u, c, false);
            return;
        }
        ssize_t n = recv(c->fd, c->in + c->in_len, sizeof(c->in) - c->in_len, 0);
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) {
            up_close(u, c, false);
            return;
        }
        c->in_len += (size_t)n;
        if (!up_consume(u, c) || c->st != U_READ)
            return;
    }
}

static void up_accept(struct upstream *u)
{
    for (;;) {
        int fd = accept4(u->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        struct uconn *c = calloc(1, sizeof(*c));
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->st = U_READ;
        struct epoll_event e = { .events = EPOLLIN, .data.ptr = c };
        if (epoll_ctl(u->ep, EPOLL_CTL_ADD, fd, &e) < 0) {
            close(fd);
            free(c);
            continue;
        }
        c->next = u->conns;
        if (u->conns)
            u->conns->prev = c;
        u->conns = c;
        atomic_fetch_add(&u->open, 1);
    }
}

static void *up_main(void *arg)
{
    struct upstream *u = arg;
    struct epoll_event evs[64];
    while (!atomic_load(&u->stop)) {
        int n = epoll_wait(u->ep, evs, 64, 20);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == NULL) {
                up_accept(u);
                continue;
            }
            struct uconn *c = evs[i].data.ptr;
            if (c->st == U_DELAY) {
                if (evs[i].events & (EPOLLERR | EPOLLHUP))
                    up_close(u, c, false);
            } else if (c->st == U_WRITE) {
                up_write(u, c);
            } else {
                up_read(u, c);
            }
        }
        /* Delayed answers that are due; idle connections once draining. Both are rare enough
         * for a walk over every connection (a few hundred at most). */
        int64_t now = now_ms();
        bool drain = atomic_load(&u->drain);
        for (struct uconn *c = u->conns, *next; c; c = next) {
            next = c->next;
            if (c->st == U_DELAY && now >= c->due_ms)
                up_respond(u, c, 200, c->size);
            else if (drain && c->st == U_READ && c->in_len == 0 && !c->have_head)
                up_close(u, c, false);
        }
    }
    while (u->conns)
        up_close(u, u->conns, false);
    return NULL;
}

int up_start(struct upstream *u)
{
    for (size_t i = 0; i < sizeof(pattern); i++)
        pattern[i] = (i % 64 == 63) ? '\n' : (unsigned char)('a' + i % 26);
    u->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof(a);
    if (u->lfd < 0 || bind(u->lfd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
        listen(u->lfd, 1024) < 0 || getsockname(u->lfd, (struct sockaddr *)&a, &al) < 0)
        return -1;
    u->port = ntohs(a.sin_port);
    u->ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event e = { .events = EPOLLIN, .data.ptr = NULL };
    if (u->ep < 0 || epoll_ctl(u->ep, EPOLL_CTL_ADD, u->lfd, &e) < 0)
        return -1;
    return pthread_create(&u->th, NULL, up_main, u) == 0 ? 0 : -1;
}

void up_stop(struct upstream *u)
{
    atomic_store(&u->stop, true);
    pthread_join(u->th, NULL);
    close(u->ep);
    close(u->lfd);
}
