#include <criterion/criterion.h>

#include <string.h>

#include "proxy/headers.h"

Test(headers, hop_by_hop_names_in_any_case)
{
    static const char *const hop[] = { "Connection", "keep-alive",        "PROXY-CONNECTION", "te",
                                       "Trailer",    "transfer-encoding", "Upgrade" };
    for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
        cr_expect(hdr_is_hop_by_hop(hop[i]), "%s", hop[i]);
    cr_expect_not(hdr_is_hop_by_hop("Content-Length"));
    cr_expect_not(hdr_is_hop_by_hop("Trailers"));
    cr_expect_not(hdr_is_hop_by_hop("X-Connection"));
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

Test(headers, match_host_lowercases_and_drops_the_port_unless_asked)
{
    char h[64];
    cr_assert_eq(hdr_match_host("Orders.Internal:8080", false, h, sizeof(h)), 0);
    cr_expect_str_eq(h, "orders.internal");
    cr_assert_eq(hdr_match_host("Orders.Internal:8080", true, h, sizeof(h)), 0);
    cr_expect_str_eq(h, "orders.internal:8080");
    cr_assert_eq(hdr_match_host("[::1]:80", false, h, sizeof(h)), 0);
    cr_expect_str_eq(h, "[::1]");
    cr_assert_eq(hdr_match_host("plain", false, h, sizeof(h)), 0);
    cr_expect_str_eq(h, "plain");
    cr_expect_eq(hdr_match_host("a-very-long-host-name", false, h, 8), -1);
}
