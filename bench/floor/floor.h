/* floor -- what the floor programs share: options, the libmicrohttpd daemon in external epoll
 * mode, and one epoll loop that drives it.
 *
 * The floor programs (floor_mhd, floor_suspend, floor_proxy) measure the cost of the stack
 * retryproxy is built on, with none of its logic: see bench/README.md.
 */
#ifndef RETRYPROXY_BENCH_FLOOR_H
#define RETRYPROXY_BENCH_FLOOR_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>

struct floor_opts {
    uint16_t port;        /* --port N (default 8090) */
    const char *upstream; /* --upstream URL (floor_proxy only) */
    bool tuned;           /* --tuned (floor_proxy only) */
};

/* Parse argv into o; prints usage and exits 2 on a bad argument, 0 on --help. */
void floor_parse(int argc, char **argv, const char *usage, struct floor_opts *o);

/* Start the daemon on 127.0.0.1:port in external epoll mode with extra_flags added, and the
 * per-connection memory limit when mem_limit is not 0. Exits 3 on failure. */
struct MHD_Daemon *floor_start(uint16_t port, unsigned extra_flags, size_t mem_limit,
                               MHD_AccessHandlerCallback handler, void *handler_cls,
                               MHD_RequestCompletedCallback completed);

/* The loop's epoll descriptor (the daemon's own epoll descriptor is in it). */
int floor_epoll(void);
/* Add fd to the loop for events, with data.ptr = tag (not NULL). */
void floor_watch(int fd, uint32_t events, void *tag);

/* Called for every ready descriptor that is not the daemon's, with its tag and events. */
typedef void (*floor_event_fn)(void *tag, uint32_t events);
/* Called once per iteration before MHD_run: do what is due (resume connections...). */
typedef void (*floor_tick_fn)(void);

/* Serve until SIGINT or SIGTERM: epoll_wait with the daemon's timeout, other descriptors to
 * on_event, then on_tick, then MHD_run. Returns 0 after a signal. on_event and on_tick may
 * be NULL. */
int floor_loop(struct MHD_Daemon *d, floor_event_fn on_event, floor_tick_fn on_tick);
/* Work was queued for the next tick: the next epoll_wait does not wait. */
void floor_wake(void);

/* The first call of the access handler for a request: true once, after storing a marker in
 * *req_cls; the handler then returns MHD_YES and answers on a later call. */
bool floor_first_call(void **req_cls);
/* True when req_cls is still the marker floor_first_call stored. */
bool floor_marked(const void *req_cls);

#endif
