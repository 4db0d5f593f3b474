#include "proxy/core/worker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "proxy/core/balance.h"
#include "proxy/store/store.h"
/* the transports' engines, which the worker makes and frees (the request path reaches them
 * through proxy/upstream/attempt.h only) */
#include "proxy/upstream/connect.h"
#include "proxy/upstream/curlm.h"
#include "proxy/upstream/h2up.h"
#include "proxy/upstream/slots.h"

/* This worker's share of limits.max_upstream_requests, and how it is shared out. */
static void set_upstream_cap(struct worker *w)
{
    unsigned n = w->px->n_workers ? w->px->n_workers : 1;
    if (w->up.slots && w->rt) {
        const struct cfg *cfg = w->rt->cfg;
        struct slots *s = w->up.slots;
        slots_set_shares(s, cfg->upstream_share_percent, cfg->connection_share_percent);
        slots_set_cap(s, (cfg->max_upstream_requests + n - 1) / n);
    }
}

void worker_refresh(struct worker *w)
{
    if (w->rt && rt_cell_generation(&w->px->cell) == w->rt->generation)
        return;
    struct rt *rt = rt_cell_get(&w->px->cell);
    if (!rt)
        return;
    uint32_t *rr = calloc(rt->cfg->n_routes, sizeof(*rr));
    if (!rr) {
        rt_unref(rt); /* keep serving the old one; the next wake tries again */
        return;
    }
    free(w->rr);
    w->rr = rr;
    rt_unref(w->rt);
    w->rt = rt;
    set_upstream_cap(w);
}

static void stop_service(struct worker *w)
{
    if (w->service.stop)
        w->service.stop(w->service.arg); /* completes the requests still alive */
    w->service = (struct worker_service){ 0 };
}

static void on_wake(struct loop_watch *lw, uint32_t events)
{
    (void)events;
    struct worker *w = lw->arg;
    uint64_t v;
    if (read(w->wake_fd, &v, sizeof(v)) < 0) {
        /* EAGAIN: a spurious wake-up; the checks below decide */
    }
    if (atomic_load(&w->stop)) {
        stop_service(w);
        loop_stop(w->loop);
        return;
    }
    if (atomic_load(&w->drain) && !w->quiesced) {
        w->quiesced = true;
        w->service.quiesce(w->service.arg);
    }
    if (atomic_load(&w->expire) && !w->expired) {
        w->expired = true;
        w->service.expire(w->service.arg);
    }
    worker_refresh(w);
    /* a name's addresses may have changed (the resolver wakes every worker): endpoints that
     * left close their idle connections without waiting for a request */
    if (w->rt) {
        struct bal_worker bw = { w->id, &w->rng, &w->up };
        for (size_t i = 0; i < w->rt->cfg->n_routes; i++)
            balance_sync(&bw, w->rt->routes[i].bal);
    }
}

static void on_store(struct loop_watch *lw, uint32_t events)
{
    (void)events;
    struct worker *w = lw->arg;
    store_cq_drain(w->cq);
}

/* Once per loop turn, before waiting: what the turn logged goes out in one write. */
static void on_idle(void *arg)
{
    struct worker *w = arg;
    log_flush(w->log);
}

struct worker *worker_new(unsigned id, int listen_fd, unsigned conn_limit, struct proxy *px,
                          uint64_t seed, worker_serve_fn serve)
{
    struct worker *w = calloc(1, sizeof(*w));
    if (!w)
        goto fail;
    *w = (struct worker){ .id = id, .px = px, .conn_limit = conn_limit, .wake_fd = -1 };
    rng_seed(&w->rng, seed);
    atomic_init(&w->stop, false);
    atomic_init(&w->drain, false);
    atomic_init(&w->expire, false);
    atomic_init(&w->requests, 0);
    worker_refresh(w);
    w->log = log_buf_new();
    w->loop = loop_new();
    w->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!w->rt || !w->log || !w->loop || w->wake_fd < 0 ||
        loop_watch_add(w->loop, &w->wake_watch, w->wake_fd, EPOLLIN, on_wake, w) < 0)
        goto fail;
    loop_set_idle(w->loop, on_idle, w);
    if (px->store &&
        (!(w->cq = store_cq_new()) ||
         loop_watch_add(w->loop, &w->cq_watch, store_cq_fd(w->cq), EPOLLIN, on_store, w) < 0))
        goto fail;
    /* the upstream side: the slots every transport holds, then each transport's engine */
    if (!(w->up.slots = slots_new(w->loop)) || !(w->up.curl = curlm_new(w->loop, w->up.slots)) ||
        !(w->up.conn = connect_side_new(w->loop)) ||
        !(w->up.h2 = h2up_new(w->up.conn, metrics_h2up_counts(w->px->metrics, w->id))))
        goto fail;
    slots_count_waits(w->up.slots, metrics_upstream_waiting(w->px->metrics, w->id));
    set_upstream_cap(w);
    int served = serve(w, listen_fd);
    listen_fd = -1; /* the service's, started or not */
    if (served < 0)
        goto fail;
    return w;
fail:;
    int e = errno;
    if (listen_fd >= 0)
        close(listen_fd);
    fprintf(stderr, "retryproxy: worker %u: cannot start: %s\n", id, strerror(e));
    worker_free(w);
    return NULL;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    if (loop_run(w->loop) < 0)
        fprintf(stderr, "retryproxy: worker %u: event loop failed: %s\n", w->id, strerror(errno));
    log_flush(w->log);
    return NULL;
}

int worker_start(struct worker *w)
{
    int e = pthread_create(&w->thread, NULL, worker_main, w);
    return e ? -e : 0;
}

void worker_wake(struct worker *w)
{
    uint64_t one = 1;
    if (write(w->wake_fd, &one, sizeof(one)) < 0) {
        /* a full counter already means "wake up" */
    }
}

size_t worker_load(const struct worker *w)
{
    return atomic_load_explicit(&w->requests, memory_order_relaxed) + curlm_active(w->up.curl);
}

void worker_trim(struct worker *w)
{
    slots_trim(w->up.slots); /* the shares of endpoints nothing uses go */
    curlm_trim(w->up.curl);
    h2up_trim(w->up.h2);
}

void worker_drain(struct worker *w, bool expire)
{
    atomic_store(&w->drain, true);
    if (expire)
        atomic_store(&w->expire, true);
    worker_wake(w);
}

void worker_stop(struct worker *w)
{
    atomic_store(&w->stop, true);
    worker_wake(w);
    pthread_join(w->thread, NULL);
}

void worker_store_closed(struct worker *w)
{
    if (w && w->cq)
        store_cq_drain(w->cq);
}

void worker_free(struct worker *w)
{
    if (!w)
        return;
    stop_service(w);     /* completes the requests still alive, cancelling their transfers */
    h2up_free(w->up.h2); /* its connections, before the TLS contexts they use */
    connect_side_free(w->up.conn);
    curlm_free(w->up.curl);
    slots_free(w->up.slots); /* nothing holds or waits for a slot now */
    loop_free(w->loop);
    store_cq_free(w->cq); /* after the loop that watched it */
    if (w->wake_fd >= 0)
        close(w->wake_fd); /* after the loop that watched it */
    log_buf_free(w->log);
    free(w->rr);
    rt_unref(w->rt);
    free(w);
}
