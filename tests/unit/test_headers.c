#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>

#include <string.h>

#include "proxy/http/fields.h"
#include "proxy/http/head.h"
#include "proxy/http/headers.h"
#include "proxy/http/hlist.h"

Test(headers, hop_by_hop_names_in_any_case)
{
    static const char *const hop[] = { "Connection", "keep-alive",        "PROXY-CONNECTION", "te",
                                       "Trailer",    "transfer-encoding", "Upgrade" };
    for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
        cr_expect(fields_hop_by_hop(hop[i], strlen(hop[i])), "%s", hop[i]);
    cr_expect_not(fields_hop_by_hop("Content-Length", strlen("Content-Length")));
    cr_expect_not(fields_hop_by_hop("Trailers", strlen("Trailers")));
    cr_expect_not(fields_hop_by_hop("X-Connection", strlen("X-Connection")));
}

Test(headers, connection_tokens_are_found_whatever_the_spacing)
{
    cr_expect(hdr_token_listed("close, X-Foo", "x-foo"));
    cr_expect(hdr_token_listed("X-Foo", "X-Foo"));
    cr_expect(hdr_token_listed(" ,X-A ,\tX-B\t", "x-b"));
    cr_expect_not(hdr_token_listed("X-Foobar", "X-Foo"));
    cr_expect_not(hdr_token_listed("close", "X-Foo"));
    cr_expect_not(hdr_token_listed("", "X-Foo"));
}

Test(headers, names_must_be_tokens_and_values_free_of_controls)
{
    cr_expect(hdr_name_valid("X-Good_1.2~"));
    cr_expect_not(hdr_name_valid(""));
    cr_expect_not(hdr_name_valid("Bad Name"));
    cr_expect_not(hdr_name_valid("Bad:Name"));
    cr_expect(hdr_value_valid("a value\twith tab"));
    cr_expect(hdr_value_valid(""));
    cr_expect_not(hdr_value_valid("line\r\nInjected: 1"));
    cr_expect_not(hdr_value_valid("bare\nLF"));
    cr_expect_not(hdr_value_valid("bare\rCR"));
    cr_expect_not(hdr_value_valid("del\x7f"));
}

Test(headers, uint_parsing_is_strict)
{
    cr_expect_eq(hdr_parse_uint("0"), 0);
    cr_expect_eq(hdr_parse_uint("1048576"), 1048576);
    cr_expect_eq(hdr_parse_uint("999999999999999999"), 999999999999999999LL);
    cr_expect_eq(hdr_parse_uint("1234567890123456789"), -1); /* 19 digits: refused */
    cr_expect_eq(hdr_parse_uint(""), -1);
    cr_expect_eq(hdr_parse_uint("-1"), -1);
    cr_expect_eq(hdr_parse_uint("1 "), -1);
    cr_expect_eq(hdr_parse_uint("+5"), -1);
    cr_expect_eq(hdr_parse_uint("0x10"), -1);
}

Test(headers, uuid_is_version_4_and_distinct)
{
    struct rng r;
    rng_seed(&r, 9);
    char a[37], b[37];
    hdr_uuid(&r, a);
    hdr_uuid(&r, b);
    cr_assert_eq(strlen(a), 36);
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23)
            cr_expect_eq(a[i], '-');
        else
            cr_expect((a[i] >= '0' && a[i] <= '9') || (a[i] >= 'a' && a[i] <= 'f'), "%s", a);
    }
    cr_expect_eq(a[14], '4');
    cr_expect(strchr("89ab", a[19]) != NULL, "%s", a);
    cr_expect_str_neq(a, b);
}

/* The same 128 bits as the printf form "%08x-%04x-%04x-%04x-%012llx" would give. */
Test(headers, uuid_spells_the_generators_bits_in_order)
{
    struct rng r, twin;
    rng_seed(&r, 77);
    rng_seed(&twin, 77);
    char got[37], want[37];
    for (int k = 0; k < 100; k++) {
        hdr_uuid(&r, got);
        uint64_t hi = rng_next(&twin), lo = rng_next(&twin);
        hi = (hi & 0xffffffffffff0fffULL) | 0x0000000000004000ULL;
        lo = (lo & 0x3fffffffffffffffULL) | 0x8000000000000000ULL;
        snprintf(want, sizeof(want), "%08x-%04x-%04x-%04x-%012llx", (unsigned)(hi >> 32),
                 (unsigned)(hi >> 16) & 0xffff, (unsigned)hi & 0xffff, (unsigned)(lo >> 48),
                 (unsigned long long)(lo & 0xffffffffffffULL));
        cr_assert_str_eq(got, want);
    }
}

Test(headers, utoa_writes_decimal_and_returns_the_end)
{
    static const uint64_t v[] = { 0, 7, 10, 99, 4294967295u, UINT64_MAX };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        char got[24], want[24];
        char *end = hdr_utoa(v[i], got);
        snprintf(want, sizeof(want), "%llu", (unsigned long long)v[i]);
        cr_expect_str_eq(got, want);
        cr_expect_eq(end, got + strlen(want));
    }
}

Test(headers, name_bytes_are_exactly_rfc9110_tchar)
{
    for (int c = 1; c < 256; c++) {
        char name[2] = { (char)c, 0 };
        bool tchar = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                     strchr("!#$%&'*+-.^_`|~", c) != NULL;
        cr_expect_eq(hdr_name_valid(name), tchar, "byte 0x%02x", c);
    }
    static const char *const hop[] = {
        "te",         "TRAILER",          "upgrade",          "connection",
        "Keep-Alive", "proxy-connection", "Transfer-Encoding"
    };
    for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
        cr_expect(fields_hop_by_hop(hop[i], strlen(hop[i])), "%s", hop[i]);
    static const char *const not_hop[] = { "",         "T",    "TEE",       "Trailers",
                                           "Upgrade2", "Host", "Connectio", "Transfer-Encodings" };
    for (size_t i = 0; i < sizeof(not_hop) / sizeof(not_hop[0]); i++)
        cr_expect_not(fields_hop_by_hop(not_hop[i], strlen(not_hop[i])), "%s", not_hop[i]);
}

Test(headers, match_host_lowercases_and_drops_the_port_unless_asked)
{
    char h[64];
    cr_assert_eq(
        hdr_match_host("Orders.Internal:8080", strlen("Orders.Internal:8080"), false, h, sizeof(h)),
        0);
    cr_expect_str_eq(h, "orders.internal");
    cr_assert_eq(
        hdr_match_host("Orders.Internal:8080", strlen("Orders.Internal:8080"), true, h, sizeof(h)),
        0);
    cr_expect_str_eq(h, "orders.internal:8080");
    cr_assert_eq(hdr_match_host("[::1]:80", strlen("[::1]:80"), false, h, sizeof(h)), 0);
    cr_expect_str_eq(h, "[::1]");
    cr_assert_eq(hdr_match_host("plain", strlen("plain"), false, h, sizeof(h)), 0);
    cr_expect_str_eq(h, "plain");
    cr_expect_eq(
        hdr_match_host("a-very-long-host-name", strlen("a-very-long-host-name"), false, h, 8), -1);
}

Test(headers, trim_drops_only_the_whitespace_around_a_value)
{
    static const struct {
        const char *in, *out;
    } cases[] = { { "700", "700" },
                  { " 700", "700" },
                  { "700 ", "700" },
                  { "\t7 0\t ", "7 0" },
                  { "   ", "" },
                  { "", "" },
                  { "a\t", "a" },
                  { " \tx y\t ", "x y" },
                  { "\x0b"
                    "1",
                    "\x0b"
                    "1" } };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t n = strlen(cases[i].in);
        const char *v = hdr_trim(cases[i].in, &n);
        cr_expect(n == strlen(cases[i].out) && memcmp(v, cases[i].out, n) == 0,
                  "hdr_trim(\"%s\") = \"%.*s\"", cases[i].in, (int)n, v);
    }
}

Test(headers, a_number_in_a_value_may_have_whitespace_around_it_not_inside)
{
    cr_expect_eq(hdr_value_uint("700", 3), 700);
    cr_expect_eq(hdr_value_uint(" 700", 4), 700);
    cr_expect_eq(hdr_value_uint("700 ", 4), 700);
    cr_expect_eq(hdr_value_uint("\t700\t ", 6), 700);
    cr_expect_eq(hdr_value_uint("7 00", 4), -1);
    cr_expect_eq(hdr_value_uint("   ", 3), -1);
    cr_expect_eq(hdr_value_uint("70x", 2), 70); /* only the n bytes given */
    cr_expect_eq(hdr_value_uint("+7", 2), -1);
    cr_expect_eq(hdr_value_uint("1234567890123456789", 19), -1);
}

static bool coding_ok(const char *const *values)
{
    struct hlist h = { 0 };
    hlist_add(&h, "Content-Type", 12, "text/plain", 10);
    for (size_t i = 0; values[i]; i++)
        cr_assert_eq(hlist_add(&h, "transfer-encoding", 17, values[i], strlen(values[i])), 0);
    bool ok = hlist_transfer_coding_ok(&h);
    hlist_free(&h);
    return ok;
}

Test(headers, a_response_transfer_encoding_must_be_one_chunked)
{
    const char *const *good[] = {
        (const char *const[]){ NULL },
        (const char *const[]){ "chunked", NULL },
        (const char *const[]){ "CHUNKED", NULL },
        (const char *const[]){ " chunked ", NULL },
        (const char *const[]){ ", chunked,", NULL },
        (const char *const[]){ "", "chunked", NULL },
    };
    const char *const *bad[] = {
        (const char *const[]){ "chunked, deflate", NULL },
        (const char *const[]){ "chunked", "identity", NULL },
        (const char *const[]){ "chunked", "chunked", NULL },
        (const char *const[]){ "chunked, chunked", NULL },
        (const char *const[]){ "chunkedchunked", NULL },
        (const char *const[]){ "gzip, chunked", NULL },
        (const char *const[]){ "gzip", NULL },
        (const char *const[]){ "identity", NULL },
        (const char *const[]){ "chunked;q=1", NULL },
        (const char *const[]){ "chunked x", NULL },
        (const char *const[]){ "xchunked", NULL },
        (const char *const[]){ "", NULL }, /* named, but no coding */
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        cr_expect(coding_ok(good[i]), "good case %zu refused", i);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_expect(!coding_ok(bad[i]), "bad case %zu (%s) accepted", i, bad[i][0]);
}

Test(headers, host_values_are_uri_host_and_an_optional_port)
{
    static const char *const good[] = {
        "",
        "a",
        "a:80",
        "a:",
        "example.com",
        "Example.COM:8080",
        "127.0.0.1",
        "127.0.0.1:65535",
        "999.1.1.1", /* a reg-name, if not an address */
        "xn--bcher-kva.example",
        "under_score.example",
        "%41%62",
        "a-b.c~d",
        "!$&'()*+,;=",
        "[::1]",
        "[::1]:8080",
        "[2001:db8::7]:443",
        "[::ffff:192.0.2.1]",
        "[v1.fe80::a+en1]",
        "[V7.x:y]:1",
        ":80",
    };
    static const char *const bad[] = {
        "bad host", " a",        "a b:80",    "a\tb",  "a/b",   "a?b",   "a#b",    "a@b",
        "u@a:80",   "a:80:90",   "a:8x",      "a: 80", "a:-1",  "[::1",  "::1",    "[::1]x",
        "[::1]:8a", "[a::b::c]", "[1.2.3.4]", "[]",    "[v1.]", "[v.x]", "[vg.x]", "[::1%25eth0]",
        "%4",       "%zz",       "a%",        "a\"b",  "a<b>",  "a\\b",  "a[b]",   "caf\xc3\xa9",
        "a{b}",     "a|b",       "a^b",       "a`b",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        cr_expect(hdr_host_valid(good[i], strlen(good[i])), "\"%s\" refused", good[i]);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_expect(!hdr_host_valid(bad[i], strlen(bad[i])), "\"%s\" accepted", bad[i]);
    /* only the n bytes given are read */
    cr_expect(hdr_host_valid("a:80 junk", 4));
    cr_expect(!hdr_host_valid("[::1]", 4));
}

Test(headers, per_request_fields_are_told_by_name_in_any_case)
{
    const char *yes[] = { "x-request-id", "X-Request-Id", "grpc-timeout",    "traceparent",
                          "X-B3-SpanId",  "b3",           "x-amzn-trace-id", "grpc-trace-bin" };
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        cr_expect(hdr_per_request(yes[i], strlen(yes[i])), "%s", yes[i]);
    const char *no[] = { "user-agent", "content-type", "x-request-i",     "x-request-idx",
                         "b",          "tracestate",   "x-retry-attempt", "" };
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        cr_expect_not(hdr_per_request(no[i], strlen(no[i])), "%s", no[i]);
    /* the length decides, not a NUL */
    cr_expect(hdr_per_request("x-request-id: 1", 12));
}
