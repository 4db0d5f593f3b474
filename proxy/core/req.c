/* req -- what a request has and what is done to it, below the state machine (proxy/core/req.h):
 * its references and its end, an attempt's transfer stopped, a retry's budget slots, and the
 * verdict on an attempt (decide.c's, on what the attempt and the request say). None of these
 * moves the request from one state to another: retry.c does, and edge.c, keep.c, race.c and
 * durable.c do what it asks with these.
 */
#include "proxy/core/req.h"

#include <stdlib.h>
#include <string.h>

#include "policy/retry_after.h"
#include "proxy/base/dlist.h"
#include "proxy/core/eject.h"
#include "proxy/core/runtime.h"
#include "proxy/core/worker.h"
#include "proxy/http/headers.h"

/* ---- life ---- */

/* Where the front end's state starts in the request's allocation. */
#define FRONT_OFFSET                                                                               \
    ((sizeof(struct retry_req) + _Alignof(max_align_t) - 1) & ~(_Alignof(max_align_t) - 1))

struct retry_req *req_new(struct worker *w, const struct front_ops *ops, size_t front_size,
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
    return r;
}

static void req_free(struct retry_req *r)
{
    struct loop *l = r->w->loop;
    r->front->ops->fini(r->front);
    if (r->cur != &r->first)
        req_trial_free(r, r->cur);
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

void req_release(struct retry_req *r)
{
    if (--r->refs == 0)
        req_free(r);
}

void req_trial_free(struct retry_req *r, struct trial *t)
{
    tally_endpoint_free(t);
    attempt_fini(&t->att);
    if (t != &r->first)
        free(t);
}

/* ---- attempts ---- */

/* Attempt 't' goes, given its transfer slot ('wait': how long its answer is waited for, as
 * the fields it sends say; 'left': ms before the deadline). False when it could not be sent (a
 * connect failure: the machine decides on it). */
bool req_launch(struct retry_req *r, struct trial *t, uint64_t wait, uint64_t left)
{
    const struct cfg_route *rt = r->route;
    const struct cfg_upstream *u = trial_upstream(r, t);
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
    req.fields = &r->up.fields;
    req.own = t->fields.own;
    req.n_own = head_up_attempt(&r->up, &t->fields, t->number, wait);
    uint64_t connect =
        rt->connect_timeout_ms && rt->connect_timeout_ms < left ? rt->connect_timeout_ms : left;
    /* a name that resolves to nothing has no endpoint: nothing to connect to */
    bool none = !t->ep && r->rtr->names[u - rt->upstreams];
    if (none || attempt_launch(&t->att, r->rtr->urls[u - rt->upstreams], t->ep ? t->ep->to : NULL,
                               u->base_path, &req, connect) < 0)
        return false;
    r->refs++; /* the transfer's, until its end (attempt_ops.done) or req_stop_transfer() */
    /* a body streamed as it arrives goes at the client's pace: a slow sender must not hold a
     * slot meant for upstream attempts (one streamed once is committed; a gRPC call's kept
     * copy may still go again, and that attempt waits for a slot of its own) */
    if (req.body == ATTEMPT_BODY_STREAM)
        attempt_commit(&t->att);
    return true;
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

/* Bytes of the request body for the upstream: the buffered head, then the streamed rest. */
size_t req_upload(struct attempt *a, char *buf, size_t max)
{
    struct trial *t = a->arg; /* a laggard (hedging) reads on from its own place */
    struct retry_req *r = t->r;
    size_t got = intake_read(&r->body, &t->sent, buf, max);
    if (got) {
        if (ring_space(&r->body.queue) > 0)
            r->front->ops->upload_room(r->front);
        return got;
    }
    return r->flags & RF_BODY_DONE ? 0 : ATTEMPT_PAUSE;
}

/* ---- the verdict on an attempt ---- */

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

/* The drain deadline as it is now (0: not draining), for the decisions that follow. */
void req_see_drain_deadline(struct retry_req *r)
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
    req_see_drain_deadline(r);
    decide_attempt(&r->dr, f, v);
    if (v->stop == RETRY_STOP_THROTTLED)
        metrics_throttled(r->m, r->w->id);
}

/* ---- a retry's budget slots ---- */

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

/* ---- the verdict applied, and the wait ---- */

/* Applies the decision for the attempt that just ended in 'o'. Returns true when a retry was
 * decided (its wait in r->pending_delay): the machine waits (BACKOFF) or reads the response's
 * body first (DRAIN, then req_settle()). */
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
    req_see_drain_deadline(r);
    enum retry_stop stop =
        decide_wait_fits(&r->dr, loop_now(r->w->loop), r->settling.delay_ms, r->deadline_ms);
    if (stop != RETRY_STOP_NONE) {
        req_give_up(r, stop); /* withdraws it, counted as the stop */
        return false;
    }
    r->flags &= ~RF_SETTLE;
    tally_verdict(r, r->cur, RETRY_OUT_STATUS, &r->settling, false);
    return true;
}

/* Retrying ends while it waits on the upstream side (the deadline, the drain deadline): the
 * retry in flight gives its slots back and the stop is counted; the caller answers. */
void req_give_up(struct retry_req *r, enum retry_stop stop)
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

/* Ends a backoff wait before its time; the log keeps the wait as it was taken. The backoff
 * timer runs exactly while the request is in RS_BACKOFF. */
void req_cut_wait_short(struct retry_req *r)
{
    struct loop *l = r->w->loop;
    if (r->n_delays)
        r->delays[r->n_delays - 1] = (uint32_t)(loop_now(l) - r->wait_start_ms);
    loop_timer_stop(l, &r->backoff_timer);
}

/* Whether body bytes arriving now go to an upstream attempt: one is running or about to, or,
 * on a gRPC call, the response streams while the request does too (a bidirectional call). */
bool req_upload_live(const struct retry_req *r)
{
    return r->state == RS_ATTEMPT || r->state == RS_BACKOFF ||
           ((r->flags & RF_GRPC) && intake_streams(&r->body) &&
            (r->state == RS_STREAM || r->state == RS_HOLD || r->state == RS_DRAIN) &&
            attempt_running(&r->cur->att));
}

/* An attempt being started is not made after all, nor counted: no address to send it to, or
 * its delivery's upstream at its bound. */
void req_not_made(struct retry_req *r)
{
    r->attempts--;
    loop_timer_stop(r->w->loop, &r->deadline_timer);
    req_end_retry_in_flight(r); /* a retry's budget slots: it is not made either */
}
