#include "proxy/core/decide.h"

#include <string.h>
#include <strings.h>

const char *retry_stop_name(enum retry_stop s)
{
    switch (s) {
    case RETRY_STOP_NONE:
        return "";
    case RETRY_STOP_MAX_ATTEMPTS:
        return "max-attempts";
    case RETRY_STOP_BUDGET:
        return "budget";
    case RETRY_STOP_CONCURRENCY:
        return "concurrency";
    case RETRY_STOP_DEADLINE:
        return "deadline";
    case RETRY_STOP_RETRY_AFTER:
        return "retry-after";
    case RETRY_STOP_NOT_RETRYABLE:
        return "not-retryable";
    case RETRY_STOP_BODY_TOO_LARGE:
        return "body-too-large";
    case RETRY_STOP_DRAINING:
        return "draining";
    case RETRY_STOP_PUSHBACK:
        return "pushback";
    case RETRY_STOP_THROTTLED:
        return "throttled";
    case RETRY_STOP_CLIENT_CLOSED:
        return "client-closed";
    }
    return "";
}

/* Whether 'head' has the condition's field (with its value, when it names one). */
static bool has_field(const struct hlist *head, const struct cfg_retry_cond *c)
{
    size_t pos = 0, nl = strlen(c->name);
    struct hfield f;
    while (head && hlist_next_n(head, &pos, &f))
        if (f.name_len == nl && strncasecmp(f.name, c->name, nl) == 0 &&
            (!c->value || strcmp(f.value, c->value) == 0))
            return true;
    return false;
}

const struct cfg_retry_cond *retry_match(const struct cfg_retry *r, enum retry_outcome o,
                                         int status, const struct hlist *head, int grpc)
{
    return retry_match_on(r->on, r->n_on, o, status, head, grpc);
}

const struct cfg_retry_cond *retry_match_on(const struct cfg_retry_cond *on, size_t n,
                                            enum retry_outcome o, int status,
                                            const struct hlist *head, int grpc)
{
    for (size_t i = 0; i < n; i++) {
        const struct cfg_retry_cond *c = &on[i];
        switch (c->kind) {
        case CFG_RETRY_CONNECT_FAILURE:
            if (o == RETRY_OUT_CONNECT_FAILURE)
                return c;
            break;
        case CFG_RETRY_RESET:
            if (o == RETRY_OUT_RESET)
                return c;
            break;
        case CFG_RETRY_TIMEOUT:
            if (o == RETRY_OUT_TIMEOUT)
                return c;
            break;
        case CFG_RETRY_STATUS:
            if (o == RETRY_OUT_STATUS && status >= c->lo && status <= c->hi)
                return c;
            break;
        case CFG_RETRY_HEADER:
            if (o == RETRY_OUT_STATUS && has_field(head, c))
                return c;
            break;
        case CFG_RETRY_GRPC:
            if (o == RETRY_OUT_STATUS && grpc >= c->lo && grpc <= c->hi)
                return c;
            break;
        }
    }
    return NULL;
}

/* A wait of 'delay_ms' from 'now_ms' that ends at or after 'deadline_ms' leaves no time for the
 * attempt after it: the one rule for the request's deadline and the drain deadline. */
static bool wait_passes(uint64_t now_ms, uint64_t delay_ms, uint64_t deadline_ms)
{
    return now_ms + delay_ms >= deadline_ms;
}

/* While draining (a drain deadline is set), the wait must end before it. */
static bool wait_passes_drain(const struct decide_budgets *b, uint64_t now_ms, uint64_t delay_ms)
{
    return b->drain_deadline_ms && wait_passes(now_ms, delay_ms, b->drain_deadline_ms);
}

void retry_decide(const struct cfg_retry *r, const struct retry_facts *f, struct retry_verdict *v)
{
    memset(v, 0, sizeof(*v));
    v->fired = retry_match(r, f->outcome, f->status, f->head, f->grpc_status);
    if (!v->fired)
        return;

    /* Nothing was sent on a connect failure, so any method and any body may go again. A
     * request the upstream refused unprocessed (HTTP/2 REFUSED_STREAM, GOAWAY) reached no
     * application: any method may go again, if its body can be sent again. A gRPC call is a
     * POST: a status its server returned is retried by that status, which says the call may go
     * again (gRFC A6), whatever retry.methods says. */
    bool sent = f->outcome != RETRY_OUT_CONNECT_FAILURE;
    bool processed = sent && !f->unprocessed;
    if (processed && !f->method_retryable && v->fired->kind != CFG_RETRY_GRPC) {
        v->stop = RETRY_STOP_NOT_RETRYABLE;
        return;
    }
    if (sent && !f->body_replayable) {
        v->stop = RETRY_STOP_BODY_TOO_LARGE;
        return;
    }
    if (f->attempts >= f->max_attempts) {
        v->stop = RETRY_STOP_MAX_ATTEMPTS;
        return;
    }
    uint64_t delay = f->backoff_ms;
    if (f->has_pushback) {
        /* the upstream's word on this retry comes before every other */
        if (f->pushback_stops) {
            v->stop = RETRY_STOP_PUSHBACK;
            return;
        }
        delay = f->pushback_ms;
        v->pushback_used = true;
    } else if (f->has_retry_after && r->retry_after_honor) {
        if (f->retry_after_ms > r->retry_after_max_ms) {
            v->stop = RETRY_STOP_RETRY_AFTER;
            return;
        }
        delay = f->retry_after_ms;
        v->retry_after_used = true;
    }
    if (wait_passes(f->now_ms, delay, f->deadline_ms)) {
        v->stop = RETRY_STOP_DEADLINE;
        return;
    }
    v->delay_ms = (uint32_t)delay;
}

void decide_note_request(const struct decide_budgets *b, uint64_t now_ms)
{
    budget_note_request(b->global, now_ms);
    budget_note_request(b->route, now_ms);
}

/* Concurrency first, then the ratio (docs/budgets.md "Order of the checks"). */
enum retry_stop decide_admit(const struct decide_budgets *b, uint64_t now, uint32_t delay_ms)
{
    if (wait_passes_drain(b, now, delay_ms))
        return RETRY_STOP_DRAINING;
    if (!budget_acquire(b->global, b->global_limits->max_concurrent_retries))
        return RETRY_STOP_CONCURRENCY;
    if (!budget_acquire(b->route, b->route_limits->max_concurrent_retries)) {
        budget_release(b->global);
        return RETRY_STOP_CONCURRENCY;
    }
    if (!budget_ratio_allows(b->global, b->global_limits, now) ||
        !budget_ratio_allows(b->route, b->route_limits, now)) {
        budget_release(b->route);
        budget_release(b->global);
        return RETRY_STOP_BUDGET;
    }
    budget_note_retry(b->global, now);
    budget_note_retry(b->route, now);
    return RETRY_STOP_NONE;
}

void decide_attempt(const struct decide_req *d, struct retry_facts *f, struct retry_verdict *v)
{
    const struct cfg_retry *policy = d->policy;
    /* The delay this retry would wait; the sequence moves only if the retry is taken (a
     * route-scoped one is shared, and a refused retry must not move it for the others). */
    bool route_scope = policy->backoff.scope == BACKOFF_SCOPE_ROUTE;
    struct live_backoff_mark mark = { 0 };
    struct backoff_seq seq = *d->seq;
    f->backoff_ms = 0;
    if (retry_match(policy, f->outcome, f->status, f->head, f->grpc_status) &&
        f->attempts < f->max_attempts)
        f->backoff_ms = route_scope ? live_route_backoff_peek(d->live, &policy->backoff, f->now_ms,
                                                              d->rng, &mark)
                                    : backoff_seq_next(&seq, &policy->backoff, f->now_ms, d->rng);
    retry_decide(policy, f, v);
    bool throttling = d->throttle && d->throttle->k > 0;
    if (!v->fired)
        decide_note_final(d, f->now_ms);
    if (!v->fired || v->stop != RETRY_STOP_NONE)
        return;
    v->stop = decide_admit(&d->budgets, f->now_ms, v->delay_ms);
    if (v->stop != RETRY_STOP_NONE)
        return;
    if (throttling &&
        !throttle_admit(&d->live->throttle, d->throttle->k, f->now_ms, d->rng, &v->throttle_p)) {
        decide_release(d);
        v->stop = RETRY_STOP_THROTTLED;
        return;
    }
    if (route_scope)
        live_route_backoff_take(d->live, &policy->backoff, f->now_ms, d->rng, &mark);
    else
        *d->seq = seq;
}

enum retry_stop decide_wait_fits(const struct decide_req *d, uint64_t now_ms, uint32_t delay_ms,
                                 uint64_t deadline_ms)
{
    if (wait_passes(now_ms, delay_ms, deadline_ms))
        return RETRY_STOP_DEADLINE;
    if (wait_passes_drain(&d->budgets, now_ms, delay_ms))
        return RETRY_STOP_DRAINING;
    return RETRY_STOP_NONE;
}

void decide_release(const struct decide_req *d)
{
    decide_budgets_release(&d->budgets);
}

void decide_budgets_release(const struct decide_budgets *b)
{
    budget_release(b->global);
    budget_release(b->route);
}

void decide_note_final(const struct decide_req *d, uint64_t now_ms)
{
    if (d->throttle && d->throttle->k > 0)
        throttle_note_accept(&d->live->throttle, now_ms);
}
