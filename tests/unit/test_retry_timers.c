/* The request state machine's timers (proxy/core/retry.c) on a fake clock: backoff waits, the
 * per-try timeout, the deadline, Retry-After and the drain deadline fire at exactly their
 * millisecond, with no network and no wall-clock slack.
 *
 * This suite is linked without proxy/upstream/attempt.o: the fakes below stand in for the upstream
 * attempt and the client side (a front end of its own, proxy/core/front.h), record what the state
 * machine asked of them, and let each test say how an attempt ends. With hedging several attempts
 * run at once: each launch is numbered from 0, and the tests name the one that answers. The loop is
 * the real one, its clock the test's (loop_set_clock), turned with loop_turn(l, 0) after each move
 * of the clock.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/upstream/attempt.h"
#include "proxy/http/answer.h"
#include "proxy/http/grpc.h"
#include "proxy/telemetry/log.h"
#include "proxy/core/retry.h"
#include "proxy/core/worker.h"
#include "proxy/dns/resolve.h"
#include "tests/support/promtext.h"

/* ---- the fakes ---- */

#define LAUNCHES 16

static struct {
    struct attempt *a; /* the attempt launched last */
    unsigned launches;
    uint64_t launched_at[LAUNCHES];
    struct attempt *launched[LAUNCHES];
    const struct hlist *fields[LAUNCHES];   /* the request's fields each launch sends */
    char first[LAUNCHES][64];               /* and its own first field, "Name: value" */
    const struct hlist *trailers[LAUNCHES]; /* and the trailers it sends after the body */
    bool running[LAUNCHES];
    unsigned cancels;
} up;

static struct {
    struct front *f;
    unsigned answers;
    unsigned status;
    uint64_t at;
    char code[64];
    char stop[32];
    uint32_t attempts;
    const char *content_type; /* the request's, if set */
    size_t body_bytes;        /* of the answer, before its end */
    bool ended, failed;       /* its end came, broken off or not */
    int trailer_status;       /* the grpc-status of its trailers (saved or streamed), or -1 */
} client;

static uint64_t now_ms;

static uint64_t fake_clock(void *arg)
{
    (void)arg;
    return now_ms;
}

void attempt_init(struct attempt *a, struct attempt_side *u, const struct attempt_ops *ops,
                  void *arg)
{
    (void)u;
    memset(a, 0, sizeof(*a));
    a->ops = ops;
    a->arg = arg;
}

void attempt_fini(struct attempt *a)
{
    hlist_free(&a->head);
    hlist_free(&a->trailers);
}

bool attempt_queue(struct attempt *a, const char *origin, struct attempt_target *to,
                   struct share *conn)
{
    (void)origin;
    (void)to;
    (void)conn;
    a->sent = false;
    a->status = 0;
    a->bad_head = false;
    hlist_clear(&a->head);
    hlist_clear(&a->trailers);
    return false;
}

/* A snapshot's URLs: nothing reads them (attempt_launch below is the suite's own). */
struct attempt_url *attempt_url_new(const char *origin, const char *host, const struct cfg_tls *tls,
                                    bool tunnels)
{
    (void)origin, (void)host, (void)tls, (void)tunnels;
    return malloc(1);
}

void attempt_url_free(struct attempt_url *url)
{
    free(url);
}

struct attempt_target *attempt_target_new(const struct attempt_url *url,
                                          const struct dns_addr *addr, _Atomic int64_t *conns)
{
    (void)url, (void)addr, (void)conns;
    return NULL;
}

void attempt_target_free(struct attempt_target *t)
{
    (void)t;
}

void attempt_target_leave(struct attempt_side *u, const struct attempt_target *t)
{
    (void)u, (void)t;
}

int attempt_launch(struct attempt *a, const struct attempt_url *url,
                   const struct attempt_target *to, const char *base_path,
                   const struct attempt_req *req, uint64_t connect_timeout_ms)
{
    (void)url;
    (void)to;
    (void)base_path;
    (void)connect_timeout_ms;
    cr_assert(up.launches < LAUNCHES);
    up.launched[up.launches] = a;
    up.fields[up.launches] = req->fields;
    cr_assert_gt(req->n_own, 0);
    snprintf(up.first[up.launches], sizeof(up.first[0]), "%.*s: %.*s", (int)req->own[0].name_len,
             req->own[0].name, (int)req->own[0].value_len, req->own[0].value);
    up.trailers[up.launches] = req->trailers;
    up.running[up.launches] = true;
    up.launched_at[up.launches++] = now_ms;
    up.a = a;
    return 0;
}

/* The launch number of the attempt 'a' runs now. */
static unsigned launch_of(const struct attempt *a)
{
    for (unsigned i = up.launches; i-- > 0;)
        if (up.launched[i] == a && up.running[i])
            return i;
    cr_assert_fail("that attempt is not running");
    return 0;
}

bool attempt_running(const struct attempt *a)
{
    for (unsigned i = up.launches; i-- > 0;)
        if (up.launched[i] == a && up.running[i])
            return true;
    return false;
}

bool attempt_cancel(struct attempt *a)
{
    if (!attempt_running(a))
        return false;
    up.running[launch_of(a)] = false;
    up.cancels++;
    return true;
}

void attempt_commit(struct attempt *a)
{
    (void)a;
}

/* No upgrade here: no attempt has a tunnel to give. */
struct tunnel_up *attempt_take_tunnel(struct attempt *a)
{
    (void)a;
    return NULL;
}

bool attempt_pause_body(struct attempt *a)
{
    (void)a;
    return false;
}

void attempt_resume_body(struct attempt *a)
{
    (void)a;
}

void attempt_resume_upload(struct attempt *a)
{
    (void)a;
}

static void fake_fields(struct front *f,
                        void (*fn)(void *arg, const char *k, size_t kl, const char *v, size_t vl),
                        void *arg)
{
    (void)f;
    fn(arg, "Host", 4, "svc", 3);
    if (client.content_type)
        fn(arg, "Content-Type", 12, client.content_type, strlen(client.content_type));
}

static void answered(struct front *f, unsigned status, const char *code,
                     const struct answer_tag *tag)
{
    f->answered = true;
    f->status = status;
    client.answers++;
    client.status = status;
    client.at = now_ms;
    snprintf(client.code, sizeof(client.code), "%s", code);
    snprintf(client.stop, sizeof(client.stop), "%s", tag && tag->stop ? tag->stop : "");
    client.attempts = tag ? tag->attempts : 0;
    if (tag) { /* an answer to send (not a reset): counted as the real front ends count it */
        f->sent = true;
        retry_req_sending(f->req);
    }
}

static void fake_error(struct front *f, unsigned status, const char *code, const char *route,
                       const char *message, const struct answer_tag *tag)
{
    (void)route;
    (void)message;
    answered(f, status, code, tag);
}

static void fake_saved(struct front *f, int status, const struct hlist *h, const char *body,
                       size_t len, const struct hlist *trailers, const struct answer_tag *tag)
{
    (void)h;
    (void)body;
    client.body_bytes = len;
    client.trailer_status = grpc_status_of(trailers);
    answered(f, (unsigned)status, "saved", tag);
}

static void fake_response(struct front *f, int status, const struct hlist *h,
                          const struct answer_tag *tag)
{
    (void)h;
    answered(f, (unsigned)status, "response", tag);
}

static size_t fake_body(struct front *f, const char *p, size_t n)
{
    (void)f;
    (void)p;
    client.body_bytes += n;
    return n;
}

static void fake_end(struct front *f, const struct hlist *trailers, bool failed)
{
    (void)f;
    client.ended = true;
    client.failed = failed;
    client.trailer_status = grpc_status_of(trailers);
}

static void fake_reset(struct front *f, unsigned status)
{
    answered(f, status, "closed", NULL);
}

static void fake_nothing(struct front *f)
{
    (void)f;
}

static const struct front_ops fake_ops = { .fields = fake_fields,
                                           .error = fake_error,
                                           .saved = fake_saved,
                                           .response = fake_response,
                                           .body = fake_body,
                                           .end = fake_end,
                                           .reset = fake_reset,
                                           .wait_upload = fake_nothing,
                                           .upload_room = fake_nothing,
                                           .watch = fake_nothing,
                                           .unwatch = fake_nothing,
                                           .fini = fake_nothing };

/* ---- the worker around one request ---- */

static struct proxy px;
static struct worker w;
static struct cfg *cfg;
static struct retry_req *req;

static void no_kick(void *arg)
{
    (void)arg;
}

/* A worker on a config with one route "r" whose fields are 'route_json' (after name and
 * upstreams), the clock at 1,000,000 ms. The upstreams are addresses: the snapshot resolves a
 * route's upstream names for its tunnels (docs/upgrades.md), and nothing here connects; each is
 * one endpoint (an IP literal is never looked up), whose requests in flight in_flight() reads. */
static void start(const char *route_json)
{
    char text[1024];
    snprintf(text, sizeof(text),
             "{\"routes\": [{\"name\": \"r\", \"upstreams\": [\"http://127.0.0.1:1\", "
             "\"http://127.0.0.2:1\"]%s%s}]}",
             *route_json ? ", " : "", route_json);
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    cfg = cfg_load_buffer(text, strlen(text), "t", &errs);
    cr_assert_not_null(cfg, "%s", errs.n ? errs.v[0].msg : "?");
    cfg_errs_clear(&errs);
    log_configure(CFG_LOG_ERROR, CFG_LOG_JSON);
    memset(&up, 0, sizeof(up));
    memset(&client, 0, sizeof(client));
    memset(&px, 0, sizeof(px));
    memset(&w, 0, sizeof(w));
    now_ms = 1000000;
    px.metrics = metrics_new(1);
    px.live = live_new();
    px.dns = dns_new(&cfg->resolver);
    cr_assert_not_null(px.dns);
    budget_init(&px.budget, cfg->budget.window_ms);
    w.px = &px;
    w.loop = loop_new();
    cr_assert_not_null(w.loop);
    loop_set_clock(w.loop, fake_clock, NULL);
    w.rt = rt_new(cfg, 1, px.metrics, px.live, px.dns, px.n_workers);
    cr_assert_not_null(w.rt);
    w.rr = calloc(cfg->n_routes, sizeof(*w.rr));
    rng_seed(&w.rng, 7);
    w.log = log_buf_new();
    w.kick = no_kick;
}

/* A request without a body: its head, then the end of its (empty) body starts attempt 1. */
static void open_request(const char *method)
{
    client.f = retry_req_new(&w, &fake_ops, sizeof(struct front), FRONT_HTTP1, "/x", "127.0.0.1",
                             40000, REFUSE_NONE);
    cr_assert_not_null(client.f);
    req = client.f->req;
    retry_req_head(req, method);
    retry_req_end(req);
}

/* A GET without a body. */
static void get(void)
{
    open_request("GET");
}

/* libmicrohttpd is done with the connection: every timer of the request must be gone. */
static void end_request(void)
{
    retry_req_completed(req);
    req = NULL;
    cr_assert_eq(loop_timer_count(w.loop), 0, "a timer outlived its request");
}

/* (Criterion 2.4 does not count a failed assertion here: checks belong in the tests.) */
static void finish(void)
{
    if (!w.loop)
        return; /* finished already (a test that runs several workers in turn) */
    if (req)
        retry_req_completed(req);
    req = NULL;
    loop_free(w.loop);
    w.loop = NULL;
    rt_unref(w.rt);
    dns_free(px.dns);
    free(w.rr);
    log_buf_free(w.log);
    live_free(px.live);
    metrics_free(px.metrics);
    cfg_unref(cfg);
}

/* Moves the clock to 'ms' after the start and runs the loop's turn. */
static void at(uint64_t ms)
{
    now_ms = 1000000 + ms;
    loop_turn(w.loop, 0);
}

static uint64_t since_start(uint64_t t)
{
    return t - 1000000;
}

/* Launch 'k' ends: without a response ('sent': the request went out), or with a response head
 * (then its body, complete). */
static void launch_fails(unsigned k, bool sent)
{
    cr_assert(k < up.launches && up.running[k], "launch %u is not running", k);
    struct attempt *a = up.launched[k];
    a->sent = sent;
    up.running[k] = false;
    a->ops->done(a, ATTEMPT_BROKEN);
}

static void launch_answers(unsigned k, int status, const char *retry_after)
{
    cr_assert(k < up.launches && up.running[k], "launch %u is not running", k);
    struct attempt *a = up.launched[k];
    a->sent = true;
    a->status = status;
    if (retry_after)
        hlist_add(&a->head, "Retry-After", 11, retry_after, strlen(retry_after));
    a->ops->head(a);
    if (!up.running[k])
        return; /* the state machine let go of it */
    up.running[k] = false;
    a->ops->done(a, ATTEMPT_COMPLETE);
}

/* The same for the attempt launched last. */
static void attempt_fails(bool sent)
{
    cr_assert(up.launches > 0);
    launch_fails(up.launches - 1, sent);
}

static void attempt_answers(int status, const char *retry_after)
{
    cr_assert(up.launches > 0);
    launch_answers(up.launches - 1, status, retry_after);
}

TestSuite(retry_timers, .fini = finish, .timeout = 20);

Test(retry_timers, a_backoff_wait_ends_at_its_exact_millisecond)
{
    start("\"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 250, \"jitter\": "
          "\"none\"}}");
    get();
    cr_assert_eq(up.launches, 1);
    at(10);
    attempt_fails(false);
    at(259);
    cr_assert_eq(up.launches, 1, "the retry went before its 250 ms wait was over");
    at(260);
    cr_assert_eq(up.launches, 2);
    cr_assert_eq(since_start(up.launched_at[1]), 260);
    at(300);
    attempt_fails(true);
    at(549);
    cr_assert_eq(up.launches, 2);
    at(550);
    cr_assert_eq(up.launches, 3);
    at(600);
    attempt_fails(true);
    cr_assert_eq(client.answers, 1, "the third attempt was the last: answered at once");
    cr_assert_eq(client.status, 502);
    cr_assert_str_eq(client.stop, "max-attempts");
    cr_assert_eq(since_start(client.at), 600);
    end_request();
}

Test(retry_timers, the_per_try_timeout_cancels_the_attempt_at_its_millisecond)
{
    start("\"per_try_timeout_ms\": 300, \"retry\": {\"max_attempts\": 2, \"backoff\": "
          "{\"policy\": \"fixed\", \"base_ms\": 100, \"jitter\": \"none\"}}");
    get();
    at(299);
    cr_assert_eq(up.cancels, 0);
    at(300);
    cr_assert_eq(up.cancels, 1, "the attempt outlived its per-try timeout");
    at(399);
    cr_assert_eq(up.launches, 1);
    at(400);
    cr_assert_eq(up.launches, 2, "the retry after a timeout waits its backoff, then goes");
    at(700);
    cr_assert_eq(up.cancels, 2);
    cr_assert_eq(client.status, 504);
    cr_assert_str_eq(client.code, "upstream_timeout");
    cr_assert_str_eq(client.stop, "max-attempts");
    cr_assert_eq(since_start(client.at), 700);
    end_request();
}

Test(retry_timers, the_deadline_ends_a_running_attempt_at_its_millisecond)
{
    start("\"timeout_ms\": 1000, \"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": "
          "400, \"jitter\": \"none\"}}");
    get();
    at(100);
    attempt_fails(false);
    at(500);
    cr_assert_eq(up.launches, 2);
    at(999);
    cr_assert_eq(client.answers, 0);
    at(1000);
    cr_assert_eq(up.cancels, 1);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 504);
    cr_assert_str_eq(client.stop, "deadline");
    cr_assert_eq(client.attempts, 2);
    end_request();
}

Test(retry_timers, a_wait_that_would_pass_the_deadline_is_not_taken)
{
    start("\"timeout_ms\": 1000, \"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": "
          "400, \"jitter\": \"none\"}}");
    get();
    at(599); /* 599 + 400 < 1000: this wait fits */
    attempt_fails(false);
    cr_assert_eq(client.answers, 0);
    at(999);
    cr_assert_eq(up.launches, 2);
    cr_assert_eq(client.answers, 0);
    attempt_fails(false); /* 999 + 400 >= 1000: no time left for another attempt */
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 502);
    cr_assert_str_eq(client.stop, "deadline");
    cr_assert_eq(since_start(client.at), 999);
    end_request();
}

Test(retry_timers, the_deadline_during_an_attempt_returns_the_saved_response)
{
    start("\"timeout_ms\": 1000, \"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": "
          "400, \"jitter\": \"none\"}}");
    get();
    at(100);
    attempt_answers(503, NULL); /* kept whole, then a 400 ms wait */
    at(500);
    cr_assert_eq(up.launches, 2);
    at(999);
    cr_assert_eq(client.answers, 0);
    at(1000);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 503, "the first attempt's response is the answer");
    cr_assert_str_eq(client.code, "saved");
    cr_assert_str_eq(client.stop, "deadline");
    end_request();
}

Test(retry_timers, retry_after_sets_the_wait_to_the_millisecond)
{
    start("\"timeout_ms\": 10000, \"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": "
          "100, \"jitter\": \"none\"}}");
    get();
    at(20);
    attempt_answers(429, "2");
    at(2019);
    cr_assert_eq(up.launches, 1, "Retry-After: 2 was not waited out");
    at(2020);
    cr_assert_eq(up.launches, 2);
    end_request();
}

Test(retry_timers, the_drain_deadline_refuses_a_wait_that_would_outlast_it)
{
    start("\"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 300, \"jitter\": "
          "\"none\"}}");
    get();
    atomic_store(&px.drain_deadline_ms, now_ms + 200);
    at(10);
    attempt_fails(false);
    cr_assert_eq(up.launches, 1);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 502);
    cr_assert_str_eq(client.stop, "draining");
    end_request();
}

Test(retry_timers, draining_ends_a_wait_with_a_503_when_its_deadline_comes)
{
    start("\"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 300, \"jitter\": "
          "\"none\"}}");
    get();
    at(10);
    attempt_fails(false);
    at(100);
    retry_expire_all(&w);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 503);
    cr_assert_str_eq(client.code, "draining");
    cr_assert_str_eq(client.stop, "draining");
    at(310);
    cr_assert_eq(up.launches, 1, "the wait's timer outlived the answer");
    end_request();
}

Test(retry_timers, a_client_leaving_during_a_wait_stops_every_timer)
{
    start("\"per_try_timeout_ms\": 300, \"retry\": {\"backoff\": {\"policy\": \"fixed\", "
          "\"base_ms\": 500, \"jitter\": \"none\"}}");
    get();
    at(10);
    attempt_fails(false);
    cr_assert_gt(loop_timer_count(w.loop), 0);
    retry_req_client_gone(req);
    cr_assert_eq(client.status, 499);
    retry_req_completed(req);
    req = NULL;
    cr_assert_eq(loop_timer_count(w.loop), 0, "a timer outlived the request");
    at(5000);
    cr_assert_eq(up.launches, 1);
}

/* ---- hedging (retry.hedge_on_per_try_timeout) ---- */

/* A route that hedges after 100 ms, its backoff 'wait_ms', at most 'attempts' attempts, the
 * whole request 1 s, and 'more' route fields. */
static void start_hedging(unsigned wait_ms, unsigned attempts, const char *more)
{
    char route[512];
    snprintf(route, sizeof(route),
             "\"timeout_ms\": 1000, \"per_try_timeout_ms\": 100, \"retry\": {\"max_attempts\": "
             "%u, \"hedge_on_per_try_timeout\": true, \"backoff\": {\"policy\": \"fixed\", "
             "\"base_ms\": %u, \"jitter\": \"none\"}}%s",
             attempts, wait_ms, more);
    start(route);
}

/* A series of the registry, summed over the workers: 0 when it is not shown. */
static double metric(const char *series)
{
    size_t len;
    char *text = metrics_render(px.metrics, &len);
    cr_assert_not_null(text);
    /* summed over the route's two upstreams; 0 when no series matches */
    double v = prom_sum(text, series);
    free(text);
    return isnan(v) ? 0 : v;
}

/* Launch 'k' sends a response head now; its body follows with launch_body_ends(). */
static void launch_head(unsigned k, int status)
{
    cr_assert(k < up.launches && up.running[k], "launch %u is not running", k);
    struct attempt *a = up.launched[k];
    a->sent = true;
    a->status = status;
    a->ops->head(a);
}

static void launch_body_ends(unsigned k)
{
    cr_assert(k < up.launches && up.running[k], "launch %u is not running", k);
    struct attempt *a = up.launched[k];
    cr_assert_eq(a->ops->body(a, "busy", 4), 4);
    up.running[k] = false;
    a->ops->done(a, ATTEMPT_COMPLETE);
}

#define DEADLINE_800                                                                               \
    "\"timeout_ms\": 1000, \"retry\": {\"max_attempts\": 2, \"retry_on\": [\"503\"], "             \
    "\"backoff\": {\"policy\": "                                                                   \
    "\"fixed\", \"base_ms\": 800, \"jitter\": \"none\"}}"

Test(retry_timers, a_retry_whose_wait_no_longer_fits_once_the_body_is_read_stops_there)
{
    start(DEADLINE_800);
    get();
    launch_head(0, 503); /* at 0: 0 + 800 < 1000, a retry if the wait could start now */
    at(300);
    cr_assert_eq(client.answers, 0);
    launch_body_ends(0); /* the wait would start at 300 and end at 1100, past the deadline */
    cr_assert_eq(client.answers, 1, "retrying ends when the body is read, not at the deadline");
    cr_assert_eq(since_start(client.at), 300);
    cr_assert_eq(client.status, 503);
    cr_assert_str_eq(client.code, "saved");
    cr_assert_str_eq(client.stop, "deadline");
    cr_assert_eq(up.launches, 1);
    cr_assert_eq(metric("retryproxy_retries_total{route=\"r\",reason=\"503\"}"), 0);
    cr_assert_eq(metric("retryproxy_backoff_seconds_count{route=\"r\"}"), 0);
    cr_assert_eq(metric("retryproxy_retries_denied_total{route=\"r\",reason=\"deadline\"}"), 1);
    cr_assert_eq(metric("retryproxy_retries_in_flight"), 0);
    end_request();
}

Test(retry_timers, a_retry_whose_wait_still_fits_once_the_body_is_read_waits_from_then)
{
    start(DEADLINE_800);
    get();
    launch_head(0, 503);
    at(150);
    launch_body_ends(0); /* 150 + 800 < 1000 */
    at(949);
    cr_assert_eq(up.launches, 1);
    at(950);
    cr_assert_eq(up.launches, 2, "the wait runs from the body's end");
    cr_assert_eq(metric("retryproxy_retries_total{route=\"r\",reason=\"503\"}"), 1);
    cr_assert_eq(metric("retryproxy_backoff_seconds_count{route=\"r\"}"), 1);
    cr_assert_eq(metric("retryproxy_retries_denied_total{route=\"r\",reason=\"deadline\"}"), 0);
    attempt_answers(200, NULL);
    cr_assert_eq(client.status, 200);
    end_request();
}

Test(retry_timers, the_deadline_during_a_slow_body_counts_the_retry_once_as_denied)
{
    start(DEADLINE_800);
    get();
    launch_head(0, 503);
    at(1000); /* the body never came: the deadline ends the request */
    cr_assert_eq(client.answers, 1);
    cr_assert_str_eq(client.stop, "deadline");
    cr_assert_eq(client.status, 504, "a body cut off is not returned as complete");
    cr_assert_eq(metric("retryproxy_retries_total{route=\"r\",reason=\"503\"}"), 0);
    cr_assert_eq(metric("retryproxy_backoff_seconds_count{route=\"r\"}"), 0);
    cr_assert_eq(metric("retryproxy_retries_denied_total{route=\"r\",reason=\"deadline\"}"), 1);
    cr_assert_eq(metric("retryproxy_retries_in_flight"), 0);
    end_request();
}

static bool running(unsigned k)
{
    return k < up.launches && up.running[k];
}

/* The attempts running now (the fake never queues one for a slot). */
static int64_t launches_running(void)
{
    int64_t n = 0;
    for (unsigned i = 0; i < up.launches; i++)
        n += up.running[i];
    return n;
}

/* Attempts in flight on the route's endpoints, as /upstreams and least_request see them. */
static int64_t in_flight(void)
{
    int64_t n = 0;
    const struct rt_route *x = &w.rt->routes[0];
    for (size_t k = 0; k < cfg->routes[0].n_upstreams; k++) {
        struct live_ep_row rows[4];
        size_t m = live_upstream_endpoints(x->ups[k], now_ms, rows, 4);
        for (size_t i = 0; i < m; i++)
            n += rows[i].in_flight;
    }
    return n;
}

/* start_hedging(), a GET, and the clock on to the hedge's launch: attempts 0 and 1 run. */
static void hedged(unsigned wait_ms, unsigned attempts)
{
    start_hedging(wait_ms, attempts, "");
    get();
    at(100);
    at(100 + wait_ms);
    cr_assert(running(0) && running(1), "two attempts should run at once");
}

Test(retry_timers, a_hedge_starts_beside_the_slow_attempt_and_the_first_good_answer_wins)
{
    start_hedging(10, 3, "");
    get();
    at(100);
    cr_assert_eq(up.cancels, 0, "the slow attempt was cancelled at its per-try timeout");
    at(109);
    cr_assert_eq(up.launches, 1, "the hedge went before its backoff wait");
    at(110);
    cr_assert_eq(up.launches, 2);
    cr_assert(running(0) && running(1), "two attempts should run at once");
    /* each sends its own number, however long the first took to send */
    cr_assert_str_eq(up.first[0], "X-Retry-Attempt: 1");
    cr_assert_str_eq(up.first[1], "X-Retry-Attempt: 2");
    cr_assert_eq(up.fields[0], up.fields[1], "the request's fields are shared");
    at(150);
    launch_answers(1, 200, NULL);
    cr_assert_eq(client.status, 200);
    cr_assert_str_eq(client.code, "response");
    cr_assert_str_eq(client.stop, "");
    cr_assert_eq(client.attempts, 2);
    at(150);
    cr_assert(!running(0), "the slow attempt outlived the answer");
    cr_assert_eq(up.cancels, 1);
    cr_assert_eq(metric("retryproxy_hedges_total{route=\"r\"}"), 1);
    cr_assert_eq(metric("retryproxy_retries_total{route=\"r\",reason=\"timeout\"}"), 1);
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"2xx\"}"), 1);
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"cancelled\"}"), 1);
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"timeout\"}"), 0);
    cr_assert_eq(metric("retryproxy_retry_success_total{route=\"r\"}"), 1);
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 0);
    end_request();
}

Test(retry_timers, the_slow_attempt_answering_first_cancels_the_hedge)
{
    hedged(10, 3);
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 1, "the hedge holds a retry's slot");
    at(180);
    launch_answers(0, 200, NULL);
    cr_assert_eq(client.status, 200);
    cr_assert_eq(client.attempts, 2);
    cr_assert(running(1), "cancelled from inside curl's callback instead of the next turn");
    at(180);
    cr_assert(!running(1), "the hedge outlived the answer");
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"cancelled\"}"), 1);
    cr_assert_eq(metric("retryproxy_retry_success_total{route=\"r\"}"), 0,
                 "the first attempt's success counted as a retry's");
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 0);
    at(200);
    cr_assert_eq(up.launches, 2, "a third attempt went after the answer");
    end_request();
}

Test(retry_timers, an_answer_during_the_hedges_wait_ends_the_wait)
{
    start_hedging(50, 3, "");
    get();
    at(100);
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 1);
    at(120);
    launch_answers(0, 200, NULL);
    cr_assert_eq(client.status, 200);
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 0, "the hedge's slot was kept");
    at(150);
    cr_assert_eq(up.launches, 1, "the hedge went after the answer");
    end_request();
}

Test(retry_timers, a_hedge_failing_last_waits_for_the_slow_attempt)
{
    hedged(10, 2);
    at(120);
    launch_answers(1, 503, NULL); /* retrying is over: max_attempts 2 */
    cr_assert_eq(client.answers, 0, "answered 503 while the slow attempt could still succeed");
    at(400);
    launch_answers(0, 200, NULL);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 200);
    cr_assert_str_eq(client.code, "response");
    cr_assert_str_eq(client.stop, "");
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"5xx\"}"), 1);
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"2xx\"}"), 1);
    end_request();
}

Test(retry_timers, when_every_attempt_fails_the_last_response_is_the_answer)
{
    hedged(10, 2);
    at(120);
    launch_answers(1, 503, NULL);
    at(300);
    launch_answers(0, 502, NULL);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 502, "the slow attempt's response, the last one, is the answer");
    cr_assert_str_eq(client.code, "response");
    cr_assert_str_eq(client.stop, "max-attempts");
    end_request();
}

Test(retry_timers, when_the_slow_attempt_fails_without_a_response_the_kept_one_is_the_answer)
{
    hedged(10, 2);
    at(120);
    launch_answers(1, 503, NULL);
    at(300);
    launch_fails(0, true);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 503);
    cr_assert_str_eq(client.code, "saved");
    cr_assert_str_eq(client.stop, "max-attempts");
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"reset\"}"), 1);
    end_request();
}

Test(retry_timers, a_slow_attempt_failing_leaves_the_hedge_running)
{
    hedged(10, 3);
    at(150);
    launch_fails(0, true);
    cr_assert_eq(client.answers, 0);
    cr_assert(running(1), "the hedge was cancelled with the slow attempt");
    at(209);
    cr_assert_eq(up.launches, 2, "a failure of the slow attempt started one more");
    at(210); /* the hedge's own per-try timeout: a third attempt, beside it */
    at(220);
    cr_assert_eq(up.launches, 3);
    cr_assert(running(1) && running(2));
    cr_assert_str_eq(up.first[2], "X-Retry-Attempt: 3");
    launch_answers(2, 200, NULL);
    cr_assert_eq(client.status, 200);
    cr_assert_eq(client.attempts, 3);
    at(230);
    cr_assert(!running(1));
    cr_assert_eq(metric("retryproxy_hedges_total{route=\"r\"}"), 2);
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 0);
    end_request();
}

Test(retry_timers, the_deadline_ends_every_attempt_at_its_millisecond)
{
    hedged(10, 3);
    at(210);
    at(220);
    cr_assert(running(0) && running(1) && running(2));
    at(320); /* the third's per-try timeout: no attempt is left, it runs on */
    cr_assert_eq(up.cancels, 0);
    cr_assert_eq(metric("retryproxy_retries_denied_total{route=\"r\",reason=\"max-attempts\"}"), 1);
    at(999);
    cr_assert_eq(client.answers, 0);
    at(1000);
    cr_assert_eq(client.answers, 1);
    cr_assert_eq(client.status, 504);
    cr_assert_str_eq(client.code, "upstream_timeout");
    cr_assert_eq(client.attempts, 3);
    cr_assert(!running(0) && !running(1) && !running(2));
    cr_assert_eq(up.cancels, 3);
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"timeout\"}"), 3);
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 0);
    end_request();
}

Test(retry_timers, a_request_that_may_not_go_twice_is_not_hedged)
{
    start_hedging(10, 3, "");
    open_request("POST");
    at(100);
    cr_assert_eq(up.cancels, 1, "the per-try timeout ends a POST's attempt as without hedging");
    cr_assert_eq(client.status, 504);
    cr_assert_str_eq(client.stop, "not-retryable");
    at(200);
    cr_assert_eq(up.launches, 1);
    end_request();
}

Test(retry_timers, a_hedge_the_budget_refuses_lets_the_attempt_run_on)
{
    start_hedging(10, 3, ", \"budget\": {\"max_concurrent_retries\": 0}");
    get();
    at(100);
    cr_assert_eq(up.cancels, 0);
    cr_assert_eq(metric("retryproxy_retries_denied_total{route=\"r\",reason=\"concurrency\"}"), 1);
    at(500);
    cr_assert_eq(up.launches, 1);
    launch_answers(0, 200, NULL);
    cr_assert_eq(client.status, 200);
    cr_assert_eq(client.attempts, 1);
    cr_assert_eq(metric("retryproxy_hedges_total{route=\"r\"}"), 0);
    end_request();
}

Test(retry_timers, a_client_leaving_during_the_hedges_wait_ends_the_slow_attempt)
{
    start_hedging(50, 3, "");
    get();
    at(120);
    retry_req_client_gone(req);
    cr_assert_eq(client.status, 499);
    cr_assert(!running(0), "the slow attempt outlived its client");
    retry_req_completed(req);
    req = NULL;
    cr_assert_eq(loop_timer_count(w.loop), 0, "a timer outlived the request");
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 0);
    at(5000);
    cr_assert_eq(up.launches, 1);
}

Test(retry_timers, draining_ends_the_slow_attempt_and_the_hedge)
{
    hedged(10, 3);
    retry_expire_all(&w);
    cr_assert_eq(client.status, 503);
    cr_assert_str_eq(client.stop, "draining");
    cr_assert(!running(0) && !running(1));
    cr_assert_eq(metric("retryproxy_attempts_total{route=\"r\",outcome=\"cancelled\"}"), 2);
    cr_assert_eq(metrics_retries_in_flight(px.metrics), 0);
    end_request();
}

/* Every attempts_total series of route "r", summed. */
static double attempts_counted(void)
{
    size_t len;
    char *text = metrics_render(px.metrics, &len);
    cr_assert_not_null(text);
    double sum = 0;
    const char *key = "\nretryproxy_attempts_total{route=\"r\",";
    for (const char *p = strstr(text, key); p; p = strstr(p + 1, key))
        sum += strtod(strchr(p, '}') + 2, NULL);
    free(text);
    return sum;
}

/* Random races, seed by seed: attempts answer 200 or 503 or fail at random instants, some
 * after others have lost, the client leaves or the proxy drains now and then. Whatever the
 * order, the request is answered once, every attempt launched is counted once and none runs
 * on after the request, no timer outlives it, and every retry slot is given back (ASan sees
 * the memory). */
Test(retry_timers, random_races_keep_every_count_and_free_everything)
{
    for (unsigned seed = 1; seed <= 400; seed++) {
        struct rng g;
        rng_seed(&g, seed);
        char more[96] = "";
        if (rng_between(&g, 0, 3) == 0)
            snprintf(more, sizeof(more), ", \"budget\": {\"max_concurrent_retries\": %u}",
                     (unsigned)rng_between(&g, 0, 1));
        start_hedging((unsigned)rng_between(&g, 1, 60), (unsigned)rng_between(&g, 1, 4), more);
        get();
        unsigned t = 0;
        while (client.answers == 0 && t <= 1100) {
            t += (unsigned)rng_between(&g, 1, 40);
            at(t);
            if (client.answers)
                break;
            unsigned k = (unsigned)rng_between(&g, 0, up.launches ? up.launches - 1 : 0);
            switch (rng_between(&g, 0, 9)) {
            case 0:
            case 1:
                if (running(k))
                    launch_answers(k, 200, NULL);
                break;
            case 2:
            case 3:
                if (running(k))
                    launch_answers(k, 503, NULL);
                break;
            case 4:
                if (running(k))
                    launch_fails(k, rng_between(&g, 0, 1));
                break;
            case 5:
                if (rng_between(&g, 0, 9) == 0)
                    retry_req_client_gone(req);
                else if (rng_between(&g, 0, 19) == 0)
                    retry_expire_all(&w);
                break;
            default:
                break; /* time passes */
            }
            /* an attempt counts in its endpoint's in flight exactly while its transfer runs:
             * through its head and body, until it ends, is cancelled or loses */
            cr_assert_eq(in_flight(), launches_running(),
                         "seed %u at %u ms: %lld in flight, %lld "
                         "running",
                         seed, t, (long long)in_flight(), (long long)launches_running());
        }
        cr_assert_eq(client.answers, 1, "seed %u: %u answers", seed, client.answers);
        at(t + 1); /* cancels left for the next turn */
        retry_req_completed(req);
        req = NULL;
        cr_assert_eq(loop_timer_count(w.loop), 0, "seed %u: a timer outlived the request", seed);
        for (unsigned i = 0; i < up.launches; i++)
            cr_assert(!running(i), "seed %u: launch %u runs on after the request", seed, i);
        cr_assert_eq(attempts_counted(), up.launches, "seed %u: %g attempts counted for %u", seed,
                     attempts_counted(), up.launches);
        cr_assert_eq(metrics_retries_in_flight(px.metrics), 0, "seed %u: a slot was kept", seed);
        cr_assert_eq(in_flight(), 0, "seed %u: an attempt stayed in flight", seed);
        finish();
    }
}

/* ---- requests in flight per endpoint (docs/admin.md "in_flight") ---- */

/* A response that streams is in flight until its body ends, not until its head. */
Test(retry_timers, a_streamed_response_is_in_flight_until_its_body_ends)
{
    start("");
    get();
    cr_assert_eq(in_flight(), 1);
    launch_head(0, 200);
    cr_assert_eq(client.status, 200);
    cr_assert_eq(in_flight(), 1, "the body still streams: the attempt is in flight");
    launch_body_ends(0);
    cr_assert_eq(in_flight(), 0);
    end_request();
    cr_assert_eq(in_flight(), 0);
}

/* A retryable response is in flight while its body is read, not during the wait after it. */
Test(retry_timers, a_drained_response_is_in_flight_until_read_and_not_during_the_wait)
{
    start("\"retry\": {\"max_attempts\": 2, \"retry_on\": [\"503\"], "
          "\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 100, \"jitter\": \"none\"}}");
    get();
    launch_head(0, 503);
    cr_assert_eq(in_flight(), 1, "its body is being read");
    at(10);
    launch_body_ends(0);
    cr_assert_eq(in_flight(), 0, "in flight during the backoff wait");
    at(110);
    cr_assert_eq(up.launches, 2);
    cr_assert_eq(in_flight(), 1);
    launch_answers(1, 200, NULL);
    cr_assert_eq(in_flight(), 0);
    end_request();
}

/* The deadline, or the client leaving, cuts a streaming body off: out of flight at once, while
 * the request itself lives on (its connection). */
Test(retry_timers, a_stream_cut_off_by_the_deadline_leaves_flight_at_once)
{
    start("\"timeout_ms\": 1000");
    get();
    launch_head(0, 200);
    at(999);
    cr_assert_eq(in_flight(), 1);
    at(1000);
    cr_assert(client.ended && client.failed, "the body was not cut off");
    cr_assert(!running(0));
    cr_assert_eq(in_flight(), 0, "a cancelled stream stayed in flight");
    end_request();
}

Test(retry_timers, a_stream_whose_client_left_leaves_flight_once)
{
    start("");
    get();
    launch_head(0, 200);
    cr_assert_eq(in_flight(), 1);
    retry_req_completed(req); /* the connection is gone mid-body */
    req = NULL;
    cr_assert(!running(0));
    cr_assert_eq(in_flight(), 0);
}

/* Hedging: both attempts in flight; the winner's stream stays in flight, the loser leaves once
 * cancelled (the next turn), and nothing is left when the winner's body ends. */
Test(retry_timers, a_hedge_winner_streams_in_flight_and_the_loser_leaves)
{
    hedged(10, 3);
    cr_assert_eq(in_flight(), 2);
    launch_head(1, 200);
    cr_assert_eq(client.status, 200);
    at(150);
    cr_assert(!running(0), "the slow attempt outlived the answer");
    cr_assert_eq(in_flight(), 1, "the loser stayed in flight, or the winner left");
    launch_body_ends(1);
    cr_assert_eq(in_flight(), 0);
    end_request();
}

/* ---- a gRPC status in trailers (proxy/core/keep.c, docs/grpc.md) ---- */

#define GRPC_ROUTE                                                                                 \
    "\"retry\": {\"max_attempts\": 3, \"retry_on\": [\"unavailable\"], " CFG_FAST_FIXED "}"
#define CFG_FAST_FIXED "\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 10, \"jitter\": \"none\"}"

/* A gRPC call (a POST) on a route that retries UNAVAILABLE, its first attempt launched. */
static void grpc_call(const char *route_json)
{
    start(route_json);
    client.content_type = "application/grpc";
    client.trailer_status = -1;
    open_request("POST");
    cr_assert_eq(up.launches, 1);
}

/* One gRPC message of 'n' payload bytes into buf (5 + n bytes). */
static size_t message(char *buf, uint32_t n)
{
    buf[0] = 0;
    buf[1] = (char)(n >> 24);
    buf[2] = (char)(n >> 16);
    buf[3] = (char)(n >> 8);
    buf[4] = (char)n;
    memset(buf + 5, 'm', n);
    return 5 + n;
}

/* Launch 'k''s response ends complete, with trailers holding grpc-status 'status'. */
static void grpc_ends(unsigned k, int status)
{
    struct attempt *a = up.launched[k];
    char v[16];
    snprintf(v, sizeof(v), "%d", status);
    hlist_add(&a->trailers, "grpc-status", 11, v, strlen(v));
    up.running[k] = false;
    a->ops->done(a, ATTEMPT_COMPLETE);
}

/* Launch 'k' answers 200 without grpc-status, then 'n' body bytes, then (when 'status' >= 0)
 * trailers with that grpc-status and its end. */
static void grpc_answers(unsigned k, const char *body, size_t n, int status)
{
    launch_head(k, 200);
    struct attempt *a = up.launched[k];
    if (n && up.running[k])
        cr_assert_eq(a->ops->body(a, body, n), n);
    if (status >= 0 && up.running[k])
        grpc_ends(k, status);
}

Test(retry_timers, a_grpc_status_in_the_trailers_is_retried_and_nothing_reached_the_client)
{
    grpc_call(GRPC_ROUTE);
    char m[64];
    size_t n = message(m, 3);
    grpc_answers(0, m, n, 14);
    cr_expect_eq(client.answers, 0, "held back, then retried: the client saw nothing");
    at(9);
    cr_expect_eq(up.launches, 1);
    at(10);
    cr_assert_eq(up.launches, 2, "the retry after the backoff");
    grpc_answers(1, m, n, 0);
    cr_expect_eq(client.answers, 1);
    cr_expect_eq(client.status, 200);
    cr_expect_str_eq(client.code, "response");
    cr_expect_eq(client.body_bytes, n, "the held message, once");
    cr_expect(client.ended && !client.failed);
    cr_expect_eq(client.trailer_status, 0, "the trailers relayed");
    cr_expect_eq(client.attempts, 2);
    cr_expect_eq(metric("retryproxy_retries_total{route=\"r\",reason=\"unavailable\"}"), 1);
    end_request();
}

Test(retry_timers, a_grpc_status_retry_on_does_not_name_is_relayed_with_its_trailers)
{
    grpc_call(GRPC_ROUTE);
    char m[64];
    size_t n = message(m, 10);
    grpc_answers(0, m, n, 5);
    cr_expect_eq(client.answers, 1);
    cr_expect_eq(client.body_bytes, n);
    cr_expect_eq(client.trailer_status, 5);
    at(1000);
    cr_expect_eq(up.launches, 1);
    end_request();
}

Test(retry_timers, a_second_message_commits_the_call_and_its_status_is_never_retried)
{
    grpc_call(GRPC_ROUTE);
    char m[64];
    size_t n = message(m, 3);
    n += message(m + n, 4); /* two messages: a server-streaming call */
    grpc_answers(0, m, n, -1);
    cr_expect_eq(client.answers, 1, "streaming from the second message on");
    cr_expect_eq(client.body_bytes, n);
    grpc_ends(0, 14);
    cr_expect_eq(client.trailer_status, 14, "relayed as it came");
    at(1000);
    cr_expect_eq(up.launches, 1, "committed: never retried");
    end_request();
}

Test(retry_timers, a_response_too_large_to_hold_streams)
{
    grpc_call(GRPC_ROUTE);
    static char big[40 * 1024];
    size_t n = message(big, sizeof(big) - 5); /* one message, larger than what is held */
    launch_head(0, 200);
    struct attempt *a = up.launched[0];
    cr_assert_eq(a->ops->body(a, big, 16384), 16384);
    cr_assert_eq(a->ops->body(a, big + 16384, 16384), 16384);
    cr_expect_eq(client.answers, 0, "32 KiB held");
    cr_assert_eq(a->ops->body(a, big + 32768, n - 32768), n - 32768);
    cr_expect_eq(client.answers, 1);
    cr_expect_eq(client.body_bytes, n, "what was held, then the rest");
    grpc_ends(0, 14);
    at(1000);
    cr_expect_eq(up.launches, 1);
    end_request();
}

Test(retry_timers, when_retrying_stops_the_last_attempt_streams_with_its_trailers)
{
    grpc_call("\"retry\": {\"max_attempts\": 2, \"retry_on\": [\"unavailable\"], " CFG_FAST_FIXED
              "}");
    char m[64];
    size_t n = message(m, 3);
    grpc_answers(0, m, n, 14);
    at(10);
    cr_assert_eq(up.launches, 2);
    launch_head(1, 200);
    cr_expect_eq(client.answers, 1, "the last attempt is not held: nothing could follow it");
    grpc_ends(1, 14);
    cr_expect_eq(client.trailer_status, 14);
    cr_expect_eq(client.attempts, 2);
    end_request();
}

Test(retry_timers, a_held_response_that_breaks_off_is_never_passed_off_as_good)
{
    grpc_call(GRPC_ROUTE);
    char m[64];
    size_t n = message(m, 3);
    grpc_answers(0, m, n, -1);
    cr_expect_eq(client.answers, 0);
    launch_fails(0, true);
    cr_expect_eq(client.answers, 1);
    cr_expect_eq(client.status, 502, "a reset on a call that is a POST: not retried");
    cr_expect_str_eq(client.code, "upstream_unavailable");
    cr_expect_eq(client.body_bytes, 0, "not a byte of the broken response");
    cr_expect_eq(up.launches, 1);
    end_request();
}

Test(retry_timers, a_saved_grpc_response_keeps_its_trailers)
{
    grpc_call("\"retry\": {\"max_attempts\": 3, \"retry_on\": [\"unavailable\"], " CFG_FAST_FIXED
              "}, \"timeout_ms\": 300");
    char m[64];
    size_t n = message(m, 3);
    grpc_answers(0, m, n, 14);
    at(10);
    cr_assert_eq(up.launches, 2);
    at(300); /* the retry never answers: at the deadline, the response retrying stopped on */
    cr_expect_eq(client.answers, 1);
    cr_expect_str_eq(client.code, "saved");
    cr_expect_eq(client.body_bytes, n);
    cr_expect_eq(client.trailer_status, 14, "with its trailers");
    cr_expect_eq(client.attempts, 2);
    end_request();
}

/* ---- request trailers (retry_req_trailer, docs/forwarding.md "Request trailers") ---- */

static void trailer(const char *k, const char *v)
{
    retry_req_trailer(req, k, strlen(k), v, strlen(v));
}

/* A GET whose head is in: its trailers follow, then its end. */
static void open_head(void)
{
    client.f = retry_req_new(&w, &fake_ops, sizeof(struct front), FRONT_HTTP1, "/x", "127.0.0.1",
                             40000, REFUSE_NONE);
    cr_assert_not_null(client.f);
    req = client.f->req;
    retry_req_head(req, "GET");
}

Test(retry_timers, request_trailers_go_with_every_attempt_but_the_proxys_own)
{
    start("\"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": 10, \"jitter\": "
          "\"none\"}}");
    open_head();
    trailer("X-Checksum", "abc");
    trailer("Content-Length", "3");
    trailer("X-Forwarded-For", "6.6.6.6");
    trailer("X-Retry-Attempt", "9");
    trailer("TE", "trailers");
    trailer(":path", "/elsewhere");
    trailer("X_Under", "1"); /* limits.headers_with_underscores "drop", the default */
    trailer("x-sig-bin", "AAEC/w==");
    retry_req_end(req);
    cr_assert_eq(up.launches, 1);
    at(5);
    attempt_fails(false);
    at(15);
    cr_assert_eq(up.launches, 2);
    for (unsigned k = 0; k < 2; k++) {
        const struct hlist *t = up.trailers[k];
        cr_assert_not_null(t, "launch %u sent no trailers", k);
        cr_expect_eq(t->count, 2, "launch %u: %zu trailers", k, t->count);
        size_t pos = 0;
        const char *n, *v;
        cr_assert(hlist_next(t, &pos, &n, &v));
        cr_expect_str_eq(n, "x-checksum", "names go in lowercase");
        cr_expect_str_eq(v, "abc");
        cr_assert(hlist_next(t, &pos, &n, &v));
        cr_expect_str_eq(n, "x-sig-bin");
        cr_expect_str_eq(v, "AAEC/w==");
    }
    end_request();
}

/* limits.max_header_bytes (8192 here) and 100 fields bound the head and the trailers together:
 * past either, none of the trailers goes, the request does. */
Test(retry_timers, request_trailers_past_the_head_bounds_are_all_left_out)
{
    start("");
    open_head();
    trailer("X-A", "1");
    char big[8100];
    memset(big, 'v', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    trailer("X-Big", big);
    trailer("X-C", "2");
    retry_req_end(req);
    cr_assert_eq(up.launches, 1, "the request goes on");
    cr_expect_eq(up.trailers[0]->count, 0, "some trailers went");
    end_request();

    /* its head has one field: 99 trailers fit, not 100 */
    for (unsigned n = 99; n <= 100; n++) {
        open_head();
        char name[16];
        for (unsigned i = 0; i < n; i++) {
            snprintf(name, sizeof(name), "X-T%u", i);
            trailer(name, "1");
        }
        retry_req_end(req);
        cr_expect_eq(up.trailers[up.launches - 1]->count, n == 99 ? 99 : 0, "%u trailers", n);
        end_request();
    }
}
