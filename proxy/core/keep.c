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
 * Part of the request's one state machine with retry.c, edge.c and race.c (proxy/core/req.h).
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
    r->state = RS_HOLD;
    return true;
}

void keep_head(struct retry_req *r, struct attempt *a)
{
    if (!req_decide(r, RETRY_OUT_STATUS)) {
        if ((r->flags & RF_SUCCEEDED) || !race_others_running(r, NULL)) {
            edge_stream(r); /* this response is the answer */
            return;
        }
        r->flags |= RF_LAG; /* a failure that ends retrying: kept while the others run on */
    }
    /* Keep this response in case retrying stops; read its body first so the connection can
     * be reused. */
    hlist_free(&r->saved.h);
    r->saved.h = a->head;
    memset(&a->head, 0, sizeof(a->head));
    hlist_clear(&r->saved.trailers);
    r->saved.status = a->status;
    r->saved.len = 0;
    r->flags |= RF_SAVED | RF_SAVED_WHOLE;
    r->state = RS_DRAIN;
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
static bool release_held(struct retry_req *r)
{
    size_t n = r->held.len;
    r->held.len = 0;
    if (!n)
        return true;
    size_t took = r->front->ops->body(r->front, r->held.body, n);
    return took == n; /* it fits the front end's buffer (HOLD_MAX) */
}

/* Body bytes of a stream that is the answer. */
static size_t stream_body(struct retry_req *r, const char *p, size_t n)
{
    size_t took = r->front->ops->body(r->front, p, n);
    return took == FRONT_FULL ? ATTEMPT_PAUSE : took;
}

/* The hold ends before the trailers came (a second message, too many bytes, its time up): the
 * response is decided now, on its head alone. Streaming, what was held goes to the client
 * first (false if the client takes none of it); kept (RS_DRAIN), it starts the saved body. */
static bool end_hold(struct retry_req *r, struct attempt *a)
{
    loop_timer_stop(r->w->loop, &r->try_timer);
    keep_head(r, a);
    if (r->state == RS_STREAM)
        return release_held(r);
    char *held = r->held.body;
    r->held.body = r->saved.body;
    r->saved.body = held;
    r->saved.len = r->held.len;
    r->held.len = 0;
    return true;
}

/* retry.grpc_hold_ms after the first byte held: a server stream's first message (a watch's
 * first event) must not wait for a second one, or the trailers, without bound. */
static void on_hold_over(struct loop_timer *t)
{
    struct retry_req *r = t->arg;
    if (r->state != RS_HOLD || end_hold(r, &r->cur->att))
        return;
    /* the client took none of what was held (gone): the response ends there, broken, as when
     * a body callback gives up */
    tally_grpc(r, -1);
    r->front->ops->end(r->front, NULL, true);
    req_stop_transfer(r, r->cur);
}

size_t keep_body(struct retry_req *r, struct attempt *a, const char *p, size_t n)
{
    if (r->state == RS_HOLD) {
        bool first = r->held.len == 0;
        if (grpc_frames_feed(&r->held.frames, p, n) <= 1 &&
            append(&r->held.body, &r->held.len, HOLD_MAX, p, n)) {
            /* the attempt's timer, idle since its head came (every end of the request or
             * of the attempt stops it), bounds the hold */
            struct loop *l = r->w->loop;
            if (first && n)
                loop_timer_start(l, &r->try_timer, loop_now(l) + r->route->retry.grpc_hold_ms,
                                 on_hold_over, r);
            return n;
        }
        /* a second message or too large: decided now, on the head alone */
        if (!end_hold(r, a))
            return 0;
        if (r->state == RS_STREAM)
            return stream_body(r, p, n);
        /* RS_DRAIN: the rest is kept below if it fits */
    }
    if (r->state != RS_DRAIN)
        return 0;
    if (!(r->flags & RF_SAVED_WHOLE) ||
        !append(&r->saved.body, &r->saved.len, SAVED_BODY_MAX, p, n)) {
        r->flags &= ~RF_SAVED_WHOLE;
        return 0; /* too large to keep: stop reading, the wait starts now */
    }
    return n;
}

/* The response in RS_DRAIN has been read (or given up on): wait and retry, or answer. */
static void drained(struct retry_req *r)
{
    if (!(r->flags & RF_LAG) && req_settle(r))
        req_wait_then_retry(r);
    else
        race_wait(r);
}

void keep_done(struct retry_req *r, struct attempt *a, enum attempt_end end)
{
    if (r->state == RS_HOLD) {
        if (end != ATTEMPT_COMPLETE) {
            /* broke off before its status came: never passed off as a good response */
            r->held.len = 0;
            req_attempt_failed(r, RETRY_OUT_RESET);
            return;
        }
        keep_head(r, a); /* the trailers are in: req_grpc_status() reads them */
        if (r->state == RS_STREAM) {
            bool whole = release_held(r);
            tally_grpc(r, whole ? req_grpc_status(r, a) : -1);
            r->front->ops->end(r->front, &a->trailers, !whole);
            return;
        }
        /* RS_DRAIN: what was held is the saved response's body, whole */
        free(r->saved.body);
        r->saved.body = r->held.body;
        r->saved.len = r->held.len;
        r->held.body = NULL;
        r->held.len = 0;
    }
    if (end == ATTEMPT_BROKEN)
        r->flags &= ~RF_SAVED_WHOLE; /* the body broke off: not something to return */
    hlist_free(&r->saved.trailers);
    r->saved.trailers = a->trailers;
    memset(&a->trailers, 0, sizeof(a->trailers));
    drained(r);
}
