/* The test upstream (tup.h): its server thread (an epoll loop over non-blocking sockets, a
 * min-heap of timers), the attempt counters per request key, and start and stop. The plans are
 * read in tup_plan.c, the records kept in tup_rec.c, a connection's output and answers written
 * in tup_conn.c and its requests parsed and acted on in tup_parse.c; what they share is
 * tup_int.h. */
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

void tup_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("tup: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

void *tup_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        tup_die("out of memory (%zu bytes)", n);
    return p;
}

void *tup_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        tup_die("out of memory (%zu x %zu bytes)", n, size);
    return p;
}

void *tup_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        tup_die("out of memory (%zu bytes)", n);
    return q;
}

char *tup_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = tup_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

int64_t tup_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- attempt counters per request key (server thread only) ---- */

unsigned tup_key_bump(struct tup *t, const char *id)
{
    uint64_t h = tup_hash(id, strlen(id));
    struct key **slot = &t->keys[h % KEY_BUCKETS];
    for (struct key *k = *slot; k; k = k->next) {
        if (strcmp(k->id, id) == 0)
            return ++k->count;
    }
    size_t n = strlen(id) + 1;
    struct key *k = tup_xmalloc(sizeof *k + n);
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

void tup_timer_cancel(struct tup *t, struct conn *c)
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

void tup_timer_arm(struct tup *t, struct conn *c, int64_t deadline)
{
    tup_timer_cancel(t, c);
    if (t->heap_n == t->heap_cap) {
        t->heap_cap = t->heap_cap ? t->heap_cap * 2 : 64;
        t->heap = tup_xrealloc(t->heap, t->heap_cap * sizeof *t->heap);
    }
    c->deadline = deadline;
    c->heap_idx = t->heap_n;
    t->heap[t->heap_n++] = c;
    heap_up(t, c->heap_idx);
}

static int conn_read(struct tup *t, struct conn *c)
{
    if (c->state == ST_HANG || c->state == ST_LINGER) {
        char sink[16384];
        for (;;) {
            ssize_t n = read(c->fd, sink, sizeof sink);
            if (n > 0) {
                tup_count_in(t, n);
                continue;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return 0;
            tup_conn_close(t, c, false);
            return -1;
        }
    }
    if (c->state != ST_HEAD && c->state != ST_BODY)
        return 0;
    if (c->in_len == c->in_cap) {
        if (c->in_cap >= TUP_HEAD_MAX)
            return 0;
        c->in_cap = c->in_cap ? c->in_cap * 2 : IN_INIT;
        c->in = tup_xrealloc(c->in, c->in_cap);
    }
    ssize_t n;
    do {
        n = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        tup_conn_close(t, c, false);
        return -1;
    }
    if (n > 0)
        tup_count_in(t, n);
    if (n == 0) {
        c->eof = true;
        /* Nothing more will come: no need to listen for input. */
        return 0;
    }
    c->in_len += (size_t)n;
    c->last_read_ns = tup_mono_ns();
    /* A read that filled the buffer means data is streaming: read bigger pieces. */
    if (c->in_len == c->in_cap && c->in_cap < TUP_HEAD_MAX) {
        c->in_cap *= 2;
        c->in = tup_xrealloc(c->in, c->in_cap);
    }
    return 0;
}

static void conn_event(struct tup *t, struct conn *c, uint32_t events)
{
    if (events & (EPOLLERR | EPOLLHUP)) {
        tup_conn_close(t, c, false);
        return;
    }
    if ((events & EPOLLIN) && conn_read(t, c) < 0)
        return;
    /* After EOF, conn_drive answers what is buffered and then closes. */
    tup_conn_drive(t, c);
}

static void conn_timer(struct tup *t, struct conn *c)
{
    switch (c->state) {
    case ST_DELAY:
        if (c->pending == PEND_RESET) {
            tup_conn_close(t, c, true);
            return;
        }
        if (c->pending == PEND_CLOSE) {
            tup_start_linger(t, c);
            tup_conn_drive(t, c);
            return;
        }
        c->state = ST_WRITE;
        tup_conn_drive(t, c);
        return;
    case ST_LINGER:
        tup_conn_close(t, c, false);
        return;
    case ST_RSTWAIT: {
        int unacked = 0;
        int64_t now = tup_mono_ns();
        if (ioctl(c->fd, SIOCOUTQ, &unacked) < 0 || unacked == 0 || now >= c->rst_give_up) {
            tup_conn_close(t, c, true);
            return;
        }
        tup_timer_arm(t, c, now + RSTWAIT_POLL_NS);
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
                t->listen_paused_until = tup_mono_ns() + PAUSE_NS;
                return;
            }
            tup_die("accept: %s", strerror(errno));
        }
        int one = 1;
        /* Small writes must leave at once: tests measure timing. */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct conn *c = tup_xcalloc(1, sizeof *c);
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
            tup_die("epoll_ctl(ADD): %s", strerror(errno));
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
    int64_t now = tup_mono_ns();
    if (t->listen_paused_until && t->listen_paused_until <= now) {
        t->listen_paused_until = 0;
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &t->listen_fd };
        epoll_ctl(t->epfd, EPOLL_CTL_MOD, t->listen_fd, &ev);
    }
    while (t->heap_n && t->heap[0]->deadline <= now) {
        struct conn *c = t->heap[0];
        tup_timer_cancel(t, c);
        conn_timer(t, c);
    }
}

static void *server_main(void *arg)
{
    struct tup *t = arg;
    struct epoll_event evs[MAX_EVENTS];
    bool running = true;
    while (running) {
        int n = epoll_wait(t->epfd, evs, MAX_EVENTS, next_timeout_ms(t, tup_mono_ns()));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            tup_die("epoll_wait: %s", strerror(errno));
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
        tup_conn_free_fd(t, t->conns, false);
    if (t->listen_fd >= 0)
        close(t->listen_fd);
    if (t->epfd >= 0)
        close(t->epfd);
    if (t->wake_fd >= 0)
        close(t->wake_fd);
    for (size_t i = 0; i < t->n_recs; i++)
        tup_rec_free(t->recs[i]);
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
    struct tup *t = tup_xcalloc(1, sizeof *t);
    t->listen_fd = t->epfd = t->wake_fd = -1;
    t->default_plan = tup_xstrdup(default_plan ? default_plan : "");
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
        tup_die("cannot start: %s", err);
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
            tup_die("eventfd write: %s", strerror(errno));
        pthread_join(t->thread, NULL);
    }
    tup_free(t);
}
