/* race -- attempts running beside the current one (proxy/core/req.h; hedging, docs/config.md
 * "retry.hedge_on_per_try_timeout"): the hedge decided at a per-try timeout, the laggards kept
 * in r->others, the first good response winning, and the losers cancelled.
 * The state machine (retry.c) decides when to hedge and what a winner does to the request;
 * this file keeps the attempts as it asks and says what happened.
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

bool race_hedgeable(const struct retry_req *r)
{
    return hedgeable(r, false);
}

/* The current attempt passed per_try_timeout_ms and hedgeable() holds, and 'v' is the verdict
 * on it as a timeout's retry (retry.c hedge()). Taken, 'next' is the current attempt (to wait
 * out its backoff) and the running one a laggard in r->others, keeping the budget slots of the
 * retry it was while the hedge holds its own; refused (counted as a denied retry), 'next' is
 * freed and the running one runs on alone. Returns whether it was taken. */
bool race_hedge(struct retry_req *r, struct trial *next, const struct retry_verdict *v)
{
    struct trial *t = r->cur;
    bool go = v->fired && v->stop == RETRY_STOP_NONE;
    if (go) {
        if (r->flags & RF_IN_FLIGHT) {
            r->flags &= ~RF_IN_FLIGHT;
            t->flags |= TF_SLOT;
        }
        req_hold_slots(r);
    }
    tally_verdict(r, t, RETRY_OUT_TIMEOUT, v, true);
    if (!go) {
        req_trial_free(r, next);
        return false;
    }
    metrics_hedge(r->m, r->w->id);
    DLIST_PUSH(r->others, t);
    r->cur = next;
    return true;
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
        req_trial_free(r, t);
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
        req_trial_free(r, t);
    }
}

/* Every attempt of the request still running (or waiting for a slot) ends now: those beside
 * the current one (hedging) and the current one, each counted as 'o' unless it was already.
 * From the loop or libmicrohttpd's callbacks only, never curl's. Returns true if the current
 * one was running. */
bool race_end_all(struct retry_req *r, enum metrics_outcome o)
{
    race_lose_others(r, o);
    race_reap(r);
    tally_trial(r, r->cur, o);
    return req_stop_transfer(r, r->cur);
}

/* 't', running beside the current attempt, has the answer (race_other_head() said so): it
 * becomes the current attempt, and the one before is out of the race (cancelled in the next
 * turn: this is one of curl's callbacks). */
void race_take(struct retry_req *r, struct trial *t)
{
    DLIST_UNLINK(r->others, t);
    lose(r, r->cur, METRICS_OUT_CANCELLED);
    r->cur = t;
}

/* A response head for 't', an attempt running beside the current one. One retry_on does not
 * name wins; one it names is dropped, unless it is the last there will be (the request waits
 * in RS_LAG for nothing else). A winner is counted here; the machine makes it the answer
 * (race_take()). */
enum race_head race_other_head(struct retry_req *r, struct trial *t)
{
    if (t->flags & TF_LOST)
        return RACE_DROPPED; /* its cancel is on the way */
    const struct attempt *a = &t->att;
    bool failed = retry_match(&r->route->retry, RETRY_OUT_STATUS, a->status, &a->head,
                              req_grpc_status(r, a)) != NULL;
    if (failed && !(r->state == RS_LAG && !race_others_running(r, t))) {
        tally_trial(r, t, tally_outcome(RETRY_OUT_STATUS, a->status));
        tally_log(r, t, RETRY_OUT_STATUS, "dropped", 0);
        lose(r, t, METRICS_OUT_CANCELLED);
        return RACE_DROPPED;
    }
    tally_trial(r, t, tally_outcome(RETRY_OUT_STATUS, a->status));
    req_give_slots_back(r, &t->flags, TF_SLOT);
    if (log_enabled(CFG_LOG_DEBUG)) {
        char stop[32];
        snprintf(stop, sizeof(stop), "stop:%s", retry_stop_name(r->stop));
        tally_log(r, t, RETRY_OUT_STATUS, failed ? stop : "won", 0);
    }
    return failed ? RACE_LAST : RACE_WON;
}

/* 't', running beside the current attempt, has ended: lost already (freed now), or without a
 * response (a failure, counted; the machine answers if the request was waiting for it last). */
void race_other_done(struct retry_req *r, struct trial *t)
{
    DLIST_UNLINK(r->others, t);
    if (!(t->flags & TF_LOST)) {
        enum retry_outcome o = attempt_sent(&t->att) ? RETRY_OUT_RESET : RETRY_OUT_CONNECT_FAILURE;
        tally_trial(r, t, tally_outcome(o, 0));
        req_give_slots_back(r, &t->flags, TF_SLOT);
        tally_log(r, t, o, "dropped", 0);
    }
    req_trial_free(r, t);
}
