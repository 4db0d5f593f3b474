/* The attempt's dispatcher (proxy/upstream/attempt.h): which transport carries it, the https h2 ->
 * http/1.1 fallback, and what every transport shares (the slot, an upstream's URL and its
 * endpoints as each transport reaches them). */
#include "proxy/upstream/attempt_int.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/cfg.h"
#include "proxy/dns/resolve.h"
#include "proxy/http/head.h"
#include "proxy/upstream/h2up.h"
#include "proxy/upstream/origin.h"

/* A parsed upstream origin: libcurl's URL, or an HTTP/2 origin of proxy/upstream/h2up.h (h2c,
 * or https by ALPN), or both (https offering http/1.1 too); and where an upgrade connects. */
struct attempt_url {
    struct h1up_url *h1; /* NULL: HTTP/2 only */
    struct origin *h2;   /* h2c, or https tried in HTTP/2 first (routes[].tls.http2) */
    struct origin *tun;  /* http or https: where an upgrade's tunnel connects (docs/upgrades.md) */
};

/* One endpoint of an upstream URL (docs/endpoints.md): the URL's origins at its address, and
 * libcurl's connections pinned to it by CURLOPT_CONNECT_TO, which leaves the URL's host for
 * SNI, the certificate check and Host. libcurl's connection cache compares the host connected
 * to, so each endpoint has connections of its own. */
struct attempt_target {
    struct origin *h2, *tun;
    struct curl_slist *pin;
    _Atomic int64_t *conns;
    struct dns_addr addr;
    struct share *share; /* the worker's share of slots for it (endpoint_share()) */
};

_Static_assert(sizeof(struct attempt_priv) <= ATTEMPT_STATE_BYTES,
               "ATTEMPT_STATE_BYTES holds the dispatcher's and a transport's state");

void attempt_init(struct attempt *a, struct attempt_side *up, const struct attempt_ops *ops,
                  void *arg)
{
    memset(a, 0, sizeof(*a));
    attempt_priv(a)->up = up;
    a->ops = ops;
    a->arg = arg;
}

void attempt_fini(struct attempt *a)
{
    struct attempt_priv *p = attempt_priv(a);
    slots_unwait(p->up->slots, &p->slot);
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
static struct share *endpoint_share(struct slots *sl, const char *origin, struct attempt_target *to)
{
    struct share **sh = to ? &to->share : NULL;
    if (sh && !*sh) {
        char ip[INET6_ADDRSTRLEN], *key = NULL;
        const struct dns_addr *ad = &to->addr;
        /* a space: no origin has one, so no endpoint's key is an origin's */
        if (inet_ntop(ad->family, &ad->u, ip, sizeof(ip)) &&
            asprintf(&key, "%s %s", origin, ip) >= 0) {
            *sh = slots_endpoint_share(sl, key);
            free(key);
        }
    }
    return sh && *sh ? *sh : slots_origin_share(sl, origin);
}

bool attempt_queue(struct attempt *a, const char *origin, struct attempt_target *to,
                   struct share *conn)
{
    struct attempt_priv *p = attempt_priv(a);
    slots_unwait(p->up->slots, &p->slot); /* its shares are replaced */
    struct slots *sl = p->up->slots;
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
    const struct h1up_url *url = p->h1.url;
    p->h1.url = NULL;
    p->fallback_h1 = NULL;
    if (!url || h1up_launch(a, url, p->h1.pin, p->xfer.conns,
                            attempt_target(a, p->h1.base_path, p->h1.req.target), &p->h1.req,
                            p->h1.connect_timeout_ms) < 0)
        return false;
    if (p->h1.req.body == ATTEMPT_BODY_STREAM)
        attempt_commit(a); /* as its owner did after the first launch */
    return true;
}

int attempt_launch(struct attempt *a, const struct attempt_url *url,
                   const struct attempt_target *to, const char *base_path,
                   const struct attempt_req *req, uint64_t connect_timeout_ms)
{
    struct attempt_priv *p = attempt_priv(a);
    p->h1.url = NULL;
    p->fallback_h1 = NULL;
    if (req->upgrade)
        return tunnel_up_attempt_launch(a, p->up->conn, to ? to->tun : url->tun,
                                        attempt_target(a, base_path, req->target), req,
                                        connect_timeout_ms);
    const struct origin *o = url->h2;
    if (o && to)
        o = to->h2;
    struct h2up *h = p->up->h2;
    if (o && url->h1) {
        /* https, h2 or http/1.1 as the server chooses: libcurl at once for a server known to
         * choose http/1.1, or whose name libcurl must resolve (docs/http2.md) */
        if (!o->addr_len || h2up_prefers_h1(h, o)) {
            o = NULL;
        } else {
            p->h1.url = url->h1;
            p->h1.pin = to ? to->pin : NULL;
            p->xfer.conns = to ? to->conns : NULL;
            p->h1.base_path = base_path;
            p->h1.req = *req;
            p->h1.connect_timeout_ms = connect_timeout_ms;
            p->fallback_h1 = fallback_h1;
        }
    }
    if (o)
        return h2up_attempt_launch(a, h, o, attempt_target(a, base_path, req->target), req,
                                   connect_timeout_ms);
    return h1up_launch(a, url->h1, to ? to->pin : NULL, to ? to->conns : NULL,
                       attempt_target(a, base_path, req->target), req, connect_timeout_ms);
}

/* The origin of "scheme://host:port/" (config/schema_values.c wrote it so), resolved now; 'ot' for
 * https. */
static struct origin *origin_of(const char *origin, const struct origin_tls *ot)
{
    const char *auth = strstr(origin, "://") + 3;
    char *a = strndup(auth, strcspn(auth, "/"));
    struct origin *o = a ? origin_new(a, origin[4] == 's' ? ot : NULL) : NULL;
    free(a);
    return o;
}

struct attempt_url *attempt_url_new(const char *origin, const char *host, const struct cfg_tls *tls,
                                    bool tunnels)
{
    struct attempt_url *url = calloc(1, sizeof(*url));
    if (!url)
        return NULL;
    if (strncmp(origin, "h2c://", 6) == 0 ||
        (strncmp(origin, "https://", 8) == 0 && tls->http2 != CFG_HTTP2_OFF)) {
        struct origin_tls ot = { tls->ca_file, tls->cert_file, tls->key_file, tls->server_name,
                                 tls->http2 == CFG_HTTP2_AUTO };
        if (!(url->h2 = origin_of(origin, &ot)))
            goto fail;
        if (!url->h2->tls || !url->h2->h1_too)
            return url; /* HTTP/2 only */
    }
    if (tunnels && strncmp(origin, "h2c://", 6) != 0) {
        /* resolved now, as h2's origins are: a worker never looks a name up (a route whose
         * upgrades is [] resolves nothing here) */
        struct origin_tls ot = { tls->ca_file, tls->cert_file, tls->key_file, tls->server_name,
                                 true };
        /* an https origin offering http/1.1 too is the same one h2 has: resolved once */
        url->tun = url->h2 ? url->h2 : origin_of(origin, &ot);
        if (!url->tun)
            goto fail;
    }
    if (!(url->h1 = h1up_url_new(origin, host, tls)))
        goto fail;
    return url;
fail:
    attempt_url_free(url);
    return NULL;
}

/* A URL's or a target's HTTP/2 and upgrade origins, which may be one. */
static void origins_free(struct origin *h2, struct origin *tun)
{
    if (tun != h2)
        origin_free(tun);
    origin_free(h2);
}

void attempt_url_free(struct attempt_url *url)
{
    if (!url)
        return;
    h1up_url_free(url->h1);
    origins_free(url->h2, url->tun);
    free(url);
}

struct attempt_target *attempt_target_new(const struct attempt_url *url,
                                          const struct dns_addr *addr, _Atomic int64_t *conns)
{
    struct attempt_target *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->conns = conns;
    t->addr = *addr;
    if ((url->h2 && !(t->h2 = origin_at(url->h2, addr, conns))) ||
        (url->tun && !(t->tun = url->tun == url->h2 ? t->h2 : origin_at(url->tun, addr, conns))) ||
        (url->h1 && h1up_url_pin(url->h1, addr, &t->pin) < 0)) {
        attempt_target_free(t);
        return NULL;
    }
    return t;
}

void attempt_target_free(struct attempt_target *t)
{
    if (!t)
        return;
    slots_share_let_go(t->share);
    origins_free(t->h2, t->tun);
    h1up_pin_free(t->pin);
    free(t);
}

void attempt_target_leave(struct attempt_side *up, const struct attempt_target *t)
{
    if (t->h2)
        h2up_leave(up->h2, t->h2);
    curlm_leave(up->curl, t->conns);
}

bool attempt_running(const struct attempt *a)
{
    return ((const struct attempt_priv *)(const void *)a->state)->tx != NULL;
}

bool attempt_cancel(struct attempt *a)
{
    struct attempt_priv *p = attempt_priv(a);
    slots_unwait(p->up->slots, &p->slot);
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
