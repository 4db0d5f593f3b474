/* h2stream -- the streams of the HTTP/2 front end (proxy/http2/h2int.h): a stream's head and body
 * become a request of the core (proxy/core/retry.h), and the core's answer becomes its response
 * (struct front_ops). docs/http2.md says what a stream carries. h2front.c and h2stream.c are one
 * state machine, a connection's and its streams' (they call each other through
 * proxy/http2/h2int.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/http/answer.h"
#include "proxy/base/dlist.h"
#include "proxy/http/fields.h"
#include "proxy/http/grpc.h"
#include "proxy/http2/h2int.h"
#include "proxy/http/headers.h"
#include "proxy/core/retry.h"

static const struct front_ops h2_ops;

static struct h2stream *of_front(struct front *f)
{
    return (struct h2stream *)f;
}

/* ---- the request ---- */

int h2s_on_begin_headers(nghttp2_session *sess, const nghttp2_frame *frame, void *user)
{
    (void)sess;
    struct h2conn *c = user;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    struct h2head *h = &c->head;
    hlist_clear(&h->fields);
    free(h->path);
    free(h->cookie);
    struct hlist keep = h->fields;
    memset(h, 0, sizeof(*h));
    h->fields = keep;
    h->id = frame->hd.stream_id;
    return 0;
}

static bool name_is(const uint8_t *n, size_t nl, const char *lit)
{
    return nl == strlen(lit) && memcmp(n, lit, nl) == 0;
}

/* A request field (names are lowercase: nghttp2 checked them). Bounded as an HTTP/1.1 head is
 * (limits.max_header_bytes, REQ_FIELDS_MAX): past the bounds the rest is not kept and the
 * request is answered 431 (or 414, 501) like one. A field of the request's trailing HEADERS
 * goes to the core as a trailer, which bounds them and leaves out the pseudo-header and
 * connection-specific ones (docs/http2.md). */
int h2s_on_header(nghttp2_session *sess, const nghttp2_frame *frame, const uint8_t *name, size_t nl,
                  const uint8_t *value, size_t vl, uint8_t flags, void *user)
{
    (void)flags;
    struct h2conn *c = user;
    struct h2head *h = &c->head;
    /* an HPACK bomb is not decoded all the way (proxy/http2/h2guard.h) */
    int rv = h2guard_field(&c->guard, nl + vl + 32, c->lim.max_header_bytes, loop_now(c->hf->loop));
    if (rv)
        return rv;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_HEADERS) {
        struct h2stream *st = nghttp2_session_get_stream_user_data(sess, frame->hd.stream_id);
        if (st && st->c && !(st->flags & S_DISCARD))
            retry_req_trailer(st->f.req, (const char *)name, nl, (const char *)value, vl);
        return 0;
    }
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST ||
        frame->hd.stream_id != h->id)
        return 0;
    if (name_is(name, nl, "content-type") && grpc_is_content_type((const char *)value, vl))
        h->grpc = true;
    h->bytes += nl + vl + 32;
    if (h->bytes > c->lim.max_header_bytes && !h->refused)
        h->refused = REFUSE_HEAD_TOO_LARGE;
    if (h->refused)
        return 0;
    const char *k = (const char *)name, *v = (const char *)value;
    if (nl && k[0] == ':') {
        if (name_is(name, nl, ":method")) {
            if (vl > REQ_METHOD_MAX)
                h->refused = REFUSE_METHOD_TOO_LONG;
            else
                memcpy(h->method, v, vl), h->method[vl] = '\0';
        } else if (name_is(name, nl, ":path")) {
            if (vl > REQ_LINE_MAX || !(h->path = strndup(v, vl)))
                h->refused = REFUSE_TARGET_TOO_LONG;
        } else if (name_is(name, nl, ":authority")) {
            /* the Host of HTTP/1.1 (RFC 9113 8.3.1) */
            h->authority = true;
            if (hlist_add(&h->fields, "host", 4, v, vl) < 0)
                h->refused = REFUSE_HEAD_TOO_LARGE;
        }
        return 0; /* pseudo-header fields never go upstream as fields */
    }
    if ((h->authority && name_is(name, nl, "host")) || name_is(name, nl, "te"))
        return 0; /* :authority wins; te is "trailers" (nghttp2 checked) and hop-by-hop */
    if (name_is(name, nl, "cookie")) {
        /* HTTP/2 clients may split a cookie into several fields; an HTTP/1.1 upstream expects
         * one (RFC 9113 8.2.3): joined here, added as the head ends */
        char *j = realloc(h->cookie, h->cookie_len + 2 + vl + 1);
        if (!j) {
            h->refused = REFUSE_HEAD_TOO_LARGE;
            return 0;
        }
        if (h->cookie_len)
            memcpy(j + h->cookie_len, "; ", 2), h->cookie_len += 2;
        memcpy(j + h->cookie_len, v, vl);
        h->cookie_len += vl;
        j[h->cookie_len] = '\0';
        h->cookie = j;
        return 0;
    }
    if (name_is(name, nl, "content-length"))
        h->length = true;
    if (++h->n > REQ_FIELDS_MAX || hlist_add(&h->fields, k, nl, v, vl) < 0)
        h->refused = REFUSE_HEAD_TOO_LARGE;
    return 0;
}

static void stream_remote_end(struct h2stream *st)
{
    st->flags |= S_REMOTE_END;
    if (!st->up_len && !(st->flags & S_ENDED)) {
        st->flags |= S_ENDED;
        retry_req_end(st->f.req);
    }
}

/* The head is complete: the stream becomes a request of the core. */
static void start_request(struct h2conn *c, const nghttp2_frame *frame)
{
    struct h2head *h = &c->head;
    struct h2front *hf = c->hf;
    bool end = frame->hd.flags & NGHTTP2_FLAG_END_STREAM;
    /* A body of no declared length: the core frames it as HTTP/1.1's chunked one (the field
     * is hop-by-hop: it never reaches the upstream as it is). */
    if (h->cookie && !h->refused &&
        hlist_add(&h->fields, "cookie", 6, h->cookie, h->cookie_len) < 0)
        h->refused = REFUSE_HEAD_TOO_LARGE;
    if (!end && !h->length && !h->refused &&
        hlist_add(&h->fields, "transfer-encoding", 17, "chunked", 7) < 0)
        h->refused = REFUSE_HEAD_TOO_LARGE;
    struct front *f = retry_req_new(hf->w, &h2_ops, sizeof(struct h2stream), FRONT_HTTP2,
                                    h->path ? h->path : "", c->peer, c->peer_port, h->refused);
    if (!f) {
        nghttp2_submit_rst_stream(c->sess, NGHTTP2_FLAG_NONE, h->id, NGHTTP2_REFUSED_STREAM);
        return;
    }
    /* the core reads it from the fields, which a refused head may not have kept */
    f->grpc = h->grpc;
    f->share = c->share;
    struct h2stream *st = of_front(f);
    st->c = c;
    st->id = h->id;
    st->fields = h->fields;
    memset(&h->fields, 0, sizeof(h->fields));
    st->down.max = H2_STREAM_BUFFER;
    DLIST_PUSH(c->streams, st);
    c->n_streams++;
    nghttp2_session_set_stream_user_data(c->sess, st->id, st);
    retry_req_head(f->req, h->method);
    if (end && st->c)
        stream_remote_end(st);
}

static void h2_fields(struct front *f,
                      void (*fn)(void *arg, const char *k, size_t kl, const char *v, size_t vl),
                      void *arg)
{
    struct h2stream *st = of_front(f);
    size_t pos = 0;
    struct hfield hf;
    while (hlist_next_n(&st->fields, &pos, &hf))
        fn(arg, hf.name, hf.name_len, hf.value, hf.value_len);
}

/* Upload bytes the core did not take are kept (at most the stream's window, which stays
 * closed by as much until they are taken). */
static bool keep_upload(struct h2stream *st, const uint8_t *p, size_t n)
{
    if (st->up_off + st->up_len + n > st->up_cap) {
        if (st->up_len) /* none kept yet: no buffer either */
            memmove(st->up, st->up + st->up_off, st->up_len);
        st->up_off = 0;
        if (st->up_len + n > st->up_cap) {
            size_t cap = st->up_len + n;
            if (cap > 2 * H2_STREAM_WINDOW)
                return false;
            char *b = realloc(st->up, cap);
            if (!b)
                return false;
            st->up = b;
            st->up_cap = cap;
        }
    }
    memcpy(st->up + st->up_off + st->up_len, p, n);
    st->up_len += n;
    return true;
}

/* Every upload byte received is given back to the connection's window once, when the core
 * takes it or when it is dropped: else a few streams ended with bytes kept would close the
 * connection's window for good. */

/* Drops the upload bytes kept (the core will never take them). */
static void drop_upload(struct h2stream *st)
{
    if (st->up_len && st->c)
        nghttp2_session_consume_connection(st->c->sess, st->up_len);
    st->up_off = st->up_len = 0;
}

/* Offers upload bytes to the core; what it takes is given back to the client's window. */
static size_t offer(struct h2stream *st, const char *p, size_t n)
{
    size_t took = retry_req_body(st->f.req, p, n);
    if (!st->c)
        return n;
    if (took == RETRY_BODY_CLOSE) {
        /* answered (413) and the client goes on: no more window for the stream, the
         * connection's given back; once the answer is out the stream is reset (NO_ERROR,
         * RFC 9113 8.1) */
        st->flags |= S_DISCARD;
        nghttp2_session_consume_connection(st->c->sess, n);
        if (st->flags & S_LOCAL_END)
            h2c_reset_stream(st, NGHTTP2_NO_ERROR);
        return n;
    }
    nghttp2_session_consume(st->c->sess, st->id, took);
    return took;
}

int h2s_on_data(nghttp2_session *sess, uint8_t flags, int32_t id, const uint8_t *data, size_t len,
                void *user)
{
    (void)user;
    struct h2stream *st = nghttp2_session_get_stream_user_data(sess, id);
    if (nghttp2_session_get_stream_local_close(sess, id) == 1 &&
        !(flags & NGHTTP2_FLAG_END_STREAM)) {
        /* the whole answer is out and the client still sends: it may stop (RFC 9113 8.1), and
         * curl 7.88 waits for this to end its upload. Sent as more comes, not with the answer,
         * which that curl would take for a failure if both came in one read. */
        nghttp2_session_consume_connection(sess, len);
        if (st && st->c)
            h2c_reset_stream(st, NGHTTP2_NO_ERROR);
        else
            nghttp2_submit_rst_stream(sess, NGHTTP2_FLAG_NONE, id, NGHTTP2_NO_ERROR);
        return 0;
    }
    if (!st || !st->c) {
        nghttp2_session_consume_connection(sess, len);
        return 0;
    }
    if (st->flags & S_DISCARD) {
        /* the stream's window stays closed; the connection's is given back, for the others */
        nghttp2_session_consume_connection(sess, len);
        return 0;
    }
    size_t took = st->up_len ? 0 : offer(st, (const char *)data, len);
    if (st->c && took < len && !(st->flags & S_DISCARD) &&
        !keep_upload(st, data + took, len - took)) {
        nghttp2_session_consume_connection(sess, len - took);
        h2c_reset_stream(st, NGHTTP2_FLOW_CONTROL_ERROR);
    }
    return 0;
}

/* The core takes upload bytes again: offers what is kept. */
/* Its kept upload is offered again from the loop (progress()), never from inside the core's
 * call that gave it room. */
static void want_drain(struct h2stream *st)
{
    st->flags |= S_ROOM;
    st->c->room = true;
    h2c_schedule(st->c);
}

void h2s_drain_upload(struct h2stream *st)
{
    st->flags &= ~S_ROOM;
    if ((st->flags & (S_LOCAL_END | S_REMOTE_END)) == S_LOCAL_END && st->up_len) {
        /* the answer is whole and the client's window is closed by bytes nobody will take:
         * it may stop sending (RFC 9113 8.1), and must be told, as it cannot send more */
        drop_upload(st);
        h2c_reset_stream(st, NGHTTP2_NO_ERROR);
        return;
    }
    while (st->c && st->up_len && !(st->flags & S_DISCARD)) {
        size_t took = offer(st, st->up + st->up_off, st->up_len);
        if (!took)
            break;
        if (took > st->up_len)
            took = st->up_len;
        st->up_off += took;
        st->up_len -= took;
    }
    if (st->flags & S_DISCARD)
        drop_upload(st);
    if (st->c && !st->up_len && (st->flags & S_REMOTE_END))
        stream_remote_end(st);
}

/* Our END_STREAM went: a stream whose upload is refused is reset, and one whose client has
 * bytes kept too, at the next turn (curl 7.88 takes a reset read together with the answer for
 * a failure). Another whose client has not ended its upload is reset as more comes
 * (h2s_on_data), or H2_TAIL_MS later (h2c_tail), whichever is first. */
void h2s_local_end(struct h2stream *st)
{
    st->flags |= S_LOCAL_END;
    if (st->flags & S_DISCARD) {
        h2c_reset_stream(st, NGHTTP2_NO_ERROR);
    } else if (st->up_len && !(st->flags & S_REMOTE_END)) {
        want_drain(st);
    } else if (!(st->flags & S_REMOTE_END)) {
        h2c_tail(st->c, st);
    }
}

int h2s_on_frame_recv(nghttp2_session *sess, const nghttp2_frame *frame, void *user)
{
    struct h2conn *c = user;
    struct h2stream *st;
    switch (frame->hd.type) {
    case NGHTTP2_HEADERS:
        if (frame->headers.cat == NGHTTP2_HCAT_REQUEST && frame->hd.stream_id == c->head.id) {
            start_request(c, frame);
            break;
        }
        /* trailers end the request as a DATA frame would */
        __attribute__((fallthrough));
    case NGHTTP2_DATA:
        st = nghttp2_session_get_stream_user_data(sess, frame->hd.stream_id);
        if (st && st->c && (frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
            stream_remote_end(st);
        break;
    default:
        break;
    }
    return 0;
}

/* ---- the answer ---- */

/* A HEADERS frame's fields being gathered for nghttp2 (which copies them), on the stack when
 * they fit, as they nearly always do: no allocation per answer. */
#define NVS_LOCAL      24
#define NVS_TEXT_LOCAL 1024

struct nvs {
    nghttp2_nv *nv;
    size_t n, cap;
    char *text; /* copies: the names in lowercase, and the values */
    size_t used, text_cap;
    nghttp2_nv nv_local[NVS_LOCAL];
    char text_local[NVS_TEXT_LOCAL];
};

/* Room for 'cap' fields of 'text_cap' bytes in all. False when out of memory. */
static bool nvs_init(struct nvs *a, size_t cap, size_t text_cap)
{
    a->n = a->used = 0;
    a->cap = cap;
    a->text_cap = text_cap;
    a->nv = cap <= NVS_LOCAL ? a->nv_local : calloc(cap, sizeof(nghttp2_nv));
    a->text = text_cap <= NVS_TEXT_LOCAL ? a->text_local : malloc(text_cap);
    return a->nv && a->text;
}

static void nvs_fini(struct nvs *a)
{
    if (a->nv != a->nv_local)
        free(a->nv);
    if (a->text != a->text_local)
        free(a->text);
}

/* Adds a field to a HEADERS frame of the answer. None that HTTP/2 forbids comes here: each of
 * those is hop-by-hop, which the filter of the way down (fields_down_drops) leaves out of the
 * upstream's fields (test_fields checks it), and the proxy's own are none of them. */
static void nv_add(void *arg, const struct hfield *f)
{
    struct nvs *a = arg;
    const char *name = f->name, *value = f->value;
    size_t nl = f->name_len, vl = f->value_len;
    if (a->n == a->cap || a->used + nl + vl > a->text_cap)
        return;
    char *lc = a->text + a->used;
    hdr_lower(lc, name, nl);
    memcpy(lc + nl, value, vl);
    a->used += nl + vl;
    a->nv[a->n++] =
        (nghttp2_nv){ (uint8_t *)lc, (uint8_t *)lc + nl, nl, vl,
                      hdr_per_request(lc, nl) ? NGHTTP2_NV_FLAG_NO_INDEX : NGHTTP2_NV_FLAG_NONE };
}

static ssize_t read_data(nghttp2_session *sess, int32_t id, uint8_t *buf, size_t length,
                         uint32_t *data_flags, nghttp2_data_source *source, void *user);

/* Resets the stream for a reason of ours (INTERNAL_ERROR), not counted against the client. */
static void fail(struct h2stream *st)
{
    st->flags |= S_NO_BLAME;
    h2c_reset_stream(st, NGHTTP2_INTERNAL_ERROR);
}

/* Submits the answer's HEADERS (and its body through read_data when 'has_body'). Fields: the
 * upstream's 'h' (NULL: none) but those fields_down_drops() names, then 'ctype' and 'length' (< 0:
 * none), then the tag's. */
static void submit(struct h2stream *st, unsigned status, const struct hlist *h,
                   const struct answer_tag *tag, const char *ctype, int64_t length, bool has_body)
{
    struct h2conn *c = st->c;
    st->f.status = status;
    st->f.answered = true;
    st->head = h;
    st->tag = *tag;
    if (!c)
        return;
    struct nvs a;
    if (!nvs_init(&a, 8 + (h ? h->count : 0), 512 + (h ? h->len : 0))) {
        nvs_fini(&a);
        fail(st);
        return;
    }
    char sbuf[4] = { (char)('0' + status / 100 % 10), (char)('0' + status / 10 % 10),
                     (char)('0' + status % 10), 0 },
         lbuf[24];
    nv_add(&a, &(struct hfield){ ":status", sbuf, 7, 3, false });
    if (h)
        fields_down_each(h, tag->request_id != NULL, nv_add, &a);
    if (ctype)
        nv_add(&a, &(struct hfield){ "content-type", ctype, 12, strlen(ctype), false });
    if (length >= 0)
        nv_add(&a, &(struct hfield){ "content-length", lbuf, 14,
                                     (size_t)(hdr_utoa((uint64_t)length, lbuf) - lbuf), false });
    answer_tag_fields(tag, nv_add, &a);
    if (!has_body)
        st->flags |= S_NO_BODY;
    st->f.sent = true;
    retry_req_sending(st->f.req); /* counted before a byte leaves */
    nghttp2_data_provider prd = { .source.ptr = st, .read_callback = read_data };
    if (nghttp2_submit_response(c->sess, st->id, a.nv, a.n, has_body ? &prd : NULL) != 0)
        fail(st);
    nvs_fini(&a); /* nghttp2 copied them */
    h2c_schedule(c);
}

static void h2_error(struct front *f, unsigned status, const char *code, const char *route,
                     const char *message, const struct answer_tag *tag)
{
    struct h2stream *st = of_front(f);
    if (f->grpc) {
        /* a gRPC call: a Trailers-Only response, its status in the one HEADERS frame, which
         * ends the stream (docs/grpc.md "Errors of retryproxy's own") */
        struct answer_grpc g;
        answer_grpc_error(code, status, message, &g);
        struct hlist h = { 0 };
        hlist_add(&h, "grpc-status", 11, g.status, strlen(g.status));
        hlist_add(&h, "grpc-message", 12, g.message, strlen(g.message));
        submit(st, 200, &h, tag, "application/grpc", -1, false);
        hlist_free(&h);
        return;
    }
    size_t n = 0;
    st->owned = answer_error_body(code, route, tag->attempts, message, &n);
    if (!st->owned) {
        st->f.status = status;
        st->f.answered = true;
        fail(st);
        return;
    }
    st->body = st->owned;
    st->body_len = n;
    st->flags |= S_WHOLE;
    submit(st, status, NULL, tag, "application/json", (int64_t)n, !f->is_head);
}

/* The upstream's trailers but those the head's filter leaves out, for end_body(): those the
 * head's Connection names too, and those a Connection among the trailers names. */
static void copy_trailers(struct h2stream *st, const struct hlist *trailers)
{
    if (!trailers)
        return;
    const struct hlist *h = st->head;
    struct fields_down d = { .named = { h && hlist_get(h, "Connection") ? h : NULL,
                                        hlist_get(trailers, "Connection") ? trailers : NULL },
                             .own_request_id = st->tag.request_id != NULL };
    size_t pos = 0;
    struct hfield hf;
    while (hlist_next_n(trailers, &pos, &hf))
        if (!fields_down_drops(&d, hf.name, hf.name_len))
            hlist_add(&st->trailers, hf.name, hf.name_len, hf.value, hf.value_len);
}

static void h2_saved(struct front *f, int status, const struct hlist *h, const char *body,
                     size_t len, const struct hlist *trailers, const struct answer_tag *tag)
{
    struct h2stream *st = of_front(f);
    st->body = body;
    st->body_len = len;
    st->flags |= S_WHOLE; /* 'body' may be NULL when 'len' is 0 */
    st->head = h;
    st->tag = *tag;
    if (!f->is_head)
        copy_trailers(st, trailers); /* sent after the body (end_body) */
    bool has_body =
        !f->is_head && answer_status_has_body(status) && (len > 0 || st->trailers.count > 0);
    /* HEAD and 304: the upstream's length, if it sent one, of a body that never comes (RFC 9110
     * 8.6); 1xx and 204: none */
    int64_t length = f->is_head || status == 304      ? hlist_content_length(h)
                     : answer_status_has_body(status) ? (int64_t)len
                                                      : -1;
    submit(st, (unsigned)status, h, tag, NULL, length, has_body);
}

static void h2_response(struct front *f, int status, const struct hlist *h,
                        const struct answer_tag *tag)
{
    struct h2stream *st = of_front(f);
    /* a gRPC response whose head holds its status is Trailers-Only (gRPC's PROTOCOL-HTTP2.md)
     * and stays so: one HEADERS frame that ends the stream */
    bool trailers_only = f->grpc && hlist_get(h, "grpc-status");
    bool has_body = !f->is_head && answer_status_has_body(status) && !trailers_only;
    int64_t length = has_body || f->is_head || status == 304 ? hlist_content_length(h) : -1;
    submit(st, (unsigned)status, h, tag, NULL, length, has_body);
}

static void resume(struct h2stream *st)
{
    if (st->c && (st->flags & S_DEFERRED)) {
        st->flags &= ~S_DEFERRED;
        nghttp2_session_resume_data(st->c->sess, st->id);
        h2c_schedule(st->c);
    }
}

/* Response body bytes a stream holds past the H2_STREAM_SURE it is sure of. */
static size_t past_sure(size_t len)
{
    return len > H2_STREAM_SURE ? len - H2_STREAM_SURE : 0;
}

/* Whether the stream has room for 'n' more response bytes: at most H2_STREAM_BUFFER, of which
 * H2_STREAM_SURE are its own and the rest from the connection's H2_SHARED. An empty stream
 * takes any write that fits H2_STREAM_BUFFER, so a stream read promptly always goes on however
 * many others are not read, and a held gRPC reply (proxy/core/keep.c) comes whole, up to 32 KiB.
 * So the connection holds at most H2_CONN_BUFFER with libcurl's writes (H2_STREAM_SURE at
 * most), H2_MAX_STREAMS larger writes with an h2c upstream's. */
static bool has_room(const struct h2conn *c, const struct h2stream *st, size_t n)
{
    size_t len = st->down.len;
    return n <= ring_space(&st->down) &&
           (len == 0 || c->shared + past_sure(len + n) - past_sure(len) <= H2_SHARED);
}

/* The stream's buffer went from 'was' bytes to what it holds now: counted. */
static void count_down(struct h2conn *c, const struct h2stream *st, size_t was)
{
    c->buffered = c->buffered - was + st->down.len;
    c->shared = c->shared - past_sure(was) + past_sure(st->down.len);
}

/* The stream's upstream is paused until give_room(): its client is slow to read, or does not,
 * and what it holds may wait long, in a buffer no larger. */
static void set_full(struct h2conn *c, struct h2stream *st)
{
    if (st->flags & S_FULL)
        return;
    c->full++;
    st->flags |= S_FULL;
    ring_fit(&st->down);
}

/* The room set aside for the stream's next write goes back to the shared part. */
static void unowe(struct h2conn *c, struct h2stream *st)
{
    c->shared -= st->owed;
    st->owed = 0;
}

/* Response body bytes, buffered as has_room() allows. A stream left with no room for another
 * write pauses its upstream at once, rather than read that write and refuse it (libcurl keeps a
 * refused write whole, up to 16 KiB, beside its receive buffer: docs/http2.md, "What an unread
 * stream costs"); one left running has the room for its next write set aside from the shared
 * part, so that other streams filling it meanwhile do not have that write refused either. */
static size_t h2_body(struct front *f, const char *p, size_t n)
{
    struct h2stream *st = of_front(f);
    struct h2conn *c = st->c;
    if (!c || (st->flags & S_RESET))
        return 0;
    if (st->flags & S_NO_BODY)
        return n;
    unowe(c, st);
    if (!has_room(c, st, n)) {
        set_full(c, st);
        return FRONT_FULL;
    }
    size_t was = st->down.len;
    if (ring_put(&st->down, p, n) < 0)
        return 0;
    count_down(c, st, was);
    resume(st);
    size_t len = st->down.len;
    if (has_room(c, st, UPSTREAM_WRITE_MAX)) {
        st->owed = past_sure(len + UPSTREAM_WRITE_MAX) - past_sure(len);
        c->shared += st->owed;
    } else if (retry_req_pause(st->f.req)) {
        set_full(c, st);
    }
    return n;
}

static void h2_end(struct front *f, const struct hlist *trailers, bool failed)
{
    struct h2stream *st = of_front(f);
    /* a body broken off is the upstream's doing (or a deadline's), not the client's */
    st->flags |= failed ? S_DOWN_FAIL | S_NO_BLAME : S_DOWN_DONE;
    if (st->c)
        unowe(st->c, st);
    copy_trailers(st, trailers);
    resume(st);
}

/* A stream that body() refused may take bytes again: its upstream goes on. */
static void give_room(struct h2conn *c, struct h2stream *st)
{
    if ((st->flags & S_FULL) && has_room(c, st, UPSTREAM_WRITE_MAX)) {
        st->flags &= ~S_FULL;
        c->full--;
        retry_req_room(st->f.req);
    }
}

static void end_body(struct h2stream *st, uint32_t *data_flags)
{
    *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    if (!st->trailers.count)
        return;
    struct nvs a;
    bool ok = nvs_init(&a, st->trailers.count, st->trailers.len + 1);
    size_t pos = 0;
    struct hfield hf;
    while (ok && hlist_next_n(&st->trailers, &pos, &hf))
        nv_add(&a, &hf);
    if (ok && nghttp2_submit_trailer(st->c->sess, st->id, a.nv, a.n) == 0)
        *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    nvs_fini(&a);
}

static ssize_t read_data(nghttp2_session *sess, int32_t id, uint8_t *buf, size_t length,
                         uint32_t *data_flags, nghttp2_data_source *source, void *user)
{
    (void)sess;
    (void)id;
    (void)user;
    struct h2stream *st = source->ptr;
    struct h2conn *c = st->c;
    if (st->flags & S_WHOLE) {
        size_t n = st->body_len - st->body_off;
        if (n > length)
            n = length;
        if (n)
            memcpy(buf, st->body + st->body_off, n);
        st->body_off += n;
        st->f.body_sent += n;
        if (st->body_off == st->body_len)
            end_body(st, data_flags); /* with the trailers of a saved response */
        return (ssize_t)n;
    }
    if (st->down.len) {
        size_t was = st->down.len;
        size_t n = ring_get(&st->down, (char *)buf, length);
        st->f.body_sent += n;
        count_down(c, st, was);
        /* an empty buffer is given back once its stream's body is over, or when it grew past
         * one write (a slow client's): an idle or ended stream holds none */
        if (st->down.len == 0) {
            unowe(c, st); /* an empty stream takes any write */
            if (st->down.cap > UPSTREAM_WRITE_MAX || (st->flags & S_DOWN_DONE))
                ring_free(&st->down);
        }
        if (st->down.len == 0 && (st->flags & S_DOWN_DONE))
            end_body(st, data_flags);
        give_room(c, st);
        for (struct h2stream *o = c->streams, *next; o && c->full; o = next) {
            next = o->next;
            give_room(c, o); /* those the connection's bound stopped */
        }
        return (ssize_t)n;
    }
    if (st->flags & S_DOWN_FAIL)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* RST_STREAM: the truncation shows */
    if (st->flags & S_DOWN_DONE) {
        end_body(st, data_flags);
        return 0;
    }
    st->flags |= S_DEFERRED;
    return NGHTTP2_ERR_DEFERRED;
}

static void h2_reset(struct front *f, unsigned status)
{
    struct h2stream *st = of_front(f);
    st->f.status = status;
    st->f.answered = true;
    st->flags |= S_NO_BLAME; /* the core's: the client going, or a reason of ours */
    h2c_reset_stream(st, status == CLIENT_CLOSED ? NGHTTP2_CANCEL : NGHTTP2_INTERNAL_ERROR);
}

static void h2_wait_upload(struct front *f)
{
    (void)f; /* the bytes not taken are kept, and the window stays closed by as much, until
              * the core takes them or they are dropped (h2s_drain_upload, h2s_gone) */
}

static void h2_upload_room(struct front *f)
{
    struct h2stream *st = of_front(f);
    if (st->c && st->up_len) {
        want_drain(st);
    }
}

/* The session sees a client's RST_STREAM itself: a watched stream only has to be marked. */
static void h2_watch(struct front *f)
{
    of_front(f)->flags |= S_WATCHED;
}

static void h2_unwatch(struct front *f)
{
    of_front(f)->flags &= ~S_WATCHED;
}

void h2s_gone(struct h2stream *st)
{
    struct h2conn *c = st->c;
    c->buffered -= st->down.len;
    c->shared -= past_sure(st->down.len);
    unowe(c, st);
    drop_upload(st);
}

static void h2_fini(struct front *f)
{
    struct h2stream *st = of_front(f);
    ring_free(&st->down);
    free(st->owned);
    hlist_free(&st->fields);
    hlist_free(&st->trailers);
    free(st->up);
}

static const struct front_ops h2_ops = { .fields = h2_fields,
                                         .error = h2_error,
                                         .saved = h2_saved,
                                         .response = h2_response,
                                         .body = h2_body,
                                         .end = h2_end,
                                         .reset = h2_reset,
                                         .wait_upload = h2_wait_upload,
                                         .upload_room = h2_upload_room,
                                         .watch = h2_watch,
                                         .unwatch = h2_unwatch,
                                         .fini = h2_fini };
