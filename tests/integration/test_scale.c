/* Scale, end to end: many requests waiting in backoff at once cost memory, not threads; backoff
 * waits keep their schedule; a long keep-alive session leaks neither descriptors nor memory
 * (docs/README.md "Waiting requests cost memory, not threads", docs/backoff.md).
 */
#include <criterion/criterion.h>

#include <curl/curl.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/fixture.h"

#define T 20000 /* ms: upper bound for any single request in these tests */

/* A test upstream and a proxy with route "r" to it; 'top' is extra top-level members and
 * 'route_extra' extra route members ("" for none). */
static void start(const char *top, const char *route_extra, const char *workers)
{
    fx_start_r(top, route_extra, "--workers", workers, NULL);
}

TestSuite(scale, .fini = fx_stop, .timeout = 120);

/* ---- 1: a thousand requests waiting in backoff ---- */

#define N_WAIT 1000

/* Records of tup whose key attempt is 'attempt'. */
static size_t count_attempt(unsigned attempt)
{
    size_t n = 0, total = tup_count(up);
    for (size_t i = 0; i < total; i++)
        n += tup_get(up, i)->key_attempt == attempt;
    return n;
}

Test(scale, thousand_requests_waiting_in_backoff_cost_no_threads)
{
    /* Both sides need a descriptor per connection: 1000 clients here, 1000+ to tup. */
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    rl.rlim_cur = rl.rlim_max;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    cr_assert_geq(rl.rlim_cur, 4 * N_WAIT, "RLIMIT_NOFILE hard limit %llu is too low",
                  (unsigned long long)rl.rlim_max);

    /* Budgets wide open so that every request retries once whether or not they are enforced. */
    start(
        "\"budget\": {\"max_concurrent_retries\": null, \"retry_ratio\": 2.0}",
        "\"retry\": {\"max_attempts\": 2, \"backoff\": {\"policy\": \"fixed\", \"base_ms\": 2000, "
        "\"jitter\": \"none\"}}, \"budget\": {\"max_concurrent_retries\": null, "
        "\"retry_ratio\": 2.0}",
        "2");
    long rss_idle = px_rss_kb(px);
    int threads_idle = px_threads(px);

    CURLM *m = curl_multi_init();
    cr_assert_not_null(m);
    static CURL *easy[N_WAIT];
    static struct curl_slist *hdrs[N_WAIT];
    static int rc[N_WAIT];
    static long status[N_WAIT];
    char url[128];
    px_url(px, "/wait", url, sizeof(url));
    for (int i = 0; i < N_WAIT; i++) {
        char id[64];
        snprintf(id, sizeof(id), "X-Request-Id: wait-%04d", i);
        hdrs[i] = curl_slist_append(NULL, id);
        hdrs[i] = curl_slist_append(hdrs[i], "X-Test-Plan: fail=1;status=503");
        easy[i] = proc_multi_get(m, url, hdrs[i], 30000L, (void *)(intptr_t)i);
        cr_assert_not_null(easy[i]);
        rc[i] = -1;
    }

    int64_t t0 = now_ms(), t_first = -1;
    int running = 1, threads_max = -1, samples = 0;
    long rss_max = -1;
    size_t retried_while_sampling = 0;
    bool sampling_done = false;
    while (running && now_ms() - t0 < 60000) {
        curl_multi_perform(m, &running);
        void *priv;
        CURLcode done_rc;
        for (CURL *e; (e = proc_multi_next_done(m, &priv, &done_rc)) != NULL;) {
            int i = (int)(intptr_t)priv;
            rc[i] = done_rc;
            curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status[i]);
        }
        /* Every first attempt answered 503: all 1000 requests now wait 2 s in backoff. Sample
         * for a second of that (about 100 ms apart), well before the first retries are due. */
        if (!sampling_done && t_first < 0 && tup_count(up) >= N_WAIT)
            t_first = now_ms();
        if (!sampling_done && t_first >= 0 && now_ms() - t_first >= 100 * (samples + 1)) {
            int th = px_threads(px);
            long kb = px_rss_kb(px);
            threads_max = th > threads_max ? th : threads_max;
            rss_max = kb > rss_max ? kb : rss_max;
            samples++;
            retried_while_sampling = count_attempt(2);
            sampling_done = samples >= 10;
        }
        curl_multi_poll(m, NULL, 0, 20, NULL);
    }
    int64_t elapsed = now_ms() - t0;

    fprintf(stderr,
            "[scale] %d waiting: %d threads (idle %d), RSS %ld KiB (idle %ld KiB, %.1f KiB per "
            "waiting request), %d samples; first attempts all in after %lld ms; all done in "
            "%lld ms\n",
            N_WAIT, threads_max, threads_idle, rss_max, rss_idle,
            (double)(rss_max - rss_idle) / N_WAIT, samples,
            (long long)(t_first >= 0 ? t_first - t0 : -1), (long long)elapsed);

    cr_expect_geq(t_first, 0, "tup never saw %d first attempts (%zu records)", N_WAIT,
                  tup_count(up));
    cr_expect_eq(samples, 10, "only %d samples taken while requests waited", samples);
    cr_expect_eq(retried_while_sampling, 0,
                 "%zu retries arrived while sampling: the sample was not of 1000 waiting requests",
                 retried_while_sampling);
    cr_expect_leq(threads_max, 2 + 8, "%d threads with %d requests waiting", threads_max, N_WAIT);
    long rss_bound = fx_under_asan() ? 256L * 1024 : 200L * 1024;
    cr_expect_lt(rss_max, rss_bound, "RSS %ld KiB with %d requests waiting", rss_max, N_WAIT);
    cr_expect_lt(elapsed, 60000, "the 1000 requests took %lld ms", (long long)elapsed);

    int not_ok = 0;
    for (int i = 0; i < N_WAIT; i++) {
        if (rc[i] != 0 || status[i] != 200) {
            if (not_ok++ < 5)
                cr_expect_fail("request wait-%04d: curl %d, status %ld", i, rc[i], status[i]);
        }
        curl_multi_remove_handle(m, easy[i]);
        curl_easy_cleanup(easy[i]);
        curl_slist_free_all(hdrs[i]);
    }
    curl_multi_cleanup(m);
    cr_expect_eq(not_ok, 0, "%d of %d requests did not end 200", not_ok, N_WAIT);

    usleep(300 * 1000); /* a third attempt would show up here */
    cr_expect_eq(tup_count(up), 2 * N_WAIT, "tup recorded %zu attempts", tup_count(up));
    size_t per_id[N_WAIT] = { 0 };
    size_t bad_ids = 0;
    for (size_t i = 0; i < tup_count(up); i++) {
        int k;
        if (sscanf(tup_get(up, i)->request_id, "wait-%d", &k) == 1 && k >= 0 && k < N_WAIT)
            per_id[k]++;
        else
            bad_ids++;
    }
    cr_expect_eq(bad_ids, 0, "%zu records with an unexpected request id", bad_ids);
    for (int i = 0, shown = 0; i < N_WAIT; i++)
        if (per_id[i] != 2 && shown++ < 5)
            cr_expect_fail("wait-%04d reached tup %zu times, want 2", i, per_id[i]);
}

/* ---- 2: the backoff schedule, as seen by the upstream ---- */

Test(scale, exponential_backoff_gaps_between_attempts)
{
    start("",
          "\"retry\": {\"max_attempts\": 4, \"backoff\": {\"policy\": \"exponential\", "
          "\"base_ms\": 100, \"factor\": 2.0, \"jitter\": \"none\"}}",
          "2");
    char url[128];
    const char *h[] = { "X-Test-Plan: fail=3;status=503", "X-Request-Id: gaps", NULL };
    struct http_resp r;
    http_do("GET", px_url(px, "/g", url, sizeof(url)), h, NULL, 0, T, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    char v[32];
    const char *att = http_header(&r, "X-Retry-Attempts", v, sizeof(v));
    cr_expect(att && strcmp(att, "4") == 0, "X-Retry-Attempts '%s'", att ? att : "(absent)");
    http_free(&r);

    cr_assert_eq(tup_count(up), 4, "tup recorded %zu attempts", tup_count(up));
    const int64_t want_ms[3] = { 100, 200, 400 };
    double gap_ms[3];
    for (size_t i = 0; i < 3; i++)
        gap_ms[i] = (double)(tup_get(up, i + 1)->arrival_ns - tup_get(up, i)->arrival_ns) / 1e6;
    fprintf(stderr, "[scale] backoff gaps: %.1f %.1f %.1f ms (want 100 200 400)\n", gap_ms[0],
            gap_ms[1], gap_ms[2]);
    for (size_t i = 0; i < 3; i++) {
        cr_expect_geq(gap_ms[i], (double)want_ms[i] - 5.0, "gap %zu: %.1f ms, want >= %lld - 5",
                      i + 1, gap_ms[i], (long long)want_ms[i]);
        cr_expect_lt(gap_ms[i], (double)want_ms[i] + 400.0, "gap %zu: %.1f ms, want < %lld + 400",
                     i + 1, gap_ms[i], (long long)want_ms[i]);
    }
}

/* ---- 3: a long keep-alive session ---- */

Test(scale, sequential_keepalive_requests_leak_nothing)
{
    enum { N = 2000, WARM = 100 };
    if (fx_under_asan()) {
        /* ASan keeps freed blocks in a quarantine of up to 256 MiB, which reads as steady
         * growth of about one request's buffers per request. A small quarantine fills within
         * the first requests, so growth after that is real; leaks proper are LeakSanitizer's. */
        const char *old = getenv("ASAN_OPTIONS");
        char opts[512];
        snprintf(opts, sizeof(opts), "%s%squarantine_size_mb=4", old ? old : "",
                 old && *old ? ":" : "");
        setenv("ASAN_OPTIONS", opts, 1);
    }
    start("", "", "1");
    int fds_before = px_fds(px);
    long rss_warm = -1;

    char url[128];
    px_url(px, "/k", url, sizeof(url));
    CURL *e = curl_easy_init();
    cr_assert_not_null(e);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)T);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, http_discard);
    int64_t t0 = now_ms();
    long connects = 0;
    int not_ok = 0;
    for (int i = 0; i < N; i++) {
        CURLcode c = curl_easy_perform(e);
        long st = 0, nc = 0;
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &st);
        curl_easy_getinfo(e, CURLINFO_NUM_CONNECTS, &nc);
        connects += nc;
        if (c != CURLE_OK || st != 200) {
            if (not_ok++ < 5)
                cr_expect_fail("request %d: curl %d, status %ld", i, c, st);
        }
        if (i + 1 == WARM)
            rss_warm = px_rss_kb(px);
    }
    int64_t elapsed = now_ms() - t0;
    int fds_after = px_fds(px);
    long rss_after = px_rss_kb(px);
    curl_easy_cleanup(e);

    fprintf(stderr,
            "[scale] %d keep-alive GETs in %lld ms: %ld client connection(s), %llu upstream "
            "connection(s); proxy fds %d -> %d, RSS %ld KiB after %d -> %ld KiB after %d\n",
            N, (long long)elapsed, connects, (unsigned long long)tup_connections(up), fds_before,
            fds_after, rss_warm, WARM, rss_after, N);
    cr_expect_eq(not_ok, 0, "%d of %d requests failed", not_ok, N);
    cr_expect_eq(connects, 1, "the client needed %ld connections: keep-alive broke", connects);
    cr_expect_eq(tup_count(up), N, "tup recorded %zu requests", tup_count(up));
    cr_expect_leq(fds_after, fds_before + 10, "proxy fds grew from %d to %d", fds_before,
                  fds_after);
    cr_expect_leq(rss_after, rss_warm + 5 * 1024, "proxy RSS grew from %ld to %ld KiB", rss_warm,
                  rss_after);
}

/* ---- 4: a cap on upstream attempts in flight ---- */

/* limits.max_upstream_requests bounds the transfers a worker runs at once: a burst of requests
 * reaches the upstream in waves of the cap, each wave after an answer freed its slot, over
 * no more connections than the cap; every request is answered. */
Test(scale, attempts_over_max_upstream_requests_wait_their_turn)
{
    enum { N = 6, CAP = 2, DELAY = 300 };
    start("\"limits\": {\"max_upstream_requests\": 2}", "", "1");
    static struct http_call calls[N];
    char url[128];
    px_url(px, "/cap", url, sizeof(url));
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof(id), "cap-%d", i);
        http_call_start(&calls[i], url, id, "delay=300");
    }
    for (int i = 0; i < N; i++) {
        http_call_join(&calls[i]);
        cr_expect_eq(calls[i].r.status, 200, "request %d: status %d", i, calls[i].r.status);
    }
    cr_assert_eq(tup_count(up), N);
    /* An answer gives its slot back at its head, when it is committed to its client; its
     * connection is free again once its body is in. So the next attempt may open one more
     * connection meanwhile (a slow machine, a sanitizer build), never more than that per slot. */
    cr_expect_leq(tup_connections(up), 2 * CAP, "%llu upstream connections for a cap of %d",
                  (unsigned long long)tup_connections(up), CAP);
    int64_t at[N];
    for (int i = 0; i < N; i++)
        at[i] = tup_get(up, (size_t)i)->arrival_ns;
    qsort(at, N, sizeof(at[0]), fx_cmp_i64);
    /* A slot frees only once its answer, sent DELAY ms after its request arrived, is in: the
     * request CAP places later cannot have arrived sooner. */
    for (int i = CAP; i < N; i++)
        cr_expect_geq(at[i] - at[i - CAP], (int64_t)DELAY * 1000000,
                      "arrival %d came %lld ms after arrival %d", i,
                      (long long)((at[i] - at[i - CAP]) / 1000000), i - CAP);
    for (int i = 0; i < N; i++)
        http_free(&calls[i].r);
}

/* A request waiting for a slot is bound by its route's timeout_ms like any attempt: at the
 * deadline it is answered 504 and the upstream never sees it. */
Test(scale, a_request_still_waiting_for_a_slot_at_its_deadline_gets_504)
{
    fx_upstreams(1);
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"limits\": {\"max_upstream_requests\": 1}");
    cfgb_route(b, "hog", "\"match\": {\"path_prefix\": \"/hog\"}");
    cfgb_route(b, "r", "\"timeout_ms\": 500");
    fx_start_b(b, "--workers", "1", NULL);
    char url[128];
    static struct http_call hog, late;
    http_call_start(&hog, px_url(px, "/hog", url, sizeof(url)), "slot-hog", "delay=2500");
    /* the hog's transfer holds the only slot before the second request arrives */
    for (int64_t t0 = now_ms(); tup_count(up) == 0 && now_ms() - t0 < T;)
        sleep_ms(5);
    cr_assert_eq(tup_count(up), 1);
    http_call_start(&late, px_url(px, "/late", url, sizeof(url)), "slot-late", "fail=0");
    http_call_join(&late);
    cr_expect_eq(late.r.status, 504);
    http_call_join(&hog);
    cr_expect_eq(hog.r.status, 200);
    cr_expect_eq(tup_count_id(up, "slot-late"), 0, "the late request reached the upstream");
    http_free(&hog.r);
    http_free(&late.r);
}

/* ---- 5: slow readers ---- */

/* Opens 'n' connections that each ask for /big ('body' bytes) and read nothing (a tiny
 * receive window), into fds[]; waits until upstream 0 has every request. */
/* One small request through the proxy, answered 200. */
static void http_do_ok_small(void)
{
    struct http_resp r;
    http_do("GET", fx_url("/small"), NULL, NULL, 0, 5000, &r);
    cr_assert_eq(r.status, 200);
    http_free(&r);
}

static void open_slow_readers(int *fds, int n, const char *body)
{
    char req[256];
    int len = snprintf(req, sizeof(req),
                       "GET /big HTTP/1.1\r\nHost: svc\r\nX-Request-Id: slow\r\n"
                       "X-Test-Plan: body=%s\r\n\r\n",
                       body);
    for (int i = 0; i < n; i++) {
        int fd = fds[i] = fx_hold(raw_dial(px->port));
        int small = 4096;
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
        cr_assert(raw_send_all(fd, req, (size_t)len));
    }
    for (int64_t t0 = now_ms(); tup_count_id(up, "slow") < (size_t)n && now_ms() - t0 < 10000;)
        sleep_ms(10);
    cr_assert_eq(tup_count_id(up, "slow"), (size_t)n, "slow requests sent upstream: %zu of %d",
                 tup_count_id(up, "slow"), n);
    sleep_ms(300); /* their responses fill every buffer on the way and stall */
}

/* A normal request sent now is answered 200 at once (well within its route's timeout_ms),
 * with 'n' slow clients ('what') connected. */
static void expect_answered_at_once(int n, const char *what)
{
    const char *h[] = { "X-Request-Id: probe", NULL };
    struct http_resp r;
    http_do("GET", fx_url("/small"), h, NULL, 0, 5000, &r);
    cr_expect_eq(r.status, 200, "a normal request behind %d %s: status %ld after %.2f s", n, what,
                 r.status, r.seconds);
    cr_expect_lt(r.seconds, 3.0, "answered after %.2f s", r.seconds);
    http_free(&r);
}

static void close_slow_readers(const int *fds, int n)
{
    for (int i = 0; i < n; i++) {
        fx_release(fds[i]);
        close(fds[i]);
    }
}

/* A client that asks for a large response and does not read it (here: never) holds its
 * connection and its response's transfer, but not a slot of limits.max_upstream_requests: a
 * committed response streams at the client's pace outside the cap (docs/hardening.md "Slow
 * readers"). With twice the cap of such clients, a normal request is still answered at once,
 * not after the slow ones reach their timeout_ms. */
Test(scale, slow_readers_do_not_hold_upstream_slots)
{
    enum { CAP = 2, SLOW = 2 * CAP };
    start("\"limits\": {\"max_upstream_requests\": 2}", "\"timeout_ms\": 12000", "1");
    int fds[SLOW];
    open_slow_readers(fds, SLOW, "67108864");
    expect_answered_at_once(SLOW, "slow readers");
    /* the slow clients leave: their requests end at once (the stop below waits for none) */
    close_slow_readers(fds, SLOW);
}

static bool rss_back(void *arg)
{
    return px_rss_kb(px) <= *(long *)arg;
}

/* What slow readers held (their response buffers, the transfers' handles) goes back to the
 * system soon after they leave, the last of a burst as well as the first (docs/operations.md
 * "Sizing"): here 150 of them on one worker, fewer than the drop that used to trigger the
 * trim. glibc's heap only: a sanitizer build keeps freed memory in its own allocator. */
Test(scale, memory_held_by_slow_readers_goes_back_when_they_leave)
{
    enum { SLOW = 150 };
    start("", "", "1");
    http_do_ok_small();
    sleep_ms(300);
    long idle = px_rss_kb(px);
    int fds0 = px_fds(px);
    int fds[SLOW];
    open_slow_readers(fds, SLOW, "8388608");
    long held = px_rss_kb(px);
    cr_assert_gt(held, idle + 10 * 1024,
                 "RSS %ld KiB with %d slow readers, %ld idle: the test measures nothing", held,
                 SLOW, idle);
    close_slow_readers(fds, SLOW);
    /* most of it: what stays is the heap's fragments (the build before kept 60 %) */
    long bound = idle + (held - idle) * 2 / 5;
    if (!fx_under_sanitizer())
        cr_expect(fx_wait(rss_back, &bound, 3000, 50),
                  "RSS %ld KiB 3 s after %d slow readers left (%ld idle, %ld with them)",
                  px_rss_kb(px), SLOW, idle, held);
    for (int64_t t0 = now_ms(); px_fds(px) > fds0 && now_ms() - t0 < 3000;)
        sleep_ms(20);
    cr_expect_leq(px_fds(px), fds0, "descriptors %d after, %d before", px_fds(px), fds0);
}

/* A body too large to keep for replay streams to the upstream once, at the client's pace: a
 * client that sends it slowly holds no slot of limits.max_upstream_requests either. */
Test(scale, slow_uploads_do_not_hold_upstream_slots)
{
    enum { CAP = 2, SLOW = 2 * CAP };
    start("\"limits\": {\"max_upstream_requests\": 2}",
          "\"timeout_ms\": 12000, \"retry\": {\"max_retry_body_bytes\": 1024}", "1");
    const char req[] = "POST /up HTTP/1.1\r\nHost: svc\r\nX-Request-Id: slow-up\r\n"
                       "Content-Length: 1000000\r\n\r\nthe first bytes of a long body";
    int fds[SLOW];
    for (int i = 0; i < SLOW; i++) {
        fds[i] = fx_hold(raw_dial(px->port));
        cr_assert(raw_send_all(fds[i], req, sizeof(req) - 1));
    }
    sleep_ms(500); /* each upload's attempt runs, waiting for the rest of its body */
    expect_answered_at_once(SLOW, "slow uploads");
    close_slow_readers(fds, SLOW);
}

/* A client that takes no response byte for limits.connection_timeout_ms is closed, its
 * transfer with it (nginx's send_timeout), long before the route's timeout_ms. */
Test(scale, a_reader_that_takes_nothing_is_closed_after_connection_timeout_ms)
{
    start("\"limits\": {\"connection_timeout_ms\": 1000}", "\"timeout_ms\": 60000", "1");
    int fd, fds0 = px_fds(px);
    open_slow_readers(&fd, 1, "67108864");
    cr_assert_eq(fx_metric("retryproxy_connections_active"), 1);
    cr_assert_gt(px_fds(px), fds0, "no descriptor for the client and its transfer");
    cr_expect_eq(fx_wait_metric("retryproxy_connections_active", 0, 5000), 0,
                 "the connection of a client reading nothing is still open");
    /* the upstream transfer ended with it: its connection closed, not kept (mid-body) */
    for (int64_t t0 = now_ms(); px_fds(px) > fds0 && now_ms() - t0 < 2000;)
        sleep_ms(20);
    cr_expect_leq(px_fds(px), fds0, "descriptors %d after, %d before", px_fds(px), fds0);
    close_slow_readers(&fd, 1);
}

/* A client reading slowly can queue no more than limits.send_buffer_bytes (the kernel counts
 * twice the value) in the kernel's send buffer of its connection; left to the kernel's own
 * sizing, a loopback connection takes megabytes of a response that nobody reads. */
static long queued_for_slow_reader(const char *limits)
{
    start(limits, "\"timeout_ms\": 60000", "1");
    int fd;
    open_slow_readers(&fd, 1, "67108864");
    sleep_ms(300);
    long q = proc_tcp_send_queue_max(px->pid, px->port);
    close_slow_readers(&fd, 1);
    return q;
}

Test(scale, a_slow_readers_kernel_send_queue_is_bounded_by_send_buffer_bytes)
{
    long q = queued_for_slow_reader("\"limits\": {\"send_buffer_bytes\": 65536}");
    cr_expect_gt(q, 0, "nothing queued: the test measures nothing");
    /* the kernel lets one write past the limit (it checks the room before queueing it): seen
     * 147,456 bytes, 16 KiB over, now and then; a 64 KiB write at most */
    cr_expect_leq(q, 3 * 65536, "%ld bytes queued for a client that reads nothing", q);
}

Test(scale, without_send_buffer_bytes_the_kernel_queues_megabytes_for_a_slow_reader)
{
    long q = queued_for_slow_reader("\"limits\": {\"send_buffer_bytes\": 0}");
    cr_expect_gt(q, 1024 * 1024, "%ld bytes queued: the bound above would hold without the key", q);
}
