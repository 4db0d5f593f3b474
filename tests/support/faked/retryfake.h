/* retryfake -- the request state machine (proxy/core/retry.c) on a fake clock with fake
 * neighbours, for the retry_timers suites (tests/unit/test_retry_timers*.c).
 *
 * Those suites are linked without proxy/upstream/attempt.o (the Makefile's FAKED_OBJ): the fakes
 * here stand in for the upstream attempt and the client side (a front end of its own,
 * proxy/core/front.h), record what the state machine asked of them, and let each test say how
 * an attempt ends. With hedging several attempts run at once: each launch is numbered from 0,
 * and the tests name the one that answers. The loop is the real one, its clock the test's
 * (loop_set_clock), turned with loop_turn(l, 0) after each move of the clock. Not in
 * tests/support/ itself: every other suite links the real attempt.o beside that folder's
 * objects.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_FAKED_RETRYFAKE_H
#define RETRYPROXY_TESTS_SUPPORT_FAKED_RETRYFAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/http/answer.h"
#include "proxy/upstream/attempt.h"
#include "proxy/core/retry.h"
#include "proxy/core/worker.h"

#define LAUNCHES 16

/* What the state machine asked of the upstream side: every launch, numbered from 0. */
struct fake_up {
    struct attempt *a; /* the attempt launched last */
    unsigned launches;
    uint64_t launched_at[LAUNCHES];
    struct attempt *launched[LAUNCHES];
    const struct hlist *fields[LAUNCHES];   /* the request's fields each launch sends */
    char first[LAUNCHES][64];               /* and its own first field, "Name: value" */
    const struct hlist *trailers[LAUNCHES]; /* and the trailers it sends after the body */
    bool running[LAUNCHES];
    unsigned cancels;
};

extern struct fake_up up;

/* What the client side was sent. */
struct fake_client {
    struct front *f;
    unsigned answers;
    unsigned status;
    uint64_t at;
    char code[64];
    char stop[32];
    uint32_t attempts;
    const char *content_type; /* the request's, if set */
    size_t body_bytes;        /* of the answer, before its end */
    bool ended, failed;       /* its end came, broken off or not */
    int trailer_status;       /* the grpc-status of its trailers (saved or streamed), or -1 */
};

extern struct fake_client client;

extern uint64_t now_ms;

void answered(struct front *f, unsigned status, const char *code, const struct answer_tag *tag);

/* The client side's front end: it records what it is sent in client. */
extern const struct front_ops fake_ops;

/* ---- the worker around one request ---- */

extern struct proxy px;
extern struct worker w;
extern struct cfg *cfg;
extern struct retry_req *req;

/* A worker on a config with one route "r" whose fields are 'route_json' (after name and
 * upstreams), the clock at 1,000,000 ms. The upstreams are addresses: the snapshot resolves a
 * route's upstream names for its tunnels (docs/upgrades.md), and nothing here connects; each is
 * one endpoint (an IP literal is never looked up), whose requests in flight in_flight() reads. */
void start(const char *route_json);

/* A request without a body: its head, then the end of its (empty) body starts attempt 1. */
void open_request(const char *method);

/* A GET without a body. */
void get(void);

/* libmicrohttpd is done with the connection: every timer of the request must be gone. */
void end_request(void);

/* (Criterion 2.4 does not count a failed assertion here: checks belong in the tests.) */
void finish(void);

/* Moves the clock to 'ms' after the start and runs the loop's turn. */
void at(uint64_t ms);

uint64_t since_start(uint64_t t);

/* Launch 'k' ends: without a response ('sent': the request went out), or with a response head
 * (then its body, complete). */
void launch_fails(unsigned k, bool sent);

void launch_answers(unsigned k, int status, const char *retry_after);

/* The same for the attempt launched last. */
void attempt_fails(bool sent);

void attempt_answers(int status, const char *retry_after);

/* ---- hedging (retry.hedge_on_per_try_timeout) ---- */

/* A route that hedges after 100 ms, its backoff 'wait_ms', at most 'attempts' attempts, the
 * whole request 1 s, and 'more' route fields. */
void start_hedging(unsigned wait_ms, unsigned attempts, const char *more);

/* A series of the registry, summed over the workers: 0 when it is not shown. */
double metric(const char *series);

/* Launch 'k' sends a response head now; its body follows with launch_body_ends(). */
void launch_head(unsigned k, int status);

void launch_body_ends(unsigned k);

bool running(unsigned k);

/* The attempts running now (the fake never queues one for a slot). */
int64_t launches_running(void);

/* Attempts in flight on the route's endpoints, as /upstreams and least_request see them. */
int64_t in_flight(void);

/* start_hedging(), a GET, and the clock on to the hedge's launch: attempts 0 and 1 run. */
void hedged(unsigned wait_ms, unsigned attempts);

#endif
