/* attempt_h2_fields: an attempt's own fields and the list proxy/http/head.c builds, as the fields
 * of an HTTP/2 request to an h2c upstream (docs/http2.md; RFC 9113 8.2). */
#include <criterion/criterion.h>
#include <string.h>

#include "proxy/upstream/attempt_int.h"
#include "proxy/upstream/h2up.h"

/* The values point into the lists: each test's lists are freed by its .fini. */
static struct hlist lists[4];
static size_t n_lists;

static void free_lists(void)
{
    while (n_lists)
        hlist_free(&lists[--n_lists]);
}

TestSuite(h2_fields, .fini = free_lists);

/* One conversion: the fields, their names' buffer, Host's value. */
struct conv {
    struct h2up_field f[8];
    char names[256];
    const char *host;
    size_t host_len, n;
};

/* Fills 'c' (its names point into it: not to be copied) from "Name: value" lines, the first
 * 'n_own' of them the attempt's own. */
static const struct conv *convert_own(struct conv *c, const char *const *lines, size_t n_own,
                                      size_t max)
{
    cr_assert_lt(n_lists, 4);
    struct hlist *l = &lists[n_lists++];
    struct hfield own[4];
    size_t i = 0;
    for (; lines[i]; i++) {
        const char *colon = strchr(lines[i], ':');
        cr_assert_not_null(colon);
        const char *v = colon[1] == ' ' ? colon + 2 : colon + 1;
        if (i < n_own) {
            cr_assert_lt(i, 4);
            own[i] = (struct hfield){ lines[i], v, (size_t)(colon - lines[i]), strlen(v), false };
        } else {
            cr_assert_eq(hlist_add(l, lines[i], (size_t)(colon - lines[i]), v, strlen(v)), 0);
        }
    }
    c->host = NULL;
    c->n = attempt_h2_fields(own, n_own < i ? n_own : i, l, c->f, max, c->names, &c->host,
                             &c->host_len);
    return c;
}

static const struct conv *convert(struct conv *c, const char *const *lines, size_t max)
{
    return convert_own(c, lines, 0, max);
}

static bool has(const struct conv *c, const char *name, const char *value)
{
    const struct h2up_field *f = c->f;
    size_t n = c->n;
    for (size_t i = 0; i < n; i++)
        if (f[i].name_len == strlen(name) && memcmp(f[i].name, name, f[i].name_len) == 0 &&
            f[i].value_len == strlen(value) && memcmp(f[i].value, value, f[i].value_len) == 0)
            return true;
    return false;
}

static bool named(const struct conv *c, const char *name)
{
    const struct h2up_field *f = c->f;
    size_t n = c->n;
    for (size_t i = 0; i < n; i++)
        if (f[i].name_len == strlen(name) && memcmp(f[i].name, name, f[i].name_len) == 0)
            return true;
    return false;
}

Test(h2_fields, names_are_lowercased_and_values_kept)
{
    const char *lines[] = { "X-Retry-Attempt: 2", "Content-Type: Text/Plain", "X-A: b, C", NULL };
    struct conv c;
    convert(&c, lines, 8);
    cr_assert_eq(c.n, 3);
    cr_expect(has(&c, "x-retry-attempt", "2"));
    cr_expect(has(&c, "content-type", "Text/Plain"));
    cr_expect(has(&c, "x-a", "b, C"));
    cr_expect_null(c.host);
    cr_expect_not(named(&c, "host"));
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
    struct conv c;
    convert(&c, lines, 8);
    cr_expect_eq(c.n, 1);
    cr_expect(has(&c, "x-kept", "1"));
    cr_assert_not_null(c.host);
    cr_expect_eq(c.host_len, strlen("api.example.com:8443"));
    cr_expect_eq(memcmp(c.host, "api.example.com:8443", c.host_len), 0);
}

Test(h2_fields, te_goes_only_as_trailers)
{
    const char *gzip[] = { "TE: gzip", NULL };
    struct conv g;
    cr_expect_eq(convert(&g, gzip, 8)->n, 0);
    const char *ok[] = { "TE: Trailers", NULL };
    struct conv c;
    convert(&c, ok, 8);
    cr_expect_eq(c.n, 1);
    cr_expect(has(&c, "te", "Trailers"));
}

/* An empty value is a field all the same (RFC 9110 5.5): it goes, as it does over HTTP/1.1
 * (issue 37); whitespace alone is an empty value. An empty Host is no authority. */
Test(h2_fields, empty_values_go_as_over_http1)
{
    const char *lines[] = { "Accept:", "X-Empty:  ", "X-Set: v", "Host:", NULL };
    struct conv c;
    convert(&c, lines, 8);
    cr_expect_eq(c.n, 3);
    cr_expect(has(&c, "accept", ""));
    cr_expect(has(&c, "x-empty", ""));
    cr_expect(has(&c, "x-set", "v"));
    cr_expect_null(c.host);
    cr_expect_not(named(&c, "host"));
}

Test(h2_fields, the_attempts_own_fields_go_first)
{
    const char *lines[] = { "X-Retry-Attempt: 2", "grpc-timeout: 5m", "X-A: b", NULL };
    struct conv c;
    convert_own(&c, lines, 2, 8);
    cr_assert_eq(c.n, 3);
    cr_expect_eq(memcmp(c.f[0].name, "x-retry-attempt", 15), 0);
    cr_expect_eq(memcmp(c.f[1].name, "grpc-timeout", 12), 0);
    cr_expect(has(&c, "x-a", "b"));
}

Test(h2_fields, at_most_max_fields)
{
    const char *lines[] = { "A: 1", "B: 2", "C: 3", NULL };
    struct conv c;
    cr_expect_eq(convert(&c, lines, 2)->n, 2);
}

static bool never_indexed(const struct conv *c, const char *name)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->f[i].name_len == strlen(name) && memcmp(c->f[i].name, name, c->f[i].name_len) == 0)
            return c->f[i].never_index;
    cr_assert_fail("no field %s", name);
    return false;
}

/* A request id, a trace id or a deadline differs on every request: HPACK gets them as literals
 * never indexed (hdr_per_request()), the rest as it chooses. */
Test(h2_fields, values_of_one_request_alone_are_never_indexed)
{
    const char *lines[] = { "X-Request-Id: 5d1f", "Traceparent: 00-4bf9-00f0-01",
                            "User-Agent: grpc-go/1.60", "X-B3-TraceId: 80f1", NULL };
    struct conv c;
    convert(&c, lines, 8);
    cr_assert_eq(c.n, 4);
    cr_expect(never_indexed(&c, "x-request-id"));
    cr_expect(never_indexed(&c, "traceparent"));
    cr_expect(never_indexed(&c, "x-b3-traceid"));
    cr_expect_not(never_indexed(&c, "user-agent"));

    /* the attempt's own: the deadline header's time left is one of them, the attempt number not */
    static const struct hfield own[] = { { "X-Retry-Attempt", "1", 15, 1, false },
                                         { "X-Deadline-Ms", "250", 13, 3, true } };
    struct conv o;
    o.n = attempt_h2_fields(own, 2, NULL, o.f, 8, o.names, &o.host, &o.host_len);
    cr_assert_eq(o.n, 2);
    cr_expect_not(never_indexed(&o, "x-retry-attempt"));
    cr_expect(never_indexed(&o, "x-deadline-ms"));
}
