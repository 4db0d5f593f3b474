#include "proxy/h2front.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "proxy/answer.h"
#include "proxy/dlist.h"
#include "proxy/headers.h"
#include "proxy/retry.h"
#include "proxy/ring.h"

/* What one connection may hold (docs/hardening.md, "HTTP/2"). */
#define H2_MAX_STREAMS   100           /* SETTINGS_MAX_CONCURRENT_STREAMS */
#define H2_STREAM_WINDOW 65535         /* a stream's upload window (SETTINGS_INITIAL_...) */
#define H2_CONN_WINDOW   (1024 * 1024) /* the connection's upload window */
#define H2_STREAM_BUFFER (64 * 1024)   /* a stream's response bytes waiting (as relay.c) */
#define H2_CONN_BUFFER   (1024 * 1024) /* ... and all the connection's streams' together */
#define H2_OUT_CAP       (32 * 1024)   /* frames serialised, waiting for the socket */
#define H2_READ          (16 * 1024)   /* one recv() */
#define H2_READS_PER_IO  4             /* recv()s per readable event: fairness */
#define H2_CONTINUATIONS 8             /* CONTINUATION frames after one HEADERS */
/* Stream resets, the client's (nghttp2 counts those) and ours (counted here: a client that
 * has us reset streams costs as much, CVE-2023-44487 and its "made you reset" variant): a
 * token bucket of this many, refilled at this many a second. Empty: GOAWAY
 * ENHANCE_YOUR_CALM. */
#define H2_RESET_BURST 200
#define H2_RESET_RATE  33
/* The most the upstream side delivers in one write (libcurl's CURL_MAX_WRITE_SIZE): once a
 * stream's buffer has this much room, a paused upstream may go on. */
#define UPSTREAM_WRITE_MAX (16 * 1024)
/* After a GOAWAY that ends a session (an error, a flood), the connection's write side is shut
 * and what the client still sends is read and dropped for this long, so that the GOAWAY is
 * not lost to a reset (closing with unread bytes resets the connection). */
#define H2_LINGER_MS 1000
/* The status the core gives a request whose client went away (nginx's 499). */
#define CLIENT_CLOSED 499

/* Stream flags (struct h2stream 'flags'). */
enum {
    S_REMOTE_END = 1u << 0, /* the client's END_STREAM came */
    S_ENDED = 1u << 1,      /* ... and went to the core (retry_req_end) */
    S_NO_BODY = 1u << 2,    /* the answer went without a body (HEAD, 204, 304) */
    S_DEFERRED = 1u << 3,   /* the data provider waits for bytes (nghttp2_session_resume_data) */
    S_DOWN_DONE = 1u << 4,  /* the response body is complete */
    S_DOWN_FAIL = 1u << 5,  /* ... or broke off: the stream is reset */
    S_FULL = 1u << 6,       /* body() said FRONT_FULL: retry_req_room() when there is room */
    S_ROOM = 1u << 7,       /* the core takes upload bytes again */
    S_DISCARD = 1u << 8,    /* answered, the rest of the upload is refused */
    S_RESET = 1u << 9,      /* we reset the stream */
    S_LOCAL_END = 1u << 10, /* our END_STREAM went */
    S_WATCHED = 1u << 11,   /* the core waits out a backoff: a reset is the client going */
};

struct h2conn;

/* A stream's front end, in its request's allocation (proxy/front.h). */
struct h2stream {
    struct front f;
    struct h2conn *c; /* NULL once the stream closed or its connection went */
    struct h2stream *prev, *next;
    int32_t id;
    unsigned flags;
    struct hlist fields; /* the request's, "host" from :authority first */
    struct ring down;    /* response body bytes for the client */
    const char *body;    /* or a whole body: saved (the core's) or an error (owned) */
    size_t body_len, body_off;
    char *owned;
    struct hlist trailers;
    char *up; /* upload bytes the core has not taken yet (within the stream's window) */
    size_t up_off, up_len, up_cap;
};

/* The request head being received: HEADERS and its CONTINUATIONs come without anything in
 * between on a connection, so one at a time. */
struct h2head {
    int32_t id;
    struct hlist fields;
    char method[WIRE_METHOD_MAX + 1];
    char *path;
    size_t bytes;   /* counted as SETTINGS_MAX_HEADER_LIST_SIZE counts them */
    unsigned n;     /* fields */
    bool authority; /* :authority came: it is the Host */
    bool length;    /* a content-length came */
    enum wire_reason refused;
};

struct h2conn {
    struct h2conn *prev, *next;
    struct h2front *hf;
    nghttp2_session *sess;
    int fd;
    bool closing;
    bool goaway;   /* a graceful GOAWAY is submitted (draining) */
    bool fatal;    /* the session ended: close after writing what is left */
    bool linger;   /* ... written, the write side shut: reading the rest away */
    unsigned full; /* streams whose body() said FRONT_FULL */
    struct h2stream *streams;
    unsigned n_streams;
    size_t buffered; /* response bytes in the streams' buffers */
    struct h2head head;
    struct h2front_limits lim;
    uint64_t last_io;          /* loop ms of the last byte in or out */
    uint64_t resets, reset_ms; /* the reset bucket's tokens, and when it was last filled */
    struct loop_watch watch;
    struct loop_timer flush_t, idle_t;
    char *out; /* H2_OUT_CAP bytes */
    size_t out_len;
    const uint8_t *pend; /* a frame from nghttp2 that did not fit in 'out' */
    size_t pend_len;
    char peer[48];
};

struct h2front {
    struct worker *w;
    struct loop *loop;
    void (*closed)(void *arg);
    void *arg;
    nghttp2_session_callbacks *cbs;
    nghttp2_option *opt;
    struct h2conn *conns;
    unsigned n;
    bool draining;
};

static const struct front_ops h2_ops;

static struct h2stream *of_front(struct front *f)
{
    return (struct h2stream *)f;
}

static void on_flush(struct loop_timer *t);

/* Has the connection's work (progress()) done at the end of this loop turn, outside of
 * nghttp2's callbacks and of the core's calls. */
static void schedule(struct h2conn *c)
{
    struct loop *l = c->hf->loop;
    if (!c->closing)
        loop_timer_start(l, &c->flush_t, loop_now(l), on_flush, c);
}

/* Ends the session with a GOAWAY carrying 'code'; the connection closes once it is written. */
static void terminate(struct h2conn *c, uint32_t code)
{
    nghttp2_session_terminate_session(c->sess, code);
    c->fatal = true;
    schedule(c);
}

/* One stream reset, ours or the client's. */
static void count_reset(struct h2conn *c)
{
    uint64_t now = loop_now(c->hf->loop);
    uint64_t refill = (now - c->reset_ms) * H2_RESET_RATE / 1000;
    if (refill) {
        c->resets = c->resets + refill > H2_RESET_BURST ? H2_RESET_BURST : c->resets + refill;
        c->reset_ms = now;
    }
    if (c->resets == 0)
        terminate(c, NGHTTP2_ENHANCE_YOUR_CALM);
    else
        c->resets--;
}

static void reset_stream(struct h2stream *st, uint32_t code)
{
    if (!st->c || (st->flags & S_RESET))
        return;
    st->flags |= S_RESET;
    nghttp2_submit_rst_stream(st->c->sess, NGHTTP2_FLAG_NONE, st->id, code);
    schedule(st->c);
}

/* ---- the request ---- */

static int on_begin_headers(nghttp2_session *sess, const nghttp2_frame *frame, void *user)
{
    (void)sess;
    struct h2conn *c = user;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    struct h2head *h = &c->head;
    hlist_clear(&h->fields);
    free(h->path);
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
 * (limits.max_header_bytes, WIRE_FIELDS_MAX): past the bounds the rest is not kept and the
 * request is answered 431 (or 414, 501) like one. */
static int on_header(nghttp2_session *sess, const nghttp2_frame *frame, const uint8_t *name,
                     size_t nl, const uint8_t *value, size_t vl, uint8_t flags, void *user)
{
    (void)sess;
    (void)flags;
    struct h2conn *c = user;
    struct h2head *h = &c->head;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST ||
        frame->hd.stream_id != h->id)
        return 0; /* trailers of a request: not relayed (docs/http2.md) */
    h->bytes += nl + vl + 32;
    if (h->bytes > c->lim.max_header_bytes && !h->refused)
        h->refused = WIRE_HEAD_TOO_LARGE;
    if (h->refused)
        return 0;
    const char *k = (const char *)name, *v = (const char *)value;
    if (nl && k[0] == ':') {
        if (name_is(name, nl, ":method")) {
            if (vl > WIRE_METHOD_MAX)
                h->refused = WIRE_METHOD_TOO_LONG;
            else
                memcpy(h->method, v, vl), h->method[vl] = '\0';
        } else if (name_is(name, nl, ":path")) {
            if (vl > WIRE_LINE_MAX || !(h->path = strndup(v, vl)))
                h->refused = WIRE_TARGET_TOO_LONG;
        } else if (name_is(name, nl, ":authority")) {
            /* the Host of HTTP/1.1 (RFC 9113 8.3.1) */
            h->authority = true;
            if (hlist_add(&h->fields, "host", 4, v, vl) < 0)
                h->refused = WIRE_HEAD_TOO_LARGE;
        }
        return 0; /* pseudo-header fields never go upstream as fields */
    }
    if ((h->authority && name_is(name, nl, "host")) || name_is(name, nl, "te"))
        return 0; /* :authority wins; te is "trailers" (nghttp2 checked) and hop-by-hop */
    if (name_is(name, nl, "content-length"))
        h->length = true;
    if (++h->n > WIRE_FIELDS_MAX || hlist_add(&h->fields, k, nl, v, vl) < 0)
        h->refused = WIRE_HEAD_TOO_LARGE;
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
    if (!end && !h->length && !h->refused &&
        hlist_add(&h->fields, "transfer-encoding", 17, "chunked", 7) < 0)
        h->refused = WIRE_HEAD_TOO_LARGE;
    struct front *f = retry_req_new(hf->w, &h2_ops, sizeof(struct h2stream), FRONT_HTTP2,
                                    h->path ? h->path : "", c->peer, h->refused);
    if (!f) {
        nghttp2_submit_rst_stream(c->sess, NGHTTP2_FLAG_NONE, h->id, NGHTTP2_REFUSED_STREAM);
        return;
    }
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
    const char *n, *v;
    while (hlist_next(&st->fields, &pos, &n, &v))
        fn(arg, n, strlen(n), v, strlen(v));
}

/* Upload bytes the core did not take are kept (at most the stream's window, which stays
 * closed by as much until they are taken). */
static bool keep_upload(struct h2stream *st, const uint8_t *p, size_t n)
{
    if (st->up_off + st->up_len + n > st->up_cap) {
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

/* Offers upload bytes to the core; what it takes is given back to the client's window. */
static size_t offer(struct h2stream *st, const char *p, size_t n)
{
    size_t took = retry_req_body(st->f.req, p, n);
    if (!st->c)
        return n;
    if (took == RETRY_BODY_CLOSE) {
        /* answered (413) and the client goes on: no more window; once the answer is out
         * the stream is reset (NO_ERROR, RFC 9113 8.1) */
        st->flags |= S_DISCARD;
        if (st->flags & S_LOCAL_END)
            reset_stream(st, NGHTTP2_NO_ERROR);
        return n;
    }
    nghttp2_session_consume(st->c->sess, st->id, took);
    return took;
}

static int on_data(nghttp2_session *sess, uint8_t flags, int32_t id, const uint8_t *data,
                   size_t len, void *user)
{
    (void)flags;
    (void)user;
    struct h2stream *st = nghttp2_session_get_stream_user_data(sess, id);
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
        !keep_upload(st, data + took, len - took))
        reset_stream(st, NGHTTP2_FLOW_CONTROL_ERROR);
    return 0;
}

/* The core takes upload bytes again: offers what is kept. */
static void drain_upload(struct h2stream *st)
{
    st->flags &= ~S_ROOM;
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
        st->up_len = 0;
    if (st->c && !st->up_len && (st->flags & S_REMOTE_END))
        stream_remote_end(st);
}

static int on_frame_recv(nghttp2_session *sess, const nghttp2_frame *frame, void *user)
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

struct nvs {
    nghttp2_nv *nv;
    size_t n, cap;
    char *text; /* copies: the names in lowercase, and the values */
    size_t used, text_cap;
};

static void nv_add(void *arg, const char *name, const char *value)
{
    struct nvs *a = arg;
    size_t nl = strlen(name), vl = strlen(value);
    if (a->n == a->cap || a->used + nl + vl > a->text_cap)
        return;
    char *lc = a->text + a->used;
    for (size_t i = 0; i < nl; i++)
        lc[i] = (char)((name[i] >= 'A' && name[i] <= 'Z') ? name[i] + 32 : name[i]);
    memcpy(lc + nl, value, vl);
    a->used += nl + vl;
    a->nv[a->n++] = (nghttp2_nv){ (uint8_t *)lc, (uint8_t *)lc + nl, nl, vl, NGHTTP2_NV_FLAG_NONE };
}

static ssize_t read_data(nghttp2_session *sess, int32_t id, uint8_t *buf, size_t length,
                         uint32_t *data_flags, nghttp2_data_source *source, void *user);

/* Submits the answer's HEADERS (and its body through read_data when 'has_body'). Fields: the
 * upstream's 'h' (NULL: none) but those answer_drops() names, then 'ctype' and 'length' (< 0:
 * none), then the tag's. */
static void submit(struct h2stream *st, unsigned status, const struct hlist *h,
                   const struct front_tag *tag, const char *ctype, int64_t length, bool has_body)
{
    struct h2conn *c = st->c;
    st->f.status = status;
    st->f.answered = true;
    if (!c)
        return;
    size_t cap = 8 + (h ? h->count : 0);
    size_t text_cap = 512 + (h ? h->len : 0);
    struct nvs a = { calloc(cap, sizeof(nghttp2_nv)), 0, cap, malloc(text_cap), 0, text_cap };
    if (!a.nv || !a.text) {
        free(a.nv);
        free(a.text);
        reset_stream(st, NGHTTP2_INTERNAL_ERROR);
        return;
    }
    char sbuf[8], lbuf[24];
    snprintf(sbuf, sizeof(sbuf), "%03u", status % 1000);
    nv_add(&a, ":status", sbuf);
    if (h) {
        bool has_connection = hlist_get(h, "Connection") != NULL;
        size_t pos = 0;
        const char *n, *v;
        while (hlist_next(h, &pos, &n, &v))
            if (!answer_drops(h, has_connection, n, tag))
                nv_add(&a, n, v);
    }
    if (ctype)
        nv_add(&a, "content-type", ctype);
    if (length >= 0) {
        hdr_utoa((uint64_t)length, lbuf);
        nv_add(&a, "content-length", lbuf);
    }
    answer_tag_fields(tag, nv_add, &a);
    if (!has_body)
        st->flags |= S_NO_BODY;
    st->f.sent = true;
    retry_req_sending(st->f.req); /* counted before a byte leaves */
    nghttp2_data_provider prd = { .source.ptr = st, .read_callback = read_data };
    if (nghttp2_submit_response(c->sess, st->id, a.nv, a.n, has_body ? &prd : NULL) != 0)
        reset_stream(st, NGHTTP2_INTERNAL_ERROR);
    free(a.nv); /* nghttp2 copied them */
    free(a.text);
    schedule(c);
}

static void h2_error(struct front *f, unsigned status, const char *code, const char *route,
                     const char *message, const struct front_tag *tag)
{
    struct h2stream *st = of_front(f);
    /* Item 4 of issue 20 goes here: a gRPC call (content-type application/grpc...) is answered
     * with a Trailers-Only response (grpc-status, grpc-message) instead of this JSON body. */
    size_t n = 0;
    st->owned = answer_error_body(code, route, tag->attempts, message, &n);
    if (!st->owned) {
        st->f.status = status;
        st->f.answered = true;
        reset_stream(st, NGHTTP2_INTERNAL_ERROR);
        return;
    }
    st->body = st->owned;
    st->body_len = n;
    submit(st, status, NULL, tag, "application/json", (int64_t)n, !f->is_head);
}

static void h2_saved(struct front *f, int status, const struct hlist *h, const char *body,
                     size_t len, const struct front_tag *tag)
{
    struct h2stream *st = of_front(f);
    st->body = body;
    st->body_len = len;
    bool has_body = !f->is_head && answer_status_has_body(status) && len > 0;
    int64_t length =
        f->is_head ? hlist_content_length(h) : (answer_status_has_body(status) ? (int64_t)len : -1);
    submit(st, (unsigned)status, h, tag, NULL, length, has_body);
}

static void h2_response(struct front *f, int status, const struct hlist *h,
                        const struct front_tag *tag)
{
    struct h2stream *st = of_front(f);
    bool has_body = !f->is_head && answer_status_has_body(status);
    int64_t length = (has_body || f->is_head) ? hlist_content_length(h) : -1;
    submit(st, (unsigned)status, h, tag, NULL, length, has_body);
}

static void resume(struct h2stream *st)
{
    if (st->c && (st->flags & S_DEFERRED)) {
        st->flags &= ~S_DEFERRED;
        nghttp2_session_resume_data(st->c->sess, st->id);
        schedule(st->c);
    }
}

/* Response body bytes: a stream holds at most H2_STREAM_BUFFER, the connection's streams
 * H2_CONN_BUFFER together (a stream with nothing buffered may always take some, so that a
 * stream read slowly never stops the others for good). */
static size_t h2_body(struct front *f, const char *p, size_t n)
{
    struct h2stream *st = of_front(f);
    struct h2conn *c = st->c;
    if (!c || (st->flags & S_RESET))
        return 0;
    if (st->flags & S_NO_BODY)
        return n;
    if (n > ring_space(&st->down) || (st->down.len && c->buffered + n > H2_CONN_BUFFER)) {
        if (!(st->flags & S_FULL))
            c->full++;
        st->flags |= S_FULL;
        return FRONT_FULL;
    }
    if (ring_put(&st->down, p, n) < 0)
        return 0;
    c->buffered += n;
    resume(st);
    return n;
}

static void h2_end(struct front *f, const struct hlist *trailers, bool failed)
{
    struct h2stream *st = of_front(f);
    st->flags |= failed ? S_DOWN_FAIL : S_DOWN_DONE;
    if (trailers) {
        size_t pos = 0;
        const char *n, *v;
        while (hlist_next(trailers, &pos, &n, &v))
            hlist_add(&st->trailers, n, strlen(n), v, strlen(v));
    }
    resume(st);
}

/* A stream that body() refused may take bytes again: its upstream goes on. */
static void give_room(struct h2conn *c, struct h2stream *st)
{
    if ((st->flags & S_FULL) && ring_space(&st->down) >= UPSTREAM_WRITE_MAX &&
        c->buffered + UPSTREAM_WRITE_MAX <= H2_CONN_BUFFER) {
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
    struct nvs a = { calloc(st->trailers.count, sizeof(nghttp2_nv)),
                     0,
                     st->trailers.count,
                     malloc(st->trailers.len + 1),
                     0,
                     st->trailers.len + 1 };
    size_t pos = 0;
    const char *n, *v;
    while (a.nv && a.text && hlist_next(&st->trailers, &pos, &n, &v))
        nv_add(&a, n, v);
    if (a.nv && a.text && nghttp2_submit_trailer(st->c->sess, st->id, a.nv, a.n) == 0)
        *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    free(a.nv);
    free(a.text);
}

static ssize_t read_data(nghttp2_session *sess, int32_t id, uint8_t *buf, size_t length,
                         uint32_t *data_flags, nghttp2_data_source *source, void *user)
{
    (void)sess;
    (void)id;
    (void)user;
    struct h2stream *st = source->ptr;
    struct h2conn *c = st->c;
    if (st->body) {
        size_t n = st->body_len - st->body_off;
        if (n > length)
            n = length;
        memcpy(buf, st->body + st->body_off, n);
        st->body_off += n;
        if (st->body_off == st->body_len)
            *data_flags |= NGHTTP2_DATA_FLAG_EOF;
        return (ssize_t)n;
    }
    if (st->down.len) {
        size_t n = ring_get(&st->down, (char *)buf, length);
        c->buffered -= n;
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
    reset_stream(st, status == CLIENT_CLOSED ? NGHTTP2_CANCEL : NGHTTP2_INTERNAL_ERROR);
}

static void h2_wait_upload(struct front *f)
{
    (void)f; /* the bytes not taken are kept, and the window stays closed by as much */
}

static void h2_upload_room(struct front *f)
{
    struct h2stream *st = of_front(f);
    if (st->c && st->up_len) {
        st->flags |= S_ROOM; /* offered from the loop, never from inside the core's call */
        schedule(st->c);
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

/* ---- the end of a stream ---- */

/* The stream is over for the client side: closed by both ends, reset by either, or its
 * connection went ('gone': not a normal end). */
static void stream_gone(struct h2stream *st, bool gone)
{
    struct h2conn *c = st->c;
    DLIST_UNLINK(c->streams, st);
    c->n_streams--;
    c->buffered -= st->down.len;
    if (st->flags & S_FULL)
        c->full--;
    st->c = NULL;
    if (gone && (st->flags & S_WATCHED) && !st->f.answered)
        retry_req_client_gone(st->f.req); /* the core stops retrying (a backoff wait) */
    retry_req_completed(st->f.req);       /* may free st */
}

static int on_stream_close(nghttp2_session *sess, int32_t id, uint32_t code, void *user)
{
    (void)user;
    struct h2stream *st = nghttp2_session_get_stream_user_data(sess, id);
    if (st && st->c)
        stream_gone(st, code != NGHTTP2_NO_ERROR || !(st->flags & S_LOCAL_END));
    return 0;
}

static int on_frame_send(nghttp2_session *sess, const nghttp2_frame *frame, void *user)
{
    struct h2conn *c = user;
    if (frame->hd.type == NGHTTP2_RST_STREAM && frame->rst_stream.error_code != NGHTTP2_NO_ERROR)
        count_reset(c);
    if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
        struct h2stream *st = nghttp2_session_get_stream_user_data(sess, frame->hd.stream_id);
        if (st && st->c) {
            st->flags |= S_LOCAL_END;
            if (st->flags & S_DISCARD)
                reset_stream(st, NGHTTP2_NO_ERROR);
        }
    }
    return 0;
}

/* ---- the connection ---- */

static void conn_close(struct h2conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    struct h2front *hf = c->hf;
    while (c->streams)
        stream_gone(c->streams, true);
    nghttp2_session_del(c->sess);
    loop_watch_del(hf->loop, &c->watch);
    loop_timer_stop(hf->loop, &c->flush_t);
    loop_timer_stop(hf->loop, &c->idle_t);
    close(c->fd);
    free(c->out);
    hlist_free(&c->head.fields);
    free(c->head.path);
    DLIST_UNLINK(hf->conns, c);
    hf->n--;
    loop_defer_free(hf->loop, c); /* its watch may have an event in this turn */
    if (hf->closed)
        hf->closed(hf->arg);
}

static void on_linger(struct loop_timer *t)
{
    conn_close(t->arg);
}

/* Serialises frames into the output buffer and writes it: 0 all written, 1 the socket is
 * full, -1 the connection is broken. */
static int write_out(struct h2conn *c)
{
    for (;;) {
        if (c->pend_len && c->out_len + c->pend_len <= H2_OUT_CAP) {
            memcpy(c->out + c->out_len, c->pend, c->pend_len);
            c->out_len += c->pend_len;
            c->pend_len = 0;
        }
        while (!c->pend_len && c->out_len < H2_OUT_CAP) {
            const uint8_t *p;
            ssize_t n = nghttp2_session_mem_send(c->sess, &p);
            if (n < 0)
                return -1;
            if (n == 0)
                break;
            if (c->out_len + (size_t)n <= H2_OUT_CAP) {
                memcpy(c->out + c->out_len, p, (size_t)n);
                c->out_len += (size_t)n;
            } else {
                c->pend = p; /* valid until the next nghttp2_session_mem_send() */
                c->pend_len = (size_t)n;
            }
        }
        if (!c->out_len)
            return 0;
        ssize_t w = send(c->fd, c->out, c->out_len, MSG_NOSIGNAL);
        if (w < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 1 : -1;
        c->last_io = loop_now(c->hf->loop);
        memmove(c->out, c->out + w, c->out_len - (size_t)w);
        c->out_len -= (size_t)w;
        if (c->out_len)
            return 1;
    }
}

/* Everything the connection has to do outside nghttp2's callbacks: uploads the core takes
 * again, a GOAWAY while draining, the frames to write; closes it when the session is over. */
static void progress(struct h2conn *c)
{
    if (c->closing)
        return;
    for (struct h2stream *st = c->streams, *next; st; st = next) {
        next = st->next;
        if (st->flags & S_ROOM)
            drain_upload(st);
    }
    if (c->hf->draining && !c->goaway) {
        c->goaway = true;
        nghttp2_submit_goaway(c->sess, NGHTTP2_FLAG_NONE,
                              nghttp2_session_get_last_proc_stream_id(c->sess), NGHTTP2_NO_ERROR,
                              NULL, 0);
    }
    if (c->linger)
        return;
    int rv = write_out(c);
    if (rv == 0 && c->fatal) {
        c->linger = true;
        shutdown(c->fd, SHUT_WR);
        loop_timer_start(c->hf->loop, &c->idle_t, loop_now(c->hf->loop) + H2_LINGER_MS, on_linger,
                         c);
        loop_watch_mod(c->hf->loop, &c->watch, EPOLLIN);
        return;
    }
    if (rv < 0 ||
        (rv == 0 && !nghttp2_session_want_read(c->sess) && !nghttp2_session_want_write(c->sess))) {
        conn_close(c);
        return;
    }
    loop_watch_mod(c->hf->loop, &c->watch, EPOLLIN | (rv ? EPOLLOUT : 0u));
}

static void on_flush(struct loop_timer *t)
{
    progress(t->arg);
}

static void on_io(struct loop_watch *w, uint32_t events)
{
    struct h2conn *c = w->arg;
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        uint8_t buf[H2_READ];
        for (int i = 0; i < H2_READS_PER_IO; i++) {
            ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                break;
            if (n <= 0) {
                conn_close(c); /* the client went: its streams are completed */
                return;
            }
            if (c->fatal)
                continue; /* the session is over: read away */
            c->last_io = loop_now(c->hf->loop);
            ssize_t rv = nghttp2_session_mem_recv(c->sess, buf, (size_t)n);
            if (rv < 0) {
                /* a connection error nghttp2 did not answer itself (a flood, a bad preface):
                 * GOAWAY with the reason, then close */
                terminate(c, rv == NGHTTP2_ERR_FLOODED || rv == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS
                                 ? NGHTTP2_ENHANCE_YOUR_CALM
                                 : NGHTTP2_PROTOCOL_ERROR);
                break;
            }
            if ((size_t)n < sizeof(buf))
                break;
        }
    }
    progress(c);
}

/* Idle: nothing in or out for limits.connection_timeout_ms. A connection with no stream, or
 * with a stream that waits on the client (its upload, or a response it does not read), is
 * closed (GOAWAY); one whose streams all wait on the upstream side is left to their
 * deadlines. */
static void on_idle(struct loop_timer *t)
{
    struct h2conn *c = t->arg;
    struct loop *l = c->hf->loop;
    uint64_t now = loop_now(l);
    if (now - c->last_io >= c->lim.idle_ms) {
        bool on_client = c->n_streams == 0 || c->out_len || c->pend_len;
        for (struct h2stream *st = c->streams; st && !on_client; st = st->next)
            on_client = !(st->flags & S_REMOTE_END) || st->down.len ||
                        (st->body && st->body_off < st->body_len);
        if (on_client) {
            terminate(c, NGHTTP2_NO_ERROR);
            c->last_io = now;
        }
    }
    loop_timer_start(l, &c->idle_t,
                     (now - c->last_io >= c->lim.idle_ms ? now : c->last_io) + c->lim.idle_ms,
                     on_idle, c);
}

int h2front_open(struct h2front *hf, int fd, const char *peer, const struct h2front_limits *lim)
{
    struct loop *l = hf->loop;
    struct h2conn *c = calloc(1, sizeof(*c));
    if (!c || !(c->out = malloc(H2_OUT_CAP)) ||
        nghttp2_session_server_new2(&c->sess, hf->cbs, c, hf->opt) != 0) {
        if (c)
            free(c->out);
        free(c);
        close(fd);
        return -1;
    }
    c->hf = hf;
    c->fd = fd;
    c->lim = *lim;
    snprintf(c->peer, sizeof(c->peer), "%s", peer);
    c->resets = H2_RESET_BURST;
    c->reset_ms = c->last_io = loop_now(l);
    c->watch.fd = -1;
    nghttp2_settings_entry iv[] = {
        { NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, H2_MAX_STREAMS },
        { NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, H2_STREAM_WINDOW },
        { NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, lim->max_header_bytes },
    };
    if (nghttp2_submit_settings(c->sess, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0])) ||
        nghttp2_session_set_local_window_size(c->sess, NGHTTP2_FLAG_NONE, 0, H2_CONN_WINDOW) ||
        loop_watch_add(l, &c->watch, fd, EPOLLIN, on_io, c) < 0) {
        nghttp2_session_del(c->sess);
        free(c->out);
        free(c);
        close(fd);
        return -1;
    }
    DLIST_PUSH(hf->conns, c);
    hf->n++;
    loop_timer_start(l, &c->idle_t, c->last_io + lim->idle_ms, on_idle, c);
    on_io(&c->watch, EPOLLIN); /* the preface is there already */
    return 0;
}

unsigned h2front_count(const struct h2front *hf)
{
    return hf->n;
}

void h2front_drain(struct h2front *hf)
{
    hf->draining = true;
    for (struct h2conn *c = hf->conns; c; c = c->next)
        schedule(c);
}

struct h2front *h2front_new(struct worker *w, struct loop *l, void (*closed)(void *arg), void *arg)
{
    struct h2front *hf = calloc(1, sizeof(*hf));
    if (!hf)
        return NULL;
    hf->w = w;
    hf->loop = l;
    hf->closed = closed;
    hf->arg = arg;
    if (nghttp2_session_callbacks_new(&hf->cbs) || nghttp2_option_new(&hf->opt)) {
        h2front_free(hf);
        return NULL;
    }
    nghttp2_session_callbacks *cb = hf->cbs;
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
    /* uploads are given window as the core takes them, not as they arrive */
    nghttp2_option_set_no_auto_window_update(hf->opt, 1);
    nghttp2_option_set_stream_reset_rate_limit(hf->opt, H2_RESET_BURST, H2_RESET_RATE);
    nghttp2_option_set_max_continuations(hf->opt, H2_CONTINUATIONS);
    return hf;
}

void h2front_free(struct h2front *hf)
{
    if (!hf)
        return;
    hf->closed = NULL;
    while (hf->conns)
        conn_close(hf->conns);
    nghttp2_session_callbacks_del(hf->cbs);
    nghttp2_option_del(hf->opt);
    free(hf);
}
