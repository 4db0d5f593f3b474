/* The fakes around the request state machine (retryfake.h). */
#include "tests/support/faked/retryfake.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/upstream/attempt.h"
#include "proxy/http/grpc.h"
#include "proxy/telemetry/log.h"
#include "proxy/core/retry.h"
#include "proxy/core/worker.h"
#include "proxy/dns/resolve.h"
#include "tests/support/promtext.h"

/* ---- the fakes ---- */

struct fake_up up;

struct fake_client client;

uint64_t now_ms;

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
                   const struct attempt_req *areq, uint64_t connect_timeout_ms)
{
    (void)url;
    (void)to;
    (void)base_path;
    (void)connect_timeout_ms;
    cr_assert(up.launches < LAUNCHES);
    up.launched[up.launches] = a;
    up.fields[up.launches] = areq->fields;
    cr_assert_gt(areq->n_own, 0);
    snprintf(up.first[up.launches], sizeof(up.first[0]), "%.*s: %.*s", (int)areq->own[0].name_len,
             areq->own[0].name, (int)areq->own[0].value_len, areq->own[0].value);
    up.trailers[up.launches] = areq->trailers;
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

void answered(struct front *f, unsigned status, const char *code, const struct answer_tag *tag)
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

const struct front_ops fake_ops = { .fields = fake_fields,
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

struct proxy px;
struct worker w;
struct cfg *cfg;
struct retry_req *req;

static void no_kick(void *arg)
{
    (void)arg;
}

/* A worker on a config with one route "r" whose fields are 'route_json' (after name and
 * upstreams), the clock at 1,000,000 ms. The upstreams are addresses: the snapshot resolves a
 * route's upstream names for its tunnels (docs/upgrades.md), and nothing here connects; each is
 * one endpoint (an IP literal is never looked up), whose requests in flight in_flight() reads. */
void start(const char *route_json)
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
void open_request(const char *method)
{
    client.f = retry_req_new(&w, &fake_ops, sizeof(struct front), FRONT_HTTP1, "/x", "127.0.0.1",
                             40000, REFUSE_NONE);
    cr_assert_not_null(client.f);
    req = client.f->req;
    retry_req_head(req, method);
    retry_req_end(req);
}

/* A GET without a body. */
void get(void)
{
    open_request("GET");
}

/* libmicrohttpd is done with the connection: every timer of the request must be gone. */
void end_request(void)
{
    retry_req_completed(req);
    req = NULL;
    cr_assert_eq(loop_timer_count(w.loop), 0, "a timer outlived its request");
}

/* (Criterion 2.4 does not count a failed assertion here: checks belong in the tests.) */
void finish(void)
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
void at(uint64_t ms)
{
    now_ms = 1000000 + ms;
    loop_turn(w.loop, 0);
}

uint64_t since_start(uint64_t t)
{
    return t - 1000000;
}

/* Launch 'k' ends: without a response ('sent': the request went out), or with a response head
 * (then its body, complete). */
void launch_fails(unsigned k, bool sent)
{
    cr_assert(k < up.launches && up.running[k], "launch %u is not running", k);
    struct attempt *a = up.launched[k];
    a->sent = sent;
    up.running[k] = false;
    a->ops->done(a, ATTEMPT_BROKEN);
}

void launch_answers(unsigned k, int status, const char *retry_after)
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
void attempt_fails(bool sent)
{
    cr_assert(up.launches > 0);
    launch_fails(up.launches - 1, sent);
}

void attempt_answers(int status, const char *retry_after)
{
    cr_assert(up.launches > 0);
    launch_answers(up.launches - 1, status, retry_after);
}

/* ---- hedging (retry.hedge_on_per_try_timeout) ---- */

/* A route that hedges after 100 ms, its backoff 'wait_ms', at most 'attempts' attempts, the
 * whole request 1 s, and 'more' route fields. */
void start_hedging(unsigned wait_ms, unsigned attempts, const char *more)
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
double metric(const char *series)
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
void launch_head(unsigned k, int status)
{
    cr_assert(k < up.launches && up.running[k], "launch %u is not running", k);
    struct attempt *a = up.launched[k];
    a->sent = true;
    a->status = status;
    a->ops->head(a);
}

void launch_body_ends(unsigned k)
{
    cr_assert(k < up.launches && up.running[k], "launch %u is not running", k);
    struct attempt *a = up.launched[k];
    cr_assert_eq(a->ops->body(a, "busy", 4), 4);
    up.running[k] = false;
    a->ops->done(a, ATTEMPT_COMPLETE);
}

bool running(unsigned k)
{
    return k < up.launches && up.running[k];
}

/* The attempts running now (the fake never queues one for a slot). */
int64_t launches_running(void)
{
    int64_t n = 0;
    for (unsigned i = 0; i < up.launches; i++)
        n += up.running[i];
    return n;
}

/* Attempts in flight on the route's endpoints, as /upstreams and least_request see them. */
int64_t in_flight(void)
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
void hedged(unsigned wait_ms, unsigned attempts)
{
    start_hedging(wait_ms, attempts, "");
    get();
    at(100);
    at(100 + wait_ms);
    cr_assert(running(0) && running(1), "two attempts should run at once");
}
