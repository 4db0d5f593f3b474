/* retry -- one client request from its headers to its last response byte: the attempts,
 * the decision to retry, the backoff waits, and the answer (CONTRACT §3, §4).
 *
 * The decision itself, retry_decide(), is a pure function of what is known when an attempt
 * ends, so every rule is unit-tested without a network. The rest is the state machine that
 * drives libmicrohttpd (client side) and libcurl (upstream side) from the worker's loop.
 */
#ifndef RETRYPROXY_PROXY_RETRY_H
#define RETRYPROXY_PROXY_RETRY_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stdint.h>

#include "config/cfg.h"
#include "proxy/wire.h"

struct worker;
struct retry_req;

/* How an attempt ended. */
enum retry_outcome {
    RETRY_OUT_STATUS,          /* response headers arrived: see the status */
    RETRY_OUT_CONNECT_FAILURE, /* no connection: the request was never sent */
    RETRY_OUT_RESET,           /* closed or reset before complete response headers */
    RETRY_OUT_TIMEOUT,         /* the per-try timeout or the deadline passed first */
};

/* Why retrying stopped (the X-Retry-Stop values). */
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
    RETRY_STOP_CLIENT_CLOSED, /* the client went away during a wait (log only: no response) */
};

const char *retry_stop_name(enum retry_stop s);

/* What is known when an attempt ends. */
struct retry_facts {
    enum retry_outcome outcome;
    int status;            /* RETRY_OUT_STATUS only */
    bool method_retryable; /* in retry.methods, or carries Idempotency-Key (when honoured) */
    bool body_replayable;  /* no body, or one buffered whole */
    uint32_t attempts;     /* attempts made, this one included */
    uint32_t max_attempts; /* the route's, lowered by X-Retry-Max-Attempts */
    uint64_t now_ms;
    uint64_t deadline_ms;
    uint32_t backoff_ms;  /* the policy's delay before the next retry */
    bool has_retry_after; /* a valid Retry-After came with this response */
    uint64_t retry_after_ms;
};

struct retry_verdict {
    const struct cfg_retry_cond *fired; /* the retry_on condition that matched; NULL: none */
    enum retry_stop stop;               /* RETRY_STOP_NONE with 'fired' set: retry */
    uint32_t delay_ms;                  /* the wait before the retry */
    bool retry_after_used;
};

/* The retry_on condition of 'r' that names this outcome, in file order, or NULL. */
const struct cfg_retry_cond *retry_match(const struct cfg_retry *r, enum retry_outcome o,
                                         int status);

/* Decides whether to retry. When no condition fires, the attempt is final and not a failure
 * for retry purposes (fired NULL, stop NONE). */
void retry_decide(const struct cfg_retry *r, const struct retry_facts *f, struct retry_verdict *v);

/* ---- the request state machine, driven by server.c ---- */

/* A request whose request line has arrived ('raw_target' as sent) on a connection from
 * 'peer' (the client's address as text, "" if unknown; it must stay valid while the
 * connection is open). 'refused' is not WIRE_OK when the framing check refused the head this
 * one stands in for: it is answered with that error and the connection closed. NULL if out of
 * memory. */
struct retry_req *retry_req_new(struct worker *w, struct MHD_Connection *c, const char *raw_target,
                                const char *peer, enum wire_reason refused);

/* libmicrohttpd's access handler for this request (see MHD_AccessHandlerCallback). */
enum MHD_Result retry_req_access(struct retry_req *r, const char *method, const char *upload_data,
                                 size_t *upload_data_size);

/* libmicrohttpd is done with the request's connection (answered, or the client went away). */
void retry_req_completed(struct retry_req *r);

/* The drain deadline passed: answers every request of 'w' still waiting on the upstream side
 * (with its last upstream response, or a 503 "draining"). */
void retry_expire_all(struct worker *w);

#endif
