/* connect -- one connection to an upstream origin (proxy/upstream/connect.h).
 *
 *   start --connect--> TCP --SO_ERROR 0, https--> TLS --handshake, ALPN--> up: 'io' from now
 *            |                 |                    |
 *            +-----------------+--------------------+--refused, timed out, TLS failed--> failed
 */
#include "proxy/upstream/connect.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "proxy/telemetry/log.h"
#include "proxy/upstream/origin.h"

/* At most one TLS failure is logged per worker in this time (a broken upstream fails every
 * connection). */
#define TLS_LOG_EVERY_MS 1000

/* When this worker last logged a TLS failure (a worker is a thread). */
static _Thread_local uint64_t tls_logged;

struct connect_side *connect_side_new(struct loop *l)
{
    struct connect_side *cs = calloc(1, sizeof(*cs));
    if (cs)
        cs->loop = l;
    return cs;
}

void connect_side_free(struct connect_side *cs)
{
    if (!cs)
        return;
    tls_ctxs_free(cs->tls);
    free(cs);
}

bool connector_again(void)
{
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

void connector_init(struct connector *k)
{
    *k = (struct connector){ .fd = -1, .w.fd = -1 };
}

void connector_unwatch(struct connector *k)
{
    if (!k->loop)
        return;
    loop_watch_del(k->loop, &k->w);
    loop_timer_stop(k->loop, &k->timer);
    loop_timer_stop(k->loop, &k->kick);
}

void connector_close(struct connector *k)
{
    connector_unwatch(k);
    tls_free(k->tls);
    k->tls = NULL;
    if (k->fd >= 0) {
        close(k->fd);
        if (k->conns)
            atomic_fetch_sub_explicit(k->conns, 1, memory_order_relaxed);
    }
    k->fd = -1;
    k->conns = NULL;
    tls_conf_clear(&k->tconf);
    free(k->authority);
    k->authority = NULL;
}

static void fail(struct connector *k, const char *why)
{
    char copy[256]; /* 'why' may be the TLS connection's, which closing frees */
    snprintf(copy, sizeof(copy), "%s", why);
    connector_close(k);
    k->ops->failed(k->arg, copy);
}

static void tls_failed(struct connector *k, const char *why)
{
    uint64_t now = loop_now(k->loop);
    if (!tls_logged || now - tls_logged >= TLS_LOG_EVERY_MS) {
        tls_logged = now;
        log_event(CFG_LOG_WARN, "upstream TLS failed; its requests were not sent", "upstream",
                  k->authority, "host", k->tconf.name, "error", why, NULL);
    }
    fail(k, why);
}

static void on_kick(struct loop_timer *t)
{
    struct connector *k = t->arg;
    if (k->up && k->tls && tls_pending(k->tls))
        k->ops->io(k->arg, EPOLLIN);
}

ssize_t connector_tls_recv(struct connector *k, void *p, size_t n)
{
    ssize_t r = tls_recv(k->tls, p, n);
    /* what TLS decrypted beyond 'n' has no socket event coming: an 'io' in the next turn */
    if (r > 0 && tls_pending(k->tls) && !loop_timer_armed(&k->kick))
        loop_timer_start(k->loop, &k->kick, loop_now(k->loop), on_kick, k);
    return r;
}

static void went_up(struct connector *k, bool h2)
{
    k->up = true;
    loop_timer_stop(k->loop, &k->timer);
    k->ops->up(k->arg, h2);
}

/* One step of the TLS handshake. */
static void handshake(struct connector *k)
{
    switch (tls_handshake(k->tls)) {
    case TLS_WANT_READ:
        if (connector_watch(k, EPOLLIN) < 0)
            fail(k, "cannot watch the socket");
        return;
    case TLS_WANT_WRITE:
        if (connector_watch(k, EPOLLOUT) < 0)
            fail(k, "cannot watch the socket");
        return;
    case TLS_FAILED:
        tls_failed(k, tls_error(k->tls));
        return;
    case TLS_DONE:
        break;
    }
    went_up(k, tls_is_h2(k->tls));
}

void connector_refuse(struct connector *k, const char *why)
{
    tls_failed(k, why);
}

static void connected(struct connector *k)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
        fail(k, strerror(err ? err : errno));
        return;
    }
    k->tcp = true;
    if (!k->tconf.name) {
        went_up(k, false);
        return;
    }
    if (!(k->tls = tls_new(k->ctxs, k->fd, &k->tconf, k->alpn))) {
        tls_failed(k, "cannot set up TLS (out of memory, or a file of tls does not load)");
        return;
    }
    handshake(k);
}

static void on_io(struct loop_watch *w, uint32_t events)
{
    struct connector *k = w->arg;
    if (k->up)
        k->ops->io(k->arg, events);
    else if (k->tcp)
        handshake(k);
    else if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
        connected(k);
}

int connector_rewatch(struct connector *k, uint32_t ev)
{
    int r = loop_watch_add(k->loop, &k->w, k->fd, ev, on_io, k);
    if (r == 0 && k->tls && tls_pending(k->tls))
        loop_timer_start(k->loop, &k->kick, loop_now(k->loop), on_kick, k);
    return r;
}

static void on_timeout(struct loop_timer *t)
{
    fail(t->arg, "connect timed out");
}

int connector_start(struct connector *k, struct connect_side *cs, const struct origin *o,
                    enum tls_alpn alpn, uint64_t timeout_ms, const struct connector_ops *ops,
                    void *arg)
{
    struct loop *l = cs->loop;
    connector_init(k);
    k->loop = l;
    k->ops = ops;
    k->arg = arg;
    k->ctxs = &cs->tls;
    k->alpn = alpn;
    if (!o->addr_len)
        return -1; /* a name: only its endpoints have addresses */
    if (!(k->authority = strdup(o->authority)) ||
        (o->tls && tls_conf_copy(&k->tconf, &o->tls_conf) < 0))
        goto fail;
    k->fd = socket(o->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (k->fd < 0)
        goto fail;
    if ((k->conns = o->conns) != NULL)
        atomic_fetch_add_explicit(k->conns, 1, memory_order_relaxed);
    int one = 1;
    setsockopt(k->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(k->fd, (const struct sockaddr *)&o->addr, o->addr_len) < 0 && errno != EINPROGRESS)
        goto fail;
    if (loop_watch_add(l, &k->w, k->fd, EPOLLOUT, on_io, k) < 0)
        goto fail;
    if (timeout_ms)
        loop_timer_start(l, &k->timer, loop_now(l) + timeout_ms, on_timeout, k);
    return 0;
fail:
    connector_close(k);
    return -1;
}
