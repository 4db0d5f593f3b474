/* A response that comes in parts over time reaches the client as it comes (docs/forwarding.md
 * "Responses to the client"): a Server-Sent Events feed, a response whose upstream says
 * X-Accel-Buffering: no, and any other response once the HTTP/1.1 front end's short hold is
 * over, over HTTP/1.1 and HTTP/2. The upstream (tests/support/evup.h) records when it sent
 * each part; libcurl, reading the body as it arrives, when each reached the client. A short
 * response that is whole within the hold still goes out in one piece, with its length.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <curl/curl.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/evup.h"
#include "tests/support/fixture.h"

/* The upstream's pace, and how late a part may reach the client after it was sent: far above
 * the hold's 10 ms (a loaded 2-core machine), far below the 1.6 s a response held whole took. */
#define PARTS    5
#define EVERY_MS 400
#define LATE_MS  350

static struct evup *ev;

static void stop_all(void)
{
    fx_stop();
    evup_stop(ev);
    ev = NULL;
}

TestSuite(streaming, .fini = stop_all, .timeout = 60);

#define SSE_HEAD                                                                                   \
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"            \
    "Transfer-Encoding: chunked\r\n\r\n"

/* The proxy with route "r" to an evup sending 'head' and PARTS parts, EVERY_MS apart. */
static void start(const char *head)
{
    ev = evup_start(head, PARTS, EVERY_MS);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r", "\"upstreams\": [\"http://127.0.0.1:%u\"], \"retry\": {\"max_attempts\": 1}",
               ev->port);
    fx_start_b(b, "--workers", "1", NULL);
}

/* What the client saw of one response. */
struct seen {
    char body[1024];
    size_t len;
    int parts;                 /* complete parts ("data: I\n\n") in the body */
    int64_t at_us[EVUP_PARTS]; /* when each was complete, evup_now_us() */
    char headers[4096];
    size_t headers_len;
};

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    struct seen *s = arg;
    size_t k = size * n;
    int64_t now = evup_now_us();
    if (k > sizeof(s->body) - 1 - s->len)
        k = sizeof(s->body) - 1 - s->len;
    memcpy(s->body + s->len, p, k);
    s->len += k;
    s->body[s->len] = '\0';
    int parts = 0;
    for (const char *q = s->body; (q = strstr(q, "\n\n")) != NULL; q += 2)
        parts++;
    for (; s->parts < parts && s->parts < EVUP_PARTS; s->parts++)
        s->at_us[s->parts] = now;
    return size * n;
}

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    struct seen *s = arg;
    size_t k = size * n;
    if (k > sizeof(s->headers) - 1 - s->headers_len)
        k = sizeof(s->headers) - 1 - s->headers_len;
    memcpy(s->headers + s->headers_len, p, k);
    s->headers_len += k;
    s->headers[s->headers_len] = '\0';
    return size * n;
}

/* GET /events over 'version' (a CURL_HTTP_VERSION_*), the body read as it comes. */
static void get(long version, struct seen *s)
{
    memset(s, 0, sizeof(*s));
    CURL *c = curl_easy_init();
    cr_assert_not_null(c);
    curl_easy_setopt(c, CURLOPT_URL, fx_url("/events"));
    curl_easy_setopt(c, CURLOPT_HTTP_VERSION, version);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, s);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    cr_assert_eq(rc, CURLE_OK, "curl: %s", curl_easy_strerror(rc));
}

/* Every part reached the client within LATE_MS of leaving the upstream; the figures logged. */
static void expect_prompt(const struct seen *s, const char *what)
{
    cr_assert_eq(s->parts, PARTS, "%s: %d parts: %s", what, s->parts, s->body);
    double first = (double)(s->at_us[0] - ev->sent_us[0]) / 1000.0, worst = first;
    for (int i = 0; i < PARTS; i++) {
        double late = (double)(s->at_us[i] - ev->sent_us[i]) / 1000.0;
        if (late > worst)
            worst = late;
        cr_expect_lt(late, LATE_MS, "%s: part %d reached the client %.1f ms after it was sent",
                     what, i, late);
    }
    cr_log_info("%s: first part %.3f ms after the upstream sent it, the latest part %.3f ms", what,
                first, worst);
}

/* The field 'name' of the response head, "" when absent. */
static const char *field(const struct seen *s, const char *name)
{
    static char v[256];
    struct http_resp r = { .headers = (char *)s->headers };
    return http_header(&r, name, v, sizeof(v)) ? v : "";
}

/* An event stream is never held: each event goes to the client as it comes, over HTTP/1.1 as
 * over HTTP/2 (where nothing is held). */
Test(streaming, event_stream_parts_reach_the_client_as_they_are_sent)
{
    start(SSE_HEAD);
    struct seen s;
    get(CURL_HTTP_VERSION_1_1, &s);
    expect_prompt(&s, "text/event-stream over HTTP/1.1");
    cr_expect_str_eq(field(&s, "Content-Type"), "text/event-stream");
    cr_expect_str_eq(field(&s, "Transfer-Encoding"), "chunked");
    get(CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE, &s);
    expect_prompt(&s, "text/event-stream over HTTP/2");
}

/* X-Accel-Buffering: no (nginx's field) asks every proxy on the way not to hold the response:
 * honoured, and passed on to the client for the proxies after this one. */
Test(streaming, x_accel_buffering_no_is_honoured_and_passed_on)
{
    start("HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nX-Accel-Buffering: No\r\n"
          "Transfer-Encoding: chunked\r\n\r\n");
    struct seen s;
    get(CURL_HTTP_VERSION_1_1, &s);
    expect_prompt(&s, "X-Accel-Buffering: no over HTTP/1.1");
    cr_expect_str_eq(field(&s, "X-Accel-Buffering"), "No");
}

/* Any other response of unknown length is held a moment at most (to go out whole if it is
 * whole by then), never until it ends. */
Test(streaming, any_response_is_held_a_moment_at_most)
{
    start(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
    struct seen s;
    get(CURL_HTTP_VERSION_1_1, &s);
    expect_prompt(&s, "application/json over HTTP/1.1");
}

/* A short response the upstream sends at once is still answered in one piece: with its length
 * rather than chunked, though it came chunked. */
Test(streaming, a_short_response_whole_at_once_goes_with_its_length)
{
    fx_start_r("", "\"retry\": {\"max_attempts\": 1}", "--workers", "1", NULL);
    const char *h[] = { "X-Test-Plan: chunked=1;body=300", NULL };
    struct http_resp r;
    http_do("GET", fx_url("/x"), h, NULL, 0, 10000, &r);
    cr_assert_eq(r.rc, 0);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, 300);
    cr_expect_str_eq(http_hdr(&r, "Content-Length") ? http_hdr(&r, "Content-Length") : "", "300");
    cr_expect_null(http_hdr(&r, "Transfer-Encoding"));
    http_free(&r);
}
