#include "proxy/http2/h2guard.h"

#include <string.h>

#include "proxy/http2/h2int.h"

#define PREFACE_LEN 24 /* "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" */

/* Takes a token from a bucket of 'burst' refilled at 'rate' a second: false when empty. */
static bool take(struct h2bucket *b, uint64_t burst, uint64_t rate, uint64_t now)
{
    uint64_t refill = (now - b->ms) * rate / 1000;
    if (refill) {
        b->tokens = b->tokens + refill > burst ? burst : b->tokens + refill;
        b->ms = now;
    }
    if (b->tokens == 0)
        return false;
    b->tokens--;
    return true;
}

void h2guard_init(struct h2guard *g, uint64_t now)
{
    memset(g, 0, sizeof(*g));
    g->skip = PREFACE_LEN;
    g->empty = (struct h2bucket){ H2G_EMPTY_BURST, now };
    g->refuse = (struct h2bucket){ H2G_REFUSE_BURST, now };
}

/* A frame that carries nothing: false when the bucket is empty. */
static bool empty_frame(struct h2guard *g, uint64_t now)
{
    if (take(&g->empty, H2G_EMPTY_BURST, H2G_EMPTY_RATE, now))
        return true;
    g->why = NGHTTP2_ENHANCE_YOUR_CALM;
    return false;
}

size_t h2guard_scan(struct h2guard *g, const uint8_t *p, size_t n, uint64_t now)
{
    size_t i = 0;
    while (i < n && !g->why) {
        if (g->skip) {
            if (g->pad) {
                /* a padded DATA frame that is all padding carries nothing either */
                g->pad = false;
                if (g->pad_len == 1u + p[i] && !(g->pad_flags & NGHTTP2_FLAG_END_STREAM) &&
                    !empty_frame(g, now))
                    return i >= 9 ? i - 9 : 0;
            }
            size_t k = n - i < g->skip ? n - i : g->skip;
            g->skip -= (uint32_t)k;
            i += k;
            continue;
        }
        g->hd[g->hd_len++] = p[i++];
        if (g->hd_len < 9)
            continue;
        g->hd_len = 0;
        uint32_t len = (uint32_t)g->hd[0] << 16 | (uint32_t)g->hd[1] << 8 | g->hd[2];
        uint8_t type = g->hd[3], flags = g->hd[4];
        g->skip = len;
        bool empty = false;
        if (type == NGHTTP2_DATA && (flags & NGHTTP2_FLAG_PADDED) && len) {
            g->pad = true;
            g->pad_len = len;
            g->pad_flags = flags;
        } else if (type == NGHTTP2_DATA) {
            empty = len == 0 && !(flags & NGHTTP2_FLAG_END_STREAM);
        } else {
            /* a priority the proxy does not use, or a frame type the session ignores */
            empty = type == NGHTTP2_PRIORITY || type > NGHTTP2_CONTINUATION;
        }
        if (empty && !empty_frame(g, now))
            return i >= 9 ? i - 9 : 0;
    }
    return n;
}

int h2guard_field(struct h2guard *g, size_t bytes, size_t limit, uint64_t now)
{
    g->block += bytes;
    if (g->block > limit && !g->over) {
        g->over = true;
        if (!take(&g->refuse, H2G_REFUSE_BURST, H2G_REFUSE_RATE, now)) {
            g->why = NGHTTP2_ENHANCE_YOUR_CALM;
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
    }
    /* far past the bound: the rest is not worth decoding (only nghttp2's table is kept) */
    if (g->block > (size_t)H2G_STOP * limit)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    return 0;
}

static bool used(const struct h2guard *g, uint32_t i)
{
    return g->used[i / 32] >> (i % 32) & 1u;
}

/* A HEADERS from the client on the odd stream id 'id': false when it is on a lower id it
 * never used, an idle stream it implicitly closed by opening a higher one (RFC 9113 5.1.1).
 * One on a lower id it used (trailers, or a stream closed since) goes to the session. */
static bool headers_id(struct h2guard *g, int32_t id)
{
    const uint32_t words = H2G_IDS / 32;
    if (id > g->max_id) {
        uint32_t k = g->max_id ? (uint32_t)(id - g->max_id) / 2 : H2G_IDS;
        uint32_t w = k / 32, b = k % 32;
        for (uint32_t i = words; i-- > 0;) {
            uint32_t v = 0;
            if (i >= w) {
                v = g->used[i - w] << b;
                if (b && i > w)
                    v |= g->used[i - w - 1] >> (32 - b);
            }
            g->used[i] = v;
        }
        g->used[0] |= 1u;
        g->max_id = id;
        return true;
    }
    uint32_t d = (uint32_t)(g->max_id - id) / 2;
    return d >= H2G_IDS || used(g, d);
}

int h2guard_on_begin_frame(nghttp2_session *sess, const nghttp2_frame_hd *hd, void *user)
{
    (void)sess;
    struct h2guard *g = &((struct h2conn *)user)->guard;
    if (hd->type != NGHTTP2_HEADERS)
        return 0;
    g->block = 0;
    g->over = false;
    /* stream 0 and even ids are the session's to refuse */
    if (hd->stream_id > 0 && (hd->stream_id & 1) && !headers_id(g, hd->stream_id)) {
        g->why = NGHTTP2_PROTOCOL_ERROR;
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    return 0;
}
