#include "proxy/upstream/slots.h"

#include <stdlib.h>
#include <string.h>

#include "proxy/base/dlist.h"
#include "proxy/base/loop.h"
#include "proxy/base/strmap.h"

struct slots {
    struct loop *loop;
    size_t held;                     /* slots held (at most 'cap' unless it fell) */
    size_t cap;                      /* 0: no limit */
    struct upstream_wait *wait_head; /* owners waiting for a slot, oldest first */
    struct upstream_wait *wait_tail;
    struct loop_timer wake;        /* hands free slots to waiting owners */
    unsigned origin_pct, conn_pct; /* the shares, percent of 'cap' (slots_set_shares) */
    struct strmap origins;         /* origin -> struct origin_share, made on first use */
    _Atomic int64_t *waiting;      /* owners waiting for a slot (the worker's metrics) */
};

/* An origin's share, under its own copy of the name. */
struct origin_share {
    struct share share;
    char name[];
};

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
        free(s->origins.slots[i].val);
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

static struct share *blocking(const struct slots *s, struct share *const share[2])
{
    return used_up(s, share[0]) ? share[0] : used_up(s, share[1]) ? share[1] : NULL;
}

static void wait_unlink(struct slots *s, struct upstream_wait *wt)
{
    struct upstream_wait **head = wt->parked ? &wt->parked->parked_head : &s->wait_head,
                         **tail = wt->parked ? &wt->parked->parked_tail : &s->wait_tail;
    if (*tail == wt)
        *tail = wt->prev;
    DLIST_UNLINK(*head, wt);
    wt->prev = wt->next = NULL;
    wt->parked = NULL;
}

/* Puts 'wt' (out of every list) last in the list of 'head' and 'tail'. */
static void wait_append(struct upstream_wait **head, struct upstream_wait **tail,
                        struct upstream_wait *wt)
{
    wt->next = NULL;
    wt->prev = *tail;
    if (*tail)
        (*tail)->next = wt;
    else
        *head = wt;
    *tail = wt;
}

/* Puts 'wt' (out of every list) first in the queue. */
static void wait_front(struct slots *s, struct upstream_wait *wt)
{
    wt->next = s->wait_head;
    if (s->wait_head)
        s->wait_head->prev = wt;
    else
        s->wait_tail = wt;
    s->wait_head = wt;
}

static void on_wake(struct loop_timer *t)
{
    struct slots *s = t->arg;
    while (s->wait_head && has_slot(s)) {
        struct upstream_wait *wt = s->wait_head;
        struct share *sh = blocking(s, wt->share);
        if (sh) {
            /* passed over until its share has room (slots_drop puts it back in front) */
            wait_unlink(s, wt);
            wt->parked = sh;
            wait_append(&sh->parked_head, &sh->parked_tail, wt);
            continue;
        }
        /* a connection's share outlives the wait until the slot holds it */
        struct share *keep[2] = { wt->share[0], wt->share[1] };
        for (int i = 0; i < 2; i++)
            if (keep[i])
                share_ref(keep[i]);
        slots_unwait(s, wt);
        wt->go(wt);
        for (int i = 0; i < 2; i++)
            share_unref(keep[i]);
    }
}

/* A slot was freed: waiting owners get it in the next turn, never from inside a library's
 * callback or from the middle of their own code. */
void slots_hand_on(struct slots *s)
{
    if (s->wait_head && has_slot(s))
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
        struct upstream_wait *wt = sh->parked_head;
        if (wt && !used_up(s, sh)) {
            /* the first passed over for this share waits in front again */
            wait_unlink(s, wt);
            wait_front(s, wt);
        }
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

void slots_set_shares(struct slots *s, unsigned origin_pct, unsigned conn_pct)
{
    s->origin_pct = origin_pct;
    s->conn_pct = conn_pct;
    /* a larger share may let a passed-over owner go: back in front, looked at again */
    for (size_t i = 0; i < s->origins.cap; i++) {
        struct origin_share *o = s->origins.slots[i].val;
        while (o && o->share.parked_head && !used_up(s, &o->share)) {
            struct upstream_wait *wt = o->share.parked_tail;
            wait_unlink(s, wt);
            wait_front(s, wt);
        }
    }
    slots_hand_on(s);
}

struct share *slots_origin_share(struct slots *s, const char *origin)
{
    struct origin_share *o = strmap_get(&s->origins, origin);
    if (o)
        return &o->share;
    size_t n = strlen(origin) + 1;
    if (!(o = calloc(1, sizeof(*o) + n)))
        return NULL;
    memcpy(o->name, origin, n);
    o->share.refs = 1; /* the map's: never freed before the worker */
    if (strmap_put(&s->origins, o->name, o) < 0) {
        free(o);
        return NULL;
    }
    return &o->share;
}

void slots_set_cap(struct slots *s, size_t cap)
{
    s->cap = cap;
    slots_hand_on(s);
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
    return s->wait_head || !has_slot(s) || blocking(s, share);
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
    count_wait(s, 1);
    wait_append(&s->wait_head, &s->wait_tail, wt);
    slots_hand_on(s);
}

void slots_unwait(struct slots *s, struct upstream_wait *wt)
{
    if (!wt->queued)
        return;
    wait_unlink(s, wt);
    wt->queued = false;
    count_wait(s, -1);
    for (int i = 0; i < 2; i++)
        share_unref(wt->share[i]);
}
