/* tally -- what a request leaves behind (proxy/core/req.h): its attempts, retries, denials and
 * answer in the metrics (docs/metrics.md), and its log lines (docs/logs.md).
 */
#include "proxy/core/req.h"

#include <stdio.h>
#include <stdlib.h>

#include "proxy/core/balance.h"
#include "proxy/http/head.h"
#include "proxy/telemetry/log.h"
#include "proxy/core/runtime.h"
#include "proxy/core/worker.h"
#include "proxy/store/store.h"

enum metrics_outcome tally_outcome(enum retry_outcome o, int status)
{
    switch (o) {
    case RETRY_OUT_CONNECT_FAILURE:
        return METRICS_OUT_CONNECT_FAILURE;
    case RETRY_OUT_RESET:
        return METRICS_OUT_RESET;
    case RETRY_OUT_TIMEOUT:
        return METRICS_OUT_TIMEOUT;
    case RETRY_OUT_STATUS:
        break;
    }
    return status >= 500   ? METRICS_OUT_5XX
           : status >= 400 ? METRICS_OUT_4XX
           : status >= 300 ? METRICS_OUT_3XX
           : status >= 200 ? METRICS_OUT_2XX
                           : METRICS_OUT_1XX;
}

_Static_assert(RETRY_STOP_DRAINING - 1 == METRICS_DENIED_DRAINING &&
                   RETRY_STOP_MAX_ATTEMPTS - 1 == METRICS_DENIED_MAX_ATTEMPTS &&
                   RETRY_STOP_PUSHBACK - 1 == METRICS_DENIED_PUSHBACK &&
                   RETRY_STOP_THROTTLED - 1 == METRICS_DENIED_THROTTLED &&
                   RETRY_STOP_CLIENT_CLOSED - 1 == METRICS_DENIED_COUNT,
               "retries_denied_total reasons follow enum retry_stop");

/* Counts a stop: a retry that retry_on asked for but that was not made. */
void tally_stop(struct retry_req *r, enum retry_stop stop)
{
    if (stop != RETRY_STOP_NONE)
        metrics_denied(r->m, r->w->id, (enum metrics_denied)(stop - 1));
}

/* An attempt counts in its endpoint's requests in flight (what least_request compares and
 * /upstreams shows, docs/admin.md) from its pick until its transfer ends, whatever follows its
 * head: attempt_done() (complete or broken, a laggard's too), req_stop_transfer() (cancelled: the
 * deadline, a per-try timeout, the client gone, a hedge lost, draining), tally_trial() for one
 * that never ran, and tally_endpoint_free() when the trial lets go, for any other. TF_IN_FLIGHT
 * makes it leave once. */
void tally_endpoint_in(struct trial *t, struct endpoint *e)
{
    t->ep = e;
    if (e) {
        t->flags |= TF_IN_FLIGHT;
        atomic_fetch_add_explicit(&e->le->in_flight, 1, memory_order_relaxed);
    }
}

void tally_endpoint_out(struct trial *t)
{
    if (t->flags & TF_IN_FLIGHT) {
        t->flags &= ~TF_IN_FLIGHT;
        atomic_fetch_sub_explicit(&t->ep->le->in_flight, 1, memory_order_relaxed);
    }
}

void tally_endpoint_free(struct trial *t)
{
    tally_endpoint_out(t);
    endpoint_unref(t->ep);
    t->ep = NULL;
}

/* Counts attempt 't' in attempts_total and attempt_duration_seconds, once, if it went: true if
 * it was counted now. An attempt that never ran (it could not start) is out of its endpoint's
 * requests in flight now; one that runs (its response head is in, its body streams or is read)
 * stays in until its transfer ends (attempt_done(), req_stop_transfer()). */
bool tally_trial(struct retry_req *r, struct trial *t, enum metrics_outcome o)
{
    if (!attempt_running(&t->att))
        tally_endpoint_out(t);
    if ((t->flags & (TF_LAUNCHED | TF_COUNTED)) != TF_LAUNCHED)
        return false;
    t->flags |= TF_COUNTED;
    struct worker *w = r->w;
    /* the upstream's series by its index in the route, found when the snapshot was made */
    metrics_attempt(r->rtr->targets[t->ep ? t->ep->k : 0], w->id, o,
                    (double)(loop_clock_us(w->loop) - t->start_us) / 1e6);
    if (r->route->delivery.dead_letter > 0) /* the one test other routes pay */
        tally_dead_letter_try(r, t, o);
    return true;
}

/* An attempt as a dead letter keeps it (durable_answered() stores them). Only a synchronous
 * route's own requests are recorded (a delivery's attempt is the courier's), in an array made at
 * the first attempt's end, as long as max_attempts: a hedged request's attempts count among
 * them too, so no more ever come. */
void tally_dead_letter_try(struct retry_req *r, const struct trial *t, enum metrics_outcome o)
{
    if (r->route->delivery.mode != CFG_DELIVERY_SYNC || r->front->ops->delivery)
        return;
    /* a first attempt answered 2xx or 3xx is nearly always the request's answer, and no dead
     * letter: nothing is made for it (the success path of such a route costs what any other's
     * does). The exception, a retry_on condition on a header or a gRPC status in the trailers of
     * a 200, leaves that first attempt out of the dead letter's rows (its 'attempts' still
     * counts it: docs/delivery.md) */
    if (!r->dl_tries && (o == METRICS_OUT_2XX || o == METRICS_OUT_3XX))
        return;
    uint32_t cap = r->max_attempts ? r->max_attempts : 1;
    if (!r->dl_tries && !(r->dl_tries = calloc(cap, sizeof(*r->dl_tries))))
        return; /* out of memory: the dead letter keeps its one row for the request */
    if (r->dl_ntries >= cap)
        return;
    uint64_t now = loop_clock_us(r->w->loop);
    struct store_attempt *a = &r->dl_tries[r->dl_ntries++];
    /* its start in wall time: the request's, plus the loop's clock since */
    *a = (struct store_attempt){
        .at_ms = (uint64_t)r->start_unix_ms + (t->start_us - r->start_us) / 1000,
        .duration_ms = (uint32_t)((now - t->start_us) / 1000),
        .status = t->att.status,
    };
    snprintf(a->outcome, sizeof(a->outcome), "%s", metrics_outcome_name(o));
    const struct cfg_upstream *u = trial_upstream(r, t);
    a->upstream = u ? u->url : NULL; /* the request's snapshot's, which it holds */
}

/* The debug log line of attempt 't' (docs/logs.md), its outcome given as text. */
void tally_log_as(struct retry_req *r, const struct trial *t, const char *outcome,
                  const char *decision, uint32_t delay_ms)
{
    const struct cfg_upstream *u = trial_upstream(r, t);
    struct log_attempt a = { .unix_ms = (int64_t)req_wall_ms(),
                             .route = r->route->name,
                             .request_id = r->request_id,
                             .attempt = t->number,
                             .upstream = u ? u->url : NULL,
                             .outcome = outcome,
                             .duration_ms =
                                 (double)(loop_clock_us(r->w->loop) - t->start_us) / 1000.0,
                             .decision = decision,
                             .delay_ms = delay_ms };
    log_attempt(r->w->log, &a);
}

/* The same with the outcome 'o' ended in (the response's status for a response). */
void tally_log(struct retry_req *r, const struct trial *t, enum retry_outcome o,
               const char *decision, uint32_t delay_ms)
{
    if (!log_enabled(CFG_LOG_DEBUG))
        return;
    char outcome[16];
    if (o == RETRY_OUT_STATUS)
        snprintf(outcome, sizeof(outcome), "%d", t->att.status);
    else
        snprintf(outcome, sizeof(outcome), "%s",
                 o == RETRY_OUT_CONNECT_FAILURE ? "connect-failure"
                 : o == RETRY_OUT_RESET         ? "reset"
                                                : "timeout");
    tally_log_as(r, t, outcome, decision, delay_ms);
}

/* The metrics and the debug log line of a verdict on attempt 't' (ended in 'o', or past its
 * per-try timeout when 'hedging'). */
void tally_verdict(struct retry_req *r, const struct trial *t, enum retry_outcome o,
                   const struct retry_verdict *v, bool hedging)
{
    struct worker *w = r->w;
    bool retry = v->fired && v->stop == RETRY_STOP_NONE;
    if (retry) {
        size_t k = (size_t)(v->fired - r->route->retry.on);
        metrics_retry(r->m, w->id, r->rtr->reasons[k]);
        metrics_observe(r->m, w->id, METRICS_HIST_BACKOFF, v->delay_ms / 1000.0);
        if (v->retry_after_used)
            metrics_retry_after_honored(r->m, w->id);
        uint32_t *d = realloc(r->delays, (r->n_delays + 1) * sizeof(*d));
        if (d) {
            d[r->n_delays++] = v->delay_ms;
            r->delays = d;
        }
    } else if (v->fired) {
        tally_stop(r, v->stop);
    }
    if (!log_enabled(CFG_LOG_DEBUG))
        return;
    /* hedging: "hedge" starts the next attempt beside this one; "run-on:REASON" lets this one
     * run on alone */
    char decision[48];
    snprintf(decision, sizeof(decision), "%s%s",
             retry      ? (hedging ? "hedge" : "retry")
             : v->fired ? (hedging ? "run-on:" : "stop:")
                        : "final",
             !retry && v->fired ? retry_stop_name(v->stop) : "");
    tally_log(r, t, o, decision, retry ? v->delay_ms : 0);
}

/* The answer is about to go out: the request's metrics are counted now, before a byte of it
 * leaves (docs/metrics.md: a client that has its response sees it counted). Its duration runs
 * to this point, the moment the response starts. */
void tally_answer(struct retry_req *r)
{
    struct worker *w = r->w;
    metrics_request(r->m, w->id, (int)r->front->status);
    metrics_protocol(r->m, w->id, r->front->proto == FRONT_HTTP2 ? METRICS_HTTP2 : METRICS_HTTP1);
    if (r->upgrade[0]) /* an upgrade the route tunnels (docs/upgrades.md) */
        metrics_upgrade(r->m, w->id,
                        r->front->status == 101 ? METRICS_UPGRADE_TUNNELLED
                                                : METRICS_UPGRADE_REFUSED);
    /* a retry's success: with hedging, the first attempt may answer after a retry went */
    if ((r->flags & RF_SUCCEEDED) && r->cur->number > 1)
        metrics_retry_success(r->m, w->id);
    metrics_observe(r->m, w->id, METRICS_HIST_REQUEST,
                    (double)(loop_clock_us(w->loop) - r->start_us) / 1e6);
}

void tally_grpc(struct retry_req *r, int status)
{
    if ((r->flags & (RF_GRPC | RF_GRPC_COUNTED)) != RF_GRPC)
        return;
    r->flags |= RF_GRPC_COUNTED;
    r->grpc_status = status;
    metrics_grpc(r->m, r->w->id, status);
}

/* The target the last attempt sent (head_upstream_target, malloc'd in *joined when joined). NULL:
 * no attempt. */
static const char *upstream_path(const struct retry_req *r, char **joined)
{
    const struct cfg_upstream *u = trial_upstream(r, r->cur);
    *joined = NULL;
    return u ? head_upstream_target(u->base_path, r->target, joined) : NULL;
}

/* The request is over (answered, or the client went away): its log line, and
 * client_gone_total when no answer of ours started (none made, or the reset of a client that
 * left: status 0, or 499 during a backoff wait) or its client left part way through it
 * (edge_cut_short). The same on every client protocol. */
void tally_done(struct retry_req *r)
{
    struct worker *w = r->w;
    if (r->state == RS_HEADERS)
        return;
    const struct front *f = r->front;
    if (!f->answered || f->status == 0 || r->stop == RETRY_STOP_CLIENT_CLOSED ||
        (r->flags & RF_CUT_SHORT))
        metrics_client_gone(r->m, w->id);
    if (!log_enabled(CFG_LOG_INFO))
        return;
    bool sent = r->front->sent || r->stop == RETRY_STOP_CLIENT_CLOSED;
    const struct cfg_upstream *u = trial_upstream(r, r->cur);
    char *joined;
    struct log_request lr = { .unix_ms = r->start_unix_ms,
                              .route = r->route ? r->route->name : NULL,
                              .method = r->method,
                              .path = r->target,
                              /* 499: libmicrohttpd may find the socket closed first */
                              .status = sent ? (int)r->front->status : 0,
                              .attempts = r->attempts,
                              .delays = r->delays,
                              .n_delays = r->n_delays,
                              .duration_ms =
                                  (double)(loop_clock_us(w->loop) - r->start_us) / 1000.0,
                              .upstream = u ? u->url : NULL,
                              .upstream_path = upstream_path(r, &joined),
                              .stop = r->stop != RETRY_STOP_NONE ? retry_stop_name(r->stop) : NULL,
                              .request_id = r->request_id[0] ? r->request_id : NULL,
                              .protocol = r->front->proto == FRONT_HTTP2 ? "HTTP/2" : "HTTP/1.1",
                              .grpc = r->flags & RF_GRPC,
                              .grpc_status = r->grpc_status,
                              .client_addr = r->peer && r->peer[0] ? r->peer : NULL,
                              .client_port = r->peer_port,
                              .user_agent = r->user_agent,
                              .bytes_from_client = r->body.total + r->discarded, /* all it took */
                              .bytes_to_client = r->front->body_sent };
    log_request(w->log, &lr);
    free(joined);
}
