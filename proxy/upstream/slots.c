/* Who goes when a slot is free. An owner may go once a slot is free and both its shares have
 * room; of those that may, the one that came first goes first (docs/hardening.md, "Upstream
 * attempt slots"). The owners waiting with the same two shares are one class, served in
 * arrival order: its head stands for all of it, so a wake looks at classes, not owners. A class
 * whose share is used up is parked on that share, out of the wake's sight, and every class
 * parked on a share is looked at again as soon as it has room, whichever class it is and
 * whatever other share it waits with (issue 37: putting back the first owner alone let it park
 * on its other, full share while those behind it, with room, waited for nothing). A wake costs
 * the classes not parked; a slot given back, the classes parked on its shares. */
#include "proxy/upstream/slots.h"

#include <stdlib.h>
#include <string.h>

#include "proxy/base/dlist.h"
#include "proxy/base/loop.h"
#include "proxy/base/strmap.h"

struct slots {
    struct loop *loop;
    size_t held;                   /* slots held (at most 'cap' unless it fell) */
    size_t cap;                    /* 0: no limit */
    struct upstream_wait *ready;   /* the heads of the classes not parked */
    struct share *blocked;         /* the shares classes are parked on */
    uint64_t arrivals;             /* owners queued so far: the next one's seq */
    struct loop_timer wake;        /* hands free slots to waiting owners */
    unsigned origin_pct, conn_pct; /* the shares, percent of 'cap' (slots_set_shares) */
    struct strmap origins;         /* key -> struct origin_share, made on first use */
    size_t kept;                   /* entries of 'origins' the last sweep kept */
    _Atomic int64_t *waiting;      /* owners waiting for a slot (the worker's metrics) */
};

/* An origin's or an endpoint's share, under its own copy of the key. An endpoint's is owned by
 * the map and by each target that found it (slots_endpoint_share), whose last owner frees it:
 * a target may let go from another thread, and after the worker's slots are freed, since the
 * config snapshot that holds it outlives the worker. An origin's is the map's alone. */
struct origin_share {
    struct share share;
    _Atomic unsigned owners; /* an endpoint's: the map's one, and one per target */
    bool endpoint;
    char name[];
};

/* The share owned by the map (or by a target of 'o') drops its owner; the last frees it. */
static void owner_drop(struct origin_share *o)
{
    if (!o->endpoint || atomic_fetch_sub_explicit(&o->owners, 1, memory_order_acq_rel) == 1)
        free(o);
}

struct slots *slots_new(struct loop *l)
{
    struct slots *s = calloc(1, sizeof(*s));
    if (s)
        s->loop = l;
    return s;
}

void slots_free(struct slots *s)
{
    if (!s)
        return;
    loop_timer_stop(s->loop, &s->wake);
    for (size_t i = 0; i < s->origins.cap; i++)
        if (s->origins.slots[i].val)
            owner_drop(s->origins.slots[i].val);
    strmap_free(&s->origins);
    free(s);
}

static bool has_slot(const struct slots *s)
{
    return !s->cap || s->held < s->cap;
}

/* Whether 'sh' (NULL: none) holds all it may. */
static bool used_up(const struct slots *s, const struct share *sh)
{
    if (!sh || !s->cap)
        return false;
    size_t limit = (s->cap * (sh->conn ? s->conn_pct : s->origin_pct) + 99) / 100;
    return sh->held >= (limit ? limit : 1);
}

/* The share that keeps an owner of 'share' waiting, or NULL. The connection's first: what is
 * parked on it is that connection's alone, few classes to look at again when it frees. */
static struct share *blocking(const struct slots *s, struct share *const share[2])
{
    return used_up(s, share[1]) ? share[1] : used_up(s, share[0]) ? share[0] : NULL;
}

/* The list the head 'h' is in. */
static struct upstream_wait **list_of(struct slots *s, const struct upstream_wait *h)
{
    return h->parked ? &h->parked->parked_head : &s->ready;
}

/* Takes the head 'h' out of its list (a share whose last one it was leaves 'blocked'). */
static void head_unlink(struct slots *s, struct upstream_wait *h)
{
    struct upstream_wait **l = list_of(s, h);
    DLIST_UNLINK(*l, h);
    if (h->parked && !h->parked->parked_head)
        DLIST_UNLINK(s->blocked, h->parked);
    h->prev = h->next = NULL;
    h->parked = NULL;
}

/* The ready head 'h' waits on the used-up 'sh' until it has room. */
static void park(struct slots *s, struct upstream_wait *h, struct share *sh)
{
    head_unlink(s, h);
    if (!sh->parked_head)
        DLIST_PUSH(s->blocked, sh);
    h->parked = sh;
    DLIST_PUSH(sh->parked_head, h);
}

/* Every class parked on 'sh' is looked at in the next wake. */
static void unpark_all(struct slots *s, struct share *sh)
{
    while (sh->parked_head) {
        struct upstream_wait *h = sh->parked_head;
        head_unlink(s, h);
        DLIST_PUSH(s->ready, h);
    }
}

/* The head of the class of owners waiting with 'share' in the list from 'h', or NULL. */
static struct upstream_wait *class_in(struct upstream_wait *h, struct share *const share[2])
{
    while (h && (h->share[0] != share[0] || h->share[1] != share[1]))
        h = h->next;
    return h;
}

static void on_wake(struct loop_timer *t)
{
    struct slots *s = t->arg;
    while (has_slot(s)) {
        /* the oldest head with room; those without are parked meanwhile */
        struct upstream_wait *best = NULL, *next;
        for (struct upstream_wait *h = s->ready; h; h = next) {
            next = h->next;
            struct share *sh = blocking(s, h->share);
            if (sh)
                park(s, h, sh);
            else if (!best || h->seq < best->seq)
                best = h;
        }
        if (!best)
            break;
        /* a connection's share outlives the wait until the slot holds it */
        struct share *keep[2] = { best->share[0], best->share[1] };
        for (int i = 0; i < 2; i++)
            if (keep[i])
                share_ref(keep[i]);
        slots_unwait(s, best);
        best->go(best);
        for (int i = 0; i < 2; i++)
            share_unref(keep[i]);
    }
}

/* A slot was freed: waiting owners get it in the next turn, never from inside a library's
 * callback or from the middle of their own code. */
void slots_hand_on(struct slots *s)
{
    if (s->ready && has_slot(s))
        loop_timer_start(s->loop, &s->wake, loop_now(s->loop), on_wake, s);
}

void slots_drop(struct slots *s, struct slot_hold *h)
{
    if (!h->held)
        return;
    h->held = false;
    s->held--;
    for (int i = 0; i < 2; i++) {
        struct share *sh = h->share[i];
        if (!sh)
            continue;
        sh->held--;
        if (!used_up(s, sh))
            unpark_all(s, sh);
        h->share[i] = NULL; /* a slot taken again without queueing counts in none */
        share_unref(sh);
    }
}

void slots_release(struct slots *s, struct slot_hold *h)
{
    slots_drop(s, h);
    slots_hand_on(s);
}

void slots_take(struct slots *s, struct slot_hold *h)
{
    if (h->held)
        return;
    h->held = true;
    s->held++;
    for (int i = 0; i < 2; i++)
        if (h->share[i]) {
            h->share[i]->held++;
            share_ref(h->share[i]);
        }
}

/* New limits may give any share room: every parked class is looked at again. */
static void limits_changed(struct slots *s)
{
    while (s->blocked)
        unpark_all(s, s->blocked);
    slots_hand_on(s);
}

void slots_set_shares(struct slots *s, unsigned origin_pct, unsigned conn_pct)
{
    s->origin_pct = origin_pct;
    s->conn_pct = conn_pct;
    limits_changed(s);
}

/* The share under 'key' in the map, made on first use (an endpoint's if 'endpoint'). */
static struct origin_share *share_of(struct slots *s, const char *key, bool endpoint)
{
    struct origin_share *o = strmap_get(&s->origins, key);
    if (o)
        return o;
    /* the map never holds more than twice the shares in use at its last sweep (and a few):
     * the sweeps cost O(1) a new share over time, however many endpoints come and go */
    if (s->origins.n >= 2 * s->kept + 16)
        slots_trim(s);
    size_t n = strlen(key) + 1;
    if (!(o = calloc(1, sizeof(*o) + n)))
        return NULL;
    memcpy(o->name, key, n);
    o->share.refs = 1; /* the map's */
    o->endpoint = endpoint;
    atomic_init(&o->owners, 1);
    if (strmap_put(&s->origins, o->name, o) < 0) {
        free(o);
        return NULL;
    }
    return o;
}

struct share *slots_origin_share(struct slots *s, const char *origin)
{
    struct origin_share *o = share_of(s, origin, false);
    return o ? &o->share : NULL;
}

struct share *slots_endpoint_share(struct slots *s, const char *key)
{
    struct origin_share *o = share_of(s, key, true);
    if (!o || !o->endpoint)
        return NULL; /* an origin's key: never the case, the keys differ (attempt.c) */
    atomic_fetch_add_explicit(&o->owners, 1, memory_order_relaxed);
    return &o->share;
}

void slots_share_let_go(struct share *sh)
{
    if (sh)
        owner_drop((struct origin_share *)(void *)sh); /* 'share' is first */
}

/* Whether the map's entry 'o' is all that is left of it: an endpoint's share that no target
 * owns (only this thread adds owners), no slot holds and nothing waits through. */
static bool unused(struct origin_share *o)
{
    return o->endpoint && atomic_load_explicit(&o->owners, memory_order_acquire) == 1 &&
           o->share.refs == 1 && !o->share.held && !o->share.parked_head;
}

void slots_trim(struct slots *s)
{
    struct strmap kept = { 0 };
    for (size_t i = 0; i < s->origins.cap; i++) {
        struct origin_share *o = s->origins.slots[i].val;
        if (o && !unused(o) && strmap_put(&kept, o->name, o) < 0) {
            strmap_free(&kept); /* out of memory: everything stays, as it was */
            return;
        }
    }
    /* what was not kept, not what is unused now: a target may have let go since */
    for (size_t i = 0; i < s->origins.cap; i++) {
        struct origin_share *o = s->origins.slots[i].val;
        if (o && strmap_get(&kept, o->name) != o)
            free(o);
    }
    strmap_free(&s->origins);
    s->origins = kept;
    s->kept = kept.n;
}

size_t slots_shares(const struct slots *s)
{
    return s->origins.n;
}

void slots_set_cap(struct slots *s, size_t cap)
{
    s->cap = cap;
    limits_changed(s);
}

void slots_count_waits(struct slots *s, _Atomic int64_t *gauge)
{
    s->waiting = gauge;
}

/* The waiting gauge moves by 'delta': a relaxed load and store, this thread being its only
 * writer. */
static void count_wait(struct slots *s, int delta)
{
    if (s->waiting)
        atomic_store_explicit(s->waiting,
                              atomic_load_explicit(s->waiting, memory_order_relaxed) + delta,
                              memory_order_relaxed);
}

bool slots_full(const struct slots *s, struct share *const share[2])
{
    return s->ready || !has_slot(s) || blocking(s, share);
}

void slots_wait(struct slots *s, struct upstream_wait *wt, upstream_go_fn go)
{
    if (wt->queued)
        return;
    for (int i = 0; i < 2; i++)
        if (wt->share[i])
            share_ref(wt->share[i]);
    wt->go = go;
    wt->queued = true;
    wt->seq = s->arrivals++;
    count_wait(s, 1);
    /* its class, wherever its head is: ready, or parked on one of their shares */
    struct upstream_wait *h = class_in(s->ready, wt->share);
    for (int i = 0; i < 2 && !h; i++)
        if (wt->share[i])
            h = class_in(wt->share[i]->parked_head, wt->share);
    if (h) {
        wt->head = false; /* the newest of the ring, just before its head */
        wt->newer = h;
        wt->older = h->older;
        h->older->newer = wt;
        h->older = wt;
    } else {
        wt->head = true;
        wt->older = wt->newer = wt;
        wt->parked = NULL;
        DLIST_PUSH(s->ready, wt);
    }
    slots_hand_on(s);
}

void slots_unwait(struct slots *s, struct upstream_wait *wt)
{
    if (!wt->queued)
        return;
    struct upstream_wait *n = wt->newer;
    if (wt->head && n != wt) {
        /* the next oldest of its class takes its place */
        n->head = true;
        n->parked = wt->parked;
        n->prev = wt->prev;
        n->next = wt->next;
        if (n->prev)
            n->prev->next = n;
        else
            *list_of(s, wt) = n;
        if (n->next)
            n->next->prev = n;
    } else if (wt->head) {
        head_unlink(s, wt);
    }
    wt->older->newer = n;
    n->older = wt->older;
    wt->prev = wt->next = wt->older = wt->newer = NULL;
    wt->parked = NULL;
    wt->head = false;
    wt->queued = false;
    count_wait(s, -1);
    for (int i = 0; i < 2; i++)
        share_unref(wt->share[i]);
}
