/* h2up -- HTTP/2 client sessions to upstreams (proxy/upstream/h2up.h; docs/http2.md): the streams,
 * the session's callbacks and the API. Connections (sockets, TLS, timers) are
 * proxy/upstream/h2up_conn.c's.
 *
 * A stream's life: submitted, HEADERS sent (h2up_sent), head, body, trailers, closed by the
 * session; its end is decided once (h2up_end_stream) and reported from h2c_settle(), outside
 * libnghttp2. A cancelled stream loses its owner at once and is freed when the session is
 * done with it (or with its connection).
 *
 * h2up.c and h2up_conn.c are one state machine, a connection's and its streams' (they call each
 * other through proxy/upstream/h2up_int.h).
 */
#include "proxy/upstream/h2up_int.h"

#include "proxy/base/dlist.h"
#include "proxy/base/pool.h"
#include "proxy/upstream/origin.h"

/* Kept body bytes go to the owner in pieces of at most this. */
#define OFFER_MAX (16 * 1024)
/* Fields of a HEADERS frame gathered on the stack (nghttp2 copies them); more are allocated. */
#define NV_LOCAL 32

/* ---- streams ---- */

void h2up_pending(struct h2up_stream *s)
{
    if (s->pending)
        return;
    struct conn *c = s->c;
    s->pending = true;
    s->pending_next = NULL;
    if (c->pending_last)
        c->pending_last->pending_next = s;
    else
        c->pending = s;
    c->pending_last = s;
}

void h2up_closed(struct h2up_stream *s)
{
    s->flags |= SF_CLOSED;
    h2up_pending(s);
}

void h2up_end_stream(struct h2up_stream *s, enum h2up_end end, uint32_t error)
{
    if (s->flags & SF_ENDED)
        return;
    s->flags |= SF_ENDED;
    s->end = end;
    s->error = error;
    h2up_pending(s);
}

static bool stopped(const struct h2up_stream *s)
{
    return (s->flags & SF_ENDED) && s->end == H2UP_STOPPED;
}

/* The owner took no bytes: the stream is reset and ends H2UP_STOPPED. */
static void stop(struct h2up_stream *s)
{
    h2up_end_stream(s, H2UP_STOPPED, 0);
    s->kept.len = 0;
    if (!(s->flags & SF_CLOSED) && s->id > 0)
        nghttp2_submit_rst_stream(s->c->s, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
}

/* Offers body bytes to the owner; true when all were taken (and counted consumed). */
static bool offer(struct h2up_stream *s, const char *p, size_t n)
{
    size_t took = s->ops->body(s->arg, p, n);
    if (took == H2UP_PAUSE) {
        s->flags |= SF_PAUSED;
        return false;
    }
    if (took < n) {
        stop(s);
        return false;
    }
    /* kept bytes of a stream whose connection is gone have no window left to open */
    if (s->c->s && !(s->flags & SF_CLOSED))
        nghttp2_session_consume_stream(s->c->s, s->id, n);
    return true;
}

/* Kept bytes to an owner that has room again, in pieces no larger than a DATA frame's (an
 * owner's buffer may be smaller than what was kept: libcurl hands 16 KiB at most too). */
void h2up_drain_kept(struct h2up_stream *s)
{
    size_t off = 0;
    while (off < s->kept.len && s->ops && !(s->flags & SF_PAUSED) && !stopped(s)) {
        size_t n = s->kept.len - off < OFFER_MAX ? s->kept.len - off : OFFER_MAX;
        if (!offer(s, (const char *)s->kept.p + off, n))
            break;
        off += n;
    }
    bytes_drop(&s->kept, stopped(s) ? s->kept.len : off);
}

void h2up_free_stream(struct h2up_stream *s)
{
    struct conn *c = s->c;
    DLIST_UNLINK(c->streams, s);
    c->nstreams--;
    if (c->s && s->id > 0 && !(s->flags & SF_CLOSED))
        nghttp2_session_set_stream_user_data(c->s, s->id, NULL);
    free(s->kept.p);
    free(s);
}

/* ---- session callbacks ---- */

static struct h2up_stream *stream_of(nghttp2_session *ss, int32_t id)
{
    return nghttp2_session_get_stream_user_data(ss, id);
}

static int on_begin_headers(nghttp2_session *ss, const nghttp2_frame *f, void *ud)
{
    (void)ud;
    struct h2up_stream *s = stream_of(ss, f->hd.stream_id);
    if (s && s->ops && !(s->flags & SF_HEAD)) {
        s->status = 0; /* a head after an interim 1xx one */
        hlist_clear(s->head);
    }
    return 0;
}

static int on_header(nghttp2_session *ss, const nghttp2_frame *f, const uint8_t *name, size_t nl,
                     const uint8_t *value, size_t vl, uint8_t flags, void *ud)
{
    (void)flags;
    (void)ud;
    struct h2up_stream *s = stream_of(ss, f->hd.stream_id);
    if (!s || !s->ops || f->hd.type != NGHTTP2_HEADERS)
        return 0;
    if (s->flags & SF_HEAD)
        return hlist_add(s->trailers, (const char *)name, nl, (const char *)value, vl) < 0
                   ? NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE
                   : 0;
    if (nl == 7 && memcmp(name, ":status", 7) == 0) {
        /* the session checked it is three digits */
        s->status = vl == 3 ? (value[0] - '0') * 100 + (value[1] - '0') * 10 + (value[2] - '0') : 0;
        return 0;
    }
    if (nl && name[0] == ':')
        return 0; /* no other pseudo-field passes the session's checks in a response */
    return hlist_add(s->head, (const char *)name, nl, (const char *)value, vl) < 0
               ? NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE /* too many or too large: reset */
               : 0;
}

/* The upstream's END_STREAM after the final head: the response is whole (the session has
 * checked its content-length against the body, and resets the stream PROTOCOL_ERROR instead of
 * getting here on a mismatch). An upload the upstream did not read is no longer needed (RFC 9113
 * 8.1): our side ends too, rather than waiting for a window that may never open. */
static void whole(struct h2up_stream *s)
{
    h2up_end_stream(s, H2UP_COMPLETE, 0);
    if (nghttp2_session_get_stream_local_close(s->c->s, s->id) == 0)
        nghttp2_submit_rst_stream(s->c->s, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_NO_ERROR);
}

static int on_frame_recv(nghttp2_session *ss, const nghttp2_frame *f, void *ud)
{
    struct conn *c = ud;
    if (f->hd.type == NGHTTP2_GOAWAY) {
        c->goaway = true; /* streams above last_stream_id are closed REFUSED_STREAM by it */
        return 0;
    }
    if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA)
        return 0;
    struct h2up_stream *s = stream_of(ss, f->hd.stream_id);
    if (!s || !s->ops || (s->flags & SF_ENDED))
        return 0;
    if (f->hd.type == NGHTTP2_HEADERS && !(s->flags & SF_HEAD)) {
        if (s->status / 100 == 1)
            return 0; /* interim, as the session sees it: the final head follows */
        s->flags |= SF_HEAD;
        if (!s->ops->head(s->arg, s->status)) {
            /* a head the owner refuses (a status outside 100-599): nothing is relayed */
            h2up_end_stream(s, H2UP_BROKEN, 0);
            nghttp2_submit_rst_stream(ss, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_PROTOCOL_ERROR);
            return 0;
        }
        if (!s->ops)
            return 0; /* the owner's decision on the head cancelled the stream */
    }
    if ((f->hd.flags & NGHTTP2_FLAG_END_STREAM) && (s->flags & SF_HEAD))
        whole(s);
    return 0;
}

static int on_data(nghttp2_session *ss, uint8_t flags, int32_t id, const uint8_t *p, size_t n,
                   void *ud)
{
    (void)flags;
    (void)ud;
    nghttp2_session_consume_connection(ss, n);
    struct h2up_stream *s = stream_of(ss, id);
    if (!s || !s->ops || (s->flags & SF_ENDED)) {
        nghttp2_session_consume_stream(ss, id, n);
        return 0;
    }
    if (!s->kept.len && !(s->flags & SF_PAUSED) && offer(s, (const char *)p, n))
        return 0;
    if (stopped(s))
        return 0;
    /* kept: the stream's window stays closed by as much, so the peer cannot send more than
     * H2UP_STREAM_WINDOW (the session enforces it) */
    if (bytes_append(&s->kept, p, n) < 0) {
        stop(s);
        s->end = H2UP_BROKEN;
    }
    h2up_pending(s);
    return 0;
}

static int on_stream_close(nghttp2_session *ss, int32_t id, uint32_t error, void *ud)
{
    (void)ud;
    struct h2up_stream *s = stream_of(ss, id);
    if (!s)
        return 0;
    h2up_closed(s);
    /* a whole response ended at its END_STREAM (whole()); closed before, even NO_ERROR, it is
     * cut short */
    if (!(s->flags & SF_HEAD) && error == NGHTTP2_REFUSED_STREAM)
        h2up_end_stream(s, H2UP_REFUSED, error);
    else if (!(s->flags & SF_SENT))
        h2up_end_stream(s, H2UP_UNSENT, error);
    else
        h2up_end_stream(s, H2UP_BROKEN, error);
    return 0;
}

static int on_frame_send(nghttp2_session *ss, const nghttp2_frame *f, void *ud)
{
    (void)ud;
    if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_REQUEST) {
        struct h2up_stream *s = stream_of(ss, f->hd.stream_id);
        if (s)
            s->flags |= SF_SENT;
    }
    return 0;
}

/* A request's HEADERS that never went out (a GOAWAY came first, or the stream was cancelled
 * before): the stream never opened, so the session is done with it. It has no stream object
 * in the session yet, hence no user data: found in the connection's list. */
static int on_frame_not_send(nghttp2_session *ss, const nghttp2_frame *f, int lib_error, void *ud)
{
    (void)ss;
    (void)lib_error;
    struct conn *c = ud;
    if (f->hd.type != NGHTTP2_HEADERS)
        return 0;
    for (struct h2up_stream *s = c->streams; s; s = s->next)
        if (s->id == f->hd.stream_id) {
            h2up_closed(s);
            h2up_end_stream(s, H2UP_REFUSED, 0);
            break;
        }
    return 0;
}

/* The upload's last byte: the stream ends with it, or with the request's trailers after it. */
static void end_upload(struct h2up_stream *s, uint32_t *data_flags)
{
    *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    const struct hlist *t = s->req_trailers;
    if (!t || !t->count)
        return;
    nghttp2_nv local[NV_LOCAL];
    nghttp2_nv *nv = t->count <= NV_LOCAL ? local : calloc(t->count, sizeof(*nv));
    size_t pos = 0, k = 0;
    struct hfield f;
    while (nv && hlist_next_n(t, &pos, &f))
        nv[k++] = (nghttp2_nv){ (uint8_t *)f.name, (uint8_t *)f.value, f.name_len, f.value_len,
                                NGHTTP2_NV_FLAG_NONE };
    /* the session copies them */
    if (nv && nghttp2_submit_trailer(s->c->s, s->id, nv, k) == 0)
        *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    if (nv != local)
        free(nv);
}

static ssize_t read_body(nghttp2_session *ss, int32_t id, uint8_t *buf, size_t max,
                         uint32_t *data_flags, nghttp2_data_source *src, void *ud)
{
    (void)src;
    (void)ud;
    struct h2up_stream *s = stream_of(ss, id);
    if (!s || !s->ops)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* cancelled: reset */
    size_t n;
    if (s->flags & SF_DATA_BUFFER) {
        n = s->len - s->off < max ? s->len - s->off : max;
        if (n)
            memcpy(buf, s->buf + s->off, n);
        s->off += n;
        if (s->off == s->len)
            end_upload(s, data_flags);
        return (ssize_t)n;
    }
    n = s->ops->upload(s->arg, (char *)buf, max);
    if (n == H2UP_PAUSE) {
        s->flags |= SF_DEFERRED;
        return NGHTTP2_ERR_DEFERRED;
    }
    if (n == 0)
        end_upload(s, data_flags);
    return (ssize_t)n;
}

nghttp2_session_callbacks *h2up_callbacks(void)
{
    /* Made once per pool: the session copies them. */
    nghttp2_session_callbacks *cb;
    if (nghttp2_session_callbacks_new(&cb) != 0)
        return NULL;
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
    nghttp2_session_callbacks_set_on_frame_not_send_callback(cb, on_frame_not_send);
    return cb;
}

/* ---- the API ---- */

struct h2up *h2up_new(struct connect_side *cs, struct metrics_h2up *counts)
{
    struct h2up *h = calloc(1, sizeof(*h));
    if (!h || !(h->pool = pool_new())) {
        free(h);
        return NULL;
    }
    h->loop = cs->loop;
    h->side = cs;
    h->counts = counts;
    h->mem = (nghttp2_mem){ h->pool, pool_malloc, pool_release, pool_calloc, pool_realloc };
    return h;
}

void h2up_free(struct h2up *h)
{
    if (!h)
        return;
    while (h->conns)
        h2c_free(h->conns);
    for (size_t i = 0; i < H2UP_H1_MEMO_MAX; i++)
        free(h->h1[i].key);
    pool_free(h->pool); /* after the sessions */
    free(h);
}

void h2up_trim(struct h2up *h)
{
    pool_trim(h->pool);
}

struct h2up_stream *h2up_start(struct h2up *h, const struct origin *o, const struct h2up_req *req,
                               uint64_t connect_timeout_ms, const struct h2up_ops *ops, void *arg,
                               struct hlist *head, struct hlist *trailers)
{
    struct conn *c = h2c_pick(h, o, connect_timeout_ms);
    if (!c)
        return NULL;
    struct h2up_stream *s = calloc(1, sizeof(*s));
    /* the session copies the fields: on the stack when they fit */
    nghttp2_nv local[NV_LOCAL];
    nghttp2_nv *nv = req->n_fields + 4 <= NV_LOCAL ? local : calloc(req->n_fields + 4, sizeof(*nv));
    if (!s || !nv)
        goto fail;
    s->c = c;
    s->ops = ops;
    s->arg = arg;
    s->head = head;
    s->trailers = trailers;
    s->req_trailers = req->trailers;
    size_t k = 0;
#define NV(n, nl, v, vl)                                                                           \
    nv[k++] = (nghttp2_nv){ (uint8_t *)(n), (uint8_t *)(v), nl, vl, NGHTTP2_NV_FLAG_NONE }
    NV(":method", 7, req->method, strlen(req->method));
    NV(":scheme", 7, o->tls ? "https" : "http", o->tls ? 5u : 4u);
    NV(":authority", 10, req->authority, strlen(req->authority));
    NV(":path", 5, req->path, strlen(req->path));
    for (size_t i = 0; i < req->n_fields; i++) {
        NV(req->fields[i].name, req->fields[i].name_len, req->fields[i].value,
           req->fields[i].value_len);
        if (req->fields[i].never_index)
            nv[k - 1].flags = NGHTTP2_NV_FLAG_NO_INDEX;
    }
#undef NV
    nghttp2_data_provider dp = { .read_callback = read_body };
    if (req->has_body) {
        s->flags |= SF_DATA_STREAM;
    } else if (req->buf) {
        s->flags |= SF_DATA_BUFFER;
        s->buf = req->buf;
        s->len = req->len;
    }
    /* the session copies the fields */
    s->id = nghttp2_submit_request(c->s, NULL, nv, k,
                                   (s->flags & (SF_DATA_STREAM | SF_DATA_BUFFER)) ? &dp : NULL, s);
    if (nv != local)
        free(nv);
    nv = NULL;
    if (s->id < 0)
        goto fail;
    DLIST_PUSH(c->streams, s);
    c->nstreams++;
    if (c->open)
        loop_timer_stop(h->loop, &c->timer); /* the idle timeout */
    h2c_kick(c);
    return s;
fail:
    if (nv != local)
        free(nv);
    free(s);
    if (!c->nstreams && !c->open) {
        h2c_fail(c);
        h2c_free(c);
    }
    return NULL;
}

void h2up_cancel(struct h2up_stream *s)
{
    struct conn *c = s->c;
    s->ops = NULL;
    s->kept.len = 0;
    h2up_pending(s);
    if (!(s->flags & SF_CLOSED) && c->s && s->id > 0)
        nghttp2_submit_rst_stream(c->s, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
    h2c_kick(c); /* freed by h2c_settle() once the session is done with it */
}

bool h2up_sent(const struct h2up_stream *s)
{
    return s->flags & SF_SENT;
}

void h2up_resume_body(struct h2up_stream *s)
{
    if (!(s->flags & SF_PAUSED))
        return;
    s->flags &= ~SF_PAUSED;
    h2up_pending(s);
    h2c_kick(s->c);
}

void h2up_resume_upload(struct h2up_stream *s)
{
    if (!(s->flags & SF_DEFERRED))
        return;
    s->flags &= ~SF_DEFERRED;
    if (s->c->s && !(s->flags & SF_CLOSED))
        nghttp2_session_resume_data(s->c->s, s->id);
    h2c_kick(s->c);
}

size_t h2up_connections(const struct h2up *h)
{
    return h->nconns;
}
