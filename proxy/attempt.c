#include "proxy/attempt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "proxy/h1resp.h"
#include "proxy/head.h"
#include "proxy/headers.h"
#include "proxy/origin.h"

void attempt_init(struct attempt *a, struct upstream *up, const struct attempt_ops *ops, void *arg)
{
    memset(a, 0, sizeof(*a));
    a->up = up;
    a->ops = ops;
    a->arg = arg;
}

void attempt_fini(struct attempt *a)
{
    upstream_unwait(a->up, &a->slot);
    free(a->target_buf);
    a->target_buf = NULL;
    hlist_free(&a->head);
    hlist_free(&a->trailers);
}

static void on_slot(struct upstream_wait *wt)
{
    struct attempt *a = (struct attempt *)(void *)((char *)wt - offsetof(struct attempt, slot));
    a->ops->go(a);
}

bool attempt_queue(struct attempt *a, const char *origin, struct share *conn)
{
    upstream_unwait(a->up, &a->slot); /* its shares are replaced */
    a->slot.share[0] = a->xfer.share[0] = upstream_origin_share(a->up, origin);
    a->slot.share[1] = a->xfer.share[1] = conn;
    a->sends = 0;
    a->unprocessed = false;
    a->status = 0;
    a->bad_head = false;
    a->upload_paused = a->body_paused = false;
    hlist_clear(&a->head);
    hlist_clear(&a->trailers);
    if (!upstream_full(a->up, a->slot.share))
        return false;
    upstream_wait(a->up, &a->slot, on_slot);
    return true;
}

/* A response head that cannot be relayed as received: the transfer is aborted and the attempt
 * ends broken, as a reset would (RFC 9112 6.3: a proxy answers such a response with 502). */
static size_t bad_head(struct attempt *a)
{
    a->bad_head = true;
    return 0;
}

/* A response status from any upstream, HTTP/1.1 or HTTP/2 (RFC 9110 15): 100 to 599. */
static bool status_ok(int status)
{
    return status >= 100 && status <= 599;
}

/* A line of the response head, or after the body a trailer field, through proxy/h1resp.h. */
static size_t on_header(char *b, size_t size, size_t n, void *ud)
{
    struct attempt *a = ud;
    size_t len = size * n;
    enum h1resp_step st = h1resp_line(&a->resp, &a->head, &a->trailers, b, len);
    a->status = a->resp.status;
    if (st == H1RESP_ABORT)
        return a->resp.bad ? bad_head(a) : 0;
    if (st == H1RESP_HEAD)
        a->ops->head(a);
    return len;
}

/* What the owner's callback returned, in curl's terms: ATTEMPT_PAUSE pauses that direction
 * (curl offers the same bytes again once resumed). */
static size_t or_pause(size_t n, bool *paused, size_t curl_pause)
{
    if (n != ATTEMPT_PAUSE)
        return n;
    *paused = true;
    return curl_pause;
}

static size_t on_write(char *p, size_t size, size_t n, void *ud)
{
    struct attempt *a = ud;
    return or_pause(a->ops->body(a, p, size * n), &a->body_paused, CURL_WRITEFUNC_PAUSE);
}

static size_t on_read(char *buf, size_t size, size_t n, void *ud)
{
    struct attempt *a = ud;
    return or_pause(a->ops->upload(a, buf, size * n), &a->upload_paused, CURL_READFUNC_PAUSE);
}

/* A buffered body that goes chunked, with its trailers. */
static size_t on_read_buffer(char *buf, size_t size, size_t n, void *ud)
{
    struct attempt *a = ud;
    size_t got = a->up_len < size * n ? a->up_len : size * n;
    if (!got)
        return 0; /* the end (an empty body may have no buffer at all) */
    memcpy(buf, a->up_buf, got);
    a->up_buf += got;
    a->up_len -= got;
    return got;
}

/* The request's trailers, after the last chunk (libcurl frees the list). */
static int on_trailers(struct curl_slist **list, void *ud)
{
    struct attempt *a = ud;
    size_t pos = 0;
    const char *n, *v;
    while (a->req_trailers && hlist_next(a->req_trailers, &pos, &n, &v)) {
        size_t cap = strlen(n) + strlen(v) + 3;
        char *line = malloc(cap);
        struct curl_slist *l = NULL;
        if (line) {
            snprintf(line, cap, "%s: %s", n, v);
            l = curl_slist_append(*list, line);
            free(line);
        }
        if (!l)
            return CURL_TRAILERFUNC_ABORT;
        *list = l;
    }
    return CURL_TRAILERFUNC_OK;
}

/* A second call means curl is about to send the same request again on a new connection by
 * itself (its reaction to a kept-alive connection found dead). The first send may have reached
 * the upstream: abort, and let the retry policy decide as for any reset. */
static int on_prereq(void *ud, char *ip, char *local_ip, int port, int local_port)
{
    (void)ip;
    (void)local_ip;
    (void)port;
    (void)local_port;
    struct attempt *a = ud;
    return ++a->sends > 1 ? CURL_PREREQFUNC_ABORT : CURL_PREREQFUNC_OK;
}

static void on_done(struct upstream_xfer *x, CURLcode rc)
{
    struct attempt *a = x->arg;
    a->upload_paused = a->body_paused = false;
    a->ops->done(a, rc == CURLE_OK            ? ATTEMPT_COMPLETE
                    : rc == CURLE_WRITE_ERROR ? ATTEMPT_REFUSED
                                              : ATTEMPT_BROKEN);
}

/* head_upstream_target(), kept in the attempt until it is launched again or ends. */
static const char *upstream_target(struct attempt *a, const char *base_path, const char *target)
{
    free(a->target_buf);
    return head_upstream_target(base_path, target, &a->target_buf);
}

static int launch_h2(struct attempt *a, const struct origin *o, const char *target,
                     const struct attempt_req *req, uint64_t connect_timeout_ms);

/* 'fields', led by the Host the upstream's URL no longer gives libcurl (tls.server_name) unless
 * they hold one (preserve_host). The node is the attempt's: the list is the request's. */
static struct curl_slist *with_host(struct attempt *a, const struct upstream_url *url,
                                    struct curl_slist *fields)
{
    const char *host = upstream_url_host_field(url);
    if (!host)
        return fields;
    for (const struct curl_slist *f = fields; f; f = f->next)
        if (strncasecmp(f->data, "Host:", 5) == 0)
            return fields;
    a->host_field = (struct curl_slist){ .data = (char *)host, .next = fields };
    return &a->host_field;
}

/* The request through libcurl (HTTP/1.1). */
static int launch_h1(struct attempt *a, const struct upstream_url *url, const char *base_path,
                     const struct attempt_req *req, uint64_t connect_timeout_ms)
{
    CURL *e = upstream_easy_get(a->up);
    if (!e)
        return -1;
    upstream_easy_url(e, url);
    curl_easy_setopt(e, CURLOPT_REQUEST_TARGET, upstream_target(a, base_path, req->target));
    bool head = strcmp(req->method, "HEAD") == 0;
    h1resp_start(&a->resp, NULL, head);
    if (head)
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    else if (strcmp(req->method, "GET") != 0 || req->body != ATTEMPT_BODY_NONE)
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, req->method);
    /* trailers need a chunked body (docs/forwarding.md, "Request trailers") */
    bool trailers = req->trailers && req->trailers->count > 0;
    a->req_trailers = req->trailers;
    a->xfer.spent = false;
    if (req->body == ATTEMPT_BODY_BUFFER && !trailers) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, req->body_buf ? req->body_buf : "");
    } else if (req->body != ATTEMPT_BODY_NONE) {
        bool buffer = req->body == ATTEMPT_BODY_BUFFER;
        a->up_buf = req->body_buf;
        a->up_len = buffer ? req->body_len : 0;
        curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(e, CURLOPT_READFUNCTION, buffer ? on_read_buffer : on_read);
        curl_easy_setopt(e, CURLOPT_READDATA, a);
        curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE,
                         (curl_off_t)(buffer ? -1 : req->content_length));
        /* a streamed body of unknown length may end with trailers: only chunked ones can
         * (and only they leave the handle spent, struct upstream_xfer) */
        if (buffer || req->content_length < 0) {
            curl_easy_setopt(e, CURLOPT_TRAILERFUNCTION, on_trailers);
            curl_easy_setopt(e, CURLOPT_TRAILERDATA, a);
            a->xfer.spent = true;
        }
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, with_host(a, url, req->headers));
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, a);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, a);
    curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, on_prereq);
    curl_easy_setopt(e, CURLOPT_PREREQDATA, a);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)connect_timeout_ms);
    a->xfer.easy = e;
    return upstream_start(a->up, &a->xfer, on_done, a);
}

static int launch_tun(struct attempt *a, const struct upstream_url *url, const char *target,
                      const struct attempt_req *req, uint64_t connect_timeout_ms);

int attempt_launch(struct attempt *a, const struct upstream_url *url, const char *base_path,
                   const struct attempt_req *req, uint64_t connect_timeout_ms)
{
    a->h1.url = NULL;
    if (req->upgrade)
        return launch_tun(a, url, upstream_target(a, base_path, req->target), req,
                          connect_timeout_ms);
    const struct origin *o = upstream_url_h2(url);
    if (o && upstream_url_h1(url)) {
        /* https, h2 or http/1.1 as the server chooses: libcurl at once for a server known to
         * choose http/1.1, or whose name libcurl must resolve (docs/http2.md) */
        struct h2up *h = upstream_h2(a->up);
        if (!o->addr_len || !h || h2up_prefers_h1(h, o)) {
            o = NULL;
        } else {
            a->h1.url = url;
            a->h1.base_path = base_path;
            a->h1.req = *req;
            a->h1.connect_timeout_ms = connect_timeout_ms;
        }
    }
    if (o)
        return launch_h2(a, o, upstream_target(a, base_path, req->target), req, connect_timeout_ms);
    return launch_h1(a, url, base_path, req, connect_timeout_ms);
}

bool attempt_cancel(struct attempt *a)
{
    upstream_unwait(a->up, &a->slot);
    if (a->tun) {
        tunnel_up_cancel(a->tun);
        a->tun = NULL;
        upstream_release_slot(a->up, &a->xfer);
        return true;
    }
    if (a->h2) {
        h2up_cancel(a->h2);
        a->h2 = NULL;
        upstream_release_slot(a->up, &a->xfer);
        return true;
    }
    if (!a->xfer.easy)
        return false;
    upstream_cancel(a->up, &a->xfer);
    return true;
}

static void resume(struct attempt *a, bool *paused)
{
    if (*paused && a->xfer.easy) {
        *paused = false;
        curl_easy_pause(a->xfer.easy, CURLPAUSE_CONT);
    }
}

void attempt_commit(struct attempt *a)
{
    upstream_release_slot(a->up, &a->xfer);
}

void attempt_resume_body(struct attempt *a)
{
    if (a->h2)
        h2up_resume_body(a->h2);
    else if (a->tun)
        tunnel_up_resume(a->tun);
    else
        resume(a, &a->body_paused);
}

void attempt_resume_upload(struct attempt *a)
{
    if (a->h2)
        h2up_resume_upload(a->h2);
    else
        resume(a, &a->upload_paused);
}

/* ---- h2c upstreams (proxy/h2up.h) ---- */

/* The session has checked the rest of the head (HTTP/2's rules, one content-length). */
static bool h2_head(void *arg, int status)
{
    struct attempt *a = arg;
    if (!status_ok(status))
        return bad_head(a);
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
    a->sends = end == H2UP_UNSENT || end == H2UP_FALLBACK ? 0 : 1;
    a->unprocessed = end == H2UP_REFUSED;
    a->h2 = NULL;
    upstream_release_slot(a->up, &a->xfer);
    if (end == H2UP_FALLBACK) {
        /* the server chose http/1.1 by ALPN: the same attempt, through libcurl */
        const struct upstream_url *url = a->h1.url;
        a->h1.url = NULL;
        if (url && launch_h1(a, url, a->h1.base_path, &a->h1.req, a->h1.connect_timeout_ms) == 0) {
            if (a->h1.req.body == ATTEMPT_BODY_STREAM)
                attempt_commit(a); /* as its owner did after the first launch */
            return;
        }
        end = H2UP_UNSENT;
    }
    a->ops->done(a, end == H2UP_COMPLETE  ? ATTEMPT_COMPLETE
                    : end == H2UP_STOPPED ? ATTEMPT_REFUSED
                                          : ATTEMPT_BROKEN);
}

static const struct h2up_ops h2_ops = {
    .head = h2_head, .body = h2_body, .upload = h2_upload, .done = h2_done
};

/* Fields a connection carries in HTTP/1.1 and HTTP/2 forbids (RFC 9113 8.2.2); Host becomes
 * :authority. */
static bool connection_specific(const char *k, size_t kl)
{
    return HDR_NAME_IS(k, kl, "Connection") || HDR_NAME_IS(k, kl, "Keep-Alive") ||
           HDR_NAME_IS(k, kl, "Proxy-Connection") || HDR_NAME_IS(k, kl, "Transfer-Encoding") ||
           HDR_NAME_IS(k, kl, "Upgrade") || HDR_NAME_IS(k, kl, "Host");
}

size_t attempt_h2_fields(const struct curl_slist *l, struct h2up_field *f, size_t max, char *names,
                         const char **host, size_t *host_len)
{
    size_t n = 0;
    for (; l && n < max; l = l->next) {
        const char *d = l->data, *colon = strchr(d, ':');
        if (!colon)
            continue;
        size_t kl = (size_t)(colon - d), vl = strlen(colon + 1);
        const char *v = hdr_trim(colon + 1, &vl);
        if (!vl)
            continue;
        if (HDR_NAME_IS(d, kl, "Host")) {
            *host = v;
            *host_len = vl;
        }
        if (connection_specific(d, kl) ||
            (HDR_NAME_IS(d, kl, "TE") && !(vl == 8 && strncasecmp(v, "trailers", 8) == 0)))
            continue;
        hdr_lower(names, d, kl);
        f[n++] = (struct h2up_field){ names, v, kl, vl };
        names += kl;
    }
    return n;
}

static int launch_h2(struct attempt *a, const struct origin *o, const char *target,
                     const struct attempt_req *req, uint64_t connect_timeout_ms)
{
    struct h2up *h = upstream_h2(a->up);
    size_t count = 1, bytes = 0;
    for (const struct curl_slist *l = req->headers; l; l = l->next, count++)
        bytes += strlen(l->data);
    char *buf = malloc(count * sizeof(struct h2up_field) + bytes + 1);
    if (!h || !buf) {
        free(buf);
        return -1;
    }
    struct h2up_field *f = (struct h2up_field *)(void *)buf;
    const char *host = NULL;
    size_t host_len = 0;
    size_t n =
        attempt_h2_fields(req->headers, f, count - 1, buf + count * sizeof(*f), &host, &host_len);
    /* the body's length, which curl would have sent as Content-Length */
    char cl[24];
    int64_t len = req->body == ATTEMPT_BODY_BUFFER   ? (int64_t)req->body_len
                  : req->body == ATTEMPT_BODY_STREAM ? req->content_length
                                                     : -1;
    if (len >= 0)
        f[n++] = (struct h2up_field){ "content-length", cl, 14,
                                      (size_t)(hdr_utoa((uint64_t)len, cl) - cl) };
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
    a->h2 = h2up_start(h, o, &r, connect_timeout_ms, &h2_ops, a, &a->head, &a->trailers);
    free(authority);
    free(buf);
    if (!a->h2)
        return -1;
    upstream_take_slot(a->up, &a->xfer);
    return 0;
}

/* ---- an upgrade's handshake (proxy/tunnel_up.h) ---- */

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
    a->sends = end == TUNNEL_UP_UNSENT ? 0 : 1;
    a->bad_head = end == TUNNEL_UP_BAD_HEAD;
    a->tun = NULL;
    upstream_release_slot(a->up, &a->xfer);
    a->ops->done(a, end == TUNNEL_UP_COMPLETE  ? ATTEMPT_COMPLETE
                    : end == TUNNEL_UP_STOPPED ? ATTEMPT_REFUSED
                                               : ATTEMPT_BROKEN);
}

static const struct tunnel_up_ops tun_ops = { .head = tun_head,
                                              .body = tun_body,
                                              .done = tun_done };

static int launch_tun(struct attempt *a, const struct upstream_url *url, const char *target,
                      const struct attempt_req *req, uint64_t connect_timeout_ms)
{
    struct h2up *h = upstream_h2(a->up);
    struct tunnel_up_req r = { .o = upstream_url_tunnel(url),
                               .method = req->method,
                               .target = target,
                               .headers = req->headers,
                               .upgrade = req->upgrade,
                               .head = &a->head,
                               .no_body = strcmp(req->method, "HEAD") == 0,
                               .connect_timeout_ms = connect_timeout_ms };
    if (!h || !(a->tun = tunnel_up_start(h2up_loop(h), h2up_tls_ctxs(h), &r, &tun_ops, a)))
        return -1;
    upstream_take_slot(a->up, &a->xfer);
    return 0;
}

struct tunnel_up *attempt_take_tunnel(struct attempt *a)
{
    struct tunnel_up *u = a->tun;
    if (u)
        tunnel_up_handover(u);
    return u;
}
