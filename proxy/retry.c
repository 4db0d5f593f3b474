/* retry -- the request state machine (proxy/retry.h).
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
 */
#include "proxy/retry.h"

#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "policy/retry_after.h"
#include "proxy/attempt.h"
#include "proxy/decide.h"
#include "proxy/dlist.h"
#include "proxy/eject.h"
#include "proxy/head.h"
#include "proxy/headers.h"
#include "proxy/intake.h"
#include "proxy/log.h"
#include "proxy/metrics.h"
#include "proxy/runtime.h"
#include "proxy/worker.h"

/* The body of a retryable response, kept to be returned if retrying stops. Error bodies are
 * small; a larger one is not kept and a 502 stands in for it. */
#define SAVED_BODY_MAX (64 * 1024)
/* How much of a body over limits.max_body_bytes is read (and dropped) so that the 413 can be
 * sent; libmicrohttpd answers only once the body is complete. Past this the connection is
 * closed instead: a client may not hold it with an endless body. */
#define DISCARD_MAX (1024 * 1024)
/* What the log and requests_total say of a request whose client left before its answer
 * (nginx's "client closed request"); nothing is sent. */
#define CLIENT_CLOSED_STATUS 499

enum req_state {
    RS_HEADERS,  /* before the first access-handler call */
    RS_BODY,     /* reading a request body that will be buffered whole */
    RS_ATTEMPT,  /* an attempt in flight, before its response head */
    RS_DRAIN,    /* reading a retryable response's body before the wait */
    RS_BACKOFF,  /* waiting out a delay */
    RS_STREAM,   /* the upstream's response is going to the client */
    RS_ANSWERED, /* a complete answer of our own (or a saved one) is ready */
    RS_LAG,      /* retrying has stopped, but earlier attempts run on (hedging): wait for them */
};

/* Request flags (struct retry_req 'flags'). */
enum {
    RF_RETRYABLE = 1u << 0,   /* its method may go twice (retry.methods, Idempotency-Key) */
    RF_BODY_DONE = 1u << 1,   /* the client's body is complete (or there is none) */
    RF_OVER_LIMIT = 1u << 2,  /* the body passed limits.max_body_bytes: answered 413 */
    RF_CLOSE_NOW = 1u << 3,   /* give the connection up: too much body left to discard */
    RF_IN_FLIGHT = 1u << 4,   /* a retry holds budget slots until its attempt ends */
    RF_SUCCEEDED = 1u << 5,   /* the last attempt ended in nothing retry_on names */
    RF_SAVED = 1u << 6,       /* 'saved' holds the last retryable response's head ... */
    RF_SAVED_WHOLE = 1u << 7, /* ... and its whole body */
    RF_THROTTLED = 1u << 8,   /* client-side throttling rejected an attempt (throttle_p) */
    RF_LAG = 1u << 9,         /* the response in DRAIN ends retrying: LAG once it is read */
    RF_SETTLE = 1u << 10,     /* the retry decided on the response in DRAIN: settle() it */
};

/* Trial flags (struct trial 'flags'). */
enum {
    TF_LAUNCHED = 1u << 0, /* its attempt went (or failed to): attempts_total counts it once ... */
    TF_COUNTED = 1u << 1,  /* ... and has */
    TF_RECORDED = 1u << 2, /* its outcome went to upstream health (a hedge records the timeout) */
    TF_SLOT = 1u << 3,     /* a laggard holding the budget slots of the retry it was */
    TF_LOST = 1u << 4,     /* out of the race: cancelled in the next turn, never inside curl */
};

/* A trial: one upstream attempt and what the request keeps of it. The request embeds one,
 * reused by each attempt in turn; hedging gives the next attempt a trial of its own while a
 * laggard runs on in r->others. */
struct trial {
    struct trial *prev, *next; /* r->others, while not the current attempt */
    struct retry_req *r;
    unsigned flags;
    uint32_t number; /* its X-Retry-Attempt */
    uint64_t start_ms;
    const struct cfg_upstream *upstream;
    struct attempt att;
    struct head_attempt fields; /* its own X-Retry-Attempt and deadline header */
};

struct retry_req {
    struct retry_req *prev, *next; /* the worker's requests */
    struct worker *w;
    enum req_state state;
    unsigned flags;
    unsigned refs;    /* the connection, a running transfer, the body reader */
    const char *peer; /* the client's address, while the connection is open */
    struct rt *rt;    /* the snapshot it started with (one reference) */
    struct cfg *cfg;  /* rt->cfg */
    const struct cfg_route *route;
    const struct rt_route *rtr; /* the matched route's bindings */
    struct metrics_route *m;    /* its metrics series (route "" until matched) */
    uint64_t start_ms;          /* loop clock when the request line arrived */
    int64_t start_unix_ms;
    uint64_t wait_start_ms; /* when the current backoff wait began */
    uint64_t deadline_ms;
    uint32_t *delays; /* the waits taken, for the log */
    size_t n_delays;

    /* the request as received */
    char *target;
    char method[WIRE_METHOD_MAX + 1]; /* the framing check refuses longer ones */
    enum wire_reason refused;         /* the head was refused: answer its error */
    uint32_t method_bit;
    char request_id[HEAD_REQUEST_ID_MAX + 1];
    struct head_up up;  /* the header list every attempt sends */
    struct intake body; /* the request body */
    uint64_t discarded; /* body bytes dropped after the answer was made */

    /* retrying */
    uint32_t attempts, max_attempts;
    uint32_t timeout_ms; /* the route's, lowered by X-Retry-Timeout-Ms */
    uint64_t tried;      /* upstreams tried, as bits */
    struct backoff_seq seq;
    struct decide_req dr;
    enum retry_outcome last_outcome;
    enum retry_stop stop;
    uint32_t pending_delay;
    struct retry_verdict settling; /* RF_SETTLE: the verdict, counted once the body is read */
    double throttle_p;             /* RF_THROTTLED: the probability it was rejected with */
    struct trial *cur;             /* the current attempt: running, waited for, or the last one */
    struct trial *others; /* attempts running beside it (hedging), and lost ones to cancel */
    struct trial first;
    struct loop_timer try_timer, deadline_timer, backoff_timer;
    struct loop_timer reap_timer; /* cancels the lost ones in the next turn */

    /* the last retryable response, returned as it is if retrying stops */
    struct {
        int status;
        struct hlist h;
        char *body;
        size_t len;
    } saved;

    struct front *front; /* the client side: its state follows in the same allocation */
};

static const struct attempt_ops attempt_ops;

static void begin(struct retry_req *r, const char *method);
static size_t take_body(struct retry_req *r, const char *data, size_t n);
static void start_attempt(struct retry_req *r);
static void attempt_failed(struct retry_req *r, enum retry_outcome o);
static bool decide(struct retry_req *r, enum retry_outcome o);
static void wait_then_retry(struct retry_req *r);
static bool stop_transfer(struct retry_req *r, struct trial *t);
static void hold_slots(struct retry_req *r);
static bool settle(struct retry_req *r);
static void give_up(struct retry_req *r, enum retry_stop stop);
static void end_retry_in_flight(struct retry_req *r);
static void answer_error(struct retry_req *r, unsigned status, const char *code,
                         const char *message);
static void answer_final(struct retry_req *r);
static void answer_saved(struct retry_req *r);
static bool saved_whole(const struct retry_req *r);
static struct front_tag tag_of(const struct retry_req *r);
static void account_stop(struct retry_req *r, enum retry_stop stop);
static void log_done(struct retry_req *r);
static void on_deadline(struct loop_timer *t);
static void on_try_timeout(struct loop_timer *t);
static void trial_init(struct retry_req *r, struct trial *t);
static void trial_free(struct retry_req *r, struct trial *t);
static void lose_others(struct retry_req *r, enum metrics_outcome o);
static void reap(struct retry_req *r);
static bool end_attempts(struct retry_req *r, enum metrics_outcome o);
static bool count_trial(struct retry_req *r, struct trial *t, enum metrics_outcome o);
static void log_trial(struct retry_req *r, const struct trial *t, enum retry_outcome o,
                      const char *decision, uint32_t delay_ms);
static void log_trial_as(struct retry_req *r, const struct trial *t, const char *outcome,
                         const char *decision, uint32_t delay_ms);

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

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
                            enum wire_reason refused)
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
    r->refused = refused;
    r->refs = 1;
    worker_refresh(w);
    r->rt = rt_ref(w->rt);
    r->cfg = r->rt->cfg;
    r->m = r->rt->no_route;
    r->start_ms = loop_now(w->loop);
    r->start_unix_ms = (int64_t)wall_ms();
    struct intake_pool pool = { &w->px->body_bytes, r->cfg->max_buffered_body_bytes,
                                &w->body_freed };
    intake_init(&r->body, &pool);
    trial_init(r, &r->first);
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
        trial_free(r, r->cur);
    attempt_fini(&r->first.att); /* r->others is empty: each held a reference */
    loop_timer_stop(l, &r->reap_timer);
    loop_timer_stop(l, &r->try_timer);
    loop_timer_stop(l, &r->deadline_timer);
    loop_timer_stop(l, &r->backoff_timer);
    head_up_free(&r->up);
    intake_fini(&r->body);
    free(r->target);
    hlist_free(&r->saved.h);
    free(r->saved.body);
    free(r->delays);
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
        begin(r, method);
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

void retry_req_end(struct retry_req *r)
{
    if (r->flags & RF_BODY_DONE)
        return;
    r->flags |= RF_BODY_DONE;
    attempt_resume_upload(&r->cur->att); /* the end of a streamed body */
    if (r->state == RS_BODY)
        start_attempt(r);
}

void retry_req_completed(struct retry_req *r)
{
    struct loop *l = r->w->loop;
    r->front->ops->unwatch(r->front);
    end_retry_in_flight(r);
    log_done(r);
    r->peer = NULL;
    loop_timer_stop(l, &r->try_timer);
    loop_timer_stop(l, &r->deadline_timer);
    loop_timer_stop(l, &r->backoff_timer);
    end_attempts(r, METRICS_OUT_CANCELLED);
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

void retry_req_room(struct retry_req *r)
{
    attempt_resume_body(&r->cur->att);
}

static void account_answer(struct retry_req *r);

void retry_req_sending(struct retry_req *r)
{
    account_answer(r);
}

static void cut_wait_short(struct retry_req *r);

/* A request waiting out a backoff delay has its client side asleep (an HTTP/1.1 connection
 * suspended, and libmicrohttpd does not look at a suspended connection's socket): a client
 * that gives up would go unnoticed until retrying ends, every retry still costing the upstream
 * an attempt (nginx stops too, its "499"). The front end watches for the client going away
 * during the wait. A request whose attempt is running is not watched: that wait is bounded by
 * the per-try timeout and watching every request would cost two epoll_ctl calls each. */
void retry_req_client_gone(struct retry_req *r)
{
    struct front *f = r->front;
    if (r->state != RS_BACKOFF || f->answered)
        return;
    cut_wait_short(r);
    end_retry_in_flight(r);
    end_attempts(r, METRICS_OUT_CANCELLED); /* those running beside the wait (hedging) */
    r->stop = RETRY_STOP_CLIENT_CLOSED;
    /* Counted now, as if answered: no response will go out to count it later. */
    f->status = CLIENT_CLOSED_STATUS;
    account_answer(r);
    f->ops->reset(f, CLIENT_CLOSED_STATUS);
    r->state = RS_ANSWERED;
}

/* ---- the head ---- */

static void each_field(void *src, head_field_fn fn, void *arg)
{
    struct front *f = src;
    f->ops->fields(f, fn, arg);
}

/* The request's id, sent upstream, logged and returned on every answer: the client's
 * X-Request-Id when its head passed the checks and the value fits, else a new UUID
 * (docs/forwarding.md). */
static void set_request_id(struct retry_req *r, const char *client_id, size_t len)
{
    if (client_id && len > 0 && len <= HEAD_REQUEST_ID_MAX)
        snprintf(r->request_id, sizeof(r->request_id), "%.*s", (int)len, client_id);
    else
        hdr_uuid(&r->w->rng, r->request_id);
}

/* First call of the access handler: the head is complete, no body byte read yet. Either an
 * answer is made at once (400, 404, 405, 413) or the request is set up to go upstream. */
static void begin(struct retry_req *r, const char *method)
{
    struct worker *w = r->w;
    if (r->refused != WIRE_OK) {
        /* A head the framing check refused (proxy/wire.h): its error, and the connection
         * closes, as what follows on it cannot be framed. The log shows no method or path:
         * they were not read. */
        static const struct {
            unsigned status;
            const char *code;
        } codes[] = { { 400, "bad_request" },     { 408, "request_timeout" },
                      { 414, "uri_too_long" },    { 431, "headers_too_large" },
                      { 501, "not_implemented" }, { 505, "version_not_supported" } };
        unsigned status = wire_reason_status(r->refused);
        const char *code = "bad_request";
        for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
            if (codes[i].status == status)
                code = codes[i].code;
        r->target[0] = '\0';
        r->state = RS_BODY;
        set_request_id(r, NULL, 0);
        answer_error(r, status, code, wire_reason_text(r->refused));
        return;
    }
    snprintf(r->method, sizeof(r->method), "%s", method);
    r->method_bit = cfg_method_bit(method, strlen(method));
    r->front->is_head = strcmp(method, "HEAD") == 0; /* a length comes back, never a body */
    r->state = RS_BODY;

    struct head_scan s;
    head_scan(&s, each_field, r->front);
    enum cfg_underscores underscores = r->cfg->headers_with_underscores;
    char why_buf[128];
    const char *why =
        head_refusal(&s, underscores == CFG_UNDERSCORES_REJECT, why_buf, sizeof(why_buf));
    set_request_id(r, why ? NULL : s.value[HF_REQUEST_ID], s.value_len[HF_REQUEST_ID]);
    if (strcmp(method, "CONNECT") == 0) {
        answer_error(r, 405, "method_not_allowed",
                     "CONNECT is not supported: retryproxy is a reverse proxy");
        return;
    }
    if (why) {
        answer_error(r, 400, "bad_request", why);
        return;
    }
    char authority[256];
    if (!head_origin_form(&r->target, r->method, authority, sizeof(authority))) {
        answer_error(r, 400, "bad_request", "a request target of no valid form");
        return;
    }
    if (authority[0]) {
        s.value[HF_HOST] = authority;
        s.value_len[HF_HOST] = strlen(authority);
    }
    const char *q = strchr(r->target, '?');
    size_t path_len = q ? (size_t)(q - r->target) : strlen(r->target);
    r->route = head_route(r->cfg, s.value[HF_HOST], s.value_len[HF_HOST], r->target, path_len,
                          r->method_bit);
    if (!r->route) {
        answer_error(r, 404, "no_route", "no route matches this request");
        return;
    }
    r->rtr = &r->rt->routes[r->route - r->cfg->routes];
    r->m = r->rtr->metrics;
    const struct cfg_retry *policy = &r->route->retry;
    const char *const *field = s.value;
    bool chunked = s.count[HF_TRANSFER_ENCODING] > 0;
    const size_t *field_len = s.value_len; /* the values without their whitespace */
    int64_t cl = field[HF_CONTENT_LENGTH]
                     ? hdr_value_uint(field[HF_CONTENT_LENGTH], field_len[HF_CONTENT_LENGTH])
                     : -1;
    if (cl > 0 && (uint64_t)cl > r->cfg->max_body_bytes) {
        answer_error(r, 413, "body_too_large",
                     "the request body is larger than limits.max_body_bytes");
        return;
    }

    /* a key named in Connection does not reach the upstream, so it cannot vouch for a retry */
    if ((policy->methods & r->method_bit) ||
        (policy->idempotency_key && field_len[HF_IDEMPOTENCY_KEY] > 0 &&
         !head_connection_names(&s, "Idempotency-Key")))
        r->flags |= RF_RETRYABLE;
    r->max_attempts = policy->max_attempts;
    if (field[HF_MAX_ATTEMPTS]) {
        int64_t m = hdr_value_uint(field[HF_MAX_ATTEMPTS], field_len[HF_MAX_ATTEMPTS]);
        if (m >= 1 && (uint64_t)m < r->max_attempts)
            r->max_attempts = (uint32_t)m;
    }
    /* The client may shorten the request's time as it may its attempts, never lengthen it. */
    r->timeout_ms = r->route->timeout_ms;
    if (field[HF_TIMEOUT]) {
        int64_t t = hdr_value_uint(field[HF_TIMEOUT], field_len[HF_TIMEOUT]);
        if (t >= 1 && (uint64_t)t < r->timeout_ms)
            r->timeout_ms = (uint32_t)t;
    }
    r->dr = (struct decide_req){
        .policy = policy,
        .seq = &r->seq,
        .live = r->rtr->live,
        .rng = &w->rng,
        .throttle = &r->route->throttle,
        .budgets = { .global = &w->px->budget,
                     .global_limits = &r->cfg->budget,
                     .route = &r->rtr->live->budget,
                     .route_limits = &r->route->budget },
    };

    bool has_body = chunked || cl >= 0;
    int64_t length = chunked ? -1 : cl;
    bool drop = s.n_underscore && underscores == CFG_UNDERSCORES_DROP;
    if (drop && log_enabled(CFG_LOG_DEBUG))
        log_event(CFG_LOG_DEBUG, "request headers with an underscore in their name not forwarded",
                  "request_id", r->request_id, "first", s.underscore_name, NULL);
    if (head_up_build(&r->up, &s, each_field, r->front, r->peer ? r->peer : "", r->request_id,
                      r->route->preserve_host, r->route->deadline_header, drop) < 0 ||
        intake_plan(&r->body, has_body, length, policy->max_retry_body_bytes) < 0) {
        answer_error(r, 500, "internal", "out of memory");
        return;
    }
    if (r->body.mode == INTAKE_STREAM)
        start_attempt(r); /* the body flows to the upstream as it arrives */
}

/* ---- the body ---- */

/* Body bytes from the client. Returns the bytes consumed. */
static size_t take_body(struct retry_req *r, const char *data, size_t n)
{
    struct intake *in = &r->body;
    if (r->front->answered) {
        /* Answered already (413, or the upstream answered before the whole body came): the
         * rest is dropped until libmicrohttpd lets the answer go out. */
        r->discarded += n;
        if ((r->flags & RF_OVER_LIMIT) && r->discarded > DISCARD_MAX)
            r->flags |= RF_CLOSE_NOW;
        return n;
    }
    if (in->total + n > r->cfg->max_body_bytes) {
        struct loop *l = r->w->loop;
        loop_timer_stop(l, &r->backoff_timer);
        loop_timer_stop(l, &r->try_timer);
        end_attempts(r, METRICS_OUT_CANCELLED);
        r->flags |= RF_OVER_LIMIT;
        r->discarded = n;
        answer_error(r, 413, "body_too_large",
                     "the request body is larger than limits.max_body_bytes");
        return n;
    }
    if (in->mode == INTAKE_BUFFER) {
        switch (intake_buffer(in, data, n, r->route->retry.max_retry_body_bytes)) {
        case INTAKE_TOOK:
            return n;
        case INTAKE_NOMEM:
            return 0;
        case INTAKE_OVERFLOW:
            start_attempt(r); /* it streams now, what was buffered first */
            break;
        }
    }
    if (r->state != RS_ATTEMPT && r->state != RS_BACKOFF) {
        in->total += n;
        return n; /* the upstream has answered: the rest of the body is not needed */
    }
    size_t take = intake_queue(in, data, n);
    if (take)
        attempt_resume_upload(&r->cur->att);
    return take;
}

/* ---- attempts ---- */

/* The next attempt: round-robin over the route's upstreams, preferring one this request has
 * not tried. The worker's positions belong to its current snapshot; a request that started
 * under an older one (a reload since) starts anywhere. */
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
        /* the base of both ratio budgets */
        budget_note_request(&w->px->budget, now);
        budget_note_request(&r->rtr->live->budget, now);
    }
    r->attempts++;
    intake_rewind(&r->body);
    r->state = RS_ATTEMPT;
    uint32_t *rr = r->rt == w->rt ? &w->rr[rt - r->cfg->routes] : NULL;
    size_t i = attempt_pick(r->tried, eject_mask(r->rtr, rt->n_upstreams, now), rt->n_upstreams, rr,
                            &w->rng);
    if (i < 64)
        r->tried |= 1ULL << i;
    struct trial *t = r->cur;
    t->flags = 0;
    t->number = r->attempts;
    t->upstream = &rt->upstreams[i];
    if (!attempt_queue(&t->att))
        attempt_ops.go(&t->att); /* else it starts when a slot frees */
}

/* The current attempt, given a transfer slot. */
static void attempt_go(struct attempt *a)
{
    struct trial *t = of_attempt(a);
    struct retry_req *r = t->r;
    struct loop *l = r->w->loop;
    const struct cfg_route *rt = r->route;
    const struct cfg_upstream *u = t->upstream;
    uint64_t now = loop_now(l);
    t->flags |= TF_LAUNCHED;
    t->start_ms = now;
    struct attempt_req req = { .method = r->method,
                               .target = r->target,
                               .body_buf = r->body.body,
                               .body_len = r->body.len,
                               .content_length = r->body.content_length };
    req.body = r->body.mode == INTAKE_BUFFER   ? ATTEMPT_BODY_BUFFER
               : r->body.mode == INTAKE_STREAM ? ATTEMPT_BODY_STREAM
                                               : ATTEMPT_BODY_NONE;
    uint64_t left = r->deadline_ms > now ? r->deadline_ms - now : 1;
    /* how long this attempt's answer is waited for: the per-try timeout or what is left */
    uint64_t wait =
        rt->per_try_timeout_ms && rt->per_try_timeout_ms < left ? rt->per_try_timeout_ms : left;
    req.headers = head_up_attempt(&r->up, &t->fields, t->number, wait);
    uint64_t connect =
        rt->connect_timeout_ms && rt->connect_timeout_ms < left ? rt->connect_timeout_ms : left;
    if (attempt_launch(a, r->rtr->urls[u - rt->upstreams], u->base_path, &req, connect) < 0) {
        attempt_failed(r, RETRY_OUT_CONNECT_FAILURE);
        return;
    }
    r->refs++; /* the transfer's, until attempt_done() or stop_transfer() */
    /* a body streamed once goes at the client's pace: a slow sender must not hold a slot
     * meant for upstream attempts (the request is committed: it is never retried) */
    if (req.body == ATTEMPT_BODY_STREAM)
        attempt_commit(a);
    if (rt->per_try_timeout_ms && now + rt->per_try_timeout_ms < r->deadline_ms)
        loop_timer_start(l, &r->try_timer, now + rt->per_try_timeout_ms, on_try_timeout, r);
}

/* Ends the transfer of 't', one of the request's attempts, whether it runs or still waits for a
 * slot, without its end being reported: the one place that cancels one and drops its reference
 * (never the last: the connection, or the body reader, holds one). Returns true if it was
 * running. */
static bool stop_transfer(struct retry_req *r, struct trial *t)
{
    if (!attempt_cancel(&t->att))
        return false;
    r->refs--;
    return true;
}

/* Every attempt of the request still running (or waiting for a slot) ends now: those beside
 * the current one (hedging) and the current one, each counted as 'o' unless it was already.
 * From the loop or libmicrohttpd's callbacks only, never curl's. Returns true if the current
 * one was running. */
static bool end_attempts(struct retry_req *r, enum metrics_outcome o)
{
    lose_others(r, o);
    reap(r);
    count_trial(r, r->cur, o);
    return stop_transfer(r, r->cur);
}

/* The Retry-After of the response, if it holds exactly one valid value. */
static bool retry_after_of(const struct hlist *h, uint64_t *ms)
{
    const char *vals[2];
    size_t lens[2];
    size_t n = hlist_values(h, "Retry-After", vals, lens, 2);
    return retry_after_parse_fields(vals, lens, n > 2 ? 2 : n, (int64_t)wall_ms(), ms) == 0;
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

static void other_head(struct retry_req *r, struct trial *t);
static bool others_running(const struct retry_req *r, const struct trial *except);
static void stream(struct retry_req *r);

/* The attempt's response head is in. */
static void attempt_head(struct attempt *a)
{
    struct trial *t = of_attempt(a);
    struct retry_req *r = t->r;
    if (t != r->cur) {
        other_head(r, t);
        return;
    }
    loop_timer_stop(r->w->loop, &r->try_timer);
    if (!decide(r, RETRY_OUT_STATUS)) {
        if ((r->flags & RF_SUCCEEDED) || !others_running(r, NULL)) {
            stream(r); /* this response is the answer */
            return;
        }
        r->flags |= RF_LAG; /* a failure that ends retrying: kept while the others run on */
    }
    /* Keep this response in case retrying stops; read its body first so the connection can
     * be reused. */
    hlist_free(&r->saved.h);
    r->saved.h = a->head;
    memset(&a->head, 0, sizeof(a->head));
    r->saved.status = a->status;
    r->saved.len = 0;
    r->flags |= RF_SAVED | RF_SAVED_WHOLE;
    r->state = RS_DRAIN;
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
    if (r->state != RS_DRAIN)
        return 0;
    if (!(r->flags & RF_SAVED_WHOLE) || r->saved.len + n > SAVED_BODY_MAX) {
        r->flags &= ~RF_SAVED_WHOLE;
        return 0; /* too large to keep: stop reading, the wait starts now */
    }
    char *b = realloc(r->saved.body, r->saved.len + n);
    if (!b) {
        r->flags &= ~RF_SAVED_WHOLE;
        return 0;
    }
    memcpy(b + r->saved.len, p, n);
    r->saved.body = b;
    r->saved.len += n;
    return n;
}

/* Bytes of the request body for the upstream: the buffered head, then the streamed rest. */
static size_t attempt_upload(struct attempt *a, char *buf, size_t max)
{
    struct retry_req *r = of_attempt(a)->r; /* a streamed body: never hedged, always r->cur */
    size_t got = intake_read(&r->body, buf, max);
    if (got) {
        if (ring_space(&r->body.queue) > 0)
            r->front->ops->upload_room(r->front);
        return got;
    }
    return r->flags & RF_BODY_DONE ? 0 : ATTEMPT_PAUSE;
}

static void other_done(struct retry_req *r, struct trial *t);
static void wait_for_others(struct retry_req *r);

static void attempt_done(struct attempt *a, enum attempt_end end)
{
    struct trial *t = of_attempt(a);
    struct retry_req *r = t->r;
    if (t != r->cur) {
        other_done(r, t);
        req_release(r);
        return;
    }
    loop_timer_stop(r->w->loop, &r->try_timer);
    switch (r->state) {
    case RS_ATTEMPT:
        /* No head: if nothing was sent, nothing reached the upstream, whatever the error. */
        attempt_failed(r, attempt_sent(a) ? RETRY_OUT_RESET : RETRY_OUT_CONNECT_FAILURE);
        break;
    case RS_DRAIN:
        if (end == ATTEMPT_BROKEN)
            r->flags &= ~RF_SAVED_WHOLE; /* the body broke off: not something to return */
        if (!(r->flags & RF_LAG) && settle(r))
            wait_then_retry(r);
        else
            wait_for_others(r);
        break;
    case RS_STREAM:
        r->front->ops->end(r->front, NULL, end != ATTEMPT_COMPLETE);
        break;
    default:
        break;
    }
    req_release(r);
}

static const struct attempt_ops attempt_ops = { .go = attempt_go,
                                                .head = attempt_head,
                                                .body = attempt_body,
                                                .upload = attempt_upload,
                                                .done = attempt_done };

/* An attempt ended without a response head. */
static void attempt_failed(struct retry_req *r, enum retry_outcome o)
{
    r->cur->att.status = 0;
    if (decide(r, o))
        wait_then_retry(r);
    else
        wait_for_others(r);
}

/* ---- deciding and waiting ---- */

static enum metrics_outcome outcome_class(enum retry_outcome o, int status);
static void account_verdict(struct retry_req *r, const struct trial *t, enum retry_outcome o,
                            const struct retry_verdict *v, bool hedging);

/* The drain deadline as it is now (0: not draining), for the decisions that follow. */
static void see_drain_deadline(struct retry_req *r)
{
    r->dr.budgets.drain_deadline_ms =
        atomic_load_explicit(&r->w->px->drain_deadline_ms, memory_order_relaxed);
}

/* What is known of the current attempt, ended in 'o' (or, hedging, past its per-try timeout),
 * and the verdict on it: the policy, the budgets, the drain deadline. */
static void judge(struct retry_req *r, enum retry_outcome o, struct retry_facts *f,
                  struct retry_verdict *v)
{
    const struct attempt *a = &r->cur->att;
    *f = (struct retry_facts){
        .outcome = o,
        .status = o == RETRY_OUT_STATUS ? a->status : 0,
        .method_retryable = r->flags & RF_RETRYABLE,
        .body_replayable = intake_replayable(&r->body),
        .attempts = r->attempts,
        .max_attempts = r->max_attempts,
        .now_ms = loop_now(r->w->loop),
        .deadline_ms = r->deadline_ms,
    };
    if (o == RETRY_OUT_STATUS) {
        f->head = &a->head;
        f->has_retry_after = retry_after_of(&a->head, &f->retry_after_ms);
        pushback_of(r->route->retry.pushback_header, &a->head, f);
    }
    if (!(r->cur->flags & TF_RECORDED)) {
        r->cur->flags |= TF_RECORDED;
        eject_record(r->rtr, r->route, r->cur->upstream, o, f->status, f->head, f->now_ms,
                     &r->w->rng);
    }
    see_drain_deadline(r);
    decide_attempt(&r->dr, f, v);
    if (v->stop == RETRY_STOP_THROTTLED)
        metrics_throttled(r->m, r->w->id);
}

/* Applies the decision for the attempt that just ended. Returns true when a retry was
 * scheduled (its wait in r->pending_delay). */
static bool decide(struct retry_req *r, enum retry_outcome o)
{
    r->last_outcome = o;
    /* the attempt that just ended gives its slots back before a new retry asks for them */
    end_retry_in_flight(r);
    struct retry_facts f;
    struct retry_verdict v;
    judge(r, o, &f, &v);
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
    count_trial(r, r->cur, outcome_class(o, f.status));
    if (retry)
        hold_slots(r);
    if (retry && o == RETRY_OUT_STATUS) {
        /* its body is read first: the retry is counted when its wait can start (settle()) */
        r->settling = v;
        r->flags |= RF_SETTLE;
    } else {
        account_verdict(r, r->cur, o, &v, false);
    }
    return retry;
}

/* The body of the response a retry was decided on has been read, or given up on (too large
 * to keep, broken off): the wait starts now, so it must still end before the deadline and the
 * drain deadline (docs/backoff.md). The verdict is counted once, as a retry or as the stop
 * that withdraws it. Returns true to wait and retry. */
static bool settle(struct retry_req *r)
{
    see_drain_deadline(r);
    enum retry_stop stop =
        decide_wait_fits(&r->dr, loop_now(r->w->loop), r->settling.delay_ms, r->deadline_ms);
    if (stop != RETRY_STOP_NONE) {
        give_up(r, stop); /* withdraws it, counted as the stop */
        return false;
    }
    r->flags &= ~RF_SETTLE;
    account_verdict(r, r->cur, RETRY_OUT_STATUS, &r->settling, false);
    return true;
}

/* The current attempt passed per_try_timeout_ms on a route that hedges, and the request may go
 * again (its method, a body held whole): the next attempt is decided as a timeout's retry would
 * be (max_attempts, the budgets, throttling, the backoff wait), but this one is not cancelled.
 * Taken, the hedge waits out its backoff while this attempt runs on in r->others; refused (and
 * counted as a denied retry), this attempt runs on alone, until the deadline at most. Returns
 * false where hedging does not apply: then the timeout ends the attempt. */
static bool hedge(struct retry_req *r)
{
    if (!r->route->retry.hedge || !(r->flags & RF_RETRYABLE) || r->body.mode == INTAKE_STREAM)
        return false;
    struct trial *t = r->cur, *next = malloc(sizeof(*next));
    if (!next)
        return false;
    trial_init(r, next);
    /* The running attempt keeps the slots of the retry it was; the hedge asks for its own. */
    if (r->flags & RF_IN_FLIGHT) {
        r->flags &= ~RF_IN_FLIGHT;
        t->flags |= TF_SLOT;
    }
    struct retry_facts f;
    struct retry_verdict v;
    judge(r, RETRY_OUT_TIMEOUT, &f, &v);
    bool go = v.fired && v.stop == RETRY_STOP_NONE;
    if (go)
        hold_slots(r);
    account_verdict(r, t, RETRY_OUT_TIMEOUT, &v, true);
    if (!go) {
        trial_free(r, next);
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
    wait_then_retry(r);
    return true;
}

/* A retry's budget slots go back (its attempt ended, or the request did first): 'bit' of
 * '*flags' says they are held. The gauge goes down before the slots are freed (and up only
 * after they are taken), so a scrape never sees more retries in flight than the cap allows. */
static void give_slots_back(struct retry_req *r, unsigned *flags, unsigned bit)
{
    if (*flags & bit) {
        *flags &= ~bit;
        metrics_retries_in_flight_add(r->w->px->metrics, -1);
        decide_release(&r->dr);
    }
}

/* A retry that decide_attempt() took holds its budget slots until its attempt ends, or until
 * the request ends before that attempt could (deadline, client gone). */
static void hold_slots(struct retry_req *r)
{
    metrics_retries_in_flight_add(r->w->px->metrics, 1);
    r->flags |= RF_IN_FLIGHT;
}

static void end_retry_in_flight(struct retry_req *r)
{
    give_slots_back(r, &r->flags, RF_IN_FLIGHT);
}

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
    r->wait_start_ms = loop_now(l);
    loop_timer_start(l, &r->backoff_timer, loop_now(l) + r->pending_delay, on_backoff, r);
    /* A zero wait ends this turn, before the socket could tell anything. */
    if (r->pending_delay)
        r->front->ops->watch(r->front);
}

/* Ends a backoff wait before its time; the log keeps the wait as it was taken. The backoff
 * timer runs exactly while the request is in RS_BACKOFF. */
static void cut_wait_short(struct retry_req *r)
{
    struct loop *l = r->w->loop;
    if (r->n_delays)
        r->delays[r->n_delays - 1] = (uint32_t)(loop_now(l) - r->wait_start_ms);
    loop_timer_stop(l, &r->backoff_timer);
}

/* ---- attempts running beside the current one (hedging) ---- */

static void trial_init(struct retry_req *r, struct trial *t)
{
    memset(t, 0, sizeof(*t));
    t->r = r;
    attempt_init(&t->att, r->w->up, &attempt_ops, t);
}

static void trial_free(struct retry_req *r, struct trial *t)
{
    attempt_fini(&t->att);
    if (t != &r->first)
        free(t);
}

/* Whether an attempt other than 'except' (may be NULL) runs on beside the current one. */
static bool others_running(const struct retry_req *r, const struct trial *except)
{
    for (const struct trial *t = r->others; t; t = t->next)
        if (t != except && !(t->flags & TF_LOST))
            return true;
    return false;
}

static void on_reap(struct loop_timer *lt)
{
    reap(lt->arg);
}

/* 't' is out of the race: counted as 'o' unless it was already, its slots given back, and
 * ended: at once when it does not run, else in the next turn (this may run inside one of
 * curl's callbacks, where no transfer may be removed). It joins r->others if it was not there. */
static void lose(struct retry_req *r, struct trial *t, enum metrics_outcome o)
{
    if (t == r->cur)
        DLIST_PUSH(r->others, t); /* the caller has a new current one */
    if (count_trial(r, t, o) && log_enabled(CFG_LOG_DEBUG))
        log_trial_as(r, t, o == METRICS_OUT_TIMEOUT ? "timeout" : "cancelled", "lost", 0);
    give_slots_back(r, &t->flags, TF_SLOT);
    if (!attempt_running(&t->att)) {
        stop_transfer(r, t); /* out of the queue for a transfer slot, if it waits there */
        DLIST_UNLINK(r->others, t);
        trial_free(r, t);
        return;
    }
    t->flags |= TF_LOST;
    struct loop *l = r->w->loop;
    if (!loop_timer_armed(&r->reap_timer))
        loop_timer_start(l, &r->reap_timer, loop_now(l), on_reap, r);
}

static void lose_others(struct retry_req *r, enum metrics_outcome o)
{
    for (struct trial *t = r->others, *next; t; t = next) {
        next = t->next;
        if (!(t->flags & TF_LOST))
            lose(r, t, o);
    }
}

/* Ends the lost attempts' transfers now (from the loop, or libmicrohttpd's callbacks). Each
 * drops the reference its transfer held, never the last: the connection holds one. */
static void reap(struct retry_req *r)
{
    loop_timer_stop(r->w->loop, &r->reap_timer);
    for (struct trial *t = r->others, *next; t; t = next) {
        next = t->next;
        if (!(t->flags & TF_LOST))
            continue;
        DLIST_UNLINK(r->others, t);
        stop_transfer(r, t);
        trial_free(r, t);
    }
}

/* Retrying has stopped on the current attempt: the answer is made now, unless attempts still
 * run beside it, which may yet bring a better one. */
static void wait_for_others(struct retry_req *r)
{
    if (others_running(r, NULL))
        r->state = RS_LAG;
    else
        answer_final(r);
}

/* 't', running beside the current attempt, has the answer: its response retry_on does not
 * name ('failed' false), or the last failure there is to return. It becomes the current
 * attempt and streams; whatever else runs is cancelled (in the next turn: this is one of
 * curl's callbacks). */
static void win(struct retry_req *r, struct trial *t, bool failed)
{
    count_trial(r, t, outcome_class(RETRY_OUT_STATUS, t->att.status));
    give_slots_back(r, &t->flags, TF_SLOT);
    if (log_enabled(CFG_LOG_DEBUG)) {
        char stop[32];
        snprintf(stop, sizeof(stop), "stop:%s", retry_stop_name(r->stop));
        log_trial(r, t, RETRY_OUT_STATUS, failed ? stop : "won", 0);
    }
    if (r->state == RS_BACKOFF) {
        cut_wait_short(r);
        r->front->ops->unwatch(r->front);
    }
    loop_timer_stop(r->w->loop, &r->try_timer);
    end_retry_in_flight(r); /* the current attempt's, or the one it waited to make */
    r->flags &= ~RF_SETTLE; /* a retry decided on a body being read is not made, nor refused */
    DLIST_UNLINK(r->others, t);
    lose(r, r->cur, METRICS_OUT_CANCELLED);
    r->cur = t;
    if (!failed) {
        r->stop = RETRY_STOP_NONE;
        r->flags |= RF_SUCCEEDED;
        decide_note_final(&r->dr, loop_now(r->w->loop));
    }
    stream(r);
}

/* A response head for 't', an attempt running beside the current one. A response retry_on
 * names is dropped, unless it is the last there will be. */
static void other_head(struct retry_req *r, struct trial *t)
{
    if (t->flags & TF_LOST)
        return; /* its cancel is on the way */
    const struct attempt *a = &t->att;
    bool failed = retry_match(&r->route->retry, RETRY_OUT_STATUS, a->status, &a->head) != NULL;
    if (!failed) {
        win(r, t, false);
        return;
    }
    if (r->state == RS_LAG && !others_running(r, t)) {
        win(r, t, true);
        return;
    }
    count_trial(r, t, outcome_class(RETRY_OUT_STATUS, a->status));
    log_trial(r, t, RETRY_OUT_STATUS, "dropped", 0);
    lose(r, t, METRICS_OUT_CANCELLED);
}

/* 't', running beside the current attempt, has ended: lost already (freed now), or without a
 * response (a failure, counted; the answer is made if the request was waiting for it last). */
static void other_done(struct retry_req *r, struct trial *t)
{
    DLIST_UNLINK(r->others, t);
    if (!(t->flags & TF_LOST)) {
        enum retry_outcome o = attempt_sent(&t->att) ? RETRY_OUT_RESET : RETRY_OUT_CONNECT_FAILURE;
        count_trial(r, t, outcome_class(o, 0));
        give_slots_back(r, &t->flags, TF_SLOT);
        log_trial(r, t, o, "dropped", 0);
    }
    trial_free(r, t);
    if (r->state == RS_LAG && !others_running(r, NULL))
        answer_final(r);
}

/* ---- timers ---- */

static void on_try_timeout(struct loop_timer *t)
{
    struct retry_req *r = t->arg;
    if (r->state != RS_ATTEMPT || !attempt_running(&r->cur->att) || hedge(r))
        return;
    stop_transfer(r, r->cur);
    attempt_failed(r, RETRY_OUT_TIMEOUT);
}

/* Retrying ends while it waits on the upstream side (the deadline, the drain deadline): the
 * retry in flight gives its slots back and the stop is counted; the caller answers. */
static void give_up(struct retry_req *r, enum retry_stop stop)
{
    end_retry_in_flight(r);
    r->stop = stop;
    if (r->flags & RF_SETTLE) {
        /* the retry decided on the response whose body is read (settle()) is withdrawn,
         * counted as the stop */
        r->flags &= ~RF_SETTLE;
        r->settling.stop = stop;
        account_verdict(r, r->cur, RETRY_OUT_STATUS, &r->settling, false);
    } else {
        account_stop(r, stop);
    }
}

static void on_deadline(struct loop_timer *t)
{
    struct retry_req *r = t->arg;
    bool running = end_attempts(r, METRICS_OUT_TIMEOUT); /* none answered in time */
    loop_timer_stop(r->w->loop, &r->try_timer);
    switch (r->state) {
    case RS_ATTEMPT:
        attempt_failed(r, RETRY_OUT_TIMEOUT); /* decide() sees the deadline: no retry */
        break;
    case RS_DRAIN:
        if (running)
            r->flags &= ~RF_SAVED_WHOLE; /* cut off mid-body: never returned as complete */
        /* fall through */
    case RS_BACKOFF:
        loop_timer_stop(r->w->loop, &r->backoff_timer);
        give_up(r, RETRY_STOP_DEADLINE);
        r->last_outcome = RETRY_OUT_TIMEOUT;
        answer_final(r);
        break;
    case RS_LAG:
        r->last_outcome = RETRY_OUT_TIMEOUT; /* retrying had stopped: that stop stands */
        answer_final(r);
        break;
    case RS_STREAM:
        r->front->ops->end(r->front, NULL, true); /* mid-body: the client must see the truncation */
        break;
    default:
        break;
    }
}

/* The drain deadline has come: a request still waiting on the upstream side (an attempt or a
 * backoff) is answered now with its last upstream response, or a 503 "draining", and
 * X-Retry-Stop: draining. Responses already streaming are left to finish. */
static void expire(struct retry_req *r)
{
    if (r->front->answered || r->state == RS_HEADERS || !r->route)
        return;
    if (r->state == RS_BACKOFF)
        cut_wait_short(r);
    loop_timer_stop(r->w->loop, &r->try_timer);
    if (end_attempts(r, METRICS_OUT_CANCELLED) && r->state == RS_DRAIN)
        r->flags &= ~RF_SAVED_WHOLE;
    give_up(r, RETRY_STOP_DRAINING);
    if (saved_whole(r))
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

/* ---- answers ---- */

/* A retryable response was kept whole: retrying that stops returns it. */
static bool saved_whole(const struct retry_req *r)
{
    return (r->flags & (RF_SAVED | RF_SAVED_WHOLE)) == (RF_SAVED | RF_SAVED_WHOLE);
}

static struct front_tag tag_of(const struct retry_req *r)
{
    return (struct front_tag){
        .attempts = r->attempts,
        .request_id = r->request_id[0] ? r->request_id : NULL,
        .stop = r->stop != RETRY_STOP_NONE ? retry_stop_name(r->stop) : NULL,
        /* a head that could not be framed, or draining: no more requests here */
        .close = r->refused != WIRE_OK ||
                 atomic_load_explicit(&r->w->px->draining, memory_order_relaxed),
        .throttled = r->flags & RF_THROTTLED ? r->throttle_p : -1,
    };
}

static void answered(struct retry_req *r)
{
    if (r->state != RS_STREAM)
        r->state = RS_ANSWERED;
    lose_others(r, METRICS_OUT_CANCELLED);
}

/* The current attempt's response is the answer: it streams, and attempts running beside it
 * are cancelled. */
static void stream(struct retry_req *r)
{
    lose_others(r, METRICS_OUT_CANCELLED);
    /* committed: a slow client must not hold a slot meant for upstream attempts */
    attempt_commit(&r->cur->att);
    r->state = RS_STREAM;
    struct front_tag tag = tag_of(r);
    r->front->ops->response(r->front, r->cur->att.status, &r->cur->att.head, &tag);
}

/* An error of retryproxy's own: {"error": ..., "route": ..., "attempts": N, "message": ...}. */
static void answer_error(struct retry_req *r, unsigned status, const char *code,
                         const char *message)
{
    struct front_tag tag = tag_of(r);
    r->front->ops->error(r->front, status, code, r->route ? r->route->name : NULL, message, &tag);
    answered(r);
}

/* The saved retryable response, when retrying stopped after it. */
static void answer_saved(struct retry_req *r)
{
    struct front_tag tag = tag_of(r);
    r->front->ops->saved(r->front, r->saved.status, &r->saved.h, r->saved.body, r->saved.len, &tag);
    answered(r);
}

/* Retrying is over without a response to stream: the last upstream response if we have it
 * whole, else an error of our own. */
static void answer_final(struct retry_req *r)
{
    if (saved_whole(r))
        answer_saved(r);
    else if (r->last_outcome == RETRY_OUT_TIMEOUT)
        answer_error(r, 504, "upstream_timeout", "no response from the upstream in time");
    else if (r->cur->att.bad_head)
        answer_error(r, 502, "upstream_invalid_response",
                     "the upstream's response head was malformed or ambiguous");
    else
        answer_error(r, 502, "upstream_unavailable", "no response from any upstream attempt");
}

/* ---- accounting ---- */

static enum metrics_outcome outcome_class(enum retry_outcome o, int status)
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
static void account_stop(struct retry_req *r, enum retry_stop stop)
{
    if (stop != RETRY_STOP_NONE)
        metrics_denied(r->m, r->w->id, (enum metrics_denied)(stop - 1));
}

/* Counts attempt 't' in attempts_total and attempt_duration_seconds, once, if it went: true if
 * it was counted now. */
static bool count_trial(struct retry_req *r, struct trial *t, enum metrics_outcome o)
{
    if ((t->flags & (TF_LAUNCHED | TF_COUNTED)) != TF_LAUNCHED)
        return false;
    t->flags |= TF_COUNTED;
    struct worker *w = r->w;
    metrics_attempt(r->m, w->id, o);
    metrics_observe(r->m, w->id, METRICS_HIST_ATTEMPT,
                    (double)(loop_now(w->loop) - t->start_ms) / 1000.0);
    return true;
}

/* The debug log line of attempt 't' (docs/logs.md), its outcome given as text. */
static void log_trial_as(struct retry_req *r, const struct trial *t, const char *outcome,
                         const char *decision, uint32_t delay_ms)
{
    struct log_attempt a = { .unix_ms = (int64_t)wall_ms(),
                             .route = r->route->name,
                             .request_id = r->request_id,
                             .attempt = t->number,
                             .upstream = t->upstream ? t->upstream->url : NULL,
                             .outcome = outcome,
                             .duration_ms = (double)(loop_now(r->w->loop) - t->start_ms),
                             .decision = decision,
                             .delay_ms = delay_ms };
    log_attempt(r->w->log, &a);
}

/* The same with the outcome 'o' ended in (the response's status for a response). */
static void log_trial(struct retry_req *r, const struct trial *t, enum retry_outcome o,
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
    log_trial_as(r, t, outcome, decision, delay_ms);
}

/* The metrics and the debug log line of a verdict on attempt 't' (ended in 'o', or past its
 * per-try timeout when 'hedging'). */
static void account_verdict(struct retry_req *r, const struct trial *t, enum retry_outcome o,
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
        account_stop(r, v->stop);
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
    log_trial(r, t, o, decision, retry ? v->delay_ms : 0);
}

/* The answer is about to go out: the request's metrics are counted now, before a byte of it
 * leaves (docs/metrics.md: a client that has its response sees it counted). Its duration runs
 * to this point, the moment the response starts. */
static void account_answer(struct retry_req *r)
{
    struct worker *w = r->w;
    metrics_request(r->m, w->id, (int)r->front->status);
    /* a retry's success: with hedging, the first attempt may answer after a retry went */
    if ((r->flags & RF_SUCCEEDED) && r->cur->number > 1)
        metrics_retry_success(r->m, w->id);
    metrics_observe(r->m, w->id, METRICS_HIST_REQUEST,
                    (double)(loop_now(w->loop) - r->start_ms) / 1000.0);
}

/* The request is over (answered, or the client went away): its log line. */
static void log_done(struct retry_req *r)
{
    struct worker *w = r->w;
    if (!log_enabled(CFG_LOG_INFO) || r->state == RS_HEADERS)
        return;
    bool sent = r->front->sent || r->stop == RETRY_STOP_CLIENT_CLOSED;
    struct log_request lr = { .unix_ms = r->start_unix_ms,
                              .route = r->route ? r->route->name : NULL,
                              .method = r->method,
                              .path = r->target,
                              /* 499: libmicrohttpd may find the socket closed first */
                              .status = sent ? (int)r->front->status : 0,
                              .attempts = r->attempts,
                              .delays = r->delays,
                              .n_delays = r->n_delays,
                              .duration_ms = (double)(loop_now(w->loop) - r->start_ms),
                              .upstream = r->cur->upstream ? r->cur->upstream->url : NULL,
                              .stop = r->stop != RETRY_STOP_NONE ? retry_stop_name(r->stop) : NULL,
                              .request_id = r->request_id[0] ? r->request_id : NULL };
    log_request(w->log, &lr);
}
