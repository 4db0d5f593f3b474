/* slots -- a worker's upstream attempt slots (limits.max_upstream_requests): at most 'cap'
 * attempts hold one at once, whatever their transport (libcurl's transfers, HTTP/2 streams,
 * upgrades' connections); the others wait their turn in order. Each slot costs an upstream
 * socket or stream and its buffers, so a burst of attempts is bounded by this rather than by
 * the number of requests. Of those slots, the attempts to one endpoint and those of one client
 * connection hold at most their share (proxy/upstream/share.h). No library:
 * the worker makes its own (proxy/core/worker.c), and proxy/upstream/attempt.c queues its attempts
 * here.
 */
#ifndef RETRYPROXY_PROXY_SLOTS_H
#define RETRYPROXY_PROXY_SLOTS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/upstream/share.h"

struct loop;
struct slots;

/* A slot held, or not, and the shares it counts in (set before it is taken; NULL: none): its
 * endpoint's (or origin's) and its client connection's. */
struct slot_hold {
    struct share *share[2];
    bool held;
};

/* An owner waiting for a slot. The owners waiting with the same two shares make a class, a
 * ring oldest first from its head; a class's head is in the worker's ready list, or parked in
 * the list of a share of its that is used up (proxy/upstream/slots.c says why). */
struct upstream_wait;
typedef void (*upstream_go_fn)(struct upstream_wait *wt);
struct upstream_wait {
    struct upstream_wait *prev, *next;   /* a head: in the ready list or its share's parked one */
    struct upstream_wait *older, *newer; /* its class's ring */
    upstream_go_fn go;
    struct share *share[2]; /* what its slot will count in (slot_hold) */
    struct share *parked;   /* a head: parked in this share's list, it being used up; NULL: ready */
    uint64_t seq;           /* arrival order */
    bool queued;
    bool head; /* its class's oldest */
};

/* A worker's slots on loop 'l' (no limit until slots_set_cap), or NULL. */
struct slots *slots_new(struct loop *l);
/* Frees; nothing may hold or wait for a slot. Accepts NULL. */
void slots_free(struct slots *s);

/* At most 'cap' slots held at once (0: no limit). */
void slots_set_cap(struct slots *s, size_t cap);
/* Where 's' counts the owners waiting for a slot (+1 on slots_wait(), -1 when they stop
 * waiting); NULL: nowhere. Only the loop's thread writes it. */
void slots_count_waits(struct slots *s, _Atomic int64_t *gauge);
/* Of those slots, the attempts to one endpoint (an upstream's origin at one address) hold at
 * most 'origin_pct' percent, those of one client connection at most 'conn_pct' (rounded up, at
 * least one): a slow endpoint, or a client with many streams, leaves the rest to the others
 * (Envoy's per-host and per-connection circuit breakers; docs/hardening.md). An attempt whose
 * share is used up waits its turn, as one past the cap does, and is passed over meanwhile. */
void slots_set_shares(struct slots *s, unsigned origin_pct, unsigned conn_pct);
/* The worker's share for the origin 'origin' (cfg_upstream.origin), made on first use, for an
 * attempt that has no endpoint target: kept until the worker ends. NULL out of memory. */
struct share *slots_origin_share(struct slots *s, const char *origin);
/* The worker's share for the endpoint named 'key' (its origin and address, made by
 * proxy/upstream/attempt.c), made on first use, with one owner more: the endpoint's target, which
 * gives it back with slots_share_let_go(), from any thread, before or after slots_free(). Two
 * targets of one endpoint (an old and a new config snapshot's) count in the same share. NULL
 * out of memory. */
struct share *slots_endpoint_share(struct slots *s, const char *key);
void slots_share_let_go(struct share *sh); /* accepts NULL */
/* Drops the endpoints' shares that nothing uses (no target owns, no slot holds, nothing waits
 * through), so that the map follows the endpoints as they come and go: done as it grows too
 * (slots_endpoint_share), and by the worker's trim. */
void slots_trim(struct slots *s);
/* How many shares the worker keeps now. */
size_t slots_shares(const struct slots *s);

/* True when a slot counted in 'share' (two, either NULL) taken now would pass the cap or a
 * share, or others already wait. */
bool slots_full(const struct slots *s, struct share *const share[2]);
/* Queues 'wt' (its 'share' set): its 'go' is called from the loop once a slot is free and its
 * shares have room, before any owner that came after it and has room too (a slot must then be
 * taken from it, counted in the same shares, or it passes to the next). */
void slots_wait(struct slots *s, struct upstream_wait *wt, upstream_go_fn go);
/* Leaves the queue (a no-op when 'wt' is not in it). */
void slots_unwait(struct slots *s, struct upstream_wait *wt);

/* 'h' takes a slot (the caller checked slots_full(); a no-op when it holds one). */
void slots_take(struct slots *s, struct slot_hold *h);
/* 'h' gives its slot back (a no-op when it holds none): its attempt ended, or its response is
 * committed to a client and streams at that client's pace, which the cap must not wait on
 * (docs/hardening.md, "Slow readers"). Waiting owners get it in the next turn. */
void slots_release(struct slots *s, struct slot_hold *h);
/* The same without handing it on yet (several at once): slots_hand_on() then. */
void slots_drop(struct slots *s, struct slot_hold *h);
void slots_hand_on(struct slots *s);

#endif
