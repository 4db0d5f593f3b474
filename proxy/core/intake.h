/* intake -- the request body on its way in: buffered whole so that a retry can send it again
 * (up to retry.max_retry_body_bytes, and within limits.max_buffered_body_bytes for the whole
 * process), or streamed once through a bounded queue when it cannot be (docs/forwarding.md),
 * or, for a gRPC call, streamed as it arrives while a copy is kept for a retry (docs/grpc.md).
 */
#ifndef RETRYPROXY_PROXY_INTAKE_H
#define RETRYPROXY_PROXY_INTAKE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/base/ring.h"

/* Request bytes of a streamed upload waiting for the upstream; when full, the client waits. */
#define INTAKE_QUEUE (256 * 1024)

/* The process's replay buffers: bytes held by every request, and their limit. */
struct intake_pool {
    atomic_uint_fast64_t *held;
    uint64_t max;
    uint64_t *freed; /* bytes given back since the worker last trimmed its heap */
};

enum intake_mode {
    INTAKE_NONE,   /* no body */
    INTAKE_BUFFER, /* buffered whole: every attempt sends it */
    INTAKE_STREAM, /* streamed once: what was buffered first, then the queue */
    INTAKE_TEE,    /* streamed as it arrives, every byte kept for a replay: INTAKE_STREAM once
                    * it outgrows the replay limit */
};

struct intake {
    enum intake_mode mode;
    int64_t content_length; /* -1: chunked */
    char *body;             /* the buffered body, or the head of a streamed one */
    size_t len, cap;
    size_t held;       /* of 'cap', counted in the pool */
    struct ring queue; /* the rest of a streamed body */
    uint64_t total;    /* bytes received from the client */
    bool started;      /* the upstream took bytes of a streamed body: it cannot go again */
    struct intake_pool pool;
};

void intake_init(struct intake *in, const struct intake_pool *pool);
void intake_fini(struct intake *in);

/* Chooses how a body of 'content_length' bytes (-1: chunked, 'has_body' false: none) is
 * taken: buffered when it may be retried and fits, else streamed; with 'tee', streamed while
 * kept (INTAKE_TEE). 0, or -1 out of memory. */
int intake_plan(struct intake *in, bool has_body, int64_t content_length, uint64_t max_retry,
                bool tee);

enum intake_took {
    INTAKE_TOOK,     /* buffered */
    INTAKE_OVERFLOW, /* too large to buffer: the body now streams, nothing taken */
    INTAKE_NOMEM,
};
/* Buffers 'n' more bytes of an INTAKE_BUFFER or INTAKE_TEE body. */
enum intake_took intake_buffer(struct intake *in, const char *data, size_t n, uint64_t max_retry);
/* Queues up to 'n' bytes of a streamed body; returns how many fit. */
size_t intake_queue(struct intake *in, const char *data, size_t n);

/* The next bytes for the upstream: the buffered part, then the queue. '*sent' is where the
 * attempt reading is in the buffered part (0 for a new one): two attempts may read a kept
 * body at once (a hedge beside a laggard still sending it), the queue only one. Returns how
 * many. */
size_t intake_read(struct intake *in, size_t *sent, char *buf, size_t max);
/* Whether another attempt could send the body again. */
static inline bool intake_replayable(const struct intake *in)
{
    return in->mode != INTAKE_STREAM || !in->started;
}
/* Whether the body goes to the upstream as it arrives (an attempt starts with the head). */
static inline bool intake_streams(const struct intake *in)
{
    return in->mode == INTAKE_STREAM || in->mode == INTAKE_TEE;
}

#endif
