#include "proxy/serve.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "proxy/listen.h"
#include "proxy/worker.h"

#define EXIT_STARTUP 1
#define EXIT_BIND    3
#define MAX_WORKERS  256

/* Thousands of client and upstream connections need more descriptors than the usual 1024. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static uint64_t random_seed(void)
{
    uint64_t s;
    if (getrandom(&s, sizeof(s), 0) != (ssize_t)sizeof(s))
        s = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    return s;
}

int serve_run(struct cfg *cfg, const struct serve_opts *o)
{
    struct worker *workers[MAX_WORKERS] = { 0 };
    int fds[MAX_WORKERS];
    char bound[300], why[512];
    int rc = EXIT_STARTUP;
    unsigned n = o->workers;
    if (n == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n = cores > 0 ? (unsigned)cores : 1;
    }
    if (n > MAX_WORKERS)
        n = MAX_WORKERS;
    const char *addr = o->listen ? o->listen : cfg->listen;

    /* Signals are taken synchronously by this thread; workers never see them. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit();

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fputs("retryproxy: cannot initialise libcurl\n", stderr);
        return EXIT_STARTUP;
    }
    if (listen_open(addr, n, fds, bound, sizeof(bound), why, sizeof(why)) < 0) {
        fprintf(stderr, "retryproxy: %s\n", why);
        rc = EXIT_BIND;
        goto out;
    }
    unsigned per_worker = (cfg->max_connections + n - 1) / n;
    for (unsigned i = 0; i < n; i++) {
        workers[i] = worker_new(i, fds[i], per_worker, cfg, random_seed());
        if (!workers[i]) {
            for (unsigned k = i + 1; k < n; k++)
                close(fds[k]);
            goto out;
        }
    }
    for (unsigned i = 0; i < n; i++) {
        if (worker_start(workers[i]) < 0) {
            fprintf(stderr, "retryproxy: cannot start worker thread %u\n", i);
            for (unsigned k = 0; k < i; k++)
                worker_stop(workers[k]);
            for (unsigned k = 0; k < n; k++) {
                worker_free(workers[k]);
                workers[k] = NULL;
            }
            goto out;
        }
    }
    fprintf(stderr, "retryproxy: listening on %s (%u worker%s)\n", bound, n, n == 1 ? "" : "s");

    for (;;) {
        siginfo_t si;
        int sig = sigwaitinfo(&set, &si);
        if (sig == SIGTERM || sig == SIGINT)
            break;
        /* SIGHUP: reloading arrives with the config watcher; until then it is ignored. */
    }
    for (unsigned i = 0; i < n; i++)
        worker_stop(workers[i]);
    rc = 0;
out:
    for (unsigned i = 0; i < n; i++)
        worker_free(workers[i]);
    curl_global_cleanup();
    return rc;
}
