/* tunnel_up_attempt -- an upgrade's handshake as an attempt (proxy/upstream/attempt.h's transport)
 * on a connection of its own (proxy/upstream/tunnel_up.h; docs/upgrades.md): a 101 agreed to ends
 * it complete, its connection taken over by the owner.
 */
#include <string.h>

#include "proxy/upstream/attempt_int.h"
#include "proxy/upstream/tunnel_up.h"

/* Its state, in the attempt (attempt_priv 't'). */
struct tunx {
    struct tunnel_up *u;
};
_Static_assert(sizeof(struct tunx) <= ATTEMPT_TX_BYTES, "ATTEMPT_TX_BYTES holds struct tunx");

static struct tunx *tunx(struct attempt *a)
{
    return (struct tunx *)(void *)attempt_priv(a)->t;
}

static void tun_head(void *arg, int status)
{
    struct attempt *a = arg;
    a->status = status;
    a->ops->head(a);
}

static size_t tun_body(void *arg, const char *p, size_t n)
{
    struct attempt *a = arg;
    return a->ops->body(a, p, n); /* ATTEMPT_PAUSE is TUNNEL_UP_PAUSE */
}

/* As for an h2c stream: nothing sent is a connect failure, the rest is broken unless whole. */
static void tun_done(void *arg, enum tunnel_up_end end)
{
    struct attempt *a = arg;
    a->sent = end != TUNNEL_UP_UNSENT;
    a->bad_head = end == TUNNEL_UP_BAD_HEAD;
    tunx(a)->u = NULL;
    attempt_running_as(a, NULL);
    attempt_release_slot(a);
    a->ops->done(a, end == TUNNEL_UP_COMPLETE  ? ATTEMPT_COMPLETE
                    : end == TUNNEL_UP_STOPPED ? ATTEMPT_REFUSED
                                               : ATTEMPT_BROKEN);
}

static const struct tunnel_up_ops tun_ops = { .head = tun_head,
                                              .body = tun_body,
                                              .done = tun_done };

static void tun_cancel(struct attempt *a)
{
    tunnel_up_cancel(tunx(a)->u);
    tunx(a)->u = NULL;
    attempt_release_slot(a);
}

static void tun_resume_body(struct attempt *a)
{
    tunnel_up_resume(tunx(a)->u);
}

/* The request's body is not sent before the switch (no upload to resume). */
static void tun_resume_upload(struct attempt *a)
{
    (void)a;
}

static struct tunnel_up *tun_take(struct attempt *a)
{
    struct tunnel_up *u = tunx(a)->u;
    tunnel_up_handover(u);
    return u;
}

static const struct attempt_transport tun_transport = { .cancel = tun_cancel,
                                                        .resume_body = tun_resume_body,
                                                        .resume_upload = tun_resume_upload,
                                                        .take_tunnel = tun_take };

int tunnel_up_attempt_launch(struct attempt *a, struct connect_side *cs, const struct origin *o,
                             const char *target, const struct attempt_req *req,
                             uint64_t connect_timeout_ms)
{
    struct tunnel_up_req r = { .o = o,
                               .method = req->method,
                               .target = target,
                               .own = req->own,
                               .n_own = req->n_own,
                               .fields = req->fields,
                               .upgrade = req->upgrade,
                               .head = &a->head,
                               .no_body = strcmp(req->method, "HEAD") == 0,
                               .connect_timeout_ms = connect_timeout_ms };
    struct tunx *x = tunx(a);
    if (!(x->u = tunnel_up_start(cs, &r, &tun_ops, a)))
        return -1;
    attempt_running_as(a, &tun_transport);
    attempt_take_slot(a);
    return 0;
}
