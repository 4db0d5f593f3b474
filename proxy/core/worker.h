/* worker -- one thread, one event loop: its own listener (SO_REUSEPORT), libmicrohttpd
 * daemon, upstream side (each transport's engine, which it makes and frees:
 * proxy/upstream/attempt.h), RNG and log buffer. Workers share nothing on the hot path.
 */
#ifndef RETRYPROXY_PROXY_WORKER_H
#define RETRYPROXY_PROXY_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "policy/rng.h"
#include "proxy/telemetry/log.h"
#include "proxy/base/loop.h"
#include "proxy/core/proxy.h"
#include "proxy/core/runtime.h"
#include "proxy/upstream/attempt.h"

struct store_cq; /* proxy/store/store.h */

struct worker;
struct retry_req;
struct tunnel;

/* What serves the worker's clients (proxy/http1/server.c), plugged in when the worker is made: the
 * worker's loop drives it knowing nothing of it. Each is called from the worker's thread. */
struct worker_service {
    void *arg;
    void (*quiesce)(void *arg); /* stop accepting connections (draining) */
    void (*expire)(void *arg);  /* the drain deadline passed: answer what still waits */
    void (*stop)(void *arg);    /* close every connection and free the service */
};

/* Starts the service of 'w' on 'listen_fd' (which it owns from then on, closed on failure
 * too), setting w->service and w->kick. 0, or -1 with a message on stderr. */
typedef int (*worker_serve_fn)(struct worker *w, int listen_fd);

struct worker {
    unsigned id;
    struct loop *loop;
    struct attempt_side up; /* its upstream side: each transport's engine, made and freed here */
    struct worker_service service;
    void (*kick)(void *); /* has the service run this turn (set with it) */
    void *kick_arg;
    struct rng rng;
    struct proxy *px;
    struct rt *rt; /* the snapshot new requests start with (one reference held) */
    uint32_t *rr;  /* round-robin position per route of 'rt' */
    struct log_buf *log;
    unsigned conn_limit; /* this worker's share of limits.max_connections */
    int wake_fd;         /* eventfd: another thread has news (a snapshot, a stop) */
    struct loop_watch wake_watch;
    atomic_bool stop;
    atomic_bool drain;  /* stop accepting */
    atomic_bool expire; /* the drain deadline passed: answer what still waits */
    bool quiesced, expired;
    pthread_t thread;
    struct retry_req *reqs; /* requests alive in this worker */
    struct tunnel *tunnels; /* upgraded connections open in this worker (proxy/http1/tunnel.h) */
    uint64_t body_freed;    /* replay-buffer bytes freed since the memory was last trimmed */
    atomic_size_t requests; /* how many (written by the worker, read while draining) */
    /* With a delivery store (px->store): where this worker's store calls complete, watched by
     * its loop (a durable accept waits on it as on a backoff timer: the loop never blocks). */
    struct store_cq *cq;
    struct loop_watch cq_watch;
};

/* A worker serving 'listen_fd' (which it owns from now on) through 'serve', with the snapshot
 * current in px->cell. NULL with a message on stderr on failure. */
struct worker *worker_new(unsigned id, int listen_fd, unsigned conn_limit, struct proxy *px,
                          uint64_t seed, worker_serve_fn serve);

/* Starts the worker's thread. 0 or -errno. */
int worker_start(struct worker *w);

/* Wakes the worker to pick up a newly published snapshot (from any thread). */
void worker_wake(struct worker *w);

/* Takes the snapshot published in the cell if it is newer than ours (one atomic load when it
 * is not): on the wake-up that follows a reload, and as each request starts, so that a request
 * arriving after a reload was published never runs on the config before it, whatever order the
 * loop sees the two in. Requests in flight keep the one they started with; the round-robin
 * positions start over for the new routes. */
void worker_refresh(struct worker *w);

/* What the worker holds beyond its client connections: requests alive and upstream transfers
 * running (proxy/http1/server.c's memory trim watches it fall after a burst). */
size_t worker_load(const struct worker *w);
/* A burst is over: the upstream side frees what it kept for it (idle transfer handles). */
void worker_trim(struct worker *w);

/* Draining (from any thread): stop accepting connections; with 'expire', also answer every
 * request still waiting on the upstream side now. */
void worker_drain(struct worker *w, bool expire);

/* Asks the worker to stop (from any thread) and waits for its thread to end. */
void worker_stop(struct worker *w);

/* After the store was closed (every call handed to it completed): runs what completed on the
 * worker's queue since its loop stopped, so that what those calls hold is let go. */
void worker_store_closed(struct worker *w);

/* Frees a stopped (or never started) worker. Accepts NULL. */
void worker_free(struct worker *w);

#endif
