/* keep -- responses a request keeps rather than streams (proxy/core/req.h):
 *
 * - DRAIN: a response retry_on names, read whole (up to SAVED_BODY_MAX) to be returned as it
 *   came if retrying stops, and so that its connection can be reused;
 * - HOLD: a gRPC call's response whose head has no grpc-status, on a route whose retry_on
 *   names gRPC statuses. Its status comes in the trailers, after the body: the response is
 *   held back until then (docs/grpc.md "A status in trailers"), while it is one message and
 *   fits HOLD_MAX, and for retry.grpc_hold_ms from its first byte, and retried like any other
 *   when that status is one retry_on names. A second message, more bytes, or the hold's time
 *   up, and it streams: nothing is retried once a byte has gone to the client.
 *
 * The state machine (retry.c) decides each response and moves the request between these
 * states; this file keeps the bytes as it asks and says what happened.
 */
#include "proxy/core/req.h"

#include <stdlib.h>
#include <string.h>

#include "proxy/http/headers.h"
#include "proxy/core/worker.h"

/* The body of a retryable response, kept to be returned if retrying stops. Error bodies are
 * small; a larger one is not kept and a 502 stands in for it. */
#define SAVED_BODY_MAX (64 * 1024)
/* How much of a gRPC response is held back for its trailers: half the front end's response
 * buffer (proxy/http1/relay.c's RELAY_BUFFER), so that what was held and the bytes that made it too
 * large both fit when it starts streaming. */
#define HOLD_MAX (32 * 1024)

bool keep_hold(struct retry_req *r, const struct attempt *a)
{
    if (!(r->flags & RF_GRPC_RETRY) || a->status != 200 || grpc_status_of(&a->head) >= 0 ||
        !r->route->retry.grpc_hold_ms)
        return false; /* not a gRPC call that retries statuses, a Trailers-Only response, or a
                       * route that never holds */
    /* a retry must be possible at all: another attempt, the body to send again, and no other
     * attempt running beside this one (hedging decides by heads alone) */
    if (r->attempts >= r->max_attempts || !intake_replayable(&r->body) ||
        race_others_running(r, NULL))
        return false;
    /* nor while the client still sends: the call is bidirectional, and its client may wait
     * for this response's first message before it sends its next one */
    if (!(r->flags & RF_BODY_DONE))
        return false;
    r->held.len = 0;
    memset(&r->held.frames, 0, sizeof(r->held.frames));
    return true;
}

/* Keep this response in case retrying stops; its body is read first so that the connection can
 * be reused. */
void keep_save(struct retry_req *r, struct attempt *a)
{
    hlist_free(&r->saved.h);
    r->saved.h = a->head;
    memset(&a->head, 0, sizeof(a->head));
    hlist_clear(&r->saved.trailers);
    r->saved.status = a->status;
    r->saved.len = 0;
    r->flags |= RF_SAVED | RF_SAVED_WHOLE;
}

/* Appends to a growing buffer of at most 'max' bytes; false when it would pass it. */
static bool append(char **buf, size_t *len, size_t max, const char *p, size_t n)
{
    if (*len + n > max)
        return false;
    char *b = realloc(*buf, *len + n);
    if (!b && *len + n)
        return false;
    memcpy(b + *len, p, n);
    *buf = b;
    *len += n;
    return true;
}

/* The held response is the answer (decided as streaming): what was held goes to the client
 * first. Returns false if the client takes none of it (gone). */
bool keep_release_held(struct retry_req *r)
{
    size_t n = r->held.len;
    r->held.len = 0;
    if (!n)
        return true;
    size_t took = r->front->ops->body(r->front, r->held.body, n);
    return took == n; /* it fits the front end's buffer (HOLD_MAX) */
}

/* The held response is kept (RS_DRAIN): what was held is its saved body so far. */
void keep_held_to_saved(struct retry_req *r)
{
    free(r->saved.body);
    r->saved.body = r->held.body;
    r->saved.len = r->held.len;
    r->held.body = NULL;
    r->held.len = 0;
}

/* Held while it is one message and fits HOLD_MAX. */
enum keep_held keep_held(struct retry_req *r, const char *p, size_t n)
{
    bool first = r->held.len == 0;
    if (grpc_frames_feed(&r->held.frames, p, n) <= 1 &&
        append(&r->held.body, &r->held.len, HOLD_MAX, p, n))
        return first && n ? KEEP_HELD_FIRST : KEEP_HELD;
    return KEEP_HOLD_OVER;
}

size_t keep_drain(struct retry_req *r, const char *p, size_t n)
{
    if (!(r->flags & RF_SAVED_WHOLE) ||
        !append(&r->saved.body, &r->saved.len, SAVED_BODY_MAX, p, n)) {
        r->flags &= ~RF_SAVED_WHOLE;
        return 0; /* too large to keep: stop reading, the wait starts now */
    }
    return n;
}

void keep_trailers(struct retry_req *r, struct attempt *a, enum attempt_end end)
{
    if (end == ATTEMPT_BROKEN)
        r->flags &= ~RF_SAVED_WHOLE; /* the body broke off: not something to return */
    hlist_free(&r->saved.trailers);
    r->saved.trailers = a->trailers;
    memset(&a->trailers, 0, sizeof(a->trailers));
}
