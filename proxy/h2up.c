/* h2up -- h2c client sessions to upstreams (proxy/h2up.h; docs/http2.md).
 *
 * A connection's life: CONNECTING (non-blocking connect, bounded by the first stream's connect
 * timeout; its streams are submitted to the session at once and go out when it connects),
 * OPEN (bytes in through nghttp2_session_mem_recv, out through nghttp2_session_mem_send into
 * a bounded buffer, EPOLLOUT while the socket is full), then GOAWAY received (no new stream)
 * or idle past H2UP_IDLE_MS, and closed once no stream is left.
 *
 * A stream's life: submitted, HEADERS sent (h2up_sent), head, body, trailers, closed by the
 * session; its end is decided once (end_stream) and reported from settle(), outside
 * libnghttp2. A cancelled stream loses its owner at once and is freed when the session is
 * done with it (or with its connection).
 */
#include "proxy/h2up.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "proxy/dlist.h"
#include "proxy/origin.h"

/* Bytes of serialized frames held for a full socket before the session is asked for more. */
#define OUT_SOFT_MAX (64 * 1024)
/* The connection's receive window: every DATA byte is counted consumed on arrival (the
 * streams' own windows do the flow control), so this only sets the pace of WINDOW_UPDATEs. */
#define CONN_WINDOW (16 * 1024 * 1024)
/* Reads per socket event, so one busy connection cannot starve the loop. */
#define READS_PER_EVENT 16
/* Kept body bytes go to the owner in pieces of at most this. */
#define OFFER_MAX (16 * 1024)

/* A growable byte buffer. */
struct bytes {
    uint8_t *p;
    size_t len, cap;
};

/* Appends n bytes at p. 0, or -1 out of memory. */
static int bytes_append(struct bytes *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 16 * 1024;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q)
            return -1;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

/* Drops the first n bytes. */
static void bytes_drop(struct bytes *b, size_t n)
{
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

struct conn {
    struct conn *prev, *next;
    struct h2up *h;
    char *key;
    int fd;
    struct loop_watch w;
    struct loop_timer timer; /* the connect timeout, then the idle timeout */
    struct loop_timer kick;  /* work submitted from outside an event of this connection */
    nghttp2_session *s;
    struct h2up_stream *streams; /* every stream not yet freed */
    size_t nstreams;
    struct bytes out; /* serialized frames the socket did not take yet */
    bool connected, goaway, dead;
};

struct h2up {
    struct loop *loop;
    struct conn *conns;
    size_t nconns;
};

/* Stream flags, one bit each. */
enum {
    SF_SENT = 1u << 0,        /* its HEADERS went out */
    SF_HEAD = 1u << 1,        /* the final head was reported: later fields are trailers */
    SF_PAUSED = 1u << 2,      /* the owner returned H2UP_PAUSE for body bytes */
    SF_DEFERRED = 1u << 3,    /* the upload waits for the owner */
    SF_ENDED = 1u << 4,       /* its end is decided (reported or to report) */
    SF_CLOSED = 1u << 5,      /* the session is done with it */
    SF_DATA_BUFFER = 1u << 6, /* the body comes from 'buf' */
    SF_DATA_STREAM = 1u << 7, /* the body comes from ops->upload */
};

struct h2up_stream {
    struct h2up_stream *prev, *next; /* in c->streams */
    struct conn *c;
    int32_t id;
    unsigned flags;
    const struct h2up_ops *ops; /* NULL once cancelled or reported */
    void *arg;
    struct hlist *head, *trailers;
    int status;
    enum h2up_end end;
    uint32_t error;
    const char *buf; /* SF_DATA_BUFFER */
    size_t len, off;
    const struct hlist *req_trailers; /* the owner's: sent after the body */
    struct bytes kept; /* body bytes a paused owner has not taken (within the stream's window) */
};

/* ---- streams ---- */

static void kick(struct conn *c);

/* Decides how 's' ended (once). */
static void end_stream(struct h2up_stream *s, enum h2up_end end, uint32_t error)
{
    if (s->flags & SF_ENDED)
        return;
    s->flags |= SF_ENDED;
    s->end = end;
    s->error = error;
}

static bool stopped(const struct h2up_stream *s)
{
    return (s->flags & SF_ENDED) && s->end == H2UP_STOPPED;
}

/* The owner took no bytes: the stream is reset and ends H2UP_STOPPED. */
static void stop(struct h2up_stream *s)
{
    end_stream(s, H2UP_STOPPED, 0);
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
    nghttp2_session_consume_stream(s->c->s, s->id, n);
    return true;
}

/* Kept bytes to an owner that has room again, in pieces no larger than a DATA frame's (an
 * owner's buffer may be smaller than what was kept: libcurl hands 16 KiB at most too). */
static void drain_kept(struct h2up_stream *s)
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

static void free_stream(struct h2up_stream *s)
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

static int on_frame_recv(nghttp2_session *ss, const nghttp2_frame *f, void *ud)
{
    struct conn *c = ud;
    if (f->hd.type == NGHTTP2_GOAWAY) {
        c->goaway = true; /* streams above last_stream_id are closed REFUSED_STREAM by it */
        return 0;
    }
    if (f->hd.type != NGHTTP2_HEADERS)
        return 0;
    struct h2up_stream *s = stream_of(ss, f->hd.stream_id);
    if (!s || !s->ops || (s->flags & SF_HEAD))
        return 0;
    if (s->status < 200)
        return 0; /* interim: the final head follows (no :status is refused by the session) */
    s->flags |= SF_HEAD;
    s->ops->head(s->arg, s->status);
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
    return 0;
}

static int on_stream_close(nghttp2_session *ss, int32_t id, uint32_t error, void *ud)
{
    (void)ud;
    struct h2up_stream *s = stream_of(ss, id);
    if (!s)
        return 0;
    s->flags |= SF_CLOSED;
    if (error == NGHTTP2_NO_ERROR && (s->flags & SF_HEAD))
        end_stream(s, H2UP_COMPLETE, 0);
    else if (!(s->flags & SF_HEAD) && error == NGHTTP2_REFUSED_STREAM)
        end_stream(s, H2UP_REFUSED, error);
    else if (!(s->flags & SF_SENT))
        end_stream(s, H2UP_UNSENT, error);
    else
        end_stream(s, H2UP_BROKEN, error);
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
            s->flags |= SF_CLOSED;
            end_stream(s, H2UP_REFUSED, 0);
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
    nghttp2_nv *nv = calloc(t->count, sizeof(*nv));
    size_t pos = 0, k = 0;
    const char *n, *v;
    while (nv && hlist_next(t, &pos, &n, &v))
        nv[k++] =
            (nghttp2_nv){ (uint8_t *)n, (uint8_t *)v, strlen(n), strlen(v), NGHTTP2_NV_FLAG_NONE };
    /* the session copies them */
    if (nv && nghttp2_submit_trailer(s->c->s, s->id, nv, k) == 0)
        *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
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

static nghttp2_session_callbacks *callbacks(void)
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

/* ---- connections ---- */

static void on_io(struct loop_watch *w, uint32_t events);
static void on_timer(struct loop_timer *t);
static void settle(struct conn *c);

/* The connection is gone (closed, failed, timed out, idle): every stream still running ends,
 * as sent or not, and the socket closes. Its streams are reported by settle(). */
static void conn_fail(struct conn *c)
{
    if (c->dead)
        return;
    c->dead = true;
    for (struct h2up_stream *s = c->streams; s; s = s->next) {
        s->flags |= SF_CLOSED;
        end_stream(s, (s->flags & SF_SENT) ? H2UP_BROKEN : H2UP_UNSENT, 0);
    }
    nghttp2_session_del(c->s);
    c->s = NULL;
    loop_watch_del(c->h->loop, &c->w);
    close(c->fd);
    c->fd = -1;
    loop_timer_stop(c->h->loop, &c->timer);
}

static void conn_free(struct conn *c)
{
    struct h2up *h = c->h;
    conn_fail(c);
    while (c->streams)
        free_stream(c->streams);
    loop_timer_stop(h->loop, &c->kick);
    DLIST_UNLINK(h->conns, c);
    h->nconns--;
    free(c->key);
    free(c->out.p);
    loop_defer_free(h->loop, c); /* its watch may have an event pending in this turn */
}

static int watch_for(struct conn *c, uint32_t ev)
{
    if (c->w.events == ev)
        return 0;
    return loop_watch_mod(c->h->loop, &c->w, ev);
}

/* Sends what the session has, until it has nothing or the socket is full (then EPOLLOUT);
 * what the socket did not take waits in c->out, bounded by OUT_SOFT_MAX plus a frame. */
static void flush(struct conn *c)
{
    if (c->dead || !c->connected)
        return;
    for (;;) {
        if (c->out.len) {
            ssize_t n = send(c->fd, c->out.p, c->out.len, MSG_NOSIGNAL);
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                    break;
                conn_fail(c);
                return;
            }
            bytes_drop(&c->out, (size_t)n);
            if (c->out.len)
                continue;
        }
        const uint8_t *d;
        ssize_t n = nghttp2_session_mem_send(c->s, &d);
        if (n < 0) {
            conn_fail(c);
            return;
        }
        if (n == 0)
            break;
        ssize_t sent = send(c->fd, d, (size_t)n, MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                conn_fail(c);
                return;
            }
            sent = 0;
        }
        if (sent < n && bytes_append(&c->out, d + sent, (size_t)(n - sent)) < 0) {
            conn_fail(c);
            return;
        }
        if (c->out.len >= OUT_SOFT_MAX)
            break;
    }
    if (!nghttp2_session_want_read(c->s) && !nghttp2_session_want_write(c->s) && !c->out.len) {
        conn_fail(c); /* both sides are done (a GOAWAY) */
        return;
    }
    if (watch_for(c, EPOLLIN | (c->out.len ? EPOLLOUT : 0)) < 0)
        conn_fail(c);
}

static void conn_read(struct conn *c)
{
    uint8_t buf[16 * 1024];
    for (int i = 0; i < READS_PER_EVENT && !c->dead; i++) {
        ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (n <= 0 || nghttp2_session_mem_recv(c->s, buf, (size_t)n) < 0) {
            conn_fail(c);
            return;
        }
    }
}

static void connected(struct conn *c)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
        conn_fail(c);
        return;
    }
    c->connected = true;
    loop_timer_stop(c->h->loop, &c->timer);
}

static void on_io(struct loop_watch *w, uint32_t events)
{
    struct conn *c = w->arg;
    if (!c->connected) {
        if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
            connected(c);
    } else if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
        conn_read(c);
    }
    flush(c);
    settle(c);
}

/* The connect timeout, or the idle one. */
static void on_timer(struct loop_timer *t)
{
    struct conn *c = t->arg;
    if (c->connected && c->nstreams)
        return; /* busy again */
    conn_fail(c);
    settle(c);
}

static void on_kick(struct loop_timer *t)
{
    struct conn *c = t->arg;
    flush(c);
    settle(c);
}

/* Work was submitted from outside an event of 'c' (a start, a cancel, a resume): it is done
 * in the next turn, never from inside the caller. */
static void kick(struct conn *c)
{
    if (!loop_timer_armed(&c->kick))
        loop_timer_start(c->h->loop, &c->kick, loop_now(c->h->loop), on_kick, c);
}

/* After the session has run: kept body bytes go to owners with room, ended streams are
 * reported (their owners may start and cancel streams: nothing here holds a pointer across
 * a report), freed when the session is done with them, and an empty dead connection goes. */
static void settle(struct conn *c)
{
    bool again = true;
    while (again) {
        again = false;
        for (struct h2up_stream *s = c->streams; s; s = s->next) {
            if (s->ops && s->kept.len && !(s->flags & SF_PAUSED))
                drain_kept(s);
            if (!s->ops || !(s->flags & SF_ENDED))
                continue;
            if (s->end == H2UP_COMPLETE && s->kept.len)
                continue; /* the owner still has body bytes to take */
            const struct h2up_ops *ops = s->ops;
            s->ops = NULL;
            ops->done(s->arg, s->end, s->error);
            again = true;
            break;
        }
    }
    for (struct h2up_stream *s = c->streams, *next; s; s = next) {
        next = s->next;
        if (!s->ops && (s->flags & SF_CLOSED))
            free_stream(s);
    }
    if (c->dead) {
        if (!c->streams)
            conn_free(c);
        return;
    }
    flush(c); /* window updates, resets and requests the reports brought */
    if (c->dead) {
        settle(c);
        return;
    }
    if (!c->nstreams && c->connected && !loop_timer_armed(&c->timer))
        loop_timer_start(c->h->loop, &c->timer, loop_now(c->h->loop) + H2UP_IDLE_MS, on_timer, c);
    if (c->goaway && !c->nstreams) {
        conn_fail(c);
        conn_free(c);
    }
}

static struct conn *conn_new(struct h2up *h, const struct origin *o, uint64_t timeout_ms)
{
    if (!o->addr_len)
        return NULL;
    struct conn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->h = h;
    c->fd = -1;
    nghttp2_session_callbacks *cb = callbacks();
    nghttp2_option *opt = NULL;
    if (!cb || nghttp2_option_new(&opt) != 0 || !(c->key = strdup(o->key)))
        goto fail;
    /* Only a stream's own window closes while its owner is paused (on_data). */
    nghttp2_option_set_no_auto_window_update(opt, 1);
    nghttp2_option_set_peer_max_concurrent_streams(opt, H2UP_MAX_STREAMS);
    if (nghttp2_session_client_new2(&c->s, cb, c, opt) != 0) {
        c->s = NULL;
        goto fail;
    }
    nghttp2_settings_entry iv[] = {
        { NGHTTP2_SETTINGS_ENABLE_PUSH, 0 },
        { NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, H2UP_STREAM_WINDOW },
    };
    if (nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0])) != 0 ||
        nghttp2_session_set_local_window_size(c->s, NGHTTP2_FLAG_NONE, 0, CONN_WINDOW) != 0)
        goto fail;
    c->fd = socket(o->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        goto fail;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(c->fd, (const struct sockaddr *)&o->addr, o->addr_len) < 0 && errno != EINPROGRESS)
        goto fail;
    if (loop_watch_add(h->loop, &c->w, c->fd, EPOLLOUT, on_io, c) < 0)
        goto fail;
    loop_timer_start(h->loop, &c->timer, loop_now(h->loop) + (timeout_ms ? timeout_ms : 1),
                     on_timer, c);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    DLIST_PUSH(h->conns, c);
    h->nconns++;
    return c;
fail:
    if (c->fd >= 0)
        close(c->fd);
    nghttp2_session_del(c->s);
    nghttp2_option_del(opt);
    if (cb)
        nghttp2_session_callbacks_del(cb);
    free(c->key);
    free(c);
    return NULL;
}

/* Streams 'c' takes at most: the peer's limit and ours. */
static size_t conn_room(const struct conn *c)
{
    uint32_t peer =
        nghttp2_session_get_remote_settings(c->s, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
    return peer < H2UP_MAX_STREAMS ? peer : H2UP_MAX_STREAMS;
}

/* A connection to 'o' with room, else a new one while under H2UP_MAX_CONNS, else the least
 * loaded (the session queues the stream until the peer allows it). */
static struct conn *pick(struct h2up *h, const struct origin *o, uint64_t timeout_ms)
{
    struct conn *least = NULL;
    size_t n = 0;
    for (struct conn *c = h->conns; c; c = c->next) {
        if (c->dead || c->goaway || strcmp(c->key, o->key) != 0)
            continue;
        n++;
        if (c->nstreams < conn_room(c))
            return c;
        if (!least || c->nstreams < least->nstreams)
            least = c;
    }
    if (n < H2UP_MAX_CONNS || !least) {
        struct conn *c = conn_new(h, o, timeout_ms);
        if (c)
            return c;
    }
    return least;
}

/* ---- the API ---- */

struct h2up *h2up_new(struct loop *l)
{
    struct h2up *h = calloc(1, sizeof(*h));
    if (h)
        h->loop = l;
    return h;
}

void h2up_free(struct h2up *h)
{
    if (!h)
        return;
    while (h->conns)
        conn_free(h->conns);
    free(h);
}

struct h2up_stream *h2up_start(struct h2up *h, const struct origin *o, const struct h2up_req *req,
                               uint64_t connect_timeout_ms, const struct h2up_ops *ops, void *arg,
                               struct hlist *head, struct hlist *trailers)
{
    struct conn *c = pick(h, o, connect_timeout_ms);
    if (!c)
        return NULL;
    struct h2up_stream *s = calloc(1, sizeof(*s));
    nghttp2_nv *nv = calloc(req->n_fields + 4, sizeof(*nv));
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
    NV(":scheme", 7, "http", 4);
    NV(":authority", 10, req->authority, strlen(req->authority));
    NV(":path", 5, req->path, strlen(req->path));
    for (size_t i = 0; i < req->n_fields; i++)
        NV(req->fields[i].name, req->fields[i].name_len, req->fields[i].value,
           req->fields[i].value_len);
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
    free(nv);
    nv = NULL;
    if (s->id < 0)
        goto fail;
    DLIST_PUSH(c->streams, s);
    c->nstreams++;
    if (c->connected)
        loop_timer_stop(h->loop, &c->timer); /* the idle timeout */
    kick(c);
    return s;
fail:
    free(nv);
    free(s);
    if (!c->nstreams && !c->connected) {
        conn_fail(c);
        conn_free(c);
    }
    return NULL;
}

void h2up_cancel(struct h2up_stream *s)
{
    struct conn *c = s->c;
    s->ops = NULL;
    s->kept.len = 0;
    if (!(s->flags & SF_CLOSED) && c->s && s->id > 0)
        nghttp2_submit_rst_stream(c->s, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
    kick(c); /* freed by settle() once the session is done with it */
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
    kick(s->c);
}

void h2up_resume_upload(struct h2up_stream *s)
{
    if (!(s->flags & SF_DEFERRED))
        return;
    s->flags &= ~SF_DEFERRED;
    if (s->c->s && !(s->flags & SF_CLOSED))
        nghttp2_session_resume_data(s->c->s, s->id);
    kick(s->c);
}

size_t h2up_connections(const struct h2up *h)
{
    return h->nconns;
}
