/* req -- the request core's own header: a request's state and the calls between the core's
 * parts. retry.c has the states and every move between them (the state diagram is at its top,
 * docs/architecture.md "One request's states"), and calls the parts that do the work, which
 * return what happened and call nothing of it: req.c the request's life, an attempt sent or
 * stopped, its budget slots and the verdict on it; edge.c the request's two ends with its
 * client (the head taken in, the answer given); keep.c responses kept rather than streamed;
 * race.c the attempts that run beside the current one (hedging); durable.c a durable route's
 * request and a dead letter; tally.c the metrics and log lines. Nothing outside the core
 * includes it: the rest of the program sees proxy/core/retry.h, and a front end
 * proxy/core/front.h.
 */
#ifndef RETRYPROXY_PROXY_REQ_H
#define RETRYPROXY_PROXY_REQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "proxy/core/balance.h"
#include "proxy/core/choose.h"
#include "proxy/upstream/attempt.h"
#include "proxy/core/decide.h"
#include "proxy/core/front.h"
#include "proxy/http/grpc.h"
#include "proxy/http/head.h"
#include "proxy/core/intake.h"
#include "proxy/base/loop.h"
#include "proxy/telemetry/metrics.h"
#include "proxy/http/refusal.h"

struct store_attempt;
struct worker;

/* What the log and requests_total say of a request whose client left before its answer
 * (nginx's "client closed request"); nothing is sent. */
#define CLIENT_CLOSED_STATUS 499

enum req_state {
    RS_HEADERS,  /* before the first access-handler call */
    RS_BODY,     /* reading a request body that will be buffered whole */
    RS_ATTEMPT,  /* an attempt in flight, before its response head */
    RS_DRAIN,    /* reading a retryable response's body before the wait */
    RS_HOLD,     /* holding a gRPC response back until its trailers tell its status */
    RS_BACKOFF,  /* waiting out a delay */
    RS_STREAM,   /* the upstream's response is going to the client */
    RS_ANSWERED, /* a complete answer of our own (or a saved one) is ready */
    RS_LAG,      /* retrying has stopped, but earlier attempts run on (hedging): wait for them */
    RS_STORE,    /* a durable route's request on its way to the store (durable.c) */
};

/* Request flags (struct retry_req 'flags'). */
enum {
    RF_RETRYABLE = 1u << 0,     /* its method may go twice (retry.methods, Idempotency-Key) */
    RF_BODY_DONE = 1u << 1,     /* the client's body is complete (or there is none) */
    RF_OVER_LIMIT = 1u << 2,    /* the body passed limits.max_body_bytes: answered 413 */
    RF_CLOSE_NOW = 1u << 3,     /* give the connection up: too much body left to discard */
    RF_IN_FLIGHT = 1u << 4,     /* a retry holds budget slots until its attempt ends */
    RF_SUCCEEDED = 1u << 5,     /* the last attempt ended in nothing retry_on names */
    RF_SAVED = 1u << 6,         /* 'saved' holds the last retryable response's head ... */
    RF_SAVED_WHOLE = 1u << 7,   /* ... and its whole body */
    RF_THROTTLED = 1u << 8,     /* client-side throttling rejected an attempt (throttle_p) */
    RF_LAG = 1u << 9,           /* the response in DRAIN ends retrying: LAG once it is read */
    RF_SETTLE = 1u << 10,       /* the retry decided on the response in DRAIN: req_settle() it */
    RF_GRPC = 1u << 11,         /* a gRPC call (Content-Type application/grpc, docs/grpc.md) */
    RF_GRPC_RETRY = 1u << 12,   /* ... on a route whose retry_on names gRPC statuses */
    RF_GRPC_COUNTED = 1u << 13, /* ... whose status is counted (grpc_status) */
    RF_TRAILERS_OFF = 1u << 14, /* its trailers passed the head's bounds: none is sent */
    RF_BAD_HEAD = 1u << 15,   /* a head refused as malformed or ambiguous: the connection closes */
    RF_CONNECTION = 1u << 16, /* its head has a Connection field (edge_trailer) */
    RF_CUT_SHORT = 1u << 17,  /* its client left while its answer went out (edge_cut_short) */
    RF_DURABLE = 1u << 18,    /* to a durable route: stored once its body is in (durable.c) */
};

/* Trial flags (struct trial 'flags'). */
enum {
    TF_LAUNCHED = 1u << 0,  /* its attempt went (or failed to): attempts_total counts it once ... */
    TF_COUNTED = 1u << 1,   /* ... and has */
    TF_RECORDED = 1u << 2,  /* its outcome went to upstream health (a hedge records the timeout) */
    TF_SLOT = 1u << 3,      /* a laggard holding the budget slots of the retry it was */
    TF_LOST = 1u << 4,      /* out of the race: cancelled in the next turn, never inside curl */
    TF_IN_FLIGHT = 1u << 5, /* counted in its endpoint's requests in flight */
};

/* A trial: one upstream attempt and what the request keeps of it. The request embeds one,
 * reused by each attempt in turn; hedging gives the next attempt a trial of its own while a
 * laggard runs on in r->others. */
struct trial {
    struct trial *prev, *next; /* r->others, while not the current attempt */
    struct retry_req *r;
    unsigned flags;
    uint32_t number; /* its X-Retry-Attempt */
    size_t sent;     /* bytes of the kept request body its upload has read */
    /* loop_clock_us() when it started: queued for a slot, or sent */
    uint64_t start_us;
    struct endpoint *ep; /* the endpoint it went to (a reference; NULL: none), which says its
                            upstream (trial_upstream) */
    struct attempt att;
    struct head_attempt fields; /* its own X-Retry-Attempt and deadline header */
};

/* Its size matters: past 2,048 bytes glibc's calloc clears an allocation with rep stosb (about
 * 2,000 instructions a request more, bench/instructions.sh h2). With an HTTP/2 stream's state
 * after it (retry_req_new) the allocation was 2,152 bytes (2,112 already at 487bc3f,
 * though this comment then said 2,024): bringing it back under is open work. The tried set
 * (issue 38) made the struct 1,824 bytes from 1,816, which the front's alignment to 16 had
 * padded to 1,824 already: the allocation stayed 2,152. The dead letters' attempt rows (issue
 * 39: a pointer and a count, no hole left for them) made it 1,840, and the allocation 2,168.
 * Fill holes before adding words; `gdb -batch -ex 'ptype /o struct retry_req' build/retryproxy`
 * shows them. */
struct retry_req {
    struct retry_req *prev, *next; /* the worker's requests */
    struct worker *w;
    enum req_state state;
    unsigned flags;
    /* the client's port, for the log (in the hole before 'peer') */
    unsigned peer_port;
    unsigned refs;    /* the connection, a running transfer, the body reader */
    const char *peer; /* the client's address, while the connection is open */
    struct rt *rt;    /* the snapshot it started with (one reference) */
    struct cfg *cfg;  /* rt->cfg */
    const struct cfg_route *route;
    const struct rt_route *rtr; /* the matched route's bindings */
    struct metrics_route *m;    /* its metrics series (route "" until matched) */
    uint64_t start_us;          /* loop_clock_us() when the request line arrived */
    int64_t start_unix_ms;
    uint64_t wait_start_ms; /* when the current backoff wait began */
    uint64_t deadline_ms;
    uint32_t *delays; /* the waits taken, for the log */
    size_t n_delays;
    /* a route keeping dead letters (delivery.dead_letter): each attempt as the store keeps it,
     * from the first attempt's end on (max_attempts of them at most); NULL on any other route */
    struct store_attempt *dl_tries;
    uint32_t dl_ntries;

    /* the request as received */
    char *target;
    uint32_t method_bit;
    char method[REQ_METHOD_MAX + 1]; /* the framing check refuses longer ones */
    char upgrade[72]; /* the protocol an upgrade asks for, the route tunnelling it; "": none */
    char request_id[HEAD_REQUEST_ID_MAX + 1];
    struct head_up up;     /* the header list every attempt sends */
    struct intake body;    /* the request body */
    struct hlist trailers; /* its trailer fields (lowercase names), sent by every attempt */
    size_t head_size;      /* the head's fields as the bounds count them (edge_trailer) */
    size_t head_fields;
    uint64_t discarded; /* body bytes dropped after the answer was made */

    /* its User-Agent, for the log (NULL: none, or not logging when the head came) */
    char *user_agent;

    /* retrying */
    uint32_t attempts, max_attempts;
    uint32_t timeout_ms;       /* the route's, lowered by X-Retry-Timeout-Ms */
    enum refusal refused;      /* the head was refused: answer its error (here: a hole) */
    struct choose_tried tried; /* the endpoints its attempts went to (their slots) */
    struct backoff_seq seq;
    struct decide_req dr;
    enum retry_outcome last_outcome;
    enum retry_stop stop;
    uint32_t pending_delay;
    int grpc_status;               /* RF_GRPC_COUNTED: the status the call ended with, -1: none */
    struct retry_verdict settling; /* RF_SETTLE: the verdict, counted once the body is read */
    double throttle_p;             /* RF_THROTTLED: the probability it was rejected with */
    struct trial *cur;             /* the current attempt: running, waited for, or the last one */
    struct trial *others; /* attempts running beside it (hedging), and lost ones to cancel */
    struct trial first;
    /* try_timer: the current attempt's per-try timeout until its head, then (RS_HOLD) the
     * hold's bound, retry.grpc_hold_ms (keep.c) */
    struct loop_timer try_timer, deadline_timer, backoff_timer;
    struct loop_timer reap_timer; /* cancels the lost ones in the next turn */

    /* the last retryable response, returned as it is if retrying stops */
    struct {
        int status;
        struct hlist h;
        char *body;
        size_t len;
        struct hlist trailers;
    } saved;
    /* RS_HOLD: the response's body so far, and its messages */
    struct {
        char *body;
        size_t len;
        struct grpc_frames frames;
    } held;

    struct front *front; /* the client side: its state follows in the same allocation */
};

static inline uint64_t req_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- retry.c: the states ---- */

/* retry.c calls the parts (req.c, edge.c, keep.c, race.c, durable.c, tally.c) and reads what
 * they return; they call nothing of it (tests/cli/layout.py checks it). An event of a part's
 * own that comes later goes back to the machine through the one callback the machine passes
 * down, its req_event(). */
enum req_event {
    REQ_EV_STORED, /* the store's answer to a durable accept ('arg': its struct store_call) */
};
typedef void req_event_fn(struct retry_req *r, enum req_event ev, const void *arg);

/* ---- req.c: what a request has, below the machine (none of these moves its state) ---- */

/* A request in RS_HEADERS (retry_req_new()), its first trial not yet made; NULL: no memory. */
struct retry_req *req_new(struct worker *w, const struct front_ops *ops, size_t front_size,
                          enum front_proto proto, const char *raw_target, const char *peer,
                          unsigned peer_port, enum refusal refused);
/* Drops a reference: the last frees the request. */
void req_release(struct retry_req *r);
void req_trial_free(struct retry_req *r, struct trial *t);
/* Attempt 't' sent ('wait': how long its answer is waited for; 'left': ms to the deadline);
 * false when it could not be. */
bool req_launch(struct retry_req *r, struct trial *t, uint64_t wait, uint64_t left);
/* attempt_ops.upload: the request body's bytes for attempt 'a'. */
size_t req_upload(struct attempt *a, char *buf, size_t max);
/* Whether body bytes arriving now go to an upstream attempt. */
bool req_upload_live(const struct retry_req *r);
/* Ends the transfer of 't' without its end being reported; true if it was running. */
bool req_stop_transfer(struct retry_req *r, struct trial *t);
/* An attempt being started is not made after all, nor counted. */
void req_not_made(struct retry_req *r);
/* What is known of the current attempt, ended in 'o', and the verdict on it. */
void req_judge(struct retry_req *r, enum retry_outcome o, struct retry_facts *f,
               struct retry_verdict *v);
/* The drain deadline as it is now, for the decisions that follow. */
void req_see_drain_deadline(struct retry_req *r);
/* The verdict on the attempt that just ended in 'o', applied: true when a retry was decided
 * (its wait in r->pending_delay). */
bool req_decide(struct retry_req *r, enum retry_outcome o);
/* The retry decided on the response whose body was read: true to wait and retry. */
bool req_settle(struct retry_req *r);
/* Retrying ends while the request waits on the upstream side: slots back, 'stop' counted. */
void req_give_up(struct retry_req *r, enum retry_stop stop);
/* The end of a backoff wait before its time (the log keeps the wait as it was taken). */
void req_cut_wait_short(struct retry_req *r);
/* The gRPC status of attempt 'a''s response on a gRPC call (its headers', or its trailers'
 * once in), -1 if none or not a gRPC call. */
int req_grpc_status(const struct retry_req *r, const struct attempt *a);
/* A retry's budget slots: taken by a retry the decision made, given back when its attempt
 * ends ('bit' of '*flags' says they are held). */
void req_hold_slots(struct retry_req *r);
void req_give_slots_back(struct retry_req *r, unsigned *flags, unsigned bit);
void req_end_retry_in_flight(struct retry_req *r);

/* ---- edge.c: the head taken in, the answer given (none of these sets r->state) ---- */

/* What edge_begin() made of the head. */
enum edge_plan {
    EDGE_ANSWERED, /* answered at once (400, 404, 405, 413...) */
    EDGE_DURABLE,  /* to a durable route: accept_plan() with 'b' */
    EDGE_BUFFER,   /* to go upstream once its body is in (or there is none) */
    EDGE_STREAM,   /* to go upstream now, its body flowing as it arrives */
};
struct edge_body {
    bool has_body;
    int64_t length; /* -1: chunked */
};
/* The head is complete: checked, routed, planned, or answered at once. */
enum edge_plan edge_begin(struct retry_req *r, const char *method, struct edge_body *b);
/* A trailer field of the request (retry_req_trailer). */
void edge_trailer(struct retry_req *r, const char *k, size_t kl, const char *v, size_t vl);
/* A retryable response was kept whole: retrying that stops returns it. */
bool edge_saved_whole(const struct retry_req *r);
/* The current attempt's response to the client (committed); false when it was an upgrade's
 * 101, now a tunnel. */
bool edge_stream(struct retry_req *r);
/* An error of retryproxy's own; the saved response. */
void edge_error(struct retry_req *r, unsigned status, const char *code, const char *message);
void edge_saved(struct retry_req *r);
/* Whether no name of the route has an address ('msg' says which and why), when the attempt
 * being started has nothing to go to; false when it is to go on as a connect failure. */
bool edge_no_address(struct retry_req *r, char *msg, size_t cap);
/* The client left while its answer's body was still coming from the upstream. */
void edge_cut_short(struct retry_req *r);

/* ---- durable.c: a durable route's request, stored and answered 202 ---- */

/* The head of a request to a durable route: its body is to be taken whole (RF_DURABLE); false
 * when it was answered (413, no store). */
bool accept_plan(struct retry_req *r, bool has_body, int64_t length);
/* Its body outgrew routes[].delivery.max_body_bytes: answered 413, nothing stored. */
void accept_too_large(struct retry_req *r);
/* Its body is in: true when it went to the store (answered once the store has it: the caller
 * holds a reference until 'event' is told, REQ_EV_STORED), false when it was answered. */
bool accept_store(struct retry_req *r, req_event_fn *event);
/* The store's answer 'c' (a struct store_call), given to the client. */
void accept_answer(struct retry_req *r, const void *c);

/* A request of a synchronous route was answered 'status' ('h', 'body': the answer's head and
 * body as given): when its retries ran out or were refused and the route keeps dead letters,
 * it is stored as one (the caller's answer is not held). Costs nothing otherwise. */
void durable_answered(struct retry_req *r, int status, const struct hlist *h, const char *body,
                      size_t len);

/* ---- keep.c: responses kept rather than streamed (none of these sets r->state) ---- */

/* A gRPC response head without a status: to be held back until its trailers (RS_HOLD)? */
bool keep_hold(struct retry_req *r, const struct attempt *a);
/* The current attempt's response head is kept (RS_DRAIN follows): its body is read next. */
void keep_save(struct retry_req *r, struct attempt *a);
/* What keep_held() did with body bytes of a response in RS_HOLD. */
enum keep_held {
    KEEP_HELD,       /* held, all of them */
    KEEP_HELD_FIRST, /* held, the first ones: the hold's time starts */
    KEEP_HOLD_OVER,  /* none held: a second message, or too many bytes; decide now */
};
enum keep_held keep_held(struct retry_req *r, const char *p, size_t n);
/* Body bytes of a response in RS_DRAIN: how many were kept (0: stop reading). */
size_t keep_drain(struct retry_req *r, const char *p, size_t n);
/* What was held goes to the client; false if it did not take it all (gone). */
bool keep_release_held(struct retry_req *r);
/* What was held becomes the saved response's body. */
void keep_held_to_saved(struct retry_req *r);
/* The kept response's transfer ended ('end'): its trailers saved. */
void keep_trailers(struct retry_req *r, struct attempt *a, enum attempt_end end);

/* ---- race.c: attempts running beside the current one (hedging; none sets r->state) ---- */

/* Whether the current attempt, past its per-try timeout, may be hedged. */
bool race_hedgeable(const struct retry_req *r);
/* The hedge's verdict 'v': taken (true), 'next' is the current attempt, and the one before a
 * laggard in r->others; refused (false), 'next' is freed. */
bool race_hedge(struct retry_req *r, struct trial *next, const struct retry_verdict *v);
/* How long the attempt starting now, with 'left' ms before the deadline, will be waited for:
 * the per-try timeout, or 'left' if it is shorter or the attempt may be hedged. */
uint64_t race_attempt_wait(const struct retry_req *r, uint64_t left);
/* Whether an attempt other than 'except' (may be NULL) runs on beside the current one. */
bool race_others_running(const struct retry_req *r, const struct trial *except);
/* Every attempt beside the current one is out of the race, counted as 'o'. */
void race_lose_others(struct retry_req *r, enum metrics_outcome o);
/* Ends the lost attempts' transfers now. */
void race_reap(struct retry_req *r);
/* Every attempt still running ends now, each counted as 'o' unless it was already; true if the
 * current one was running. */
bool race_end_all(struct retry_req *r, enum metrics_outcome o);
/* What a response head of an attempt beside the current one is. */
enum race_head {
    RACE_DROPPED, /* lost already, or a failure dropped (others may still answer) */
    RACE_WON,     /* retry_on does not name it: it is the answer */
    RACE_LAST,    /* a failure, the last there will be: it is the answer */
};
enum race_head race_other_head(struct retry_req *r, struct trial *t);
/* 't' (RACE_WON, RACE_LAST) becomes the current attempt; the one before loses. */
void race_take(struct retry_req *r, struct trial *t);
/* 't', an attempt beside the current one, ended: counted, and freed. */
void race_other_done(struct retry_req *r, struct trial *t);

/* ---- tally.c: metrics and log lines ---- */

enum metrics_outcome tally_outcome(enum retry_outcome o, int status);
void tally_stop(struct retry_req *r, enum retry_stop stop);
bool tally_trial(struct retry_req *r, struct trial *t, enum metrics_outcome o);
/* Attempt 't' ended in 'o' (tally_trial(), once per attempt that went): recorded in r->dl_tries
 * for the dead letter a route with delivery.dead_letter may keep (durable_answered()). */
void tally_dead_letter_try(struct retry_req *r, const struct trial *t, enum metrics_outcome o);
/* The upstream of trial 't' (NULL before its first attempt): its endpoint's, or the route's
 * first when it has none (no resolver). */
static inline const struct cfg_upstream *trial_upstream(const struct retry_req *r,
                                                        const struct trial *t)
{
    return t->number ? &r->route->upstreams[t->ep ? t->ep->k : 0] : NULL;
}

/* Trial 't' goes to endpoint 'e' (its reference; NULL: none), counted in its requests in
 * flight until tally_endpoint_out(). */
void tally_endpoint_in(struct trial *t, struct endpoint *e);
/* The attempt of 't' ended: it no longer counts in its endpoint's requests in flight. */
void tally_endpoint_out(struct trial *t);
/* ... and the trial lets go of its endpoint (it is freed, or goes again). */
void tally_endpoint_free(struct trial *t);
void tally_log_as(struct retry_req *r, const struct trial *t, const char *outcome,
                  const char *decision, uint32_t delay_ms);
void tally_log(struct retry_req *r, const struct trial *t, enum retry_outcome o,
               const char *decision, uint32_t delay_ms);
void tally_verdict(struct retry_req *r, const struct trial *t, enum retry_outcome o,
                   const struct retry_verdict *v, bool hedging);
void tally_answer(struct retry_req *r);
void tally_done(struct retry_req *r);
/* A gRPC call ended with 'status' (-1: none): counted once, the first time. */
void tally_grpc(struct retry_req *r, int status);

#endif
