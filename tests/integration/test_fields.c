/* Request fields on the way upstream, sent as raw bytes (docs/forwarding.md, docs/hardening.md):
 * what the proxy adds (nothing of libcurl's own), which names it will not pass on (underscore
 * look-alikes of the fields it manages), which Host values it refuses, how it reads the
 * values it parses (whitespace around them is not part of them), and that an empty value
 * crosses both ways over HTTP/1.1 and h2c on either side.
 *
 * Each case asserts what the test upstream received, every field in order where it matters.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/h2u.h"
#include "tests/support/rawup.h"

#define READ_MS 5000

static void stop_all(void)
{
    h2u_stop_all();
    fx_stop();
}

TestSuite(fields, .fini = stop_all, .timeout = 90);

struct answer {
    char buf[16384];
    size_t len;
    int status;
    const char *body; /* after the head, or "" */
};

/* Sends 'req' on a fresh connection (the request should say Connection: close) and reads the
 * answer until the proxy closes. */
static void exchange(const char *req, struct answer *a)
{
    int fd = raw_dial(px->port);
    cr_assert(raw_send_all(fd, req, strlen(req)));
    a->len = 0;
    int64_t end = now_ms() + READ_MS;
    while (a->len < sizeof(a->buf) - 1) {
        int left = (int)(end - now_ms());
        ssize_t n =
            left > 0 ? raw_recv(fd, a->buf + a->len, sizeof(a->buf) - 1 - a->len, left) : -2;
        if (n <= 0)
            break;
        a->len += (size_t)n;
    }
    close(fd);
    a->buf[a->len] = '\0';
    a->status = 0;
    if (a->len > 12 && memcmp(a->buf, "HTTP/1.", 7) == 0)
        a->status = atoi(a->buf + 9);
    const char *b = strstr(a->buf, "\r\n\r\n");
    a->body = b ? b + 4 : "";
}

/* Every field 'q' carries but Host, X-Forwarded-For and X-Retry-Attempt (the proxy's, checked
 * elsewhere), as "name: value\n" in the order received. */
static void fields_of(const struct tup_req *q, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < q->n_headers; i++) {
        const struct tup_header *h = &q->headers[i];
        if (!strcasecmp(h->name, "Host") || !strcasecmp(h->name, "X-Forwarded-For") ||
            !strcasecmp(h->name, "X-Retry-Attempt"))
            continue;
        int n = snprintf(out + used, cap - used, "%s: %s\n", h->name, h->value);
        cr_assert(n >= 0 && (size_t)n < cap - used, "fields longer than %zu bytes", cap);
        used += (size_t)n;
    }
}

/* The record of the only request the upstream saw with X-Request-Id 'id'. */
static const struct tup_req *record(const char *id)
{
    tup_wait_count(up, 1, 3000);
    cr_assert_eq(tup_count_id(up, id), 1, "the upstream saw %zu requests with id %s",
                 tup_count_id(up, id), id);
    for (size_t i = 0; i < tup_count(up); i++)
        if (strcmp(tup_get(up, i)->request_id, id) == 0)
            return tup_get(up, i);
    return NULL;
}

/* ---- item: nothing of libcurl's own is added ---- */

struct sent {
    const char *id;
    const char *head; /* request line and fields before X-Request-Id */
    const char *rest; /* fields after it, the blank line, the body */
    const char *want; /* every field the upstream received (fields_of) */
    size_t body_len;
};

#define ID(x) "X-Request-Id: " x "\r\nConnection: close\r\n"

/* libcurl adds Content-Type: application/x-www-form-urlencoded to a body given as a buffer,
 * and the proxy buffers every body it may replay, an empty one included. */
static const struct sent no_added_field[] = {
    { "cl0-post", "POST /a HTTP/1.1\r\nHost: a\r\n", "Content-Length: 0\r\n\r\n",
      "X-Forwarded-Proto: http\nX-Request-Id: cl0-post\nContent-Length: 0\n", 0 },
    { "cl0-get", "GET /a HTTP/1.1\r\nHost: a\r\n", "Content-Length: 0\r\n\r\n",
      "X-Forwarded-Proto: http\nX-Request-Id: cl0-get\nContent-Length: 0\n", 0 },
    { "cl0-put", "PUT /a HTTP/1.1\r\nHost: a\r\n", "Content-Length: 0\r\n\r\n",
      "X-Forwarded-Proto: http\nX-Request-Id: cl0-put\nContent-Length: 0\n", 0 },
    { "cl0-patch", "PATCH /a HTTP/1.1\r\nHost: a\r\n", "Content-Length: 0\r\n\r\n",
      "X-Forwarded-Proto: http\nX-Request-Id: cl0-patch\nContent-Length: 0\n", 0 },
    { "cl0-delete", "DELETE /a HTTP/1.1\r\nHost: a\r\n", "Content-Length: 0\r\n\r\n",
      "X-Forwarded-Proto: http\nX-Request-Id: cl0-delete\nContent-Length: 0\n", 0 },
    { "cl0-options", "OPTIONS /a HTTP/1.1\r\nHost: a\r\n", "Content-Length: 0\r\n\r\n",
      "X-Forwarded-Proto: http\nX-Request-Id: cl0-options\nContent-Length: 0\n", 0 },
    { "cl0-http10", "POST /a HTTP/1.0\r\n", "Content-Length: 0\r\n\r\n",
      "X-Forwarded-Proto: http\nX-Request-Id: cl0-http10\nContent-Length: 0\n", 0 },
    { "cl3-post", "POST /a HTTP/1.1\r\nHost: a\r\n", "Content-Length: 3\r\n\r\nabc",
      "X-Forwarded-Proto: http\nX-Request-Id: cl3-post\nContent-Length: 3\n", 3 },
    { "chunked0-post", "POST /a HTTP/1.1\r\nHost: a\r\n",
      "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
      "X-Forwarded-Proto: http\nX-Request-Id: chunked0-post\nContent-Length: 0\n", 0 },
    { "own-type", "POST /a HTTP/1.1\r\nHost: a\r\nContent-Type: text/plain\r\n",
      "Content-Length: 0\r\n\r\n",
      "Content-Type: text/plain\nX-Forwarded-Proto: http\nX-Request-Id: own-type\n"
      "Content-Length: 0\n",
      0 },
    { "empty-type", "POST /a HTTP/1.1\r\nHost: a\r\nContent-Type:\r\n", "Content-Length: 0\r\n\r\n",
      "Content-Type: \nX-Forwarded-Proto: http\nX-Request-Id: empty-type\nContent-Length: 0\n", 0 },
    { "no-length", "GET /a HTTP/1.1\r\nHost: a\r\n", "\r\n",
      "X-Forwarded-Proto: http\nX-Request-Id: no-length\n", 0 },
};

Test(fields, no_field_of_libcurls_own_reaches_the_upstream_whatever_the_body)
{
    fx_start_r("", "\"retry\": {\"retry_on\": []}", "--workers", "1", NULL);
    for (size_t i = 0; i < sizeof(no_added_field) / sizeof(no_added_field[0]); i++) {
        const struct sent *c = &no_added_field[i];
        char req[1024];
        snprintf(req, sizeof(req), "%s" ID("%s") "%s", c->head, c->id, c->rest);
        struct answer a;
        exchange(req, &a);
        cr_expect_eq(a.status, 200, "%s: status %d: %s", c->id, a.status, a.buf);
        const struct tup_req *q = record(c->id);
        char got[2048];
        fields_of(q, got, sizeof(got));
        cr_expect_str_eq(got, c->want, "%s: the upstream received\n%s", c->id, got);
        cr_expect_eq(q->body_len, c->body_len, "%s: body of %llu bytes", c->id,
                     (unsigned long long)q->body_len);
    }
}

/* ---- item: the whitespace around a value is not part of it (RFC 9110 5.5) ---- */

/* The value of 'name' the upstream received in the request with id 'id', as a number. */
static long number_in(const char *id, const char *name)
{
    const struct tup_req *q = record(id);
    const char *v = tup_req_header(q, name);
    cr_assert_not_null(v, "%s: no %s", id, name);
    return strtol(v, NULL, 10);
}

Test(fields, values_the_proxy_reads_are_read_without_surrounding_whitespace)
{
    fx_start_r("",
               "\"timeout_ms\": 5000, \"deadline_header\": \"X-Deadline-Ms\", "
               "\"retry\": {\"retry_on\": [\"503\"], \"methods\": [\"GET\"], " CFG_FAST "}",
               "--workers", "1", NULL);
    /* X-Retry-Timeout-Ms: the deadline the upstream is told is the client's 700 ms */
    static const char *const timeouts[][2] = {
        { "to-trailing", "700 " },
        { "to-leading", " 700" },
        { "to-tabs", "\t700\t" },
        { "to-plain", "700" },
    };
    for (size_t i = 0; i < sizeof(timeouts) / sizeof(timeouts[0]); i++) {
        char req[512];
        snprintf(req, sizeof(req),
                 "GET /t HTTP/1.1\r\nHost: a\r\n" ID("%s") "X-Retry-Timeout-Ms: %s\r\n\r\n",
                 timeouts[i][0], timeouts[i][1]);
        struct answer a;
        exchange(req, &a);
        cr_expect_eq(a.status, 200, "%s: %d", timeouts[i][0], a.status);
        long v = number_in(timeouts[i][0], "X-Deadline-Ms");
        cr_expect(v <= 700 && v > 200, "%s: the upstream was told %ld ms, want 700", timeouts[i][0],
                  v);
    }
    /* X-Retry-Max-Attempts: "1 " is one attempt, so the 503 is the answer */
    struct answer a;
    exchange("GET /m HTTP/1.1\r\nHost: a\r\n" ID(
                 "max-trailing") "X-Test-Plan: fail=1\r\nX-Retry-Max-Attempts: 1 \r\n\r\n",
             &a);
    cr_expect_eq(a.status, 503, "X-Retry-Max-Attempts: \"1 \": %d", a.status);
    cr_expect_eq(tup_count_id(up, "max-trailing"), 1);
    /* X-Request-Id: the id is the value without its whitespace, in the log too */
    exchange(
        "GET /i HTTP/1.1\r\nHost: a\r\nX-Request-Id: \tspaced-id \t\r\nConnection: close\r\n\r\n",
        &a);
    cr_expect_eq(a.status, 200);
    cr_expect_eq(tup_count_id(up, "spaced-id"), 1);
    /* Idempotency-Key: a POST with a key is retried; a key of whitespace only is no key */
    exchange(
        "POST /k HTTP/1.1\r\nHost: a\r\n" ID(
            "key-set") "X-Test-Plan: fail=1\r\nIdempotency-Key: k1 \r\nContent-Length: 0\r\n\r\n",
        &a);
    cr_expect_eq(a.status, 200, "a POST with a key is retried: %d", a.status);
    cr_expect_eq(tup_count_id(up, "key-set"), 2);
    exchange(
        "POST /k HTTP/1.1\r\nHost: a\r\n" ID("key-blank") "X-Test-Plan: fail=1\r\nIdempotency-Key: "
                                                          " \t \r\nContent-Length: 0\r\n\r\n",
        &a);
    cr_expect_eq(a.status, 503, "a blank key makes no POST retryable: %d", a.status);
    cr_expect_eq(tup_count_id(up, "key-blank"), 1);
}

/* A route's pushback header on a response: whitespace around the number does not make it
 * invalid (libcurl hands the proxy the field line with it; Retry-After is read the same way). */
Test(fields, response_values_are_read_without_surrounding_whitespace)
{
    fx_start_r("",
               "\"retry\": {\"retry_on\": [\"503\"], " CFG_FAST
               ", \"pushback_header\": \"X-Pushback-Ms\"}",
               "--workers", "1", NULL);
    struct answer a;
    /* a pushback of "300 " is a wait of 300 ms before the retry, not a refusal */
    int64_t t0 = now_ms();
    exchange("GET /p HTTP/1.1\r\nHost: a\r\n" ID(
                 "push") "X-Test-Plan: fail=1;header=X-Pushback-Ms: 300 ;ok=200\r\n\r\n",
             &a);
    int64_t took = now_ms() - t0;
    cr_expect_eq(a.status, 200, "pushback: %d: %s", a.status, a.buf);
    cr_expect_eq(tup_count_id(up, "push"), 2);
    cr_expect(took >= 290, "the retry came after %lld ms, want 300", (long long)took);
}

/* ---- item: a Host that is not uri-host [ ":" port ] is a 400 (RFC 9112 3.2, RFC 9110 7.2) ---- */

Test(fields, an_invalid_host_is_refused_with_400_and_reaches_no_upstream)
{
    fx_start_r("", "\"retry\": {\"retry_on\": []}", "--workers", "1", NULL);
    static const char *const bad[] = {
        "GET / HTTP/1.1\r\nHost: bad host\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a/b\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a:80:80\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a:http\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: [::1\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a@b\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.0\r\nHost: a,b c\r\n\r\n",
        "GET http://a b/ HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET http://a:x/ HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct answer a;
        exchange(bad[i], &a);
        cr_expect_eq(a.status, 400, "case %zu: %d: %s", i, a.status, a.buf);
        cr_expect(strstr(a.buf, "Content-Type: application/json") != NULL, "case %zu: %s", i,
                  a.buf);
        cr_expect(strncmp(a.body, "{\"error\": \"bad_request\"", 23) == 0, "case %zu: %s", i,
                  a.body);
    }
    struct answer a;
    exchange(bad[0], &a);
    cr_expect(strstr(a.body, "Host") != NULL, "the message names Host: %s", a.body);
    sleep_ms(50);
    cr_expect_eq(tup_count(up), 0, "the upstream received %zu requests", tup_count(up));

    static const char *const good[][2] = {
        { "Host: a:8080", "host-port" },  { "Host: [::1]:8080", "host-v6" },
        { "Host: 127.0.0.1", "host-v4" }, { "Host: x_y.example ", "host-underscore" },
        { "Host:", "host-empty" },        { "Host: %41", "host-pct" },
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        char req[256];
        snprintf(req, sizeof(req), "GET /ok HTTP/1.1\r\n%s\r\n" ID("%s") "\r\n", good[i][0],
                 good[i][1]);
        exchange(req, &a);
        cr_expect_eq(a.status, 200, "%s: %d: %s", good[i][0], a.status, a.buf);
        record(good[i][1]);
    }
}

/* ---- item: underscore look-alikes of the fields the proxy manages ---- */

/* CGI and WSGI servers (gunicorn) map X_Forwarded_Proto and X-Forwarded-Proto to one variable
 * and merge them: "HTTP_X_FORWARDED_PROTO=https,http". */
#define UNDERSCORED                                                                                \
    "X_Forwarded_Proto: https\r\nX_Retry_Attempt: 99\r\nX_Request_Id: spoofed\r\n"                 \
    "Transfer_Encoding: chunked\r\nContent_Length: 5\r\nX-Kept: 1\r\n"

static void underscores_start(const char *value)
{
    char top[128] = "";
    if (value)
        snprintf(top, sizeof(top), "\"limits\": {\"headers_with_underscores\": \"%s\"}", value);
    fx_start_r(top, "\"retry\": {\"retry_on\": []}", "--workers", "1", NULL);
}

Test(fields, underscored_names_are_dropped_by_default)
{
    underscores_start(NULL);
    struct answer a;
    exchange("GET /u HTTP/1.1\r\nHost: a\r\n" UNDERSCORED ID("us-drop") "\r\n", &a);
    cr_expect_eq(a.status, 200, "%d: %s", a.status, a.buf);
    char got[1024];
    fields_of(record("us-drop"), got, sizeof(got));
    cr_expect_str_eq(got, "X-Kept: 1\nX-Forwarded-Proto: http\nX-Request-Id: us-drop\n");
    /* and explicitly */
    fx_stop();
    underscores_start("drop");
    exchange("GET /u HTTP/1.1\r\nHost: a\r\n" UNDERSCORED ID("us-drop2") "\r\n", &a);
    cr_expect_eq(a.status, 200);
    fields_of(record("us-drop2"), got, sizeof(got));
    cr_expect_str_eq(got, "X-Kept: 1\nX-Forwarded-Proto: http\nX-Request-Id: us-drop2\n");
}

Test(fields, underscored_names_are_refused_with_400_when_reject)
{
    underscores_start("reject");
    struct answer a;
    exchange("GET /u HTTP/1.1\r\nHost: a\r\n" UNDERSCORED ID("us-reject") "\r\n", &a);
    cr_expect_eq(a.status, 400, "%d: %s", a.status, a.buf);
    cr_expect(strstr(a.buf, "Content-Type: application/json") != NULL, "%s", a.buf);
    cr_expect(strncmp(a.body, "{\"error\": \"bad_request\"", 23) == 0, "%s", a.body);
    cr_expect(strstr(a.body, "underscore: X_Forwarded_Proto\"") != NULL, "names the field: %s",
              a.body);
    exchange("GET /u HTTP/1.1\r\nHost: a\r\nX-Kept: 1\r\n" ID("us-clean") "\r\n", &a);
    cr_expect_eq(a.status, 200, "a request without one passes: %d", a.status);
    cr_expect_eq(tup_count_id(up, "us-reject"), 0);
    cr_expect_eq(tup_count(up), 1);
}

Test(fields, underscored_names_are_forwarded_when_allow)
{
    underscores_start("allow");
    struct answer a;
    exchange("GET /u HTTP/1.1\r\nHost: a\r\n" UNDERSCORED ID("us-allow") "\r\n", &a);
    cr_expect_eq(a.status, 200, "%d: %s", a.status, a.buf);
    char got[1024];
    fields_of(record("us-allow"), got, sizeof(got));
    cr_expect_str_eq(got, "X_Forwarded_Proto: https\nX_Retry_Attempt: 99\nX_Request_Id: spoofed\n"
                          "Transfer_Encoding: chunked\nContent_Length: 5\nX-Kept: 1\n"
                          "X-Forwarded-Proto: http\nX-Request-Id: us-allow\n");
}

/* The setting is reloadable: a request is read under the config it started with. */
Test(fields, headers_with_underscores_changes_on_reload)
{
    fx_upstreams(1);
    fx_config_dir("fields");
    char *text = cfg_r("\"limits\": {\"headers_with_underscores\": \"reject\"}", "");
    cfg_write_renamed(fx_cfg_path, text);
    free(text);
    const char *args[] = { "-c",          fx_cfg_path, "--listen", "127.0.0.1:0", "--admin",
                           "127.0.0.1:0", "--workers", "1",        NULL };
    fx_start_argv(args);
    struct answer a;
    exchange("GET /u HTTP/1.1\r\nHost: a\r\n" UNDERSCORED ID("reload-1") "\r\n", &a);
    cr_expect_eq(a.status, 400, "under reject: %d", a.status);

    text = cfg_r("\"limits\": {\"headers_with_underscores\": \"allow\"}", "");
    cfg_write_renamed(fx_cfg_path, text);
    free(text);
    int64_t end = now_ms() + 5000;
    bool applied = false;
    while (!applied && now_ms() < end) {
        json_t *c = fx_admin_get_json("/config");
        json_t *limits = json_object_get(json_object_get(c, "config"), "limits");
        const char *v = json_str(limits, "headers_with_underscores");
        applied = v && strcmp(v, "allow") == 0;
        json_decref(c);
        if (!applied)
            sleep_ms(50);
    }
    cr_assert(applied, "the reload did not show in /config within 5 s");
    exchange("GET /u HTTP/1.1\r\nHost: a\r\n" UNDERSCORED ID("reload-2") "\r\n", &a);
    cr_expect_eq(a.status, 200, "under allow: %d", a.status);
    cr_expect_str_eq(tup_req_header(record("reload-2"), "X_Forwarded_Proto"), "https");
}

/* A field the head's Connection names is the client's hop's, in the head and in the trailers
 * alike (docs/forwarding.md, "Which fields cross"): the trailer X-Hop stays out as the head's
 * would, beside the trailers that go. */
Test(fields, a_field_the_heads_connection_names_stays_out_of_the_trailers_too)
{
    underscores_start(NULL);
    struct answer a;
    exchange("PUT /t HTTP/1.1\r\nHost: a\r\nConnection: X-Hop, close\r\n" ID(
                 "conn-trl") "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Hop: 1\r\n"
                             "X-Checksum: abc\r\nX-Other: 2\r\n\r\n",
             &a);
    cr_expect_eq(a.status, 200, "%d: %s", a.status, a.buf);
    const struct tup_req *q = record("conn-trl");
    cr_expect_eq(q->body_len, 5);
    cr_expect_str_eq(tup_req_trailer(q, "X-Checksum"), "abc");
    cr_expect_str_eq(tup_req_trailer(q, "X-Other"), "2");
    cr_expect_null(tup_req_trailer(q, "X-Hop"), "the trailer the head's Connection names went up");
    cr_expect_eq(q->n_trailers, 2, "%zu trailers", q->n_trailers);
}

/* ---- an empty value is a field all the same (RFC 9110 5.5), over every pair of protocols ---- */

/* Whether the head 'head' has a field 'name' (case-insensitive) whose value is empty: nothing
 * but optional whitespace before its line's end. */
static bool empty_in(const char *head, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = strstr(head, "\r\n"); p; p = strstr(p + 2, "\r\n")) {
        if (strncasecmp(p + 2, name, nl) != 0 || p[2 + nl] != ':')
            continue;
        const char *v = p + 3 + nl;
        v += strspn(v, " \t");
        return strncmp(v, "\r\n", 2) == 0;
    }
    return false;
}

/* An HTTP/1.1 upstream's answer with an empty field. */
static const char EMPTY_ANSWER[] =
    "HTTP/1.1 200 OK\r\nX-Empty:\r\nX-Set: v\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";

/* A request with an empty X-Empty goes from an HTTP/1.1 or h2c client ('h2_client') through an
 * HTTP/1.1 or h2c upstream ('h2_upstream'), which answers with an empty X-Empty too: the
 * upstream received the field with its empty value, and so did the client. The h2c upstream is
 * asked for its field by x-h2-field; over HTTP/1.1 both ends are raw bytes, read as they went. */
static void empty_both_ways(bool h2_client, bool h2_upstream)
{
    struct rawup *raw = NULL;
    struct h2u *h = NULL;
    char url[64];
    if (h2_upstream) {
        h = h2u_start();
        snprintf(url, sizeof(url), "%s", h2u_url(h, ""));
    } else {
        raw = rawup_start(EMPTY_ANSWER, 20);
        snprintf(url, sizeof(url), "http://127.0.0.1:%u", raw->port);
    }
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r", "\"upstreams\": [\"%s\"], \"retry\": {\"max_attempts\": 1}", url);
    fx_start_b(b, "--workers", "1", NULL);

    if (h2_client) {
        const char *hdrs[] = { "X-Empty;", "X-H2-Field: x-empty:", NULL };
        struct http_resp r;
        http_do_h2("GET", fx_url("/e"), hdrs, NULL, 0, 10000, &r);
        cr_expect_eq(r.status, 200);
        const char *v = http_hdr(&r, "X-Empty");
        cr_expect(v && !*v, "the client got X-Empty %s%s%s: %s", v ? "\"" : "", v ? v : "absent",
                  v ? "\"" : "", r.headers);
        http_free(&r);
    } else {
        struct answer a;
        exchange("GET /e HTTP/1.1\r\nHost: a\r\nX-Empty:\r\nX-H2-Field: x-empty:\r\n"
                 "Connection: close\r\n\r\n",
                 &a);
        cr_expect_eq(a.status, 200, "%s", a.buf);
        cr_expect(empty_in(a.buf, "X-Empty"), "the client got no empty X-Empty: %s", a.buf);
    }

    if (h2_upstream) {
        json_t *rec = h2u_find(h, "path", "/e");
        cr_assert_not_null(rec, "the request did not reach the upstream");
        bool got = false;
        size_t i;
        json_t *f;
        json_array_foreach(json_object_get(rec, "headers"), i, f)
        {
            const char *n = json_string_value(json_array_get(f, 0)),
                       *v = json_string_value(json_array_get(f, 1));
            got |= n && v && strcmp(n, "x-empty") == 0 && !*v;
        }
        cr_expect(got, "the upstream got no empty x-empty: %s",
                  json_dumps(json_object_get(rec, "headers"), 0));
        json_decref(rec);
    } else {
        cr_expect(empty_in(raw->got, "X-Empty"), "the upstream got no empty X-Empty: %s", raw->got);
        rawup_stop(raw);
    }
}

Test(fields, an_empty_value_goes_both_ways_from_http1_to_http1)
{
    empty_both_ways(false, false);
}

Test(fields, an_empty_value_goes_both_ways_from_http1_to_h2c)
{
    empty_both_ways(false, true);
}

Test(fields, an_empty_value_goes_both_ways_from_h2c_to_http1)
{
    empty_both_ways(true, false);
}

Test(fields, an_empty_value_goes_both_ways_from_h2c_to_h2c)
{
    empty_both_ways(true, true);
}
