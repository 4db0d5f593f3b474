/* h2up_conn -- the connections of proxy/upstream/h2up.h: their sessions over
 * proxy/upstream/connect.h's sockets and TLS, timers, and which origin gets which connection (the
 * streams and the session's callbacks are proxy/upstream/h2up.c's).
 *
 * A connection's life: CONNECTING (proxy/upstream/connect.h: bounded by the first stream's connect
 * timeout; its streams are submitted to the session at once and go out when it is open; for
 * an https origin TLS within the same timeout, and ALPN must choose h2), OPEN (bytes
 * in through nghttp2_session_mem_recv, out through nghttp2_session_mem_send into a bounded
 * buffer, EPOLLOUT while the socket is full), then GOAWAY received (no new stream) or idle
 * past H2UP_IDLE_MS, and closed once no stream is left.
 *
 * An https origin whose server chose http/1.1 (or nothing) by ALPN: the connection's streams
 * end H2UP_FALLBACK, nothing sent, and the origin is remembered for H2UP_H1_MEMO_MS so that
 * its next requests go to libcurl at once (docs/http2.md "https upstreams").
 *
 * One state machine with proxy/upstream/h2up.c (the streams): they call each other
 * (proxy/upstream/h2up_int.h).
 */
#include "proxy/upstream/h2up_int.h"

#include <stdatomic.h>
#include <sys/epoll.h>

#include "proxy/upstream/connect.h"
#include "proxy/base/dlist.h"
#include "proxy/base/pool.h"
#include "proxy/upstream/origin.h"

/* Bytes of serialized frames held for a full socket before the session is asked for more. */
#define OUT_SOFT_MAX (64 * 1024)
/* The connection's receive window: every DATA byte is counted consumed on arrival (the
 * streams' own windows do the flow control), so this only sets the pace of WINDOW_UPDATEs. */
#define CONN_WINDOW (16 * 1024 * 1024)
/* Reads per socket event, so one busy connection cannot starve the loop. */
#define READS_PER_EVENT 16

static void on_timer(struct loop_timer *t);

/* ---- life and death ---- */

/* Adds 'delta' to a count only this worker writes (a scrape reads it from another thread). */
static void count(_Atomic int64_t *c, int64_t delta)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + delta,
                          memory_order_relaxed);
}

static void count_opened(struct conn *c, enum metrics_h2up_opened how)
{
    if (c->h->counts)
        count(&c->h->counts->opened[how], 1);
}

void h2c_fail(struct conn *c)
{
    if (c->dead)
        return;
    c->dead = true;
    if (!c->open)
        count_opened(c, c->fell_back ? METRICS_H2UP_HTTP1 : METRICS_H2UP_FAILED);
    for (struct h2up_stream *s = c->streams; s; s = s->next) {
        h2up_closed(s);
        h2up_end_stream(s, (s->flags & SF_SENT) ? H2UP_BROKEN : H2UP_UNSENT, 0);
    }
    nghttp2_session_del(c->s);
    c->s = NULL;
    connector_close(&c->k);
    loop_timer_stop(c->h->loop, &c->timer);
}

void h2c_free(struct conn *c)
{
    struct h2up *h = c->h;
    h2c_fail(c);
    c->pending = c->pending_last = NULL;
    while (c->streams)
        h2up_free_stream(c->streams);
    loop_timer_stop(h->loop, &c->kick);
    DLIST_UNLINK(h->conns, c);
    h->nconns--;
    if (h->counts)
        count(&h->counts->open, -1);
    free(c->key);
    free(c->out.p);
    loop_defer_free(h->loop, c); /* its watch may have an event pending in this turn */
}

/* Sends what the session has: its frames gathered into c->out, up to OUT_SOFT_MAX and a frame,
 * and written in one send, until it has nothing more or the socket is full (then EPOLLOUT).
 * Bytes the socket did not take are offered again from c->out before anything is added to
 * it, unmoved (TLS wants the same bytes again, tls.h). A loop turn's requests, window updates
 * and resets for this connection so go out in one system call (h2c_kick() defers to the end
 * of the turn). */
static void flush(struct conn *c)
{
    if (c->dead || !c->open)
        return;
    for (;;) {
        if (c->out.len) {
            ssize_t n = connector_send(&c->k, c->out.p, c->out.len);
            if (n < 0) {
                if (connector_again())
                    break;
                h2c_fail(c);
                return;
            }
            bytes_drop(&c->out, (size_t)n);
            if (c->out.len)
                continue;
        }
        while (c->out.len < OUT_SOFT_MAX) {
            const uint8_t *d;
            ssize_t n = nghttp2_session_mem_send(c->s, &d);
            if (n < 0) {
                h2c_fail(c);
                return;
            }
            if (n == 0)
                break;
            if (bytes_append(&c->out, d, (size_t)n) < 0) {
                h2c_fail(c);
                return;
            }
        }
        if (!c->out.len)
            break;
    }
    if (!nghttp2_session_want_read(c->s) && !nghttp2_session_want_write(c->s) && !c->out.len) {
        h2c_fail(c); /* both sides are done (a GOAWAY) */
        return;
    }
    if (connector_watch(&c->k, EPOLLIN | (c->out.len ? EPOLLOUT : 0)) < 0)
        h2c_fail(c);
}

static void conn_read(struct conn *c)
{
    uint8_t buf[16 * 1024];
    for (int i = 0; i < READS_PER_EVENT && !c->dead; i++) {
        ssize_t n = connector_recv(&c->k, buf, sizeof(buf));
        if (n < 0 && connector_again())
            return;
        if (n <= 0 || nghttp2_session_mem_recv(c->s, buf, (size_t)n) < 0) {
            h2c_fail(c);
            return;
        }
    }
}

/* The connection can carry HTTP/2 now. */
static void opened(struct conn *c)
{
    c->open = true;
    count_opened(c, METRICS_H2UP_H2);
}

/* Remembers that origin 'key' answers in http/1.1, for H2UP_H1_MEMO_MS. */
static void memo_h1(struct h2up *h, const char *key)
{
    uint64_t now = loop_now(h->loop);
    size_t slot = 0;
    for (size_t i = 0; i < H2UP_H1_MEMO_MAX; i++) {
        if (h->h1[i].key && strcmp(h->h1[i].key, key) == 0) {
            slot = i;
            break;
        }
        if (!h->h1[i].key || h->h1[i].until < h->h1[slot].until)
            slot = i; /* a free one, else the one that expires first */
    }
    char *copy =
        h->h1[slot].key && strcmp(h->h1[slot].key, key) == 0 ? h->h1[slot].key : strdup(key);
    if (!copy)
        return;
    if (copy != h->h1[slot].key)
        free(h->h1[slot].key);
    h->h1[slot].key = copy;
    h->h1[slot].until = now + H2UP_H1_MEMO_MS;
}

bool h2up_prefers_h1(struct h2up *h, const struct origin *o)
{
    if (!o->tls || !o->h1_too)
        return false;
    uint64_t now = loop_now(h->loop);
    for (size_t i = 0; i < H2UP_H1_MEMO_MAX; i++)
        if (h->h1[i].key && h->h1[i].until > now && strcmp(h->h1[i].key, o->key) == 0)
            return true;
    return false;
}

/* Connected: h2 chosen by ALPN (or h2c), or an https server that chose http/1.1. */
static void on_up(void *arg, bool h2)
{
    struct conn *c = arg;
    if (!h2 && c->k.tls && !c->h1_too) {
        /* on_failed ends the connection */
        connector_refuse(&c->k, "the server did not choose h2 by ALPN (tls.http2 is \"required\")");
        return;
    }
    if (h2 || !c->k.tls) {
        opened(c);
    } else {
        memo_h1(c->h, c->key);
        c->fell_back = true;
        for (struct h2up_stream *s = c->streams; s; s = s->next)
            h2up_end_stream(s, H2UP_FALLBACK, 0); /* none went out: flush() waits for open */
        h2c_fail(c);
    }
    flush(c);
    h2c_settle(c);
}

/* Not connected (proxy/upstream/connect.c logged a TLS failure). */
static void on_failed(void *arg, const char *why)
{
    struct conn *c = arg;
    (void)why;
    h2c_fail(c);
    h2c_settle(c);
}

static void on_io(void *arg, uint32_t events)
{
    struct conn *c = arg;
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP))
        conn_read(c);
    flush(c);
    h2c_settle(c);
}

static const struct connector_ops conn_ops = { .up = on_up, .failed = on_failed, .io = on_io };

/* The idle timeout. */
static void on_timer(struct loop_timer *t)
{
    struct conn *c = t->arg;
    if (c->open && c->nstreams)
        return; /* busy again */
    h2c_fail(c);
    h2c_settle(c);
}

static void on_kick(struct loop_timer *t)
{
    struct conn *c = t->arg;
    flush(c);
    h2c_settle(c);
}

void h2c_kick(struct conn *c)
{
    if (!loop_timer_armed(&c->kick))
        loop_timer_start(c->h->loop, &c->kick, loop_now(c->h->loop), on_kick, c);
}

/* After the session has run, for each stream with something to do (h2up_pending()): kept body
 * bytes go to an owner with room, an end is reported (its owner may start and cancel streams,
 * which join the list: nothing here holds a pointer across a report), a stream the session is
 * done with and that has no owner is freed; then an empty dead connection goes. */
void h2c_settle(struct conn *c)
{
    struct h2up_stream *s;
    while ((s = c->pending)) {
        c->pending = s->pending_next;
        if (!c->pending)
            c->pending_last = NULL;
        s->pending = false;
        if (s->ops && s->kept.len && !(s->flags & SF_PAUSED))
            h2up_drain_kept(s);
        /* an owner still has body bytes to take: reported once it took them (resume) */
        if (s->ops && (s->flags & SF_ENDED) && !(s->end == H2UP_COMPLETE && s->kept.len)) {
            const struct h2up_ops *ops = s->ops;
            s->ops = NULL;
            ops->done(s->arg, s->end, s->error);
        }
        if (!s->ops && (s->flags & SF_CLOSED) && !s->pending)
            h2up_free_stream(s);
    }
    if (c->dead) {
        if (!c->streams)
            h2c_free(c);
        return;
    }
    flush(c); /* window updates, resets and requests the reports brought */
    if (c->dead) {
        h2c_settle(c);
        return;
    }
    if (!c->nstreams && c->open && !loop_timer_armed(&c->timer))
        loop_timer_start(c->h->loop, &c->timer, loop_now(c->h->loop) + H2UP_IDLE_MS, on_timer, c);
    if (c->goaway && !c->nstreams) {
        if (c->leaving && c->open && c->s) {
            /* our own GOAWAY first: the upstream sees the session end, not a dropped socket */
            nghttp2_submit_goaway(c->s, NGHTTP2_FLAG_NONE, 0, NGHTTP2_NO_ERROR, NULL, 0);
            flush(c);
        }
        h2c_fail(c);
        h2c_free(c);
    }
}

void h2up_leave(struct h2up *h, const struct origin *o)
{
    for (struct conn *c = h->conns, *next; c; c = next) {
        next = c->next;
        if (c->dead || strcmp(c->key, o->key) != 0)
            continue;
        c->goaway = c->leaving = true; /* no new stream; closed once its streams ended */
        h2c_kick(c);
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
    connector_init(&c->k);
    nghttp2_session_callbacks *cb = h2up_callbacks();
    nghttp2_option *opt = NULL;
    if (!cb || nghttp2_option_new(&opt) != 0 || !(c->key = strdup(o->key)))
        goto fail;
    c->h1_too = o->tls && o->h1_too; /* an https origin: TLS first, ALPN must choose h2 */
    /* Only a stream's own window closes while its owner is paused (on_data). */
    nghttp2_option_set_no_auto_window_update(opt, 1);
    nghttp2_option_set_peer_max_concurrent_streams(opt, H2UP_MAX_STREAMS);
    if (nghttp2_session_client_new3(&c->s, cb, c, opt, &h->mem) != 0) {
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
    if (connector_start(&c->k, h->side, o, c->h1_too ? TLS_ALPN_H2_H1 : TLS_ALPN_H2, timeout_ms,
                        &conn_ops, c) < 0)
        goto fail;
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    DLIST_PUSH(h->conns, c);
    h->nconns++;
    if (h->counts)
        count(&h->counts->open, 1);
    return c;
fail:
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
struct conn *h2c_pick(struct h2up *h, const struct origin *o, uint64_t timeout_ms)
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
