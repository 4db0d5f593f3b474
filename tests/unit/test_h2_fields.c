/* attempt_h2_fields: the header list proxy/head.c builds, as the fields of an HTTP/2 request to
 * an h2c upstream (docs/http2.md; RFC 9113 8.2). */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <string.h>

#include "proxy/attempt.h"

/* The values point into the list: each test's lists are freed by its .fini. */
static struct curl_slist *lists[4];
static size_t n_lists;

static void free_lists(void)
{
    while (n_lists)
        curl_slist_free_all(lists[--n_lists]);
}

TestSuite(h2_fields, .fini = free_lists);

static size_t convert(const char *const *lines, struct h2up_field *f, size_t max, char *names,
                      const char **host, size_t *host_len)
{
    struct curl_slist *l = NULL;
    for (size_t i = 0; lines[i]; i++)
        l = curl_slist_append(l, lines[i]);
    cr_assert_lt(n_lists, 4);
    lists[n_lists++] = l;
    return attempt_h2_fields(l, f, max, names, host, host_len);
}

static bool has(const struct h2up_field *f, size_t n, const char *name, const char *value)
{
    for (size_t i = 0; i < n; i++)
        if (f[i].name_len == strlen(name) && memcmp(f[i].name, name, f[i].name_len) == 0 &&
            f[i].value_len == strlen(value) && memcmp(f[i].value, value, f[i].value_len) == 0)
            return true;
    return false;
}

static bool named(const struct h2up_field *f, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (f[i].name_len == strlen(name) && memcmp(f[i].name, name, f[i].name_len) == 0)
            return true;
    return false;
}

Test(h2_fields, names_are_lowercased_and_values_kept)
{
    const char *lines[] = { "X-Retry-Attempt: 2", "Content-Type: Text/Plain", "X-A: b, C", NULL };
    struct h2up_field f[8];
    char names[256];
    const char *host = NULL;
    size_t hl = 0;
    size_t n = convert(lines, f, 8, names, &host, &hl);
    cr_assert_eq(n, 3);
    cr_expect(has(f, n, "x-retry-attempt", "2"));
    cr_expect(has(f, n, "content-type", "Text/Plain"));
    cr_expect(has(f, n, "x-a", "b, C"));
    cr_expect_null(host);
}

Test(h2_fields, connection_specific_fields_and_host_are_left_out)
{
    const char *lines[] = { "Connection: keep-alive",
                            "Keep-Alive: timeout=5",
                            "Proxy-Connection: close",
                            "Transfer-Encoding: chunked",
                            "Upgrade: websocket",
                            "Host: api.example.com:8443",
                            "X-Kept: 1",
                            NULL };
    struct h2up_field f[8];
    char names[256];
    const char *host = NULL;
    size_t hl = 0;
    size_t n = convert(lines, f, 8, names, &host, &hl);
    cr_expect_eq(n, 1);
    cr_expect(has(f, n, "x-kept", "1"));
    cr_assert_not_null(host);
    cr_expect_eq(hl, strlen("api.example.com:8443"));
    cr_expect_eq(memcmp(host, "api.example.com:8443", hl), 0);
}

Test(h2_fields, te_goes_only_as_trailers)
{
    const char *lines[] = { "TE: gzip", NULL };
    struct h2up_field f[4];
    char names[64];
    const char *host = NULL;
    size_t hl = 0;
    cr_expect_eq(convert(lines, f, 4, names, &host, &hl), 0);
    const char *ok[] = { "TE: Trailers", NULL };
    size_t n = convert(ok, f, 4, names, &host, &hl);
    cr_expect_eq(n, 1);
    cr_expect(has(f, n, "te", "Trailers"));
}

Test(h2_fields, removals_and_empty_values_are_left_out_as_curl_does)
{
    const char *lines[] = { "Accept:", "Expect:", "X-Empty: ", "X-Set: v", NULL };
    struct h2up_field f[8];
    char names[256];
    const char *host = NULL;
    size_t hl = 0;
    size_t n = convert(lines, f, 8, names, &host, &hl);
    cr_expect_eq(n, 1);
    cr_expect(has(f, n, "x-set", "v"));
    cr_expect_not(named(f, n, "accept"));
}

Test(h2_fields, at_most_max_fields)
{
    const char *lines[] = { "A: 1", "B: 2", "C: 3", NULL };
    struct h2up_field f[2];
    char names[64];
    const char *host = NULL;
    size_t hl = 0;
    cr_expect_eq(convert(lines, f, 2, names, &host, &hl), 2);
}
