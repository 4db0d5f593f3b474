/* The request line as an operator reads it (docs/logs.md): durations to a tenth of a
 * millisecond and histogram sums to the microsecond (docs/metrics.md).
 *
 * Each test reads the proxy's stdout and checks the request line against what the client sent
 * and got and what the test upstream received.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/fixture.h"

#define T 10000 /* ms: upper bound for any single request in these tests */

TestSuite(access_log, .fini = fx_stop, .timeout = 60);

/* Routes: /base/... to upstream 0 under the base path /up (its URL ".../up"), anything else to
 * upstream 0 as it is; no route for /none. */
static void start(const char *level)
{
    fx_upstreams(1);
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"log\": {\"level\": \"%s\"}", level);
    cfgb_route(b, "based", "\"match\": {\"path_prefix\": \"/base\"}, \"upstreams\": [\"%s/up\"]",
               fx_up_url(0));
    cfgb_route(b, "r", "\"match\": {\"path_prefix\": \"/r\"}");
    fx_start_b(b, "--workers", "2", NULL);
}

/* The request line with request id 'id' (asserted), caller decrefs. */
static json_t *logged(const char *id)
{
    json_t *l = fx_request_logged("request_id", id);
    cr_assert(l, "no request line for %s:\n%s", id, px_stdout(px));
    return l;
}

static double num(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    cr_assert(json_is_number(v), "%s is not a number", key);
    return json_number_value(v);
}

/* Whether a duration in ms has a tenth that is not 0: not a whole millisecond. */
static bool has_tenths(double ms)
{
    return fabs(ms - round(ms)) >= 0.05;
}

/* ---- durations (docs/logs.md, docs/metrics.md) ---- */

/* An upstream that answers after 3 ms: the request and attempt lines say at least 3 ms, to the
 * tenth, not in whole milliseconds read from the loop's per-turn clock. */
Test(access_log, durations_have_tenths_of_a_millisecond)
{
    start("debug");
    int tenths = 0;
    for (int i = 0; i < 6; i++) {
        char id[32], idh[64], url[128];
        snprintf(id, sizeof(id), "slow-%d", i);
        snprintf(idh, sizeof(idh), "X-Request-Id: %s", id);
        const char *h[] = { idh, "X-Test-Plan: delay=3", NULL };
        struct http_resp r;
        http_do("GET", px_url(px, "/r/slow", url, sizeof(url)), h, NULL, 0, T, &r);
        cr_assert_eq(r.status, 200);
        http_free(&r);

        json_t *l = logged(id);
        double d = num(l, "duration_ms");
        cr_expect(d >= 3.0 && d < 5000, "duration_ms %.1f for an answer after 3 ms", d);
        tenths += has_tenths(d);
        json_decref(l);
        json_t *a = fx_logged("attempt", "request_id", id);
        cr_assert(a, "no attempt line for %s", id);
        double ad = num(a, "duration_ms");
        cr_expect(ad >= 3.0 && ad <= d, "attempt duration_ms %.1f (request %.1f)", ad, d);
        tenths += has_tenths(ad);
        json_decref(a);
    }
    /* a whole number of ms by chance: one in ten for each of the twelve */
    cr_expect_gt(tenths, 0, "every duration a whole number of milliseconds");
}

/* The sum of every series of 'family' (a histogram's _sum) for route 'route', whatever other
 * labels it has. */
static double family_sum(const char *text, const char *family, const char *route)
{
    char want[64];
    snprintf(want, sizeof(want), "route=\"%s\"", route);
    size_t fl = strlen(family);
    double sum = 0;
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        const char *sp = memchr(line, ' ', n);
        if (sp && strncmp(line, family, fl) == 0 && line[fl] == '{') {
            char *lbl = strndup(line, (size_t)(sp - line));
            if (strstr(lbl, want))
                sum += strtod(sp + 1, NULL);
            free(lbl);
        }
        line = end ? end + 1 : NULL;
    }
    return sum;
}

/* Loopback attempts take well under a millisecond: their sums are not 0, nor whole ms. */
Test(access_log, loopback_durations_sum_to_the_microsecond)
{
    start("info");
    for (int i = 0; i < 8; i++) {
        char url[128];
        struct http_resp r;
        http_do("GET", px_url(px, "/r/fast", url, sizeof(url)), NULL, NULL, 0, T, &r);
        cr_assert_eq(r.status, 200);
        http_free(&r);
    }
    char url[128];
    struct http_resp m;
    http_do("GET", px_admin_url(px, "/metrics", url, sizeof(url)), NULL, NULL, 0, T, &m);
    cr_assert_eq(m.status, 200);
    char *text = strndup((const char *)m.body, m.body_len);
    double att = family_sum(text, "retryproxy_attempt_duration_seconds_sum", "r");
    double req = family_sum(text, "retryproxy_request_duration_seconds_sum", "r");
    free(text);
    http_free(&m);
    cr_expect_gt(att, 0, "attempt_duration_seconds_sum is 0 after 8 attempts");
    cr_expect_gt(req, 0, "request_duration_seconds_sum is 0 after 8 requests");
    cr_expect_lt(att, 8 * 5.0);
    /* whole milliseconds by chance: one in a thousand for each */
    bool whole_att = fabs(att * 1000 - round(att * 1000)) < 1e-6;
    bool whole_req = fabs(req * 1000 - round(req * 1000)) < 1e-6;
    cr_expect(!(whole_att && whole_req), "sums of whole milliseconds: %.6f, %.6f", att, req);
}
