/* Request and response bodies, end to end: replay of buffered bodies across retries, streamed
 * uploads sent once, stale kept-alive connections, failures mid-body, and bounded memory while
 * large bodies flow through (docs/config.md retry.max_retry_body_bytes,
 * docs/forwarding.md).
 *
 * Bodies are generated on the fly and hashed with tup_hash on both sides, so a lost, repeated
 * or reordered block shows up as a hash mismatch without either side holding the body whole.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/fixture.h"

#define T    60000 /* ms: upper bound for any single request in these tests */
#define MIB  (1024u * 1024u)
#define SEED UINT64_C(0x5eed0b0d1e5)
/* Response bytes kept by send_gen (enough for our own JSON errors); the rest is only hashed. */
#define KEEP 65536

/* The ASan build's shadow memory and quarantine inflate RSS several times over: the bound is
 * looser there but still a bound. */
static long rss_bound_kb(void)
{
    return fx_under_asan() ? 256L * 1024 : 64L * 1024;
}

/* A tup and a proxy routing everything to it with 'route_extra' members; 'workers' NULL keeps
 * the default (one per core). */
static void start(const char *route_extra, const char *workers)
{
    if (workers)
        fx_start_r("", route_extra, "--workers", workers, NULL);
    else
        fx_start_r("", route_extra, NULL);
}

TestSuite(bodies, .fini = fx_stop, .timeout = 120);

/* ---- generated request bodies ---- */

static uint64_t splitmix64(uint64_t x)
{
    x += UINT64_C(0x9e3779b97f4a7c15);
    x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

/* Bytes [off, off + n) of the random body for 'seed': a pure function of the position, so
 * any slice can be produced again (and hashed) without keeping the body. */
static void gen_fill(uint64_t seed, uint64_t off, unsigned char *dst, size_t n)
{
    uint64_t word = 0, wi = UINT64_MAX;
    for (size_t k = 0; k < n; k++) {
        uint64_t i = off + k;
        if (i >> 3 != wi) {
            wi = i >> 3;
            word = splitmix64(seed ^ (wi * UINT64_C(0xd1b54a32d192ed03)));
        }
        dst[k] = (unsigned char)(word >> ((i & 7) * 8));
    }
}

static uint64_t gen_hash(uint64_t seed, uint64_t len)
{
    static unsigned char block[65536];
    uint64_t h = TUP_HASH_INIT;
    for (uint64_t off = 0; off < len;) {
        size_t n = len - off < sizeof(block) ? (size_t)(len - off) : sizeof(block);
        gen_fill(seed, off, block, n);
        h = tup_hash_update(h, block, n);
        off += n;
    }
    return h;
}

/* ---- a client that uploads generated bodies ---- */

struct upload {
    uint64_t seed, len, pos;
    uint64_t hash; /* of the bytes handed to curl */
};

static size_t on_upload(char *buf, size_t size, size_t n, void *ud)
{
    struct upload *u = ud;
    size_t want = size * n;
    if (want > u->len - u->pos)
        want = (size_t)(u->len - u->pos);
    gen_fill(u->seed, u->pos, (unsigned char *)buf, want);
    u->hash = tup_hash_update(u->hash, buf, want);
    u->pos += want;
    return want;
}

struct sink {
    struct http_resp *r;
    FILE *hdr;
};

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    struct sink *s = ud;
    struct http_resp *r = s->r;
    size_t len = size * n;
    r->body_hash = tup_hash_update(r->body_hash, p, len);
    if (r->body_len + len <= KEEP) {
        memcpy(r->body + r->body_len, p, len);
        r->body[r->body_len + len] = '\0';
    }
    r->body_len += len;
    return len;
}

static size_t on_hdr(char *p, size_t size, size_t n, void *ud)
{
    struct sink *s = ud;
    return fwrite(p, size, n, s->hdr) * size;
}

struct gen_req {
    const char *method;
    const char *path;
    const char *const *headers; /* NULL-terminated, or NULL */
    uint64_t body_len;          /* generated body of this many bytes (with 'seed'); 0: none */
    uint64_t seed;
    bool chunked;              /* Transfer-Encoding: chunked instead of Content-Length */
    curl_off_t max_recv_speed; /* bytes per second, 0: as fast as possible */
};

/* One request through the proxy with a generated body; fills 'out' like http_do (free it with
 * http_free) and returns the hash of the body bytes actually sent. */
static uint64_t send_gen(const struct gen_req *g, struct http_resp *out)
{
    char url[256];
    struct upload u = { .seed = g->seed, .len = g->body_len, .hash = TUP_HASH_INIT };
    struct sink s = { .r = out };
    char *hbuf = NULL;
    size_t hlen = 0;

    memset(out, 0, sizeof(*out));
    out->body_hash = TUP_HASH_INIT;
    out->body = calloc(1, KEEP + 1);
    cr_assert_not_null(out->body);
    s.hdr = open_memstream(&hbuf, &hlen);
    cr_assert_not_null(s.hdr);

    CURL *e = curl_easy_init();
    cr_assert_not_null(e);
    struct curl_slist *h = NULL;
    for (size_t i = 0; g->headers && g->headers[i]; i++)
        h = curl_slist_append(h, g->headers[i]);
    h = curl_slist_append(h, "Expect:");
    if (g->chunked)
        h = curl_slist_append(h, "Transfer-Encoding: chunked");
    curl_easy_setopt(e, CURLOPT_URL, px_url(px, g->path, url, sizeof(url)));
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)T);
    if (g->body_len || g->chunked) {
        curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(e, CURLOPT_READFUNCTION, on_upload);
        curl_easy_setopt(e, CURLOPT_READDATA, &u);
        curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE,
                         g->chunked ? (curl_off_t)-1 : (curl_off_t)g->body_len);
    }
    if (strcmp(g->method, "GET") != 0)
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, g->method);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_hdr);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &s);
    if (g->max_recv_speed)
        curl_easy_setopt(e, CURLOPT_MAX_RECV_SPEED_LARGE, g->max_recv_speed);
    int64_t t0 = now_ms();
    out->rc = curl_easy_perform(e);
    out->seconds = (double)(now_ms() - t0) / 1000.0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &out->status);
    fclose(s.hdr);
    out->headers = hbuf;
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    cr_expect_eq(u.pos, g->body_len, "curl sent %llu of %llu body bytes", (unsigned long long)u.pos,
                 (unsigned long long)g->body_len);
    return u.hash;
}

/* ---- sampling the proxy's memory while a transfer runs ---- */

struct sampler {
    pthread_t th;
    const struct px *p;
    long base_kb; /* RSS when sampling started */
    atomic_bool stop;
    atomic_long max_kb;
    atomic_long samples;
};

static void *sample_loop(void *arg)
{
    struct sampler *s = arg;
    while (!atomic_load(&s->stop)) {
        long kb = px_rss_kb(s->p);
        if (kb > atomic_load(&s->max_kb))
            atomic_store(&s->max_kb, kb);
        atomic_fetch_add(&s->samples, 1);
        usleep(20 * 1000); /* fine-grained: a 100 MiB transfer may take well under 1 s */
    }
    return NULL;
}

static void sampler_start(struct sampler *s, const struct px *p)
{
    s->p = p;
    s->base_kb = px_rss_kb(p);
    atomic_init(&s->stop, false);
    atomic_init(&s->max_kb, 0);
    atomic_init(&s->samples, 0);
    cr_assert_eq(pthread_create(&s->th, NULL, sample_loop, s), 0);
}

/* Stops sampling and returns the largest RSS seen, in KiB: samples, a last one, and the
 * kernel's high-water mark (one proxy per test, so that peak belongs to this test). */
static long sampler_stop(struct sampler *s)
{
    atomic_store(&s->stop, true);
    pthread_join(s->th, NULL);
    long max = atomic_load(&s->max_kb);
    long kb = px_rss_kb(s->p);
    long hwm = proc_status_kb(s->p->pid, "VmHWM"); /* a peak between two samples */
    max = kb > max ? kb : max;
    return hwm > max ? hwm : max;
}

/* sampler_stop(), and a line on stderr for the transfer 'what' that took 'seconds'. */
static long sampler_report(struct sampler *s, const char *what, double seconds)
{
    long max = sampler_stop(s);
    fprintf(stderr, "[bodies] %s: %.2f s, proxy RSS %ld KiB before, peak %ld KiB (%ld samples)\n",
            what, seconds, s->base_kb, max, atomic_load(&s->samples));
    return max;
}

/* A response of 'len' bytes of tup's pattern, whole and with status 200. */
static void expect_pattern_response(const struct http_resp *r, uint64_t len)
{
    cr_assert_eq(r->rc, 0, "curl error %d", r->rc);
    cr_expect_eq(r->status, 200);
    cr_expect_eq(r->body_len, len);
    cr_expect_eq(r->body_hash, tup_pattern_hash(len), "response body differs from tup's");
}

/* ---- small helpers ---- */

/* Waits for stragglers: a request the proxy sent twice would show up as a second record
 * shortly after the response. */
static void settle(void)
{
    usleep(300 * 1000);
}

static void expect_header(const struct http_resp *r, const char *name, const char *want)
{
    char v[256];
    const char *got = http_header(r, name, v, sizeof(v));
    if (want)
        cr_expect(got && strcmp(got, want) == 0, "%s: want '%s', got '%s'", name, want,
                  got ? got : "(absent)");
    else
        cr_expect_null(got, "%s: want none, got '%s'", name, got ? got : "");
}

/* Every record of request id 'id' carries the whole body: 'len' bytes hashing to 'hash'. */
static void expect_records(const char *id, size_t count, uint64_t len, uint64_t hash)
{
    size_t seen = 0;
    for (size_t i = 0; i < tup_count(up); i++) {
        const struct tup_req *q = tup_get(up, i);
        if (strcmp(q->request_id, id) != 0)
            continue;
        seen++;
        cr_expect_eq(q->body_len, len, "%s attempt %u: body_len %llu, want %llu", id,
                     q->key_attempt, (unsigned long long)q->body_len, (unsigned long long)len);
        cr_expect_eq(q->body_hash, hash, "%s attempt %u: body hash differs from the sent body", id,
                     q->key_attempt);
    }
    cr_expect_eq(seen, count, "%s: tup recorded %zu attempts, want %zu", id, seen, count);
}

/* The body is one of retryproxy's own JSON errors, with "error" equal to 'code'. */
static void expect_json_error(const struct http_resp *r, const char *code)
{
    json_error_t jerr;
    json_t *j = json_loadb((const char *)r->body, r->body_len, 0, &jerr);
    cr_assert_not_null(j, "error body is not JSON (%s): %.*s", jerr.text, (int)r->body_len,
                       r->body ? (const char *)r->body : "");
    const char *got = json_string_value(json_object_get(j, "error"));
    cr_expect(got && strcmp(got, code) == 0, "error: want '%s', got '%s'", code,
              got ? got : "(absent)");
    cr_expect(json_is_integer(json_object_get(j, "attempts")), "no integer 'attempts'");
    json_decref(j);
}

/* ---- 1, 2: buffered bodies replayed byte for byte ---- */

Test(bodies, post_1mib_with_idempotency_key_is_replayed_on_each_attempt)
{
    start("\"retry\": {" CFG_FAST "}", NULL);
    const char *h[] = { "X-Test-Plan: fail=2;status=503", "X-Request-Id: post-1m",
                        "Idempotency-Key: k-post-1m", NULL };
    struct gen_req g = {
        .method = "POST", .path = "/p", .headers = h, .body_len = MIB, .seed = SEED
    };
    struct http_resp r;
    uint64_t sent = send_gen(&g, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    expect_header(&r, "X-Retry-Attempts", "3");
    expect_header(&r, "X-Retry-Stop", NULL);
    cr_expect_eq(sent, gen_hash(SEED, MIB));
    settle();
    expect_records("post-1m", 3, MIB, sent);
    http_free(&r);
}

Test(bodies, put_of_exactly_the_limit_is_replayed_on_each_attempt)
{
    start("\"retry\": {\"max_retry_body_bytes\": 1048576, " CFG_FAST "}", NULL);
    const char *h[] = { "X-Test-Plan: fail=2;status=503", "X-Request-Id: put-1m", NULL };
    struct gen_req g = {
        .method = "PUT", .path = "/p", .headers = h, .body_len = MIB, .seed = SEED + 1
    };
    struct http_resp r;
    uint64_t sent = send_gen(&g, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    expect_header(&r, "X-Retry-Attempts", "3");
    settle();
    expect_records("put-1m", 3, MIB, sent);
    for (size_t i = 0; i < tup_count(up); i++)
        cr_expect_str_eq(tup_get(up, i)->method, "PUT");
    http_free(&r);
}

Test(bodies, put_one_byte_over_the_limit_is_streamed_once_and_not_retried)
{
    start("\"retry\": {\"max_retry_body_bytes\": 1048576, " CFG_FAST "}", NULL);
    const char *h[] = { "X-Test-Plan: fail=2;status=503", "X-Request-Id: put-1m1", NULL };
    struct gen_req g = {
        .method = "PUT", .path = "/p", .headers = h, .body_len = MIB + 1, .seed = SEED + 2
    };
    struct http_resp r;
    uint64_t sent = send_gen(&g, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 503, "want tup's 503, got %ld", r.status);
    expect_header(&r, "X-Retry-Stop", "body-too-large");
    expect_header(&r, "X-Retry-Attempts", "1");
    expect_header(&r, "X-Tup-Attempt", "1"); /* tup's own answer, not one of ours */
    settle();
    expect_records("put-1m1", 1, MIB + 1, sent);
    http_free(&r);
}

/* ---- 3: chunked request bodies ---- */

Test(bodies, chunked_body_under_the_limit_is_buffered_and_replayed)
{
    start("\"retry\": {" CFG_FAST "}", NULL);
    const char *h[] = { "X-Test-Plan: fail=1;status=503", "X-Request-Id: chunked-300k", NULL };
    struct gen_req g = { .method = "PUT",
                         .path = "/c",
                         .headers = h,
                         .body_len = 300 * 1024,
                         .seed = SEED + 3,
                         .chunked = true };
    struct http_resp r;
    uint64_t sent = send_gen(&g, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    expect_header(&r, "X-Retry-Attempts", "2");
    settle();
    expect_records("chunked-300k", 2, 300 * 1024, sent);
    /* Buffered whole, so each attempt is sent with its length (and without chunked framing). */
    for (size_t i = 0; i < tup_count(up); i++) {
        const struct tup_req *q = tup_get(up, i);
        const char *cl = tup_req_header(q, "Content-Length");
        cr_expect(cl && strcmp(cl, "307200") == 0, "attempt %u: Content-Length '%s'",
                  q->key_attempt, cl ? cl : "(absent)");
        cr_expect_null(tup_req_header(q, "Transfer-Encoding"));
    }
    http_free(&r);
}

Test(bodies, chunked_body_growing_past_the_limit_is_streamed_once)
{
    start("\"retry\": {" CFG_FAST "}", NULL);
    const char *h[] = { "X-Test-Plan: fail=1;status=503", "X-Request-Id: chunked-1m5", NULL };
    uint64_t len = MIB + MIB / 2;
    struct gen_req g = { .method = "PUT",
                         .path = "/c",
                         .headers = h,
                         .body_len = len,
                         .seed = SEED + 4,
                         .chunked = true };
    struct http_resp r;
    uint64_t sent = send_gen(&g, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 503, "want tup's 503, got %ld", r.status);
    expect_header(&r, "X-Retry-Stop", "body-too-large");
    expect_header(&r, "X-Retry-Attempts", "1");
    settle();
    expect_records("chunked-1m5", 1, len, sent);
    http_free(&r);
}

/* ---- 4: a large streamed upload ---- */

Test(bodies, large_streamed_upload_arrives_once_intact_with_bounded_memory)
{
    start("", NULL);
    const uint64_t len = 20 * MIB;
    const char *h[] = { "X-Request-Id: up-20m", NULL };
    struct gen_req g = {
        .method = "POST", .path = "/u", .headers = h, .body_len = len, .seed = SEED + 5
    };
    struct sampler s;
    sampler_start(&s, px);
    struct http_resp r;
    uint64_t sent = send_gen(&g, &r);
    long max = sampler_report(&s, "20 MiB upload", r.seconds);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(sent, gen_hash(SEED + 5, len));
    settle();
    expect_records("up-20m", 1, len, sent);
    cr_expect_lt(max, rss_bound_kb(), "proxy RSS reached %ld KiB during a 20 MiB upload", max);
    http_free(&r);
}

/* ---- 5: connect failures are retried whatever the body ---- */

Test(bodies, connect_failure_is_retried_for_a_streamed_post)
{
    fx_start_b(fx_cfg_closed_then_up(), "--workers", "2", NULL);

    /* Round-robin may send a request to tup first. With 2 workers, 4 requests put at least
     * two on one worker, and consecutive requests there start on different upstreams, so at
     * least one of them meets the closed port first. */
    enum { N = 4 };
    const uint64_t len = 2 * MIB;
    int via_closed_port = 0;
    for (int i = 0; i < N; i++) {
        char id[64], hid[80];
        snprintf(id, sizeof(id), "cf-%d", i);
        snprintf(hid, sizeof(hid), "X-Request-Id: %s", id);
        const char *h[] = { hid, NULL };
        struct gen_req g = { .method = "POST",
                             .path = "/cf",
                             .headers = h,
                             .body_len = len,
                             .seed = SEED + 10 + (uint64_t)i };
        struct http_resp r;
        uint64_t sent = send_gen(&g, &r);
        char v[32];
        const char *att = http_header(&r, "X-Retry-Attempts", v, sizeof(v));
        cr_expect_eq(r.rc, 0, "%s: curl error %d", id, r.rc);
        cr_expect_eq(r.status, 200, "%s: status %ld, attempts %s", id, r.status,
                     att ? att : "(none)");
        via_closed_port += att && strcmp(att, "2") == 0;
        settle();
        expect_records(id, 1, len, sent);
        http_free(&r);
    }
    cr_expect_geq(via_closed_port, 1, "no request met the closed port first");
}

/* ---- 6: stale kept-alive upstream connections ---- */

/* One GET that leaves a kept-alive connection to tup in the proxy's pool. */
static void warm_connection(const char *id)
{
    char url[128], hid[80];
    snprintf(hid, sizeof(hid), "X-Request-Id: %s", id);
    const char *h[] = { hid, NULL };
    struct http_resp r;
    http_do("GET", px_url(px, "/warm", url, sizeof(url)), h, NULL, 0, T, &r);
    cr_assert_eq(r.rc, 0, "warm-up: curl error %d", r.rc);
    cr_assert_eq(r.status, 200, "warm-up: status %ld", r.status);
    http_free(&r);
}

/* The first record of 'id' went out on a reused connection: the test really met staleness. */
static void expect_reused(const char *id)
{
    for (size_t i = 0; i < tup_count(up); i++) {
        const struct tup_req *q = tup_get(up, i);
        if (strcmp(q->request_id, id) == 0) {
            cr_expect_gt(q->conn_index, 1,
                         "%s went out on a fresh connection, not the kept-alive "
                         "one (conn_index %u)",
                         id, q->conn_index);
            return;
        }
    }
}

Test(bodies, post_on_a_stale_connection_is_sent_once_and_answered_502)
{
    start("", "1");
    warm_connection("warm-1");

    char url[128];
    const char *h[] = { "X-Test-Plan: stale=1", "X-Request-Id: stale-post", NULL };
    struct http_resp r;
    http_do("POST", px_url(px, "/s", url, sizeof(url)), h, "a body that must arrive once", 28, T,
            &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 502, "status %ld: %s", r.status, r.body ? (char *)r.body : "");
    expect_header(&r, "Content-Type", "application/json");
    expect_json_error(&r, "upstream_unavailable");
    settle();
    cr_expect_eq(tup_count_id(up, "stale-post"), 1, "the POST reached tup %zu times",
                 tup_count_id(up, "stale-post"));
    expect_reused("stale-post");
    http_free(&r);

    /* A GET may be sent again: reset is in the default retry_on. */
    warm_connection("warm-2");
    const char *hg[] = { "X-Test-Plan: stale=1", "X-Request-Id: stale-get", NULL };
    http_do("GET", px_url(px, "/s", url, sizeof(url)), hg, NULL, 0, T, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    cr_expect_eq(r.status, 200, "status %ld: %s", r.status, r.body ? (char *)r.body : "");
    expect_header(&r, "X-Retry-Attempts", "2");
    settle();
    cr_expect_eq(tup_count_id(up, "stale-get"), 2, "the GET reached tup %zu times",
                 tup_count_id(up, "stale-get"));
    expect_reused("stale-get");
    http_free(&r);
}

/* ---- 7: a failure mid-body ---- */

/* A GET with request id 'id' whose upstream resets after part of a 'len'-byte body (retries
 * configured): the client sees a truncated response, and the upstream one attempt. 'report'
 * prints what the client got. */
static void expect_reset_mid_body(const char *id, unsigned len, bool report)
{
    start("\"retry\": {" CFG_FAST "}", NULL);
    char url[128], plan[96], idh[64];
    snprintf(plan, sizeof(plan), "X-Test-Plan: action=reset-mid;fail=1;body=%u", len);
    snprintf(idh, sizeof(idh), "X-Request-Id: %s", id);
    const char *h[] = { plan, idh, NULL };
    struct http_resp r;
    http_do("GET", px_url(px, "/m", url, sizeof(url)), h, NULL, 0, T, &r);
    if (report)
        fprintf(stderr, "[bodies] reset-mid: curl rc %d (%s), status %ld, %zu body bytes\n", r.rc,
                curl_easy_strerror((CURLcode)r.rc), r.status, r.body_len);
    cr_expect_neq(r.rc, 0, "the client got a complete-looking response of %zu bytes", r.body_len);
    cr_expect_lt(r.body_len, len);
    settle();
    cr_expect_eq(tup_count_id(up, id), 1, "tup saw %zu attempts", tup_count_id(up, id));
    http_free(&r);
}

Test(bodies, failure_mid_body_is_not_retried_and_the_client_sees_it)
{
    expect_reset_mid_body("mid", 1000000, true);
}

/* A short body is held back to go out in one write with its headers; when it breaks off, the
 * client must still see a truncated response, not a complete-looking shorter one. */
Test(bodies, failure_mid_short_body_is_not_retried_and_the_client_sees_it)
{
    expect_reset_mid_body("mid-s", 2000, false);
}

/* ---- 8: large responses with bounded memory ---- */

Test(bodies, response_of_100mib_streams_intact_with_bounded_memory)
{
    start("", NULL);
    const uint64_t len = 100 * (uint64_t)MIB;
    char url[128];
    const char *h[] = { "X-Test-Plan: body=104857600", "X-Request-Id: down-100m", NULL };
    struct sampler s;
    sampler_start(&s, px);
    struct http_resp r;
    http_do("GET", px_url(px, "/d", url, sizeof(url)), h, NULL, 0, T, &r);
    long max = sampler_report(&s, "100 MiB response", r.seconds);
    expect_pattern_response(&r, len);
    cr_expect_lt(max, rss_bound_kb(), "proxy RSS reached %ld KiB during a 100 MiB response", max);
    http_free(&r);
}

Test(bodies, slow_client_keeps_memory_bounded)
{
    start("", NULL);
    const uint64_t len = 60 * (uint64_t)MIB;
    const char *h[] = { "X-Test-Plan: body=62914560", "X-Request-Id: slow-60m", NULL };
    /* A plain GET; send_gen for its receive-rate limit. */
    struct gen_req g = {
        .method = "GET", .path = "/d", .headers = h, .max_recv_speed = 20 * 1000 * 1000
    };
    struct sampler s;
    sampler_start(&s, px);
    struct http_resp r;
    send_gen(&g, &r);
    long max = sampler_report(&s, "60 MiB response at 20 MB/s", r.seconds);
    expect_pattern_response(&r, len);
    cr_expect_lt(max, rss_bound_kb(), "proxy RSS reached %ld KiB with a slow client", max);
    http_free(&r);
}

/* ---- 9: requests without a body ---- */

Test(bodies, head_and_bodiless_post_are_forwarded)
{
    start("", NULL);
    char url[128];
    const char *hh[] = { "X-Test-Plan: body=1000", "X-Request-Id: head", NULL };
    struct http_resp r;
    http_do("HEAD", px_url(px, "/h", url, sizeof(url)), hh, NULL, 0, T, &r);
    cr_assert_eq(r.rc, 0, "HEAD: curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, 0);
    expect_header(&r, "Content-Length", "1000"); /* the upstream's, for the GET it stands for */
    http_free(&r);

    const char *hp[] = { "X-Request-Id: empty-post", NULL };
    http_do("POST", px_url(px, "/e", url, sizeof(url)), hp, "", 0, T, &r);
    cr_assert_eq(r.rc, 0, "POST: curl error %d", r.rc);
    cr_expect_eq(r.status, 200);
    cr_expect_str_eq((char *)r.body, "ok\n");
    http_free(&r);

    settle();
    cr_assert_eq(tup_count(up), 2);
    const struct tup_req *q = tup_get(up, 0);
    cr_expect_str_eq(q->method, "HEAD");
    cr_expect_str_eq(q->request_id, "head");
    cr_expect_eq(q->body_len, 0);
    q = tup_get(up, 1);
    cr_expect_str_eq(q->method, "POST");
    cr_expect_str_eq(q->request_id, "empty-post");
    cr_expect_eq(q->body_len, 0);
    const char *cl = tup_req_header(q, "Content-Length");
    cr_expect(cl && strcmp(cl, "0") == 0, "POST Content-Length '%s'", cl ? cl : "(absent)");
    cr_expect_null(tup_req_header(q, "Transfer-Encoding"));
}

/* ---- 10: request trailers (docs/forwarding.md, "Request trailers") ---- */

/* Sends a chunked PUT of 'len' bytes to /tr with trailers on a raw connection: its answer's
 * status. */
static int put_with_trailers(const char *id, size_t len)
{
    int fd = fx_hold(raw_dial(px->port));
    char head[512];
    int hl = snprintf(head, sizeof(head),
                      "PUT /tr HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Request-Id: %s\r\n"
                      "X-Test-Plan: fail=1;status=503\r\nTransfer-Encoding: chunked\r\n\r\n"
                      "%zx\r\n",
                      id, len);
    cr_assert(raw_send_all(fd, head, (size_t)hl));
    char *body = malloc(len);
    memset(body, 'b', len);
    cr_assert(raw_send_all(fd, body, len));
    free(body);
    const char tail[] = "\r\n0\r\nX-Checksum: abc123\r\nX-Sig-Bin: AAEC/w==\r\n"
                        "X-Forwarded-For: 6.6.6.6\r\nContent-Length: 3\r\n\r\n";
    return raw_send_status(fd, tail, sizeof(tail) - 1, T);
}

/* Each attempt's trailers as tup recorded them: the client's, but for the proxy's own fields
 * and the framing ones; 'n' attempts of 'len' bytes, sent chunked. */
static void expect_trailers(const char *id, size_t n, size_t len)
{
    settle();
    cr_expect_eq(tup_count_id(up, id), n, "%s: attempts", id);
    for (size_t i = 0; i < tup_count(up); i++) {
        const struct tup_req *q = tup_get(up, i);
        if (strcmp(q->request_id, id) != 0)
            continue;
        cr_expect_eq(q->body_len, len);
        cr_expect_str_eq(tup_req_header(q, "Transfer-Encoding"), "chunked");
        cr_expect_null(tup_req_header(q, "Content-Length"));
        cr_expect_str_eq(tup_req_trailer(q, "X-Checksum"), "abc123", "attempt %u", q->key_attempt);
        cr_expect_str_eq(tup_req_trailer(q, "X-Sig-Bin"), "AAEC/w==", "attempt %u", q->key_attempt);
        cr_expect_eq(q->n_trailers, 2, "attempt %u: %zu trailers", q->key_attempt, q->n_trailers);
    }
}

/* A buffered body with trailers goes chunked, so that they can follow it, on every attempt;
 * a streamed chunked one carries them after its last chunk. */
Test(bodies, chunked_trailers_reach_an_http1_upstream_on_every_attempt)
{
    start("\"retry\": {" CFG_FAST ", \"max_retry_body_bytes\": 4096}", "1");
    cr_expect_eq(put_with_trailers("trl-buffered", 1000), 200);
    expect_trailers("trl-buffered", 2, 1000);
    cr_expect_eq(put_with_trailers("trl-streamed", 100000), 503, "streamed once: tup's 503");
    expect_trailers("trl-streamed", 1, 100000);
}
