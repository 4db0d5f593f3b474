/* loop -- one epoll event loop per thread: fd watches, timers, a cached clock.
 *
 * Everything a worker does is driven from here: client sockets (through libmicrohttpd's epoll
 * fd), upstream sockets (curl's multi-socket API), timers (curl's, MHD's, per-try timeouts,
 * deadlines and every backoff wait), and wake-ups from other threads. Nothing blocks and
 * nothing sleeps: a request waiting out a backoff delay is one timer in a binary heap.
 *
 * "now" is read once per loop turn (CLOCK_MONOTONIC, milliseconds), so every decision made in
 * one turn sees the same time. A test may put a clock of its own in its place and drive the
 * loop turn by turn: every timer then fires at exactly the time it was set for, whatever the
 * machine's speed. A loop and its watches and timers belong to one thread.
 */
#ifndef RETRYPROXY_PROXY_LOOP_H
#define RETRYPROXY_PROXY_LOOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct loop;

struct loop_watch;
typedef void (*loop_fd_fn)(struct loop_watch *w, uint32_t events);

/* Embedded in its owner; the callback finds the owner with container_of-style arithmetic or
 * through 'arg'. */
struct loop_watch {
    int fd;
    uint32_t events;
    loop_fd_fn fn;
    void *arg;
};

struct loop_timer;
typedef void (*loop_timer_fn)(struct loop_timer *t);

struct loop_timer {
    uint64_t when_ms;
    size_t slot; /* position in the heap + 1; 0 when not armed */
    loop_timer_fn fn;
    void *arg;
};

/* A new loop, or NULL with errno set. */
struct loop *loop_new(void);
/* Frees the loop (not the owners of its watches and timers). Accepts NULL. */
void loop_free(struct loop *l);

/* Starts watching 'fd' for 'events' (EPOLLIN, EPOLLOUT...). 0 or -errno (w->fd is then -1). A
 * watch that was never added has fd -1 (set it so before any failure can reach its delete). */
int loop_watch_add(struct loop *l, struct loop_watch *w, int fd, uint32_t events, loop_fd_fn fn,
                   void *arg);
/* Changes the events of a watch. 0 or -errno. */
int loop_watch_mod(struct loop *l, struct loop_watch *w, uint32_t events);
/* Stops watching (the fd stays open; the caller closes it); nothing for fd -1. Events already
 * collected in this turn for the watch are dropped, so the owner may free it once the current turn
 * ends: see loop_defer_free(). */
void loop_watch_del(struct loop *l, struct loop_watch *w);

/* Forgets a watch whose fd was closed already (by a library that did not say so): the kernel
 * dropped it from epoll with its file, and the number may name another file by now, which must
 * not be touched. Events already collected for it in this turn are dropped. */
void loop_watch_forget(struct loop *l, struct loop_watch *w);

/* Frees 'p' with free() at the end of the current loop turn, after every event of the turn
 * has been dispatched. */
void loop_defer_free(struct loop *l, void *p);

/* Arms (or re-arms) 't' to fire at 'when_ms' (loop clock). */
void loop_timer_start(struct loop *l, struct loop_timer *t, uint64_t when_ms, loop_timer_fn fn,
                      void *arg);
/* Disarms 't' if armed. */
void loop_timer_stop(struct loop *l, struct loop_timer *t);
static inline bool loop_timer_armed(const struct loop_timer *t)
{
    return t->slot != 0;
}

/* The cached monotonic clock, in milliseconds. */
uint64_t loop_now(const struct loop *l);
/* Re-reads the clock (for work that spans a long callback). */
uint64_t loop_update_now(struct loop *l);

/* The clock read now, in microseconds, for the durations that are reported (logs, histograms):
 * the cached milliseconds would make a 3.6 ms request 3 ms and a loopback attempt 0. Timers keep
 * to loop_now(). One vDSO call; with a test's clock (loop_set_clock), its milliseconds * 1000. */
uint64_t loop_clock_us(const struct loop *l);

/* Reads the time from clock(arg), in milliseconds, from now on (NULL: CLOCK_MONOTONIC again).
 * For tests: the timerfd still follows the real clock, so drive a loop with a clock of its
 * own by loop_turn(l, 0) after moving the clock. */
void loop_set_clock(struct loop *l, uint64_t (*clock)(void *arg), void *arg);

/* Calls fn(arg) once per turn, after the turn's events and timers, before waiting again
 * (batching work, such as writing buffered log lines). */
void loop_set_idle(struct loop *l, void (*fn)(void *), void *arg);

/* One turn: waits up to 'timeout_ms' (-1: until something happens, 0: not at all) for events,
 * reads the clock, runs the events, then every timer due, then the idle callback. 0, or
 * -errno if epoll failed. */
int loop_turn(struct loop *l, int timeout_ms);

/* Runs turns until loop_stop(). Returns 0, or -errno if epoll failed. */
int loop_run(struct loop *l);
/* Makes loop_run() return after the current turn. From the loop's own thread only. */
void loop_stop(struct loop *l);

/* Timers armed right now (for tests and metrics). */
size_t loop_timer_count(const struct loop *l);

#endif
