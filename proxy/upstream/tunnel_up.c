/* tunnel_up -- an upgrade's attempt on its own connection (proxy/upstream/tunnel_up.h).
 *
 *   CONNECTING (and TLS) --> SENDING --> HEAD --101 taken over--> HANDED: the tunnel's, whose
 *                                          |                      bytes go through the connector
 *                                          |
 *                                          +--another final status--> BODY --> done
 *
 * Every failure before a byte of the request went is UNSENT (a connect failure to the retry
 * policy); after it, BROKEN (a reset). CONNECTING is proxy/upstream/connect.h's, within the connect
 * timeout; the owner's timers bound the rest.
 */
#include "proxy/upstream/tunnel_up.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "proxy/upstream/connect.h"
#include "proxy/upstream/h1resp.h"
#include "proxy/http/hlist.h"
#include "proxy/http/headers.h"
#include "proxy/base/loop.h"
#include "proxy/upstream/origin.h"
#include "proxy/base/ring.h"

/* The most of a response head (and what is read past it) held at once. */
#define IN_MAX (64 * 1024)
/* A chunk-size line longer than this is malformed (its extensions are not read). */
#define CHUNK_LINE_MAX 1024

enum tu_state { TU_CONNECTING, TU_SENDING, TU_HEAD, TU_BODY, TU_HANDED };
enum tu_framing { TF_NONE, TF_LENGTH, TF_CHUNKED, TF_CLOSE };
enum tu_chunk { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER };

struct tunnel_up {
    struct loop *loop;
    const struct tunnel_up_ops *ops;
    void *arg;
    enum tu_state state;
    struct connector k; /* the socket and TLS (proxy/upstream/connect.h) */
    char *out;          /* the request head */
    size_t out_len, out_off;
    uint64_t *bytes_sent;
    struct ring in;
    struct h1resp resp; /* the response head's parser */
    struct hlist *head; /* ... and its fields (the owner's) */
    bool paused, eof;   /* the owner has no room; the upstream closed */
    enum tu_framing framing;
    enum tu_chunk chunk;
    uint64_t left; /* TF_LENGTH, CH_DATA: bytes of the body (chunk) still to come */
    void (*io)(void *arg, uint32_t events); /* TU_HANDED: the data phase's owner */
    void *io_arg;
};

/* ---- life and death ---- */

void tunnel_up_free(struct tunnel_up *u)
{
    if (!u)
        return;
    connector_close(&u->k);
    free(u->out);
    ring_free(&u->in);
    loop_defer_free(u->loop, u); /* its watch may have an event pending in this turn */
}

void tunnel_up_cancel(struct tunnel_up *u)
{
    tunnel_up_free(u);
}

/* The attempt is over: the owner hears it last, and 'u' is gone. */
static void finish(struct tunnel_up *u, enum tunnel_up_end end)
{
    const struct tunnel_up_ops *ops = u->ops;
    void *arg = u->arg;
    if (end == TUNNEL_UP_BROKEN && !tunnel_up_sent(u))
        end = TUNNEL_UP_UNSENT;
    tunnel_up_free(u);
    ops->done(arg, end);
}

/* ---- the request ---- */

static bool put(char **b, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n > *cap) {
        size_t c = *cap ? *cap * 2 : 1024;
        while (c < *len + n)
            c *= 2;
        char *nb = realloc(*b, c);
        if (!nb)
            return false;
        *b = nb;
        *cap = c;
    }
    memcpy(*b + *len, p, n);
    *len += n;
    return true;
}

#define PUTS(s) put(&b, &len, &cap, s, strlen(s))

/* The head as libcurl would write it from the same fields, the attempt's own first; Host from
 * the origin unless the request has it (preserve_host); Connection and Upgrade put back. */
static bool build_head(struct tunnel_up *u, const struct tunnel_up_req *req)
{
    char *b = NULL;
    size_t len = 0, cap = 0;
    bool ok = PUTS(req->method) && PUTS(" ") && PUTS(req->target) && PUTS(" HTTP/1.1\r\n");
    bool host = false;
    for (size_t i = 0; ok && i < req->n_own; i++)
        ok = put(&b, &len, &cap, req->own[i].name, req->own[i].name_len) && PUTS(": ") &&
             put(&b, &len, &cap, req->own[i].value, req->own[i].value_len) && PUTS("\r\n");
    size_t pos = 0;
    const char *k, *v;
    while (ok && req->fields && hlist_next(req->fields, &pos, &k, &v)) {
        size_t vl = strlen(v);
        hdr_trim(v, &vl);
        if (*v && !vl)
            continue; /* blanks alone, which libcurl leaves out too */
        host |= hdr_name_eq(k, "Host");
        ok = PUTS(k) && PUTS(*v ? ": " : ":") && PUTS(v) && PUTS("\r\n");
    }
    if (ok && !host)
        ok = PUTS("Host: ") && PUTS(req->o->authority) && PUTS("\r\n");
    ok = ok && PUTS("Connection: upgrade\r\nUpgrade: ") && PUTS(req->upgrade) && PUTS("\r\n\r\n");
    if (!ok) {
        free(b);
        return false;
    }
    u->out = b;
    u->out_len = len;
    return true;
}

bool tunnel_up_sent(const struct tunnel_up *u)
{
    return u->out_off > 0;
}

/* ---- the response ---- */

/* What a final head says of its body: none, chunked, a length, or to the close (the parser
 * refused every ambiguous head: one length at most, "chunked" the only transfer coding). */
static void frame(struct tunnel_up *u)
{
    int status = u->resp.status;
    int64_t length = hlist_content_length(u->head);
    if (u->resp.no_body || status == 204 || status == 304)
        u->framing = TF_NONE;
    else if (hlist_get(u->head, "Transfer-Encoding"))
        u->framing = TF_CHUNKED;
    else if (length >= 0)
        u->framing = length ? TF_LENGTH : TF_NONE;
    else
        u->framing = TF_CLOSE;
    u->left = length > 0 ? (uint64_t)length : 0;
    u->chunk = CH_SIZE;
}

/* One line of a head (at in.buf + in.start, 'len' bytes with its LF). False: the attempt is
 * over (finished, or handed over). */
static bool head_line(struct tunnel_up *u, const char *b, size_t len)
{
    enum h1resp_step st = h1resp_line(&u->resp, u->head, u->head, b, len);
    if (st == H1RESP_ABORT) {
        finish(u, u->resp.bad ? TUNNEL_UP_BAD_HEAD : TUNNEL_UP_BROKEN);
        return false;
    }
    ring_drop(&u->in, len);
    if (st == H1RESP_MORE)
        return true; /* a line of the head, or the end of an interim one */
    u->ops->head(u->arg, u->resp.status);
    if (u->state == TU_HANDED) {
        /* the 101 was taken: the rest of the buffer is the tunnel's */
        const struct tunnel_up_ops *ops = u->ops;
        void *arg = u->arg;
        connector_unwatch(&u->k);
        ops->done(arg, TUNNEL_UP_COMPLETE);
        return false;
    }
    if (u->resp.status == 101) {
        finish(u, TUNNEL_UP_BROKEN); /* a 101 the owner did not take */
        return false;
    }
    frame(u);
    u->state = TU_BODY;
    return true;
}

/* Hands body bytes over: how many were taken; 0 with u->paused set, or -1 when the owner
 * stopped the transfer (then it is finished). */
static ssize_t deliver(struct tunnel_up *u, const char *p, size_t n)
{
    if (!n)
        return 0;
    size_t took = u->ops->body(u->arg, p, n);
    if (took == TUNNEL_UP_PAUSE) {
        u->paused = true;
        return 0;
    }
    if (took == 0) {
        finish(u, TUNNEL_UP_STOPPED);
        return -1;
    }
    return (ssize_t)took;
}

/* One step of a chunked body over the buffered bytes. 1: go on; 0: more bytes are needed
 * (or the owner paused); -1: finished. */
static int chunk_step(struct tunnel_up *u, const char *p, size_t n)
{
    const char *lf = u->chunk != CH_DATA ? memchr(p, '\n', n) : NULL;
    if (u->chunk != CH_DATA && !lf) {
        if (n > CHUNK_LINE_MAX || (u->chunk == CH_TRAILER && n >= IN_MAX))
            goto bad;
        return 0;
    }
    size_t line = lf ? (size_t)(lf - p) + 1 : 0;
    switch (u->chunk) {
    case CH_SIZE: {
        uint64_t size = 0;
        size_t i = 0;
        for (; i < line; i++) {
            char c = p[i];
            int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
            if (d < 0)
                break;
            if (size >> 56)
                goto bad;
            size = size * 16 + (uint64_t)d;
        }
        if (i == 0 || (p[i] != ';' && p[i] != '\r' && p[i] != '\n'))
            goto bad;
        ring_drop(&u->in, line);
        u->left = size;
        u->chunk = size ? CH_DATA : CH_TRAILER;
        return 1;
    }
    case CH_DATA: {
        ssize_t took = deliver(u, p, n < u->left ? n : (size_t)u->left);
        if (took < 0)
            return -1;
        if (took == 0)
            return 0;
        ring_drop(&u->in, (size_t)took);
        u->left -= (uint64_t)took;
        if (!u->left)
            u->chunk = CH_DATA_END;
        return 1;
    }
    case CH_DATA_END:
        if (!(line == 2 && p[0] == '\r') && line != 1)
            goto bad;
        ring_drop(&u->in, line);
        u->chunk = CH_SIZE;
        return 1;
    case CH_TRAILER:
        /* trailer fields are not relayed to an HTTP/1.1 client (proxy/http1/relay.c): dropped */
        ring_drop(&u->in, line);
        if (line <= 2 && (p[0] == '\r' || p[0] == '\n')) {
            finish(u, TUNNEL_UP_COMPLETE);
            return -1;
        }
        return 1;
    }
bad:
    finish(u, TUNNEL_UP_BROKEN);
    return -1;
}

/* Works through the buffered bytes. False: the attempt is over. */
static bool consume(struct tunnel_up *u)
{
    while (!u->paused) {
        const char *p = u->in.buf + u->in.start;
        size_t n = u->in.len;
        if (u->state == TU_HEAD) {
            const char *lf = n ? memchr(p, '\n', n) : NULL;
            if (!lf) {
                if (n >= IN_MAX || u->eof) {
                    finish(u, TUNNEL_UP_BROKEN); /* too large, or cut short */
                    return false;
                }
                return true;
            }
            if (!head_line(u, p, (size_t)(lf - p) + 1))
                return false;
            continue;
        }
        if (u->framing == TF_NONE) {
            finish(u, TUNNEL_UP_COMPLETE);
            return false;
        }
        if (u->framing == TF_CHUNKED) {
            int r = n ? chunk_step(u, p, n) : 0;
            if (r < 0)
                return false;
            if (r == 0) {
                if (u->eof && !u->paused) {
                    finish(u, TUNNEL_UP_BROKEN);
                    return false;
                }
                return true;
            }
            continue;
        }
        size_t want = u->framing == TF_LENGTH && u->left < n ? (size_t)u->left : n;
        ssize_t took = deliver(u, p, want);
        if (took < 0)
            return false;
        ring_drop(&u->in, (size_t)took);
        if (u->framing == TF_LENGTH) {
            u->left -= (uint64_t)took;
            if (!u->left) {
                finish(u, TUNNEL_UP_COMPLETE);
                return false;
            }
        }
        if (took == 0 || !u->in.len) {
            if (u->eof && !u->paused) {
                finish(u, u->framing == TF_CLOSE ? TUNNEL_UP_COMPLETE : TUNNEL_UP_BROKEN);
                return false;
            }
            return true;
        }
    }
    return true;
}

/* Reads what the socket has (while there is room and the owner takes bytes), then works
 * through it. */
static void read_some(struct tunnel_up *u)
{
    for (int i = 0; i < 16 && !u->eof && !u->paused && ring_space(&u->in); i++) {
        char buf[16 * 1024];
        size_t room = ring_space(&u->in) < sizeof(buf) ? ring_space(&u->in) : sizeof(buf);
        ssize_t n = connector_recv(&u->k, buf, room);
        if (n < 0 && connector_again())
            break;
        if (n < 0) {
            finish(u, TUNNEL_UP_BROKEN);
            return;
        }
        if (n == 0)
            u->eof = true;
        else if (ring_put(&u->in, buf, (size_t)n) < 0) {
            finish(u, TUNNEL_UP_BROKEN);
            return;
        }
        if (!consume(u))
            return;
    }
    if (!consume(u))
        return;
    if (connector_watch(&u->k, u->paused || u->eof ? 0 : EPOLLIN) < 0)
        finish(u, TUNNEL_UP_BROKEN);
}

void tunnel_up_resume(struct tunnel_up *u)
{
    if (!u->paused || u->state != TU_BODY)
        return;
    u->paused = false;
    read_some(u);
}

/* ---- connecting and sending ---- */

static void send_head(struct tunnel_up *u)
{
    while (u->out_off < u->out_len) {
        ssize_t n = connector_send(&u->k, u->out + u->out_off, u->out_len - u->out_off);
        if (n < 0 && connector_again()) {
            if (connector_watch(&u->k, EPOLLOUT) < 0)
                finish(u, TUNNEL_UP_BROKEN);
            return;
        }
        if (n <= 0) {
            finish(u, TUNNEL_UP_BROKEN);
            return;
        }
        u->out_off += (size_t)n;
        if (u->bytes_sent)
            *u->bytes_sent += (uint64_t)n;
    }
    free(u->out);
    u->out = NULL;
    u->state = TU_HEAD;
    read_some(u);
}

static void on_up(void *arg, bool h2)
{
    struct tunnel_up *u = arg;
    (void)h2; /* http/1.1 was the only offer */
    u->state = TU_SENDING;
    send_head(u);
}

/* Not connected (proxy/upstream/connect.c logged a TLS failure). */
static void on_failed(void *arg, const char *why)
{
    (void)why;
    finish(arg, TUNNEL_UP_UNSENT);
}

static void on_io(void *arg, uint32_t events)
{
    struct tunnel_up *u = arg;
    switch (u->state) {
    case TU_SENDING:
        send_head(u);
        break;
    case TU_HEAD:
    case TU_BODY:
        read_some(u);
        break;
    case TU_HANDED:
        if (u->io)
            u->io(u->io_arg, events); /* the data phase's owner */
        break;
    case TU_CONNECTING:
        break;
    }
}

static const struct connector_ops tu_ops = { .up = on_up, .failed = on_failed, .io = on_io };

struct tunnel_up *tunnel_up_start(struct connect_side *cs, const struct tunnel_up_req *req,
                                  const struct tunnel_up_ops *ops, void *arg)
{
    const struct origin *o = req->o;
    if (!o || !o->addr_len)
        return NULL; /* a name that did not resolve */
    struct tunnel_up *u = calloc(1, sizeof(*u));
    if (!u)
        return NULL;
    u->loop = cs->loop;
    u->ops = ops;
    u->arg = arg;
    connector_init(&u->k);
    h1resp_start(&u->resp, req->upgrade, req->no_body);
    u->head = req->head;
    u->bytes_sent = req->bytes_sent;
    u->in.max = IN_MAX;
    if (!build_head(u, req) ||
        connector_start(&u->k, cs, o, TLS_ALPN_H1, req->connect_timeout_ms, &tu_ops, u) < 0) {
        free(u->out);
        free(u);
        return NULL;
    }
    return u;
}

/* ---- the handover ---- */

void tunnel_up_handover(struct tunnel_up *u)
{
    u->state = TU_HANDED;
}

const char *tunnel_up_rest(const struct tunnel_up *u, size_t *len)
{
    *len = u->in.len;
    return u->in.buf ? u->in.buf + u->in.start : "";
}

/* ---- the data phase ---- */

int tunnel_up_attach(struct tunnel_up *u, void (*io)(void *arg, uint32_t events), void *arg)
{
    u->io = io;
    u->io_arg = arg;
    return connector_rewatch(&u->k, EPOLLIN) < 0 ? -1 : 0;
}

int tunnel_up_watch(struct tunnel_up *u, uint32_t ev)
{
    return connector_watch(&u->k, ev) < 0 ? -1 : 0;
}

ssize_t tunnel_up_recv(struct tunnel_up *u, void *p, size_t n)
{
    return connector_recv(&u->k, p, n);
}

ssize_t tunnel_up_send(struct tunnel_up *u, const void *p, size_t n)
{
    return connector_send(&u->k, p, n);
}

int tunnel_up_shut_write(struct tunnel_up *u)
{
    if (u->k.tls)
        return -1;
    shutdown(u->k.fd, SHUT_WR); /* a connection already broken says so on its next read */
    return 0;
}
