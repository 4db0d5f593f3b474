/* What an HTTP/2 client may send that libnghttp2 does not bound by itself (proxy/http2/h2guard.c,
 * docs/hardening.md "HTTP/2"): frames that carry nothing (CVE-2019-9518), an HPACK bomb, a
 * HEADERS on a lower stream id never used (RFC 9113 5.1.1). The frames are built by hand by
 * tests/tools/h2guard_peer.py, which prints one line of results.
 */
#include <criterion/criterion.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fixture.h"
#include "tests/support/h2u.h"

#define T 10000 /* ms: upper bound for any single request in these tests */

TestSuite(h2_guard, .fini = fx_stop, .timeout = 60);

static void start(void)
{
    fx_upstreams(1);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r", "\"match\": {\"path_prefix\": \"/r\"}, \"retry\": {%s}", CFG_FAST);
    fx_start_b(b, "--workers", "1", NULL);
}

/* Runs tests/tools/h2guard_peer.py with the arguments 'fmt' makes; its result line in out. */
static void peer(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void peer(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    h2u_vtool(out, cap, "/usr/bin/python3 tests/tools/h2guard_peer.py", fmt, ap);
    va_end(ap);
}

/* The proxy answers a new connection after an attack on another. */
static void still_answers(void)
{
    char url[256];
    struct http_resp r;
    http_do_h2("GET", px_url(px, "/r/after", url, sizeof(url)), NULL, NULL, 0, T, &r);
    cr_expect_eq(r.rc, 0);
    cr_expect_eq(r.status, 200);
    http_free(&r);
}

/* 200,000 frames that carry nothing: far past the 1,000 at once a connection may send. */
static void flood(const char *kind)
{
    start();
    char line[256];
    peer(line, sizeof(line), "empty %u /r/slow %s 200000", px->port, kind);
    cr_expect_eq(h2u_peer_field(line, "goaway"), 11, "no GOAWAY ENHANCE_YOUR_CALM: %s", line);
    still_answers();
}

Test(h2_guard, empty_data_flood_gets_goaway)
{
    flood("data");
}

Test(h2_guard, padding_only_data_flood_gets_goaway)
{
    flood("padded");
}

Test(h2_guard, ignored_frame_type_flood_gets_goaway)
{
    flood("unknown");
}

Test(h2_guard, priority_flood_gets_goaway)
{
    flood("priority");
}

/* Each block decodes to 64 MB: no stream gets that far (a reset instead of a 431 decoded to
 * the end), and a connection that goes on sending them is closed. */
Test(h2_guard, hpack_bomb_is_cut_short_and_its_connection_closed)
{
    start();
    char line[256];
    peer(line, sizeof(line), "bomb %u /r/bomb 40", px->port);
    cr_expect_eq(h2u_peer_field(line, "goaway"), 11, "no GOAWAY ENHANCE_YOUR_CALM: %s", line);
    cr_expect_eq(h2u_peer_field(line, "answered"), 0, "a bomb decoded to the end: %s", line);
    cr_expect_eq(tup_count(up), 0);
    still_answers();
}

Test(h2_guard, headers_on_a_lower_unused_stream_is_a_protocol_error)
{
    start();
    char line[256];
    peer(line, sizeof(line), "lower %u /r/lower", px->port);
    cr_expect_eq(h2u_peer_field(line, "first"), 200, "%s", line);
    cr_expect_eq(h2u_peer_field(line, "goaway"), 1, "no GOAWAY PROTOCOL_ERROR: %s", line);
    still_answers();
}

/* A lower stream the client opened may still get its trailers. */
Test(h2_guard, trailers_on_a_lower_open_stream_still_pass)
{
    start();
    char line[256];
    peer(line, sizeof(line), "trailers-lower %u /r/tl", px->port);
    cr_expect_eq(h2u_peer_field(line, "second"), 200, "%s", line);
    cr_expect_eq(h2u_peer_field(line, "first"), 200, "%s", line);
    cr_expect_eq(h2u_peer_field(line, "goaway"), -1, "a GOAWAY: %s", line);
    cr_assert_eq(tup_wait_count(up, 2, T), 0);
}
