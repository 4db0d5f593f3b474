/* serve -- run the proxy: listeners, workers, the control loop, until a clean shutdown. */
#ifndef RETRYPROXY_PROXY_SERVE_H
#define RETRYPROXY_PROXY_SERVE_H

#include "config/cfg.h"

/* Command-line settings that override the config file. */
struct serve_opts {
    const char *config_path; /* the file 'cfg' came from: watched and reloaded */
    const char *listen;      /* NULL: the file's */
    const char *admin;
    unsigned workers;        /* 0: one per CPU the process may use (proxy/base/cpus.h) */
    const char *cgroup_root; /* NULL: /sys/fs/cgroup (tests name another) */
    int log_level;           /* -1: the file's (enum cfg_log_level otherwise) */
    int log_format;          /* -1: the file's (enum cfg_log_format otherwise) */
};

/* Serves 'cfg' until SIGTERM or SIGINT. Returns the process exit status: 0 after a clean
 * shutdown, 3 when a listener cannot be bound, 1 on other start-up failures. */
int serve_run(struct cfg *cfg, const struct serve_opts *o);

#endif
