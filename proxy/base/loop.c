#include "proxy/base/loop.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_EVENTS 256

struct loop {
    int epfd;
    int tfd;           /* timerfd armed to the earliest timer */
    uint64_t armed_ms; /* what tfd is armed to; 0: disarmed */
    uint64_t now_ms;
    uint64_t (*clock)(void *); /* the time source: CLOCK_MONOTONIC unless a test sets one */
    void *clock_arg;
    bool stopping;
    struct loop_watch tfd_watch;

    struct loop_timer **heap; /* min-heap on when_ms */
    size_t n, cap;

    void **graveyard; /* freed at the end of the turn */
    size_t ngrave, capgrave;

    void (*idle)(void *);
    void *idle_arg;

    /* Events of the current turn, so that a deleted watch's pending events can be dropped. */
    struct epoll_event *events;
    int nevents;
};

static uint64_t monotonic_ms(void *arg)
{
    (void)arg;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t loop_now(const struct loop *l)
{
    return l->now_ms;
}

uint64_t loop_update_now(struct loop *l)
{
    l->now_ms = l->clock(l->clock_arg);
    return l->now_ms;
}

uint64_t loop_clock_us(const struct loop *l)
{
    if (l->clock != monotonic_ms)
        return l->clock(l->clock_arg) * 1000;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

void loop_set_clock(struct loop *l, uint64_t (*clock)(void *arg), void *arg)
{
    l->clock = clock ? clock : monotonic_ms;
    l->clock_arg = arg;
    loop_update_now(l);
}

/* ---- the timer heap ---- */

static void heap_set(struct loop *l, size_t i, struct loop_timer *t)
{
    l->heap[i] = t;
    t->slot = i + 1;
}

static void sift_up(struct loop *l, size_t i)
{
    struct loop_timer *t = l->heap[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (l->heap[parent]->when_ms <= t->when_ms)
            break;
        heap_set(l, i, l->heap[parent]);
        i = parent;
    }
    heap_set(l, i, t);
}

static void sift_down(struct loop *l, size_t i)
{
    struct loop_timer *t = l->heap[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= l->n)
            break;
        if (c + 1 < l->n && l->heap[c + 1]->when_ms < l->heap[c]->when_ms)
            c++;
        if (t->when_ms <= l->heap[c]->when_ms)
            break;
        heap_set(l, i, l->heap[c]);
        i = c;
    }
    heap_set(l, i, t);
}

void loop_timer_stop(struct loop *l, struct loop_timer *t)
{
    if (!t->slot)
        return;
    size_t i = t->slot - 1;
    t->slot = 0;
    l->n--;
    if (i == l->n)
        return;
    /* The last timer fills the hole and moves whichever way restores the heap. */
    struct loop_timer *moved = l->heap[l->n];
    heap_set(l, i, moved);
    sift_down(l, i);
    sift_up(l, moved->slot - 1);
}

void loop_timer_start(struct loop *l, struct loop_timer *t, uint64_t when_ms, loop_timer_fn fn,
                      void *arg)
{
    loop_timer_stop(l, t);
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        struct loop_timer **h = realloc(l->heap, cap * sizeof(*h));
        if (!h)
            abort(); /* a timer we cannot arm would hang a request forever */
        l->heap = h;
        l->cap = cap;
    }
    t->when_ms = when_ms;
    t->fn = fn;
    t->arg = arg;
    heap_set(l, l->n++, t);
    sift_up(l, l->n - 1);
}

size_t loop_timer_count(const struct loop *l)
{
    return l->n;
}

/* Arms the timerfd to the earliest timer when that changed; one syscall per turn at most. */
static void rearm(struct loop *l)
{
    uint64_t want = l->n ? l->heap[0]->when_ms : 0;
    if (want == l->armed_ms)
        return;
    struct itimerspec its = { 0 };
    if (want) {
        /* The cached clock is truncated to the millisecond, so "now + d" may lie up to 1 ms
         * less than d ahead: wake at the end of that millisecond, never early. Timers already
         * due run at the end of the turn that armed them, without waiting for this. */
        uint64_t at = want + 1;
        its.it_value.tv_sec = (time_t)(at / 1000);
        its.it_value.tv_nsec = (long)(at % 1000) * 1000000;
    }
    timerfd_settime(l->tfd, TFD_TIMER_ABSTIME, &its, NULL);
    l->armed_ms = want;
}

static void run_timers(struct loop *l)
{
    while (l->n && l->heap[0]->when_ms <= l->now_ms) {
        struct loop_timer *t = l->heap[0];
        loop_timer_stop(l, t);
        t->fn(t);
    }
}

static void on_timerfd(struct loop_watch *w, uint32_t events)
{
    (void)events;
    struct loop *l = w->arg;
    uint64_t expirations;
    if (read(l->tfd, &expirations, sizeof(expirations)) < 0) {
        /* EAGAIN: re-armed before we read; the timers below are checked anyway */
    }
    l->armed_ms = 0; /* a fired timerfd is disarmed */
}

/* ---- watches ---- */

int loop_watch_add(struct loop *l, struct loop_watch *w, int fd, uint32_t events, loop_fd_fn fn,
                   void *arg)
{
    struct epoll_event ev = { .events = events, .data.ptr = w };
    w->fd = fd;
    w->events = events;
    w->fn = fn;
    w->arg = arg;
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        int e = errno;
        w->fd = -1; /* never added: its delete must not touch the fd (another watch's, EEXIST) */
        return -e;
    }
    return 0;
}

int loop_watch_mod(struct loop *l, struct loop_watch *w, uint32_t events)
{
    if (events == w->events)
        return 0;
    struct epoll_event ev = { .events = events, .data.ptr = w };
    if (epoll_ctl(l->epfd, EPOLL_CTL_MOD, w->fd, &ev) < 0)
        return -errno;
    w->events = events;
    return 0;
}

void loop_watch_forget(struct loop *l, struct loop_watch *w)
{
    w->fd = -1;
    for (int i = 0; i < l->nevents; i++)
        if (l->events[i].data.ptr == w)
            l->events[i].data.ptr = NULL;
}

void loop_watch_del(struct loop *l, struct loop_watch *w)
{
    if (w->fd < 0)
        return;
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, w->fd, NULL);
    loop_watch_forget(l, w);
}

void loop_defer_free(struct loop *l, void *p)
{
    if (l->ngrave == l->capgrave) {
        size_t cap = l->capgrave ? l->capgrave * 2 : 32;
        void **g = realloc(l->graveyard, cap * sizeof(*g));
        if (!g) {
            abort();
        }
        l->graveyard = g;
        l->capgrave = cap;
    }
    l->graveyard[l->ngrave++] = p;
}

static void bury(struct loop *l)
{
    for (size_t i = 0; i < l->ngrave; i++)
        free(l->graveyard[i]);
    l->ngrave = 0;
}

/* ---- the loop ---- */

struct loop *loop_new(void)
{
    struct loop *l = calloc(1, sizeof(*l));
    if (!l)
        return NULL;
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    l->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    l->events = calloc(MAX_EVENTS, sizeof(*l->events));
    if (l->epfd < 0 || l->tfd < 0 || !l->events ||
        loop_watch_add(l, &l->tfd_watch, l->tfd, EPOLLIN, on_timerfd, l) < 0) {
        int e = errno;
        loop_free(l);
        errno = e;
        return NULL;
    }
    loop_set_clock(l, NULL, NULL);
    return l;
}

void loop_free(struct loop *l)
{
    if (!l)
        return;
    bury(l);
    if (l->epfd >= 0)
        close(l->epfd);
    if (l->tfd >= 0)
        close(l->tfd);
    free(l->heap);
    free(l->graveyard);
    free(l->events);
    free(l);
}

void loop_set_idle(struct loop *l, void (*fn)(void *), void *arg)
{
    l->idle = fn;
    l->idle_arg = arg;
}

void loop_stop(struct loop *l)
{
    l->stopping = true;
}

int loop_turn(struct loop *l, int timeout_ms)
{
    rearm(l);
    l->nevents = epoll_wait(l->epfd, l->events, MAX_EVENTS, timeout_ms);
    if (l->nevents < 0) {
        l->nevents = 0;
        return errno == EINTR ? 0 : -errno;
    }
    loop_update_now(l);
    for (int i = 0; i < l->nevents; i++) {
        struct loop_watch *w = l->events[i].data.ptr;
        if (w) /* NULL: deleted by an earlier callback of this turn */
            w->fn(w, l->events[i].events);
    }
    l->nevents = 0;
    run_timers(l);
    bury(l);
    if (l->idle)
        l->idle(l->idle_arg);
    return 0;
}

int loop_run(struct loop *l)
{
    l->stopping = false;
    while (!l->stopping) {
        int rc = loop_turn(l, -1);
        if (rc < 0)
            return rc;
    }
    return 0;
}
