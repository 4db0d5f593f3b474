/* procstat -- the process's own figures as Prometheus' process_* series have them, read from
 * /proc/self at scrape time (Linux only, as the rest of the proxy). */
#ifndef RETRYPROXY_PROXY_PROCSTAT_H
#define RETRYPROXY_PROXY_PROCSTAT_H

#include <stdbool.h>
#include <stdint.h>

struct procstat {
    bool ok;                   /* /proc/self/stat was read: the other fields are set */
    double cpu_seconds;        /* user and system time */
    double start_time_seconds; /* Unix time the process started */
    uint64_t resident_bytes;
    int64_t open_fds; /* -1: unknown */
    int64_t max_fds;  /* the soft RLIMIT_NOFILE, -1 for none */
};

/* Fills 'p'; p->ok false when /proc cannot be read (the figures are then left out). */
void procstat_read(struct procstat *p);

#endif
