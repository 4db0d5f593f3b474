#include "proxy/upstream/curlm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "proxy/upstream/slots.h"

/* Idle easy handles kept for reuse; more are freed. Each holds some kilobytes (its buffers):
 * after a burst, curlm_trim() keeps POOL_KEEP. */
#define POOL_MAX  256
#define POOL_KEEP 16
/* A worker's transfers are spread over several multi handles ("shards"), each with its own
 * connection cache. libcurl looks for a connection to reuse by walking every connection to
 * the host in its cache, and walks the whole cache again when a transfer is removed: with
 * hundreds of connections that cost grows with the load. A shard takes transfers until
 * SHARD_FILL run on it, then the next one is used, so that each cache holds about SHARD_FILL
 * connections at any load, and a light load still runs on the first shard alone (one
 * connection for requests one after another). */
#define SHARDS     8 /* at most 256: struct curlm_xfer keeps the index in a byte */
#define SHARD_FILL 32

/* One per upstream socket curl has asked us to watch, from that moment until curl closes the
 * socket (through on_close). Between transfers curl stops watching a kept-alive connection
 * (CURL_POLL_REMOVE) and watches it again when the next transfer reuses it: the socket stays
 * in epoll meanwhile, "parked", so a request costs no epoll_ctl for its upstream socket. */
struct curlm_sock {
    struct loop_watch w; /* w.fd is -1 while detached from epoll */
    struct shard *sh;    /* the multi handle whose connection this is */
    int fd;
    bool parked;            /* curl is not watching it: events are not passed on */
    _Atomic int64_t *conns; /* its endpoint's count of open connections (NULL: none) */
    /* curl has watched it for reading: it is connected, and curl closes it through on_close.
     * Until then curl may close it behind our back (sock_gone). */
    bool settled;
    /* The transfer curl last watched it for, until that transfer ends: parked with none, the
     * connection is idle in curl's cache (a paused transfer's is parked too, and busy). */
    const struct curlm_xfer *user;
    uint64_t cookie; /* the socket's SO_COOKIE (0: unknown), which a later socket with the same
                        number does not have */
};

struct shard {
    struct curlm *u;
    CURLM *multi;
    struct loop_timer timer;
    size_t active;
    size_t conns; /* its connections, idle ones included */
};

struct curlm {
    struct loop *loop;
    struct shard shards[SHARDS];
    CURL *pool[POOL_MAX];
    size_t npool;
    size_t active;
    struct curlm_sock **socks; /* by fd; NULL where curl has no socket */
    size_t nsocks;
    struct slots *slots; /* the worker's attempt slots, which transfers hold (borrowed) */
    int dead; /* a socket whose peer is closed (sock_close_idle), made when first needed; -1 */
};

static struct curlm_sock *sock_find(const struct curlm *u, int fd);

/* Returns a handle to the pool (reset: nothing of its last transfer remains), or frees it (a
 * 'spent' one always: struct curlm_xfer). */
static void pool_put(struct curlm *u, CURL *e, bool spent)
{
    if (u->npool < POOL_MAX && !spent) {
        curl_easy_reset(e);
        u->pool[u->npool++] = e;
    } else {
        curl_easy_cleanup(e);
    }
}

/* Transfer 'x' ended: the connection it used, if curl keeps it, is idle now. */
static void sock_let_go(struct curlm *u, struct curlm_xfer *x)
{
    struct curlm_sock *s = sock_find(u, x->fd);
    if (s && s->user == x)
        s->user = NULL;
    x->fd = -1;
}

/* Hands every finished transfer of 'sh' to its owner. Runs after curl returned to us, so
 * owners may start or cancel transfers from 'done'. */
static void check_done(struct shard *sh)
{
    struct curlm *u = sh->u;
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(sh->multi, &left)) != NULL) {
        if (m->msg != CURLMSG_DONE)
            continue;
        CURL *easy = m->easy_handle;
        CURLcode rc = m->data.result;
        struct curlm_xfer *x = NULL;
        curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x);
        curl_multi_remove_handle(sh->multi, easy);
        sh->active--;
        u->active--;
        bool spent = x && x->spent;
        if (x) {
            sock_let_go(u, x);
            slots_drop(u->slots, &x->hold);
            x->easy = NULL;
            x->done(x, rc);
        }
        pool_put(u, easy, spent);
    }
    slots_hand_on(u->slots);
}

static void on_sock_event(struct loop_watch *w, uint32_t events)
{
    struct curlm_sock *s = w->arg;
    struct shard *sh = s->sh;
    int flags = 0, running;
    if (s->parked) {
        /* An idle connection became readable: the upstream closed it (or sent bytes nobody
         * asked for). curl finds it dead when it next looks and closes it; until then it must
         * not keep waking the loop. */
        loop_watch_del(sh->u->loop, &s->w);
        return;
    }
    if (events & EPOLLIN)
        flags |= CURL_CSELECT_IN;
    if (events & EPOLLOUT)
        flags |= CURL_CSELECT_OUT;
    if (events & (EPOLLERR | EPOLLHUP))
        flags |= CURL_CSELECT_ERR;
    curl_multi_socket_action(sh->multi, w->fd, flags, &running);
    check_done(sh);
}

static struct curlm_sock *sock_find(const struct curlm *u, int fd)
{
    return fd >= 0 && (size_t)fd < u->nsocks ? u->socks[fd] : NULL;
}

static struct curlm_sock *sock_new(struct shard *sh, int fd)
{
    struct curlm *u = sh->u;
    if ((size_t)fd >= u->nsocks) {
        size_t n = u->nsocks ? u->nsocks : 64;
        while (n <= (size_t)fd)
            n *= 2;
        struct curlm_sock **t = realloc(u->socks, n * sizeof(*t));
        if (!t)
            return NULL;
        for (size_t i = u->nsocks; i < n; i++)
            t[i] = NULL;
        u->socks = t;
        u->nsocks = n;
    }
    struct curlm_sock *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    sh->conns++;
    s->sh = sh;
    s->fd = fd;
    s->w.fd = -1;
    socklen_t len = sizeof(s->cookie);
    if (getsockopt(fd, SOL_SOCKET, SO_COOKIE, &s->cookie, &len) < 0)
        s->cookie = 0;
    u->socks[fd] = s;
    return s;
}

/* libcurl (7.88) closes a socket it has not made its connection's yet (one still connecting
 * when its transfer is cancelled or its connect times out: cf_socket_close() of
 * lib/cf-socket.c, "not active") with close() itself, not through CURLOPT_CLOSESOCKETFUNCTION:
 * on_close never hears of it, the CURL_POLL_REMOVE that may follow names a number that can be
 * another socket's by then, and its endpoint counted the connection for good (issue 38: an endpoint
 * "leaving" forever with connections=1). Whether 's' is still the socket we watched: its number is
 * open and has its cookie. A connected socket
 * ('settled') is not asked: curl closes those through on_close. */
static bool sock_gone(const struct curlm_sock *s)
{
    if (s->settled || !s->cookie)
        return false;
    uint64_t cookie = 0;
    socklen_t len = sizeof(cookie);
    return getsockopt(s->fd, SOL_SOCKET, SO_COOKIE, &cookie, &len) < 0 || cookie != s->cookie;
}

/* 's' is closed: its connection is no longer counted and it is freed. 'gone': curl closed it
 * behind our back (sock_gone), so its number, which may name another file by now, is not
 * touched (the kernel took the closed socket out of epoll with it); otherwise it leaves epoll
 * before on_close closes it. */
static void sock_drop(struct curlm *u, struct curlm_sock *s, bool gone)
{
    if (s->conns)
        atomic_fetch_sub_explicit(s->conns, 1, memory_order_relaxed);
    s->sh->conns--;
    if (gone)
        loop_watch_forget(u->loop, &s->w);
    else
        loop_watch_del(u->loop, &s->w);
    if (u->socks[s->fd] == s)
        u->socks[s->fd] = NULL;
    loop_defer_free(u->loop, s);
}

/* Puts the socket in epoll with 'ev', whatever its state there. */
static int sock_watch(struct curlm *u, struct curlm_sock *s, uint32_t ev)
{
    if (s->w.fd < 0)
        return loop_watch_add(u->loop, &s->w, s->fd, ev, on_sock_event, s);
    int rc = loop_watch_mod(u->loop, &s->w, ev);
    if (rc == -ENOENT) { /* not in epoll after all: add it again */
        s->w.fd = -1;
        return loop_watch_add(u->loop, &s->w, s->fd, ev, on_sock_event, s);
    }
    return rc;
}

static int on_socket(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
    struct shard *sh = userp;
    struct curlm *u = sh->u;
    struct curlm_sock *s = socketp;

    if (what == CURL_POLL_REMOVE) {
        if (!s)
            s = sock_find(u, fd);
        if (s && sock_gone(s)) {
            sock_drop(u, s, true);
            return 0;
        }
        if (s && !s->parked) {
            s->parked = true;
            curl_multi_assign(sh->multi, fd, NULL);
            /* Parked, only a readable socket (the upstream closing it) may wake us. */
            if (s->w.fd >= 0 && s->w.events != EPOLLIN && sock_watch(u, s, EPOLLIN) < 0)
                loop_watch_del(u->loop, &s->w);
        }
        return 0;
    }
    uint32_t ev = 0;
    if (what & CURL_POLL_IN)
        ev |= EPOLLIN;
    if (what & CURL_POLL_OUT)
        ev |= EPOLLOUT;
    struct curlm_xfer *x = NULL;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x);
    bool assign = !s;
    if (!s)
        s = sock_find(u, fd);
    if (s && sock_gone(s)) { /* the number is a new socket's now (curl may even pass the old
                                one's pointer: it did not hear of its close either) */
        sock_drop(u, s, true);
        s = NULL;
        assign = true;
    }
    if (!s) {
        if (!(s = sock_new(sh, fd)))
            return -1;
        /* a new connection: its endpoint counts it until curl closes it */
        if (x && (s->conns = x->conns) != NULL)
            atomic_fetch_add_explicit(s->conns, 1, memory_order_relaxed);
    }
    if (assign) {
        s->parked = false;
        curl_multi_assign(sh->multi, fd, s);
    }
    if (x) {
        s->user = x;
        x->fd = fd;
    }
    if (what & CURL_POLL_IN)
        s->settled = true;
    return sock_watch(u, s, ev) < 0 ? -1 : 0;
}

/* curl is done with a socket: forget it, then close it. */
static int on_close(void *clientp, curl_socket_t fd)
{
    struct curlm *u = clientp;
    struct curlm_sock *s = sock_find(u, fd);
    if (s)
        sock_drop(u, s, false);
    return close(fd);
}

static void on_timer(struct loop_timer *t)
{
    struct shard *sh = t->arg;
    int running;
    curl_multi_socket_action(sh->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    check_done(sh);
}

/* curl asks to be called back after 'ms' (-1: never). Acting here would re-enter curl, so
 * even 0 goes through the loop timer (it fires in the next turn). */
static int on_curl_timer(CURLM *multi, long ms, void *userp)
{
    (void)multi;
    struct shard *sh = userp;
    struct loop *l = sh->u->loop;
    if (ms < 0)
        loop_timer_stop(l, &sh->timer);
    else
        loop_timer_start(l, &sh->timer, loop_now(l) + (uint64_t)ms, on_timer, sh);
    return 0;
}

/* A multi handle for 'sh', or NULL. */
static CURLM *shard_multi(struct shard *sh)
{
    CURLM *m = curl_multi_init();
    if (!m)
        return NULL;
    curl_multi_setopt(m, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(m, CURLMOPT_SOCKETDATA, sh);
    curl_multi_setopt(m, CURLMOPT_TIMERFUNCTION, on_curl_timer);
    curl_multi_setopt(m, CURLMOPT_TIMERDATA, sh);
    curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, CURLM_MAX_CONNECTIONS / SHARDS);
    return m;
}

struct curlm *curlm_new(struct loop *l, struct slots *slots)
{
    struct curlm *u = calloc(1, sizeof(*u));
    if (!u)
        return NULL;
    u->loop = l;
    u->slots = slots;
    u->dead = -1;
    for (size_t i = 0; i < SHARDS; i++) {
        struct shard *sh = &u->shards[i];
        sh->u = u;
        if (!(sh->multi = shard_multi(sh))) {
            curlm_free(u);
            return NULL;
        }
    }
    return u;
}

void curlm_free(struct curlm *u)
{
    if (!u)
        return;
    /* Running transfers were cancelled by their requests when the worker tore them down. */
    for (size_t i = 0; i < SHARDS; i++) {
        loop_timer_stop(u->loop, &u->shards[i].timer);
        if (u->shards[i].multi)
            curl_multi_cleanup(u->shards[i].multi);
    }
    for (size_t i = 0; i < u->npool; i++)
        curl_easy_cleanup(u->pool[i]);
    /* Cleaning up closed every socket through on_close; nothing should be left. */
    for (size_t i = 0; i < u->nsocks; i++)
        if (u->socks[i]) {
            loop_watch_del(u->loop, &u->socks[i]->w);
            free(u->socks[i]);
        }
    free(u->socks);
    if (u->dead >= 0)
        close(u->dead);
    free(u);
}

CURL *curlm_easy_get(struct curlm *u)
{
    CURL *e = u->npool ? u->pool[--u->npool] : curl_easy_init();
    if (!e)
        return NULL;
    /* Shared by every transfer: threads and signals, protocols, no redirects followed. */
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, CURLM_RECV_BUFFER);
    /* Upstreams are reached directly: an http_proxy or HTTPS_PROXY in the sidecar's
     * environment must not reroute them (and is not looked up on every transfer). */
    curl_easy_setopt(e, CURLOPT_PROXY, "");
    /* Sockets are closed through us, so a parked socket is forgotten before its fd number can
     * be reused. */
    curl_easy_setopt(e, CURLOPT_CLOSESOCKETFUNCTION, on_close);
    curl_easy_setopt(e, CURLOPT_CLOSESOCKETDATA, u);
    return e;
}

/* The first shard with room under SHARD_FILL, else the least busy. */
static struct shard *pick_shard(struct curlm *u)
{
    struct shard *least = &u->shards[0];
    for (size_t i = 0; i < SHARDS; i++) {
        struct shard *sh = &u->shards[i];
        if (sh->active < SHARD_FILL)
            return sh;
        if (sh->active < least->active)
            least = sh;
    }
    return least;
}

int curlm_start(struct curlm *u, struct curlm_xfer *x, curlm_done_fn done, void *arg)
{
    x->done = done;
    x->arg = arg;
    x->fd = -1;
    struct shard *sh = pick_shard(u);
    x->shard = (unsigned char)(sh - u->shards);
    curl_easy_setopt(x->easy, CURLOPT_PRIVATE, (char *)x);
    if (curl_multi_add_handle(sh->multi, x->easy) != CURLM_OK) {
        pool_put(u, x->easy, x->spent);
        x->easy = NULL;
        return -1;
    }
    sh->active++;
    u->active++;
    slots_take(u->slots, &x->hold);
    return 0;
}

void curlm_cancel(struct curlm *u, struct curlm_xfer *x)
{
    if (!x->easy)
        return;
    struct shard *sh = &u->shards[x->shard];
    curl_multi_remove_handle(sh->multi, x->easy);
    sh->active--;
    u->active--;
    sock_let_go(u, x);
    slots_drop(u->slots, &x->hold);
    pool_put(u, x->easy, x->spent);
    x->easy = NULL;
    slots_hand_on(u->slots);
}

/* Closes the idle connection 's' now. libcurl (7.88) keeps an idle connection in its cache
 * until a later transfer on the same multi handle looks at it, which on a quiet worker is never,
 * and has no call to close one: its descriptor is made a copy of a socket whose peer is closed
 * instead. dup3() closes the TCP socket (the upstream sees it close, the endpoint's count drops
 * and it is gone from /upstreams) and keeps the number taken, so libcurl, which finds the copy
 * dead (its peer closed) when it next looks, closes it through on_close and nothing else. */
static void sock_close_idle(struct curlm *u, struct curlm_sock *s)
{
    if (sock_gone(s)) { /* its number is not ours to replace */
        sock_drop(u, s, true);
        return;
    }
    loop_watch_del(u->loop, &s->w);
    if (u->dead < 0) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0) {
            close(sv[1]);
            u->dead = sv[0];
        }
    }
    if (u->dead < 0 || dup3(u->dead, s->fd, O_CLOEXEC) < 0) {
        shutdown(s->fd, SHUT_RDWR); /* the upstream sees it close at least */
        return;
    }
    if (s->conns)
        atomic_fetch_sub_explicit(s->conns, 1, memory_order_relaxed);
    s->conns = NULL;
}

void curlm_leave(struct curlm *u, const _Atomic int64_t *conns)
{
    /* libcurl's idle connections to it close now; busy ones as their transfers end (the
     * endpoint's last attempt calls this again, docs/endpoints.md) */
    for (size_t i = 0; conns && i < u->nsocks; i++) {
        struct curlm_sock *s = u->socks[i];
        if (s && s->parked && !s->user && s->conns == conns)
            sock_close_idle(u, s);
    }
}

void curlm_trim(struct curlm *u)
{
    while (u->npool > POOL_KEEP)
        curl_easy_cleanup(u->pool[--u->npool]);
    /* libcurl keeps each connection whose transfer ended for a next one, and closes it only when
     * a transfer on the same multi handle finds it dead: a burst's hundreds would stay open
     * (and their upstreams' ends with them). A shard with no transfer running is made anew,
     * which closes its connections (through on_close). */
    for (size_t i = 0; i < SHARDS; i++) {
        struct shard *sh = &u->shards[i];
        CURLM *m = !sh->active && sh->conns ? shard_multi(sh) : NULL;
        if (!m)
            continue;
        loop_timer_stop(u->loop, &sh->timer);
        curl_multi_cleanup(sh->multi);
        sh->multi = m;
    }
}

size_t curlm_active(const struct curlm *u)
{
    return u->active;
}
