/* worker -- one thread, one event loop: its own listener (SO_REUSEPORT), libmicrohttpd
 * daemon, curl multi handle, RNG and log buffer. Workers share nothing on the hot path.
 */
#ifndef RETRYPROXY_PROXY_WORKER_H
#define RETRYPROXY_PROXY_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "policy/rng.h"
#include "proxy/log.h"
#include "proxy/loop.h"
#include "proxy/proxy.h"
#include "proxy/runtime.h"
#include "proxy/upstream.h"

struct server;

struct worker {
    unsigned id;
    struct loop *loop;
    struct upstream *up;
    struct server *srv;
    struct rng rng;
    struct proxy *px;
    struct rt *rt; /* the snapshot new requests start with (one reference held) */
    uint32_t *rr;  /* round-robin position per route of 'rt' */
    struct log_buf *log;
    int listen_fd;
    unsigned conn_limit; /* this worker's share of limits.max_connections */
    int wake_fd;         /* eventfd: another thread has news (a snapshot, a stop) */
    struct loop_watch wake_watch;
    atomic_bool stop;
    pthread_t thread;
    size_t requests; /* requests alive in this worker */
};

/* A worker serving 'listen_fd' (which it owns from now on) with the snapshot current in
 * px->cell. NULL with a message on stderr on failure. */
struct worker *worker_new(unsigned id, int listen_fd, unsigned conn_limit, struct proxy *px,
                          uint64_t seed);

/* Starts the worker's thread. 0 or -errno. */
int worker_start(struct worker *w);

/* Wakes the worker to pick up a newly published snapshot (from any thread). */
void worker_wake(struct worker *w);

/* Asks the worker to stop (from any thread) and waits for its thread to end. */
void worker_stop(struct worker *w);

/* Frees a stopped (or never started) worker. Accepts NULL. */
void worker_free(struct worker *w);

#endif
