/* durable -- a request to a durable route (routes[].delivery.mode "durable", docs/delivery.md):
 * not forwarded, but taken whole, stored, and answered 202 once the store says it is on disk.
 * The state machine (retry.c) plans it, hands it over once its body is in, and moves it to
 * STORE and then ANSWERED: this file stores it and answers, through edge.c, as it asks, and
 * the store's answer goes back to the machine through the callback it passed down.
 *
 *   BODY --body complete--> STORE --committed--> ANSWERED (202, or 422, 503: store full)
 *
 * The store's call completes on the worker's queue (worker.h cq, a watch of its loop), so the
 * request waits as a backoff wait does: the loop goes on, nothing blocks on the disk. The
 * request is held (a reference) until the call completes, whatever its client does meanwhile:
 * the store borrows its body and fields until then.
 */
#include "proxy/core/req.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proxy/core/proxy.h"
#include "proxy/core/retry.h"
#include "proxy/core/worker.h"
#include "proxy/http/answer.h"
#include "proxy/http/fields.h"
#include "proxy/store/store.h"
#include "proxy/telemetry/log.h"

/* How long a caller refused for a full store is asked to wait (Retry-After). Room comes back
 * only as deliveries end (delivered ones do not count) or an operator drops dead letters:
 * minutes rather than milliseconds, so a caller that comes back at once only finds it full
 * again; 30 s keeps a refused caller's retries from adding to the load meanwhile. */
#define ACCEPT_FULL_RETRY_AFTER_S 30
/* ... and when the store failed (a shared store's database away): it reconnects within 5 s */
#define ACCEPT_DOWN_RETRY_AFTER_S 5

struct accept_job {
    struct store_call call;
    struct store_dead_new in; /* an accept stores in.req alone */
    struct store_field *fields;
    size_t nfields, cap;
    bool nomem;
    char *idem_key;
    struct retry_req *r;
    req_event_fn *event;   /* the state machine's, for the store's answer (accept_store()) */
    const char *id_header; /* the route's, left out: every attempt carries its own */
    /* a synchronous route's dead letter: its attempt, final head and first body bytes, and
     * why (the stop, and whether the body could be kept) */
    struct store_attempt att;
    char *head, *final_body, reason[48];
};

/* The fields that are the request's own, as they go into the store: hop-by-hop and framing
 * fields are the connection's (the courier frames the body again), and the id header is set
 * on every attempt from the delivery's id. */
static bool kept_field(const struct accept_job *j, const char *k, size_t kl)
{
    static const char *const framing[] = { "content-length", "transfer-encoding", "expect" };
    if (fields_hop_by_hop(k, kl))
        return false;
    for (size_t i = 0; i < sizeof(framing) / sizeof(framing[0]); i++)
        if (strlen(framing[i]) == kl && strncasecmp(framing[i], k, kl) == 0)
            return false;
    return !(strlen(j->id_header) == kl && strncasecmp(j->id_header, k, kl) == 0);
}

static void add_field(void *arg, const char *k, size_t kl, const char *v, size_t vl)
{
    struct accept_job *j = arg;
    if (j->nomem)
        return;
    if (kl == 15 && strncasecmp(k, "idempotency-key", 15) == 0 && !j->idem_key &&
        !(j->idem_key = strndup(v, vl)))
        j->nomem = true;
    if (j->nomem || !kept_field(j, k, kl))
        return;
    if (j->nfields == j->cap) {
        size_t cap = j->cap ? 2 * j->cap : 16;
        struct store_field *f = realloc(j->fields, cap * sizeof(*f));
        if (!f) {
            j->nomem = true;
            return;
        }
        j->fields = f;
        j->cap = cap;
    }
    struct store_field *f = &j->fields[j->nfields++];
    f->name = strndup(k, kl);
    f->value = strndup(v, vl);
    j->nomem = !f->name || !f->value;
}

static void job_free(struct accept_job *j)
{
    store_fields_free(j->fields, j->nfields);
    free(j->idem_key);
    free(j->head);
    free(j->final_body);
    store_call_clear(&j->call);
    free(j);
}

/* An answer made here, with fields of its own (what edge_error() cannot carry): a JSON body
 * (copied), its Content-Type, and 'extra' fields (name, value pairs, NULL-terminated). It is
 * kept as the request's saved response, as an upstream's would be: a front end may read it
 * until the request is freed (HTTP/2 sends it at the peer's pace). */
static void answer_with(struct retry_req *r, unsigned status, const char *body, size_t len,
                        const char *const *extra)
{
    struct hlist *h = &r->saved.h;
    hlist_clear(h);
    bool ok = body && hlist_add(h, "Content-Type", 12, "application/json", 16) == 0;
    for (size_t i = 0; ok && extra && extra[i]; i += 2)
        ok = hlist_add(h, extra[i], strlen(extra[i]), extra[i + 1], strlen(extra[i + 1])) == 0;
    free(r->saved.body);
    r->saved.body = ok ? malloc(len ? len : 1) : NULL;
    if (!r->saved.body) {
        edge_error(r, 500, "internal", "out of memory");
        return;
    }
    memcpy(r->saved.body, body, len);
    r->saved.len = len;
    r->saved.status = (int)status;
    /* no attempt was made, so the tag says 0 of them */
    struct answer_tag tag = { .request_id = r->request_id[0] ? r->request_id : NULL,
                              .throttled = -1 };
    r->front->ops->saved(r->front, (int)status, h, r->saved.body, len, NULL, &tag);
}

static void answer_accepted(struct retry_req *r, const char *id)
{
    char body[128], location[64];
    int len = snprintf(body, sizeof(body), "{\"id\": \"%s\", \"state\": \"scheduled\"}\n", id);
    snprintf(location, sizeof(location), "/deliveries/%s", id);
    const char *extra[] = { "X-Delivery-Id", id, "Location", location, NULL };
    answer_with(r, 202, body, (size_t)len, extra);
}

/* An error of retryproxy's own with fields besides (a Retry-After), in the JSON body every
 * error has. */
static void answer_error_with(struct retry_req *r, unsigned status, const char *code,
                              const char *message, const char *const *extra)
{
    size_t len;
    char *body = answer_error_body(code, r->route->name, 0, message, &len);
    answer_with(r, status, body, len, extra);
    free(body);
}

/* An error with Retry-After (a 503: the caller may send it again later; nothing was stored). */
static void answer_retry_after(struct retry_req *r, unsigned status, const char *code,
                               const char *message, int after_s)
{
    char after[16];
    snprintf(after, sizeof(after), "%d", after_s);
    const char *extra[] = { "Retry-After", after, NULL };
    answer_error_with(r, status, code, message, extra);
}

static enum metrics_accept result_of(int result, bool dup)
{
    switch (result) {
    case 0:
        return dup ? METRICS_ACCEPT_DUPLICATE : METRICS_ACCEPT_ACCEPTED;
    case STORE_ECONFLICT:
        return METRICS_ACCEPT_CONFLICT;
    case STORE_EFULL:
        return METRICS_ACCEPT_FULL;
    default:
        return METRICS_ACCEPT_ERROR;
    }
}

/* The words of delivery_accepts_total{result}, which the log says too. */
static const char *const result_words[METRICS_ACCEPT_COUNT] = { "accepted", "duplicate", "conflict",
                                                                "full",     "too_large", "error" };

static void count(struct retry_req *r, enum metrics_accept a)
{
    metrics_delivery_accept(r->m, r->w->id, a);
}

/* The store's answer, in the worker's thread. */
static void accept_done(struct store_call *c)
{
    struct accept_job *j = c->arg;
    struct retry_req *r = j->r;
    struct worker *w = r->w;
    enum metrics_accept res = result_of(c->result, c->dup);
    const char *word = result_words[res];
    count(r, res);
    if (c->result == 0)
        /* fields_left_out: credentials not stored, there being no store.key_file
         * (docs/delivery.md "Secrets at rest"): the upstream will not get them */
        log_event(CFG_LOG_INFO, "delivery accepted", "route", r->route->name, "result", word, "id",
                  c->id, "request_id", r->request_id, LOG_NUM("fields_left_out", c->left_out),
                  NULL);
    else
        log_event(CFG_LOG_WARN, "delivery refused", "route", r->route->name, "result", word,
                  "request_id", r->request_id, NULL);
    j->event(r, REQ_EV_STORED, c); /* answered, unless nobody is to be told */
    if (c->result == 0 && w->px->accepted)
        w->px->accepted(w->px->accepted_arg);
    job_free(j);
    req_release(r);
}

/* The store's answer to the client (REQ_EV_STORED). */
void accept_answer(struct retry_req *r, const void *arg)
{
    const struct store_call *c = arg;
    if (c->result == 0)
        answer_accepted(r, c->id);
    else if (c->result == STORE_ECONFLICT)
        edge_error(r, 422, "idempotency_conflict",
                   "this Idempotency-Key was accepted before with another body");
    else if (c->result == STORE_EFULL)
        answer_retry_after(r, 503, "store_full",
                           "the delivery store is full (store.max_count, store.max_bytes or its "
                           "disk): nothing was stored",
                           ACCEPT_FULL_RETRY_AFTER_S);
    else /* its database unreachable, say (docs/delivery.md "Shared store") */
        answer_retry_after(r, 503, "store_unavailable",
                           "the delivery store could not take the request: nothing was stored",
                           ACCEPT_DOWN_RETRY_AFTER_S);
}

/* A durable route's request is planned: its body is taken whole, up to delivery.max_body_bytes
 * (413 before anything is stored). False when it was answered. */
bool accept_plan(struct retry_req *r, bool has_body, int64_t length)
{
    const struct cfg_delivery *d = &r->route->delivery;
    if (!r->w->px->store || !r->w->cq) {
        count(r, METRICS_ACCEPT_ERROR);
        edge_error(r, 503, "store_unavailable", "no delivery store is open");
        return false;
    }
    if (length > 0 && (uint64_t)length > d->max_body_bytes) {
        count(r, METRICS_ACCEPT_TOO_LARGE);
        edge_error(r, 413, "body_too_large",
                   "the request body is larger than routes[].delivery.max_body_bytes");
        return false;
    }
    if (intake_plan(&r->body, has_body, length, d->max_body_bytes, false) < 0) {
        edge_error(r, 500, "internal", "out of memory");
        return false;
    }
    r->flags |= RF_DURABLE;
    return true;
}

/* The body of a durable request outgrew delivery.max_body_bytes while it came (chunked). */
void accept_too_large(struct retry_req *r)
{
    r->flags |= RF_OVER_LIMIT;
    count(r, METRICS_ACCEPT_TOO_LARGE);
    edge_error(r, 413, "body_too_large",
               "the request body is larger than routes[].delivery.max_body_bytes");
}

/* The body is in: the request goes to the store (true; the caller holds a reference for the
 * store, which borrows its body and target until the call completes, and is told of its answer
 * through 'event'), or it is answered. */
bool accept_store(struct retry_req *r, req_event_fn *event)
{
    struct accept_job *j = calloc(1, sizeof(*j));
    if (!j) {
        count(r, METRICS_ACCEPT_ERROR);
        edge_error(r, 503, "store_unavailable", "out of memory: nothing was stored");
        return false;
    }
    j->r = r;
    j->event = event;
    j->id_header = r->route->delivery.id_header;
    r->front->ops->fields(r->front, add_field, j);
    if (j->nomem) {
        job_free(j);
        count(r, METRICS_ACCEPT_ERROR);
        edge_error(r, 503, "store_unavailable", "out of memory: nothing was stored");
        return false;
    }
    j->in.req = (struct store_new){ .route = r->route->name,
                                    .method = r->method,
                                    .target = r->target,
                                    .fields = j->fields,
                                    .nfields = j->nfields,
                                    .body = r->body.body,
                                    .body_len = r->body.len,
                                    .idem_key = j->idem_key };
    j->call.cq = r->w->cq;
    j->call.done = accept_done;
    j->call.arg = j;
    int rc = store_enqueue(r->w->px->store, &j->call, &j->in.req);
    if (rc < 0) {
        /* nothing was taken, and the call will not complete */
        log_event(CFG_LOG_WARN, "delivery refused", "route", r->route->name, "result", "error",
                  "request_id", r->request_id, NULL);
        count(r, METRICS_ACCEPT_ERROR);
        job_free(j);
        edge_error(r, 503, "store_unavailable",
                   "the delivery store is closing: nothing was stored");
        return false;
    }
    return true;
}

/* ---- dead letters of synchronous routes (routes[].delivery.dead_letter) ---- */

/* Whether retrying ran out or was refused (the stops a dead letter is kept for): what is
 * answered then is the last failure, and the request exists nowhere else. */
static bool ran_out(const struct retry_req *r)
{
    switch (r->stop) {
    case RETRY_STOP_MAX_ATTEMPTS:
    case RETRY_STOP_BUDGET:
    case RETRY_STOP_CONCURRENCY:
    case RETRY_STOP_DEADLINE:
    case RETRY_STOP_RETRY_AFTER:
    case RETRY_STOP_PUSHBACK:
    case RETRY_STOP_THROTTLED:
        return true;
    default:
        return (r->flags & RF_THROTTLED) != 0;
    }
}

/* A dead letter the store refused (full, failing) or that could not be made (out of memory):
 * refused, never evicted, so nothing was kept, and an operator is told: a warn line and
 * dead_letters_refused_total (alerted on: docs/operations.md). */
static void not_kept(struct retry_req *r, int error)
{
    log_event(CFG_LOG_WARN, "dead letter not kept", "route", r->route->name, "request_id",
              r->request_id, LOG_NUM("error", error), NULL);
    metrics_dead_refused(r->m, r->w->id);
}

static void dead_done(struct store_call *c)
{
    struct accept_job *j = c->arg;
    struct retry_req *r = j->r;
    if (c->result == 0) {
        log_event(CFG_LOG_WARN, "delivery dead", "id", c->id, "route", r->route->name, "reason",
                  j->reason, LOG_NUM("attempts", r->attempts), LOG_NUM("status", j->att.status),
                  NULL);
        metrics_dead_letter(r->m, r->w->id,
                            r->stop == RETRY_STOP_MAX_ATTEMPTS ? METRICS_DEAD_ATTEMPTS
                                                               : METRICS_DEAD_REFUSED);
    } else {
        not_kept(r, c->result); /* the store is full, or failed */
    }
    job_free(j);
    retry_req_release(r);
}

const char *retry_req_upstream(const struct retry_req *r)
{
    const struct cfg_upstream *u = r->attempts ? trial_upstream(r, r->cur) : NULL;
    return u ? u->url : NULL;
}

void durable_answered(struct retry_req *r, int status, const struct hlist *h, const char *body,
                      size_t len)
{
    const struct cfg_route *rt = r->route;
    struct worker *w = r->w;
    /* a delivery's attempt (the courier's) is the courier's to bury */
    if (!rt || rt->delivery.mode != CFG_DELIVERY_SYNC || rt->delivery.dead_letter <= 0 ||
        !ran_out(r) || (status >= 200 && status < 400) || !w->px->store || !w->cq ||
        r->front->ops->delivery)
        return;
    struct accept_job *j = calloc(1, sizeof(*j));
    if (!j)
        goto nomem;
    j->r = r;
    j->id_header = rt->delivery.id_header;
    r->front->ops->fields(r->front, add_field, j);
    size_t cap = r->cfg->store.dead_body_bytes;
    j->head = hlist_head_text(status, h, &j->in.dead.head_len);
    j->final_body = malloc(cap ? cap : 1);
    if (j->nomem || !j->head || !j->final_body)
        goto nomem;
    len = len < cap ? len : cap;
    if (len)
        memcpy(j->final_body, body, len);
    /* the body is kept when it was buffered whole; one streamed once is not (docs/delivery.md) */
    bool whole =
        r->body.mode == INTAKE_NONE || (r->body.mode == INTAKE_BUFFER && (r->flags & RF_BODY_DONE));
    snprintf(j->reason, sizeof(j->reason), "%s%s",
             r->stop != RETRY_STOP_NONE ? retry_stop_name(r->stop) : "throttled",
             whole ? "" : "; body not kept");
    /* no attempt went (throttled, no address): one row for the request, its answer's status */
    j->att = (struct store_attempt){
        .at_ms = (uint64_t)r->start_unix_ms,
        .duration_ms = (uint32_t)((loop_clock_us(w->loop) - r->start_us) / 1000),
        .status = status,
    };
    snprintf(j->att.outcome, sizeof(j->att.outcome), "%s",
             r->stop != RETRY_STOP_NONE ? retry_stop_name(r->stop) : "throttled");
    free(j->idem_key); /* a dead letter answers for no accept: its key stays among its fields */
    j->idem_key = NULL;
    j->in.req = (struct store_new){ .route = rt->name,
                                    .method = r->method,
                                    .target = r->target,
                                    .fields = j->fields,
                                    .nfields = j->nfields,
                                    .body = whole ? r->body.body : NULL,
                                    .body_len = whole ? r->body.len : 0 };
    j->in.attempts = r->attempts;
    j->in.tries = r->dl_ntries ? r->dl_tries : &j->att;
    j->in.ntries = r->dl_ntries ? r->dl_ntries : 1;
    j->in.dead = (struct store_dead){ .reason = j->reason,
                                      .head = j->head,
                                      .head_len = j->in.dead.head_len,
                                      .body = j->final_body,
                                      .body_len = len };
    j->call.cq = w->cq;
    j->call.done = dead_done;
    j->call.arg = j;
    retry_req_hold(r); /* the store borrows its body and target until the call completes */
    if (store_insert_dead(w->px->store, &j->call, &j->in) == 0)
        return;
    retry_req_release(r);
nomem:
    not_kept(r, STORE_EIO);
    if (j)
        job_free(j);
}
