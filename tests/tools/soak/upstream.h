/* The soak load's upstream (tests/tools/soak.c): one epoll thread on 127.0.0.1 answering each
 * request as its X-Soak header says, constant memory per connection and no record of what it
 * served (unlike tests/support/tup), so that it can run for hours.
 */
#ifndef RETRYPROXY_TESTS_TOOLS_SOAK_UPSTREAM_H
#define RETRYPROXY_TESTS_TOOLS_SOAK_UPSTREAM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum kind { K_OK, K_POST, K_503, K_RESET, K_SLOW, K_BACKOFF, K_COUNT };

extern const char *const kind_name[K_COUNT];

struct upstream {
    int lfd, ep;
    uint16_t port;
    pthread_t th;
    atomic_bool stop;
    atomic_bool drain; /* close every idle connection (after the load) */
    struct uconn *conns;
    /* written by the upstream thread only, read at the end */
    atomic_ulong answered, resets, open;
};

int up_start(struct upstream *u);

void up_stop(struct upstream *u);

#endif
