#include "proxy/serve.h"

#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "proxy/base/cpus.h"
#include "proxy/dns/resolve.h"
#include "proxy/ops/admin.h"
#include "proxy/ops/deliveries.h"
#include "proxy/listen.h"
#include "proxy/telemetry/log.h"
#include "proxy/base/loop.h"
#include "proxy/telemetry/metrics.h"
#include "proxy/core/proxy.h"
#include "proxy/ops/reload.h"
#include "proxy/http1/server.h"
#include "proxy/http1/wiretab.h"
#include "proxy/core/worker.h"
#include "proxy/delivery/courier.h"
#include "proxy/store/store.h"

#define EXIT_STARTUP 1
#define EXIT_BIND    3
#define MAX_WORKERS  256

/* How often the control loop looks at what is still running while draining, and how long the
 * answers given at the drain deadline get to reach their clients. */
#define DRAIN_CHECK_MS 20
#define DRAIN_GRACE_MS 1000

/* The main thread: signals, the config watch, the admin listener, shutdown. */
struct control {
    struct loop *loop;
    struct reload *rl;
    struct proxy *px;
    struct worker **workers;
    unsigned n;
    int sfd;
    struct loop_watch sig_watch;
    struct loop_timer drain_timer;
    uint64_t deadline_ms, grace_ms; /* 0 until draining / until expired */
};

/* Thousands of client and upstream connections need more descriptors than the usual 1024. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* The framing check's table has a slot per descriptor, up to a million (a client socket
 * beyond it is closed unread, see server.c). */
#define WIRETAB_MAX (1u << 20)

static int init_wiretab(void)
{
    struct rlimit rl;
    size_t n = WIRETAB_MAX;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < n)
        n = (size_t)rl.rlim_cur;
    return wiretab_init(n);
}

/* The store's commits, into the store_commit_seconds histogram (from the store's thread). */
static void store_commit(void *arg, double seconds)
{
    metrics_store_commit(arg, seconds);
}

static uint64_t random_seed(void)
{
    uint64_t s;
    if (getrandom(&s, sizeof(s), 0) != (ssize_t)sizeof(s))
        s = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    return s;
}

static size_t requests_alive(const struct control *ctl)
{
    size_t n = 0;
    for (unsigned i = 0; i < ctl->n; i++)
        n += atomic_load_explicit(&ctl->workers[i]->requests, memory_order_relaxed);
    return n;
}

/* Draining: done when no request is left; at the deadline the workers answer what still
 * waits, then have a moment to send those answers. */
static void on_drain_check(struct loop_timer *t)
{
    struct control *ctl = t->arg;
    uint64_t now = loop_now(ctl->loop);
    if (requests_alive(ctl) == 0 || (ctl->grace_ms && now >= ctl->grace_ms)) {
        loop_stop(ctl->loop);
        return;
    }
    if (!ctl->grace_ms && now >= ctl->deadline_ms) {
        log_event(CFG_LOG_WARN, "drain timeout: answering the requests still waiting",
                  LOG_NUM("requests", requests_alive(ctl)), NULL);
        for (unsigned i = 0; i < ctl->n; i++)
            worker_drain(ctl->workers[i], true);
        ctl->grace_ms = now + DRAIN_GRACE_MS;
    }
    loop_timer_start(ctl->loop, &ctl->drain_timer, now + DRAIN_CHECK_MS, on_drain_check, ctl);
}

/* SIGTERM or SIGINT: /readyz turns 503, the listeners stop accepting, requests in flight
 * (backoff waits included) get until drain_timeout_ms to finish. */
static void start_draining(struct control *ctl, const char *signame)
{
    uint64_t now = loop_now(ctl->loop);
    struct rt *rt = rt_cell_get(&ctl->px->cell);
    uint32_t drain_ms = rt ? rt->cfg->drain_timeout_ms : 0;
    rt_unref(rt);
    ctl->deadline_ms = now + drain_ms;
    atomic_store(&ctl->px->draining, true);
    metrics_set_draining(ctl->px->metrics); /* the admin listener keeps answering /metrics */
    atomic_store(&ctl->px->drain_deadline_ms, ctl->deadline_ms ? ctl->deadline_ms : 1);
    log_event(CFG_LOG_INFO, "draining", "signal", signame, LOG_NUM("drain_timeout_ms", drain_ms),
              NULL);
    for (unsigned i = 0; i < ctl->n; i++)
        worker_drain(ctl->workers[i], false);
    loop_timer_start(ctl->loop, &ctl->drain_timer, now, on_drain_check, ctl);
}

static void on_signal(struct loop_watch *w, uint32_t events)
{
    (void)events;
    struct control *ctl = w->arg;
    struct signalfd_siginfo si;
    while (read(ctl->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGHUP) {
            log_event(CFG_LOG_INFO, "SIGHUP: reloading the config", NULL);
            reload_force(ctl->rl, NULL, NULL);
        } else {
            const char *name = si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT";
            if (atomic_load(&ctl->px->draining)) {
                /* a second signal: the operator wants out now */
                log_event(CFG_LOG_WARN, "second signal: exiting at once", "signal", name, NULL);
                _exit(128 + (int)si.ssi_signo);
            }
            start_draining(ctl, name);
        }
    }
}

/* A name's addresses changed: every worker looks at its endpoints again, even with no request
 * coming. */
static void on_dns_change(void *arg)
{
    struct control *ctl = arg;
    for (unsigned i = 0; i < ctl->n; i++)
        worker_wake(ctl->workers[i]);
}

/* Opens the delivery store (docs/delivery.md): the SQLite file of store.path, the process's own
 * (an flock on PATH.lock: what a process before left in flight is due at once), or the shared
 * PostgreSQL store of store.postgres (its schema created or migrated; a newer one refuses the
 * start). 0, or -1 with a line on stderr. No store: 0 and none. */
static int open_store(const struct cfg *cfg, struct metrics *m, struct store **out)
{
    *out = NULL;
    const struct cfg_store *cs = &cfg->store;
    if (!cs->path && !cs->postgres.url)
        return 0;
    char why[512];
    if (deliveries_open(cfg, true, store_commit, m, out, why, sizeof(why)) < 0) {
        fprintf(stderr, "retryproxy: store: %s\n", why);
        return -1;
    }
    struct store_stats st;
    store_stats(*out, &st);
    if (cs->postgres.url) {
        log_event(CFG_LOG_INFO, "shared delivery store open", "namespace", cs->postgres.ns,
                  LOG_NUM("kept", st.count), NULL);
        return 0;
    }
    if (store_on_tmpfs(cs->path))
        log_event(CFG_LOG_WARN, "delivery store on tmpfs: lost at reboot, or with its pod", "path",
                  cs->path, NULL);
    log_event(CFG_LOG_INFO, "delivery store open", "path", cs->path, LOG_NUM("kept", st.count),
              LOG_NUM("resumed_in_flight", st.recovered), NULL);
    return 0;
}

/* Binds the admin listener; on failure says why on stderr. */
static int open_admin(const char *addr, int *fd, char *bound, size_t cap)
{
    char why[512];
    if (listen_open(addr, 1, fd, bound, cap, why, sizeof(why)) < 0) {
        fprintf(stderr, "retryproxy: admin: %s\n", why);
        return -1;
    }
    return 0;
}

int serve_run(struct cfg *cfg, const struct serve_opts *o)
{
    struct worker *workers[MAX_WORKERS] = { 0 };
    int fds[MAX_WORKERS], admin_fd = -1;
    char bound[300], admin_bound[300], why[512];
    int rc = EXIT_STARTUP;
    struct proxy px = { 0 };
    struct control ctl = { .sfd = -1 };
    struct admin *admin = NULL;
    struct courier *courier = NULL;
    unsigned n = o->workers, started = 0;
    /* by default one per CPU the process may use: its container's quota included */
    struct cpus cpus = { .n = n };
    snprintf(cpus.source, sizeof(cpus.source), "--workers");
    if (n == 0) {
        cpus_detect(o->cgroup_root, &cpus);
        n = cpus.n;
    }
    if (n > MAX_WORKERS)
        n = MAX_WORKERS;
    const char *addr = o->listen ? o->listen : cfg->listen;
    const char *admin_addr = o->admin ? o->admin : cfg->admin;

    /* Signals are taken synchronously by this thread (signalfd); workers never see them. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit();
    /* Replay buffers above 256 KiB are mapped and unmapped whole, so they never stay behind
     * in the heap (a fixed threshold: glibc would otherwise raise it after the first free). */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    if (init_wiretab() < 0) {
        fputs("retryproxy: out of memory\n", stderr);
        return EXIT_STARTUP;
    }

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fputs("retryproxy: cannot initialise libcurl\n", stderr);
        return EXIT_STARTUP;
    }
    rt_cell_init(&px.cell);
    atomic_init(&px.draining, false);
    px.n_workers = n;
    px.head_max = cfg->max_header_bytes;
    px.metrics = metrics_new(n);
    px.live = live_new();
    metrics_set_upstreams(px.metrics, live_upstream_rows, px.live);
    metrics_set_body_bytes(px.metrics, &px.body_bytes);
    budget_init(&px.budget, cfg->budget.window_ms);
    atomic_init(&px.drain_deadline_ms, 0);
    /* Before the first snapshot, whose names it resolves at once (no loop turns yet). */
    px.dns = dns_new(&cfg->resolver);
    if (px.dns)
        dns_set_metrics(px.dns, px.metrics);
    struct reload_pins pins = { .listen = o->listen,
                                .admin = o->admin,
                                .log_level = o->log_level,
                                .log_format = o->log_format };
    ctl.rl = px.metrics && px.live && px.dns ? reload_new(&px, o->config_path, cfg, &pins) : NULL;
    ctl.loop = loop_new();
    ctl.sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (!ctl.rl || !ctl.loop || ctl.sfd < 0 || dns_attach(px.dns, ctl.loop) < 0) {
        fprintf(stderr, "retryproxy: cannot start: %s\n", strerror(errno));
        goto out;
    }

    if (listen_open(addr, n, fds, bound, sizeof(bound), why, sizeof(why)) < 0) {
        fprintf(stderr, "retryproxy: %s\n", why);
        rc = EXIT_BIND;
        goto out;
    }
    if (open_admin(admin_addr, &admin_fd, admin_bound, sizeof(admin_bound)) < 0) {
        for (unsigned k = 0; k < n; k++)
            close(fds[k]);
        rc = EXIT_BIND;
        goto out;
    }
    if (open_store(cfg, px.metrics, &px.store) < 0) {
        for (unsigned k = 0; k < n; k++)
            close(fds[k]);
        close(admin_fd);
        goto out;
    }
    unsigned per_worker = (cfg->max_connections + n - 1) / n;
    for (unsigned i = 0; i < n; i++) {
        workers[i] = worker_new(i, fds[i], per_worker, &px, random_seed(), server_serve);
        if (!workers[i]) {
            for (unsigned k = i + 1; k < n; k++)
                close(fds[k]);
            close(admin_fd);
            goto out;
        }
    }
    if (px.store) {
        /* in worker 0's loop, armed before its thread starts */
        if (!(courier = courier_new(workers[0])))
            goto out;
        px.accepted_arg = courier;
        px.accepted = courier_kick;
    }
    reload_set_workers(ctl.rl, workers, n);
    ctl.px = &px;
    ctl.workers = workers;
    ctl.n = n;
    dns_on_change(px.dns, on_dns_change, &ctl);
    admin = admin_start(ctl.loop, admin_fd, &px, ctl.rl, px.store);
    if (!admin || loop_watch_add(ctl.loop, &ctl.sig_watch, ctl.sfd, EPOLLIN, on_signal, &ctl) < 0)
        goto out;
    reload_attach(ctl.rl, ctl.loop);
    reload_set_bound(ctl.rl, bound, admin_bound);
    for (; started < n; started++) {
        if (worker_start(workers[started]) < 0) {
            fprintf(stderr, "retryproxy: cannot start worker thread %u\n", started);
            goto out;
        }
    }
    fprintf(stderr, "retryproxy: listening on %s (%u worker%s: %s), admin on %s\n", bound, n,
            n == 1 ? "" : "s", cpus.source, admin_bound);
    log_event(CFG_LOG_INFO, "listening", "listen", bound, "admin", admin_bound, "source",
              o->config_path, LOG_NUM("workers", n), "workers_from", cpus.source, NULL);

    if (loop_run(ctl.loop) < 0)
        fprintf(stderr, "retryproxy: control loop failed: %s\n", strerror(errno));
    loop_timer_stop(ctl.loop, &ctl.drain_timer);
    log_event(CFG_LOG_INFO, "stopped", NULL);
    rc = 0;
out:
    for (unsigned i = 0; i < started; i++)
        worker_stop(workers[i]);
    admin_stop(admin);
    /* the store last: its deliveries' attempts end first (their leases given back), then every call
     * handed to it completes, and what those calls held is let go */
    courier_stop(courier);
    store_close(px.store);
    for (unsigned i = 0; i < n; i++)
        worker_store_closed(workers[i]);
    courier_free(courier);
    for (unsigned i = 0; i < n; i++)
        worker_free(workers[i]);
    reload_free(ctl.rl);
    if (ctl.sfd >= 0)
        close(ctl.sfd);
    rt_cell_destroy(&px.cell); /* the last names' references, before their resolver goes */
    dns_free(px.dns);
    loop_free(ctl.loop);
    metrics_free(px.metrics);
    live_free(px.live);
    curl_global_cleanup();
    wiretab_free();
    return rc;
}
