/* sim -- the discrete-event simulation of policy/sim.h.
 *
 * Each client has at most one event pending, so the queue (a binary heap ordered by time,
 * then by the order events were scheduled) never holds more than 'clients' events:
 *
 *   EV_ATTEMPT --(call answered after latency_ms)--> EV_END
 *   EV_END: success, or no retry allowed --> the request ends; the client's next one starts
 *           at once (EV_ATTEMPT now), or the client is done
 *   EV_END: retry allowed --> EV_ATTEMPT after the delay
 *
 * A retry is decided in the proxy's order (proxy/core/decide.c): retry_on, max_attempts, the
 * backoff delay (Retry-After instead, when the failure carries one and it is honoured), the
 * deadline, then the budgets: a concurrency slot in the process-wide budget and the route's,
 * then both ratios. A taken retry holds its slots until its attempt ends; a refused one moves
 * neither the backoff sequence nor the budgets.
 */
#include "policy/sim.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum ev_kind { EV_ATTEMPT, EV_END };

struct ev {
    uint64_t at_ms;
    uint64_t order; /* ties at one millisecond go in scheduling order */
    uint32_t client;
    enum ev_kind kind;
};

struct client {
    uint32_t requests_done;
    uint32_t attempts; /* of the current request */
    uint64_t started_ms;
    uint64_t deadline_ms;
    struct backoff_seq seq; /* scope request: this request's sequence */
    bool holds_slots;       /* the attempt in flight is a retry holding budget slots */
    bool last_ok;           /* how the attempt in flight ends */
    bool cut;               /* ... cut short by the deadline */
};

struct sim {
    const struct sim_policy *p;
    const struct sim_upstream *u;
    const struct sim_load *l;
    struct rng *backoff_rng;
    struct rng fail_rng;
    struct client *clients;
    struct ev *heap;
    size_t n_heap;
    uint64_t order;
    struct budget global, route;
    struct backoff_seq route_seq; /* scope route: the sequence all requests share */
    uint64_t window;              /* the capacity window seen last, and its successes */
    uint32_t window_ok;
    uint64_t *completions;
    size_t n_completions;
    uint64_t *calls;
    size_t n_calls, cap_calls;
    struct sim_result *res;
};

static bool ev_before(const struct ev *a, const struct ev *b);
static void push(struct sim *s, uint64_t at_ms, uint32_t client, enum ev_kind kind);
static struct ev pop(struct sim *s);
static int step(struct sim *s, const struct ev *e);
static int cmp_u64(const void *a, const void *b);

int sim_run(const struct sim_policy *p, const struct sim_upstream *u, const struct sim_load *l,
            struct rng *r, struct sim_result *out)
{
    int rc = -ENOMEM;
    struct sim s = { .p = p, .u = u, .l = l, .backoff_rng = r, .res = out };
    memset(out, 0, sizeof(*out));
    rng_seed(&s.fail_rng, rng_next(r));
    budget_init(&s.global, p->global.window_ms);
    budget_init(&s.route, p->route.window_ms);
    uint64_t total = (uint64_t)l->clients * l->requests;
    s.clients = calloc(l->clients, sizeof(*s.clients));
    s.heap = malloc(l->clients * sizeof(*s.heap));
    s.completions = malloc(total * sizeof(*s.completions));
    if (!s.clients || !s.heap || !s.completions)
        goto out;

    for (uint32_t c = 0; c < l->clients; c++)
        push(&s, 0, c, EV_ATTEMPT);
    while (s.n_heap > 0) {
        struct ev e = pop(&s);
        if (step(&s, &e) < 0)
            goto out;
    }

    out->requests = total;
    if (l->record_calls) {
        out->n_calls = s.n_calls;
        out->call_ms = s.calls;
        s.calls = NULL;
    }
    /* completion times, sorted for the percentiles */
    qsort(s.completions, s.n_completions, sizeof(*s.completions), cmp_u64);
    out->p50_ms = sim_percentile(s.completions, s.n_completions, 50);
    out->p90_ms = sim_percentile(s.completions, s.n_completions, 90);
    out->p99_ms = sim_percentile(s.completions, s.n_completions, 99);
    out->max_ms = sim_percentile(s.completions, s.n_completions, 100);
    rc = 0;
out:
    free(s.clients);
    free(s.heap);
    free(s.completions);
    free(s.calls);
    if (rc < 0)
        memset(out, 0, sizeof(*out));
    return rc;
}

/* ---- the event queue ---- */

static bool ev_before(const struct ev *a, const struct ev *b)
{
    return a->at_ms < b->at_ms || (a->at_ms == b->at_ms && a->order < b->order);
}

/* Never more than one event per client is pending, so the heap (sized for 'clients') has room. */
static void push(struct sim *s, uint64_t at_ms, uint32_t client, enum ev_kind kind)
{
    size_t i = s->n_heap++;
    s->heap[i] = (struct ev){ at_ms, s->order++, client, kind };
    while (i > 0 && ev_before(&s->heap[i], &s->heap[(i - 1) / 2])) {
        struct ev t = s->heap[i];
        s->heap[i] = s->heap[(i - 1) / 2];
        s->heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static struct ev pop(struct sim *s)
{
    struct ev top = s->heap[0];
    s->heap[0] = s->heap[--s->n_heap];
    for (size_t i = 0;;) {
        size_t m = i, a = 2 * i + 1, b = a + 1;
        if (a < s->n_heap && ev_before(&s->heap[a], &s->heap[m]))
            m = a;
        if (b < s->n_heap && ev_before(&s->heap[b], &s->heap[m]))
            m = b;
        if (m == i)
            break;
        struct ev t = s->heap[i];
        s->heap[i] = s->heap[m];
        s->heap[m] = t;
        i = m;
    }
    return top;
}

/* ---- a request's life ---- */

static int attempt(struct sim *s, uint32_t id, uint64_t now);
static bool upstream_answers(struct sim *s, uint64_t now);
static void attempt_ended(struct sim *s, uint32_t id, uint64_t now);
static enum sim_stop decide_retry(struct sim *s, struct client *c, uint64_t now,
                                  uint32_t *delay_ms);
static void request_ended(struct sim *s, uint32_t id, uint64_t now, bool ok);

static int step(struct sim *s, const struct ev *e)
{
    if (e->kind == EV_ATTEMPT)
        return attempt(s, e->client, e->at_ms);
    attempt_ended(s, e->client, e->at_ms);
    return 0;
}

/* A call goes to the upstream now: the first attempt of a request starts its deadline and
 * counts as a first attempt in both budgets, as the proxy's start_attempt() does. */
static int attempt(struct sim *s, uint32_t id, uint64_t now)
{
    struct client *c = &s->clients[id];
    if (c->attempts == 0) {
        c->started_ms = now;
        c->deadline_ms = now + s->p->timeout_ms;
        budget_note_request(&s->global, now);
        budget_note_request(&s->route, now);
    }
    c->attempts++;
    s->res->calls++;
    if (s->l->record_calls) {
        if (s->n_calls == s->cap_calls) {
            size_t cap = s->cap_calls ? 2 * s->cap_calls : 1024;
            uint64_t *v = realloc(s->calls, cap * sizeof(*v));
            if (!v)
                return -ENOMEM;
            s->calls = v;
            s->cap_calls = cap;
        }
        s->calls[s->n_calls] = now;
    }
    s->n_calls++;
    c->last_ok = upstream_answers(s, now);
    c->cut = false;
    uint64_t end = now + s->u->latency_ms;
    if (end > c->deadline_ms) {
        /* the proxy answers 504 at the deadline; nothing is retried after it */
        end = c->deadline_ms;
        c->last_ok = false;
        c->cut = true;
    }
    push(s, end, id, EV_END);
    return 0;
}

/* Whether a call starting now succeeds. The failure draw is made for every call, so the
 * stream of draws does not depend on the outage or the capacity. */
static bool upstream_answers(struct sim *s, uint64_t now)
{
    const struct sim_upstream *u = s->u;
    bool failed = u->failure_rate > 0 && rng_unit(&s->fail_rng) < u->failure_rate;
    if (now >= u->outage_start_ms && now < u->outage_end_ms)
        return false;
    if (failed)
        return false;
    if (u->capacity == 0)
        return true;
    uint64_t w = now / u->capacity_window_ms;
    if (w != s->window) {
        s->window = w; /* events come in time order: an older window never comes back */
        s->window_ok = 0;
    }
    if (s->window_ok >= u->capacity)
        return false;
    s->window_ok++;
    return true;
}

static void attempt_ended(struct sim *s, uint32_t id, uint64_t now)
{
    struct client *c = &s->clients[id];
    if (c->holds_slots) {
        budget_release(&s->global);
        budget_release(&s->route);
        c->holds_slots = false;
    }
    if (c->last_ok) {
        request_ended(s, id, now, true);
        return;
    }
    uint32_t delay = 0;
    enum sim_stop why = c->cut ? SIM_STOP_DEADLINE : decide_retry(s, c, now, &delay);
    if (why != SIM_STOP_NONE) {
        s->res->stopped[why]++;
        request_ended(s, id, now, false);
        return;
    }
    s->res->retries++;
    c->holds_slots = true;
    push(s, now + delay, id, EV_ATTEMPT);
}

/* The proxy's decision (proxy/core/decide.c: retry_decide, then admit) for a failed attempt. On
 * SIM_STOP_NONE the retry is taken: the sequence has moved and the slots are held. */
static enum sim_stop decide_retry(struct sim *s, struct client *c, uint64_t now, uint32_t *delay_ms)
{
    const struct sim_policy *p = s->p;
    const struct sim_upstream *u = s->u;
    if (!p->retryable)
        return SIM_STOP_NOT_RETRYABLE;
    if (c->attempts >= p->max_attempts)
        return SIM_STOP_MAX_ATTEMPTS;
    /* the delay the sequence would give; it moves only if the retry is taken */
    bool shared = p->backoff.scope == BACKOFF_SCOPE_ROUTE;
    struct backoff_seq seq = shared ? s->route_seq : c->seq;
    uint64_t delay = backoff_seq_next(&seq, &p->backoff, now, s->backoff_rng);
    if (u->retry_after && p->retry_after_honor) {
        if (u->retry_after_ms > p->retry_after_max_ms)
            return SIM_STOP_RETRY_AFTER;
        delay = u->retry_after_ms;
    }
    if (now + delay >= c->deadline_ms)
        return SIM_STOP_DEADLINE;
    if (!budget_acquire(&s->global, p->global.max_concurrent_retries))
        return SIM_STOP_CONCURRENCY;
    if (!budget_acquire(&s->route, p->route.max_concurrent_retries)) {
        budget_release(&s->global);
        return SIM_STOP_CONCURRENCY;
    }
    if (!budget_ratio_allows(&s->global, &p->global, now) ||
        !budget_ratio_allows(&s->route, &p->route, now)) {
        budget_release(&s->route);
        budget_release(&s->global);
        return SIM_STOP_BUDGET;
    }
    budget_note_retry(&s->global, now);
    budget_note_retry(&s->route, now);
    if (shared)
        s->route_seq = seq;
    else
        c->seq = seq;
    *delay_ms = (uint32_t)delay;
    return SIM_STOP_NONE;
}

/* The request has its final answer: its completion time is counted, and the client sends its
 * next request at once. */
static void request_ended(struct sim *s, uint32_t id, uint64_t now, bool ok)
{
    struct client *c = &s->clients[id];
    s->completions[s->n_completions++] = now - c->started_ms;
    if (ok)
        s->res->succeeded++;
    if (now > s->res->end_ms)
        s->res->end_ms = now;
    c->attempts = 0;
    backoff_seq_reset(&c->seq);
    if (++c->requests_done < s->l->requests)
        push(s, now, id, EV_ATTEMPT);
}

/* ---- results ---- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

uint64_t sim_percentile(const uint64_t *sorted, size_t n, unsigned pct)
{
    if (n == 0)
        return 0;
    size_t rank = (size_t)(((uint64_t)n * pct + 99) / 100); /* ceil(n * pct / 100), 1-based */
    if (rank < 1)
        rank = 1;
    return sorted[(rank > n ? n : rank) - 1];
}

void sim_result_free(struct sim_result *res)
{
    if (!res)
        return;
    free(res->call_ms);
    res->call_ms = NULL;
}
