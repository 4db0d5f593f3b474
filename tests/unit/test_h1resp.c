/* h1resp: an HTTP/1.1 response head, line by line, with the checks every upstream response head
 * passes (proxy/upstream/h1resp.h; docs/hardening.md#responses). */
#include <criterion/criterion.h>
#include <string.h>

#include "proxy/upstream/h1resp.h"

static struct h1resp p;
static struct hlist head, trailers;

static void fini(void)
{
    hlist_free(&head);
    hlist_free(&trailers);
}

TestSuite(h1resp, .fini = fini);

/* Feeds the lines of 'text' ("\n" ends each) as libcurl's header callback would, up to the
 * first step that is not H1RESP_MORE; returns that step (H1RESP_MORE when every line was). */
static enum h1resp_step feed(const char *text)
{
    while (*text) {
        const char *lf = strchr(text, '\n');
        size_t len = lf ? (size_t)(lf - text) + 1 : strlen(text);
        enum h1resp_step st = h1resp_line(&p, &head, &trailers, text, len);
        text += len;
        if (st != H1RESP_MORE)
            return st;
    }
    return H1RESP_MORE;
}

static void start(const char *upgrade, bool no_body)
{
    h1resp_start(&p, upgrade, no_body);
    hlist_clear(&head);
    hlist_clear(&trailers);
}

Test(h1resp, a_final_head_is_complete_at_its_blank_line)
{
    start(NULL, false);
    cr_assert_eq(feed("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A:  b c \r\n\r\n"), H1RESP_HEAD);
    cr_assert_eq(p.status, 200);
    cr_assert(p.head_done);
    cr_assert_str_eq(hlist_get(&head, "x-a"), "b c");
    cr_assert_eq(hlist_content_length(&head), 5);
}

Test(h1resp, an_obs_fold_joins_the_value_before_it_with_a_space)
{
    start(NULL, false);
    cr_assert_eq(feed("HTTP/1.1 200 OK\r\nX-A: one\r\n\t two\r\n\r\n"), H1RESP_HEAD);
    cr_assert_str_eq(hlist_get(&head, "X-A"), "one two");
}

Test(h1resp, interim_heads_are_dropped_and_the_final_one_follows)
{
    start(NULL, false);
    cr_assert_eq(feed("HTTP/1.1 100 Continue\r\nX-I: 1\r\n\r\n"), H1RESP_MORE);
    cr_assert_eq(p.status, 0);
    cr_assert_eq(feed("HTTP/1.1 204 No Content\r\n\r\n"), H1RESP_HEAD);
    cr_assert_eq(p.status, 204);
    cr_assert_null(hlist_get(&head, "X-I"));
}

Test(h1resp, a_101_to_a_request_that_asked_for_no_upgrade_is_interim)
{
    start(NULL, false);
    cr_assert_eq(
        feed("HTTP/1.1 101 Switching\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"),
        H1RESP_MORE);
    cr_assert_eq(p.status, 0);
}

Test(h1resp, a_101_naming_the_protocol_asked_for_completes_the_head)
{
    start("WebSocket", false);
    cr_assert_eq(feed("HTTP/1.1 101 Switching\r\nUpgrade: websocket/13\r\n"
                      "Connection: keep-alive, Upgrade\r\n\r\n"),
                 H1RESP_HEAD);
    cr_assert_eq(p.status, 101);
    cr_assert_not(p.bad);
}

Test(h1resp, a_101_naming_another_protocol_or_no_connection_upgrade_is_malformed)
{
    start("websocket", false);
    cr_assert_eq(feed("HTTP/1.1 101 S\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n"),
                 H1RESP_ABORT);
    cr_assert(p.bad);
    start("websocket", false);
    cr_assert_eq(feed("HTTP/1.1 101 S\r\nUpgrade: websocket\r\n\r\n"), H1RESP_ABORT);
    cr_assert(p.bad);
    start("websocket/13", false);
    cr_assert_eq(feed("HTTP/1.1 101 S\r\nUpgrade: websocket/8\r\nConnection: upgrade\r\n\r\n"),
                 H1RESP_ABORT);
}

Test(h1resp, two_different_lengths_are_malformed)
{
    start(NULL, false);
    cr_assert_eq(feed("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"),
                 H1RESP_ABORT);
    cr_assert(p.bad);
    cr_assert_not(p.head_done);
}

Test(h1resp, a_transfer_coding_other_than_chunked_is_malformed_unless_no_body_follows)
{
    start(NULL, false);
    cr_assert_eq(feed("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"), H1RESP_ABORT);
    cr_assert(p.bad);
    start(NULL, true); /* a response to HEAD */
    cr_assert_eq(feed("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"), H1RESP_HEAD);
    start(NULL, false);
    cr_assert_eq(feed("HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: gzip\r\n\r\n"), H1RESP_HEAD);
    start(NULL, false);
    cr_assert_eq(feed("HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n"), H1RESP_HEAD);
}

Test(h1resp, a_bad_status_line_is_refused_without_being_called_malformed)
{
    const char *lines[] = { "HTTP/1.1 99 Low\r\n", "HTTP/1.1 600 High\r\n", "HTTP/1.1 2x0 OK\r\n",
                            "HTTP/1.1\r\n" };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        start(NULL, false);
        cr_assert_eq(feed(lines[i]), H1RESP_ABORT, "%s", lines[i]);
        cr_assert_not(p.bad, "%s", lines[i]);
    }
}

Test(h1resp, a_field_line_before_a_status_line_or_without_a_name_is_malformed)
{
    start(NULL, false);
    cr_assert_eq(feed("X-A: b\r\n"), H1RESP_ABORT);
    cr_assert(p.bad);
    start(NULL, false);
    cr_assert_eq(feed("HTTP/1.1 200 OK\r\nno colon here\r\n"), H1RESP_ABORT);
    cr_assert(p.bad);
    start(NULL, false);
    cr_assert_eq(feed("HTTP/1.1 200 OK\r\nBad Name: x\r\n"), H1RESP_ABORT);
    start(NULL, false);
    cr_assert_eq(feed("HTTP/1.1 200 OK\r\nX-A: a\001b\r\n"), H1RESP_ABORT);
    cr_assert(p.bad);
    start(NULL, false);
    cr_assert_eq(feed("HTTP/1.1 200 OK\r\n folded first\r\n"), H1RESP_ABORT);
    cr_assert(p.bad);
}

Test(h1resp, lines_after_the_head_are_trailers)
{
    start(NULL, false);
    cr_assert_eq(feed("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"), H1RESP_HEAD);
    cr_assert_eq(feed("grpc-status: 0\r\n\r\n"), H1RESP_MORE);
    cr_assert_str_eq(hlist_get(&trailers, "grpc-status"), "0");
    cr_assert_null(hlist_get(&head, "grpc-status"));
}

Test(h1resp, a_head_past_the_lists_bounds_is_refused)
{
    start(NULL, false);
    cr_assert_eq(feed("HTTP/1.1 200 OK\r\n"), H1RESP_MORE);
    enum h1resp_step st = H1RESP_MORE;
    for (unsigned i = 0; i <= HLIST_MAX_COUNT && st == H1RESP_MORE; i++)
        st = feed("X-A: b\r\n");
    cr_assert_eq(st, H1RESP_ABORT);
    cr_assert_not(p.bad);
}
