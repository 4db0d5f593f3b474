#include "proxy/core/intake.h"

#include <stdlib.h>
#include <string.h>

/* A body of unknown length is buffered from this size, doubling: most are small, and a block
 * this size is one malloc keeps per thread (16 KiB took its slow path on every call). */
#define CHUNKED_START 1024

void intake_init(struct intake *in, const struct intake_pool *pool)
{
    memset(in, 0, sizeof(*in));
    in->content_length = -1;
    in->queue.max = INTAKE_QUEUE;
    in->pool = *pool;
}

/* Counts 'cap' bytes of body buffer against the pool (what is held already included). False,
 * with nothing counted, when they do not fit. */
static bool hold(struct intake *in, size_t cap)
{
    if (cap <= in->held)
        return true;
    uint64_t more = cap - in->held;
    uint64_t now = atomic_fetch_add_explicit(in->pool.held, more, memory_order_relaxed) + more;
    if (now > in->pool.max) {
        atomic_fetch_sub_explicit(in->pool.held, more, memory_order_relaxed);
        return false;
    }
    in->held = cap;
    return true;
}

void intake_fini(struct intake *in)
{
    free(in->body);
    in->body = NULL;
    if (in->held) {
        atomic_fetch_sub_explicit(in->pool.held, in->held, memory_order_relaxed);
        *in->pool.freed += in->held;
        in->held = 0;
    }
    ring_free(&in->queue);
}

int intake_plan(struct intake *in, bool has_body, int64_t content_length, uint64_t max_retry,
                bool tee)
{
    in->content_length = content_length;
    if (!has_body)
        in->mode = INTAKE_NONE;
    else if (tee)
        in->mode = INTAKE_TEE; /* its replay copy grows as it comes, up to max_retry */
    else if (content_length < 0 || (uint64_t)content_length <= max_retry)
        in->mode = INTAKE_BUFFER; /* chunked: buffered until it proves too large */
    else
        in->mode = INTAKE_STREAM;
    if (in->mode != INTAKE_BUFFER || content_length <= 0 || (uint64_t)content_length > max_retry)
        return 0;
    if (!hold(in, (size_t)content_length)) {
        in->mode = INTAKE_STREAM; /* no room left for replay: this body goes once */
        return 0;
    }
    in->body = malloc((size_t)content_length);
    if (!in->body)
        return -1;
    in->cap = (size_t)content_length;
    return 0;
}

enum intake_took intake_buffer(struct intake *in, const char *data, size_t n, uint64_t max_retry)
{
    size_t cap = in->cap;
    if (in->len + n > cap) {
        cap = cap ? cap * 2 : CHUNKED_START;
        while (cap < in->len + n)
            cap *= 2;
    }
    if (in->len + n > max_retry || !hold(in, cap)) {
        /* A chunked body (or a tee'd one) outgrew the replay limit, or the process's: it
         * streams, what was buffered first. */
        in->mode = INTAKE_STREAM;
        return INTAKE_OVERFLOW;
    }
    if (cap > in->cap) {
        char *b = realloc(in->body, cap);
        if (!b)
            return INTAKE_NOMEM;
        in->body = b;
        in->cap = cap;
    }
    memcpy(in->body + in->len, data, n);
    in->len += n;
    in->total += n;
    return INTAKE_TOOK;
}

size_t intake_queue(struct intake *in, const char *data, size_t n)
{
    size_t take = ring_space(&in->queue) < n ? ring_space(&in->queue) : n;
    if (take && ring_put(&in->queue, data, take) < 0)
        take = 0;
    in->total += take;
    return take;
}

size_t intake_read(struct intake *in, size_t *sent, char *buf, size_t max)
{
    size_t got = 0;
    if (*sent < in->len) {
        got = in->len - *sent;
        if (got > max)
            got = max;
        memcpy(buf, in->body + *sent, got);
        *sent += got;
    }
    if (got < max && in->queue.len)
        got += ring_get(&in->queue, buf + got, max - got);
    if (got)
        in->started = true;
    return got;
}
