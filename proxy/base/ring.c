#include "proxy/base/ring.h"

#include <stdlib.h>
#include <string.h>

int ring_put(struct ring *q, const char *p, size_t n)
{
    if (n > ring_space(q))
        return -1;
    if (q->start + q->len + n > q->cap) {
        if (q->start) {
            memmove(q->buf, q->buf + q->start, q->len);
            q->start = 0;
        }
        if (q->len + n > q->cap) {
            /* from 512 bytes: most bodies are small, and a block this size is one malloc
             * keeps per thread, where 4 KiB took its slow path on every call */
            size_t cap = q->cap ? q->cap : 512;
            while (cap < q->len + n)
                cap *= 2;
            if (cap > q->max)
                cap = q->max;
            char *b = realloc(q->buf, cap);
            if (!b)
                return -1;
            q->buf = b;
            q->cap = cap;
        }
    }
    memcpy(q->buf + q->start + q->len, p, n);
    q->len += n;
    return 0;
}

size_t ring_get(struct ring *q, char *out, size_t n)
{
    if (n > q->len)
        n = q->len;
    memcpy(out, q->buf + q->start, n);
    ring_drop(q, n);
    return n;
}

void ring_drop(struct ring *q, size_t n)
{
    if (n > q->len)
        n = q->len;
    q->start += n;
    q->len -= n;
    if (q->len == 0)
        q->start = 0;
}

void ring_fit(struct ring *q)
{
    if (!q->len) {
        ring_free(q);
        return;
    }
    if (q->start)
        memmove(q->buf, q->buf + q->start, q->len);
    q->start = 0;
    char *b = q->len < q->cap ? realloc(q->buf, q->len) : NULL;
    if (b) {
        q->buf = b;
        q->cap = q->len;
    }
}

void ring_free(struct ring *q)
{
    free(q->buf);
    q->buf = NULL;
    q->start = q->len = q->cap = 0;
}
