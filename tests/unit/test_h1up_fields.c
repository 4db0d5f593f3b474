/* h1up_fields: an attempt's own fields and the list proxy/http/head.c builds, as the header list
 * libcurl sends (proxy/upstream/h1up.c; docs/forwarding.md: no field added that the client did not
 * send but the proxy's own). */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/upstream/attempt_int.h"

static struct hlist fields;
static void *block;
static char got[16384];

static void fini(void)
{
    hlist_free(&fields);
    free(block);
}

TestSuite(h1up_fields, .fini = fini);

static void add(const char *k, const char *v)
{
    cr_assert_eq(hlist_add(&fields, k, strlen(k), v, strlen(v)), 0);
}

/* The list libcurl would get, its lines joined by '|'. */
static const char *lines(const char *host_field, int body, size_t n_own)
{
    static const struct hfield own[] = { { "X-Retry-Attempt", "2", 15, 1, false },
                                         { "grpc-timeout", "5m", 12, 2, true } };
    struct attempt_req req = {
        .method = "GET", .target = "/", .fields = &fields, .own = own, .n_own = n_own
    };
    req.body = body;
    free(block);
    block = NULL;
    struct curl_slist *l = h1up_fields(host_field, &req, &block);
    got[0] = '\0';
    for (; l; l = l->next) {
        cr_assert_lt(strlen(got) + strlen(l->data) + 2, sizeof(got));
        strcat(got, l->data);
        if (l->next)
            strcat(got, "|");
    }
    return got;
}

Test(h1up_fields, host_first_then_the_attempts_own_then_the_request_and_curls_removals)
{
    add("X-A", "b");
    add("X-Forwarded-Proto", "http");
    cr_assert_str_eq(lines("Host: up:8080", ATTEMPT_BODY_NONE, 2),
                     "Host: up:8080|X-Retry-Attempt: 2|grpc-timeout: 5m|X-A: b|"
                     "X-Forwarded-Proto: http|Accept:");
}

Test(h1up_fields, a_preserved_host_keeps_its_place_and_the_urls_goes_out)
{
    add("Host", "api.example.com");
    add("Accept", "text/plain");
    cr_assert_str_eq(lines("Host: up:8080", ATTEMPT_BODY_NONE, 1),
                     "X-Retry-Attempt: 2|Host: api.example.com|Accept: text/plain");
}

Test(h1up_fields, an_empty_value_goes_as_curl_spells_it)
{
    add("X-Empty", "");
    add("Accept", "");
    cr_assert_str_eq(lines(NULL, ATTEMPT_BODY_NONE, 0), "X-Empty;|Accept;");
}

Test(h1up_fields, a_body_removes_expect_and_a_form_content_type_unless_the_client_sent_one)
{
    add("X-A", "b");
    cr_assert_str_eq(lines(NULL, ATTEMPT_BODY_BUFFER, 0), "X-A: b|Accept:|Expect:|Content-Type:");
    add("Content-Type", "application/json");
    cr_assert_str_eq(lines(NULL, ATTEMPT_BODY_STREAM, 0),
                     "X-A: b|Content-Type: application/json|Accept:|Expect:");
}

Test(h1up_fields, many_fields_fit_their_one_allocation)
{
    char k[16], v[64];
    for (int i = 0; i < 150; i++) {
        snprintf(k, sizeof(k), "X-%d", i);
        memset(v, 'a' + i % 26, sizeof(v) - 1);
        v[(size_t)i % sizeof(v)] = '\0';
        add(k, v);
    }
    lines("Host: up", ATTEMPT_BODY_BUFFER, 2);
    size_t n = 0;
    for (const char *p = got; (p = strchr(p, '|')); p++)
        n++;
    cr_assert_eq(n + 1, 1 + 2 + 150 + 3);
}
