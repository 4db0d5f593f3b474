/* ring -- a byte queue between a producer and a consumer that run at different times (a
 * response body waiting for the client, an upload waiting for curl). It compacts instead of
 * wrapping, starts small (a body is often a few bytes) and grows up to 'max'. */
#ifndef RETRYPROXY_PROXY_RING_H
#define RETRYPROXY_PROXY_RING_H

#include <stddef.h>

struct ring {
    char *buf;
    size_t start, len, cap, max;
};

static inline size_t ring_space(const struct ring *q)
{
    return q->max - q->len;
}

/* Queues p[0..n). 0, or -1 when it does not fit or out of memory (nothing queued). */
int ring_put(struct ring *q, const char *p, size_t n);
/* Takes up to 'n' bytes into 'out'; returns how many. */
size_t ring_get(struct ring *q, char *out, size_t n);
/* Drops the first 'n' bytes (at most len): those at buf + start, sent elsewhere. */
void ring_drop(struct ring *q, size_t n);
/* Frees the buffer; 'max' stays. */
void ring_free(struct ring *q);
/* Shrinks the buffer to what it holds (none when empty): for a queue that will wait long as it
 * is (its reader stopped), whose buffer grew while it was read. */
void ring_fit(struct ring *q);

#endif
