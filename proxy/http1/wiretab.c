#include "proxy/http1/wiretab.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* One slot per descriptor. A slot is written by the worker that owns the socket and read by
 * whichever thread calls recv() on that descriptor number: the same worker while registered,
 * any thread once the number is reused after close, hence the atomics. */
static _Atomic(struct wire *) *slots;
static size_t n_slots;

int wiretab_init(size_t max_fd)
{
    if (slots)
        return 0;
    slots = calloc(max_fd, sizeof(*slots));
    if (!slots)
        return -1;
    n_slots = max_fd;
    return 0;
}

void wiretab_free(void)
{
    free(slots);
    slots = NULL;
    n_slots = 0;
}

int wiretab_attach(int fd, struct wire *w)
{
    if (fd < 0 || (size_t)fd >= n_slots)
        return -1;
    atomic_store_explicit(&slots[fd], w, memory_order_release);
    return 0;
}

void wiretab_detach(int fd)
{
    if (fd >= 0 && (size_t)fd < n_slots)
        atomic_store_explicit(&slots[fd], NULL, memory_order_release);
}

static ssize_t kernel_recv(int fd, void *buf, size_t len, int flags)
{
    return syscall(SYS_recvfrom, fd, buf, len, flags, NULL, NULL);
}

struct raw {
    int fd, flags;
};

static ssize_t raw_read(void *ctx, void *buf, size_t len)
{
    const struct raw *r = ctx;
    return kernel_recv(r->fd, buf, len, r->flags);
}

ssize_t wiretab_recv(int fd, void *buf, size_t len, int flags)
{
    struct wire *w = NULL;
    if (fd >= 0 && (size_t)fd < n_slots)
        w = atomic_load_explicit(&slots[fd], memory_order_acquire);
    if (!w || (flags & MSG_PEEK))
        return kernel_recv(fd, buf, len, flags);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    struct raw r = { fd, flags };
    return wire_recv(w, buf, len, raw_read, &r, now);
}

bool wiretab_quiet(int fd)
{
    struct wire *w = NULL;
    if (fd >= 0 && (size_t)fd < n_slots)
        w = atomic_load_explicit(&slots[fd], memory_order_acquire);
    return !w || wire_quiet(w);
}
