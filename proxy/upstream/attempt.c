/* The attempt's dispatcher (proxy/upstream/attempt.h): which transport carries it, the https h2 ->
 * http/1.1 fallback, and what every transport shares (the slot, the target). */
#include "proxy/upstream/attempt_int.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/dns/resolve.h"
#include "proxy/http/head.h"
#include "proxy/upstream/h2up.h"
#include "proxy/upstream/origin.h"

_Static_assert(sizeof(struct attempt_priv) <= ATTEMPT_STATE_BYTES,
               "ATTEMPT_STATE_BYTES holds the dispatcher's and a transport's state");

void attempt_init(struct attempt *a, struct upstream *up, const struct attempt_ops *ops, void *arg)
{
    memset(a, 0, sizeof(*a));
    attempt_priv(a)->up = up;
    a->ops = ops;
    a->arg = arg;
}

void attempt_fini(struct attempt *a)
{
    struct attempt_priv *p = attempt_priv(a);
    slots_unwait(upstream_slots(p->up), &p->slot);
    free(p->target_buf);
    p->target_buf = NULL;
    hlist_free(&a->head);
    hlist_free(&a->trailers);
}

static void on_slot(struct upstream_wait *wt)
{
    struct attempt_priv *p =
        (struct attempt_priv *)(void *)((char *)wt - offsetof(struct attempt_priv, slot));
    struct attempt *a = attempt_of_priv(p);
    a->ops->go(a);
}

/* The share of the worker's slots the attempts to endpoint 'to' of 'origin' count in: found once
 * per target, under the origin and the address, so that every target of the endpoint (one per
 * config snapshot) finds the same. Without a target (or out of memory), the origin's. */
static struct share *endpoint_share(struct slots *sl, const char *origin,
                                    struct upstream_target *to)
{
    struct share **sh = to ? upstream_target_share(to) : NULL;
    if (sh && !*sh) {
        char ip[INET6_ADDRSTRLEN], *key = NULL;
        const struct dns_addr *ad = upstream_target_addr(to);
        /* a space: no origin has one, so no endpoint's key is an origin's */
        if (inet_ntop(ad->family, &ad->u, ip, sizeof(ip)) &&
            asprintf(&key, "%s %s", origin, ip) >= 0) {
            *sh = slots_endpoint_share(sl, key);
            free(key);
        }
    }
    return sh && *sh ? *sh : slots_origin_share(sl, origin);
}

bool attempt_queue(struct attempt *a, const char *origin, struct upstream_target *to,
                   struct share *conn)
{
    struct attempt_priv *p = attempt_priv(a);
    slots_unwait(upstream_slots(p->up), &p->slot); /* its shares are replaced */
    struct slots *sl = upstream_slots(p->up);
    p->slot.share[0] = p->xfer.hold.share[0] = endpoint_share(sl, origin, to);
    p->slot.share[1] = p->xfer.hold.share[1] = conn;
    a->sent = false;
    a->unprocessed = false;
    a->status = 0;
    a->bad_head = false;
    hlist_clear(&a->head);
    hlist_clear(&a->trailers);
    if (!slots_full(sl, p->slot.share))
        return false;
    slots_wait(sl, &p->slot, on_slot);
    return true;
}

/* head_upstream_target(), kept in the attempt until it is launched again or ends. */
static const char *attempt_target(struct attempt *a, const char *base_path, const char *target)
{
    struct attempt_priv *p = attempt_priv(a);
    free(p->target_buf);
    return head_upstream_target(base_path, target, &p->target_buf);
}

/* An https attempt's HTTP/2 connection found its server choosing http/1.1 by ALPN
 * (attempt_priv.fallback_h1): the same attempt goes through libcurl. */
static bool fallback_h1(struct attempt *a)
{
    struct attempt_priv *p = attempt_priv(a);
    const struct upstream_url *url = p->h1.url;
    p->h1.url = NULL;
    p->fallback_h1 = NULL;
    if (!url ||
        h1up_launch(a, url, p->xfer.to, attempt_target(a, p->h1.base_path, p->h1.req.target),
                    &p->h1.req, p->h1.connect_timeout_ms) < 0)
        return false;
    if (p->h1.req.body == ATTEMPT_BODY_STREAM)
        attempt_commit(a); /* as its owner did after the first launch */
    return true;
}

int attempt_launch(struct attempt *a, const struct upstream_url *url,
                   const struct upstream_target *to, const char *base_path,
                   const struct attempt_req *req, uint64_t connect_timeout_ms)
{
    struct attempt_priv *p = attempt_priv(a);
    p->h1.url = NULL;
    p->fallback_h1 = NULL;
    if (req->upgrade)
        return tunnel_up_attempt_launch(
            a, upstream_h2(p->up), to ? upstream_target_tunnel(to) : upstream_url_tunnel(url),
            attempt_target(a, base_path, req->target), req, connect_timeout_ms);
    const struct origin *o = upstream_url_h2(url);
    if (o && to)
        o = upstream_target_h2(to);
    struct h2up *h = o ? upstream_h2(p->up) : NULL;
    if (o && upstream_url_h1(url)) {
        /* https, h2 or http/1.1 as the server chooses: libcurl at once for a server known to
         * choose http/1.1, or whose name libcurl must resolve (docs/http2.md) */
        if (!o->addr_len || !h || h2up_prefers_h1(h, o)) {
            o = NULL;
        } else {
            p->h1.url = url;
            p->xfer.to = to;
            p->h1.base_path = base_path;
            p->h1.req = *req;
            p->h1.connect_timeout_ms = connect_timeout_ms;
            p->fallback_h1 = fallback_h1;
        }
    }
    if (o)
        return h2up_attempt_launch(a, h, o, attempt_target(a, base_path, req->target), req,
                                   connect_timeout_ms);
    return h1up_launch(a, url, to, attempt_target(a, base_path, req->target), req,
                       connect_timeout_ms);
}

struct upstream_target *attempt_target_new(const struct upstream_url *url,
                                           const struct dns_addr *addr, _Atomic int64_t *conns)
{
    return upstream_target_new(url, addr, conns);
}

void attempt_target_free(struct upstream_target *t)
{
    if (t)
        slots_share_let_go(*upstream_target_share(t));
    upstream_target_free(t);
}

void attempt_target_leave(struct upstream *up, const struct upstream_target *t)
{
    upstream_target_leave(up, t);
}

bool attempt_running(const struct attempt *a)
{
    return ((const struct attempt_priv *)(const void *)a->state)->tx != NULL;
}

bool attempt_cancel(struct attempt *a)
{
    struct attempt_priv *p = attempt_priv(a);
    slots_unwait(upstream_slots(p->up), &p->slot);
    const struct attempt_transport *tx = p->tx;
    if (!tx)
        return false;
    p->tx = NULL;
    tx->cancel(a);
    return true;
}

void attempt_commit(struct attempt *a)
{
    attempt_release_slot(a);
}

bool attempt_pause_body(struct attempt *a)
{
    struct attempt_priv *p = attempt_priv(a);
    return p->tx && p->tx->pause_body && p->tx->pause_body(a);
}

void attempt_resume_body(struct attempt *a)
{
    struct attempt_priv *p = attempt_priv(a);
    if (p->tx)
        p->tx->resume_body(a);
}

void attempt_resume_upload(struct attempt *a)
{
    struct attempt_priv *p = attempt_priv(a);
    if (p->tx)
        p->tx->resume_upload(a);
}

struct tunnel_up *attempt_take_tunnel(struct attempt *a)
{
    struct attempt_priv *p = attempt_priv(a);
    return p->tx && p->tx->take_tunnel ? p->tx->take_tunnel(a) : NULL;
}
