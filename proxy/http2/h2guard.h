/* h2guard -- what an HTTP/2 client connection may send that libnghttp2 does not bound by itself
 * (docs/hardening.md, "HTTP/2"), checked as the bytes come in, part of the front end
 * (proxy/http2/h2int.h):
 *
 *   - frames that carry nothing (an empty DATA without END_STREAM, PRIORITY, a frame type the
 *     session ignores) cost the client 9 bytes and us a frame's work (CVE-2019-9518): a token
 *     bucket per connection, seen by a frame header scanner ahead of the session, since
 *     nghttp2 reports no callback for the frames it ignores;
 *   - a header block that decodes to far more than the head limit (an HPACK bomb: one table
 *     entry referred to thousands of times) is not decoded further, and refused heads draw on
 *     a budget per connection;
 *   - HEADERS on a lower stream id the client never used (RFC 9113 5.1.1), which nghttp2 1.52
 *     ignores, is a connection error.
 *
 * Whatever ends the connection leaves its GOAWAY code in 'why'.
 */
#ifndef RETRYPROXY_PROXY_H2GUARD_H
#define RETRYPROXY_PROXY_H2GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nghttp2/nghttp2.h>

/* Frames that carry nothing: this many at once, then this many a second. */
#define H2G_EMPTY_BURST 1000
#define H2G_EMPTY_RATE  100
/* Heads over the limit (each answered 431, or reset when over H2G_STOP times it): this many
 * at once, then this many a second. */
#define H2G_REFUSE_BURST 16
#define H2G_REFUSE_RATE  1
#define H2G_STOP         4
/* The client's stream ids remembered below its highest (as many odd ids). */
#define H2G_IDS 512

struct h2bucket {
    uint64_t tokens, ms; /* tokens left, and when it was last filled */
};

struct h2guard {
    uint32_t skip;  /* bytes left of the current frame's payload (first the preface's) */
    uint8_t hd[9];  /* the frame header being read */
    uint8_t hd_len; /* ... bytes of it so far */
    bool pad;       /* a padded DATA frame's pad length byte is next */
    uint32_t pad_len, pad_flags;
    struct h2bucket empty, refuse;
    int32_t max_id;              /* the highest stream id a HEADERS from the client had */
    uint32_t used[H2G_IDS / 32]; /* bit i: max_id - 2 * i had a HEADERS */
    size_t block;                /* the current header block's decoded bytes */
    bool over;                   /* ... past the limit (a refusal counted) */
    uint32_t why;                /* the GOAWAY code that ends the connection, or 0 */
};

void h2guard_init(struct h2guard *g, uint64_t now);

/* Looks at the frames in the 'n' bytes read at loop time 'now': how many of them may go to
 * the session, 'n' or fewer when a frame among them ends the connection ('why' says how). */
size_t h2guard_scan(struct h2guard *g, const uint8_t *p, size_t n, uint64_t now);

/* A decoded field of 'bytes' (as SETTINGS_MAX_HEADER_LIST_SIZE counts them) of the current
 * header block, against the head limit 'limit': 0 to go on, NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE
 * to stop decoding the block (the stream is reset), NGHTTP2_ERR_CALLBACK_FAILURE when the
 * connection ends ('why'). */
int h2guard_field(struct h2guard *g, size_t bytes, size_t limit, uint64_t now);

/* The session's on_begin_frame callback ('user' is the connection, struct h2conn). */
int h2guard_on_begin_frame(nghttp2_session *sess, const nghttp2_frame_hd *hd, void *user);

#endif
