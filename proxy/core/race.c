/* race -- attempts running beside the current one (proxy/core/req.h; hedging, docs/config.md
 * "retry.hedge_on_per_try_timeout"): the hedge decided at a per-try timeout, the laggards kept
 * in r->others, the first good response winning, and the losers cancelled.
 * Part of the request's one state machine with retry.c, edge.c and keep.c (proxy/core/req.h).
 */
#include "proxy/core/req.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/base/dlist.h"
#include "proxy/telemetry/log.h"
#include "proxy/core/worker.h"

/* Whether hedging applies to the request: the route hedges, the request may go again (its
 * method), and its body can go twice at once: held whole, or a gRPC call's kept copy once the
 * client's body is complete (each attempt reads it from its own place, struct trial 'sent'); a
 * body streamed once cannot. 'ahead': asked as an attempt starts, when a gRPC call's body may
 * still be on its way (it may be complete by the per-try timeout). */
static bool hedgeable(const struct retry_req *r, bool ahead)
{
    if (!r->route->retry.hedge || !(r->flags & RF_RETRYABLE) || r->body.mode == INTAKE_STREAM ||
        r->upgrade[0]) /* one tunnel: the handshake is never raced */
        return false;
    return r->body.mode != INTAKE_TEE || ahead || (r->flags & RF_BODY_DONE);
}

/* An attempt that may be hedged is not cancelled at its per-try timeout (even when no hedge is
 * allowed then): it is waited for until the deadline, and told so (grpc-timeout, the deadline
 * header), or a server would give up at the per-try timeout on an answer still wanted. */
uint64_t race_attempt_wait(const struct retry_req *r, uint64_t left)
{
    uint64_t per_try = r->route->per_try_timeout_ms;
    return per_try && per_try < left && !hedgeable(r, true) ? per_try : left;
}

/* The current attempt passed per_try_timeout_ms and hedgeable() holds: the next attempt is
 * decided as a timeout's retry would be (max_attempts, the budgets, throttling, the backoff
 * wait), but this one is not cancelled. Taken, the hedge waits out its backoff while this
 * attempt runs on in r->others; refused (and counted as a denied retry), this attempt runs on
 * alone, until the deadline at most. Returns false where hedging does not apply: then the
 * timeout ends the attempt. */
bool race_hedge(struct retry_req *r)
{
    if (!hedgeable(r, false))
        return false;
    struct trial *t = r->cur, *next = malloc(sizeof(*next));
    if (!next)
        return false;
    race_trial_init(r, next);
    /* The running attempt keeps the slots of the retry it was; the hedge asks for its own. */
    if (r->flags & RF_IN_FLIGHT) {
        r->flags &= ~RF_IN_FLIGHT;
        t->flags |= TF_SLOT;
    }
    struct retry_facts f;
    struct retry_verdict v;
    req_judge(r, RETRY_OUT_TIMEOUT, &f, &v);
    bool go = v.fired && v.stop == RETRY_STOP_NONE;
    if (go)
        req_hold_slots(r);
    tally_verdict(r, t, RETRY_OUT_TIMEOUT, &v, true);
    if (!go) {
        race_trial_free(r, next);
        if (t->flags & TF_SLOT) {
            t->flags &= ~TF_SLOT;
            r->flags |= RF_IN_FLIGHT;
        }
        return true;
    }
    metrics_hedge(r->m, r->w->id);
    DLIST_PUSH(r->others, t);
    r->cur = next;
    r->pending_delay = v.delay_ms;
    req_wait_then_retry(r);
    return true;
}

void race_trial_init(struct retry_req *r, struct trial *t)
{
    memset(t, 0, sizeof(*t));
    t->r = r;
    attempt_init(&t->att, &r->w->up, &req_attempt_ops, t);
}

void race_trial_free(struct retry_req *r, struct trial *t)
{
    tally_endpoint_free(t);
    attempt_fini(&t->att);
    if (t != &r->first)
        free(t);
}

/* Whether an attempt other than 'except' (may be NULL) runs on beside the current one. */
bool race_others_running(const struct retry_req *r, const struct trial *except)
{
    for (const struct trial *t = r->others; t; t = t->next)
        if (t != except && !(t->flags & TF_LOST))
            return true;
    return false;
}

static void on_reap(struct loop_timer *lt)
{
    race_reap(lt->arg);
}

/* 't' is out of the race: counted as 'o' unless it was already, its slots given back, and
 * ended: at once when it does not run, else in the next turn (this may run inside one of
 * curl's callbacks, where no transfer may be removed). It joins r->others if it was not there. */
static void lose(struct retry_req *r, struct trial *t, enum metrics_outcome o)
{
    if (t == r->cur)
        DLIST_PUSH(r->others, t); /* the caller has a new current one */
    if (tally_trial(r, t, o) && log_enabled(CFG_LOG_DEBUG))
        tally_log_as(r, t, o == METRICS_OUT_TIMEOUT ? "timeout" : "cancelled", "lost", 0);
    req_give_slots_back(r, &t->flags, TF_SLOT);
    if (!attempt_running(&t->att)) {
        req_stop_transfer(r, t); /* out of the queue for a transfer slot, if it waits there */
        DLIST_UNLINK(r->others, t);
        race_trial_free(r, t);
        return;
    }
    t->flags |= TF_LOST;
    struct loop *l = r->w->loop;
    if (!loop_timer_armed(&r->reap_timer))
        loop_timer_start(l, &r->reap_timer, loop_now(l), on_reap, r);
}

void race_lose_others(struct retry_req *r, enum metrics_outcome o)
{
    for (struct trial *t = r->others, *next; t; t = next) {
        next = t->next;
        if (!(t->flags & TF_LOST))
            lose(r, t, o);
    }
}

/* Ends the lost attempts' transfers now (from the loop, or libmicrohttpd's callbacks). Each
 * drops the reference its transfer held, never the last: the connection holds one. */
void race_reap(struct retry_req *r)
{
    loop_timer_stop(r->w->loop, &r->reap_timer);
    for (struct trial *t = r->others, *next; t; t = next) {
        next = t->next;
        if (!(t->flags & TF_LOST))
            continue;
        DLIST_UNLINK(r->others, t);
        req_stop_transfer(r, t);
        race_trial_free(r, t);
    }
}

/* Retrying has stopped on the current attempt: the answer is made now, unless attempts still
 * run beside it, which may yet bring a better one. */
void race_wait(struct retry_req *r)
{
    if (race_others_running(r, NULL))
        r->state = RS_LAG;
    else
        edge_final(r);
}

/* 't', running beside the current attempt, has the answer: its response retry_on does not
 * name ('failed' false), or the last failure there is to return. It becomes the current
 * attempt and streams; whatever else runs is cancelled (in the next turn: this is one of
 * curl's callbacks). */
static void win(struct retry_req *r, struct trial *t, bool failed)
{
    tally_trial(r, t, tally_outcome(RETRY_OUT_STATUS, t->att.status));
    req_give_slots_back(r, &t->flags, TF_SLOT);
    if (log_enabled(CFG_LOG_DEBUG)) {
        char stop[32];
        snprintf(stop, sizeof(stop), "stop:%s", retry_stop_name(r->stop));
        tally_log(r, t, RETRY_OUT_STATUS, failed ? stop : "won", 0);
    }
    if (r->state == RS_BACKOFF) {
        req_cut_wait_short(r);
        r->front->ops->unwatch(r->front);
    }
    loop_timer_stop(r->w->loop, &r->try_timer);
    req_end_retry_in_flight(r); /* the current attempt's, or the one it waited to make */
    r->flags &= ~RF_SETTLE;     /* a retry decided on a body being read is not made, nor refused */
    DLIST_UNLINK(r->others, t);
    lose(r, r->cur, METRICS_OUT_CANCELLED);
    r->cur = t;
    if (!failed) {
        r->stop = RETRY_STOP_NONE;
        r->flags |= RF_SUCCEEDED;
        decide_note_final(&r->dr, loop_now(r->w->loop));
    }
    edge_stream(r);
}

/* A response head for 't', an attempt running beside the current one. A response retry_on
 * names is dropped, unless it is the last there will be. */
void race_other_head(struct retry_req *r, struct trial *t)
{
    if (t->flags & TF_LOST)
        return; /* its cancel is on the way */
    const struct attempt *a = &t->att;
    bool failed = retry_match(&r->route->retry, RETRY_OUT_STATUS, a->status, &a->head,
                              req_grpc_status(r, a)) != NULL;
    if (!failed) {
        win(r, t, false);
        return;
    }
    if (r->state == RS_LAG && !race_others_running(r, t)) {
        win(r, t, true);
        return;
    }
    tally_trial(r, t, tally_outcome(RETRY_OUT_STATUS, a->status));
    tally_log(r, t, RETRY_OUT_STATUS, "dropped", 0);
    lose(r, t, METRICS_OUT_CANCELLED);
}

/* 't', running beside the current attempt, has ended: lost already (freed now), or without a
 * response (a failure, counted; the answer is made if the request was waiting for it last). */
void race_other_done(struct retry_req *r, struct trial *t)
{
    DLIST_UNLINK(r->others, t);
    if (!(t->flags & TF_LOST)) {
        enum retry_outcome o = attempt_sent(&t->att) ? RETRY_OUT_RESET : RETRY_OUT_CONNECT_FAILURE;
        tally_trial(r, t, tally_outcome(o, 0));
        req_give_slots_back(r, &t->flags, TF_SLOT);
        tally_log(r, t, o, "dropped", 0);
    }
    race_trial_free(r, t);
    if (r->state == RS_LAG && !race_others_running(r, NULL))
        edge_final(r);
}
