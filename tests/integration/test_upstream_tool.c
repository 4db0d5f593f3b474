/* Self-test of the test upstream (tests/support/tup.h): its plans and what it records.
 *
 * Every directive and record field is exercised for real over 127.0.0.1: libcurl as the
 * client where a normal client is wanted, raw sockets where the bytes on the wire matter
 * (tests/support/tupself.h). Its connections and load: test_upstream_tool_conns.c; the
 * standalone build/tests/upstream: test_upstream_tool_cli.c.
 */
#include "tests/support/tupself.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

TestSuite(upstream_tool, .init = tupself_start, .fini = tupself_stop);

/* ---- hash and pattern ---- */

Test(upstream_tool, hash_and_pattern, .timeout = 30)
{
    cr_assert_eq(tup_hash("", 0), TUP_HASH_INIT);
    /* Published FNV-1a 64 test vectors. */
    cr_assert_eq(tup_hash("a", 1), UINT64_C(0xaf63dc4c8601ec8c));
    cr_assert_eq(tup_hash("foobar", 6), UINT64_C(0x85944171f73967e8));
    uint64_t h = tup_hash_update(TUP_HASH_INIT, "foo", 3);
    cr_assert_eq(tup_hash_update(h, "bar", 3), tup_hash("foobar", 6));

    unsigned char buf[5000];
    tup_pattern_fill(buf, 0, sizeof buf);
    cr_assert_eq(tup_pattern_hash(sizeof buf), tup_hash(buf, sizeof buf));
    cr_assert_eq(tup_pattern_hash(0), TUP_HASH_INIT);
    for (size_t i = 0; i < sizeof buf; i++) {
        cr_assert_eq(buf[i], tup_pattern_byte(i));
        if (i % 64 == 63)
            cr_assert_eq(buf[i], '\n');
        else
            cr_assert(buf[i] >= '+' && buf[i] <= 'z', "byte %zu is %d", i, buf[i]);
    }
    /* A pattern shifted by a block must differ: lost or repeated data changes the hash. */
    unsigned char off[4096];
    tup_pattern_fill(off, 4096, sizeof off);
    cr_assert(memcmp(buf, off, sizeof off) != 0);
    cr_assert_neq(tup_pattern_hash(100000), tup_pattern_hash(100001));
}

Test(upstream_tool, plan_check, .timeout = 30)
{
    char err[256];
    cr_assert_eq(tup_plan_check("", err, sizeof err), 0);
    cr_assert_eq(tup_plan_check(" fail = 2 ; action = reset-mid ; body = 10 ;", err, sizeof err),
                 0);
    cr_assert_eq(tup_plan_check("retry-after=Wed, 21 Oct 2015 07:28:00 GMT", err, sizeof err), 0);
    cr_assert_eq(tup_plan_check("fial=2", err, sizeof err), -1);
    cr_assert(strstr(err, "fial") != NULL, "%s", err);
    cr_assert_eq(tup_plan_check("fail=two", err, sizeof err), -1);
    cr_assert(strstr(err, "fail") && strstr(err, "two"), "%s", err);
    cr_assert_eq(tup_plan_check("action=explode", err, sizeof err), -1);
    cr_assert_eq(tup_plan_check("status=99", err, sizeof err), -1);
    cr_assert_eq(tup_plan_check("status=600", err, sizeof err), -1);
    cr_assert_eq(tup_plan_check("chunked=2", err, sizeof err), -1);
    cr_assert_eq(tup_plan_check("delay", err, sizeof err), -1);
    cr_assert_eq(tup_plan_check("retry-after=", err, sizeof err), -1);
    cr_assert_eq(tup_plan_check("body=-1", err, sizeof err), -1);
}

/* ---- directives ---- */

Test(upstream_tool, fail_counts_per_request_id, .timeout = 30)
{
    struct resp r;
    const char *plan = "fail=2;status=503";
    long want[] = { 503, 503, 200, 200 };
    for (int i = 0; i < 4; i++) {
        get_plan(plan, "id-a", &r);
        cr_assert_eq(r.rc, CURLE_OK, "%s", curl_easy_strerror(r.rc));
        cr_assert_eq(r.status, want[i], "attempt %d: %ld", i + 1, r.status);
        cr_assert_eq(atoi(r.attempt), i + 1);
        resp_free(&r);
    }
    get_plan(plan, "id-b", &r);
    cr_assert_eq(r.status, 503);
    cr_assert_str_eq(r.attempt, "1");
    resp_free(&r);
    get_plan(plan, NULL, &r);
    cr_assert_eq(r.status, 503);
    resp_free(&r);

    cr_assert_eq(tup_count(tupself), 6);
    cr_assert_eq(tup_count_id(tupself, "id-a"), 4);
    cr_assert_eq(tup_count_id(tupself, "id-b"), 1);
    cr_assert_eq(tup_count_id(tupself, ""), 1);
    cr_assert_eq(tup_count_id(tupself, "nope"), 0);
    for (size_t i = 0; i < 4; i++) {
        const struct tup_req *q = tup_get(tupself, i);
        cr_assert_eq(q->seq, i);
        cr_assert_str_eq(q->request_id, "id-a");
        cr_assert_eq(q->key_attempt, i + 1);
        cr_assert_str_eq(q->method, "GET");
        cr_assert_str_eq(q->target, "/");
        cr_assert_eq(q->body_len, 0);
        cr_assert_eq(q->body_hash, TUP_HASH_INIT);
        cr_assert_eq(q->body_kept, 0);
    }
    cr_assert_eq(tup_get(tupself, 4)->key_attempt, 1);
    cr_assert_str_eq(tup_get(tupself, 5)->request_id, "");
    cr_assert_null(tup_get(tupself, 6));
    /* Arrival times follow the order of the requests. */
    for (size_t i = 1; i < 6; i++)
        cr_assert(tup_get(tupself, i)->arrival_ns > tup_get(tupself, i - 1)->arrival_ns);
}

Test(upstream_tool, status_and_retry_after, .timeout = 30)
{
    struct resp r;
    get_plan("fail=1;status=429;retry-after=7", "ra-1", &r);
    cr_assert_eq(r.status, 429);
    cr_assert_str_eq(r.retry_after, "7");
    resp_free(&r);
    get_plan("fail=1;status=429;retry-after=7", "ra-1", &r);
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.retry_after, "", "success answers carry no Retry-After");
    resp_free(&r);

    get_plan(" status = 503 ; retry-after = Wed, 21 Oct 2015 07:28:00 GMT ; fail = 1 ", "ra-2", &r);
    cr_assert_eq(r.status, 503);
    cr_assert_str_eq(r.retry_after, "Wed, 21 Oct 2015 07:28:00 GMT");
    resp_free(&r);

    get_plan("fail=1;status=502", "ra-3", &r);
    cr_assert_eq(r.status, 502);
    cr_assert_str_eq(r.retry_after, "");
    resp_free(&r);
}

Test(upstream_tool, hang_until_client_gives_up, .timeout = 30)
{
    struct resp r;
    struct req q = { .plan = "fail=1;action=hang", .id = "hang-1", .timeout_ms = 300 };
    perform(&q, &r);
    cr_assert_eq(r.rc, CURLE_OPERATION_TIMEDOUT, "%s", curl_easy_strerror(r.rc));
    cr_assert(r.ms >= 250, "gave up after %.0f ms", r.ms);
    cr_assert_eq(r.body_len, 0);
    cr_assert_eq(tup_wait_count(tupself, 1, 2000), 0);
    cr_assert_str_eq(tup_get(tupself, 0)->request_id, "hang-1");
    /* curl closed its side; tup notices and lets go of the connection. */
    cr_assert_eq(tup_wait_open_at_most(tupself, 0, 5000), 0);
    resp_free(&r);

    /* The second attempt of the same key succeeds. */
    get_plan("fail=1;action=hang", "hang-1", &r);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
}

Test(upstream_tool, reset_and_close_send_nothing, .timeout = 30)
{
    struct resp r;
    get_plan("fail=1;action=reset", "rst", &r);
    cr_assert(r.rc == CURLE_GOT_NOTHING || r.rc == CURLE_RECV_ERROR, "reset: %d %s", r.rc,
              curl_easy_strerror(r.rc));
    cr_assert_eq(r.body_len, 0);
    resp_free(&r);
    get_plan("fail=1;action=close", "cls", &r);
    cr_assert(r.rc == CURLE_GOT_NOTHING || r.rc == CURLE_RECV_ERROR, "close: %d %s", r.rc,
              curl_easy_strerror(r.rc));
    cr_assert_eq(r.body_len, 0);
    resp_free(&r);
    cr_assert_eq(tup_count(tupself), 2);
    cr_assert_str_eq(tup_get(tupself, 0)->request_id, "rst");
    cr_assert_str_eq(tup_get(tupself, 1)->request_id, "cls");

    /* On the wire: reset is an RST or an empty read, close is a clean EOF, no bytes either. */
    struct raw *c = raw_new();
    raw_sends(c, "GET /r HTTP/1.1\r\nHost: x\r\nX-Request-Id: rst\r\n"
                 "X-Test-Plan: fail=2;action=reset\r\n\r\n");
    cr_assert_eq(raw_until_closed(c), 0);
    raw_free(c);
    c = raw_new();
    raw_sends(c, "GET /c HTTP/1.1\r\nHost: x\r\nX-Request-Id: cls\r\n"
                 "X-Test-Plan: fail=2;action=close\r\n\r\n");
    char b;
    cr_assert_eq(recv(c->fd, &b, 1, 0), 0, "close must be a FIN without bytes");
    raw_free(c);
}

Test(upstream_tool, reset_mid_body, .timeout = 30)
{
    struct resp r;
    get_plan("fail=1;action=reset-mid;body=200000", "rm", &r);
    cr_assert(r.rc == CURLE_PARTIAL_FILE || r.rc == CURLE_RECV_ERROR, "%d %s", r.rc,
              curl_easy_strerror(r.rc));
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.content_length, "200000");
    cr_assert(r.body_len <= 100000, "got %" PRIu64 " bytes", r.body_len);
    /* What did arrive is the start of the pattern. */
    cr_assert_eq(r.body_hash, tup_pattern_hash(r.body_len));
    resp_free(&r);

    /* Raw: exactly half the declared body arrives before the reset. */
    struct raw *c = raw_new();
    raw_sends(c, "GET /rm HTTP/1.1\r\nHost: x\r\nX-Test-Plan: fail=1;action=reset-mid\r\n"
                 "X-Request-Id: rm2\r\n\r\n");
    size_t total = raw_until_closed(c);
    raw_free(c);
    cr_assert(total > 32768 && total < 32768 + 1024, "received %zu bytes", total);
    cr_assert_eq(tup_count(tupself), 2);
}

/* stall-mid: half the declared body, then nothing, until the peer closes. */
Test(upstream_tool, stall_mid_body, .timeout = 30)
{
    struct raw *c = raw_new();
    raw_sends(c, "GET /sm HTTP/1.1\r\nHost: x\r\nX-Test-Plan: fail=1;action=stall-mid;body=2000\r\n"
                 "X-Request-Id: sm\r\n\r\n");
    char buf[4096];
    size_t total = 0;
    struct pollfd p = { .fd = c->fd, .events = POLLIN };
    while (total < sizeof buf && poll(&p, 1, 500) == 1) {
        ssize_t n = recv(c->fd, buf + total, sizeof buf - total, 0);
        cr_assert_gt(n, 0, "the stalled answer ended");
        total += (size_t)n;
    }
    const char *body = memmem(buf, total, "\r\n\r\n", 4);
    cr_assert_not_null(body);
    cr_assert_eq(total - (size_t)(body + 4 - buf), 1000, "received %zu bytes", total);
    cr_assert_eq(tup_open_connections(tupself), 1);
    raw_free(c);
    cr_assert_eq(tup_wait_open_at_most(tupself, 0, 5000), 0, "the peer's close was not seen");
}

Test(upstream_tool, delay_before_answer, .timeout = 30)
{
    struct resp r;
    get_plan("delay=200", "d1", &r);
    cr_assert_eq(r.status, 200);
    cr_assert(r.ms >= 180, "answered after %.0f ms", r.ms);
    resp_free(&r);
    get_plan("fail=1;status=503;delay=200", "d2", &r);
    cr_assert_eq(r.status, 503);
    cr_assert(r.ms >= 180, "failed after %.0f ms", r.ms);
    resp_free(&r);
    /* Without delay it is quick (generous bound for a loaded machine). */
    get_plan("", "d3", &r);
    cr_assert(r.ms < 150, "took %.0f ms", r.ms);
    resp_free(&r);
}

Test(upstream_tool, ok_body_chunked, .timeout = 30)
{
    struct resp r;
    get_plan("", NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_eq(r.body_len, 3);
    cr_assert(memcmp(r.body, "ok\n", 3) == 0);
    cr_assert_str_eq(r.content_length, "3");
    resp_free(&r);

    get_plan("ok=201;body=100000", NULL, &r);
    cr_assert_eq(r.status, 201);
    cr_assert_eq(r.body_len, 100000);
    cr_assert_eq(r.body_hash, tup_pattern_hash(100000));
    cr_assert_str_eq(r.te, "");
    resp_free(&r);

    get_plan("body=100000;chunked=1", NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.te, "chunked");
    cr_assert_str_eq(r.content_length, "");
    cr_assert_eq(r.body_len, 100000);
    cr_assert_eq(r.body_hash, tup_pattern_hash(100000));
    resp_free(&r);

    get_plan("chunked=1", NULL, &r);
    cr_assert_str_eq(r.te, "chunked");
    cr_assert_eq(r.body_len, 3);
    cr_assert(memcmp(r.body, "ok\n", 3) == 0);
    resp_free(&r);

    get_plan("body=0;chunked=1", NULL, &r);
    cr_assert_eq(r.rc, CURLE_OK);
    cr_assert_eq(r.body_len, 0);
    resp_free(&r);

    get_plan("ok=204", NULL, &r);
    cr_assert_eq(r.rc, CURLE_OK);
    cr_assert_eq(r.status, 204);
    cr_assert_eq(r.body_len, 0);
    resp_free(&r);

    struct req q = { .method = "HEAD", .plan = "body=5000" };
    perform(&q, &r);
    cr_assert_eq(r.rc, CURLE_OK, "%s", curl_easy_strerror(r.rc));
    cr_assert_str_eq(r.content_length, "5000");
    cr_assert_eq(r.body_len, 0);
    cr_assert_str_eq(tup_get(tupself, 6)->method, "HEAD");
    resp_free(&r);
}

Test(upstream_tool, echo_bodies, .timeout = 30)
{
    size_t n = 300000;
    unsigned char *data = random_bytes(n, 1);
    struct resp r;
    struct req q = { .path = "/echo", .plan = "echo=1", .body = data, .body_len = n };
    perform(&q, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_eq(r.body_len, n);
    cr_assert(memcmp(r.body, data, n) == 0);
    resp_free(&r);

    q.plan = "echo=1;chunked=1;ok=202";
    q.chunked_upload = true;
    perform(&q, &r);
    cr_assert_eq(r.status, 202);
    cr_assert_str_eq(r.te, "chunked");
    cr_assert_eq(r.body_len, n);
    cr_assert_eq(r.body_hash, tup_hash(data, n));
    resp_free(&r);

    /* An empty body echoes as empty. */
    struct req e = { .path = "/echo", .plan = "echo=1", .body = "", .body_len = 0 };
    perform(&e, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_eq(r.body_len, 0);
    resp_free(&r);
    free(data);
}

Test(upstream_tool, echo_refuses_over_8mib, .timeout = 30)
{
    size_t n = TUP_ECHO_MAX + 4096;
    unsigned char *data = random_bytes(n, 2);
    struct resp r;
    struct req q = { .path = "/big", .plan = "echo=1", .id = "e413", .body = data, .body_len = n };
    perform(&q, &r);
    cr_assert_eq(r.rc, CURLE_OK, "%s", curl_easy_strerror(r.rc));
    cr_assert_eq(r.status, 413);
    resp_free(&r);
    const struct tup_req *rec = tup_get(tupself, 0);
    cr_assert_eq(rec->body_len, n);
    cr_assert_eq(rec->body_hash, tup_hash(data, n));
    cr_assert_eq(rec->body_kept, TUP_BODY_KEEP);
    cr_assert(memcmp(rec->body, data, TUP_BODY_KEEP) == 0);
    /* The connection stays usable for the next request. */
    get_plan("", "after", &r);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    free(data);
}

Test(upstream_tool, post_1mib_recorded, .timeout = 30)
{
    size_t n = 1024 * 1024;
    unsigned char *data = random_bytes(n, 3);
    struct resp r;
    struct req q = {
        .method = "POST", .path = "/upload?x=1", .id = "p1", .body = data, .body_len = n
    };
    perform(&q, &r);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    q.id = "p2";
    q.chunked_upload = true;
    perform(&q, &r);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    /* Expect: 100-continue is answered at once (curl would wait 5 s otherwise). */
    q.id = "p3";
    q.chunked_upload = false;
    q.extra[0] = "Expect: 100-continue";
    perform(&q, &r);
    cr_assert_eq(r.status, 200);
    cr_assert(r.ms < 4000, "Expect: 100-continue took %.0f ms", r.ms);
    resp_free(&r);

    cr_assert_eq(tup_count(tupself), 3);
    for (size_t i = 0; i < 3; i++) {
        const struct tup_req *rec = tup_get(tupself, i);
        cr_assert_str_eq(rec->method, "POST");
        cr_assert_str_eq(rec->target, "/upload?x=1");
        cr_assert_eq(rec->body_len, n);
        cr_assert_eq(rec->body_hash, tup_hash(data, n));
        cr_assert_eq(rec->body_kept, TUP_BODY_KEEP);
        cr_assert(memcmp(rec->body, data, TUP_BODY_KEEP) == 0);
    }
    cr_assert_str_eq(tup_req_header(tup_get(tupself, 0), "content-length"), "1048576");
    cr_assert_str_eq(tup_req_header(tup_get(tupself, 1), "Transfer-Encoding"), "chunked");
    cr_assert_null(tup_req_header(tup_get(tupself, 1), "Content-Length"));
    cr_assert_str_eq(tup_req_header(tup_get(tupself, 2), "Expect"), "100-continue");
    free(data);
}

Test(upstream_tool, streams_100mib_in_constant_memory, .timeout = 30)
{
    uint64_t n = UINT64_C(100) * 1024 * 1024;
    struct resp r;
    CURL *h = curl_easy_init();
    struct upload u;
    struct req q = { .plan = "body=104857600", .timeout_ms = 25000 };
    struct curl_slist *hl = prepare(h, &q, &r, &u);
    /* Hash as it streams and keep nothing, so any growth is tup's (or curl's). */
    r.no_keep = true;
    r.sample_rss = true;
    long before = rss_kb();
    r.rss_max_kb = before;
    int64_t t0 = now_ns();
    CURLcode rc = curl_easy_perform(h);
    double ms = ms_since(t0);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    cr_assert_eq(rc, CURLE_OK, "%s", curl_easy_strerror(rc));
    cr_assert_eq(r.status, 200);
    cr_assert_eq(r.body_len, n);
    cr_assert_eq(r.body_hash, tup_pattern_hash(n));
    long after = rss_kb();
    if (after > r.rss_max_kb)
        r.rss_max_kb = after;
    long growth = r.rss_max_kb - before;
    cr_log_info("100 MiB in %.0f ms, RSS %ld kB -> peak %ld kB (+%ld kB)", ms, before, r.rss_max_kb,
                growth);
    cr_assert(growth < 64 * 1024, "RSS grew by %ld kB", growth);
    resp_free(&r);
}

Test(upstream_tool, headers_in_order_with_duplicates, .timeout = 30)
{
    struct resp r;
    struct req q = { .path = "/h/p?q=1&r=2",
                     .plan = "ok=200",
                     .id = "hdr",
                     .extra = { "X-Dup: first", "X-Other:   spaced value   ", "x-dup: second",
                                "X-Empty;" } };
    perform(&q, &r);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    const struct tup_req *rec = tup_get(tupself, 0);
    cr_assert_str_eq(rec->target, "/h/p?q=1&r=2");
    cr_assert_eq(tup_req_header_count(rec, "X-DUP"), 2);
    cr_assert_str_eq(tup_req_header(rec, "x-Dup"), "first");
    cr_assert_str_eq(tup_req_header(rec, "X-Other"), "spaced value");
    cr_assert_str_eq(tup_req_header(rec, "X-Empty"), "");
    cr_assert_null(tup_req_header(rec, "X-Missing"));
    cr_assert_eq(tup_req_header_count(rec, "X-Missing"), 0);
    char host[64];
    snprintf(host, sizeof host, "127.0.0.1:%u", tup_port(tupself));
    cr_assert_str_eq(tup_req_header(rec, "Host"), host);
    /* Received order: find the positions of the three custom headers. */
    int first = -1, other = -1, second = -1;
    for (size_t i = 0; i < rec->n_headers; i++) {
        const struct tup_header *h = &rec->headers[i];
        if (strcmp(h->name, "X-Dup") == 0)
            first = (int)i;
        else if (strcmp(h->name, "X-Other") == 0)
            other = (int)i;
        else if (strcmp(h->name, "x-dup") == 0)
            second = (int)i;
    }
    cr_assert(first >= 0 && other == first + 1 && second == other + 1, "%d %d %d", first, other,
              second);
    cr_assert_str_eq(rec->headers[second].value, "second");
    cr_assert_str_eq(tup_req_header(rec, "X-Test-Plan"), "ok=200");
}

Test(upstream_tool, keep_alive_reuse, .timeout = 30)
{
    CURL *h = curl_easy_init();
    struct resp r1, r2;
    struct req q = { .path = "/one", .id = "ka" };
    perform_on(h, &q, &r1);
    q.path = "/two";
    perform_on(h, &q, &r2);
    curl_easy_cleanup(h);
    cr_assert_eq(r1.status, 200);
    cr_assert_eq(r2.status, 200);
    cr_assert_str_eq(r1.conn, r2.conn);
    cr_assert_str_eq(r2.attempt, "2");
    cr_assert_eq(tup_connections(tupself), 1);
    const struct tup_req *a = tup_get(tupself, 0);
    const struct tup_req *b = tup_get(tupself, 1);
    cr_assert_eq(a->conn_id, b->conn_id);
    cr_assert_eq(a->conn_id, strtoull(r1.conn, NULL, 10));
    cr_assert_eq(a->conn_index, 1);
    cr_assert_eq(b->conn_index, 2);
    cr_assert_str_eq(b->target, "/two");
    resp_free(&r1);
    resp_free(&r2);
    /* curl_easy_cleanup closed the connection. */
    cr_assert_eq(tup_wait_open_at_most(tupself, 0, 5000), 0);

    /* A new handle opens a new connection. */
    get_plan("", "ka2", &r1);
    cr_assert_eq(tup_connections(tupself), 2);
    cr_assert_eq(tup_get(tupself, 2)->conn_index, 1);
    cr_assert_neq(tup_get(tupself, 2)->conn_id, a->conn_id);
    resp_free(&r1);
}

Test(upstream_tool, close_after_and_connection_close, .timeout = 30)
{
    struct raw *c = raw_new();
    struct raw_resp rr;
    char v[64];
    raw_sends(c, "GET /a HTTP/1.1\r\nHost: x\r\nX-Test-Plan: close-after=1\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    cr_assert_str_eq(raw_header(&rr, "Connection", v, sizeof v), "close");
    cr_assert_eq(raw_until_closed(c), 0);
    raw_free(c);

    c = raw_new();
    raw_sends(c, "GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    cr_assert_str_eq(raw_header(&rr, "Connection", v, sizeof v), "close");
    cr_assert_eq(raw_until_closed(c), 0);
    raw_free(c);

    /* HTTP/1.0: closes unless keep-alive was asked for. */
    c = raw_new();
    raw_sends(c, "GET /c HTTP/1.0\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    cr_assert_eq(raw_until_closed(c), 0);
    raw_free(c);

    c = raw_new();
    raw_sends(c, "GET /d HTTP/1.0\r\nConnection: keep-alive\r\nX-Test-Plan: body=10\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    cr_assert_eq(rr.body_len, 10);
    cr_assert_str_eq(raw_header(&rr, "Connection", v, sizeof v), "keep-alive");
    raw_sends(c, "GET /e HTTP/1.0\r\nConnection: keep-alive\r\nX-Test-Plan: chunked=1\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    cr_assert_str_eq(raw_header(&rr, "Content-Length", v, sizeof v), "3",
                     "no chunked answers to HTTP/1.0");
    raw_free(c);
    cr_assert_eq(tup_count(tupself), 5);
    cr_assert_eq(tup_get(tupself, 4)->conn_index, 2);
}

Test(upstream_tool, stale_connection, .timeout = 30)
{
    struct raw *c = raw_new();
    struct raw_resp rr;
    const char *req = "POST /s HTTP/1.1\r\nHost: x\r\nX-Request-Id: st\r\n"
                      "X-Test-Plan: stale=1\r\nContent-Length: 4\r\n\r\nbody";
    raw_sends(c, req);
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200, "the first request on a connection is answered");
    raw_sends(c, req);
    cr_assert_eq(raw_until_closed(c), 0, "the second gets no answer");
    raw_free(c);
    cr_assert_eq(tup_count(tupself), 2);
    const struct tup_req *q = tup_get(tupself, 1);
    cr_assert_eq(q->conn_index, 2);
    cr_assert_eq(q->body_len, 4);
    cr_assert_eq(q->key_attempt, 2);
    cr_assert_eq(tup_count_id(tupself, "st"), 2);
    cr_assert_eq(tup_connections(tupself), 1);
}

/* Not a tup feature but a fact the proxy's tests rely on: libcurl itself silently re-sends
 * a request (even a POST) that got nothing back on a reused connection. */
Test(upstream_tool, curl_resends_on_stale_connection, .timeout = 30)
{
    CURL *h = curl_easy_init();
    struct resp r;
    struct req q = { .plan = "stale=1", .id = "cs", .body = "data", .body_len = 4 };
    perform_on(h, &q, &r);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    perform_on(h, &q, &r);
    curl_easy_cleanup(h);
    cr_assert_eq(r.rc, CURLE_OK, "%s", curl_easy_strerror(r.rc));
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    cr_assert_eq(tup_count_id(tupself, "cs"), 3, "the POST reached the upstream three times");
    cr_assert_eq(tup_get(tupself, 1)->conn_index, 2);
    cr_assert_eq(tup_get(tupself, 2)->conn_index, 1);
    cr_assert_eq(tup_connections(tupself), 2);
}

Test(upstream_tool, bad_plan_is_400, .timeout = 30)
{
    const char *plans[] = { "fial=1", "fail=x", "action=explode", "status=99", "delay" };
    const char *names[] = { "fial", "fail", "explode", "status", "delay" };
    for (size_t i = 0; i < 5; i++) {
        struct resp r;
        get_plan(plans[i], "bad", &r);
        cr_assert_eq(r.status, 400, "%s", plans[i]);
        cr_assert_eq(atoi(r.attempt), (int)i + 1, "bad plans count as attempts");
        char body[512] = "";
        memcpy(body, r.body, r.body_len < sizeof body - 1 ? r.body_len : sizeof body - 1);
        cr_assert(strstr(body, names[i]) != NULL, "body '%s' does not name '%s'", body, names[i]);
        resp_free(&r);
    }
    cr_assert_eq(tup_count(tupself), 5);

    /* The default plan applies without X-Test-Plan; the header overrides it. */
    tup_set_default_plan(tupself, "ok=202");
    struct resp r;
    get_plan(NULL, "dp", &r);
    cr_assert_eq(r.status, 202);
    resp_free(&r);
    get_plan("ok=203", "dp", &r);
    cr_assert_eq(r.status, 203);
    resp_free(&r);
    tup_set_default_plan(tupself, "nonsense");
    get_plan(NULL, "dp", &r);
    cr_assert_eq(r.status, 400);
    resp_free(&r);
}
