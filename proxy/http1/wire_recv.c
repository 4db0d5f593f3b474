/* wire_recv -- the framing check (proxy/http1/wire.h) between the socket and libmicrohttpd: bytes
 * are read, checked by the parser (proxy/http1/wire.c) and handed on once nothing in them can be
 * refused; a refused head is replaced by the stand-in. And wire_run(), a whole byte string
 * through the same path, for the tests and the fuzz target.
 */
#include "proxy/http1/wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/http1/wire_int.h"

/* ---- handing bytes to libmicrohttpd ---- */

static int q_append(struct wire *w, const char *p, size_t n)
{
    if (w->q_off == w->q_len)
        w->q_off = w->q_len = 0;
    char *b = realloc(w->q, w->q_len + n);
    if (!b)
        return -1;
    memcpy(b + w->q_len, p, n);
    w->q = b;
    w->q_len += n;
    return 0;
}

/* Copies queued bytes into buf[*out..len). */
static void q_flush(struct wire *w, char *buf, size_t len, size_t *out)
{
    size_t k = w->q_len - w->q_off;
    if (k > len - *out)
        k = len - *out;
    memcpy(buf + *out, w->q + w->q_off, k);
    w->q_off += k;
    *out += k;
    if (w->q_off == w->q_len) {
        free(w->q);
        w->q = NULL;
        w->q_len = w->q_off = 0;
    }
}

static bool q_pending(const struct wire *w)
{
    return w->q_off < w->q_len;
}

static void drop_stash(struct wire *w)
{
    free(w->stash);
    w->stash = NULL;
    w->stash_len = 0;
}

/* A refused head: the stand-in takes its place and nothing more is read. */
static ssize_t refuse(struct wire *w, enum refusal why, char *buf, size_t len, size_t out)
{
    drop_stash(w);
    w->dead = true;
    w->rejected = why;
    w->reject_head = ++w->heads_out;
    if (q_append(w, wire_standin, wire_standin_len) < 0) {
        w->closing = true;
        errno = ECONNRESET;
        return -1;
    }
    q_flush(w, buf, len, &out);
    return (ssize_t)out;
}

static ssize_t broken(struct wire *w)
{
    drop_stash(w);
    w->closing = true;
    w->rejected = REFUSE_BAD_CHUNK;
    errno = ECONNRESET;
    return -1;
}

static ssize_t nothing_yet(size_t out)
{
    if (out)
        return (ssize_t)out;
    errno = EAGAIN;
    return -1;
}

bool wire_holding(const struct wire *w)
{
    return w->stash_len > 0 && !w->dead;
}

bool wire_head_expired(const struct wire *w, uint64_t now_ms)
{
    return wire_holding(w) && w->head_timeout_ms && now_ms - w->head_start_ms >= w->head_timeout_ms;
}

ssize_t wire_recv(struct wire *w, void *vbuf, size_t len, wire_read_fn read, void *ctx,
                  uint64_t now_ms)
{
    char *buf = vbuf;
    size_t out = 0;
    if (w->closing) {
        errno = ECONNRESET;
        return -1;
    }
    if (len == 0)
        return 0;
    if (q_pending(w)) {
        q_flush(w, buf, len, &out);
        if (q_pending(w))
            return (ssize_t)out; /* a full read: libmicrohttpd comes back for the rest */
    }
    if (w->dead)
        return nothing_yet(out);
    if (wire_holding(w) && (w->expired || wire_head_expired(w, now_ms)))
        return refuse(w, REFUSE_HEAD_TIMEOUT, buf, len, out);

    for (;;) {
        if (!w->stash_len) {
            /* the usual case: read straight into libmicrohttpd's buffer, check in place */
            size_t room = len - out;
            if (room == 0)
                return (ssize_t)out;
            ssize_t got = read(ctx, buf + out, room);
            if (got <= 0)
                return out ? (ssize_t)out : got;
            struct wire_scan sc = wire_parse(w, buf + out, (size_t)got);
            if (sc.reason == REFUSE_BAD_CHUNK)
                return broken(w);
            if (sc.reason != REFUSE_NONE)
                return refuse(w, sc.reason, buf, len, out + sc.safe);
            if (sc.safe < (size_t)got) {
                /* a head began and is not complete: hold it back */
                size_t k = (size_t)got - sc.safe;
                w->stash = malloc((size_t)w->head_max + 1);
                if (!w->stash)
                    return broken(w);
                memcpy(w->stash, buf + out + sc.safe, k);
                w->stash_len = k;
                w->head_start_ms = now_ms;
            }
            out += sc.safe;
            if ((size_t)got < room)
                return nothing_yet(out); /* the socket is drained */
            continue;
        }
        /* a head is held: the next bytes go after it */
        size_t room = (size_t)w->head_max + 1 - w->stash_len;
        ssize_t got = read(ctx, w->stash + w->stash_len, room);
        if (got <= 0)
            return out ? (ssize_t)out : got;
        size_t old = w->stash_len;
        struct wire_scan sc = wire_parse(w, w->stash + old, (size_t)got);
        if (sc.reason == REFUSE_BAD_CHUNK)
            return broken(w);
        if (sc.reason != REFUSE_NONE) {
            /* the refused head is the held one, or one after it in these bytes */
            size_t keep = sc.safe ? old + sc.safe : 0;
            if (keep && q_append(w, w->stash, keep) < 0)
                return broken(w);
            return refuse(w, sc.reason, buf, len, out);
        }
        w->stash_len += (size_t)got;
        if (sc.safe > 0) {
            /* the held head is complete: it and what follows up to any new open head go */
            size_t done = old + sc.safe;
            if (q_append(w, w->stash, done) < 0)
                return broken(w);
            memmove(w->stash, w->stash + done, w->stash_len - done);
            w->stash_len -= done;
            if (w->stash_len)
                w->head_start_ms = now_ms;
            else
                drop_stash(w);
            q_flush(w, buf, len, &out);
            if (q_pending(w))
                return (ssize_t)out;
        }
        if ((size_t)got < room)
            return nothing_yet(out);
    }
}

enum refusal wire_take_reject(struct wire *w)
{
    w->heads_in++;
    if (w->reject_head && w->heads_in == w->reject_head)
        return w->rejected;
    return REFUSE_NONE;
}

/* ---- a whole byte string through the checker ---- */

struct feed {
    const char *data;
    size_t n, pos;
    const size_t *pieces;
    size_t n_pieces, k;
    size_t piece_left; /* bytes left of the current piece; 0: next call is a drained socket */
    bool drained;
};

static ssize_t feed_read(void *ctx, void *buf, size_t len)
{
    struct feed *f = ctx;
    if (f->pos == f->n)
        return 0;
    if (f->piece_left == 0) {
        if (!f->drained) {
            f->drained = true;
            errno = EAGAIN;
            return -1;
        }
        f->drained = false;
        size_t p = f->n_pieces ? f->pieces[f->k++ % f->n_pieces] : f->n;
        f->piece_left = p ? p : 1;
    }
    size_t k = f->n - f->pos;
    if (k > f->piece_left)
        k = f->piece_left;
    if (k > len)
        k = len;
    memcpy(buf, f->data + f->pos, k);
    f->pos += k;
    f->piece_left -= k;
    return (ssize_t)k;
}

size_t wire_run(const char *data, size_t n, const size_t *pieces, size_t n_pieces, char *out,
                size_t cap, bool *closed, struct wire *w)
{
    struct feed f = {
        .data = data, .n = n, .pieces = pieces, .n_pieces = n_pieces, .drained = true
    };
    size_t olen = 0;
    *closed = false;
    /* libmicrohttpd reads into what is left of its buffer, at most 16 KiB at a time here */
    for (unsigned rounds = 0; rounds < 1000000; rounds++) {
        size_t len = cap - olen < 16384 ? cap - olen : 16384;
        if (len == 0)
            break;
        ssize_t r = wire_recv(w, out + olen, len, feed_read, &f, 0);
        if (r > 0) {
            olen += (size_t)r;
            continue;
        }
        if (r == 0)
            break;
        if (errno == ECONNRESET) {
            *closed = true;
            break;
        }
        /* EAGAIN: with nothing left to read (or refused) and nothing queued, the run is over */
        if ((f.pos == f.n || w->dead) && !q_pending(w))
            break;
    }
    return olen;
}
