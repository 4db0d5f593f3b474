/* tunnel -- an upgraded connection's bytes, both ways (proxy/http1/tunnel.h).
 *
 * Side 0 is the client, side 1 the upstream; buf[d] holds bytes read from side d for the other.
 * Every event on either side runs pump(): it reads each side while its buffer has room,
 * writes each buffer to the other side while that side takes bytes, passes an EOF on once
 * its buffer is written, and then watches each side for what it waits for (EPOLLIN while its
 * buffer has room and it has not ended, EPOLLOUT while bytes wait for it). The upstream's side
 * is read, written and watched through proxy/upstream/tunnel_up.h, TLS or cleartext alike: bytes
 * TLS holds past a pump's last round come as an event of their own (docs/upgrades.md).
 */
#include "proxy/http1/tunnel.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proxy/base/dlist.h"
#include "proxy/telemetry/log.h"
#include "proxy/base/loop.h"
#include "proxy/telemetry/metrics.h"
#include "proxy/base/ring.h"
#include "proxy/upstream/tunnel_up.h"

/* Rounds of reading and writing per event, so that one busy tunnel cannot starve the loop
 * (level-triggered epoll calls again for what is left). */
#define ROUNDS 8

struct side {
    bool eof;  /* it sent its end */
    bool shut; /* its write side was shut: the other side's end was passed on */
};

struct tunnel {
    struct tunnel *prev, *next; /* the worker's open tunnels */
    struct tunnel **open;
    struct loop *loop;
    struct side side[2];
    struct ring buf[2];
    int client_fd;
    struct loop_watch cw; /* client_fd's (fd -1: not in the loop yet) */
    struct tunnel_up *up; /* the upstream's connection, watched through it */
    void (*close_client)(void *arg);
    void *close_arg;
    struct loop_timer idle;
    uint32_t idle_ms;
    uint64_t last_ms; /* a byte last moved */
    atomic_uint *count;
    struct metrics *metrics;
    struct metrics_route *route_metrics;
    unsigned worker;
    uint64_t start_ms;
    uint64_t bytes[2];     /* carried from the client, from the upstream */
    uint64_t counted[2];   /* ... of which already in the metrics */
    const char *closed_by; /* who ended it first: "client", "upstream", "idle", "drain" */
    char *route, *request_id;
    bool closed;
};

/* The bytes carried since the last count go into the route's series. */
static void count_bytes(struct tunnel *t)
{
    metrics_tunnel_bytes(t->route_metrics, t->worker, t->bytes[0] - t->counted[0],
                         t->bytes[1] - t->counted[1]);
    t->counted[0] = t->bytes[0];
    t->counted[1] = t->bytes[1];
}

static const char *const side_names[2] = { "client", "upstream" };

/* Side d ended the tunnel (its end, or an error), unless another cause came first. */
static void ended_by(struct tunnel *t, int d)
{
    if (!t->closed_by)
        t->closed_by = side_names[d];
}

static bool again(void)
{
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

/* The client's socket is read with read(): recv() of this binary is the framing check's
 * (proxy/http1/wiretab.h), which an upgraded connection is past. */
static ssize_t side_read(struct tunnel *t, int d, char *p, size_t n)
{
    return d ? tunnel_up_recv(t->up, p, n) : read(t->client_fd, p, n);
}

static ssize_t side_write(struct tunnel *t, int d, const char *p, size_t n)
{
    return d ? tunnel_up_send(t->up, p, n) : send(t->client_fd, p, n, MSG_NOSIGNAL);
}

static void tunnel_close(struct tunnel *t)
{
    if (t->closed)
        return;
    t->closed = true;
    count_bytes(t);
    metrics_tunnels_add(t->metrics, t->worker, -1);
    log_event(CFG_LOG_INFO, "tunnel closed", "route", t->route, "request_id", t->request_id,
              LOG_NUM("duration_ms", loop_now(t->loop) - t->start_ms),
              LOG_NUM("bytes_from_client", t->bytes[0]),
              LOG_NUM("bytes_from_upstream", t->bytes[1]), "closed_by",
              t->closed_by ? t->closed_by : "client", NULL);
    free(t->route);
    free(t->request_id);
    loop_watch_del(t->loop, &t->cw);
    for (int d = 0; d < 2; d++)
        ring_free(&t->buf[d]);
    loop_timer_stop(t->loop, &t->idle);
    tunnel_up_free(t->up); /* closes the upstream's connection, its watch and TLS */
    t->up = NULL;
    shutdown(t->client_fd, SHUT_RDWR); /* the client sees the end now, whatever the front end */
    t->close_client(t->close_arg);
    if (t->count)
        atomic_fetch_sub_explicit(t->count, 1, memory_order_relaxed);
    if (t->open)
        DLIST_UNLINK(*t->open, t);
    loop_defer_free(t->loop, t); /* a watch may have an event pending in this turn */
}

static void on_client(struct loop_watch *w, uint32_t events);

static int watch(struct tunnel *t, int d, uint32_t ev)
{
    if (d)
        return tunnel_up_watch(t->up, ev);
    if (t->cw.fd < 0)
        return loop_watch_add(t->loop, &t->cw, t->client_fd, ev, on_client, t);
    return t->cw.events == ev ? 0 : loop_watch_mod(t->loop, &t->cw, ev);
}

/* Reads side d into its buffer while there is room. -1: an error. */
static int fill(struct tunnel *t, int d, bool *moved)
{
    struct side *s = &t->side[d];
    while (!s->eof && ring_space(&t->buf[d]) > 0) {
        char tmp[16 * 1024];
        size_t room = ring_space(&t->buf[d]);
        ssize_t n = side_read(t, d, tmp, room < sizeof(tmp) ? room : sizeof(tmp));
        if (n < 0 && again())
            return 0;
        if (n <= 0)
            ended_by(t, d);
        if (n < 0)
            return -1;
        *moved = true;
        t->bytes[d] += (size_t)n;
        if (n == 0)
            s->eof = true;
        else if (ring_put(&t->buf[d], tmp, (size_t)n) < 0)
            return -1;
    }
    return 0;
}

/* Writes side d's buffer to the other side while it takes bytes, then passes side d's end on
 * once all it sent is written. -1: an error. */
static int drain(struct tunnel *t, int d, bool *moved)
{
    int o = 1 - d;
    struct ring *q = &t->buf[d];
    while (q->len) {
        ssize_t n = side_write(t, o, q->buf + q->start, q->len);
        if (n < 0 && !again())
            ended_by(t, o);
        if (n < 0)
            return again() ? 0 : -1;
        *moved = true;
        ring_drop(q, (size_t)n);
    }
    if (t->side[d].eof && !t->side[o].shut) {
        /* TLS has no half-close here: the upstream's connection ends whole */
        if (o == 1 && tunnel_up_shut_write(t->up) < 0)
            return -1;
        if (o == 0)
            shutdown(t->client_fd, SHUT_WR);
        t->side[o].shut = true;
    }
    return 0;
}

static void pump(struct tunnel *t)
{
    bool any = false;
    for (int round = 0; round < ROUNDS; round++) {
        bool moved = false;
        for (int d = 0; d < 2; d++)
            if (fill(t, d, &moved) < 0 || drain(t, d, &moved) < 0) {
                tunnel_close(t);
                return;
            }
        if (!moved)
            break;
        any = true;
    }
    if (any) {
        t->last_ms = loop_now(t->loop);
        count_bytes(t);
    }
    if (t->side[0].eof && t->side[1].eof && !t->buf[0].len && !t->buf[1].len) {
        tunnel_close(t); /* both ends passed on */
        return;
    }
    for (int d = 0; d < 2; d++) {
        uint32_t ev = (!t->side[d].eof && ring_space(&t->buf[d]) ? EPOLLIN : 0) |
                      (t->buf[1 - d].len ? EPOLLOUT : 0);
        if (watch(t, d, ev) < 0) {
            tunnel_close(t);
            return;
        }
    }
}

static void on_client(struct loop_watch *w, uint32_t events)
{
    (void)events;
    pump(w->arg);
}

/* The upstream's events, and bytes its TLS holds that no socket event announces. */
static void on_upstream(void *arg, uint32_t events)
{
    (void)events;
    pump(arg);
}

static void on_idle(struct loop_timer *tm)
{
    struct tunnel *t = tm->arg;
    uint64_t now = loop_now(t->loop);
    if (now - t->last_ms >= t->idle_ms) {
        t->closed_by = "idle";
        tunnel_close(t);
        return;
    }
    loop_timer_start(t->loop, &t->idle, t->last_ms + t->idle_ms, on_idle, t);
}

int tunnel_open(struct loop *l, const struct tunnel_client *c, struct tunnel_up *up,
                const struct front_tunnel *conf)
{
    struct tunnel *t = calloc(1, sizeof(*t));
    if (!t) {
        tunnel_up_free(up);
        c->close(c->close_arg);
        return -1;
    }
    t->loop = l;
    t->up = up;
    t->client_fd = c->fd;
    t->cw.fd = -1;
    t->close_client = c->close;
    t->close_arg = c->close_arg;
    t->idle_ms = conf->idle_ms;
    t->metrics = conf->metrics;
    t->route_metrics = conf->route_metrics;
    t->worker = conf->worker;
    t->start_ms = loop_now(l);
    t->route = strdup(conf->route ? conf->route : "");
    t->request_id = strdup(conf->request_id ? conf->request_id : "");
    metrics_tunnels_add(t->metrics, t->worker, 1);
    t->count = conf->count;
    if (t->count)
        atomic_fetch_add_explicit(t->count, 1, memory_order_relaxed);
    t->open = conf->open;
    if (t->open)
        DLIST_PUSH(*t->open, t);
    t->last_ms = loop_now(l);
    size_t rest_len;
    const char *rest = tunnel_up_rest(up, &rest_len);
    t->buf[0].max = t->buf[1].max = TUNNEL_BUFFER;
    /* what each side sent past the handshake goes first; more than a buffer's worth cannot
     * have come (the head reader holds at most that much) */
    if ((c->extra_len && ring_put(&t->buf[0], c->extra, c->extra_len) < 0) ||
        (rest_len && ring_put(&t->buf[1], rest, rest_len) < 0)) {
        tunnel_close(t);
        return -1;
    }
    if (tunnel_up_attach(up, on_upstream, t) < 0) {
        tunnel_close(t);
        return -1;
    }
    if (t->idle_ms)
        loop_timer_start(l, &t->idle, t->last_ms + t->idle_ms, on_idle, t);
    pump(t);
    return 0;
}

void tunnel_close_all(struct tunnel **open)
{
    while (*open) {
        (*open)->closed_by = "drain";
        tunnel_close(*open);
    }
}
