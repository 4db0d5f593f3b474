/* proxy/http/grpc.c: what retryproxy reads and writes of gRPC (docs/grpc.md): the content type, the
 * grpc-status and grpc-timeout values, and the statuses of retryproxy's own errors. */
#include <criterion/criterion.h>

#include <string.h>

#include "proxy/http/grpc.h"
#include "proxy/http/hlist.h"

static bool ct(const char *v)
{
    return grpc_is_content_type(v, strlen(v));
}

Test(grpc, content_types_that_make_a_call)
{
    cr_expect(ct("application/grpc"));
    cr_expect(ct("application/grpc+proto"));
    cr_expect(ct("application/grpc+json"));
    cr_expect(ct("application/grpc;charset=utf-8"));
    cr_expect(ct("Application/GRPC"), "the type is case-insensitive");
    cr_expect_not(ct("application/grpc-web"), "gRPC-Web is another protocol");
    cr_expect_not(ct("application/grpcx"));
    cr_expect_not(ct("application/json"));
    cr_expect_not(ct("application/grp"));
    cr_expect_not(ct(""));
}

static int st(const char *v)
{
    return grpc_status_parse(v, strlen(v));
}

Test(grpc, status_values)
{
    cr_expect_eq(st("0"), 0);
    cr_expect_eq(st("14"), 14);
    cr_expect_eq(st("999"), 999);
    cr_expect_eq(st(""), -1);
    cr_expect_eq(st("1000"), -1);
    cr_expect_eq(st("-1"), -1);
    cr_expect_eq(st("1 4"), -1);
    cr_expect_eq(st("0x1"), -1);
}

Test(grpc, the_status_of_a_field_list_is_its_one_grpc_status)
{
    struct hlist h = { 0 };
    cr_expect_eq(grpc_status_of(&h), -1);
    cr_expect_eq(grpc_status_of(NULL), -1);
    hlist_add(&h, "content-type", 12, "application/grpc", 16);
    hlist_add(&h, "Grpc-Status", 11, "14", 2);
    cr_expect_eq(grpc_status_of(&h), 14, "names match in any case");
    hlist_add(&h, "grpc-status", 11, "0", 1);
    cr_expect_eq(grpc_status_of(&h), -1, "two statuses: neither is believed");
    hlist_free(&h);
}

static int64_t to(const char *v)
{
    uint64_t ms;
    return grpc_timeout_parse(v, strlen(v), &ms) < 0 ? -1 : (int64_t)ms;
}

/* The status a client sees: grpc-status, head first; without one, a non-200 HTTP status as
 * gRPC maps it; a 200 without one has none. */
Test(grpc, the_status_a_client_sees)
{
    struct hlist head = { 0 }, trailers = { 0 };
    cr_expect_eq(grpc_status_seen(503, &head, NULL), GRPC_UNAVAILABLE);
    cr_expect_eq(grpc_status_seen(404, &head, &trailers), GRPC_UNIMPLEMENTED);
    cr_expect_eq(grpc_status_seen(500, &head, NULL), GRPC_UNKNOWN);
    cr_expect_eq(grpc_status_seen(200, &head, &trailers), -1);
    cr_expect_eq(grpc_status_seen(0, &head, NULL), -1, "no response");
    hlist_add(&trailers, "grpc-status", 11, "8", 1);
    cr_expect_eq(grpc_status_seen(200, &head, &trailers), GRPC_RESOURCE_EXHAUSTED);
    hlist_add(&head, "grpc-status", 11, "13", 2);
    cr_expect_eq(grpc_status_seen(503, &head, &trailers), GRPC_INTERNAL, "the server's own");
    hlist_free(&head);
    hlist_free(&trailers);
}

Test(grpc, timeout_values_in_every_unit_rounded_up_to_milliseconds)
{
    cr_expect_eq(to("1H"), 3600000);
    cr_expect_eq(to("2M"), 120000);
    cr_expect_eq(to("5S"), 5000);
    cr_expect_eq(to("250m"), 250);
    cr_expect_eq(to("1500u"), 2);
    cr_expect_eq(to("1n"), 1, "under a millisecond is one");
    cr_expect_eq(to("0m"), 0);
    cr_expect_eq(to("99999999H"), 99999999LL * 3600000);
    cr_expect_eq(to("100000000m"), -1, "nine digits");
    cr_expect_eq(to("m"), -1);
    cr_expect_eq(to("10"), -1);
    cr_expect_eq(to("10s"), -1, "units are case-sensitive");
    cr_expect_eq(to("1.5S"), -1);
    cr_expect_eq(to(" 5S"), -1);
}

Test(grpc, timeouts_written_in_milliseconds_then_seconds)
{
    char out[GRPC_TIMEOUT_MAX];
    cr_expect_eq(grpc_timeout_format(250, out), 4);
    cr_expect_str_eq(out, "250m");
    grpc_timeout_format(0, out);
    cr_expect_str_eq(out, "0m");
    grpc_timeout_format(99999999, out);
    cr_expect_str_eq(out, "99999999m");
    grpc_timeout_format(100000999, out);
    cr_expect_str_eq(out, "100000S", "rounded down: never more time than is left");
    grpc_timeout_format(UINT64_MAX, out);
    cr_expect_str_eq(out, "99999999S");
    uint64_t back;
    for (uint64_t ms = 1; ms < 200000000; ms = ms * 7 + 3) {
        grpc_timeout_format(ms, out);
        cr_assert_eq(grpc_timeout_parse(out, strlen(out), &back), 0, "%s", out);
        cr_expect(back <= ms && back + 1000 > ms, "%llu -> %s", (unsigned long long)ms, out);
    }
}

Test(grpc, errors_of_our_own_as_grpc_statuses)
{
    cr_expect_eq(grpc_code_of_error("no_route", 404), GRPC_UNIMPLEMENTED);
    cr_expect_eq(grpc_code_of_error("upstream_unavailable", 502), GRPC_UNAVAILABLE);
    cr_expect_eq(grpc_code_of_error("upstream_timeout", 504), GRPC_DEADLINE_EXCEEDED);
    cr_expect_eq(grpc_code_of_error("draining", 503), GRPC_UNAVAILABLE);
    cr_expect_eq(grpc_code_of_error("body_too_large", 413), GRPC_RESOURCE_EXHAUSTED);
    cr_expect_eq(grpc_code_of_error("bad_request", 400), GRPC_INTERNAL);
    cr_expect_eq(grpc_code_of_error("something_new", 503), GRPC_UNAVAILABLE,
                 "unknown codes by their HTTP status");
    cr_expect_eq(grpc_code_of_error(NULL, 401), GRPC_UNAUTHENTICATED);
    cr_expect_eq(grpc_code_of_error(NULL, 418), GRPC_UNKNOWN);
}

Test(grpc, messages_are_percent_encoded_and_cut_to_fit)
{
    char out[16];
    cr_expect_eq(grpc_message_encode("no route", out, sizeof(out)), 8);
    cr_expect_str_eq(out, "no route");
    grpc_message_encode("10% \xc3\xa9\n", out, sizeof(out));
    cr_expect_str_eq(out, "10%25 %C3%A9%0A");
    grpc_message_encode("0123456789abcdefghij", out, sizeof(out));
    cr_expect_str_eq(out, "0123456789abcde", "cut, with its NUL");
    grpc_message_encode("0123456789abcd\n", out, sizeof(out));
    cr_expect_str_eq(out, "0123456789abcd", "an escape is never cut in two");
}

Test(grpc, messages_are_counted_across_any_split)
{
    /* three messages: 2 bytes, 0 bytes, 300 bytes */
    unsigned char s[5 + 2 + 5 + 5 + 300] = {
        0, 0, 0, 0, 2, 'a', 'b', 1, 0, 0, 0, 0, 0, 0, 0, 1, 44
    };
    uint32_t want[sizeof(s)];
    struct grpc_frames g = { 0 };
    for (size_t i = 0; i < sizeof(s); i++)
        want[i] = grpc_frames_feed(&g, (const char *)s + i, 1);
    cr_expect_eq(want[0], 1);
    cr_expect_eq(want[6], 1, "the first message's payload");
    cr_expect_eq(want[7], 2, "the second begins");
    cr_expect_eq(want[12], 3, "the empty second is followed at once by the third");
    cr_expect_eq(want[sizeof(s) - 1], 3, "its 300 bytes");
    for (size_t cut = 0; cut <= sizeof(s); cut += 7) {
        struct grpc_frames h = { 0 };
        grpc_frames_feed(&h, (const char *)s, cut);
        cr_expect_eq(grpc_frames_feed(&h, (const char *)s + cut, sizeof(s) - cut), 3, "cut %zu",
                     cut);
        cr_expect_eq(h.left, 0);
        cr_expect_eq(h.prefix_len, 0);
    }
}
