#include "proxy/retry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>

#include <curl/curl.h>

#include "policy/backoff.h"
#include "policy/retry_after.h"
#include "proxy/headers.h"
#include "proxy/log.h"
#include "proxy/metrics.h"
#include "proxy/runtime.h"
#include "proxy/server.h"
#include "proxy/upstream.h"
#include "proxy/worker.h"

/* Response headers of one attempt: bounded like a client's request headers would be. */
#define HLIST_MAX_BYTES (64 * 1024)
#define HLIST_MAX_COUNT 200
/* The body of a retryable response, kept to be returned if retrying stops. Error bodies are
 * small; a larger one is not kept and a 502 stands in for it. */
#define SAVED_BODY_MAX (64 * 1024)
/* Response bytes waiting for the client; when full, curl is paused (backpressure). */
#define DOWN_RING (64 * 1024)
/* Request bytes of a streamed upload waiting for curl; when full, the client is paused. */
#define UP_RING (256 * 1024)
/* MHD asks the content reader for at most this much at a time. */
#define READER_BLOCK (32 * 1024)
/* How much of a body over limits.max_body_bytes is read (and dropped) so that the 413 can be
 * sent; libmicrohttpd answers only once the body is complete. Past this the connection is
 * closed instead: a client may not hold it with an endless body. */
#define DISCARD_MAX (1024 * 1024)
/* X-Request-Id values longer than this are replaced by a fresh id. */
#define REQUEST_ID_MAX 128
/* What the log and requests_total say of a request whose client left before its answer
 * (nginx's "client closed request"); nothing is sent. */
#define CLIENT_CLOSED_STATUS 499

/* ---- the decision ---- */

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
    case RETRY_STOP_CLIENT_CLOSED:
        return "client-closed";
    }
    return "";
}

const struct cfg_retry_cond *retry_match(const struct cfg_retry *r, enum retry_outcome o,
                                         int status)
{
    for (size_t i = 0; i < r->n_on; i++) {
        const struct cfg_retry_cond *c = &r->on[i];
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
        }
    }
    return NULL;
}

void retry_decide(const struct cfg_retry *r, const struct retry_facts *f, struct retry_verdict *v)
{
    memset(v, 0, sizeof(*v));
    v->fired = retry_match(r, f->outcome, f->status);
    if (!v->fired)
        return;

    /* Nothing was sent on a connect failure, so any method and any body may go again. */
    bool sent = f->outcome != RETRY_OUT_CONNECT_FAILURE;
    if (sent && !f->method_retryable) {
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
    if (f->has_retry_after && r->retry_after_honor) {
        if (f->retry_after_ms > r->retry_after_max_ms) {
            v->stop = RETRY_STOP_RETRY_AFTER;
            return;
        }
        delay = f->retry_after_ms;
        v->retry_after_used = true;
    }
    /* A wait that would end at or after the deadline leaves no time for the attempt. */
    if (f->now_ms + delay >= f->deadline_ms) {
        v->stop = RETRY_STOP_DEADLINE;
        return;
    }
    v->delay_ms = (uint32_t)delay;
}

/* ---- small buffers ---- */

/* Header fields as "name\0value\0" pairs. */
struct hlist {
    char *buf;
    size_t len, cap, count;
};

static void hlist_clear(struct hlist *h)
{
    h->len = 0;
    h->count = 0;
}

static void hlist_free(struct hlist *h)
{
    free(h->buf);
    memset(h, 0, sizeof(*h));
}

/* Room for 'more' bytes after h->len, within HLIST_MAX_BYTES. */
static int hlist_reserve(struct hlist *h, size_t more)
{
    if (h->len + more > HLIST_MAX_BYTES)
        return -1;
    if (h->len + more > h->cap) {
        /* from 512: a typical head, and small enough for malloc's per-thread cache */
        size_t cap = h->cap ? h->cap : 512;
        while (cap < h->len + more)
            cap *= 2;
        char *b = realloc(h->buf, cap);
        if (!b)
            return -1;
        h->buf = b;
        h->cap = cap;
    }
    return 0;
}

static int hlist_add(struct hlist *h, const char *name, size_t nl, const char *value, size_t vl)
{
    size_t need = nl + vl + 2;
    if (h->count >= HLIST_MAX_COUNT || hlist_reserve(h, need) < 0)
        return -1;
    memcpy(h->buf + h->len, name, nl);
    h->buf[h->len + nl] = '\0';
    memcpy(h->buf + h->len + nl + 1, value, vl);
    h->buf[h->len + nl + 1 + vl] = '\0';
    h->len += need;
    h->count++;
    return 0;
}

/* Appends " " and v[0..vl) to the value of the last field (an unfolded continuation). */
static int hlist_extend_last(struct hlist *h, const char *v, size_t vl)
{
    if (!h->count || hlist_reserve(h, vl + 1) < 0)
        return -1;
    /* the last value's NUL becomes the space */
    h->buf[h->len - 1] = ' ';
    memcpy(h->buf + h->len, v, vl);
    h->len += vl;
    h->buf[h->len++] = '\0';
    return 0;
}

/* Iterates: *pos starts at 0; returns false at the end. */
static bool hlist_next(const struct hlist *h, size_t *pos, const char **name, const char **value)
{
    if (*pos >= h->len)
        return false;
    *name = h->buf + *pos;
    *value = *name + strlen(*name) + 1;
    *pos = (size_t)(*value - h->buf) + strlen(*value) + 1;
    return true;
}

static const char *hlist_get(const struct hlist *h, const char *name)
{
    size_t pos = 0;
    const char *n, *v;
    while (hlist_next(h, &pos, &n, &v))
        if (hdr_name_eq(n, name))
            return v;
    return NULL;
}

/* A byte queue that compacts instead of wrapping; bounded by 'max'. */
struct ring {
    char *buf;
    size_t start, len, cap, max;
};

static size_t ring_space(const struct ring *q)
{
    return q->max - q->len;
}

/* The buffer starts small (a response body is often a few bytes) and doubles up to 'max'. */
static int ring_put(struct ring *q, const char *p, size_t n)
{
    if (n > ring_space(q))
        return -1;
    if (q->start + q->len + n > q->cap) {
        if (q->start) {
            memmove(q->buf, q->buf + q->start, q->len);
            q->start = 0;
        }
        if (q->len + n > q->cap) {
            size_t cap = q->cap ? q->cap : 4096;
            while (cap < q->len + n)
                cap *= 2;
            if (cap > q->max)
                cap = q->max;
            char *b = realloc(q->buf, cap);
            if (!b)
                return -1;
            q->buf = b;
            q->cap = cap;
        }
    }
    memcpy(q->buf + q->start + q->len, p, n);
    q->len += n;
    return 0;
}

static size_t ring_get(struct ring *q, char *out, size_t n)
{
    if (n > q->len)
        n = q->len;
    memcpy(out, q->buf + q->start, n);
    q->start += n;
    q->len -= n;
    if (q->len == 0)
        q->start = 0;
    return n;
}

static void ring_free(struct ring *q)
{
    free(q->buf);
    q->buf = NULL;
    q->start = q->len = q->cap = 0;
}

/* ---- the request ---- */

enum req_state {
    RS_HEADERS,  /* before the first access-handler call */
    RS_BODY,     /* reading a request body that will be buffered whole */
    RS_ATTEMPT,  /* an attempt in flight, before its response headers */
    RS_DRAIN,    /* reading a retryable response's body before the wait */
    RS_BACKOFF,  /* waiting out a delay */
    RS_STREAM,   /* the upstream's response is going to the client */
    RS_ANSWERED, /* a complete answer of our own (or a saved one) is ready */
};

enum body_mode { BODY_NONE, BODY_BUFFER, BODY_STREAM };

struct retry_req {
    struct retry_req *prev, *next; /* the worker's requests */
    struct worker *w;
    struct MHD_Connection *conn; /* NULL once libmicrohttpd is done with it */
    const char *peer;            /* the client's address, while 'conn' is set */
    struct rt *rt;               /* the snapshot it started with (one reference) */
    struct cfg *cfg;             /* rt->cfg */
    const struct rt_route *rtr;  /* the matched route's bindings */
    struct metrics_route *m;     /* its metrics series (route "" until matched) */
    uint64_t start_ms;           /* loop clock when the request line arrived */
    int64_t start_unix_ms;
    uint64_t attempt_start_ms;
    const struct cfg_upstream *upstream; /* of the last attempt */
    uint32_t *delays;                    /* the waits taken, for the log */
    size_t n_delays;
    bool retry_in_flight; /* counted in retries_in_flight until its attempt ends */
    bool succeeded;       /* the last attempt was not a failure retry_on names */
    const struct cfg_route *route;
    unsigned refs; /* the connection, a running transfer, the response reader */
    enum req_state state;
    bool suspended;  /* we suspended the connection */
    bool in_handler; /* inside retry_req_access(): answers are queued on return */
    bool answered;   /* an answer is ready (r->resp, or NULL: close the connection) */
    bool queued;

    /* the request as received */
    char *target;
    char method[WIRE_METHOD_MAX + 1]; /* the framing check refuses longer ones */
    enum wire_reason refused;         /* the head was refused: answer its error */
    uint32_t method_bit;
    bool is_head;
    char request_id[REQUEST_ID_MAX + 1];
    struct curl_slist *hdrs;        /* what each attempt sends, in 'hdrs_block' */
    char *hdrs_block;               /* one allocation: see build_upstream_headers() */
    struct curl_slist attempt_node; /* "X-Retry-Attempt: N", linked at the tail */
    char attempt_hdr[40];
    char *upstream_target; /* base path + target for the current upstream */

    /* the request body */
    enum body_mode body_mode;
    bool body_done;
    int64_t content_length; /* -1: chunked */
    char *body;             /* buffered body, or the head of a streamed one */
    size_t body_len, body_cap;
    size_t body_held;      /* of body_cap, counted in the process's buffered bytes */
    size_t body_sent;      /* bytes of 'body' handed to curl in this attempt */
    struct ring upload;    /* the rest of a streamed body */
    uint64_t upload_total; /* bytes received from the client */
    bool upload_started;   /* curl has taken bytes of a streamed body: no replay */
    bool read_paused;      /* curl's read callback is paused waiting for client bytes */
    bool upload_blocked;   /* the connection is suspended until curl takes bytes */
    bool over_limit;       /* the body passed max_body_bytes: 413 */
    bool close_now;        /* give up on the connection: too much to discard */
    uint64_t discarded;    /* body bytes dropped after the answer was made */

    /* retrying */
    uint32_t attempts, max_attempts;
    bool method_retryable;
    uint64_t deadline_ms;
    uint64_t tried; /* upstreams tried, as bits */
    struct backoff_seq seq;
    enum retry_outcome last_outcome;
    enum retry_stop stop;
    uint32_t pending_delay;
    uint64_t wait_start_ms; /* when the current backoff wait began */

    /* the current attempt */
    struct upstream_xfer xfer;
    struct upstream_wait slot; /* queued for a transfer slot (limits.max_upstream_requests) */
    unsigned sends;            /* times curl was about to send this attempt's request */
    int status;
    bool hdrs_done;
    struct hlist rh;
    struct loop_timer try_timer, deadline_timer, backoff_timer;
    struct loop_watch client_w; /* the client's socket, during a backoff wait */
    bool client_watched;

    /* the last retryable response, returned as it is if retrying stops */
    struct {
        bool valid, whole;
        int status;
        struct hlist h;
        char *body;
        size_t len;
    } saved;

    /* the answer */
    struct MHD_Response *resp;
    unsigned resp_status;
    struct ring down;
    bool down_done, down_failed, curl_paused, reader_waiting;
    bool collecting;   /* holding a short body back to answer it in one piece */
    bool bad_response; /* the last attempt's response head was malformed or ambiguous */
};

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void client_unwatch(struct retry_req *r);
static void account_answer(struct retry_req *r);

/* Counts 'cap' bytes of body buffer for replay against limits.max_buffered_body_bytes (what
 * this request holds already included). False, with nothing counted, when they do not fit. */
static bool body_hold(struct retry_req *r, size_t cap)
{
    if (cap <= r->body_held)
        return true;
    atomic_uint_fast64_t *held = &r->w->px->body_bytes;
    uint64_t more = cap - r->body_held;
    uint64_t now = atomic_fetch_add_explicit(held, more, memory_order_relaxed) + more;
    if (now > r->cfg->max_buffered_body_bytes) {
        atomic_fetch_sub_explicit(held, more, memory_order_relaxed);
        return false;
    }
    r->body_held = cap;
    return true;
}

static void body_unhold(struct retry_req *r)
{
    if (r->body_held) {
        atomic_fetch_sub_explicit(&r->w->px->body_bytes, r->body_held, memory_order_relaxed);
        r->w->body_freed += r->body_held;
        r->body_held = 0;
    }
}

static void req_free(struct retry_req *r)
{
    struct loop *l = r->w->loop;
    client_unwatch(r);
    upstream_unwait(r->w->up, &r->slot);
    loop_timer_stop(l, &r->try_timer);
    loop_timer_stop(l, &r->deadline_timer);
    loop_timer_stop(l, &r->backoff_timer);
    free(r->hdrs_block);
    free(r->target);
    free(r->upstream_target);
    free(r->body);
    body_unhold(r);
    ring_free(&r->upload);
    ring_free(&r->down);
    hlist_free(&r->rh);
    hlist_free(&r->saved.h);
    free(r->saved.body);
    free(r->delays);
    rt_unref(r->rt);
    if (r->prev)
        r->prev->next = r->next;
    else
        r->w->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
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

struct retry_req *retry_req_new(struct worker *w, struct MHD_Connection *c, const char *raw_target,
                                const char *peer, enum wire_reason refused)
{
    struct retry_req *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->target = strdup(raw_target);
    if (!r->target) {
        free(r);
        return NULL;
    }
    r->w = w;
    r->conn = c;
    r->peer = peer;
    r->refused = refused;
    r->refs = 1;
    r->rt = rt_ref(w->rt);
    r->cfg = r->rt->cfg;
    r->m = r->rt->no_route;
    r->start_ms = loop_now(w->loop);
    r->start_unix_ms = (int64_t)wall_ms();
    r->content_length = -1;
    r->upload.max = UP_RING;
    r->down.max = DOWN_RING;
    r->next = w->reqs;
    if (w->reqs)
        w->reqs->prev = r;
    w->reqs = r;
    /* written by this worker only; read by the control thread while draining */
    atomic_store_explicit(&w->requests,
                          atomic_load_explicit(&w->requests, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    return r;
}

/* ---- answers ---- */

static void add_retry_headers(struct retry_req *r, struct MHD_Response *resp)
{
    if (atomic_load_explicit(&r->w->px->draining, memory_order_relaxed))
        MHD_add_response_header(resp, "Connection", "close"); /* no more requests here */
    char n[24];
    hdr_utoa(r->attempts, n);
    MHD_add_response_header(resp, "X-Retry-Attempts", n);
    if (r->stop != RETRY_STOP_NONE)
        MHD_add_response_header(resp, "X-Retry-Stop", retry_stop_name(r->stop));
}

/* Resumes the suspended connection and has libmicrohttpd look at it this turn. */
static void resume(struct retry_req *r)
{
    client_unwatch(r); /* libmicrohttpd watches the socket again */
    r->suspended = false;
    r->upload_blocked = false;
    r->reader_waiting = false;
    MHD_resume_connection(r->conn);
    server_kick(r->w->srv);
}

/* Makes 'resp' the answer. Inside the access handler it is queued on return; otherwise the
 * suspended connection is resumed and libmicrohttpd calls the handler, which queues it. */
static void answer(struct retry_req *r, struct MHD_Response *resp, unsigned status)
{
    /* resp NULL (out of memory): closing the connection is the only honest answer left */
    r->resp = resp;
    r->resp_status = status;
    r->answered = true;
    if (r->state != RS_STREAM)
        r->state = RS_ANSWERED;
    if (!r->in_handler && r->suspended && r->conn)
        resume(r);
}

/* An error of retryproxy's own: {"error": ..., "route": ..., "attempts": N, "message": ...}. */
static void answer_error(struct retry_req *r, unsigned status, const char *code,
                         const char *message)
{
    char body[512];
    char route[160] = "null";
    if (r->route)
        snprintf(route, sizeof(route), "\"%s\"", r->route->name); /* names need no escaping */
    int n = snprintf(body, sizeof(body),
                     "{\"error\": \"%s\", \"route\": %s, \"attempts\": %u, \"message\": \"%s\"}\n",
                     code, route, r->attempts, message);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer((size_t)n, body, MHD_RESPMEM_MUST_COPY);
    if (resp) {
        MHD_add_response_header(resp, "Content-Type", "application/json");
        add_retry_headers(r, resp);
    }
    answer(r, resp, status);
}

/* A head the framing check refused (proxy/wire.h): its error, and the connection closes, as
 * what follows on it cannot be framed. The log shows no method or path: they were not read. */
static void answer_refused(struct retry_req *r)
{
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
    r->method[0] = '\0';
    r->target[0] = '\0';
    r->state = RS_BODY;
    answer_error(r, status, code, wire_reason_text(r->refused));
    if (r->resp)
        MHD_add_response_header(r->resp, "Connection", "close");
}

/* Whether 'name' is listed in a Connection field of 'h'. */
static bool named_in_connection(const struct hlist *h, const char *name)
{
    size_t pos = 0;
    const char *n, *v;
    while (hlist_next(h, &pos, &n, &v))
        if (HDR_NAME_IS(n, strlen(n), "Connection") && hdr_token_listed(v, name))
            return true;
    return false;
}

static void copy_response_headers(struct retry_req *r, struct MHD_Response *resp,
                                  const struct hlist *h)
{
    bool has_connection = false;
    size_t pos = 0;
    const char *n, *v;
    while (!has_connection && hlist_next(h, &pos, &n, &v))
        has_connection = HDR_NAME_IS(n, strlen(n), "Connection");
    pos = 0;
    while (hlist_next(h, &pos, &n, &v)) {
        /* not hop-by-hop, not one of ours, not named in a Connection field */
        size_t nl = strlen(n);
        if (hdr_is_hop_by_hop(n) || HDR_NAME_IS(n, nl, "Content-Length") ||
            HDR_NAME_IS(n, nl, "X-Retry-Attempts") || HDR_NAME_IS(n, nl, "X-Retry-Stop") ||
            (has_connection && named_in_connection(h, n)))
            continue;
        MHD_add_response_header(resp, n, v);
    }
    add_retry_headers(r, resp);
}

static int64_t content_length_of(const struct hlist *h)
{
    const char *cl = hlist_get(h, "Content-Length");
    return cl ? hdr_parse_uint(cl) : -1;
}

static bool status_has_body(int status)
{
    return status != 204 && status != 304 && !(status >= 100 && status < 200);
}

static ssize_t never_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)cls;
    (void)pos;
    (void)buf;
    (void)max;
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

/* The saved retryable response, when retrying stopped after it. */
static void answer_saved(struct retry_req *r)
{
    struct MHD_Response *resp;
    int64_t cl = content_length_of(&r->saved.h);
    if (r->is_head && cl >= 0)
        /* HEAD: the upstream's length, and no body (libmicrohttpd never reads it). */
        resp = MHD_create_response_from_callback((uint64_t)cl, 1024, never_read, NULL, NULL);
    else
        resp = MHD_create_response_from_buffer(r->saved.len, r->saved.body ? r->saved.body : "",
                                               MHD_RESPMEM_MUST_COPY);
    if (resp)
        copy_response_headers(r, resp, &r->saved.h);
    answer(r, resp, (unsigned)r->saved.status);
}

/* Retrying is over without a response to stream: the last upstream response if we have it
 * whole, else an error of our own. */
static void answer_final(struct retry_req *r)
{
    if (r->saved.valid && r->saved.whole) {
        answer_saved(r);
        return;
    }
    if (r->last_outcome == RETRY_OUT_TIMEOUT)
        answer_error(r, MHD_HTTP_GATEWAY_TIMEOUT, "upstream_timeout",
                     "no response from the upstream in time");
    else if (r->bad_response)
        answer_error(r, MHD_HTTP_BAD_GATEWAY, "upstream_invalid_response",
                     "the upstream's response head was malformed or ambiguous");
    else
        answer_error(r, MHD_HTTP_BAD_GATEWAY, "upstream_unavailable",
                     "no response from any upstream attempt");
}

/* ---- the response body, streamed ---- */

static void release_reader(void *cls)
{
    req_release(cls);
}

static void resume_reader(struct retry_req *r)
{
    if (r->reader_waiting && r->suspended && r->conn)
        resume(r);
}

/* libmicrohttpd wants body bytes for the client. With none buffered and the upstream still
 * sending, the connection is suspended until curl delivers more (returning 0 alone would make
 * libmicrohttpd call again at once, a busy loop). */
static ssize_t read_body(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct retry_req *r = cls;
    if (r->down.len) {
        size_t n = ring_get(&r->down, buf, max);
        if (r->curl_paused && r->xfer.easy && ring_space(&r->down) >= CURL_MAX_WRITE_SIZE) {
            r->curl_paused = false;
            curl_easy_pause(r->xfer.easy, CURLPAUSE_CONT);
        }
        return (ssize_t)n;
    }
    if (r->down_failed)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    if (r->down_done)
        return MHD_CONTENT_READER_END_OF_STREAM;
    if (r->conn) {
        r->reader_waiting = true;
        r->suspended = true;
        MHD_suspend_connection(r->conn);
    }
    return 0;
}

/* Answers with the response whose headers are in, its body read through read_body(). */
static void start_streaming(struct retry_req *r)
{
    int64_t cl = content_length_of(&r->rh);
    uint64_t size = MHD_SIZE_UNKNOWN;
    if (cl >= 0 && (r->is_head || status_has_body(r->status)))
        size = (uint64_t)cl;
    r->collecting = false;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(size, READER_BLOCK, read_body, r, release_reader);
    if (resp) {
        r->refs++; /* the reader's */
        copy_response_headers(r, resp, &r->rh);
    }
    answer(r, resp, (unsigned)r->status);
}

/* The whole body is in the buffer: answer with it in one piece (libmicrohttpd writes headers
 * and body together), handing the buffer over rather than copying it. */
static void answer_collected(struct retry_req *r)
{
    struct MHD_Response *resp;
    r->collecting = false;
    if (r->down.start == 0 && r->down.buf) {
        resp = MHD_create_response_from_buffer(r->down.len, r->down.buf, MHD_RESPMEM_MUST_FREE);
        if (resp)
            r->down.buf = NULL;
    } else {
        resp = MHD_create_response_from_buffer(r->down.len, (void *)"", MHD_RESPMEM_PERSISTENT);
    }
    r->down.len = 0;
    if (resp)
        copy_response_headers(r, resp, &r->rh);
    answer(r, resp, (unsigned)r->status);
}

/* Response headers are in and this response is the answer. A body that fits the buffer is
 * usually complete within the same read as the headers: collect it and answer in one piece.
 * Anything larger, or not finished when the buffer fills, streams. */
static void answer_stream(struct retry_req *r)
{
    int64_t cl = content_length_of(&r->rh);
    r->state = RS_STREAM;
    if (!status_has_body(r->status) || (!r->is_head && (cl < 0 || (uint64_t)cl <= DOWN_RING))) {
        /* 1xx, 204 and 304 have no body whatever the upstream sends (RFC 9112 6.3): answered
         * once the transfer ends, with none */
        r->collecting = true;
        if (cl > 0 && !r->down.buf && (r->down.buf = malloc((size_t)cl)) != NULL)
            r->down.cap = (size_t)cl;
    } else {
        start_streaming(r);
    }
}

/* ---- attempts ---- */

static void start_attempt(struct retry_req *r);
static void attempt_done(struct upstream_xfer *x, CURLcode rc);

/* The Retry-After of the current response, if it holds exactly one valid value. */
static bool retry_after_of(const struct hlist *h, uint64_t *ms)
{
    const char *vals[2];
    size_t lens[2], n = 0, pos = 0;
    const char *name, *v;
    while (hlist_next(h, &pos, &name, &v)) {
        if (!hdr_name_eq(name, "Retry-After"))
            continue;
        if (n < 2) {
            vals[n] = v;
            lens[n] = strlen(v);
        }
        n++;
    }
    return retry_after_parse_fields(vals, lens, n > 2 ? 2 : n, (int64_t)wall_ms(), ms) == 0;
}

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
                   RETRY_STOP_MAX_ATTEMPTS - 1 == METRICS_DENIED_MAX_ATTEMPTS,
               "retries_denied_total reasons follow enum retry_stop");

/* A retry that was decided ends its count in retries_in_flight when its attempt ends, or when
 * the request ends before that attempt could (deadline, client gone). */
static void end_retry_in_flight(struct retry_req *r)
{
    if (r->retry_in_flight) {
        r->retry_in_flight = false;
        /* The gauge goes down before the slots are freed (and up only after they are taken),
         * so a scrape never sees more retries in flight than the cap allows. */
        metrics_retries_in_flight_add(r->w->px->metrics, -1);
        budget_release(&r->w->px->budget);
        budget_release(&r->rtr->live->budget);
    }
}

/* A retry the policy asked for must also fit the process-wide budget and the route's
 * (concurrency first, then the ratio) and, while draining, end its wait before the drain
 * deadline. An admitted retry holds a concurrency slot in both budgets until its attempt ends
 * (end_retry_in_flight), its wait included. */
static enum retry_stop admit(struct retry_req *r, uint32_t delay_ms)
{
    struct proxy *px = r->w->px;
    uint64_t now = loop_now(r->w->loop);
    uint64_t drain = atomic_load_explicit(&px->drain_deadline_ms, memory_order_relaxed);
    if (drain && now + delay_ms >= drain)
        return RETRY_STOP_DRAINING;
    const struct cfg_budget *gb = &r->cfg->budget, *rb = &r->route->budget;
    struct budget *g = &px->budget, *lb = &r->rtr->live->budget;
    if (!budget_acquire(g, gb->max_concurrent_retries))
        return RETRY_STOP_CONCURRENCY;
    if (!budget_acquire(lb, rb->max_concurrent_retries)) {
        budget_release(g);
        return RETRY_STOP_CONCURRENCY;
    }
    struct budget_limits gl = { gb->max_concurrent_retries, gb->retry_ratio,
                                gb->min_retries_per_second, gb->window_ms };
    struct budget_limits rl = { rb->max_concurrent_retries, rb->retry_ratio,
                                rb->min_retries_per_second, rb->window_ms };
    if (!budget_ratio_allows(g, &gl, now) || !budget_ratio_allows(lb, &rl, now)) {
        budget_release(lb);
        budget_release(g);
        return RETRY_STOP_BUDGET;
    }
    budget_note_retry(g, now);
    budget_note_retry(lb, now);
    return RETRY_STOP_NONE;
}

/* Counts a stop: a retry that retry_on asked for but that was not made. */
static void account_stop(struct retry_req *r, enum retry_stop stop)
{
    if (stop != RETRY_STOP_NONE)
        metrics_denied(r->m, r->w->id, (enum metrics_denied)(stop - 1));
}

/* Metrics and the debug log line of an attempt that just ended, with its verdict. */
static void account_attempt(struct retry_req *r, enum retry_outcome o,
                            const struct retry_verdict *v)
{
    struct worker *w = r->w;
    uint64_t now = loop_now(w->loop);
    metrics_attempt(r->m, w->id, outcome_class(o, r->status));
    metrics_observe(r->m, w->id, METRICS_HIST_ATTEMPT,
                    (double)(now - r->attempt_start_ms) / 1000.0);
    bool retry = v->fired && v->stop == RETRY_STOP_NONE;
    if (retry) {
        size_t k = (size_t)(v->fired - r->route->retry.on);
        metrics_retry(r->m, w->id, r->rtr->reasons[k]);
        metrics_observe(r->m, w->id, METRICS_HIST_BACKOFF, v->delay_ms / 1000.0);
        if (v->retry_after_used)
            metrics_retry_after_honored(r->m, w->id);
        metrics_retries_in_flight_add(w->px->metrics, 1);
        r->retry_in_flight = true; /* admit() took the budget slots */
        uint32_t *d = realloc(r->delays, (r->n_delays + 1) * sizeof(*d));
        if (d) {
            d[r->n_delays++] = v->delay_ms;
            r->delays = d;
        }
    } else if (v->fired) {
        account_stop(r, v->stop);
    }
    if (log_enabled(CFG_LOG_DEBUG)) {
        char outcome[16], decision[48];
        if (o == RETRY_OUT_STATUS)
            snprintf(outcome, sizeof(outcome), "%d", r->status);
        else
            snprintf(outcome, sizeof(outcome), "%s",
                     o == RETRY_OUT_CONNECT_FAILURE ? "connect-failure"
                     : o == RETRY_OUT_RESET         ? "reset"
                                                    : "timeout");
        snprintf(decision, sizeof(decision), "%s%s",
                 retry      ? "retry"
                 : v->fired ? "stop:"
                            : "final",
                 !retry && v->fired ? retry_stop_name(v->stop) : "");
        struct log_attempt a = { .unix_ms = (int64_t)wall_ms(),
                                 .route = r->route->name,
                                 .request_id = r->request_id,
                                 .attempt = r->attempts,
                                 .upstream = r->upstream ? r->upstream->url : NULL,
                                 .outcome = outcome,
                                 .duration_ms = (double)(now - r->attempt_start_ms),
                                 .decision = decision,
                                 .delay_ms = retry ? v->delay_ms : 0 };
        log_attempt(w->log, &a);
    }
}

/* Applies the decision for the attempt that just ended; 'saved' responses were kept by the
 * caller. Returns true when a retry was scheduled. */
static bool decide(struct retry_req *r, enum retry_outcome o)
{
    const struct cfg_retry *policy = &r->route->retry;
    struct loop *l = r->w->loop;
    struct retry_facts f = {
        .outcome = o,
        .status = r->status,
        .method_retryable = r->method_retryable,
        .body_replayable = r->body_mode != BODY_STREAM || !r->upload_started,
        .attempts = r->attempts,
        .max_attempts = r->max_attempts,
        .now_ms = loop_now(l),
        .deadline_ms = r->deadline_ms,
    };
    r->last_outcome = o;
    /* The delay this retry would wait; the sequence moves only if the retry is taken (a
     * route-scoped one is shared, and a refused retry must not move it for the others). */
    bool route_scope = policy->backoff.scope == BACKOFF_SCOPE_ROUTE;
    struct live_backoff_mark mark = { 0 };
    struct backoff_seq seq = r->seq;
    if (retry_match(policy, o, r->status) && r->attempts < r->max_attempts)
        f.backoff_ms = route_scope
                           ? live_route_backoff_peek(r->rtr->live, &policy->backoff, loop_now(l),
                                                     &r->w->rng, &mark)
                           : backoff_seq_next(&seq, &policy->backoff, loop_now(l), &r->w->rng);
    if (o == RETRY_OUT_STATUS)
        f.has_retry_after = retry_after_of(&r->rh, &f.retry_after_ms);

    struct retry_verdict v;
    retry_decide(policy, &f, &v);
    /* end_retry_in_flight() first: the attempt that just ended gives its slots back before a
     * new retry asks for them */
    end_retry_in_flight(r);
    if (v.fired && v.stop == RETRY_STOP_NONE)
        v.stop = admit(r, v.delay_ms);
    r->stop = v.fired ? v.stop : RETRY_STOP_NONE;
    r->succeeded = o == RETRY_OUT_STATUS && !v.fired;
    bool retry = v.fired && v.stop == RETRY_STOP_NONE;
    if (retry) {
        r->pending_delay = v.delay_ms;
        if (route_scope)
            live_route_backoff_take(r->rtr->live, &policy->backoff, loop_now(l), &r->w->rng, &mark);
        else
            r->seq = seq;
    }
    account_attempt(r, o, &v);
    return retry;
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

/* ---- the client going away during a wait ---- */

/* A request waiting out a backoff delay has its connection suspended, and libmicrohttpd does
 * not look at a suspended connection's socket: a client that gives up would go unnoticed
 * until retrying ends, every retry still costing the upstream an attempt (nginx stops too,
 * its "499"). The socket is watched during the wait for the client closing or resetting it.
 * A request whose attempt is running is not watched: that wait is bounded by the per-try
 * timeout and watching every request would cost two epoll_ctl calls each. */
static void on_client_event(struct loop_watch *cw, uint32_t events)
{
    (void)events;
    struct retry_req *r = cw->arg;
    client_unwatch(r);
    if (r->state != RS_BACKOFF || r->answered)
        return;
    cut_wait_short(r);
    end_retry_in_flight(r);
    r->stop = RETRY_STOP_CLIENT_CLOSED;
    /* Counted now, as if answered: no response will go out to count it later. */
    r->resp_status = CLIENT_CLOSED_STATUS;
    account_answer(r);
    answer(r, NULL, CLIENT_CLOSED_STATUS); /* no answer: libmicrohttpd closes the connection */
}

static void client_watch(struct retry_req *r)
{
    if (r->client_watched || !r->suspended || !r->conn)
        return;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci && loop_watch_add(r->w->loop, &r->client_w, ci->connect_fd, EPOLLRDHUP, on_client_event,
                             r) == 0)
        r->client_watched = true;
}

static void client_unwatch(struct retry_req *r)
{
    if (!r->client_watched)
        return;
    loop_watch_del(r->w->loop, &r->client_w);
    r->client_watched = false;
}

static void on_backoff(struct loop_timer *t)
{
    struct retry_req *r = t->arg;
    client_unwatch(r);
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
        client_watch(r);
}

/* An attempt ended without response headers. */
static void attempt_failed(struct retry_req *r, enum retry_outcome o)
{
    r->status = 0;
    if (decide(r, o))
        wait_then_retry(r);
    else
        answer_final(r);
}

/* How an attempt without response headers ended. The pre-request callback runs right before
 * the request goes out on an established connection: if it never ran, nothing reached the
 * upstream, whatever curl's error. */
static enum retry_outcome classify(const struct retry_req *r)
{
    return r->sends == 0 ? RETRY_OUT_CONNECT_FAILURE : RETRY_OUT_RESET;
}

/* Ends the current attempt's transfer, whether it runs or still waits for a slot, without its
 * 'done' being called. Returns true if it was running; its reference is dropped then, never
 * the last: the connection, or the response reader, holds one. */
static bool stop_transfer(struct retry_req *r)
{
    upstream_unwait(r->w->up, &r->slot);
    if (!r->xfer.easy)
        return false;
    upstream_cancel(r->w->up, &r->xfer);
    r->refs--;
    return true;
}

static void on_try_timeout(struct loop_timer *t)
{
    struct retry_req *r = t->arg;
    if (r->state != RS_ATTEMPT || !stop_transfer(r))
        return;
    attempt_failed(r, RETRY_OUT_TIMEOUT);
}

static void on_deadline(struct loop_timer *t)
{
    struct retry_req *r = t->arg;
    bool running = stop_transfer(r);
    loop_timer_stop(r->w->loop, &r->try_timer);
    switch (r->state) {
    case RS_ATTEMPT:
        attempt_failed(r, RETRY_OUT_TIMEOUT); /* decide() sees the deadline: no retry */
        break;
    case RS_DRAIN:
        if (running)
            r->saved.whole = false; /* cut off mid-body: never replayed as complete */
        /* fall through */
    case RS_BACKOFF:
        loop_timer_stop(r->w->loop, &r->backoff_timer);
        end_retry_in_flight(r);
        r->stop = RETRY_STOP_DEADLINE;
        account_stop(r, r->stop);
        r->last_outcome = RETRY_OUT_TIMEOUT;
        answer_final(r);
        break;
    case RS_STREAM:
        /* Mid-body: the client must see the truncation. */
        r->down_failed = true;
        if (r->collecting)
            start_streaming(r);
        else
            resume_reader(r);
        break;
    default:
        break;
    }
}

/* A response head that cannot be relayed as received: the transfer is aborted and the attempt
 * ends as a reset would (RFC 9112 6.3: a proxy answers such a response with 502). */
static size_t bad_head(struct retry_req *r)
{
    r->bad_response = true;
    return 0;
}

/* Content-Length, when present, must be one decimal number however many times it is sent
 * (RFC 9112 6.3: differing values make the framing unknowable). */
static bool length_unambiguous(const struct hlist *h)
{
    size_t pos = 0;
    const char *n, *v;
    int64_t seen = -1;
    while (hlist_next(h, &pos, &n, &v)) {
        if (!hdr_name_eq(n, "Content-Length"))
            continue;
        int64_t cl = hdr_parse_uint(v);
        if (cl < 0 || (seen >= 0 && cl != seen))
            return false;
        seen = cl;
    }
    return true;
}

static size_t on_header(char *b, size_t size, size_t n, void *ud)
{
    struct retry_req *r = ud;
    size_t len = size * n;
    if (r->state != RS_ATTEMPT)
        return len; /* trailers of a response already decided */
    if (len >= 5 && memcmp(b, "HTTP/", 5) == 0) {
        const char *sp = memchr(b, ' ', len);
        if (!sp || (size_t)(sp - b) + 4 > len || sp[1] < '1' || sp[1] > '5' || sp[2] < '0' ||
            sp[2] > '9' || sp[3] < '0' || sp[3] > '9')
            return 0; /* not an HTTP status line: abort, seen as a reset */
        r->status = (sp[1] - '0') * 100 + (sp[2] - '0') * 10 + (sp[3] - '0');
        hlist_clear(&r->rh);
        return len;
    }
    if (r->status == 0)
        return bad_head(r); /* a field before any status line */
    if (len <= 2 && (b[0] == '\r' || b[0] == '\n')) {
        if (r->status >= 200)
            r->hdrs_done = true;
        else
            r->status = 0; /* an interim 1xx: the real status line follows */
        if (!r->hdrs_done)
            return len;
        if (!length_unambiguous(&r->rh))
            return bad_head(r);
        loop_timer_stop(r->w->loop, &r->try_timer);
        if (decide(r, RETRY_OUT_STATUS)) {
            /* Keep this response in case retrying stops; read its body first so the
             * connection can be reused. */
            hlist_free(&r->saved.h);
            r->saved.h = r->rh;
            memset(&r->rh, 0, sizeof(r->rh));
            r->saved.status = r->status;
            r->saved.valid = true;
            r->saved.whole = true;
            r->saved.len = 0;
            r->state = RS_DRAIN;
        } else {
            answer_stream(r);
        }
        return len;
    }
    /* name: value */
    size_t end = len;
    while (end > 0 && (b[end - 1] == '\r' || b[end - 1] == '\n'))
        end--;
    /* RFC 9112 5.2: an obs-fold (a line starting with whitespace) continues the previous
     * value; a proxy replaces it by a space before anything reads the value */
    bool fold = b[0] == ' ' || b[0] == '\t';
    const char *colon = fold ? NULL : memchr(b, ':', end);
    if (!fold && (!colon || !hdr_name_valid_n(b, (size_t)(colon - b))))
        return bad_head(r); /* not a field line */
    const char *v = fold ? b : colon + 1, *ve = b + end;
    while (v < ve && (*v == ' ' || *v == '\t'))
        v++;
    while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
        ve--;
    size_t vl = (size_t)(ve - v);
    if (!hdr_value_valid_n(v, vl))
        return bad_head(r);
    if (fold)
        return hlist_extend_last(&r->rh, v, vl) < 0 ? bad_head(r) : len;
    if (hlist_add(&r->rh, b, (size_t)(colon - b), v, vl) < 0)
        return 0; /* too many or too large: abort, seen as a reset */
    return len;
}

static size_t on_write(char *p, size_t size, size_t n, void *ud)
{
    struct retry_req *r = ud;
    size_t len = size * n;
    if (r->state == RS_DRAIN) {
        if (!r->saved.whole || r->saved.len + len > SAVED_BODY_MAX) {
            r->saved.whole = false;
            return 0; /* too large to keep: stop reading, the wait starts now */
        }
        char *b = realloc(r->saved.body, r->saved.len + len);
        if (!b) {
            r->saved.whole = false;
            return 0;
        }
        memcpy(b + r->saved.len, p, len);
        r->saved.body = b;
        r->saved.len += len;
        return len;
    }
    if (r->state != RS_STREAM || !r->conn)
        return 0;
    if (!status_has_body(r->status))
        return len; /* never relayed */
    if (r->collecting && len > ring_space(&r->down))
        start_streaming(r); /* too large to answer in one piece */
    if (len > ring_space(&r->down)) {
        r->curl_paused = true;
        return CURL_WRITEFUNC_PAUSE; /* delivered again once the client has read */
    }
    if (ring_put(&r->down, p, len) < 0)
        return 0;
    resume_reader(r);
    return len;
}

/* Bytes of the request body for curl: the buffered head, then the streamed rest. */
static size_t on_read(char *buf, size_t size, size_t n, void *ud)
{
    struct retry_req *r = ud;
    size_t max = size * n, got = 0;
    if (r->body_sent < r->body_len) {
        got = r->body_len - r->body_sent;
        if (got > max)
            got = max;
        memcpy(buf, r->body + r->body_sent, got);
        r->body_sent += got;
    }
    if (got < max && r->upload.len)
        got += ring_get(&r->upload, buf + got, max - got);
    if (got > 0) {
        r->upload_started = true;
        if (r->upload_blocked && r->conn && ring_space(&r->upload) > 0)
            resume(r);
        return got;
    }
    if (r->body_done)
        return 0;
    r->read_paused = true;
    return CURL_READFUNC_PAUSE;
}

/* A second call means curl is about to send the same request again on a new connection by
 * itself (its reaction to a kept-alive connection found dead). The first send may have reached
 * the upstream: abort, and let the retry policy decide as for any reset. */
static int on_prereq(void *ud, char *ip, char *local_ip, int port, int local_port)
{
    (void)ip;
    (void)local_ip;
    (void)port;
    (void)local_port;
    struct retry_req *r = ud;
    return ++r->sends > 1 ? CURL_PREREQFUNC_ABORT : CURL_PREREQFUNC_OK;
}

static void attempt_done(struct upstream_xfer *x, CURLcode rc)
{
    struct retry_req *r = x->arg;
    loop_timer_stop(r->w->loop, &r->try_timer);
    switch (r->state) {
    case RS_ATTEMPT:
        attempt_failed(r, classify(r));
        break;
    case RS_DRAIN:
        if (rc != CURLE_OK && rc != CURLE_WRITE_ERROR)
            r->saved.whole = false; /* the body broke off: not something to return as is */
        wait_then_retry(r);
        break;
    case RS_STREAM:
        r->down_done = true;
        r->down_failed = rc != CURLE_OK;
        if (r->collecting && !r->down_failed)
            answer_collected(r);
        else if (r->collecting)
            start_streaming(r); /* what came, then the truncation */
        else
            resume_reader(r);
        break;
    default:
        break;
    }
    req_release(r);
}

/* Round-robin over the route's upstreams, preferring one this request has not tried. */
static size_t pick_upstream(struct retry_req *r)
{
    const struct cfg_route *rt = r->route;
    size_t n = rt->n_upstreams;
    /* The worker's positions belong to its current snapshot; a request that started under an
     * older one (a reload since) starts anywhere. */
    size_t start;
    if (r->rt == r->w->rt) {
        uint32_t *rr = &r->w->rr[rt - r->cfg->routes];
        start = *rr % n;
        *rr = (uint32_t)(start + 1);
    } else {
        start = (size_t)rng_between(&r->w->rng, 0, n - 1);
    }
    for (size_t k = 0; k < n && k < 64; k++) {
        size_t i = (start + k) % n;
        if (i >= 64 || !(r->tried & (1ULL << i)))
            return i;
    }
    return start;
}

static void launch(struct retry_req *r);

static void on_slot(struct upstream_wait *wt)
{
    launch((struct retry_req *)(void *)((char *)wt - offsetof(struct retry_req, slot)));
}

static void start_attempt(struct retry_req *r)
{
    struct worker *w = r->w;
    struct loop *l = w->loop;
    const struct cfg_route *rt = r->route;
    uint64_t now = loop_now(l);

    if (r->attempts == 0) {
        /* timeout_ms covers every attempt and wait, from the first attempt on */
        r->deadline_ms = now + rt->timeout_ms;
        loop_timer_start(l, &r->deadline_timer, r->deadline_ms, on_deadline, r);
        /* the base of both ratio budgets */
        budget_note_request(&w->px->budget, now);
        budget_note_request(&r->rtr->live->budget, now);
    }
    r->attempts++;
    r->sends = 0;
    r->status = 0;
    r->bad_response = false;
    r->hdrs_done = false;
    r->body_sent = 0;
    hlist_clear(&r->rh);
    r->state = RS_ATTEMPT;

    size_t i = pick_upstream(r);
    if (i < 64)
        r->tried |= 1ULL << i;
    r->upstream = &rt->upstreams[i];
    r->attempt_start_ms = now;
    if (upstream_full(w->up))
        upstream_wait(w->up, &r->slot, on_slot); /* the attempt starts when a slot frees */
    else
        launch(r);
}

/* The current attempt's transfer, given a slot. */
static void launch(struct retry_req *r)
{
    struct worker *w = r->w;
    struct loop *l = w->loop;
    const struct cfg_route *rt = r->route;
    const struct cfg_upstream *u = r->upstream;
    size_t i = (size_t)(u - rt->upstreams);
    uint64_t now = loop_now(l);

    CURL *e = upstream_easy_get(w->up);
    if (!e) {
        attempt_failed(r, RETRY_OUT_CONNECT_FAILURE);
        return;
    }
    free(r->upstream_target);
    r->upstream_target = NULL;
    if (*u->base_path && strcmp(r->target, "*") != 0) {
        size_t bl = strlen(u->base_path), tl = strlen(r->target);
        r->upstream_target = malloc(bl + tl + 1);
        if (r->upstream_target) {
            memcpy(r->upstream_target, u->base_path, bl);
            memcpy(r->upstream_target + bl, r->target, tl + 1);
        }
    }
    upstream_easy_url(e, r->rtr->urls[i]);
    curl_easy_setopt(e, CURLOPT_REQUEST_TARGET,
                     r->upstream_target ? r->upstream_target : r->target);
    if (r->is_head)
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    else if (strcmp(r->method, "GET") != 0 || r->body_mode != BODY_NONE)
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r->method);
    if (r->body_mode == BODY_BUFFER) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, r->body ? r->body : "");
    } else if (r->body_mode == BODY_STREAM) {
        curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(e, CURLOPT_READDATA, r);
        curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->content_length);
    }
    memcpy(r->attempt_hdr, "X-Retry-Attempt: ", 17);
    hdr_utoa(r->attempts, r->attempt_hdr + 17);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->hdrs);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, on_prereq);
    curl_easy_setopt(e, CURLOPT_PREREQDATA, r);
    uint64_t left = r->deadline_ms > now ? r->deadline_ms - now : 1;
    uint64_t connect =
        rt->connect_timeout_ms && rt->connect_timeout_ms < left ? rt->connect_timeout_ms : left;
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)connect);

    r->xfer.easy = e;
    r->refs++;
    if (upstream_start(w->up, &r->xfer, attempt_done, r) < 0) {
        r->refs--;
        attempt_failed(r, RETRY_OUT_CONNECT_FAILURE);
        return;
    }
    if (rt->per_try_timeout_ms && now + rt->per_try_timeout_ms < r->deadline_ms)
        loop_timer_start(l, &r->try_timer, now + rt->per_try_timeout_ms, on_try_timeout, r);
}

/* ---- draining ---- */

/* The drain deadline has come: a request still waiting on the upstream side (an attempt or a
 * backoff) is answered now with its last upstream response, or a 503 "draining", and
 * X-Retry-Stop: draining. Responses already streaming are left to finish. */
static void expire(struct retry_req *r)
{
    if (r->answered || r->state == RS_HEADERS || !r->route)
        return;
    struct loop *l = r->w->loop;
    if (r->state == RS_BACKOFF)
        cut_wait_short(r);
    loop_timer_stop(l, &r->try_timer);
    if (stop_transfer(r) && r->state == RS_DRAIN)
        r->saved.whole = false;
    end_retry_in_flight(r);
    r->stop = RETRY_STOP_DRAINING;
    account_stop(r, r->stop);
    if (r->saved.valid && r->saved.whole)
        answer_saved(r);
    else
        answer_error(r, MHD_HTTP_SERVICE_UNAVAILABLE, "draining", "retryproxy is shutting down");
}

void retry_expire_all(struct worker *w)
{
    for (struct retry_req *r = w->reqs, *next; r; r = next) {
        next = r->next;
        expire(r);
    }
}

/* ---- the request line and headers ---- */

struct scan {
    unsigned n_cl, n_te, n_host, n_bad;
    size_t n_fields, field_bytes; /* every header, for sizing what is forwarded */
    const char *cl, *host, *idem, *max_attempts, *request_id, *accept, *ctype;
    const char *connection[8];
    unsigned n_connection;
    size_t xff_len;
};

/* CR, LF and other control bytes in a header make the request a 400. A NUL cannot reach the
 * upstream: libmicrohttpd 0.9.75 cuts the value at it while parsing (and reports that shorter
 * length); a version reporting the true length makes such a header a 400 here too. */
static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *k, size_t k_len,
                                   const char *v, size_t v_len)
{
    (void)kind;
    struct scan *s = cls;
    if (!v)
        v = "";
    s->n_fields++;
    s->field_bytes += k_len + v_len;
    if (!hdr_name_valid(k) || !hdr_value_valid(v) || strlen(k) != k_len || strlen(v) != v_len)
        s->n_bad++;
    if (HDR_NAME_IS(k, k_len, "Content-Length")) {
        s->n_cl++;
        s->cl = v;
    } else if (HDR_NAME_IS(k, k_len, "Transfer-Encoding")) {
        s->n_te++;
    } else if (HDR_NAME_IS(k, k_len, "Host")) {
        s->n_host++;
        s->host = v;
    } else if (HDR_NAME_IS(k, k_len, "Idempotency-Key")) {
        s->idem = v;
    } else if (HDR_NAME_IS(k, k_len, "X-Retry-Max-Attempts")) {
        s->max_attempts = v;
    } else if (HDR_NAME_IS(k, k_len, "X-Request-Id")) {
        s->request_id = v;
    } else if (HDR_NAME_IS(k, k_len, "Accept")) {
        s->accept = v;
    } else if (HDR_NAME_IS(k, k_len, "Content-Type")) {
        s->ctype = v;
    } else if (HDR_NAME_IS(k, k_len, "Connection")) {
        if (s->n_connection < 8)
            s->connection[s->n_connection++] = v;
    } else if (HDR_NAME_IS(k, k_len, "X-Forwarded-For")) {
        s->xff_len += v_len + 2;
    }
    return MHD_YES;
}

/* The header lines every attempt sends, built once per request in one allocation: the list
 * nodes first, then the text they point into. Sized from the scan, so it never grows. */
struct hbuild {
    struct curl_slist *nodes;
    size_t n, max;
    char *text;
    size_t used, cap;
};

/* Appends "name: value", or "name;" for an empty value (curl reads "name:" as "remove
 * name"), or the bare 'name' when 'v' is NULL (a removal such as "Accept:"). */
static void hb_add(struct hbuild *b, const char *k, size_t kl, const char *v, size_t vl)
{
    size_t need = kl + (v ? vl + 2 : 0) + 1;
    if (b->n == b->max || b->used + need > b->cap)
        return; /* cannot happen: sized from the scan; the header is left out */
    char *o = b->text + b->used;
    memcpy(o, k, kl);
    if (v && vl) {
        memcpy(o + kl, ": ", 2);
        memcpy(o + kl + 2, v, vl);
        o[kl + 2 + vl] = '\0';
    } else if (v) {
        memcpy(o + kl, ";", 2);
    } else {
        o[kl] = '\0';
    }
    b->used += need;
    struct curl_slist *node = &b->nodes[b->n++];
    node->data = o;
    node->next = NULL;
    if (b->n > 1)
        b->nodes[b->n - 2].next = node;
}

static void hb_field(struct hbuild *b, const char *k, const char *v)
{
    hb_add(b, k, strlen(k), v, strlen(v));
}

struct fwd {
    struct hbuild *b;
    const struct scan *s;
    char *xff; /* the X-Forwarded-For values joined, the peer's address to come */
    size_t xff_len, xff_cap;
};

static bool dropped_on_the_way_up(const char *k, const struct scan *s)
{
    size_t kl = strlen(k);
    if (hdr_is_hop_by_hop(k) || HDR_NAME_IS(k, kl, "Host") ||
        HDR_NAME_IS(k, kl, "Content-Length") || HDR_NAME_IS(k, kl, "Expect") ||
        HDR_NAME_IS(k, kl, "X-Retry-Max-Attempts") || HDR_NAME_IS(k, kl, "X-Retry-Attempt") ||
        HDR_NAME_IS(k, kl, "X-Forwarded-For") || HDR_NAME_IS(k, kl, "X-Forwarded-Proto") ||
        HDR_NAME_IS(k, kl, "X-Request-Id"))
        return true;
    for (unsigned i = 0; i < s->n_connection; i++)
        if (hdr_token_listed(s->connection[i], k))
            return true;
    return false;
}

/* Adds 'v' to the X-Forwarded-For value being built, after ", " unless it is the first. */
static void xff_append(struct fwd *f, const char *v, size_t vl)
{
    if (f->xff_len + vl + 3 > f->xff_cap)
        return; /* cannot happen: sized from the scan */
    if (f->xff_len) {
        memcpy(f->xff + f->xff_len, ", ", 2);
        f->xff_len += 2;
    }
    memcpy(f->xff + f->xff_len, v, vl);
    f->xff_len += vl;
}

static enum MHD_Result forward_header(void *cls, enum MHD_ValueKind kind, const char *k,
                                      const char *v)
{
    (void)kind;
    struct fwd *f = cls;
    if (hdr_name_eq(k, "X-Forwarded-For")) {
        xff_append(f, v, strlen(v));
        return MHD_YES;
    }
    if (!dropped_on_the_way_up(k, f->s))
        hb_field(f->b, k, v);
    return MHD_YES;
}

/* Builds the header list every attempt sends. 0, or -1 out of memory. */
static int build_upstream_headers(struct retry_req *r, const struct scan *s)
{
    const char *peer = r->peer ? r->peer : "";
    size_t peer_len = strlen(peer);
    /* what is forwarded, and what is added: X-Forwarded-For (the client's values and the
     * peer), X-Forwarded-Proto, X-Request-Id, Host, and up to three removals */
    size_t max = s->n_fields + 7;
    size_t xff_cap = s->xff_len + peer_len + 3;
    size_t cap = s->field_bytes + 3 * s->n_fields + sizeof("X-Forwarded-For: ") + xff_cap +
                 sizeof("X-Forwarded-Proto: http") + sizeof("X-Request-Id: ") + REQUEST_ID_MAX +
                 (s->host ? strlen(s->host) : 0) + sizeof("Host: ") +
                 sizeof("Expect:Accept:Content-Type:") + 8;
    char *block = malloc(max * sizeof(struct curl_slist) + cap + xff_cap);
    if (!block)
        return -1;
    struct hbuild b = { .nodes = (struct curl_slist *)(void *)block,
                        .max = max,
                        .text = block + max * sizeof(struct curl_slist),
                        .cap = cap };
    struct fwd f = { .b = &b, .s = s, .xff = b.text + cap, .xff_cap = xff_cap };
    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, forward_header, &f);
    if (peer_len)
        xff_append(&f, peer, peer_len);
    if (f.xff_len)
        hb_add(&b, "X-Forwarded-For", 15, f.xff, f.xff_len);
    hb_field(&b, "X-Forwarded-Proto", "http");
    hb_field(&b, "X-Request-Id", r->request_id);
    if (r->route->preserve_host && s->host)
        hb_field(&b, "Host", s->host);
    /* curl's own additions that a proxy must not make: Accept: *\/\* where the client sent
     * none, and for a request with a body Expect: 100-continue and a form Content-Type */
    if (!s->accept)
        hb_add(&b, "Accept:", 7, NULL, 0);
    if (s->n_te || (s->cl && hdr_parse_uint(s->cl) > 0)) {
        hb_add(&b, "Expect:", 7, NULL, 0);
        if (!s->ctype)
            hb_add(&b, "Content-Type:", 13, NULL, 0);
    }
    r->hdrs_block = block;
    r->hdrs = b.n ? b.nodes : &r->attempt_node;
    /* The attempt header is ours, rewritten before each attempt. */
    r->attempt_node.data = r->attempt_hdr;
    r->attempt_node.next = NULL;
    if (b.n)
        b.nodes[b.n - 1].next = &r->attempt_node;
    return 0;
}

static const struct cfg_route *match_route(const struct cfg *c, const char *host, const char *path,
                                           size_t path_len, uint32_t method_bit)
{
    for (size_t i = 0; i < c->n_routes; i++) {
        const struct cfg_route *rt = &c->routes[i];
        if (rt->match_methods && !(rt->match_methods & method_bit))
            continue;
        size_t pl = strlen(rt->match_path_prefix);
        if (pl > path_len || memcmp(path, rt->match_path_prefix, pl) != 0)
            continue;
        if (rt->match_host) {
            char h[300];
            bool keep_port = strchr(rt->match_host, ':') != NULL &&
                             (rt->match_host[0] != '[' || strstr(rt->match_host, "]:"));
            if (!host || hdr_match_host(host, keep_port, h, sizeof(h)) < 0 ||
                strcmp(h, rt->match_host) != 0)
                continue;
        }
        return rt;
    }
    return NULL;
}

/* The request target's form (RFC 9112 3.2). Origin-form ("/path?q") goes as it is. Absolute-form
 * ("http://host/path") becomes origin-form for the upstream and its authority, copied into
 * 'authority', replaces the Host header for routing and preserve_host (3.2.2: the target's
 * authority wins). "*" is for OPTIONS only. Returns false for anything else (400). */
static bool to_origin_form(struct retry_req *r, char *authority, size_t cap)
{
    const char *t = r->target;
    authority[0] = '\0';
    if (strchr(t, '#'))
        return false; /* a fragment is never sent */
    if (t[0] == '/')
        return true;
    if (t[0] == '*')
        return t[1] == '\0' && strcmp(r->method, "OPTIONS") == 0;
    size_t skip = strncasecmp(t, "http://", 7) == 0    ? 7
                  : strncasecmp(t, "https://", 8) == 0 ? 8
                                                       : 0;
    if (!skip)
        return false;
    const char *a = t + skip;
    size_t al = strcspn(a, "/?");
    if (al == 0 || al >= cap || memchr(a, '@', al))
        return false; /* no host, or userinfo (RFC 9110 4.2.4) */
    memcpy(authority, a, al);
    authority[al] = '\0';
    const char *rest = a + al;
    size_t rl = strlen(rest);
    char *o = malloc(rl + 2);
    if (!o)
        return false;
    if (*rest == '/') {
        memcpy(o, rest, rl + 1);
    } else {
        o[0] = '/'; /* "http://a?x" is "/?x" */
        memcpy(o + 1, rest, rl + 1);
    }
    free(r->target);
    r->target = o;
    return true;
}

/* First call of the access handler: headers are complete, no body byte read yet. Either an
 * answer is made at once (400, 404, 405, 413) or the request is set up to go upstream. */
static void begin(struct retry_req *r, const char *method)
{
    struct worker *w = r->w;
    struct scan s = { 0 };
    if (r->refused != WIRE_OK) {
        answer_refused(r);
        return;
    }
    snprintf(r->method, sizeof(r->method), "%s", method);
    r->method_bit = cfg_method_bit(method, strlen(method));
    r->is_head = strcmp(method, "HEAD") == 0;
    r->state = RS_BODY;

    if (strcmp(method, "CONNECT") == 0) {
        answer_error(r, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed",
                     "CONNECT is not supported: retryproxy is a reverse proxy");
        return;
    }
    MHD_get_connection_values_n(r->conn, MHD_HEADER_KIND, scan_header, &s);
    if (s.n_cl > 1 || (s.n_cl && s.n_te) || s.n_host > 1 || s.n_bad ||
        (s.cl && hdr_parse_uint(s.cl) < 0)) {
        const char *why = s.n_cl > 1         ? "two Content-Length headers"
                          : s.n_cl && s.n_te ? "both Content-Length and Transfer-Encoding"
                          : s.n_host > 1     ? "two Host headers"
                          : s.n_bad          ? "a header with a forbidden character"
                                             : "an invalid Content-Length";
        answer_error(r, MHD_HTTP_BAD_REQUEST, "bad_request", why);
        return;
    }
    char authority[256];
    if (!to_origin_form(r, authority, sizeof(authority))) {
        answer_error(r, MHD_HTTP_BAD_REQUEST, "bad_request", "a request target of no valid form");
        return;
    }
    if (authority[0])
        s.host = authority;
    const char *q = strchr(r->target, '?');
    size_t path_len = q ? (size_t)(q - r->target) : strlen(r->target);
    r->route = match_route(r->cfg, s.host, r->target, path_len, r->method_bit);
    if (!r->route) {
        answer_error(r, MHD_HTTP_NOT_FOUND, "no_route", "no route matches this request");
        return;
    }
    r->rtr = &r->rt->routes[r->route - r->cfg->routes];
    r->m = r->rtr->metrics;
    const struct cfg_route *rt = r->route;
    const struct cfg_retry *policy = &rt->retry;
    int64_t cl = s.cl ? hdr_parse_uint(s.cl) : -1;
    if (cl > 0 && (uint64_t)cl > r->cfg->max_body_bytes) {
        answer_error(r, MHD_HTTP_CONTENT_TOO_LARGE, "body_too_large",
                     "the request body is larger than limits.max_body_bytes");
        return;
    }

    r->method_retryable =
        (policy->methods & r->method_bit) || (policy->idempotency_key && s.idem != NULL);
    r->max_attempts = policy->max_attempts;
    if (s.max_attempts) {
        int64_t m = hdr_parse_uint(s.max_attempts);
        if (m >= 1 && (uint64_t)m < r->max_attempts)
            r->max_attempts = (uint32_t)m;
    }
    if (s.request_id && *s.request_id && strlen(s.request_id) <= REQUEST_ID_MAX)
        snprintf(r->request_id, sizeof(r->request_id), "%s", s.request_id);
    else
        hdr_uuid(&w->rng, r->request_id);

    if (build_upstream_headers(r, &s) < 0) {
        answer_error(r, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", "out of memory");
        return;
    }

    r->content_length = s.n_te ? -1 : cl;
    if (!s.n_te && cl < 0)
        r->body_mode = BODY_NONE;
    else if (cl >= 0 && (uint64_t)cl <= policy->max_retry_body_bytes)
        r->body_mode = BODY_BUFFER;
    else if (cl >= 0)
        r->body_mode = BODY_STREAM;
    else
        r->body_mode = BODY_BUFFER; /* chunked: buffered until it proves too large */
    if (r->body_mode == BODY_BUFFER && cl > 0 && !body_hold(r, (size_t)cl))
        r->body_mode = BODY_STREAM; /* no room left for replay: this body goes once */
    if (r->body_mode == BODY_BUFFER && cl > 0) {
        r->body = malloc((size_t)cl);
        if (!r->body) {
            answer_error(r, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", "out of memory");
            return;
        }
        r->body_cap = (size_t)cl;
    }
    if (r->body_mode == BODY_STREAM)
        start_attempt(r); /* the body flows to the upstream as it arrives */
}

/* Body bytes from the client. Returns the bytes consumed. */
static size_t take_body(struct retry_req *r, const char *data, size_t n)
{
    const struct cfg_retry *policy = &r->route->retry;
    if (r->answered) {
        /* Answered already (413, or the upstream answered before the whole body came): the
         * rest is dropped until libmicrohttpd lets the answer go out. */
        r->discarded += n;
        if (r->over_limit && r->discarded > DISCARD_MAX)
            r->close_now = true;
        return n;
    }
    if (r->upload_total + n > r->cfg->max_body_bytes) {
        struct loop *l = r->w->loop;
        loop_timer_stop(l, &r->backoff_timer);
        loop_timer_stop(l, &r->try_timer);
        stop_transfer(r);
        r->over_limit = true;
        r->discarded = n;
        answer_error(r, MHD_HTTP_CONTENT_TOO_LARGE, "body_too_large",
                     "the request body is larger than limits.max_body_bytes");
        return n;
    }
    if (r->body_mode == BODY_BUFFER) {
        size_t cap = r->body_cap;
        if (r->body_len + n > cap) {
            cap = cap ? cap * 2 : 16384;
            while (cap < r->body_len + n)
                cap *= 2;
        }
        if (r->body_len + n > policy->max_retry_body_bytes || !body_hold(r, cap)) {
            /* A chunked body outgrew the replay limit, or the process's: stream it, what we
             * have first. */
            r->body_mode = BODY_STREAM;
            start_attempt(r);
        } else {
            if (cap > r->body_cap) {
                char *b = realloc(r->body, cap);
                if (!b)
                    return 0;
                r->body = b;
                r->body_cap = cap;
            }
            memcpy(r->body + r->body_len, data, n);
            r->body_len += n;
            r->upload_total += n;
            return n;
        }
    }
    if (r->state != RS_ATTEMPT && r->state != RS_BACKOFF) {
        r->upload_total += n;
        return n; /* the upstream has answered: the rest of the body is not needed */
    }
    size_t take = ring_space(&r->upload) < n ? ring_space(&r->upload) : n;
    if (take && ring_put(&r->upload, data, take) < 0)
        take = 0;
    r->upload_total += take;
    if (take && r->read_paused && r->xfer.easy) {
        r->read_paused = false;
        curl_easy_pause(r->xfer.easy, CURLPAUSE_CONT);
    }
    return take;
}

/* The answer is about to go out: the request's metrics are counted now, before a byte of it
 * leaves (CONTRACT §8: a client that has its response sees it counted). Its duration runs to
 * this point, the moment the response starts. */
static void account_answer(struct retry_req *r)
{
    struct worker *w = r->w;
    metrics_request(r->m, w->id, (int)r->resp_status);
    if (r->succeeded && r->attempts > 1)
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
    struct log_request lr = { .unix_ms = r->start_unix_ms,
                              .route = r->route ? r->route->name : NULL,
                              .method = r->method,
                              .path = r->target,
                              /* 499: libmicrohttpd may find the socket closed first */
                              .status = r->queued || r->stop == RETRY_STOP_CLIENT_CLOSED
                                            ? (int)r->resp_status
                                            : 0,
                              .attempts = r->attempts,
                              .delays = r->delays,
                              .n_delays = r->n_delays,
                              .duration_ms = (double)(loop_now(w->loop) - r->start_ms),
                              .upstream = r->upstream ? r->upstream->url : NULL,
                              .stop = r->stop != RETRY_STOP_NONE ? retry_stop_name(r->stop) : NULL,
                              .request_id = r->request_id[0] ? r->request_id : NULL };
    log_request(w->log, &lr);
}

enum MHD_Result retry_req_access(struct retry_req *r, const char *method, const char *upload_data,
                                 size_t *upload_data_size)
{
    /* libmicrohttpd takes an answer only on the first call (headers) or once the body is
     * complete, the calls that come without upload data. */
    bool can_answer = *upload_data_size == 0;
    r->in_handler = true;
    if (r->state == RS_HEADERS) {
        begin(r, method);
    } else if (*upload_data_size) {
        size_t took = take_body(r, upload_data, *upload_data_size);
        *upload_data_size -= took;
        if (*upload_data_size && !r->answered) {
            /* curl has not taken the last bytes yet: wait for it, not for the socket */
            r->upload_blocked = true;
            r->suspended = true;
            MHD_suspend_connection(r->conn);
        }
    } else if (!r->body_done) {
        r->body_done = true;
        if (r->body_mode == BODY_STREAM && r->read_paused && r->xfer.easy) {
            r->read_paused = false;
            curl_easy_pause(r->xfer.easy, CURLPAUSE_CONT);
        }
        if (r->state == RS_BODY)
            start_attempt(r);
    }
    r->in_handler = false;

    if (r->close_now)
        return MHD_NO;
    if (r->answered && !r->queued && can_answer) {
        /* Right after the headers (400, 404, 405, 413 by Content-Length) libmicrohttpd then
         * reads none of the body; after the body, the connection may be kept alive. */
        r->queued = true;
        if (!r->resp)
            return MHD_NO;
        account_answer(r);
        enum MHD_Result ret = MHD_queue_response(r->conn, r->resp_status, r->resp);
        MHD_destroy_response(r->resp);
        r->resp = NULL;
        return ret;
    }
    if (!r->answered && r->body_done && !r->suspended) {
        /* the upstream side has the request: nothing to do until it answers */
        r->suspended = true;
        MHD_suspend_connection(r->conn);
    }
    return MHD_YES;
}

void retry_req_completed(struct retry_req *r)
{
    struct loop *l = r->w->loop;
    client_unwatch(r);
    end_retry_in_flight(r);
    log_done(r);
    r->conn = NULL;
    loop_timer_stop(l, &r->try_timer);
    loop_timer_stop(l, &r->deadline_timer);
    loop_timer_stop(l, &r->backoff_timer);
    stop_transfer(r);
    if (r->resp && !r->queued)
        MHD_destroy_response(r->resp); /* its reader's reference is released here */
    r->resp = NULL;
    req_release(r);
}
