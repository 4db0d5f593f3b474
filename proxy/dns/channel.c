/* channel -- the resolver's c-ares channel in the control loop: its sockets as loop watches
 * (ARES_OPT_SOCK_STATE_CB), its timeouts as one loop timer, its servers and timeouts from the
 * "resolver" settings; a lookup run at once when no loop turns yet; the resolver's life. This
 * file and resolve.c call each other: they are one state machine, a name's lookups and the
 * channel that runs them.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>

#include "proxy/dns/dns_int.h"
#include "proxy/telemetry/metrics.h"

uint64_t dns_mono_ms(const struct dns *d)
{
    if (d->loop)
        return loop_now(d->loop);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- the channel's sockets and timeouts in the loop ---- */

static void on_ares_timer(struct loop_timer *t);

void dns_flush_changes(struct dns *d)
{
    if (d->changed && d->loop) {
        d->changed = false;
        if (d->change_fn)
            d->change_fn(d->change_arg);
    }
}

static void on_sock(struct loop_watch *w, uint32_t events)
{
    struct sock *s = w->arg;
    struct dns *d = s->d;
    int fd = s->fd;
    ares_process_fd(d->ch, events & (EPOLLIN | EPOLLERR | EPOLLHUP) ? fd : ARES_SOCKET_BAD,
                    events & EPOLLOUT ? fd : ARES_SOCKET_BAD);
    dns_rearm(d);
    dns_flush_changes(d);
}

static void on_ares_timer(struct loop_timer *t)
{
    struct dns *d = t->arg;
    ares_process_fd(d->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
    dns_rearm(d);
    dns_flush_changes(d);
}

/* The loop timer at c-ares' next timeout. */
void dns_rearm(struct dns *d)
{
    if (!d->loop)
        return;
    struct timeval tv, *next = ares_timeout(d->ch, NULL, &tv);
    if (!next) {
        loop_timer_stop(d->loop, &d->ares_timer);
        return;
    }
    uint64_t ms = (uint64_t)next->tv_sec * 1000u + ((uint64_t)next->tv_usec + 999u) / 1000u;
    loop_timer_start(d->loop, &d->ares_timer, loop_now(d->loop) + ms, on_ares_timer, d);
}

/* Watches socket 's' for its events (unwatched when that fails: c-ares' own timeouts end its
 * queries then). */
static void sock_watch(struct dns *d, struct sock *s)
{
    if (!d->loop)
        return;
    if (s->watched) {
        if (loop_watch_mod(d->loop, &s->w, s->events) == 0)
            return;
        loop_watch_del(d->loop, &s->w);
    }
    s->watched = loop_watch_add(d->loop, &s->w, s->fd, s->events, on_sock, s) == 0;
}

static void sock_unwatch(struct dns *d, struct sock *s)
{
    if (s->watched)
        loop_watch_del(d->loop, &s->w);
    s->watched = false;
}

/* c-ares opens, changes or closes one of its sockets. */
static void on_sock_state(void *data, ares_socket_t fd, int readable, int writable)
{
    struct dns *d = data;
    size_t i = 0;
    while (i < d->nsocks && d->socks[i]->fd != fd)
        i++;
    uint32_t ev = (readable ? EPOLLIN : 0) | (writable ? EPOLLOUT : 0);
    if (i == d->nsocks) {
        struct sock *s = ev ? calloc(1, sizeof(*s)) : NULL;
        if (!s)
            return;
        if (d->nsocks == d->capsocks) {
            size_t cap = d->capsocks ? 2 * d->capsocks : 4;
            struct sock **v = realloc(d->socks, cap * sizeof(*v));
            if (!v) {
                free(s);
                return;
            }
            d->socks = v;
            d->capsocks = cap;
        }
        s->d = d;
        s->fd = fd;
        s->w.fd = -1;
        d->socks[d->nsocks++] = s;
    }
    struct sock *s = d->socks[i];
    s->events = ev;
    if (ev) {
        sock_watch(d, s);
        return;
    }
    sock_unwatch(d, s);
    d->socks[i] = d->socks[--d->nsocks];
    if (d->loop)
        loop_defer_free(d->loop, s); /* its events of this turn are dropped */
    else
        free(s);
}

/* ---- the channel ---- */

static ares_channel channel_new(struct dns *d, const struct cfg_resolver *s)
{
    struct ares_options o;
    memset(&o, 0, sizeof(o));
    o.sock_state_cb = on_sock_state;
    o.sock_state_cb_data = d;
    /* Two tries at each server, the second twice as long: three of these in all. */
    size_t nserv = s->n_servers ? s->n_servers : 1;
    int per = (int)(s->timeout_ms / (3 * nserv));
    o.timeout = per > 0 ? per : 1;
    o.tries = 2;
    ares_channel ch;
    int rc =
        ares_init_options(&ch, &o, ARES_OPT_SOCK_STATE_CB | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES);
    if (rc != ARES_SUCCESS) {
        fprintf(stderr, "retryproxy: resolver: %s\n", ares_strerror(rc));
        return NULL;
    }
    if (s->n_servers) {
        struct ares_addr_port_node *v = calloc(s->n_servers, sizeof(*v));
        if (!v) {
            ares_destroy(ch);
            return NULL;
        }
        for (size_t i = 0; i < s->n_servers; i++) {
            v[i].next = i + 1 < s->n_servers ? &v[i + 1] : NULL;
            v[i].family = s->servers[i].family;
            memcpy(&v[i].addr, s->servers[i].ip, s->servers[i].family == AF_INET ? 4 : 16);
            v[i].udp_port = v[i].tcp_port = s->servers[i].port;
        }
        rc = ares_set_servers_ports(ch, v);
        free(v);
        if (rc != ARES_SUCCESS) {
            fprintf(stderr, "retryproxy: resolver: servers: %s\n", ares_strerror(rc));
            ares_destroy(ch);
            return NULL;
        }
    }
    return ch;
}

/* Copies the settings, servers included. 0 or -1. */
static int keep_settings(struct dns *d, const struct cfg_resolver *s)
{
    struct cfg_dns_server *v = NULL;
    if (s->n_servers) {
        v = calloc(s->n_servers, sizeof(*v));
        if (!v)
            return -1;
        memcpy(v, s->servers, s->n_servers * sizeof(*v));
        for (size_t i = 0; i < s->n_servers; i++)
            v[i].addr = NULL; /* the snapshot's text is not kept */
    }
    free(d->servers);
    d->servers = v;
    d->s = *s;
    d->s.servers = v;
    return 0;
}

static bool same_servers(const struct cfg_resolver *a, const struct cfg_resolver *b)
{
    if (a->n_servers != b->n_servers || a->timeout_ms != b->timeout_ms)
        return false;
    for (size_t i = 0; i < a->n_servers; i++)
        if (a->servers[i].family != b->servers[i].family ||
            a->servers[i].port != b->servers[i].port ||
            memcmp(a->servers[i].ip, b->servers[i].ip, 16) != 0)
            return false;
    return true;
}

/* A name dns_name_start() made is still waiting for its first answer. */
static bool first_pending(const struct dns *d)
{
    for (size_t i = 0; i < d->nnames; i++)
        if (d->names[i]->first && d->names[i]->pending)
            return true;
    return false;
}

static int64_t clock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Runs the channel here, not in the loop (none turns yet, or a new snapshot waits for its
 * names), until the new names have their first answers or timeout_ms passes: their lookups
 * run side by side, so that a snapshot with many new names waits one timeout at most. */
void dns_wait(struct dns *d)
{
    int64_t start = clock_ms(), now = start;
    while (first_pending(d) && now - start < d->s.timeout_ms) {
        ares_socket_t fds[ARES_GETSOCK_MAXNUM];
        int bits = ares_getsock(d->ch, fds, ARES_GETSOCK_MAXNUM);
        struct pollfd p[ARES_GETSOCK_MAXNUM];
        nfds_t np = 0;
        for (int i = 0; i < ARES_GETSOCK_MAXNUM; i++) {
            /* ARES_GETSOCK_WRITABLE shifts a signed 1 into the sign bit: the same test, unsigned */
            unsigned b = (unsigned)bits;
            short ev = (short)(((b >> i) & 1u ? POLLIN : 0) |
                               ((b >> (i + ARES_GETSOCK_MAXNUM)) & 1u ? POLLOUT : 0));
            if (ev)
                p[np++] = (struct pollfd){ .fd = fds[i], .events = ev };
        }
        struct timeval tv, *next = ares_timeout(d->ch, NULL, &tv);
        int64_t wait = (int64_t)d->s.timeout_ms - (now - start);
        if (next && next->tv_sec * 1000 + next->tv_usec / 1000 + 1 < wait)
            wait = next->tv_sec * 1000 + next->tv_usec / 1000 + 1;
        int rc = poll(p, np, (int)wait);
        if (rc < 0 && errno != EINTR)
            break;
        /* the names answered now time their next lookup from the real now */
        if (d->loop)
            loop_update_now(d->loop);
        bool any = false;
        for (nfds_t i = 0; rc > 0 && i < np; i++) {
            if (!p[i].revents)
                continue;
            any = true;
            ares_process_fd(d->ch,
                            p[i].revents & (POLLIN | POLLERR | POLLHUP) ? p[i].fd : ARES_SOCKET_BAD,
                            p[i].revents & POLLOUT ? p[i].fd : ARES_SOCKET_BAD);
        }
        if (!any)
            ares_process_fd(d->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
        now = clock_ms();
    }
    if (d->loop)
        loop_update_now(d->loop);
    for (size_t i = 0; i < d->nnames; i++) {
        struct dns_name *n = d->names[i];
        if (!n->first)
            continue;
        n->first = false;
        if (n->pending)
            dns_timed_out(n);
        dns_schedule(n);
    }
    dns_rearm(d);
    dns_flush_changes(d);
}

/* ---- the resolver ---- */

struct dns *dns_new(const struct cfg_resolver *s)
{
    struct dns *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    if (ares_library_init(ARES_LIB_INIT_ALL) != ARES_SUCCESS) {
        free(d);
        return NULL;
    }
    if (keep_settings(d, s) < 0 || !(d->ch = channel_new(d, &d->s))) {
        dns_free(d);
        return NULL;
    }
    return d;
}

void dns_free(struct dns *d)
{
    if (!d)
        return;
    while (d->nnames)
        dns_name_free(d->names[d->nnames - 1]);
    if (d->ch)
        ares_destroy(d->ch); /* abandoned lookups are freed by their callbacks */
    if (d->loop)
        loop_timer_stop(d->loop, &d->ares_timer);
    for (size_t i = 0; i < d->nsocks; i++) {
        sock_unwatch(d, d->socks[i]);
        free(d->socks[i]);
    }
    free(d->socks);
    free(d->names);
    free(d->servers);
    free(d);
    ares_library_cleanup();
}

int dns_attach(struct dns *d, struct loop *l)
{
    d->loop = l;
    for (size_t i = 0; i < d->nsocks; i++)
        sock_watch(d, d->socks[i]);
    for (size_t i = 0; i < d->nnames; i++)
        dns_schedule(d->names[i]);
    dns_rearm(d);
    return 0;
}

int dns_configure(struct dns *d, const struct cfg_resolver *s)
{
    if (!same_servers(&d->s, s)) {
        /* A new channel (resolv.conf read again when there are no servers); the old one's
         * lookups end with ARES_EDESTRUCTION and are asked again of the new one. */
        ares_channel ch = channel_new(d, s);
        if (!ch)
            return -1;
        ares_channel old = d->ch;
        d->ch = ch;
        ares_destroy(old);
    }
    if (keep_settings(d, s) < 0)
        return -1;
    for (size_t i = 0; i < d->nnames; i++)
        dns_schedule(d->names[i]);
    dns_rearm(d);
    return 0;
}

void dns_set_metrics(struct dns *d, struct metrics *m)
{
    d->m = m;
    for (size_t i = 0; i < d->nnames; i++)
        if (!d->names[i]->literal && !d->names[i]->mn)
            d->names[i]->mn = metrics_dns_name(m, d->names[i]->shown);
}

void dns_on_change(struct dns *d, void (*fn)(void *arg), void *arg)
{
    d->change_fn = fn;
    d->change_arg = arg;
}
