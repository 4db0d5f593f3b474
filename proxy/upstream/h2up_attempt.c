/* h2up_attempt -- an attempt as a stream of the worker's HTTP/2 sessions (proxy/upstream/h2up.h),
 * h2c or h2 over TLS: the request's fields in HTTP/2's terms, and the stream's ends in the
 * attempt's (proxy/upstream/attempt.h's transport; docs/http2.md).
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proxy/upstream/attempt_int.h"
#include "proxy/http/fields.h"
#include "proxy/upstream/h2up.h"
#include "proxy/http/headers.h"
#include "proxy/upstream/origin.h"

/* Its state, in the attempt (attempt_priv 't'). */
struct h2x {
    struct h2up_stream *s;
};
_Static_assert(sizeof(struct h2x) <= ATTEMPT_TX_BYTES, "ATTEMPT_TX_BYTES holds struct h2x");

static struct h2x *h2x(struct attempt *a)
{
    return (struct h2x *)(void *)attempt_priv(a)->t;
}

/* The session has checked the rest of the head (HTTP/2's rules, one content-length); the
 * status is checked here as an HTTP/1.1 one is (RFC 9110 15: 100 to 599). */
static bool h2_head(void *arg, int status)
{
    struct attempt *a = arg;
    if (status < 100 || status > 599) {
        a->bad_head = true;
        return false;
    }
    a->status = status;
    a->ops->head(a);
    return true;
}

static size_t h2_body(void *arg, const char *p, size_t n)
{
    struct attempt *a = arg;
    return a->ops->body(a, p, n); /* ATTEMPT_PAUSE is H2UP_PAUSE */
}

static size_t h2_upload(void *arg, char *buf, size_t max)
{
    struct attempt *a = arg;
    return a->ops->upload(a, buf, max);
}

/* A stream that never went out reached no upstream: not sent, a connect failure. One the
 * upstream refused (REFUSED_STREAM, a GOAWAY below it) reached no application: a reset that
 * may go again whatever the method (docs/http2.md). A reset, a lost connection or a response
 * without a good head is broken, never complete. */
static void h2_done(void *arg, enum h2up_end end, uint32_t error)
{
    (void)error;
    struct attempt *a = arg;
    a->sent = !(end == H2UP_UNSENT || end == H2UP_FALLBACK);
    a->unprocessed = end == H2UP_REFUSED;
    h2x(a)->s = NULL;
    attempt_running_as(a, NULL);
    attempt_release_slot(a);
    if (end == H2UP_FALLBACK) {
        /* the server chose http/1.1 by ALPN: the same attempt, through libcurl */
        bool (*fallback)(struct attempt *) = attempt_priv(a)->fallback_h1;
        if (fallback && fallback(a))
            return;
        end = H2UP_UNSENT;
    }
    a->ops->done(a, end == H2UP_COMPLETE  ? ATTEMPT_COMPLETE
                    : end == H2UP_STOPPED ? ATTEMPT_REFUSED
                                          : ATTEMPT_BROKEN);
}

static const struct h2up_ops h2_ops = {
    .head = h2_head, .body = h2_body, .upload = h2_upload, .done = h2_done
};

static void h2_cancel(struct attempt *a)
{
    h2up_cancel(h2x(a)->s);
    h2x(a)->s = NULL;
    attempt_release_slot(a);
}

static void h2_resume_body(struct attempt *a)
{
    h2up_resume_body(h2x(a)->s);
}

static void h2_resume_upload(struct attempt *a)
{
    h2up_resume_upload(h2x(a)->s);
}

static const struct attempt_transport h2_transport = { .cancel = h2_cancel,
                                                       .resume_body = h2_resume_body,
                                                       .resume_upload = h2_resume_upload };

/* Where attempt_h2_fields() writes. */
struct h2conv {
    struct h2up_field *f;
    size_t n, max;
    char *names;
    const char **host;
    size_t *host_len;
};

static void h2_field(struct h2conv *c, const char *k, size_t kl, const char *v, size_t vl,
                     bool per_request)
{
    v = hdr_trim(v, &vl);
    if (c->n == c->max)
        return;
    /* an empty value is a field all the same (RFC 9110 5.5): it goes, as over HTTP/1.1 */
    if (HDR_NAME_IS(k, kl, "Host") && vl) {
        *c->host = v;
        *c->host_len = vl;
    }
    /* HTTP/2 forbids what a connection carries in HTTP/1.1 (proxy/http/fields.h); Host becomes
     * :authority */
    if (HDR_NAME_IS(k, kl, "Host") || fields_h2_connection_specific(k, kl, v, vl))
        return;
    hdr_lower(c->names, k, kl);
    c->f[c->n++] =
        (struct h2up_field){ c->names, v, kl, vl, per_request || hdr_per_request(k, kl) };
    c->names += kl;
}

size_t attempt_h2_fields(const struct hfield *own, size_t n_own, const struct hlist *l,
                         struct h2up_field *f, size_t max, char *names, const char **host,
                         size_t *host_len)
{
    struct h2conv c = { f, 0, max, names, host, host_len };
    for (size_t i = 0; i < n_own; i++)
        h2_field(&c, own[i].name, own[i].name_len, own[i].value, own[i].value_len,
                 own[i].per_request);
    size_t pos = 0;
    struct hfield lf;
    while (l && hlist_next_n(l, &pos, &lf))
        h2_field(&c, lf.name, lf.name_len, lf.value, lf.value_len, false);
    return c.n;
}

int h2up_attempt_launch(struct attempt *a, struct h2up *h, const struct origin *o,
                        const char *target, const struct attempt_req *req,
                        uint64_t connect_timeout_ms)
{
    /* room for every field and a content-length, and every name (the list's bytes hold them) */
    size_t count = req->n_own + req->fields->count + 1, bytes = req->fields->len;
    for (size_t i = 0; i < req->n_own; i++)
        bytes += req->own[i].name_len;
    /* on the stack when it fits, as a request's fields nearly always do */
    union {
        struct h2up_field f[32];
        char bytes[2048];
    } local;
    size_t need = count * sizeof(struct h2up_field) + bytes + 1;
    char *buf = need <= sizeof(local) ? local.bytes : malloc(need);
    if (!h || !buf) {
        if (buf != local.bytes)
            free(buf);
        return -1;
    }
    struct h2up_field *f = (struct h2up_field *)(void *)buf;
    const char *host = NULL;
    size_t host_len = 0;
    size_t n = attempt_h2_fields(req->own, req->n_own, req->fields, f, count - 1,
                                 buf + count * sizeof(*f), &host, &host_len);
    /* the body's length, which curl would have sent as Content-Length */
    char cl[24];
    int64_t len = req->body == ATTEMPT_BODY_BUFFER   ? (int64_t)req->body_len
                  : req->body == ATTEMPT_BODY_STREAM ? req->content_length
                                                     : -1;
    if (len >= 0)
        f[n++] = (struct h2up_field){ "content-length", cl, 14,
                                      (size_t)(hdr_utoa((uint64_t)len, cl) - cl), false };
    char *authority = host ? strndup(host, host_len) : NULL;
    struct h2up_req r = { .method = req->method,
                          .path = target,
                          .authority = authority ? authority : o->authority,
                          .fields = f,
                          .n_fields = n,
                          .has_body = req->body == ATTEMPT_BODY_STREAM,
                          .buf = req->body == ATTEMPT_BODY_BUFFER ? req->body_buf : NULL,
                          .len = req->body_len,
                          .trailers = req->trailers };
    if (r.buf == NULL && req->body == ATTEMPT_BODY_BUFFER)
        r.buf = "";
    struct h2x *x = h2x(a);
    x->s = h2up_start(h, o, &r, connect_timeout_ms, &h2_ops, a, &a->head, &a->trailers);
    free(authority);
    if (buf != local.bytes)
        free(buf);
    if (!x->s)
        return -1;
    attempt_running_as(a, &h2_transport);
    attempt_take_slot(a);
    return 0;
}
