/* Self-test of the test upstream (tests/support/tup.h): the HTTP/1.1 it parses byte by byte,
 * pipelining, waiting for requests, and thousands of requests and connections at once.
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

Test(upstream_tool, raw_http_parsing, .timeout = 30)
{
    struct raw *c = raw_new();
    struct raw_resp rr;
    char v[64];
    /* Pipelined: three requests in one write, answered in order. */
    raw_sends(c, "GET /p1 HTTP/1.1\r\nHost: x\r\n\r\n"
                 "POST /p2 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nX-Test-Plan: echo=1\r\n\r\n"
                 "hello"
                 "\r\nGET /p3 HTTP/1.1\r\nhost: x\r\nX-Test-Plan: body=7\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    cr_assert_str_eq(rr.body, "ok\n");
    raw_read(c, &rr, false);
    cr_assert_str_eq(rr.body, "hello");
    cr_assert_str_eq(raw_header(&rr, "X-Tup-Seq", v, sizeof v), "1");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.body_len, 7);
    cr_assert_eq(rr.body_hash, tup_pattern_hash(7));

    /* Chunked request with extensions and trailers; LF-only line ends are accepted. */
    raw_sends(c, "PUT /ch HTTP/1.1\nHost: x\nTransfer-Encoding: chunked\nX-Test-Plan: echo=1\n\n"
                 "5;ext=1\r\nhello\r\n6\r\n world\r\nA\r\n0123456789\r\n0\r\n"
                 "X-Trailer: t\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    cr_assert_str_eq(rr.body, "hello world0123456789");

    /* Expect: 100-continue comes before the body is sent. */
    raw_sends(c, "POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n"
                 "X-Test-Plan: echo=1\r\n\r\n");
    const char *cont = "HTTP/1.1 100 Continue\r\n\r\n";
    while (c->len < strlen(cont))
        cr_assert(raw_fill(c) > 0);
    cr_assert(memcmp(c->buf, cont, strlen(cont)) == 0);
    raw_take(c, strlen(cont));
    raw_sends(c, "abc");
    raw_read(c, &rr, false);
    cr_assert_str_eq(rr.body, "abc");

    /* HEAD gets Content-Length but no body, and the connection stays in sync. */
    raw_sends(c, "HEAD /hd HTTP/1.1\r\nHost: x\r\nX-Test-Plan: body=100\r\n\r\n"
                 "GET /after HTTP/1.1\r\nHost: x\r\n\r\n");
    raw_read(c, &rr, true);
    cr_assert_str_eq(raw_header(&rr, "Content-Length", v, sizeof v), "100");
    raw_read(c, &rr, false);
    cr_assert_str_eq(rr.body, "ok\n");
    raw_free(c);

    cr_assert_eq(tup_count(tupself), 7);
    const struct tup_req *p2 = tup_get(tupself, 1);
    cr_assert_str_eq(p2->method, "POST");
    cr_assert_eq(p2->conn_index, 2);
    cr_assert_eq(p2->body_kept, 5);
    cr_assert(memcmp(p2->body, "hello", 5) == 0);
    const struct tup_req *ch = tup_get(tupself, 3);
    cr_assert_str_eq(ch->method, "PUT");
    cr_assert_eq(ch->body_len, 21);
    cr_assert_eq(ch->body_hash, tup_hash("hello world0123456789", 21));
    cr_assert_null(tup_req_header(ch, "X-Trailer"), "trailers are not headers");
    for (size_t i = 0; i < 7; i++)
        cr_assert_eq(tup_get(tupself, i)->conn_index, i + 1);
}

Test(upstream_tool, pipelined_delays_keep_order, .timeout = 30)
{
    struct raw *c = raw_new();
    struct raw_resp rr;
    char v[64];
    int64_t t0 = now_ns();
    raw_sends(c, "GET /d1 HTTP/1.1\r\nX-Test-Plan: delay=200;body=5\r\n\r\n"
                 "GET /d2 HTTP/1.1\r\nX-Test-Plan: delay=200;body=6\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.body_len, 5);
    cr_assert(ms_since(t0) >= 180);
    raw_read(c, &rr, false);
    cr_assert_eq(rr.body_len, 6);
    cr_assert_str_eq(raw_header(&rr, "X-Tup-Seq", v, sizeof v), "1");
    /* Answers are serial: the second delay starts once the first answer is out. */
    cr_assert(ms_since(t0) >= 360, "both answered after %.0f ms", ms_since(t0));
    raw_free(c);
    /* Both heads arrived in one read: both arrival times are that read's. */
    int64_t d = tup_get(tupself, 1)->arrival_ns - tup_get(tupself, 0)->arrival_ns;
    cr_assert(d >= 0 && d < 100 * 1000000LL, "arrivals %" PRId64 " ns apart", d);
}

Test(upstream_tool, bad_requests_not_recorded, .timeout = 30)
{
    struct raw *c = raw_new();
    struct raw_resp rr;
    raw_sends(c, "NONSENSE\r\n\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 400);
    cr_assert_eq(raw_until_closed(c), 0);
    raw_free(c);

    c = raw_new();
    raw_sends(c, "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 400);
    raw_free(c);

    c = raw_new();
    raw_sends(c, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 400);
    raw_free(c);

    /* A head over 64 KiB: 431, then the connection is closed. */
    size_t big = 70000;
    char *req = malloc(big + 64);
    cr_assert(req != NULL);
    int k = snprintf(req, 64, "GET / HTTP/1.1\r\nX-Big: ");
    memset(req + k, 'a', big);
    memcpy(req + k + big, "\r\n\r\n", 5);
    c = raw_new();
    raw_sends(c, req);
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 431);
    cr_assert_eq(raw_until_closed(c), 0);
    raw_free(c);
    free(req);

    /* A head just under the limit is fine. */
    req = malloc(TUP_HEAD_MAX);
    cr_assert(req != NULL);
    const char *start = "GET /fits HTTP/1.1\r\nX-Big: ";
    size_t pad = TUP_HEAD_MAX - strlen(start) - 4;
    memcpy(req, start, strlen(start));
    memset(req + strlen(start), 'b', pad);
    memcpy(req + strlen(start) + pad, "\r\n\r\n", 4);
    c = raw_new();
    raw_send(c, req, TUP_HEAD_MAX);
    raw_read(c, &rr, false);
    cr_assert_eq(rr.status, 200);
    raw_free(c);
    free(req);

    cr_assert_eq(tup_wait_count(tupself, 1, 2000), 0);
    cr_assert_eq(tup_count(tupself), 1, "only the well-formed request is recorded");
    cr_assert_str_eq(tup_get(tupself, 0)->target, "/fits");
    cr_assert_eq(strlen(tup_req_header(tup_get(tupself, 0), "X-Big")), pad);
}

Test(upstream_tool, wait_count_times_out_and_wakes, .timeout = 30)
{
    int64_t t0 = now_ns();
    cr_assert_eq(tup_wait_count(tupself, 1, 150), -1);
    cr_assert(ms_since(t0) >= 140, "returned after %.0f ms", ms_since(t0));
    cr_assert_eq(tup_wait_count(tupself, 0, 0), 0);

    struct raw *c = raw_new();
    struct raw_resp rr;
    raw_sends(c, "GET /w HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(tup_wait_count(tupself, 1, 5000), 0);
    raw_read(c, &rr, false);
    /* Arrival times are CLOCK_MONOTONIC and fall within the test's clock. */
    int64_t arr = tup_get(tupself, 0)->arrival_ns;
    cr_assert(arr > t0 && arr <= now_ns());
    cr_assert_eq(tup_open_connections(tupself), 1);
    raw_free(c);
    cr_assert_eq(tup_wait_open_at_most(tupself, 0, 5000), 0);
}

Test(upstream_tool, arrival_times_measure_gaps, .timeout = 30)
{
    struct resp r;
    get_plan("", "gap", &r);
    resp_free(&r);
    usleep(120 * 1000);
    get_plan("", "gap", &r);
    resp_free(&r);
    int64_t gap = tup_get(tupself, 1)->arrival_ns - tup_get(tupself, 0)->arrival_ns;
    cr_assert(gap >= 110 * 1000000LL, "gap %" PRId64 " ns", gap);
}

/* ---- load ---- */

Test(upstream_tool, five_hundred_concurrent_requests, .timeout = 30)
{
    enum { N = 500 };
    CURLM *m = curl_multi_init();
    CURL **hs = calloc(N, sizeof *hs);
    struct curl_slist **hl = calloc(N, sizeof *hl);
    struct resp *rs = calloc(N, sizeof *rs);
    struct upload *us = calloc(N, sizeof *us);
    cr_assert(m && hs && hl && rs && us);
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof id, "c-%d", i);
        struct req q = { .plan = "delay=200;body=1000", .id = id, .timeout_ms = 20000 };
        hs[i] = curl_easy_init();
        hl[i] = prepare(hs[i], &q, &rs[i], &us[i]);
        curl_easy_setopt(hs[i], CURLOPT_PRIVATE, &rs[i]);
        curl_multi_add_handle(m, hs[i]);
    }
    int64_t t0 = now_ns();
    int running = 1;
    size_t peak = 0;
    while (running) {
        cr_assert_eq(curl_multi_perform(m, &running), CURLM_OK);
        size_t open = tup_open_connections(tupself);
        if (open > peak)
            peak = open;
        if (running)
            curl_multi_poll(m, NULL, 0, 50, NULL);
        cr_assert(ms_since(t0) < 20000, "500 requests still running after 20 s");
    }
    double ms = ms_since(t0);
    int done = 0;
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left))) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        struct resp *r;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
        curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &r->status);
        cr_assert_eq(msg->data.result, CURLE_OK, "%s", curl_easy_strerror(msg->data.result));
        cr_assert_eq(r->status, 200);
        cr_assert_eq(r->body_hash, tup_pattern_hash(1000));
        done++;
    }
    cr_assert_eq(done, N);
    cr_assert_eq(tup_count(tupself), N);
    cr_log_info("500 concurrent: %.0f ms, peak %zu open connections, %" PRIu64 " accepted", ms,
                peak, tup_connections(tupself));
    /* Every request had its own id, so every one was a first attempt. */
    for (size_t i = 0; i < N; i++)
        cr_assert_eq(tup_get(tupself, i)->key_attempt, 1);
    cr_assert(peak >= 100, "peak of %zu open connections: requests did not overlap", peak);
    for (int i = 0; i < N; i++) {
        curl_multi_remove_handle(m, hs[i]);
        curl_easy_cleanup(hs[i]);
        curl_slist_free_all(hl[i]);
        resp_free(&rs[i]);
    }
    curl_multi_cleanup(m);
    free(hs);
    free(hl);
    free(rs);
    free(us);
}

Test(upstream_tool, two_thousand_connections, .timeout = 30)
{
    enum { N = 2000 };
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(tup_port(tupself)) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* tup_start raised the soft limit to the hard one; both ends live in this process. */
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    cr_assert(rl.rlim_cur >= 2 * N + 200, "RLIMIT_NOFILE is %llu: too low for %d connections",
              (unsigned long long)rl.rlim_cur, N);
    int *fds = calloc(N, sizeof *fds);
    cr_assert(fds != NULL);
    struct timeval tv = { .tv_sec = 10 };
    for (int i = 0; i < N; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        cr_assert(fds[i] >= 0, "socket %d: %s", i, strerror(errno));
        setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        cr_assert(connect(fds[i], (struct sockaddr *)&sa, sizeof sa) == 0, "connect %d: %s", i,
                  strerror(errno));
        char req[128];
        int n = snprintf(req, sizeof req,
                         "GET /%d HTTP/1.1\r\nX-Request-Id: k%d\r\nX-Test-Plan: delay=100\r\n\r\n",
                         i, i);
        cr_assert_eq(send(fds[i], req, (size_t)n, MSG_NOSIGNAL), n);
    }
    cr_assert_eq(tup_wait_count(tupself, N, 15000), 0, "only %zu of %d requests arrived",
                 tup_count(tupself), N);
    cr_assert_eq(tup_open_connections(tupself), N);
    cr_assert_eq(tup_connections(tupself), N);
    for (int i = 0; i < N; i++) {
        char buf[1024];
        size_t len = 0;
        while (!memmem(buf, len, "\r\n\r\nok\n", 7)) {
            ssize_t n = recv(fds[i], buf + len, sizeof buf - len, 0);
            cr_assert(n > 0, "connection %d: %s", i, n < 0 ? strerror(errno) : "EOF");
            len += (size_t)n;
        }
        cr_assert(strncmp(buf, "HTTP/1.1 200 ", 13) == 0);
        close(fds[i]);
    }
    free(fds);
    cr_assert_eq(tup_wait_open_at_most(tupself, 0, 10000), 0);
}

Test(upstream_tool, stop_with_open_connections, .timeout = 30)
{
    struct raw *c[5];
    for (int i = 0; i < 5; i++)
        c[i] = raw_new();
    raw_sends(c[0],
              "GET /h HTTP/1.1\r\nX-Request-Id: h0\r\nX-Test-Plan: fail=1;action=hang\r\n\r\n");
    raw_sends(c[1],
              "GET /h HTTP/1.1\r\nX-Request-Id: h1\r\nX-Test-Plan: fail=1;action=hang\r\n\r\n");
    /* A response the client never reads, a long delay, a half-sent request. */
    raw_sends(c[2], "GET /big HTTP/1.1\r\nX-Test-Plan: body=1000000000\r\n\r\n");
    raw_sends(c[3], "GET /slow HTTP/1.1\r\nX-Test-Plan: delay=60000\r\n\r\n");
    raw_sends(c[4], "POST /half HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly some");
    cr_assert_eq(tup_wait_count(tupself, 4, 5000), 0);
    cr_assert_eq(tup_open_connections(tupself), 5);
    int64_t t0 = now_ns();
    tup_stop(tupself);
    tupself = NULL;
    double ms = ms_since(t0);
    cr_assert(ms < 2000, "tup_stop took %.0f ms", ms);
    for (int i = 0; i < 5; i++) {
        if (i != 2)
            cr_assert_eq(raw_until_closed(c[i]), 0, "connection %d", i);
        raw_free(c[i]);
    }
}
