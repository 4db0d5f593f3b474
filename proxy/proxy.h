/* proxy -- what the whole process shares: the snapshot being served, the metrics registry,
 * and whether it is draining. Created by serve.c, read by every worker. */
#ifndef RETRYPROXY_PROXY_PROXY_H
#define RETRYPROXY_PROXY_PROXY_H

#include <stdatomic.h>
#include <stdbool.h>

#include "proxy/metrics.h"
#include "proxy/runtime.h"

struct proxy {
    struct rt_cell cell;
    struct metrics *metrics;
    atomic_bool draining;
    unsigned n_workers;
};

#endif
