/* retry -- the request state machine (proxy/core/retry.h): a request's states and every move
 * between them are here, and only here. The parts do what it asks and say what happened:
 * edge.c takes the head in and renders answers, keep.c keeps a response rather than stream it,
 * race.c keeps the attempts that run beside the current one (hedging), durable.c stores a
 * durable route's request, req.c has the request's references, slots and verdicts. None of
 * them sets r->state or calls back here, but for req_event() (docs/architecture.md, "One
 * request's states"; tests/cli/layout.py checks it).
 *
 *   HEADERS --begin()--> BODY --body complete--> ATTEMPT --head, final--> STREAM --> done
 *                         | |  (a body too large      |  |
 *                         | |   to replay starts      |  +--head, retry--> DRAIN --body read--+
 *                         | |   ATTEMPT at once)      |  +--gRPC, no status--> HOLD --+       |
 *                         | |                         |      (its trailers decide: STREAM or DRAIN)
 *                         | |                         +--no head, retry--> BACKOFF <----------+
 *                         | |                                                  |
 *                         | |                         ATTEMPT <--timer---------+
 *                         | +--durable route, body complete--> STORE --stored--> ANSWERED
 *                         +--an answer of our own (400, 404, 405, 413)--> ANSWERED
 *
 * Retrying stops (ANSWERED, with the saved response or an error of our own) when decide_attempt()
 * says so, at the deadline, when draining ends, or when the client goes away during a wait.
 * A request is referenced by its connection, by a running transfer and by a streamed
 * response's body reader; the last to let go frees it (req_release(), req.c).
 *
 * Hedging (retry.hedge_on_per_try_timeout): an attempt that passes per_try_timeout_ms is not
 * cancelled. The next attempt is decided as a timeout's retry (BACKOFF, then ATTEMPT), and the
 * slow one runs on in r->others, a laggard. The first response retry_on does not name wins,
 * from any of them: a laggard's becomes the current attempt and streams, and every other
 * attempt is cancelled. When retrying stops with laggards still running, the request waits
 * for them (LAG) instead of answering.
 *
 * What moves a request: the front end's calls (retry.h), an attempt's callbacks
 * (req_attempt_ops: go, head, body, upload, done), the request's timers (the per-try timeout,
 * the gRPC hold, the backoff, the deadline), the drain deadline (retry_expire_all()), and the
 * store's answer to a durable accept, the one event that comes from a part (req_event()).
 */
#include "proxy/core/retry.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proxy/upstream/attempt.h"
#include "proxy/core/balance.h"
#include "proxy/core/decide.h"
#include "proxy/base/dlist.h"
#include "proxy/http/grpc.h"
#include "proxy/http/head.h"
#include "proxy/core/intake.h"
#include "proxy/telemetry/metrics.h"
#include "proxy/core/req.h"
#include "proxy/core/runtime.h"
#include "proxy/core/worker.h"

/* How much of a body over limits.max_body_bytes is read (and dropped) so that the 413 can be
 * sent; libmicrohttpd answers only once the body is complete. Past this the connection is
 * closed instead: a client may not hold it with an endless body. */
#define DISCARD_MAX (1024 * 1024)

static size_t take_body(struct retry_req *r, const char *data, size_t n);
static void start_attempt(struct retry_req *r);
static void answer_error(struct retry_req *r, unsigned status, const char *code,
                         const char *message);
static void on_deadline(struct loop_timer *t);
static void on_try_timeout(struct loop_timer *t);
static const struct attempt_ops req_attempt_ops;
static void answered(struct retry_req *r);
static req_event_fn req_event;
static void answer_saved(struct retry_req *r);
static void answer_final(struct retry_req *r);
static void attempt_failed(struct retry_req *r, enum retry_outcome o);
static void wait_then_retry(struct retry_req *r);
static void stream(struct retry_req *r);
static void lag_or_answer(struct retry_req *r);
static void head_decided(struct retry_req *r, struct attempt *a);
static size_t kept_body(struct retry_req *r, struct attempt *a, const char *p, size_t n);
static void kept_done(struct retry_req *r, struct attempt *a, enum attempt_end end);
static void other_head(struct retry_req *r, struct trial *t);

static struct trial *of_attempt(struct attempt *a)
{
    return a->arg;
}

/* ---- life ---- */

static void trial_init(struct retry_req *r, struct trial *t)
{
    memset(t, 0, sizeof(*t));
    t->r = r;
    attempt_init(&t->att, &r->w->up, &req_attempt_ops, t);
}

/* -> HEADERS: a request, made by req_new() (req.c), with its first attempt's trial. */
struct front *retry_req_new(struct worker *w, const struct front_ops *ops, size_t front_size,
                            enum front_proto proto, const char *raw_target, const char *peer,
                            unsigned peer_port, enum refusal refused)
{
    struct retry_req *r = req_new(w, ops, front_size, proto, raw_target, peer, peer_port, refused);
    if (!r)
        return NULL;
    trial_init(r, &r->first);
    return r->front;
}

/* ---- the client side: the front end's calls ---- */

/* HEADERS -> BODY: the head is taken in (edge.c), and either answered at once or planned. */
void retry_req_head(struct retry_req *r, const char *method)
{
    if (r->state != RS_HEADERS)
        return;
    r->state = RS_BODY;
    struct edge_body b;
    switch (edge_begin(r, method, &b)) {
    case EDGE_ANSWERED:
        answered(r);
        break;
    case EDGE_DURABLE: /* stored, not forwarded: its body is taken whole first */
        if (!accept_plan(r, b.has_body, b.length))
            answered(r);
        break;
    case EDGE_BUFFER: /* the first attempt goes once the body is in (retry_req_end()) */
        break;
    case EDGE_STREAM:
        start_attempt(r); /* the body flows to the upstream as it arrives */
        break;
    }
}

size_t retry_req_body(struct retry_req *r, const char *data, size_t n)
{
    size_t took = take_body(r, data, n);
    if (r->flags & RF_CLOSE_NOW)
        return RETRY_BODY_CLOSE;
    if (took < n && !r->front->answered)
        r->front->ops->wait_upload(r->front); /* until the upstream takes the last bytes */
    return took;
}

void retry_req_trailer(struct retry_req *r, const char *k, size_t kl, const char *v, size_t vl)
{
    edge_trailer(r, k, kl, v, vl);
}

/* BODY -> STORE (a durable route's) or ATTEMPT. */
void retry_req_end(struct retry_req *r)
{
    if (r->flags & RF_BODY_DONE)
        return;
    r->flags |= RF_BODY_DONE;
    attempt_resume_upload(&r->cur->att); /* the end of a streamed body */
    if (r->state != RS_BODY)
        return;
    if (!(r->flags & RF_DURABLE)) {
        start_attempt(r);
    } else if (accept_store(r, req_event)) {
        r->state = RS_STORE;
        r->refs++; /* the store borrows its body and target until its answer (req_event()) */
    } else {
        answered(r);
    }
}

void retry_req_completed(struct retry_req *r)
{
    struct loop *l = r->w->loop;
    r->front->ops->unwatch(r->front);
    req_end_retry_in_flight(r);
    loop_timer_stop(l, &r->try_timer);
    loop_timer_stop(l, &r->deadline_timer);
    loop_timer_stop(l, &r->backoff_timer);
    /* a response still coming when the client side ended: its client left part way */
    if (race_end_all(r, METRICS_OUT_CANCELLED) && r->state == RS_STREAM)
        edge_cut_short(r);
    tally_grpc(r, GRPC_CANCELLED); /* the client side ended before an answer ended the call */
    tally_done(r);
    r->peer = NULL;
    req_release(r);
}

/* ---- the body ---- */

/* Body bytes from the client. Returns the bytes consumed. */
static size_t take_body(struct retry_req *r, const char *data, size_t n)
{
    struct intake *in = &r->body;
    if (r->front->answered && !req_upload_live(r)) {
        /* Answered already (413, or the upstream answered before the whole body came): the
         * rest is dropped until the front end lets the answer go out. A bidirectional gRPC
         * call's upload goes on while its response streams (req_upload_live()). */
        r->discarded += n;
        if ((r->flags & RF_OVER_LIMIT) && r->discarded > DISCARD_MAX)
            r->flags |= RF_CLOSE_NOW;
        return n;
    }
    if (in->total + n > r->cfg->max_body_bytes) {
        struct loop *l = r->w->loop;
        loop_timer_stop(l, &r->backoff_timer);
        loop_timer_stop(l, &r->try_timer);
        race_end_all(r, METRICS_OUT_CANCELLED);
        r->flags |= RF_OVER_LIMIT;
        r->discarded = n;
        answer_error(r, 413, "body_too_large",
                     "the request body is larger than limits.max_body_bytes");
        return n;
    }
    bool live = req_upload_live(r);
    if (in->mode == INTAKE_BUFFER || in->mode == INTAKE_TEE) {
        bool tee = in->mode == INTAKE_TEE;
        uint64_t max = r->flags & RF_DURABLE ? r->route->delivery.max_body_bytes
                                             : r->route->retry.max_retry_body_bytes;
        switch (intake_buffer(in, data, n, max)) {
        case INTAKE_TOOK:
            if (tee && live)
                attempt_resume_upload(&r->cur->att);
            return n;
        case INTAKE_NOMEM:
            return 0;
        case INTAKE_OVERFLOW:
            if (r->flags & RF_DURABLE) { /* stored whole or not at all */
                r->discarded = n;
                accept_too_large(r);
                answered(r);
                return n;
            }
            if (!tee)
                start_attempt(r); /* it streams now, what was buffered first */
            live = req_upload_live(r);
            break;
        }
    }
    if (!live) {
        in->total += n;
        return n; /* the upstream has answered: the rest of the body is not needed */
    }
    size_t take = intake_queue(in, data, n);
    if (take)
        attempt_resume_upload(&r->cur->att);
    return take;
}

/* ---- attempts ---- */

/* -> ATTEMPT: to one of the route's endpoints (proxy/core/balance.h), preferring one this
 * request has not tried. The worker's turns belong to its current snapshot; a request that
 * started under an older one (a reload since) starts anywhere. Or ANSWERED at once: throttled,
 * no address (edge_no_address()), a delivery's upstream busy. */
static void start_attempt(struct retry_req *r)
{
    struct worker *w = r->w;
    struct loop *l = w->loop;
    const struct cfg_route *rt = r->route;
    uint64_t now = loop_now(l);

    if (r->attempts == 0 && rt->throttle.k > 0 &&
        !throttle_admit(&r->rtr->live->throttle, rt->throttle.k, now, &w->rng, &r->throttle_p)) {
        /* client-side throttling: the upstream keeps failing, this one is not sent */
        r->flags |= RF_THROTTLED;
        metrics_throttled(r->m, w->id);
        answer_error(r, 503, "throttled",
                     "the upstream keeps failing: retryproxy sends it fewer requests "
                     "(routes[].throttle)");
        return;
    }
    if (r->attempts == 0) {
        /* timeout_ms covers every attempt and wait, from the first attempt on */
        r->deadline_ms = now + r->timeout_ms;
        loop_timer_start(l, &r->deadline_timer, r->deadline_ms, on_deadline, r);
        /* the base of both ratio budgets (a delivery's attempts are the courier's to count) */
        if (!r->front->ops->delivery)
            decide_note_request(&r->dr.budgets, now);
    }
    r->attempts++;
    r->state = RS_ATTEMPT;
    uint32_t *rr = r->rt == w->rt ? &w->rr[rt - r->cfg->routes] : NULL;
    struct trial *t = r->cur;
    tally_endpoint_free(t);
    struct bal_worker bw = { w->id, &w->rng, &w->up };
    struct endpoint *e = balance_pick(&bw, r->rtr->bal, &r->tried, now, rr);
    char msg[512];
    /* no address for any name of the route: answered, no attempt, no wait (an attempt running
     * beside this one may still answer: then it goes on as a connect failure) */
    if (!e && !race_others_running(r, NULL) && edge_no_address(r, msg, sizeof(msg))) {
        req_not_made(r);
        if (edge_saved_whole(r))
            answer_saved(r);
        else
            answer_error(r, 503, "no_address", msg);
        return;
    }
    if (r->front->ops->attempting && !r->front->ops->attempting(r->front, e ? e->k : 0)) {
        /* a stored delivery whose upstream is at its bound: put back, not sent */
        endpoint_unref(e);
        req_not_made(r);
        answer_error(r, 503, "upstream_busy", "the upstream has its bound of deliveries in flight");
        return;
    }
    t->flags = 0;
    t->sent = 0; /* its upload reads from the start */
    t->number = r->attempts;
    tally_endpoint_in(t, e);
    if (e)
        choose_tried_add(&r->tried, e->le);
    t->start_us = loop_clock_us(l); /* its duration includes a wait for a slot (metrics.md) */
    if (!attempt_queue(&t->att, trial_upstream(r, t)->origin, e ? e->to : NULL, r->front->share))
        req_attempt_ops.go(&t->att); /* else it starts when a slot frees */
}

/* The current attempt, given a transfer slot: sent (req_launch()), with its per-try timeout,
 * or failed as a connect failure. */
static void attempt_go(struct attempt *a)
{
    struct trial *t = of_attempt(a);
    struct retry_req *r = t->r;
    struct loop *l = r->w->loop;
    const struct cfg_route *rt = r->route;
    uint64_t now = loop_now(l);
    uint64_t left = r->deadline_ms > now ? r->deadline_ms - now : 1;
    /* how long this attempt's answer is waited for (grpc-timeout, the deadline header) */
    if (!req_launch(r, t, race_attempt_wait(r, left), left)) {
        attempt_failed(r, RETRY_OUT_CONNECT_FAILURE);
        return;
    }
    if (rt->per_try_timeout_ms && now + rt->per_try_timeout_ms < r->deadline_ms)
        loop_timer_start(l, &r->try_timer, now + rt->per_try_timeout_ms, on_try_timeout, r);
}

/* Response bytes of the current attempt to the client. */
static size_t to_client(struct retry_req *r, const char *p, size_t n)
{
    size_t took = r->front->ops->body(r->front, p, n);
    return took == FRONT_FULL ? ATTEMPT_PAUSE : took;
}

/* ATTEMPT -> HOLD (a gRPC response whose status is to come in its trailers, keep.c), or the
 * head decided: STREAM or DRAIN. A head of an attempt beside the current one: other_head(). */
static void attempt_head(struct attempt *a)
{
    struct trial *t = of_attempt(a);
    struct retry_req *r = t->r;
    if (t != r->cur) {
        other_head(r, t);
        return;
    }
    loop_timer_stop(r->w->loop, &r->try_timer);
    if (keep_hold(r, a))
        r->state = RS_HOLD; /* its trailers decide (kept_done()) */
    else
        head_decided(r, a);
}

static size_t attempt_body(struct attempt *a, const char *p, size_t n)
{
    struct trial *t = of_attempt(a);
    struct retry_req *r = t->r;
    if (t != r->cur)
        return 0; /* a lost attempt's: stop it (one running on has had no head yet) */
    if (r->state == RS_STREAM)
        return to_client(r, p, n);
    return kept_body(r, a, p, n);
}

/* ATTEMPT ended without a head: attempt_failed(); HOLD or DRAIN: kept_done(); STREAM: the
 * answer ends. An attempt beside the current one: race.c, and the answer if LAG waited for it
 * last. */
static void attempt_done(struct attempt *a, enum attempt_end end)
{
    struct trial *t = of_attempt(a);
    struct retry_req *r = t->r;
    tally_endpoint_out(t); /* its transfer is over, whatever follows */
    if (t != r->cur) {
        race_other_done(r, t);
        if (r->state == RS_LAG && !race_others_running(r, NULL))
            answer_final(r);
        req_release(r);
        return;
    }
    loop_timer_stop(r->w->loop, &r->try_timer);
    switch (r->state) {
    case RS_ATTEMPT:
        /* No head: if nothing was sent, nothing reached the upstream, whatever the error; one
         * it refused unprocessed is a reset that may go again (req_judge()) */
        attempt_failed(r, attempt_sent(a) || a->unprocessed ? RETRY_OUT_RESET
                                                            : RETRY_OUT_CONNECT_FAILURE);
        break;
    case RS_DRAIN:
    case RS_HOLD:
        kept_done(r, a, end);
        break;
    case RS_STREAM:
        tally_grpc(r, end == ATTEMPT_COMPLETE ? req_grpc_status(r, a) : -1);
        r->front->ops->end(r->front, &a->trailers, end != ATTEMPT_COMPLETE);
        break;
    default:
        break;
    }
    req_release(r);
}

static const struct attempt_ops req_attempt_ops = { .go = attempt_go,
                                                    .head = attempt_head,
                                                    .body = attempt_body,
                                                    .upload = req_upload,
                                                    .done = attempt_done };

/* An attempt ended without a response head: BACKOFF, or retrying stops (lag_or_answer()). */
static void attempt_failed(struct retry_req *r, enum retry_outcome o)
{
    r->cur->att.status = 0;
    if (req_decide(r, o))
        wait_then_retry(r);
    else
        lag_or_answer(r);
}

/* ---- deciding and waiting ---- */

static void on_backoff(struct loop_timer *t)
{
    struct retry_req *r = t->arg;
    r->front->ops->unwatch(r->front);
    start_attempt(r);
}

static void wait_then_retry(struct retry_req *r)
{
    struct loop *l = r->w->loop;
    r->state = RS_BACKOFF;
    /* from now, not from when this loop turn began: the wait taken is the one logged, however
     * long the turn has run (a loaded machine, a sanitizer) */
    r->wait_start_ms = loop_update_now(l);
    loop_timer_start(l, &r->backoff_timer, r->wait_start_ms + r->pending_delay, on_backoff, r);
    /* A zero wait ends this turn, before the socket could tell anything. */
    if (r->pending_delay)
        r->front->ops->watch(r->front);
}

/* ---- answers ---- */

/* -> ANSWERED (a streamed answer stays in STREAM): attempts running beside the current one
 * are cancelled. */
static void answered(struct retry_req *r)
{
    if (r->state != RS_STREAM)
        r->state = RS_ANSWERED;
    race_lose_others(r, METRICS_OUT_CANCELLED);
}

/* An error of retryproxy's own (edge_error()); kept as a dead letter when retrying stopped
 * before it (durable_answered()). */
static void answer_error(struct retry_req *r, unsigned status, const char *code,
                         const char *message)
{
    edge_error(r, status, code, message);
    answered(r);
    if (r->stop != RETRY_STOP_NONE || (r->flags & RF_THROTTLED))
        durable_answered(r, (int)status, NULL, message, strlen(message));
}

/* The saved retryable response, when retrying stopped after it. */
static void answer_saved(struct retry_req *r)
{
    edge_saved(r);
    answered(r);
    if (r->stop != RETRY_STOP_NONE)
        durable_answered(r, r->saved.status, &r->saved.h, r->saved.body, r->saved.len);
}

/* Retrying is over without a response to stream: the last upstream response if we have it
 * whole, else an error of our own. */
static void answer_final(struct retry_req *r)
{
    if (edge_saved_whole(r))
        answer_saved(r);
    else if (r->last_outcome == RETRY_OUT_TIMEOUT)
        answer_error(r, 504, "upstream_timeout", "no response from the upstream in time");
    else if (r->cur->att.bad_head)
        answer_error(r, 502, "upstream_invalid_response",
                     "the upstream's response head was malformed or ambiguous");
    else
        answer_error(r, 502, "upstream_unavailable", "no response from any upstream attempt");
}

/* -> STREAM: the current attempt's response is the answer (edge_stream()), and attempts
 * running beside it are cancelled. */
static void stream(struct retry_req *r)
{
    race_lose_others(r, METRICS_OUT_CANCELLED);
    r->state = RS_STREAM;
    /* the last failure streams: its head is kept as a dead letter, not its body */
    if (edge_stream(r) && r->stop != RETRY_STOP_NONE)
        durable_answered(r, r->cur->att.status, &r->cur->att.head, NULL, 0);
}

/* Retrying has stopped on the current attempt: ANSWERED now, or LAG while attempts still run
 * beside it, which may yet bring a better answer. */
static void lag_or_answer(struct retry_req *r)
{
    if (race_others_running(r, NULL))
        r->state = RS_LAG;
    else
        answer_final(r);
}

/* ---- responses kept rather than streamed (keep.c) ---- */

/* The current attempt's response head, decided (held, once its trailers are in): STREAM, it
 * is the answer; DRAIN, it is kept (read whole, so that its connection can be reused) because
 * a retry follows, or because it ends retrying while attempts beside it run on (RF_LAG). */
static void head_decided(struct retry_req *r, struct attempt *a)
{
    if (!req_decide(r, RETRY_OUT_STATUS)) {
        if ((r->flags & RF_SUCCEEDED) || !race_others_running(r, NULL)) {
            stream(r); /* this response is the answer */
            return;
        }
        r->flags |= RF_LAG; /* a failure that ends retrying: kept while the others run on */
    }
    keep_save(r, a);
    r->state = RS_DRAIN;
}

/* HOLD ends before the trailers came (a second message, too many bytes, its time up): the
 * response is decided now, on its head alone. Streaming, what was held goes to the client
 * first (false if the client takes none of it); kept (DRAIN), it starts the saved body. */
static bool end_hold(struct retry_req *r, struct attempt *a)
{
    loop_timer_stop(r->w->loop, &r->try_timer);
    head_decided(r, a);
    if (r->state == RS_STREAM)
        return keep_release_held(r);
    keep_held_to_saved(r);
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

/* Body bytes of a response in HOLD or DRAIN. */
static size_t kept_body(struct retry_req *r, struct attempt *a, const char *p, size_t n)
{
    if (r->state == RS_HOLD) {
        switch (keep_held(r, p, n)) {
        case KEEP_HELD_FIRST: {
            /* the attempt's timer, idle since its head came (every end of the request or of
             * the attempt stops it), bounds the hold */
            struct loop *l = r->w->loop;
            loop_timer_start(l, &r->try_timer, loop_now(l) + r->route->retry.grpc_hold_ms,
                             on_hold_over, r);
            return n;
        }
        case KEEP_HELD:
            return n;
        case KEEP_HOLD_OVER: /* a second message or too large: decided now, on the head alone */
            if (!end_hold(r, a))
                return 0;
            if (r->state == RS_STREAM)
                return to_client(r, p, n);
            break; /* DRAIN: the rest is kept below if it fits */
        }
    }
    if (r->state != RS_DRAIN)
        return 0;
    return keep_drain(r, p, n);
}

/* The transfer of a response in HOLD or DRAIN ended. HOLD: broken off before its status came,
 * a failure (never passed off as a good response); whole, its trailers decide it as a head is
 * decided. DRAIN, read (or given up on): BACKOFF and retry, or retrying stops. */
static void kept_done(struct retry_req *r, struct attempt *a, enum attempt_end end)
{
    if (r->state == RS_HOLD) {
        if (end != ATTEMPT_COMPLETE) {
            r->held.len = 0; /* dropped */
            attempt_failed(r, RETRY_OUT_RESET);
            return;
        }
        head_decided(r, a); /* the trailers are in: req_grpc_status() reads them */
        if (r->state == RS_STREAM) {
            bool whole = keep_release_held(r);
            tally_grpc(r, whole ? req_grpc_status(r, a) : -1);
            r->front->ops->end(r->front, &a->trailers, !whole);
            return;
        }
        keep_held_to_saved(r); /* DRAIN: the saved response's body, whole */
    }
    keep_trailers(r, a, end);
    if (!(r->flags & RF_LAG) && req_settle(r))
        wait_then_retry(r);
    else
        lag_or_answer(r);
}

/* ---- attempts beside the current one (race.c) ---- */

/* The current attempt passed its per-try timeout: hedged where hedging applies, decided as a
 * timeout's retry would be (max_attempts, the budgets, throttling, the backoff wait), but this
 * one is not cancelled. Taken, the hedge waits out its backoff (BACKOFF) while this attempt
 * runs on in r->others; refused (and counted as a denied retry), this attempt runs on alone,
 * until the deadline at most. Returns false where hedging does not apply: then the timeout
 * ends the attempt. */
static bool hedge(struct retry_req *r)
{
    if (!race_hedgeable(r))
        return false;
    struct trial *next = malloc(sizeof(*next));
    if (!next)
        return false;
    trial_init(r, next);
    struct retry_facts f;
    struct retry_verdict v;
    req_judge(r, RETRY_OUT_TIMEOUT, &f, &v);
    if (race_hedge(r, next, &v)) {
        r->pending_delay = v.delay_ms;
        wait_then_retry(r);
    }
    return true;
}

/* A response head for 't', an attempt running beside the current one (race_other_head()). One
 * that wins (retry_on does not name it), or the last failure there is to return, becomes the
 * current attempt and streams: a wait for the next attempt ends, and whatever else runs is
 * cancelled (in the next turn: this is one of curl's callbacks). */
static void other_head(struct retry_req *r, struct trial *t)
{
    enum race_head h = race_other_head(r, t);
    if (h == RACE_DROPPED)
        return;
    if (r->state == RS_BACKOFF) {
        req_cut_wait_short(r);
        r->front->ops->unwatch(r->front);
    }
    loop_timer_stop(r->w->loop, &r->try_timer);
    req_end_retry_in_flight(r); /* the current attempt's, or the one it waited to make */
    r->flags &= ~RF_SETTLE;     /* a retry decided on a body being read is not made, nor refused */
    race_take(r, t);
    if (h == RACE_WON) {
        r->stop = RETRY_STOP_NONE;
        r->flags |= RF_SUCCEEDED;
        decide_note_final(&r->dr, loop_now(r->w->loop));
    }
    stream(r);
}

/* ---- timers, and the request's ends ---- */

static void on_try_timeout(struct loop_timer *t)
{
    struct retry_req *r = t->arg;
    if (r->state != RS_ATTEMPT || !attempt_running(&r->cur->att) || hedge(r))
        return;
    req_stop_transfer(r, r->cur);
    attempt_failed(r, RETRY_OUT_TIMEOUT);
}

static void on_deadline(struct loop_timer *t)
{
    struct retry_req *r = t->arg;
    bool running = race_end_all(r, METRICS_OUT_TIMEOUT); /* none answered in time */
    loop_timer_stop(r->w->loop, &r->try_timer);
    switch (r->state) {
    case RS_ATTEMPT:
    case RS_HOLD:
        attempt_failed(r, RETRY_OUT_TIMEOUT); /* decide() sees the deadline: no retry */
        break;
    case RS_DRAIN:
        if (running)
            r->flags &= ~RF_SAVED_WHOLE; /* cut off mid-body: never returned as complete */
        /* fall through */
    case RS_BACKOFF:
        loop_timer_stop(r->w->loop, &r->backoff_timer);
        req_give_up(r, RETRY_STOP_DEADLINE);
        r->last_outcome = RETRY_OUT_TIMEOUT;
        answer_final(r);
        break;
    case RS_LAG:
        r->last_outcome = RETRY_OUT_TIMEOUT; /* retrying had stopped: that stop stands */
        answer_final(r);
        break;
    case RS_STREAM:
        tally_grpc(r, -1);
        r->front->ops->end(r->front, NULL, true); /* mid-body: the client must see the truncation */
        break;
    default:
        break;
    }
}

/* The client went away, seen while the core could not have (the front end watches for it: an
 * HTTP/1.1 connection is suspended while the upstream side has the request, or while it waits
 * for more of the response, and libmicrohttpd does not look at a suspended connection's
 * socket). Upstream work for nobody stops: every attempt is cancelled (its slot, and a retry's
 * budget slots, go back) and any wait ends, as nginx stops with its "499". During a backoff wait
 * it is a 499 "client-closed" (counted in requests_total); before the answer started, nothing
 * is counted as answered and the log says 0, as for a client gone at any other moment; once
 * the answer's head has gone, the transfer still sending its body ends, and the front end ends
 * the answer broken (edge_cut_short). */
void retry_req_client_gone(struct retry_req *r)
{
    struct front *f = r->front;
    struct loop *l = r->w->loop;
    if (r->state == RS_HEADERS)
        return;
    if (f->answered) {
        if (r->state == RS_STREAM && race_end_all(r, METRICS_OUT_CANCELLED)) {
            loop_timer_stop(l, &r->deadline_timer);
            edge_cut_short(r);
            f->ops->end(f, NULL, true);
        }
        return;
    }
    bool waiting = r->state == RS_BACKOFF;
    if (waiting)
        req_cut_wait_short(r);
    loop_timer_stop(l, &r->try_timer);
    req_end_retry_in_flight(r);
    race_end_all(r, METRICS_OUT_CANCELLED); /* the current one, and those beside it (hedging) */
    r->state = RS_ANSWERED;
    if (!waiting) {
        f->ops->reset(f, 0);
        return;
    }
    r->stop = RETRY_STOP_CLIENT_CLOSED;
    /* Counted now, as if answered: no response will go out to count it later. */
    f->status = CLIENT_CLOSED_STATUS;
    tally_answer(r);
    f->ops->reset(f, CLIENT_CLOSED_STATUS);
}

/* The drain deadline has come: a request still waiting on the upstream side (an attempt or a
 * backoff) is answered now with its last upstream response, or a 503 "draining", and
 * X-Retry-Stop: draining. An answer that has begun is left to finish, or to be cut short at
 * exit: one whose head the front end has (RS_STREAM), though it may not have sent it yet (an
 * HTTP/1.1 response held a moment to go out whole, proxy/http1/relay.c), as the upstream
 * acts on a request once it answers it. */
static void expire(struct retry_req *r)
{
    if (r->front->answered || r->state == RS_HEADERS || r->state == RS_STREAM || !r->route ||
        r->state == RS_STORE) /* a durable accept: answered by its commit, in a moment */
        return;
    if (r->state == RS_BACKOFF)
        req_cut_wait_short(r);
    loop_timer_stop(r->w->loop, &r->try_timer);
    if (race_end_all(r, METRICS_OUT_CANCELLED) && r->state == RS_DRAIN)
        r->flags &= ~RF_SAVED_WHOLE;
    req_give_up(r, RETRY_STOP_DRAINING);
    if (edge_saved_whole(r))
        answer_saved(r);
    else
        answer_error(r, 503, "draining", "retryproxy is shutting down");
}

void retry_expire_all(struct worker *w)
{
    for (struct retry_req *r = w->reqs, *next; r; r = next) {
        next = r->next;
        expire(r);
    }
}

/* An event from a part that comes later (proxy/core/req.h): the one way back into the machine,
 * a callback it passes down (accept_store()); the parts call nothing of retry.c. */
static void req_event(struct retry_req *r, enum req_event ev, const void *arg)
{
    switch (ev) {
    case REQ_EV_STORED:
        /* STORE -> ANSWERED. The client may have gone meanwhile (answered with a reset), or
         * the worker stopped: what was committed stays committed, and nobody is told. */
        if (!r->front->answered && r->state == RS_STORE &&
            !atomic_load_explicit(&r->w->stop, memory_order_relaxed)) {
            accept_answer(r, arg);
            answered(r);
        }
        break;
    }
}
