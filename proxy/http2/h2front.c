/* h2front -- the HTTP/2 front end's connections (proxy/http2/h2front.h): a libnghttp2 server
 * session per client connection in the worker's loop, its bytes, flow control and limits. The
 * streams are proxy/http2/h2stream.c's; the two are one state machine, a connection's and its
 * streams' (they call each other through proxy/http2/h2int.h).
 */
#include "proxy/http2/h2front.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "proxy/base/dlist.h"
#include "proxy/base/pool.h"
#include "proxy/http2/h2int.h"
#include "proxy/core/retry.h"

static void on_flush(struct loop_timer *t);

/* Has the connection's work (progress()) done at the end of this loop turn, outside of
 * nghttp2's callbacks and of the core's calls. */
void h2c_schedule(struct h2conn *c)
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
    h2c_schedule(c);
}

/* One stream reset the client caused: its own, or ours because of what it sent. */
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

void h2c_reset_stream(struct h2stream *st, uint32_t code)
{
    if (!st->c || (st->flags & S_RESET))
        return;
    st->flags |= S_RESET;
    nghttp2_submit_rst_stream(st->c->sess, NGHTTP2_FLAG_NONE, st->id, code);
    h2c_schedule(st->c);
}

/* ---- the end of a stream ---- */

/* The stream is over for the client side: closed by both ends, reset by either, or its
 * connection went ('gone': not a normal end). */
static void stream_gone(struct h2stream *st, bool gone)
{
    struct h2conn *c = st->c;
    DLIST_UNLINK(c->streams, st);
    c->n_streams--;
    h2s_gone(st);
    if (st->flags & S_FULL)
        c->full--;
    st->c = NULL;
    st->f.share = NULL; /* a later attempt is bounded by the worker's slots alone */
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
    bool reset =
        frame->hd.type == NGHTTP2_RST_STREAM && frame->rst_stream.error_code != NGHTTP2_NO_ERROR;
    bool end = (frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
               (frame->hd.flags & NGHTTP2_FLAG_END_STREAM);
    if (!reset && !end)
        return 0;
    struct h2stream *st = nghttp2_session_get_stream_user_data(sess, frame->hd.stream_id);
    /* resets nghttp2 makes (a stream breaking HTTP/2's rules) are the client's doing; those of
     * an upstream breaking off or a deadline are not (S_NO_BLAME) */
    if (reset && !(st && (st->flags & S_NO_BLAME)))
        count_reset(c);
    if (end && st && st->c)
        h2s_local_end(st);
    return 0;
}

static void on_tail(struct loop_timer *t)
{
    struct h2conn *c = t->arg;
    uint64_t now = loop_now(c->hf->loop), next = 0;
    for (struct h2stream *st = c->streams, *n; st; st = n) {
        n = st->next;
        if ((st->flags & (S_LOCAL_END | S_REMOTE_END | S_RESET)) != S_LOCAL_END)
            continue;
        if (now - st->local_end_ms >= H2_TAIL_MS)
            h2c_reset_stream(st, NGHTTP2_NO_ERROR); /* RFC 9113 8.1: it may stop sending */
        else if (!next || st->local_end_ms + H2_TAIL_MS < next)
            next = st->local_end_ms + H2_TAIL_MS;
    }
    if (next)
        loop_timer_start(c->hf->loop, t, next, on_tail, c);
}

void h2c_tail(struct h2conn *c, struct h2stream *st)
{
    struct loop *l = c->hf->loop;
    st->local_end_ms = loop_now(l);
    if (!c->closing && !loop_timer_armed(&c->tail_t))
        loop_timer_start(l, &c->tail_t, st->local_end_ms + H2_TAIL_MS, on_tail, c);
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
    share_unref(c->share); /* attempts that still hold its slots keep it */
    loop_watch_del(hf->loop, &c->watch);
    loop_timer_stop(hf->loop, &c->flush_t);
    loop_timer_stop(hf->loop, &c->idle_t);
    loop_timer_stop(hf->loop, &c->tail_t);
    close(c->fd);
    free(c->out);
    hlist_free(&c->head.fields);
    free(c->head.path);
    free(c->head.cookie);
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
    if (c->room) {
        c->room = false; /* set again by a stream given room meanwhile, for the next turn */
        for (struct h2stream *st = c->streams, *next; st; st = next) {
            next = st->next;
            if (st->flags & S_ROOM)
                h2s_drain_upload(st);
        }
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
            /* the frames the guard refuses never reach the session, nor what follows them */
            size_t ok = h2guard_scan(&c->guard, buf, (size_t)n, c->last_io);
            ssize_t rv = ok ? nghttp2_session_mem_recv(c->sess, buf, ok) : 0;
            if (rv < 0 || c->guard.why) {
                /* a connection error nghttp2 did not answer itself (a flood, a bad preface),
                 * or the guard's: GOAWAY with the reason, then close */
                terminate(c, c->guard.why ? c->guard.why
                             : rv == NGHTTP2_ERR_FLOODED || rv == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS
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

int h2front_open(struct h2front *hf, int fd, const char *peer, unsigned peer_port,
                 const struct h2front_limits *lim)
{
    struct loop *l = hf->loop;
    struct h2conn *c = calloc(1, sizeof(*c));
    if (!c || !(c->out = malloc(H2_OUT_CAP)) ||
        nghttp2_session_server_new3(&c->sess, hf->cbs, c, hf->opt, &hf->mem) != 0) {
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
    c->peer_port = peer_port;
    c->resets = H2_RESET_BURST;
    c->reset_ms = c->last_io = loop_now(l);
    h2guard_init(&c->guard, c->last_io);
    c->share = share_new_conn();
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
        share_unref(c->share);
        free(c->out);
        free(c);
        close(fd);
        return -1;
    }
    DLIST_PUSH(hf->conns, c);
    hf->n++;
    if (lim->idle_ms) /* 0: never */
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
        h2c_schedule(c);
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
    hf->pool = pool_new();
    hf->mem = (nghttp2_mem){ hf->pool, pool_malloc, pool_release, pool_calloc, pool_realloc };
    if (!hf->pool || nghttp2_session_callbacks_new(&hf->cbs) || nghttp2_option_new(&hf->opt)) {
        h2front_free(hf);
        return NULL;
    }
    nghttp2_session_callbacks *cb = hf->cbs;
    nghttp2_session_callbacks_set_on_begin_frame_callback(cb, h2guard_on_begin_frame);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, h2s_on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, h2s_on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, h2s_on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, h2s_on_data);
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
    pool_free(hf->pool); /* after the sessions */
    free(hf);
}

void h2front_trim(struct h2front *hf)
{
    pool_trim(hf->pool);
}
