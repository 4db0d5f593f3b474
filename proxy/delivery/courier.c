/* courier -- delivers what durable routes stored (proxy/delivery/courier.h, docs/delivery.md).
 *
 * Why one courier, in one worker: deliveries are paced (routes[].delivery.max_per_second and
 * max_in_flight), so the work of starting them is small next to the attempts themselves, and
 * those run in the upstream machinery of the worker's loop as any attempt does; one claimer
 * also keeps the store's claims from competing with each other.
 *
 * A tick (every COURIER_POLL_MS, and at once after an accept committed anywhere) claims, per
 * route, as many due deliveries as the route has room for: its in-flight bound and its token
 * bucket (max_per_second, a second's worth of burst). Each claimed delivery becomes a request
 * of the core with this file's front_ops: one attempt (front_ops.delivery), whose answer comes
 * back as a client's would. A re-attempt is a retry for the retry budgets (courier_end.c,
 * dlv_admit()): one they refuse makes no attempt and is rescheduled after its backoff delay.
 * Its end goes to the store under the claim's lease:
 *
 *   2xx                               -> complete (delivered)
 *   what retry_on names (the core       -> reschedule at now + the backoff policy's delay for
 *   stopped at its one attempt), a       attempt n (Retry-After first, within
 *   reset, no connection, 408, 429       retry_after.max_ms), or bury "attempts" once n reaches
 *                                        retry.max_attempts, or "age" past delivery.max_age_ms
 *   anything else                      -> bury "final", with the answer's head and first bytes
 *
 * The policy read is that of the route in the worker's current snapshot, so a reload applies to
 * the next delay of every pending delivery. A route a reload removed keeps being delivered under
 * the last snapshot that had it, which its entry here holds.
 *
 * This file and courier_end.c (an attempt's end and its store writes) are one state machine, a
 * delivery's: they call each other, through courier_int.h.
 */
#include "proxy/delivery/courier.h"
#include "proxy/delivery/courier_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "policy/backoff.h"
#include "policy/retry_after.h"
#include "proxy/core/front.h"
#include "proxy/core/proxy.h"
#include "proxy/core/retry.h"
#include "proxy/core/runtime.h"
#include "proxy/core/worker.h"
#include "proxy/http/answer.h"
#include "proxy/store/store.h"
#include "proxy/telemetry/log.h"
#include "proxy/telemetry/metrics.h"

/* How often due deliveries are looked for when no accept says so: the delay a rescheduled
 * delivery may wait past its time. */
#define COURIER_POLL_MS 200
/* Every this many ticks (about 5 s), and at the first, the deliveries of routes no claimer asks
 * for are looked for: a route gone from the config since they were accepted (a restart on a
 * config without it; a reload keeps the old snapshot instead). So many at a time. */
#define ORPHAN_TICKS 25
#define ORPHAN_MAX   16
/* How long a stopping courier waits for a claim under way (it gives back what it took). Short:
 * the stop comes after the drain, and the pod's grace period is sized for the drain and one
 * second more (docs/deploy.md); a claim not back by then keeps its rows under their lease,
 * taken again after it (at least once: docs/delivery.md). With 10 s here, a proxy stopped just
 * after its start took over 10 s to exit in two of three fresh-clone test runs, most likely
 * waiting here. */
#define STOP_WAIT_MS 1000

static struct dlv *of_front(struct front *f)
{
    return ((struct cfront *)(void *)f)->d;
}

uint64_t courier_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void courier_arm(struct courier *c, uint64_t in_ms)
{
    struct loop *l = c->w->loop;
    uint64_t when = loop_now(l) + in_ms;
    if (!loop_timer_armed(&c->tick) || c->tick.when_ms > when) {
        loop_timer_stop(l, &c->tick);
        loop_timer_start(l, &c->tick, when, c->tick.fn, c);
    }
}

/* ---- the route's policy as it is now ---- */

/* The route 'name' in snapshot 'rt', or NULL. */
static const struct cfg_route *route_in(const struct rt *rt, const char *name)
{
    for (size_t i = 0; rt && i < rt->cfg->n_routes; i++)
        if (strcmp(rt->cfg->routes[i].name, name) == 0)
            return &rt->cfg->routes[i];
    return NULL;
}

/* The route of 'cr' in the worker's current snapshot, else in the last one that had it. */
const struct cfg_route *courier_route_now(struct courier *c, struct croute *cr)
{
    const struct cfg_route *r = route_in(c->w->rt, cr->name);
    return r ? r : route_in(cr->rt, cr->name);
}

/* ---- the front end of a stored request ---- */

static void c_fields(struct front *f,
                     void (*fn)(void *arg, const char *k, size_t kl, const char *v, size_t vl),
                     void *arg)
{
    struct dlv *d = of_front(f);
    const struct store_delivery *rec = &d->rec;
    for (size_t i = 0; i < rec->nfields; i++)
        fn(arg, rec->fields[i].name, strlen(rec->fields[i].name), rec->fields[i].value,
           strlen(rec->fields[i].value));
    const struct cfg_route *rt = courier_route_now(d->c, d->cr);
    const char *idh = rt ? rt->delivery.id_header : "webhook-id";
    fn(arg, idh, strlen(idh), rec->id, strlen(rec->id));
    /* the body is framed again (the accept kept no framing field) */
    bool bodied = rec->body_len || strcmp(rec->method, "POST") == 0 ||
                  strcmp(rec->method, "PUT") == 0 || strcmp(rec->method, "PATCH") == 0;
    if (bodied) { /* kept in 'd': the core keeps pointers to the values it is given */
        int n = snprintf(d->length, sizeof(d->length), "%zu", rec->body_len);
        fn(arg, "Content-Length", 14, d->length, (size_t)n);
    }
}

/* The answer is in: acted on in the next turn, once the core is out of its call. */
static void answered(struct dlv *d, struct front *f, int status)
{
    d->answered = true;
    d->status = status;
    f->answered = true;
    f->status = (unsigned)status;
    f->sent = true;
    retry_req_sending(f->req);
    loop_timer_start(d->c->w->loop, &d->end_timer, loop_now(d->c->w->loop), dlv_on_end, d);
}

/* The answer's head as a dead letter keeps it, and its Retry-After for the next delay. */
static void keep_head(struct dlv *d, int status, const struct hlist *h)
{
    free(d->head);
    d->head = hlist_head_text(status, h, &d->head_len);
    const char *ra;
    size_t ra_len;
    uint64_t ms;
    if (h && hlist_values(h, "Retry-After", &ra, &ra_len, 1) &&
        retry_after_parse(ra, ra_len, (int64_t)courier_wall_ms(), &ms) == 0) {
        d->has_retry_after = true;
        d->retry_after_ms = ms;
    }
}

static void keep_body(struct dlv *d, const char *p, size_t n)
{
    size_t cap = d->c->w->rt->cfg->store.dead_body_bytes;
    if (d->body_len >= cap)
        return;
    if (n > cap - d->body_len)
        n = cap - d->body_len;
    if (!d->body && !(d->body = malloc(cap ? cap : 1)))
        return;
    memcpy(d->body + d->body_len, p, n);
    d->body_len += n;
}

static void c_error(struct front *f, unsigned status, const char *code, const char *route,
                    const char *message, const struct answer_tag *tag)
{
    (void)route;
    struct dlv *d = of_front(f);
    d->ours = true;
    snprintf(d->code, sizeof(d->code), "%s", code);
    snprintf(d->stop, sizeof(d->stop), "%s", tag->stop ? tag->stop : "");
    keep_head(d, (int)status, NULL);
    keep_body(d, message, strlen(message));
    answered(d, f, (int)status);
}

static void c_saved(struct front *f, int status, const struct hlist *h, const char *body,
                    size_t len, const struct hlist *trailers, const struct answer_tag *tag)
{
    (void)trailers;
    struct dlv *d = of_front(f);
    snprintf(d->stop, sizeof(d->stop), "%s", tag->stop ? tag->stop : "");
    keep_head(d, status, h);
    keep_body(d, body, len);
    answered(d, f, status);
}

static void c_response(struct front *f, int status, const struct hlist *h,
                       const struct answer_tag *tag)
{
    struct dlv *d = of_front(f);
    snprintf(d->stop, sizeof(d->stop), "%s", tag->stop ? tag->stop : "");
    keep_head(d, status, h);
    d->status = status;
    f->status = (unsigned)status;
    f->sent = true;
    f->answered = true;
    retry_req_sending(f->req);
}

static size_t c_body(struct front *f, const char *p, size_t n)
{
    struct dlv *d = of_front(f);
    keep_body(d, p, n);
    f->body_sent += n;
    return n;
}

static void c_end(struct front *f, const struct hlist *trailers, bool failed)
{
    (void)trailers;
    struct dlv *d = of_front(f);
    if (d->answered)
        return;
    d->failed = failed;
    d->answered = true;
    loop_timer_start(d->c->w->loop, &d->end_timer, loop_now(d->c->w->loop), dlv_on_end, d);
}

static void c_reset(struct front *f, unsigned status)
{
    struct dlv *d = of_front(f);
    if (d->answered)
        return;
    d->failed = true;
    snprintf(d->code, sizeof(d->code), "reset");
    f->answered = true;
    f->status = status;
    d->answered = true;
    loop_timer_start(d->c->w->loop, &d->end_timer, loop_now(d->c->w->loop), dlv_on_end, d);
}

static void offer_body(struct dlv *d);

static void c_wait_upload(struct front *f)
{
    (void)f; /* the rest is offered again at upload_room() */
}

static void c_upload_room(struct front *f)
{
    offer_body(of_front(f));
}

static void c_nothing(struct front *f)
{
    (void)f;
}

static struct rt *c_delivery(struct front *f, const char **route)
{
    struct dlv *d = of_front(f);
    *route = d->cr->name;
    return d->rt;
}

/* The core picked upstream 'k' of the route for the attempt: counted against it, unless it has
 * max_in_flight_per_upstream of the route's deliveries in flight already (the bound as the
 * route is now: a reload applies at the next pick). */
static bool c_attempting(struct front *f, size_t k)
{
    struct dlv *d = of_front(f);
    struct croute *cr = d->cr;
    const struct cfg_route *rt = courier_route_now(d->c, cr);
    if (!rt || d->counted)
        return true;
    if (k >= cr->n_up) {
        uint32_t *v = realloc(cr->up_in_flight, (k + 1) * sizeof(*v));
        if (!v)
            return true; /* out of memory: not counted, not refused */
        memset(v + cr->n_up, 0, (k + 1 - cr->n_up) * sizeof(*v));
        cr->up_in_flight = v;
        cr->n_up = k + 1;
    }
    if (cr->up_in_flight[k] >= rt->delivery.max_in_flight_per_upstream)
        return false;
    cr->up_in_flight[k]++;
    d->up = k;
    d->counted = true;
    return true;
}

static void c_fini(struct front *f)
{
    struct dlv *d = of_front(f);
    if (d)
        d->f = NULL;
}

/* upgrade is never asked: a stored head carries no Upgrade field (durable.c keeps no
 * hop-by-hop field). */
static const struct front_ops courier_ops = {
    .fields = c_fields,
    .error = c_error,
    .saved = c_saved,
    .response = c_response,
    .body = c_body,
    .end = c_end,
    .reset = c_reset,
    .wait_upload = c_wait_upload,
    .upload_room = c_upload_room,
    .watch = c_nothing,
    .unwatch = c_nothing,
    .delivery = c_delivery,
    .attempting = c_attempting,
    .fini = c_fini,
};

static void offer_body(struct dlv *d)
{
    while (d->f && !d->f->answered && d->body_off < d->rec.body_len) {
        size_t took =
            retry_req_body(d->f->req, d->rec.body + d->body_off, d->rec.body_len - d->body_off);
        if (took == RETRY_BODY_CLOSE || took == 0)
            return;
        d->body_off += took;
    }
    if (d->f && d->body_off == d->rec.body_len)
        retry_req_end(d->f->req);
}

/* ---- claims ---- */

/* A claimed delivery, taken from 'rec' (cleared), counted in flight; NULL out of memory (its
 * lease runs out and it is claimed again). */
static struct dlv *dlv_new(struct courier *c, struct croute *cr, struct store_delivery *rec)
{
    struct dlv *d = calloc(1, sizeof(*d));
    if (!d) {
        store_delivery_clear(rec);
        return NULL;
    }
    d->c = c;
    d->cr = cr;
    d->rec = *rec;
    memset(rec, 0, sizeof(*rec));
    d->rt = cr->rt ? rt_ref(cr->rt) : NULL; /* none: its route is gone */
    d->start_ms = courier_wall_ms();
    d->start_mono = loop_now(c->w->loop);
    d->leased_mono = d->start_mono;
    d->next = c->live;
    c->live = d;
    cr->in_flight++;
    d->call.cq = c->w->cq;
    d->call.done = dlv_on_written;
    d->call.arg = d;
    return d;
}

static void start(struct courier *c, struct dlv *d)
{
    if (!dlv_admit(d))
        return; /* refused by the budgets: put back, its store call under way */
    struct front *f = retry_req_new(c->w, &courier_ops, sizeof(struct cfront), FRONT_HTTP1,
                                    d->rec.target, "", 0, REFUSE_NONE);
    if (!f) {
        dlv_free(d);
        return;
    }
    ((struct cfront *)(void *)f)->d = d;
    d->f = f;
    retry_req_head(f->req, d->rec.method);
    offer_body(d);
}

static void on_claimed(struct store_call *call)
{
    struct croute *cr = call->arg;
    struct courier *c = cr->c;
    cr->claiming = false;
    if (call->n < cr->asked) /* fewer were due: their tokens come back */
        cr->tokens += (double)(cr->asked - call->n);
    bool draining = c->stopped || atomic_load_explicit(&c->w->px->draining, memory_order_relaxed);
    for (size_t i = 0; i < call->n; i++) {
        struct dlv *d = dlv_new(c, cr, &call->items[i]);
        if (!d)
            continue;
        d->leased_mono = cr->claim_sent;
        if (draining) /* claimed, not attempted: another proxy takes it at once */
            dlv_release(d);
        else
            start(c, d);
    }
    store_call_clear(call);
}

static struct croute *croute_of(struct courier *c, const char *name)
{
    for (struct croute *cr = c->routes; cr; cr = cr->next)
        if (strcmp(cr->name, name) == 0)
            return cr;
    struct croute *cr = calloc(1, sizeof(*cr));
    if (!cr || !(cr->name = strdup(name))) {
        free(cr);
        return NULL;
    }
    cr->c = c;
    cr->m = metrics_route(c->w->px->metrics, name);
    cr->next = c->routes;
    c->routes = cr;
    return cr;
}

/* Claims for one route: as many as its in-flight bound and its token bucket leave room for. */
static void claim(struct courier *c, struct croute *cr, const struct cfg_route *rt, uint64_t now)
{
    const struct cfg_delivery *dv = &rt->delivery;
    double rate = dv->max_per_second;
    if (cr->filled_ms == 0)
        cr->tokens = rate;
    else
        cr->tokens += rate * (double)(now - cr->filled_ms) / 1000.0;
    if (cr->tokens > rate)
        cr->tokens = rate; /* a second's worth of burst */
    cr->filled_ms = now;
    /* no more than every upstream's bound together: each one's own is kept at the pick
     * (c_attempting), for the core picks the upstream */
    uint64_t bound = dv->max_in_flight;
    uint64_t per_up = (uint64_t)dv->max_in_flight_per_upstream * rt->n_upstreams;
    if (per_up < bound)
        bound = per_up;
    if (cr->claiming || cr->in_flight >= bound || cr->tokens < 1)
        return;
    size_t room = (size_t)(bound - cr->in_flight);
    if ((double)room > cr->tokens)
        room = (size_t)cr->tokens;
    cr->claim.cq = c->w->cq;
    cr->claim.done = on_claimed;
    cr->claim.arg = cr;
    if (store_claim_route(c->store, &cr->claim, c->owner, cr->name, room) == 0) {
        cr->claiming = true;
        cr->claim_sent = now;
        cr->asked = room;
        cr->tokens -= (double)room; /* those not used come back in on_claimed() */
    }
}

/* What the sweep found: a route of the current snapshot (one no longer durable) is delivered
 * as its route is; one of no route is a dead letter, "route_gone", without an attempt. */
static void on_orphans(struct store_call *call)
{
    struct courier *c = call->arg;
    c->sweeping = false;
    free(c->names);
    c->names = NULL;
    for (size_t i = 0; i < call->n; i++) {
        struct store_delivery *rec = &call->items[i];
        struct croute *cr = c->stopped ? NULL : croute_of(c, rec->route);
        if (!cr) {
            store_delivery_clear(rec);
            continue;
        }
        if (!cr->rt && route_in(c->w->rt, cr->name))
            cr->rt = rt_ref(c->w->rt);
        struct dlv *d = dlv_new(c, cr, rec);
        if (d && cr->rt)
            start(c, d);
        else if (d)
            dlv_bury(d, METRICS_DEAD_ROUTE_GONE, NULL);
    }
    store_call_clear(call);
}

/* Looks for due deliveries of the routes no claimer asks for. */
static void sweep(struct courier *c)
{
    size_t n = 0;
    for (struct croute *cr = c->routes; cr; cr = cr->next)
        n++;
    c->names = calloc(n ? n : 1, sizeof(*c->names));
    if (!c->names)
        return;
    n = 0;
    for (struct croute *cr = c->routes; cr; cr = cr->next)
        if (cr->rt) /* one with no route is not asked for by its name */
            c->names[n++] = cr->name;
    c->orphans.cq = c->w->cq;
    c->orphans.done = on_orphans;
    c->orphans.arg = c;
    if (store_claim_except(c->store, &c->orphans, c->owner, c->names, n, ORPHAN_MAX) == 0) {
        c->sweeping = true;
    } else {
        free(c->names);
        c->names = NULL;
    }
}

/* ---- leases ---- */

static void on_renewed(struct store_call *call)
{
    struct courier *c = call->arg;
    c->renewing = false;
    for (struct dlv *d = c->live; d; d = d->next) {
        if (d->renewing && call->result == 0)
            d->leased_mono = c->renew_sent;
        d->renewing = false;
    }
    /* said once per streak: while the database is lost every tick fails */
    if (call->result < 0 && call->result != STORE_ECLOSED && !c->renew_failed)
        log_event(CFG_LOG_WARN, "delivery leases not renewed", LOG_NUM("error", call->result),
                  NULL);
    c->renew_failed = call->result < 0;
    store_call_clear(call);
}

/* Renews, in one store call, the lease of every delivery held (not being written) whose lease
 * is a third gone: an attempt that runs longer than the lease (a slow upstream, a long body)
 * keeps its delivery, and no other proxy takes it while it may still be running
 * (docs/delivery.md "Shared store", leases). A renewal that fails is tried at the next tick;
 * one never written lets the lease run out (at least once, as ever). */
static void renew(struct courier *c, uint64_t now)
{
    if (c->renewing || !c->lease_ms)
        return;
    size_t n = 0;
    for (struct dlv *d = c->live; d; d = d->next)
        if (!d->writing && now - d->leased_mono >= c->lease_ms / 3)
            n++;
    if (n == 0)
        return;
    char *ids = realloc(c->renew_ids, n * STORE_ID_SIZE);
    if (ids)
        c->renew_ids = ids;
    const char **ptrs = ids ? realloc(c->renew_ptrs, n * sizeof(*ptrs)) : NULL;
    if (!ptrs)
        return; /* out of memory: the next tick tries again */
    c->renew_ptrs = ptrs;
    size_t k = 0;
    for (struct dlv *d = c->live; d && k < n; d = d->next)
        if (!d->writing && now - d->leased_mono >= c->lease_ms / 3) {
            ptrs[k] = ids + k * STORE_ID_SIZE;
            memcpy(ids + k * STORE_ID_SIZE, d->rec.id, STORE_ID_SIZE);
            k++;
            d->renewing = true;
        }
    c->renew.cq = c->w->cq;
    c->renew.done = on_renewed;
    c->renew.arg = c;
    c->renew_sent = now;
    if (store_renew(c->store, &c->renew, c->owner, ptrs, k) == 0)
        c->renewing = true;
    else
        for (struct dlv *d = c->live; d; d = d->next)
            d->renewing = false;
}

/* The lease's owner, unique across a fleet: the host's name (a pod's), the pid (1 in many
 * containers), the start in ms and 32 random bits, so that two pods whose proxies are PID 1 and
 * started in the same millisecond still differ. */
static void courier_owner(struct courier *c)
{
    char host[65] = "";
    if (gethostname(host, sizeof(host) - 1) < 0 || !host[0])
        snprintf(host, sizeof(host), "unknown");
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        rnd = (uint32_t)rand() ^ (uint32_t)courier_wall_ms(); /* no entropy: the time's bits */
    snprintf(c->owner, sizeof(c->owner), "%s-%ld-%" PRIu64 "-%08" PRIx32, host, (long)getpid(),
             courier_wall_ms(), rnd);
}

static void on_tick(struct loop_timer *t)
{
    struct courier *c = t->arg;
    struct worker *w = c->w;
    if (c->stopped)
        return;
    uint64_t now = loop_now(w->loop);
    renew(c, now); /* attempts running during a drain too */
    if (atomic_load_explicit(&w->px->draining, memory_order_relaxed)) {
        courier_arm(c, COURIER_POLL_MS); /* no new claims while draining */
        return;
    }
    worker_refresh(w);
    /* the routes of the current snapshot, which they are claimed under from now on */
    for (size_t i = 0; w->rt && i < w->rt->cfg->n_routes; i++) {
        const struct cfg_route *rt = &w->rt->cfg->routes[i];
        if (rt->delivery.mode != CFG_DELIVERY_DURABLE)
            continue;
        struct croute *cr = croute_of(c, rt->name);
        if (cr && cr->rt != w->rt) {
            rt_unref(cr->rt);
            cr->rt = rt_ref(w->rt);
        }
    }
    for (struct croute *cr = c->routes; cr; cr = cr->next) {
        const struct cfg_route *rt = route_in(cr->rt, cr->name);
        if (rt)
            claim(c, cr, rt, now);
    }
    if (c->ticks++ % ORPHAN_TICKS == 0 && !c->sweeping)
        sweep(c);
    courier_arm(c, COURIER_POLL_MS);
}

static void on_kick(struct loop_watch *lw, uint32_t events)
{
    (void)events;
    struct courier *c = lw->arg;
    uint64_t v;
    if (read(c->kick_fd, &v, sizeof(v)) < 0) {
        /* EAGAIN: another read took it */
    }
    if (!c->stopped)
        courier_arm(c, 0);
}

void courier_kick(void *arg)
{
    struct courier *c = arg;
    uint64_t one = 1;
    if (write(c->kick_fd, &one, sizeof(one)) < 0) {
        /* a full counter already means "look" */
    }
}

struct courier *courier_new(struct worker *w)
{
    struct courier *c = calloc(1, sizeof(*c));
    if (!c)
        goto fail;
    c->w = w;
    c->store = w->px->store;
    c->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    courier_owner(c);
    struct store_stats st;
    store_stats(c->store, &st);
    c->lease_ms = st.lease_ms;
    if (c->kick_fd < 0 ||
        loop_watch_add(w->loop, &c->kick_watch, c->kick_fd, EPOLLIN, on_kick, c) < 0)
        goto fail;
    c->tick.fn = on_tick;
    loop_timer_start(w->loop, &c->tick, loop_now(w->loop), on_tick, c);
    return c;
fail:
    fprintf(stderr, "retryproxy: cannot start the courier of durable deliveries\n");
    if (c && c->kick_fd >= 0)
        close(c->kick_fd);
    free(c);
    return NULL;
}

void courier_stop(struct courier *c)
{
    if (!c)
        return;
    /* claims under way complete first (their completions run here, the worker's thread gone):
     * what they took is given back at once (on_claimed(), stopped) */
    c->stopped = true;
    loop_timer_stop(c->w->loop, &c->tick);
    for (struct croute *cr = c->routes; cr; cr = cr->next)
        if (cr->claiming)
            store_call_wait(&cr->claim, STOP_WAIT_MS);
    if (c->sweeping)
        store_call_wait(&c->orphans, STOP_WAIT_MS);
    /* an answer already in whose end had not run yet: written as any end. Attempts still
     * running at the end of the drain: they end without an outcome, and their leases are given
     * back (due now, no attempt recorded) so that another proxy takes them at once rather than
     * after the lease. store_close() finishes those writes. */
    for (struct dlv *d = c->live, *next; d; d = next) {
        next = d->next;
        if (!d->writing && d->answered && loop_timer_armed(&d->end_timer)) {
            loop_timer_stop(c->w->loop, &d->end_timer);
            dlv_on_end(&d->end_timer);
            continue;
        }
        if (d->f && !d->f->answered) {
            struct front *f = d->f;
            retry_req_client_gone(f->req);
        }
        if (d->f) {
            struct front *f = d->f;
            d->f = NULL;
            ((struct cfront *)(void *)f)->d = NULL;
            retry_req_completed(f->req);
        }
        if (!d->writing)
            dlv_release(d);
    }
}

void courier_free(struct courier *c)
{
    if (!c)
        return;
    while (c->live)
        dlv_free(c->live);
    store_call_clear(&c->orphans);
    store_call_clear(&c->renew);
    free(c->renew_ids);
    free(c->renew_ptrs);
    free(c->names);
    for (struct croute *cr = c->routes, *next; cr; cr = next) {
        next = cr->next;
        store_call_clear(&cr->claim);
        rt_unref(cr->rt);
        free(cr->name);
        free(cr->up_in_flight);
        free(cr);
    }
    loop_watch_del(c->w->loop, &c->kick_watch);
    close(c->kick_fd);
    free(c);
}
