#include "proxy/worker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "proxy/server.h"

static void on_wake(struct loop_watch *lw, uint32_t events)
{
    (void)events;
    struct worker *w = lw->arg;
    uint64_t v;
    if (read(w->wake_fd, &v, sizeof(v)) < 0) {
        /* EAGAIN: a spurious wake-up; the flag below decides */
    }
    if (atomic_load(&w->stop)) {
        server_stop(w->srv);
        w->srv = NULL;
        loop_stop(w->loop);
    }
}

struct worker *worker_new(unsigned id, int listen_fd, unsigned conn_limit, struct cfg *cfg,
                          uint64_t seed)
{
    struct worker *w = calloc(1, sizeof(*w));
    if (!w) {
        close(listen_fd);
        return NULL;
    }
    w->id = id;
    w->listen_fd = listen_fd;
    w->conn_limit = conn_limit;
    w->wake_fd = -1;
    w->cfg = cfg_ref(cfg);
    rng_seed(&w->rng, seed);
    atomic_init(&w->stop, false);
    w->rr = calloc(cfg->n_routes, sizeof(*w->rr));
    w->loop = loop_new();
    w->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!w->rr || !w->loop || w->wake_fd < 0 ||
        loop_watch_add(w->loop, &w->wake_watch, w->wake_fd, EPOLLIN, on_wake, w) < 0)
        goto fail;
    w->up = upstream_new(w->loop);
    if (!w->up)
        goto fail;
    w->srv = server_start(w, listen_fd, cfg);
    if (!w->srv)
        goto fail;
    w->listen_fd = -1; /* libmicrohttpd owns it now and closes it when stopped */
    return w;
fail:
    fprintf(stderr, "retryproxy: worker %u: cannot start: %s\n", id, strerror(errno));
    worker_free(w);
    return NULL;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    if (loop_run(w->loop) < 0)
        fprintf(stderr, "retryproxy: worker %u: event loop failed: %s\n", w->id, strerror(errno));
    return NULL;
}

int worker_start(struct worker *w)
{
    int e = pthread_create(&w->thread, NULL, worker_main, w);
    return e ? -e : 0;
}

void worker_stop(struct worker *w)
{
    uint64_t one = 1;
    atomic_store(&w->stop, true);
    if (write(w->wake_fd, &one, sizeof(one)) < 0) {
        /* the counter cannot overflow with one write per stop */
    }
    pthread_join(w->thread, NULL);
}

void worker_free(struct worker *w)
{
    if (!w)
        return;
    server_stop(w->srv); /* completes the requests still alive, cancelling their transfers */
    upstream_free(w->up);
    if (w->wake_fd >= 0)
        close(w->wake_fd);
    if (w->listen_fd >= 0)
        close(w->listen_fd);
    loop_free(w->loop);
    free(w->rr);
    cfg_unref(w->cfg);
    free(w);
}
