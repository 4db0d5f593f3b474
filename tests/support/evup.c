#include "tests/support/evup.h"

#include <criterion/criterion.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/fixture.h"

int64_t evup_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Reads the request head (what follows it is left unread). */
static bool read_head(int c)
{
    char got[8192];
    size_t n = 0;
    while (n + 1 < sizeof(got) && !memmem(got, n, "\r\n\r\n", 4)) {
        struct pollfd q = { c, POLLIN, 0 };
        if (poll(&q, 1, 2000) <= 0)
            return false;
        ssize_t k = recv(c, got + n, sizeof(got) - 1 - n, 0);
        if (k <= 0)
            return false;
        n += (size_t)k;
    }
    return true;
}

/* Waits up to 'ms' (-1: the stop flag alone) for the peer to close: true if it did (its
 * request's bytes are all read by then, so anything readable is its end). */
static bool peer_closed(struct evup *e, int c, int ms)
{
    for (int64_t until = evup_now_us() + (int64_t)ms * 1000; !e->stop;) {
        int64_t left = (until - evup_now_us()) / 1000;
        if (ms >= 0 && left <= 0)
            return false;
        struct pollfd q = { c, POLLIN | POLLRDHUP, 0 };
        if (poll(&q, 1, ms < 0 || left > 50 ? 50 : (int)left) > 0) {
            atomic_store(&e->closed_us, evup_now_us());
            return true;
        }
    }
    return false;
}

static void serve(struct evup *e, int c)
{
    atomic_store(&e->sent, 0);
    atomic_store(&e->closed_us, 0);
    if (!read_head(c))
        return;
    e->served++;
    if (!raw_send_all(c, e->head, strlen(e->head)))
        return;
    for (int i = 0; i < e->parts && i < EVUP_PARTS; i++) {
        if (i > 0 && peer_closed(e, c, e->every_ms))
            return;
        char part[64];
        int n = snprintf(part, sizeof(part), "%x\r\ndata: %d\n\n\r\n", i < 10 ? 9 : 10, i);
        atomic_store(&e->sent_us[i], evup_now_us());
        if (!raw_send_all(c, part, (size_t)n))
            return;
        atomic_store(&e->sent, i + 1);
    }
    raw_send_all(c, "0\r\n\r\n", 5);
}

static void *evup_main(void *arg)
{
    struct evup *e = arg;
    for (int c; (c = fx_accept(e->lfd, &e->stop)) >= 0; close(c))
        serve(e, c);
    return NULL;
}

struct evup *evup_start(const char *head, int parts, int every_ms)
{
    cr_assert_leq(parts, EVUP_PARTS);
    struct evup *e = calloc(1, sizeof(*e));
    cr_assert_not_null(e);
    e->head = head;
    e->parts = parts;
    e->every_ms = every_ms;
    e->lfd = fx_listen(&e->port);
    pthread_create(&e->th, NULL, evup_main, e);
    return e;
}

void evup_stop(struct evup *e)
{
    if (!e)
        return;
    e->stop = 1;
    pthread_join(e->th, NULL);
    close(e->lfd);
    free(e);
}
