/* courier_int -- what the courier's two files share (proxy/delivery/courier.c: its front end,
 * claims and ticks; courier_end.c: an attempt's end and its store writes). Not for any other
 * file: proxy/delivery/courier.h is the courier's interface.
 */
#ifndef RETRYPROXY_PROXY_COURIER_INT_H
#define RETRYPROXY_PROXY_COURIER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/core/decide.h"
#include "proxy/core/front.h"
#include "proxy/core/worker.h"
#include "proxy/store/store.h"
#include "proxy/telemetry/metrics.h"

struct croute;

/* One claimed delivery: its attempt, then its end's store call. */
struct dlv {
    struct dlv *next;
    struct courier *c;
    struct croute *cr;
    struct rt *rt; /* the snapshot its attempt runs under (a reference) */
    struct store_delivery rec;
    struct front *f; /* its request's front, until fini */
    size_t body_off; /* body bytes the core took */
    char length[24]; /* its Content-Length */
    uint64_t start_ms, start_mono;
    /* the loop's ms when its lease was last set (claimed or renewed), and whether the renewal
     * under way (courier.renew) names it */
    uint64_t leased_mono;
    bool renewing;
    /* the answer */
    bool answered, ours, failed;
    int status;
    char stop[24], code[24];
    char *head;
    size_t head_len;
    char *body;
    size_t body_len, body_cap;
    char *upstream; /* its attempt's, copied before its request goes (NULL: none went) */
    uint64_t retry_after_ms;
    bool has_retry_after;
    /* the upstream (its index in the route's) its attempt counts against, while 'counted' */
    size_t up;
    bool counted;
    /* a re-attempt the budgets admitted holds a concurrency slot in each, while 'budgeted' */
    struct decide_budgets budgets;
    bool budgeted;
    struct loop_timer end_timer; /* the answer is acted on in the next turn, out of the core */
    /* what its end's store call borrows until it completes */
    struct store_attempt att;
    struct store_dead dead;
    struct store_call call;
    bool writing; /* 'call' is with the store: on_written() frees it */
};

/* A route deliveries are claimed for: its bounds' state, and the last snapshot that had it. */
struct croute {
    struct croute *next;
    char *name;
    struct metrics_route *m; /* its series (by name: they outlive any snapshot) */
    struct rt *rt;
    uint32_t in_flight;
    /* ... of them to each upstream, by its index in the route's upstreams (the attempt's
     * snapshot's: a reload that reorders them mixes counts until those in flight end) */
    uint32_t *up_in_flight;
    size_t n_up;
    double tokens;
    uint64_t filled_ms;
    struct store_call claim;
    size_t asked;        /* by the claim under way, its tokens taken */
    uint64_t claim_sent; /* ... sent then (the loop's ms): its leases run from no earlier */
    bool claiming;
    /* re-attempts the budgets refused since the last log line, and when that was */
    uint64_t refused, refused_logged_ms;
    struct courier *c;
};

struct courier {
    struct worker *w;
    struct store *store;
    /* the lease's owner: host, pid, start and random bits (courier_owner()) */
    char owner[160];
    uint64_t lease_ms; /* the store's lease: renewed after a third of it */
    /* the renewal under way: its call, the ids it borrows (STORE_ID_SIZE apart), their pointers,
     * and when it was sent */
    struct store_call renew;
    char *renew_ids;
    const char **renew_ptrs;
    uint64_t renew_sent;
    bool renewing, renew_failed;
    struct loop_timer tick;
    int kick_fd;
    struct loop_watch kick_watch;
    struct croute *routes;
    struct dlv *live;
    bool stopped;
    unsigned ticks;
    /* the sweep for deliveries of no claimed route: its call, and the names it borrows */
    struct store_call orphans;
    const char **names;
    bool sweeping;
};

/* The front state in the request's allocation. */
struct cfront {
    struct front f;
    struct dlv *d;
};

/* Wall-clock ms since the epoch (the store's times). */
uint64_t courier_wall_ms(void);
/* The next tick in 'in_ms' at the latest. */
void courier_arm(struct courier *c, uint64_t in_ms);
/* The route of 'cr' in the worker's current snapshot, else in the last one that had it. */
const struct cfg_route *courier_route_now(struct courier *c, struct croute *cr);

/* courier_end.c: whether the budgets let a claimed delivery's attempt go (false: it was put
 * back, or buried when its age ran out: no attempt), the attempt's end (the answer is in: its
 * end_timer), its store call's completion, a dead letter's write ('a' NULL: no attempt), and the
 * delivery freed. */
bool dlv_admit(struct dlv *d);
void dlv_on_end(struct loop_timer *t);
void dlv_on_written(struct store_call *call);
void dlv_bury(struct dlv *d, enum metrics_dead why, const struct store_attempt *a);
void dlv_free(struct dlv *d);
/* Gives its lease back: scheduled again, due now, no attempt recorded (a drain's). */
void dlv_release(struct dlv *d);
/* Its attempt no longer counts against its upstream, nor holds the budgets' slots (once only). */
void dlv_uncount(struct dlv *d);

#endif
