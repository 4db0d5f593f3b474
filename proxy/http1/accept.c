#include "proxy/http1/accept.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "proxy/base/dlist.h"
#include "proxy/telemetry/log.h"

/* Connections taken from the backlog in one turn at most, so that a burst of connections does
 * not starve the requests already open. */
#define ACCEPT_BATCH 64
/* Out of descriptors (or of kernel memory), accepting pauses this long: the listening socket
 * stays readable while the backlog holds connections, and a level-triggered watch would report
 * it again at once, failing every time (nginx's accept pause). A connection closing ends the
 * pause sooner. */
#define ACCEPT_PAUSE_MS 250
/* Pauses are logged at most this often, for the whole process. */
#define ACCEPT_LOG_MS 1000

/* A connection whose first bytes are awaited. */
struct sniff {
    struct sniff *prev, *next;
    struct acceptor *a;
    int fd;
    bool got_bytes; /* the wait is the preface's now, no longer the idle one */
    struct loop_watch watch;
    struct loop_timer timer;
    struct sockaddr_storage sa;
    socklen_t sa_len;
};

struct acceptor {
    struct loop *loop;
    const struct accept_ops *ops;
    void *arg;
    int fd;         /* the listening socket; -1 once quiesced */
    bool listening; /* its watch is in the loop (false at the limit) */
    bool paused;    /* out of descriptors: the watch waits for pause_t */
    unsigned limit; /* connections open at once, these and the owner's */
    unsigned n_sniff;
    struct sniff *sniffs;
    struct loop_watch watch;
    struct loop_timer pause_t;
};

/* Pauses since the last line logged, and when it was (every worker's acceptor). */
static atomic_uint_fast64_t pauses, logged_ms;

int accept_sniff(const char *p, size_t n)
{
    size_t k = n < ACCEPT_H2_PREFACE_LEN ? n : ACCEPT_H2_PREFACE_LEN;
    if (memcmp(p, ACCEPT_H2_PREFACE, k) != 0)
        return ACCEPT_HTTP1;
    return k == ACCEPT_H2_PREFACE_LEN ? ACCEPT_HTTP2 : -1;
}

static void sniff_free(struct sniff *s, bool close_fd)
{
    struct acceptor *a = s->a;
    loop_watch_del(a->loop, &s->watch);
    loop_timer_stop(a->loop, &s->timer);
    if (close_fd) {
        close(s->fd);
        a->ops->count(a->arg, -1);
    }
    DLIST_UNLINK(a->sniffs, s);
    a->n_sniff--;
    loop_defer_free(a->loop, s); /* its watch may have an event in this turn */
}

void accept_peer_text(const struct sockaddr *sa, char *out, size_t cap)
{
    out[0] = '\0';
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, out,
                  (socklen_t)cap);
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, out,
                  (socklen_t)cap);
}

unsigned accept_peer_port(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)(const void *)sa)->sin_port);
    if (sa->sa_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)(const void *)sa)->sin6_port);
    return 0;
}

static void resume_listening(struct acceptor *a);
static void pause_accepting(struct acceptor *a, int err);
static void on_sniff_timeout(struct loop_timer *t);

/* Hands the connection over once its first bytes tell, or closes it when the client went.
 * Returns true while it waits for more. */
static bool look(struct sniff *s)
{
    struct acceptor *a = s->a;
    char buf[ACCEPT_H2_PREFACE_LEN];
    ssize_t n = recv(s->fd, buf, sizeof(buf), MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return true;
    if (n <= 0) {
        sniff_free(s, true); /* gone before a request */
        resume_listening(a);
        return false;
    }
    int proto = accept_sniff(buf, (size_t)n);
    if (proto < 0) {
        if (!s->got_bytes) {
            /* a beginning of the preface: the rest within the header timeout */
            struct accept_limits lim;
            a->ops->limits(a->arg, &lim);
            s->got_bytes = true;
            if (lim.header_timeout_ms) /* 0: the idle timeout alone */
                loop_timer_start(a->loop, &s->timer, loop_now(a->loop) + lim.header_timeout_ms,
                                 on_sniff_timeout, s);
        }
        return true;
    }
    char peer[INET6_ADDRSTRLEN];
    accept_peer_text((const struct sockaddr *)&s->sa, peer, sizeof(peer));
    int fd = s->fd;
    struct sockaddr_storage sa = s->sa;
    socklen_t sa_len = s->sa_len;
    /* the gauge counts it on: the owner's count takes over from here */
    a->ops->count(a->arg, -1);
    sniff_free(s, false);
    a->ops->take(a->arg, (enum accept_proto)proto, fd, (const struct sockaddr *)&sa, sa_len, peer);
    return false;
}

static void on_sniff_event(struct loop_watch *w, uint32_t events)
{
    struct sniff *s = w->arg;
    struct acceptor *a = s->a;
    if (look(s) && (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
        sniff_free(s, true); /* a beginning of the preface, then the end */
        resume_listening(a);
    }
}

/* Nothing (or only part of the preface) came in time: closed, no answer (an HTTP/1.1 head
 * never began; an HTTP/2 client gets no session it could be told anything on). */
static void on_sniff_timeout(struct loop_timer *t)
{
    struct sniff *s = t->arg;
    struct acceptor *a = s->a;
    sniff_free(s, true);
    resume_listening(a);
}

static bool at_limit(const struct acceptor *a)
{
    return a->n_sniff + a->ops->open(a->arg) >= a->limit;
}

static void start_sniff(struct acceptor *a, int fd, const struct sockaddr_storage *sa,
                        socklen_t sa_len)
{
    struct accept_limits lim;
    a->ops->limits(a->arg, &lim);
    /* Linux sizes a loopback connection's send buffer up to 4 MiB at once, whatever the peer
     * reads: a slow reader would have the proxy copy megabytes into the kernel for it
     * (docs/hardening.md, "Slow clients"). */
    int sndbuf = (int)lim.send_buffer;
    if (sndbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    struct sniff *s = calloc(1, sizeof(*s));
    if (!s) {
        close(fd);
        return;
    }
    s->a = a;
    s->fd = fd;
    s->sa = *sa;
    s->sa_len = sa_len;
    s->watch.fd = -1;
    DLIST_PUSH(a->sniffs, s);
    a->n_sniff++;
    a->ops->count(a->arg, 1);
    if (lim.idle_ms) /* 0: never */
        loop_timer_start(a->loop, &s->timer, loop_now(a->loop) + lim.idle_ms, on_sniff_timeout, s);
    /* A client often sends its request with the connection: look before watching. */
    /* Edge-triggered: the bytes looked at stay in the socket, and a level-triggered watch would
     * report them again at once while the rest of the preface is awaited. */
    if (look(s) && loop_watch_add(a->loop, &s->watch, fd, EPOLLIN | EPOLLRDHUP | EPOLLET,
                                  on_sniff_event, s) < 0)
        sniff_free(s, true);
}

static void on_listen(struct loop_watch *w, uint32_t events)
{
    (void)events;
    struct acceptor *a = w->arg;
    for (int i = 0; i < ACCEPT_BATCH && a->fd >= 0; i++) {
        if (at_limit(a)) {
            /* the backlog holds the rest until a connection closes (accept_closed) */
            loop_watch_del(a->loop, &a->watch);
            a->listening = false;
            if (a->ops->limited)
                a->ops->limited(a->arg);
            return;
        }
        struct sockaddr_storage sa;
        socklen_t sa_len = sizeof(sa);
        int fd = accept4(a->fd, (struct sockaddr *)&sa, &sa_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
            pause_accepting(a, errno);
            return;
        }
        if (fd < 0)
            return; /* EAGAIN, or a connection that went before it was accepted */
        start_sniff(a, fd, &sa, sa_len);
    }
}

static void on_pause_end(struct loop_timer *t)
{
    resume_listening(t->arg);
}

static void pause_accepting(struct acceptor *a, int err)
{
    loop_watch_del(a->loop, &a->watch);
    a->listening = false;
    a->paused = true;
    uint64_t now = loop_now(a->loop);
    loop_timer_start(a->loop, &a->pause_t, now + ACCEPT_PAUSE_MS, on_pause_end, a);
    uint64_t n = atomic_fetch_add(&pauses, 1) + 1, last = atomic_load(&logged_ms);
    if ((last == 0 || now - last >= ACCEPT_LOG_MS) &&
        atomic_compare_exchange_strong(&logged_ms, &last, now)) {
        atomic_fetch_sub(&pauses, n);
        log_event(CFG_LOG_ERROR, "accepting paused: no descriptor for a new connection", "error",
                  strerror(err), LOG_NUM("pauses", n), LOG_NUM("pause_ms", ACCEPT_PAUSE_MS), NULL);
    }
}

static void resume_listening(struct acceptor *a)
{
    if (a->paused) {
        /* the pause is over, or a connection closed: a descriptor is free */
        loop_timer_stop(a->loop, &a->pause_t);
        a->paused = false;
    }
    if (a->listening || a->fd < 0 || at_limit(a))
        return;
    if (loop_watch_add(a->loop, &a->watch, a->fd, EPOLLIN, on_listen, a) == 0)
        a->listening = true;
}

struct acceptor *accept_new(struct loop *l, int listen_fd, unsigned limit,
                            const struct accept_ops *ops, void *arg)
{
    struct acceptor *a = calloc(1, sizeof(*a));
    if (!a) {
        close(listen_fd);
        return NULL;
    }
    a->loop = l;
    a->ops = ops;
    a->arg = arg;
    a->fd = listen_fd;
    a->limit = limit ? limit : 1;
    a->watch.fd = -1;
    resume_listening(a);
    if (!a->listening) {
        close(listen_fd);
        free(a);
        return NULL;
    }
    return a;
}

void accept_closed(struct acceptor *a)
{
    resume_listening(a);
}

void accept_quiesce(struct acceptor *a)
{
    if (a->fd < 0)
        return;
    if (a->listening)
        loop_watch_del(a->loop, &a->watch);
    a->listening = false;
    loop_timer_stop(a->loop, &a->pause_t);
    close(a->fd);
    a->fd = -1;
}

unsigned accept_pending(const struct acceptor *a)
{
    return a->n_sniff;
}

void accept_free(struct acceptor *a)
{
    if (!a)
        return;
    accept_quiesce(a);
    while (a->sniffs)
        sniff_free(a->sniffs, true);
    free(a);
}
