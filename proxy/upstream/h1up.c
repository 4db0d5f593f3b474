/* h1up -- an attempt over HTTP/1.1 through libcurl (proxy/upstream/attempt.h's transport;
 * proxy/upstream/curlm.c is the multi-socket engine under it, h1up_url.c the URLs): the easy
 * handle's setup, its callbacks (the response head through proxy/upstream/h1resp.h, body bytes, the
 * upload pulled from the owner, request trailers), and the guard against libcurl sending a request
 * again by itself. With curlm.c and h1up_url.c, the only files that call libcurl.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "proxy/upstream/attempt_int.h"
#include "proxy/upstream/h1resp.h"
#include "proxy/http/headers.h"

/* Its state, in the attempt (attempt_priv 't'). */
struct h1up {
    struct h1resp resp;               /* the response head's parser */
    void *fields;                     /* the request's fields as libcurl takes them (fields()) */
    const struct hlist *req_trailers; /* attempt_req.trailers, for a chunked upload */
    const char *up_buf;               /* a buffered body going chunked: what is left of it */
    size_t up_len;
    unsigned sends; /* times curl was about to send this attempt's request */
    bool upload_paused, body_paused;
    bool upload_end; /* the upload's read callback said its end (none: no callback) */
};
_Static_assert(sizeof(struct h1up) <= ATTEMPT_TX_BYTES, "ATTEMPT_TX_BYTES holds struct h1up");

static struct h1up *h1(struct attempt *a)
{
    return (struct h1up *)(void *)attempt_priv(a)->t;
}

/* A line of the response head, or after the body a trailer field. A head that cannot be
 * relayed as received aborts the transfer: the attempt ends broken, as a reset would (RFC 9112
 * 6.3: a proxy answers such a response with 502). */
static size_t on_header(char *b, size_t size, size_t n, void *ud)
{
    struct attempt *a = ud;
    struct h1up *s = h1(a);
    size_t len = size * n;
    enum h1resp_step st = h1resp_line(&s->resp, &a->head, &a->trailers, b, len);
    a->status = s->resp.status;
    if (st == H1RESP_ABORT) {
        a->bad_head = s->resp.bad;
        return 0;
    }
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
    return or_pause(a->ops->body(a, p, size * n), &h1(a)->body_paused, CURL_WRITEFUNC_PAUSE);
}

static size_t on_read(char *buf, size_t size, size_t n, void *ud)
{
    struct attempt *a = ud;
    size_t got = a->ops->upload(a, buf, size * n);
    h1(a)->upload_end = got == 0;
    return or_pause(got, &h1(a)->upload_paused, CURL_READFUNC_PAUSE);
}

/* A buffered body that goes chunked, with its trailers. */
static size_t on_read_buffer(char *buf, size_t size, size_t n, void *ud)
{
    struct h1up *s = h1(ud);
    size_t got = s->up_len < size * n ? s->up_len : size * n;
    s->upload_end = got == 0;
    if (!got)
        return 0; /* the end (an empty body may have no buffer at all) */
    memcpy(buf, s->up_buf, got);
    s->up_buf += got;
    s->up_len -= got;
    return got;
}

/* The request's trailers, after the last chunk (libcurl frees the list). */
static int on_trailers(struct curl_slist **list, void *ud)
{
    struct h1up *s = h1(ud);
    size_t pos = 0;
    const char *n, *v;
    while (s->req_trailers && hlist_next(s->req_trailers, &pos, &n, &v)) {
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
    return ++h1(ud)->sends > 1 ? CURL_PREREQFUNC_ABORT : CURL_PREREQFUNC_OK;
}

/* The transfer is over: its list is read no more. */
static void drop_fields(struct h1up *s)
{
    free(s->fields);
    s->fields = NULL;
}

static void on_done(struct curlm_xfer *x, CURLcode rc)
{
    struct attempt *a = x->arg;
    struct h1up *s = h1(a);
    s->upload_paused = s->body_paused = false;
    drop_fields(s);
    a->sent = s->sends > 0;
    attempt_running_as(a, NULL);
    a->ops->done(a, rc == CURLE_OK            ? ATTEMPT_COMPLETE
                    : rc == CURLE_WRITE_ERROR ? ATTEMPT_REFUSED
                                              : ATTEMPT_BROKEN);
}

/* libcurl's own additions that a proxy must not make (docs/forwarding.md: no field is added)
 * are removed: Accept: *\/\* where the request has none, and for a request that has a body, an
 * empty one included (Content-Length: 0 is given to curl as an empty buffer), Expect:
 * 100-continue for a large upload and a form Content-Type. A request without a body gets
 * neither from libcurl, and is spared two entries it would scan. */
struct curl_slist *h1up_fields(const char *host_field, const struct attempt_req *req, void **block)
{
    const struct hlist *l = req->fields;
    size_t max = l->count + req->n_own + 4, cap = l->len + l->count + 32;
    for (size_t i = 0; i < req->n_own; i++)
        cap += req->own[i].name_len + req->own[i].value_len + 3;
    struct curl_slist *nodes = *block = malloc(max * sizeof(*nodes) + cap);
    if (!nodes)
        return NULL;
    char *o = (char *)(nodes + max);
    size_t n = 1; /* nodes[0]: Host, if it goes */
    bool host = false, accept = false, type = false;
    for (size_t i = 0; i < req->n_own; i++) {
        const struct hfield *f = &req->own[i];
        nodes[n++].data = o;
        memcpy(o, f->name, f->name_len);
        memcpy(o + f->name_len, ": ", 2);
        memcpy(o + f->name_len + 2, f->value, f->value_len);
        o += f->name_len + 2 + f->value_len;
        *o++ = '\0';
    }
    size_t pos = 0;
    struct hfield lf;
    while (hlist_next_n(l, &pos, &lf)) {
        const char *k = lf.name, *v = lf.value;
        size_t kl = lf.name_len, vl = lf.value_len;
        host |= HDR_NAME_IS(k, kl, "Host");
        accept |= HDR_NAME_IS(k, kl, "Accept");
        type |= HDR_NAME_IS(k, kl, "Content-Type");
        nodes[n++].data = o;
        memcpy(o, k, kl);
        o += kl;
        if (vl) {
            memcpy(o, ": ", 2);
            memcpy(o + 2, v, vl + 1);
            o += vl + 3;
        } else {
            memcpy(o, ";", 2);
            o += 2;
        }
    }
    static const char removals[] = "Accept:\0Expect:\0Content-Type:";
    if (!accept)
        nodes[n++].data = (char *)removals;
    if (req->body != ATTEMPT_BODY_NONE) {
        nodes[n++].data = (char *)removals + 8;
        if (!type)
            nodes[n++].data = (char *)removals + 16;
    }
    if (host)
        host_field = NULL;
    size_t first = host_field ? 0 : 1;
    nodes[0].data = (char *)host_field;
    for (size_t i = first; i + 1 < n; i++)
        nodes[i].next = &nodes[i + 1];
    nodes[n - 1].next = NULL;
    return n > first ? nodes + first : NULL;
}

static void h1_cancel(struct attempt *a)
{
    struct attempt_priv *p = attempt_priv(a);
    curlm_cancel(p->up->curl, &p->xfer);
    drop_fields(h1(a));
}

static void resume(struct attempt *a, bool *paused)
{
    struct attempt_priv *p = attempt_priv(a);
    if (*paused && p->xfer.easy) {
        *paused = false;
        curl_easy_pause(p->xfer.easy, CURLPAUSE_CONT);
    }
}

/* Whether 'done' bytes of 'total' (-1: not known) are all. */
static bool all_of(CURL *e, CURLINFO done, CURLINFO total)
{
    curl_off_t n = 0, of = -1;
    curl_easy_getinfo(e, total, &of);
    if (of < 0)
        return false;
    curl_easy_getinfo(e, done, &n);
    return n >= of;
}

/* Both ways: libcurl 7.88's curl_easy_pause() of the receiving side alone has the transfer read
 * once more at its next run (it marks the socket readable, for bytes read off it already), and
 * that read's bytes would be kept as a refused write's are. Pausing the sending side too needs
 * the request whole, else its upload would stop with the client's reading: a body given as
 * POSTFIELDS once that many bytes went, one read through a callback once the callback said its
 * end (a chunked one's last chunk, 5 bytes, may wait for the socket: it goes with the resume).
 * Not after the body's last byte: a paused transfer does not end (libcurl counts it running),
 * and its connection would wait for the client. */
static bool h1_pause_body(struct attempt *a)
{
    struct attempt_priv *p = attempt_priv(a);
    struct h1up *s = h1(a);
    CURL *e = p->xfer.easy;
    if (s->body_paused)
        return true;
    if (!e ||
        !(s->upload_end || all_of(e, CURLINFO_SIZE_UPLOAD_T, CURLINFO_CONTENT_LENGTH_UPLOAD_T)) ||
        all_of(e, CURLINFO_SIZE_DOWNLOAD_T, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T) ||
        curl_easy_pause(e, CURLPAUSE_ALL) != CURLE_OK)
        return false;
    s->body_paused = true;
    return true;
}

static void h1_resume_body(struct attempt *a)
{
    resume(a, &h1(a)->body_paused);
}

static void h1_resume_upload(struct attempt *a)
{
    resume(a, &h1(a)->upload_paused);
}

static const struct attempt_transport h1_transport = { .cancel = h1_cancel,
                                                       .pause_body = h1_pause_body,
                                                       .resume_body = h1_resume_body,
                                                       .resume_upload = h1_resume_upload };

int h1up_launch(struct attempt *a, const struct h1up_url *url, const struct curl_slist *pin,
                _Atomic int64_t *conns, const char *target, const struct attempt_req *req,
                uint64_t connect_timeout_ms)
{
    struct attempt_priv *p = attempt_priv(a);
    struct h1up *s = h1(a);
    CURL *e = curlm_easy_get(p->up->curl);
    if (!e)
        return -1;
    memset(s, 0, sizeof(*s));
    s->upload_end = req->body == ATTEMPT_BODY_NONE;
    h1up_url_easy(e, url, pin);
    curl_easy_setopt(e, CURLOPT_REQUEST_TARGET, target);
    bool head = strcmp(req->method, "HEAD") == 0;
    h1resp_start(&s->resp, NULL, head);
    if (head)
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    else if (strcmp(req->method, "GET") != 0 || req->body != ATTEMPT_BODY_NONE)
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, req->method);
    /* trailers need a chunked body (docs/forwarding.md, "Request trailers") */
    bool trailers = req->trailers && req->trailers->count > 0;
    s->req_trailers = req->trailers;
    p->xfer.spent = false;
    if (req->body == ATTEMPT_BODY_BUFFER && !trailers) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, req->body_buf ? req->body_buf : "");
    } else if (req->body != ATTEMPT_BODY_NONE) {
        bool buffer = req->body == ATTEMPT_BODY_BUFFER;
        s->up_buf = req->body_buf;
        s->up_len = buffer ? req->body_len : 0;
        curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(e, CURLOPT_READFUNCTION, buffer ? on_read_buffer : on_read);
        curl_easy_setopt(e, CURLOPT_READDATA, a);
        curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE,
                         (curl_off_t)(buffer ? -1 : req->content_length));
        /* a streamed body of unknown length may end with trailers: only chunked ones can
         * (and only they leave the handle spent, struct curlm_xfer) */
        if (buffer || req->content_length < 0) {
            curl_easy_setopt(e, CURLOPT_TRAILERFUNCTION, on_trailers);
            curl_easy_setopt(e, CURLOPT_TRAILERDATA, a);
            p->xfer.spent = true;
        }
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h1up_fields(h1up_url_host_field(url), req, &s->fields));
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, a);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, a);
    curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, on_prereq);
    curl_easy_setopt(e, CURLOPT_PREREQDATA, a);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)connect_timeout_ms);
    p->xfer.easy = e;
    p->xfer.conns = conns;
    if (curlm_start(p->up->curl, &p->xfer, on_done, a) < 0) {
        drop_fields(s);
        return -1;
    }
    attempt_running_as(a, &h1_transport);
    return 0;
}
