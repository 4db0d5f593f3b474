/* The request framing check (proxy/http1/wire.h) on raw bytes, without a socket. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "proxy/http1/wire.h"

static char out[1 << 16];

struct run {
    size_t len;
    bool closed;
    struct wire w;
};

static void run(const char *s, size_t n, size_t piece, struct run *r)
{
    wire_init(&r->w, 0, WIRE_HEAD_DEFAULT);
    r->len =
        wire_run(s, n, piece ? &piece : NULL, piece ? 1 : 0, out, sizeof(out), &r->closed, &r->w);
}

static const char *const clean[] = {
    "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    "POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /2 HTTP/1.1\r\nHost: "
    "a\r\n\r\n",
    "POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;e=1\r\nhel\r\n2\r\nlo\r\n"
    "0\r\nX-T: y\r\n\r\nGET / HTTP/1.0\r\n\r\n",
    "\r\nGET /lf HTTP/1.1\nHost: a\nX: b\n\n",
};

Test(wire, clean_streams_pass_unchanged_however_they_are_cut)
{
    for (size_t i = 0; i < sizeof(clean) / sizeof(clean[0]); i++) {
        size_t n = strlen(clean[i]);
        for (size_t piece = 0; piece <= 9; piece++) {
            struct run r;
            run(clean[i], n, piece, &r);
            cr_expect(!r.closed && r.w.rejected == REFUSE_NONE, "case %zu piece %zu", i, piece);
            cr_expect(r.len == n && memcmp(out, clean[i], n) == 0, "case %zu piece %zu: %zu of %zu",
                      i, piece, r.len, n);
            wire_release(&r.w);
        }
    }
}

static const struct {
    const char *s;
    enum refusal why;
} bad[] = {
    { "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n 0\r\n\r\n", REFUSE_OBS_FOLD },
    { "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: "
      "identity\r\n\r\n",
      REFUSE_BAD_TRANSFER_ENCODING },
    { "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
      REFUSE_UNSUPPORTED_CODING },
    { "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
      REFUSE_CL_AND_TE },
    { "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", REFUSE_TWO_HOSTS },
    { "GET / HTTP/1.1\r\n\r\n", REFUSE_NO_HOST },
    { "GET /a\tb HTTP/1.1\r\nHost: a\r\n\r\n", REFUSE_BAD_TARGET },
    { "GET / HTTP/1.1\r\nHost: a\rX: 1\r\n\r\n", REFUSE_BARE_CR },
    { "GET / HTTP/2.0\r\nHost: a\r\n\r\n", REFUSE_BAD_VERSION },
    { "ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFG / HTTP/1.1\r\n", REFUSE_METHOD_TOO_LONG },
    { "GET / HTTP/1.1\r\nHost : a\r\n\r\n", REFUSE_SPACE_BEFORE_COLON },
    /* a lone CR between requests is refused with what follows, never handed over alone */
    { "\rGET / HTTP/1.1\r\nHost: a\r\n\r\n", REFUSE_BARE_CR },
    { "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5 \r\n\r\n", REFUSE_BAD_CONTENT_LENGTH },
};

Test(wire, a_refused_head_becomes_the_stand_in_after_what_came_before)
{
    static const char good[] = "GET /first HTTP/1.1\r\nHost: a\r\n\r\n";
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char in[512];
        int n =
            snprintf(in, sizeof(in), "%s%sGET /after HTTP/1.1\r\nHost: a\r\n\r\n", good, bad[i].s);
        for (size_t piece = 0; piece <= 7; piece++) {
            struct run r;
            run(in, (size_t)n, piece, &r);
            cr_expect_eq(r.w.rejected, bad[i].why, "case %zu piece %zu: %s", i, piece,
                         refusal_text(r.w.rejected));
            size_t gl = sizeof(good) - 1;
            cr_expect(r.len == gl + wire_standin_len && memcmp(out, good, gl) == 0 &&
                          memcmp(out + gl, wire_standin, wire_standin_len) == 0,
                      "case %zu piece %zu: handed over %zu bytes", i, piece, r.len);
            /* the access handler sees the good head, then the stand-in */
            cr_expect_eq(wire_take_reject(&r.w), REFUSE_NONE);
            cr_expect_eq(wire_take_reject(&r.w), bad[i].why);
            wire_release(&r.w);
        }
    }
}

Test(wire, broken_chunked_framing_resets_the_connection)
{
    static const char s[] =
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5x\r\nhello";
    for (size_t piece = 0; piece <= 5; piece++) {
        struct run r;
        run(s, sizeof(s) - 1, piece, &r);
        cr_expect(r.closed, "piece %zu", piece);
        cr_expect_eq(r.w.rejected, REFUSE_BAD_CHUNK);
        wire_release(&r.w);
    }
}

/* ---- the deadline, with a fake socket and a fake clock ---- */

struct sock {
    const char *data;
    size_t n, pos;
};

static ssize_t sock_read(void *ctx, void *buf, size_t len)
{
    struct sock *k = ctx;
    if (k->pos == k->n) {
        errno = EAGAIN;
        return -1;
    }
    size_t c = k->n - k->pos < len ? k->n - k->pos : len;
    memcpy(buf, k->data + k->pos, c);
    k->pos += c;
    return (ssize_t)c;
}

Test(wire, a_head_held_past_the_deadline_is_refused_with_408)
{
    struct wire w;
    wire_init(&w, 1000, WIRE_HEAD_DEFAULT);
    struct sock k = { "GET / HTTP/1.1\r\nHo", 18, 0 };
    char buf[4096];
    errno = 0;
    cr_expect_eq(wire_recv(&w, buf, sizeof(buf), sock_read, &k, 5000), -1);
    cr_expect_eq(errno, EAGAIN, "nothing handed over while the head is incomplete");
    cr_expect(wire_holding(&w));
    cr_expect(!wire_head_expired(&w, 5999));
    cr_expect(wire_head_expired(&w, 6000));
    ssize_t got = wire_recv(&w, buf, sizeof(buf), sock_read, &k, 6000);
    cr_expect_eq((size_t)got, wire_standin_len);
    cr_expect(memcmp(buf, wire_standin, wire_standin_len) == 0);
    cr_expect_eq(wire_take_reject(&w), REFUSE_HEAD_TIMEOUT);
    cr_expect_eq(refusal_status(REFUSE_HEAD_TIMEOUT), 408);
    /* nothing more is read */
    cr_expect_eq(wire_recv(&w, buf, sizeof(buf), sock_read, &k, 7000), -1);
    cr_expect_eq(errno, EAGAIN);
    wire_release(&w);
}

/* libmicrohttpd's buffer smaller than what is queued: handed over across reads, in order. */
Test(wire, a_small_reader_buffer_gets_everything_in_order)
{
    static const char s[] = "GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\n";
    struct wire w;
    wire_init(&w, 0, WIRE_HEAD_DEFAULT);
    struct sock k = { s, sizeof(s) - 1, 0 };
    char got[256];
    size_t n = 0;
    for (int i = 0; i < 200 && n < sizeof(s) - 1; i++) {
        ssize_t r = wire_recv(&w, got + n, 3, sock_read, &k, 0);
        if (r > 0)
            n += (size_t)r;
    }
    cr_expect(n == sizeof(s) - 1 && memcmp(got, s, n) == 0);
    wire_release(&w);
}

/* A client that ends a body with a stray CRLF and then idles is not a slow head: the CRLF is
 * handed over at once and no deadline runs. More than a few empty lines are refused. */
Test(wire, empty_lines_between_requests_are_passed_on_not_held)
{
    static const char s[] = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nok\r\n";
    struct wire w;
    wire_init(&w, 1000, WIRE_HEAD_DEFAULT);
    struct sock k = { s, sizeof(s) - 1, 0 };
    char buf[256];
    cr_expect_eq(wire_recv(&w, buf, sizeof(buf), sock_read, &k, 0), (ssize_t)(sizeof(s) - 1));
    cr_expect(!wire_holding(&w));
    cr_expect(!wire_head_expired(&w, 60000));
    wire_release(&w);

    static const char many[] =
        "\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n";
    struct run r;
    run(many, sizeof(many) - 1, 0, &r);
    cr_expect_eq(r.w.rejected, REFUSE_BAD_REQUEST_LINE);
    wire_release(&r.w);
    run(many + 2, sizeof(many) - 3, 0, &r);
    cr_expect_eq(r.w.rejected, REFUSE_NONE, "eight empty lines are tolerated");
    wire_release(&r.w);
}
