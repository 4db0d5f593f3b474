/* retry -- the request state machine (proxy/core/retry.h).
 *
 *   HEADERS --begin()--> BODY --body complete--> ATTEMPT --head, final--> STREAM --> done
 *                         |   (a body too large      |  |
 *                         |    to replay starts      |  +--head, retry--> DRAIN --body read--+
 *                         |    ATTEMPT at once)      |                                        |
 *                         |                          +--no head, retry--> BACKOFF <-----------+
 *                         |                                                  |
 *                         |                          ATTEMPT <--timer--------+
 *                         +--an answer of our own (400, 404, 405, 413)--> ANSWERED
 *
 * Retrying stops (ANSWERED, with the saved response or an error of our own) when decide_attempt()
 * says so, at the deadline, when draining ends, or when the client goes away during a wait.
 * A request is referenced by its connection, by a running transfer and by a streamed
 * response's body reader; the last to let go frees it.
 *
 * Hedging (retry.hedge_on_per_try_timeout): an attempt that passes per_try_timeout_ms is not
 * cancelled. The next attempt is decided as a timeout's retry (BACKOFF, then ATTEMPT), and the
 * slow one runs on in r->others, a laggard. The first response retry_on does not name wins,
 * from any of them: a laggard's becomes the current attempt and streams, and every other
 * attempt is cancelled. When retrying stops with laggards still running, the request waits
 * for them (LAG) instead of answering.
 *
 * retry.c, edge.c, keep.c and race.c are one state machine, split by concern (proxy/core/req.h):
 * they call each other, and nothing outside the core calls them but through proxy/core/retry.h.
 */
#include "proxy/core/retry.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "policy/retry_after.h"
#include "proxy/upstream/attempt.h"
#include "proxy/core/balance.h"
#include "proxy/core/decide.h"
#include "proxy/base/dlist.h"
#include "proxy/core/eject.h"
#include "proxy/http/grpc.h"
#include "proxy/http/head.h"
#include "proxy/http/headers.h"
#include "proxy/core/intake.h"
#include "proxy/telemetry/log.h"
#include "proxy/telemetry/metrics.h"
#include "proxy/core/req.h"
#include "proxy/core/runtime.h"
#include "proxy/core/worker.h"

/* How much of a body over limits.max_body_bytes is read (and dropped) so that the 413 can be
 * sent; libmicrohttpd answers only once the body is complete. Past this the connection is
 * closed instead: a client may not hold it with an endless body. */
#define DISCARD_MAX (1024 * 1024)

static size_t take_body(struct retry_req *r, const char *data, size_t n);
static void give_up(struct retry_req *r, enum retry_stop stop);
static void on_deadline(struct loop_timer *t);
static void on_try_timeout(struct loop_timer *t);

static struct trial *of_attempt(struct attempt *a)
{
    return a->arg;
}

/* ---- life ---- */

/* Where the front end's state starts in the request's allocation. */
#define FRONT_OFFSET                                                                               \
    ((sizeof(struct retry_req) + _Alignof(max_align_t) - 1) & ~(_Alignof(max_align_t) - 1))

struct front *retry_req_new(struct worker *w, const struct front_ops *ops, size_t front_size,
                            enum front_proto proto, const char *raw_target, const char *peer,
                            unsigned peer_port, enum refusal refused)
{
    struct retry_req *r = calloc(1, FRONT_OFFSET + front_size);
    if (!r)
        return NULL;
    r->target = strdup(raw_target);
    if (!r->target) {
        free(r);
        return NULL;
    }
    r->w = w;
    r->peer = peer;
    r->peer_port = peer_port;
    r->refused = refused;
    r->refs = 1;
    worker_refresh(w);
    r->rt = rt_ref(w->rt);
    r->cfg = r->rt->cfg;
    r->m = r->rt->no_route;
    r->start_us = loop_clock_us(w->loop);
    r->start_unix_ms = (int64_t)req_wall_ms();
    struct intake_pool pool = { &w->px->body_bytes, r->cfg->max_buffered_body_bytes,
                                &w->body_freed };
    intake_init(&r->body, &pool);
    race_trial_init(r, &r->first);
    r->cur = &r->first;
    r->front = (struct front *)(void *)((char *)r + FRONT_OFFSET);
    r->front->ops = ops;
    r->front->req = r;
    r->front->proto = proto;
    DLIST_PUSH(w->reqs, r);
    /* written by this worker only; read by the control thread while draining */
    atomic_store_explicit(&w->requests,
                          atomic_load_explicit(&w->requests, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    return r->front;
}

static void req_free(struct retry_req *r)
{
    struct loop *l = r->w->loop;
    r->front->ops->fini(r->front);
    if (r->cur != &r->first)
        race_trial_free(r, r->cur);
    tally_endpoint_free(&r->first);
    attempt_fini(&r->first.att); /* r->others is empty: each held a reference */
    loop_timer_stop(l, &r->reap_timer);
    loop_timer_stop(l, &r->try_timer);
    loop_timer_stop(l, &r->deadline_timer);
    loop_timer_stop(l, &r->backoff_timer);
    head_up_free(&r->up);
    intake_fini(&r->body);
    hlist_free(&r->trailers);
    free(r->target);
    free(r->user_agent);
    hlist_free(&r->saved.h);
    hlist_free(&r->saved.trailers);
    free(r->saved.body);
    free(r->held.body);
    free(r->delays);
    free(r->dl_tries);
    choose_tried_free(&r->tried);
    rt_unref(r->rt);
    DLIST_UNLINK(r->w->reqs, r);
    atomic_store_explicit(&r->w->requests,
                          atomic_load_explicit(&r->w->requests, memory_order_relaxed) - 1,
                          memory_order_relaxed);
    free(r);
}

static void req_release(struct retry_req *r)
{
    if (--r->refs == 0)
        req_free(r);
}

/* ---- the client side: the front end's calls ---- */

void retry_req_head(struct retry_req *r, const char *method)
{
    if (r->state == RS_HEADERS)
        edge_begin(r, method);
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

void retry_req_end(struct retry_req *r)
{
    if (r->flags & RF_BODY_DONE)
        return;
    r->flags |= RF_BODY_DONE;
    attempt_resume_upload(&r->cur->att); /* the end of a streamed body */
    if (r->state == RS_BODY && (r->flags & RF_DURABLE))
        accept_store(r); /* stored, not forwarded */
    else if (r->state == RS_BODY)
        req_start_attempt(r);
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
    if (req_end_attempts(r, METRICS_OUT_CANCELLED) && r->state == RS_STREAM)
        edge_cut_short(r);
    tally_grpc(r, GRPC_CANCELLED); /* the client side ended before an answer ended the call */
    tally_done(r);
    r->peer = NULL;
    req_release(r);
}

void retry_req_hold(struct retry_req *r)
{
    r->refs++;
}

void retry_req_release(struct retry_req *r)
{
    req_release(r);
}

bool retry_req_pause(struct retry_req *r)
{
    return attempt_pause_body(&r->cur->att);
}

void retry_req_room(struct retry_req *r)
{
    attempt_resume_body(&r->cur->att);
}

void retry_req_sending(struct retry_req *r)
{
    tally_answer(r);
}

/* ---- the body ---- */

/* Whether body bytes arriving now go to an upstream attempt: one is running or about to, or,
 * on a gRPC call, the response streams while the request does too (a bidirectional call). */
static bool upload_live(const struct retry_req *r)
{
    return r->state == RS_ATTEMPT || r->state == RS_BACKOFF ||
           ((r->flags & RF_GRPC) && intake_streams(&r->body) &&
            (r->state == RS_STREAM || r->state == RS_HOLD || r->state == RS_DRAIN) &&
            attempt_running(&r->cur->att));
}

/* Body bytes from the client. Returns the bytes consumed. */
static size_t take_body(struct retry_req *r, const char *data, size_t n)
{
    struct intake *in = &r->body;
    if (r->front->answered && !upload_live(r)) {
        /* Answered already (413, or the upstream answered before the whole body came): the
         * rest is dropped until the front end lets the answer go out. A bidirectional gRPC
         * call's upload goes on while its response streams (upload_live()). */
        r->discarded += n;
        if ((r->flags & RF_OVER_LIMIT) && r->discarded > DISCARD_MAX)
            r->flags |= RF_CLOSE_NOW;
        return n;
    }
    if (in->total + n > r->cfg->max_body_bytes) {
        struct loop *l = r->w->loop;
        loop_timer_stop(l, &r->backoff_timer);
        loop_timer_stop(l, &r->try_timer);
        req_end_attempts(r, METRICS_OUT_CANCELLED);
        r->flags |= RF_OVER_LIMIT;
        r->discarded = n;
        edge_error(r, 413, "body_too_large",
                   "the request body is larger than limits.max_body_bytes");
        return n;
    }
    bool live = upload_live(r);
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
                return n;
            }
            if (!tee)
                req_start_attempt(r); /* it streams now, what was buffered first */
            live = upload_live(r);
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

/* The next attempt: to one of the route's endpoints (proxy/core/balance.h), preferring one this
 * request has not tried. The worker's turns belong to its current snapshot; a request that
 * started under an older one (a reload since) starts anywhere. */
void req_start_attempt(struct retry_req *r)
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
        edge_error(r, 503, "throttled",
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
    if (!e && edge_no_address(r))
        return; /* no address for any name of the route: answered, no attempt, no wait */
    if (r->front->ops->attempting && !r->front->ops->attempting(r->front, e ? e->k : 0)) {
        endpoint_unref(e);
        edge_busy(r);
        return; /* a stored delivery whose upstream is at its bound: put back, not sent */
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

/* The current attempt, given a transfer slot. */
static void attempt_go(struct attempt *a)
{
    struct trial *t = of_attempt(a);
    struct retry_req *r = t->r;
    struct loop *l = r->w->loop;
    const struct cfg_route *rt = r->route;
    const struct cfg_upstream *u = trial_upstream(r, t);
    uint64_t now = loop_now(l);
    t->flags |= TF_LAUNCHED;
    struct attempt_req req = { .method = r->method,
                               .target = r->target,
                               .body_buf = r->body.body,
                               .body_len = r->body.len,
                               .content_length = r->body.content_length,
                               .trailers = &r->trailers,
                               .upgrade = r->upgrade[0] ? r->upgrade : NULL };
    req.body = r->body.mode == INTAKE_BUFFER ? ATTEMPT_BODY_BUFFER
               : intake_streams(&r->body)    ? ATTEMPT_BODY_STREAM
                                             : ATTEMPT_BODY_NONE;
    uint64_t left = r->deadline_ms > now ? r->deadline_ms - now : 1;
    /* how long this attempt's answer is waited for (grpc-timeout, the deadline header) */
    req.fields = &r->up.fields;
    req.own = t->fields.own;
    req.n_own = head_up_attempt(&r->up, &t->fields, t->number, race_attempt_wait(r, left));
    uint64_t connect =
        rt->connect_timeout_ms && rt->connect_timeout_ms < left ? rt->connect_timeout_ms : left;
    /* a name that resolves to nothing has no endpoint: nothing to connect to */
    bool none = !t->ep && r->rtr->names[u - rt->upstreams];
    if (none || attempt_launch(a, r->rtr->urls[u - rt->upstreams], t->ep ? t->ep->to : NULL,
                               u->base_path, &req, connect) < 0) {
        req_attempt_failed(r, RETRY_OUT_CONNECT_FAILURE);
        return;
    }
    r->refs++; /* the transfer's, until attempt_done() or req_stop_transfer() */
    /* a body streamed as it arrives goes at the client's pace: a slow sender must not hold a
     * slot meant for upstream attempts (one streamed once is committed; a gRPC call's kept
     * copy may still go again, and that attempt waits for a slot of its own) */
    if (req.body == ATTEMPT_BODY_STREAM)
        attempt_commit(a);
    if (rt->per_try_timeout_ms && now + rt->per_try_timeout_ms < r->deadline_ms)
        loop_timer_start(l, &r->try_timer, now + rt->per_try_timeout_ms, on_try_timeout, r);
}

/* Ends the transfer of 't', one of the request's attempts, whether it runs or still waits for a
 * slot, without its end being reported: the one place that cancels one and drops its reference
 * (never the last: the connection, or the body reader, holds one). Returns true if it was
 * running. */
bool req_stop_transfer(struct retry_req *r, struct trial *t)
{
    tally_endpoint_out(t);
    if (!attempt_cancel(&t->att))
        return false;
    r->refs--;
    return true;
}

/* Every attempt of the request still running (or waiting for a slot) ends now: those beside
 * the current one (hedging) and the current one, each counted as 'o' unless it was already.
 * From the loop or libmicrohttpd's callbacks only, never curl's. Returns true if the current
 * one was running. */
bool req_end_attempts(struct retry_req *r, enum metrics_outcome o)
{
    race_lose_others(r, o);
    race_reap(r);
    tally_trial(r, r->cur, o);
    return req_stop_transfer(r, r->cur);
}

/* The Retry-After of the response, if it holds exactly one valid value. */
static bool retry_after_of(const struct hlist *h, uint64_t *ms)
{
    const char *vals[2];
    size_t lens[2];
    size_t n = hlist_values(h, "Retry-After", vals, lens, 2);
    return retry_after_parse_fields(vals, lens, n > 2 ? 2 : n, (int64_t)req_wall_ms(), ms) == 0;
}

/* The route's pushback header on the response (gRPC's grpc-retry-pushback-ms): a whole number
 * of milliseconds is the next wait; anything else, or the field twice, refuses the retry. */
static void pushback_of(const char *name, const struct hlist *h, struct retry_facts *f)
{
    const char *v;
    size_t n = name ? hlist_values(h, name, &v, NULL, 1) : 0;
    if (!n)
        return;
    int64_t ms = n == 1 ? hdr_value_uint(v, strlen(v)) : -1;
    f->has_pushback = true;
    f->pushback_stops = ms < 0;
    f->pushback_ms = ms < 0 ? 0 : (uint64_t)ms;
}

/* The attempt's response head is in. */
static void attempt_head(struct attempt *a)
{
    struct trial *t = of_attempt(a);
    struct retry_req *r = t->r;
    if (t != r->cur) {
        race_other_head(r, t);
        return;
    }
    loop_timer_stop(r->w->loop, &r->try_timer);
    if (!keep_hold(r, a))
        keep_head(r, a);
}

static size_t attempt_body(struct attempt *a, const char *p, size_t n)
{
    struct trial *t = of_attempt(a);
    struct retry_req *r = t->r;
    if (t != r->cur)
        return 0; /* a lost attempt's: stop it (one running on has had no head yet) */
    if (r->state == RS_STREAM) {
        size_t took = r->front->ops->body(r->front, p, n);
        return took == FRONT_FULL ? ATTEMPT_PAUSE : took;
    }
    return keep_body(r, a, p, n);
}

/* Bytes of the request body for the upstream: the buffered head, then the streamed rest. */
static size_t attempt_upload(struct attempt *a, char *buf, size_t max)
{
    struct trial *t = of_attempt(a); /* a laggard (hedging) reads on from its own place */
    struct retry_req *r = t->r;
    size_t got = intake_read(&r->body, &t->sent, buf, max);
    if (got) {
        if (ring_space(&r->body.queue) > 0)
            r->front->ops->upload_room(r->front);
        return got;
    }
    return r->flags & RF_BODY_DONE ? 0 : ATTEMPT_PAUSE;
}

static void attempt_done(struct attempt *a, enum attempt_end end)
{
    struct trial *t = of_attempt(a);
    struct retry_req *r = t->r;
    tally_endpoint_out(t); /* its transfer is over, whatever follows */
    if (t != r->cur) {
        race_other_done(r, t);
        req_release(r);
        return;
    }
    loop_timer_stop(r->w->loop, &r->try_timer);
    switch (r->state) {
    case RS_ATTEMPT:
        /* No head: if nothing was sent, nothing reached the upstream, whatever the error; one
         * it refused unprocessed is a reset that may go again (judge()) */
        req_attempt_failed(r, attempt_sent(a) || a->unprocessed ? RETRY_OUT_RESET
                                                                : RETRY_OUT_CONNECT_FAILURE);
        break;
    case RS_DRAIN:
    case RS_HOLD:
        keep_done(r, a, end);
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

const struct attempt_ops req_attempt_ops = { .go = attempt_go,
                                             .head = attempt_head,
                                             .body = attempt_body,
                                             .upload = attempt_upload,
                                             .done = attempt_done };

/* An attempt ended without a response head. */
void req_attempt_failed(struct retry_req *r, enum retry_outcome o)
{
    r->cur->att.status = 0;
    if (req_decide(r, o))
        req_wait_then_retry(r);
    else
        race_wait(r);
}

/* ---- deciding and waiting ---- */

/* The drain deadline as it is now (0: not draining), for the decisions that follow. */
static void see_drain_deadline(struct retry_req *r)
{
    r->dr.budgets.drain_deadline_ms =
        atomic_load_explicit(&r->w->px->drain_deadline_ms, memory_order_relaxed);
}

int req_grpc_status(const struct retry_req *r, const struct attempt *a)
{
    if (!(r->flags & RF_GRPC))
        return -1;
    return grpc_status_seen(a->status, &a->head, &a->trailers);
}

/* What is known of the current attempt, ended in 'o' (or, hedging, past its per-try timeout),
 * and the verdict on it: the policy, the budgets, the drain deadline. */
void req_judge(struct retry_req *r, enum retry_outcome o, struct retry_facts *f,
               struct retry_verdict *v)
{
    const struct attempt *a = &r->cur->att;
    *f = (struct retry_facts){
        .outcome = o,
        .status = o == RETRY_OUT_STATUS ? a->status : 0,
        .method_retryable = r->flags & RF_RETRYABLE,
        .unprocessed = o == RETRY_OUT_RESET && a->unprocessed,
        .body_replayable = intake_replayable(&r->body),
        .attempts = r->attempts,
        .max_attempts = r->max_attempts,
        .now_ms = loop_now(r->w->loop),
        .deadline_ms = r->deadline_ms,
    };
    f->grpc_status = o == RETRY_OUT_STATUS ? req_grpc_status(r, a) : -1;
    if (o == RETRY_OUT_STATUS) {
        f->head = &a->head;
        f->has_retry_after = retry_after_of(&a->head, &f->retry_after_ms);
        /* a gRPC call's pushback is gRPC's own field unless the route names another; a
         * server may send it with the status, in the trailers */
        const char *pushback = r->route->retry.pushback_header;
        if (!pushback && (r->flags & RF_GRPC))
            pushback = "grpc-retry-pushback-ms";
        pushback_of(pushback, &a->head, f);
        if (!f->has_pushback)
            pushback_of(pushback, &a->trailers, f);
    }
    if (!(r->cur->flags & TF_RECORDED)) {
        r->cur->flags |= TF_RECORDED;
        eject_record(r->route, r->cur->ep, o, f->status, f->head, f->grpc_status,
                     loop_clock_us(r->w->loop) - r->cur->start_us, f->now_ms, &r->w->rng);
    }
    see_drain_deadline(r);
    decide_attempt(&r->dr, f, v);
    if (v->stop == RETRY_STOP_THROTTLED)
        metrics_throttled(r->m, r->w->id);
}

/* Applies the decision for the attempt that just ended. Returns true when a retry was
 * scheduled (its wait in r->pending_delay). */
bool req_decide(struct retry_req *r, enum retry_outcome o)
{
    r->last_outcome = o;
    /* the attempt that just ended gives its slots back before a new retry asks for them */
    req_end_retry_in_flight(r);
    struct retry_facts f;
    struct retry_verdict v;
    req_judge(r, o, &f, &v);
    r->stop = v.fired ? v.stop : RETRY_STOP_NONE;
    r->flags &= ~RF_SUCCEEDED;
    if (o == RETRY_OUT_STATUS && !v.fired)
        r->flags |= RF_SUCCEEDED;
    bool retry = v.fired && v.stop == RETRY_STOP_NONE;
    if (retry)
        r->pending_delay = v.delay_ms;
    if (v.stop == RETRY_STOP_THROTTLED) {
        r->flags |= RF_THROTTLED;
        r->throttle_p = v.throttle_p;
    }
    tally_trial(r, r->cur, tally_outcome(o, f.status));
    if (retry)
        req_hold_slots(r);
    if (retry && o == RETRY_OUT_STATUS) {
        /* its body is read first: the retry is counted when its wait can start (req_settle()) */
        r->settling = v;
        r->flags |= RF_SETTLE;
    } else {
        tally_verdict(r, r->cur, o, &v, false);
    }
    return retry;
}

/* The body of the response a retry was decided on has been read, or given up on (too large
 * to keep, broken off): the wait starts now, so it must still end before the deadline and the
 * drain deadline (docs/backoff.md). The verdict is counted once, as a retry or as the stop
 * that withdraws it. Returns true to wait and retry. */
bool req_settle(struct retry_req *r)
{
    see_drain_deadline(r);
    enum retry_stop stop =
        decide_wait_fits(&r->dr, loop_now(r->w->loop), r->settling.delay_ms, r->deadline_ms);
    if (stop != RETRY_STOP_NONE) {
        give_up(r, stop); /* withdraws it, counted as the stop */
        return false;
    }
    r->flags &= ~RF_SETTLE;
    tally_verdict(r, r->cur, RETRY_OUT_STATUS, &r->settling, false);
    return true;
}

/* A retry's budget slots go back (its attempt ended, or the request did first): 'bit' of
 * '*flags' says they are held. The gauge goes down before the slots are freed (and up only
 * after they are taken), so a scrape never sees more retries in flight than the cap allows. */
void req_give_slots_back(struct retry_req *r, unsigned *flags, unsigned bit)
{
    if (*flags & bit) {
        *flags &= ~bit;
        metrics_retries_in_flight_add(r->w->px->metrics, -1);
        decide_release(&r->dr);
    }
}

/* A retry that decide_attempt() took holds its budget slots until its attempt ends, or until
 * the request ends before that attempt could (deadline, client gone). */
void req_hold_slots(struct retry_req *r)
{
    metrics_retries_in_flight_add(r->w->px->metrics, 1);
    r->flags |= RF_IN_FLIGHT;
}

void req_end_retry_in_flight(struct retry_req *r)
{
    req_give_slots_back(r, &r->flags, RF_IN_FLIGHT);
}

static void on_backoff(struct loop_timer *t)
{
    struct retry_req *r = t->arg;
    r->front->ops->unwatch(r->front);
    req_start_attempt(r);
}

void req_wait_then_retry(struct retry_req *r)
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

/* Ends a backoff wait before its time; the log keeps the wait as it was taken. The backoff
 * timer runs exactly while the request is in RS_BACKOFF. */
void req_cut_wait_short(struct retry_req *r)
{
    struct loop *l = r->w->loop;
    if (r->n_delays)
        r->delays[r->n_delays - 1] = (uint32_t)(loop_now(l) - r->wait_start_ms);
    loop_timer_stop(l, &r->backoff_timer);
}

/* ---- timers ---- */

static void on_try_timeout(struct loop_timer *t)
{
    struct retry_req *r = t->arg;
    if (r->state != RS_ATTEMPT || !attempt_running(&r->cur->att) || race_hedge(r))
        return;
    req_stop_transfer(r, r->cur);
    req_attempt_failed(r, RETRY_OUT_TIMEOUT);
}

/* Retrying ends while it waits on the upstream side (the deadline, the drain deadline): the
 * retry in flight gives its slots back and the stop is counted; the caller answers. */
static void give_up(struct retry_req *r, enum retry_stop stop)
{
    req_end_retry_in_flight(r);
    r->stop = stop;
    if (r->flags & RF_SETTLE) {
        /* the retry decided on the response whose body is read (req_settle()) is withdrawn,
         * counted as the stop */
        r->flags &= ~RF_SETTLE;
        r->settling.stop = stop;
        tally_verdict(r, r->cur, RETRY_OUT_STATUS, &r->settling, false);
    } else {
        tally_stop(r, stop);
    }
}

static void on_deadline(struct loop_timer *t)
{
    struct retry_req *r = t->arg;
    bool running = req_end_attempts(r, METRICS_OUT_TIMEOUT); /* none answered in time */
    loop_timer_stop(r->w->loop, &r->try_timer);
    switch (r->state) {
    case RS_ATTEMPT:
    case RS_HOLD:
        req_attempt_failed(r, RETRY_OUT_TIMEOUT); /* req_decide() sees the deadline: no retry */
        break;
    case RS_DRAIN:
        if (running)
            r->flags &= ~RF_SAVED_WHOLE; /* cut off mid-body: never returned as complete */
        /* fall through */
    case RS_BACKOFF:
        loop_timer_stop(r->w->loop, &r->backoff_timer);
        give_up(r, RETRY_STOP_DEADLINE);
        r->last_outcome = RETRY_OUT_TIMEOUT;
        edge_final(r);
        break;
    case RS_LAG:
        r->last_outcome = RETRY_OUT_TIMEOUT; /* retrying had stopped: that stop stands */
        edge_final(r);
        break;
    case RS_STREAM:
        tally_grpc(r, -1);
        r->front->ops->end(r->front, NULL, true); /* mid-body: the client must see the truncation */
        break;
    default:
        break;
    }
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
    if (req_end_attempts(r, METRICS_OUT_CANCELLED) && r->state == RS_DRAIN)
        r->flags &= ~RF_SAVED_WHOLE;
    give_up(r, RETRY_STOP_DRAINING);
    if (edge_saved_whole(r))
        edge_saved(r);
    else
        edge_error(r, 503, "draining", "retryproxy is shutting down");
}

void retry_expire_all(struct worker *w)
{
    for (struct retry_req *r = w->reqs, *next; r; r = next) {
        next = r->next;
        expire(r);
    }
}
