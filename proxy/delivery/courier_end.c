/* courier_end -- a claimed delivery's attempt, admitted by the retry budgets or put back
 * (docs/delivery.md "Retry budgets"); its end: what the store is told (docs/delivery.md "The
 * courier"; the table of ends is at the top of courier.c), and the delivery let go of. This file
 * and courier.c are one state machine, a delivery's (they call each other: its claim and
 * attempt there, its end here, the next tick armed there).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy/backoff.h"
#include "proxy/core/decide.h"
#include "proxy/core/proxy.h"
#include "proxy/core/retry.h"
#include "proxy/core/runtime.h"
#include "proxy/delivery/courier_int.h"
#include "proxy/telemetry/log.h"

/* ---- an attempt's end ---- */

/* How long a delivery whose upstream was at its bound waits before it is claimed again (and its
 * upstream picked anew): about a tick of the courier, so that a storm is paced. */
#define BUSY_RETRY_MS 200

void dlv_uncount(struct dlv *d)
{
    if (d->counted)
        d->cr->up_in_flight[d->up]--;
    d->counted = false;
    if (d->budgeted)
        decide_budgets_release(&d->budgets);
    d->budgeted = false;
}

void dlv_free(struct dlv *d)
{
    struct courier *c = d->c;
    for (struct dlv **p = &c->live; *p; p = &(*p)->next)
        if (*p == d) {
            *p = d->next;
            break;
        }
    d->cr->in_flight--;
    dlv_uncount(d);
    loop_timer_stop(c->w->loop, &d->end_timer);
    rt_unref(d->rt);
    store_delivery_clear(&d->rec);
    store_call_clear(&d->call);
    free(d->head);
    free(d->body);
    free(d->upstream);
    free(d);
}

void dlv_on_written(struct store_call *call)
{
    struct dlv *d = call->arg;
    if (call->result == STORE_ESTALE)
        log_event(CFG_LOG_WARN, "delivery lease lost: its outcome was not written", "id", d->rec.id,
                  "route", d->cr->name, NULL);
    else if (call->result < 0)
        log_event(CFG_LOG_ERROR, "delivery outcome not written", "id", d->rec.id, "route",
                  d->cr->name, LOG_NUM("error", call->result), NULL);
    struct courier *c = d->c;
    dlv_free(d);
    if (!c->stopped)
        courier_arm(c, 0); /* room for the next */
}

/* Whether the answer is one the route's policy would have retried. */
static bool retryable(const struct dlv *d)
{
    if (d->failed || strcmp(d->code, "reset") == 0)
        return true;
    if (strcmp(d->stop, "max-attempts") == 0 || strcmp(d->stop, "body-too-large") == 0)
        return true;
    if (d->ours &&
        (strcmp(d->code, "no_address") == 0 || strcmp(d->code, "throttled") == 0 ||
         strcmp(d->code, "upstream_timeout") == 0 || strcmp(d->code, "upstream_unavailable") == 0 ||
         strcmp(d->code, "internal") == 0))
        return true;
    return d->status == 408 || d->status == 429;
}

/* A store call for its end was handed over (rc 0), or not: then nothing more is written, and
 * its lease runs out (it is attempted again). */
static void handed(struct dlv *d, int rc)
{
    if (rc < 0)
        dlv_free(d);
    else
        d->writing = true;
}

void dlv_release(struct dlv *d)
{
    handed(d, store_reschedule(d->c->store, &d->call, d->rec.id, d->c->owner, NULL,
                               courier_wall_ms()));
}

void dlv_bury(struct dlv *d, enum metrics_dead why, const struct store_attempt *a)
{
    static const char *const reasons[METRICS_DEAD_COUNT] = { "attempts", "age", "final",
                                                             "route_gone", "refused" };
    const char *reason = reasons[why];
    /* a route saying delivery.dead_letter false keeps none: deleted, and said and counted so
     * that nothing goes silently (one whose route is gone is kept: no config says otherwise) */
    const struct cfg_route *rt = courier_route_now(d->c, d->cr);
    bool discard = rt && rt->delivery.mode == CFG_DELIVERY_DURABLE && rt->delivery.dead_letter == 0;
    (discard ? metrics_discarded : metrics_dead_letter)(d->cr->m, d->c->w->id, why);
    if (a)
        metrics_delivery_attempt(d->cr->m, d->c->w->id, METRICS_DELIVERY_DEAD);
    d->dead = (struct store_dead){ .reason = reason,
                                   .head = d->head,
                                   .head_len = d->head_len,
                                   .body = d->body,
                                   .body_len = d->body_len,
                                   .discard = discard };
    if (discard)
        log_event(CFG_LOG_WARN, "delivery discarded", "id", d->rec.id, "route", d->cr->name,
                  "reason", reason, LOG_NUM("attempts", d->rec.attempts + (a != NULL)),
                  LOG_NUM("status", d->status), NULL);
    else
        log_event(CFG_LOG_WARN, "delivery dead", "id", d->rec.id, "route", d->cr->name, "reason",
                  reason, LOG_NUM("attempts", d->rec.attempts + (a != NULL)),
                  LOG_NUM("status", d->status), NULL);
    handed(d, store_bury(d->c->store, &d->call, d->rec.id, d->c->owner, a, &d->dead));
}

/* ---- before the attempt: the retry budgets (docs/delivery.md "Retry budgets") ---- */

/* How often a route's refused re-attempts are logged, at most: a budget that refuses refuses
 * many, and a line for each would flood the log in the outage it guards against. */
#define REFUSED_LOG_MS 1000

/* The budgets refused delivery 'd' its re-attempt ('stop': budget or concurrency): it is no
 * attempt, so nothing is recorded and its count stays; it goes back to scheduled, due after
 * the route's backoff delay for the same retry (a refusal moves no sequence, as a refused
 * retry of the sync path does not), or is buried when its age would run out first. */
static void refused(struct dlv *d, enum retry_stop stop)
{
    struct courier *c = d->c;
    struct croute *cr = d->cr;
    const struct cfg_route *rt = courier_route_now(c, cr);
    uint64_t now = courier_wall_ms();
    metrics_denied(cr->m, c->w->id,
                   stop == RETRY_STOP_BUDGET ? METRICS_DENIED_BUDGET : METRICS_DENIED_CONCURRENCY);
    uint64_t mono = loop_now(c->w->loop);
    cr->refused++;
    if (cr->refused_logged_ms == 0 || mono - cr->refused_logged_ms >= REFUSED_LOG_MS) {
        log_event(CFG_LOG_INFO, "delivery re-attempts refused by the retry budget", "route",
                  cr->name, "reason", retry_stop_name(stop), LOG_NUM("refused", cr->refused), NULL);
        cr->refused = 0;
        cr->refused_logged_ms = mono;
    }
    uint32_t delay =
        backoff_delay(&rt->retry.backoff, d->rec.attempts, d->rec.last_delay_ms, &c->w->rng);
    if (now + delay > d->rec.created_at + rt->delivery.max_age_ms) {
        dlv_bury(d, METRICS_DEAD_AGE, NULL);
        return;
    }
    handed(d, store_reschedule(c->store, &d->call, d->rec.id, c->owner, NULL, now + delay));
}

bool dlv_admit(struct dlv *d)
{
    struct rt *snap = d->rt;
    size_t i = 0;
    while (snap && i < snap->cfg->n_routes && strcmp(snap->cfg->routes[i].name, d->cr->name) != 0)
        i++;
    if (!snap || i == snap->cfg->n_routes || !snap->routes[i].live)
        return true; /* no route to deliver to: the core says so, and it is buried */
    d->budgets = (struct decide_budgets){ .global = &d->c->w->px->budget,
                                          .global_limits = &snap->cfg->budget,
                                          .route = &snap->routes[i].live->budget,
                                          .route_limits = &snap->cfg->routes[i].budget };
    uint64_t now = loop_now(d->c->w->loop);
    /* its first attempt is a request, the ratio's base; every later one a retry, as the sync
     * path counts them (the core counts none of a delivery's: retry.c) */
    if (d->rec.attempts == 0) {
        decide_note_request(&d->budgets, now);
        return true;
    }
    enum retry_stop stop = decide_admit(&d->budgets, now, 0);
    if (stop == RETRY_STOP_NONE) {
        d->budgeted = true; /* its slots go back when its attempt ends (dlv_uncount) */
        return true;
    }
    refused(d, stop);
    return false;
}

/* ---- the attempt's end ---- */

void dlv_on_end(struct loop_timer *t)
{
    struct dlv *d = t->arg;
    struct courier *c = d->c;
    struct front *f = d->f;
    if (f) {
        d->f = NULL;
        ((struct cfront *)(void *)f)->d = NULL;
        const char *up = retry_req_upstream(f->req);
        d->upstream = up ? strdup(up) : NULL; /* out of memory: recorded as none */
        retry_req_completed(f->req);
    }
    dlv_uncount(d);
    /* the drain's deadline cut it: its lease is given back, due now, so that another proxy
     * (or the next start) makes it again at once (courier_stop() gives back those it cuts) */
    if (strcmp(d->stop, "draining") == 0 || strcmp(d->code, "draining") == 0) {
        metrics_delivery_attempt(d->cr->m, c->w->id, METRICS_DELIVERY_INTERRUPTED);
        dlv_release(d);
        return;
    }
    uint64_t now = courier_wall_ms();
    if (d->ours && strcmp(d->code, "upstream_busy") == 0) {
        /* nothing was sent: back to scheduled a little later, with no attempt recorded or
         * counted towards max_attempts, so that deliveries to other upstreams go on */
        handed(d, store_reschedule(c->store, &d->call, d->rec.id, c->owner, NULL,
                                   now + BUSY_RETRY_MS));
        return;
    }
    d->att =
        (struct store_attempt){ .at_ms = d->start_ms,
                                .duration_ms = (uint32_t)(loop_now(c->w->loop) - d->start_mono),
                                .status = d->failed ? 0 : d->status,
                                .upstream = d->upstream };
    bool ok = !d->ours && !d->failed && d->status >= 200 && d->status < 300;
    snprintf(d->att.outcome, sizeof(d->att.outcome), "%s",
             ok           ? "ok"
             : d->code[0] ? d->code
                          : "status");
    const struct cfg_route *rt = courier_route_now(c, d->cr);
    uint32_t n = d->rec.attempts + 1; /* this one's number */
    if (ok) {
        metrics_delivery_attempt(d->cr->m, c->w->id, METRICS_DELIVERY_DELIVERED);
        handed(d, store_complete(c->store, &d->call, d->rec.id, c->owner, &d->att));
        return;
    }
    if (!rt || (d->ours && strcmp(d->code, "no_route") == 0)) {
        dlv_bury(d, METRICS_DEAD_ROUTE_GONE,
                 &d->att); /* no snapshot has its route: nothing to deliver to */
        return;
    }
    if (!retryable(d)) {
        dlv_bury(d, METRICS_DEAD_FINAL, &d->att);
        return;
    }
    if (n >= rt->retry.max_attempts) {
        dlv_bury(d, METRICS_DEAD_ATTEMPTS, &d->att);
        return;
    }
    /* the previous delay as the store kept it: decorrelated goes on from it, not from base_ms */
    uint32_t delay = backoff_delay(&rt->retry.backoff, n, d->rec.last_delay_ms, &c->w->rng);
    if (d->has_retry_after && rt->retry.retry_after_honor)
        delay = (uint32_t)(d->retry_after_ms < rt->retry.retry_after_max_ms
                               ? d->retry_after_ms
                               : rt->retry.retry_after_max_ms);
    if (now + delay > d->rec.created_at + rt->delivery.max_age_ms) {
        dlv_bury(d, METRICS_DEAD_AGE, &d->att);
        return;
    }
    metrics_delivery_attempt(d->cr->m, c->w->id, METRICS_DELIVERY_RESCHEDULED);
    d->att.delay_ms = delay;
    handed(d, store_reschedule(c->store, &d->call, d->rec.id, c->owner, &d->att, now + delay));
}
