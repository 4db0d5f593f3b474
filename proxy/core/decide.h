/* decide -- whether an attempt that just ended is retried, and after what wait (the rules of
 * docs/config.md "retry", docs/backoff.md and docs/budgets.md).
 *
 * A function of what is known when the attempt ends, the route's policy, the budgets and the
 * clock, all passed in: no libmicrohttpd, no libcurl, no clock read, no I/O. The request state
 * machine (retry.c) gathers the facts, calls decide_attempt(), and acts on the verdict.
 */
#ifndef RETRYPROXY_PROXY_DECIDE_H
#define RETRYPROXY_PROXY_DECIDE_H

#include <stdbool.h>
#include <stdint.h>

#include "config/cfg.h"
#include "policy/backoff.h"
#include "policy/budget.h"
#include "policy/rng.h"
#include "proxy/http/hlist.h"
#include "proxy/core/live.h"

/* How an attempt ended. */
enum retry_outcome {
    RETRY_OUT_STATUS,          /* response headers arrived: see the status */
    RETRY_OUT_CONNECT_FAILURE, /* no connection: the request was never sent */
    RETRY_OUT_RESET,           /* closed or reset before complete response headers */
    RETRY_OUT_TIMEOUT,         /* the per-try timeout or the deadline passed first */
};

/* Why retrying stopped (the X-Retry-Stop values, docs/forwarding.md). */
enum retry_stop {
    RETRY_STOP_NONE, /* not stopped: retry */
    RETRY_STOP_MAX_ATTEMPTS,
    RETRY_STOP_BUDGET,
    RETRY_STOP_CONCURRENCY,
    RETRY_STOP_DEADLINE,
    RETRY_STOP_RETRY_AFTER,
    RETRY_STOP_NOT_RETRYABLE,
    RETRY_STOP_BODY_TOO_LARGE,
    RETRY_STOP_DRAINING,
    RETRY_STOP_PUSHBACK,      /* the response's pushback header refused a retry */
    RETRY_STOP_THROTTLED,     /* client-side throttling rejected the retry's attempt */
    RETRY_STOP_CLIENT_CLOSED, /* the client went away during a wait (log only: no response) */
};

const char *retry_stop_name(enum retry_stop s);

/* What is known when an attempt ends. */
struct retry_facts {
    enum retry_outcome outcome;
    int status;               /* RETRY_OUT_STATUS only */
    const struct hlist *head; /* the response's fields (RETRY_OUT_STATUS), else NULL */
    int grpc_status;          /* a gRPC call's status (headers or trailers); -1: none */
    bool method_retryable;    /* in retry.methods, or carries Idempotency-Key (when honoured) */
    bool unprocessed;         /* RETRY_OUT_RESET: the upstream refused it before its application
                               * saw it (HTTP/2 REFUSED_STREAM, GOAWAY): it may go again */
    bool body_replayable;     /* no body, or one buffered whole */
    uint32_t attempts;        /* attempts made, this one included */
    uint32_t max_attempts;    /* the route's, lowered by X-Retry-Max-Attempts */
    uint64_t now_ms;
    uint64_t deadline_ms;
    uint32_t backoff_ms;  /* the policy's delay before the next retry */
    bool has_retry_after; /* a valid Retry-After came with this response */
    uint64_t retry_after_ms;
    bool has_pushback;   /* the route's pushback header came with this response ... */
    bool pushback_stops; /* ... holding anything but a whole number: no retry */
    uint64_t pushback_ms;
};

struct retry_verdict {
    const struct cfg_retry_cond *fired; /* the retry_on condition that matched; NULL: none */
    enum retry_stop stop;               /* RETRY_STOP_NONE with 'fired' set: retry */
    uint32_t delay_ms;                  /* the wait before the retry */
    bool retry_after_used;
    bool pushback_used;
    double throttle_p; /* RETRY_STOP_THROTTLED: the rejection probability */
};

/* The retry_on condition of 'r' that names this outcome, in file order, or NULL. 'head' is
 * the response's fields (NULL without a response), for the header conditions; 'grpc' the gRPC
 * status of a gRPC call's response (from its headers or its trailers; -1: none). */
const struct cfg_retry_cond *retry_match(const struct cfg_retry *r, enum retry_outcome o,
                                         int status, const struct hlist *head, int grpc);
/* The same over any list of 'n' retry_on conditions (routes[].ejection.on as well). */
const struct cfg_retry_cond *retry_match_on(const struct cfg_retry_cond *on, size_t n,
                                            enum retry_outcome o, int status,
                                            const struct hlist *head, int grpc);

/* The policy's rules alone (method, body, attempts, pushback, Retry-After, deadline), with the
 * delay the caller looked up in f->backoff_ms. When no condition fires, the attempt is final and
 * not a failure for retry purposes (fired NULL, stop NONE). */
void retry_decide(const struct cfg_retry *r, const struct retry_facts *f, struct retry_verdict *v);

/* What a retry must fit besides the policy: the process-wide budget and the route's, and
 * while draining, the drain deadline. */
struct decide_budgets {
    struct budget *global;
    const struct budget_limits *global_limits;
    struct budget *route;
    const struct budget_limits *route_limits;
    uint64_t drain_deadline_ms; /* 0: not draining */
};

/* A first attempt: the base of both ratio budgets. */
void decide_note_request(const struct decide_budgets *b, uint64_t now_ms);

/* A retry the policy asked for must also fit the process-wide budget and the route's and, while
 * draining, end its wait of 'delay_ms' before the drain deadline: RETRY_STOP_NONE, or
 * RETRY_STOP_DRAINING, RETRY_STOP_CONCURRENCY or RETRY_STOP_BUDGET. An admitted retry holds a
 * concurrency slot in both budgets (decide_budgets_release() gives them back) and is counted in
 * both windows; a refused one takes nothing. decide_attempt() calls it for a request's retry,
 * the courier for a durable delivery's re-attempt (docs/delivery.md "Retry budgets"). */
enum retry_stop decide_admit(const struct decide_budgets *b, uint64_t now_ms, uint32_t delay_ms);
void decide_budgets_release(const struct decide_budgets *b);

/* One request's view of retrying. */
struct decide_req {
    const struct cfg_retry *policy;
    struct backoff_seq *seq; /* the request's own sequence (scope "request") */
    struct live_route *live; /* the route's shared sequence (scope "route") */
    struct rng *rng;
    struct decide_budgets budgets;
    const struct throttle_limits *throttle; /* the route's; k 0: off */
};

/* The whole decision for the attempt described by 'f' (f->backoff_ms is filled in here): the
 * policy's rules, then the budgets, then client-side throttling (the attempt is counted as
 * accepted when no retry_on condition names it; a retry is a new attempt to admit). A retry that is
 * taken holds a concurrency slot in both budgets until decide_release(), and moves the backoff
 * sequence (the request's, or the route's shared one); a refused one moves neither and is counted
 * nowhere. */
void decide_attempt(const struct decide_req *d, struct retry_facts *f, struct retry_verdict *v);

/* Whether a retry's wait of 'delay_ms' starting at 'now_ms' still ends before the request's
 * deadline and the drain deadline, the same rules decide_attempt() applied: RETRY_STOP_NONE,
 * RETRY_STOP_DEADLINE or RETRY_STOP_DRAINING. For a retry decided on a response head whose
 * body had to be read before the wait could start. */
enum retry_stop decide_wait_fits(const struct decide_req *d, uint64_t now_ms, uint32_t delay_ms,
                                 uint64_t deadline_ms);

/* The attempt of a retry that decide_attempt() took has ended (or the request ended first):
 * its concurrency slots go back. */
void decide_release(const struct decide_req *d);

/* An attempt ended in nothing retry_on names without decide_attempt() seeing it (a hedged
 * request's earlier attempt that answered first): client-side throttling counts it accepted. */
void decide_note_final(const struct decide_req *d, uint64_t now_ms);

#endif
