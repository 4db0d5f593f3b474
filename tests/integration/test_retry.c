/* Retrying, end to end: the real binary against the test upstream on 127.0.0.1. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "tests/support/harness.h"
#include "tests/support/tup.h"

#define T 20000 /* ms: upper bound for any single request in these tests */

static struct tup *up;
static struct px *px;

/* A config with one route to the test upstream; 'retry' is the route's "retry" object. */
static void start(const char *route_extra)
{
    char json[4096];
    up = tup_start();
    snprintf(json, sizeof(json),
             "{\"routes\": [{\"name\": \"r\", \"upstreams\": [\"http://127.0.0.1:%u\"]%s%s}]}",
             tup_port(up), *route_extra ? ", " : "", route_extra);
    px = px_start(json, "--workers", "2", NULL);
}

static void stop(void)
{
    if (px)
        cr_expect_eq(px_stop(px, 10000), 0, "retryproxy did not exit cleanly");
    tup_stop(up);
    px = NULL;
    up = NULL;
}

TestSuite(retry, .fini = stop, .timeout = 60);

Test(retry, two_503s_then_200_is_three_attempts_and_a_200)
{
    start("\"retry\": {\"max_attempts\": 3, \"backoff\": {\"base_ms\": 10, \"jitter\": \"none\"}}");
    char url[128], v[64];
    const char *h[] = { "X-Test-Plan: fail=2;status=503", "X-Request-Id: two-503", NULL };
    struct http_resp r;
    http_do("GET", px_url(px, "/a?b=1", url, sizeof(url)), h, NULL, 0, T, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq(http_header(&r, "X-Retry-Attempts", v, sizeof(v)), "3");
    cr_expect_null(http_header(&r, "X-Retry-Stop", v, sizeof(v)));
    cr_expect_eq(tup_count_id(up, "two-503"), 3);
    for (size_t i = 0; i < 3; i++) {
        const struct tup_req *q = tup_get(up, i);
        char want[8];
        snprintf(want, sizeof(want), "%zu", i + 1);
        cr_expect_str_eq(tup_req_header(q, "X-Retry-Attempt"), want);
        cr_expect_str_eq(q->target, "/a?b=1");
    }
    http_free(&r);
}
