/* proxy/http2/h2guard.c: the frame header scanner ahead of the HTTP/2 session, and the header block
 * bound. The scanner must find the same frames however the bytes are cut into reads, and
 * stop at the frame that used the bucket up. */
#include <criterion/criterion.h>

#include <string.h>

#include "proxy/http2/h2guard.h"

static const char PREFACE[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/* Appends a frame header on stream 1 and 'len' payload bytes, the first one 'first'. */
static size_t frame(uint8_t *p, uint32_t len, uint8_t type, uint8_t flags, uint8_t first)
{
    p[0] = (uint8_t)(len >> 16), p[1] = (uint8_t)(len >> 8), p[2] = (uint8_t)len;
    p[3] = type, p[4] = flags;
    memset(p + 5, 0, 4);
    p[8] = 1; /* stream 1 */
    memset(p + 9, 'x', len);
    if (len)
        p[9] = first;
    return 9 + len;
}

enum { CAP = 64 * 1024 };

/* A connection: the preface, a 300-byte DATA, then 'n' frames of 'kind' (0 an empty DATA, 1
 * a padding-only DATA, 2 an empty DATA ending the stream), then a 16 KB DATA. */
static size_t stream(uint8_t *p, int kind, int n)
{
    size_t len = strlen(PREFACE);
    memcpy(p, PREFACE, len);
    len += frame(p + len, 300, NGHTTP2_DATA, 0, 'x');
    for (int i = 0; i < n; i++)
        len += kind == 1   ? frame(p + len, 5, NGHTTP2_DATA, NGHTTP2_FLAG_PADDED, 4)
               : kind == 2 ? frame(p + len, 0, NGHTTP2_DATA, NGHTTP2_FLAG_END_STREAM, 0)
                           : frame(p + len, 0, NGHTTP2_DATA, 0, 0);
    len += frame(p + len, 16384, NGHTTP2_DATA, 0, 'x');
    return len;
}

/* Feeds 'p' in reads of 'step' bytes at loop time 0: the bytes accepted in all. */
static size_t feed(const uint8_t *p, size_t n, size_t step, uint32_t *why)
{
    struct h2guard g;
    h2guard_init(&g, 0);
    size_t ok = 0;
    for (size_t i = 0; i < n && !g.why; i += step) {
        size_t k = n - i < step ? n - i : step;
        ok += h2guard_scan(&g, p + i, k, 0);
    }
    *why = g.why;
    return ok;
}

Test(h2guard, frames_that_carry_something_pass_however_cut)
{
    static uint8_t p[CAP];
    size_t n = stream(p, 2, H2G_EMPTY_BURST * 2);
    for (size_t step = 1; step <= 64; step++) {
        uint32_t why;
        cr_assert_eq(feed(p, n, step, &why), n, "cut every %zu bytes", step);
        cr_assert_eq(why, 0);
    }
}

Test(h2guard, empty_frames_past_the_burst_stop_at_the_same_frame_however_cut)
{
    static uint8_t p[CAP];
    for (int kind = 0; kind < 2; kind++) {
        size_t n = stream(p, kind, H2G_EMPTY_BURST + 1);
        size_t one = kind ? 14 : 9;
        /* everything before the frame past the burst */
        size_t want = strlen(PREFACE) + 309 + H2G_EMPTY_BURST * one;
        uint32_t why;
        size_t whole = feed(p, n, n, &why);
        cr_expect_eq(why, NGHTTP2_ENHANCE_YOUR_CALM);
        cr_expect_eq(whole, want, "kind %d: %zu accepted, %zu expected", kind, whole, want);
        for (size_t step = 1; step <= 40; step++) {
            /* cut: its frame header (a padded one's, before the pad length byte came) may
             * have gone with an earlier read, which the session only holds */
            size_t got = feed(p, n, step, &why);
            cr_expect(got >= want && got <= want + 9, "kind %d cut every %zu: %zu accepted", kind,
                      step, got);
            cr_expect_eq(why, NGHTTP2_ENHANCE_YOUR_CALM, "kind %d cut every %zu", kind, step);
        }
        /* the burst itself passes */
        n = stream(p, kind, H2G_EMPTY_BURST);
        cr_expect_eq(feed(p, n, 7, &why), n);
        cr_expect_eq(why, 0);
    }
}

Test(h2guard, a_header_block_is_stopped_past_four_times_the_limit)
{
    struct h2guard g;
    h2guard_init(&g, 0);
    size_t total = 0;
    int rv = 0;
    while (rv == 0) {
        rv = h2guard_field(&g, 4032, 8192, 0);
        total += 4032;
    }
    cr_expect_eq(rv, NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE);
    cr_expect_gt(total, 4 * 8192);
    cr_expect_leq(total, 4 * 8192 + 4032);
}
