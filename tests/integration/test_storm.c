/* Retry budgets under load (docs/budgets.md, docs/backoff.md scope route, docs/reload.md,
 * docs/metrics.md), end to end: the real binary against the test upstream on 127.0.0.1.
 *
 * The proxy counts a retry "in flight" from the decision to retry until that retry's attempt
 * ends, its backoff wait included; the top-level budget caps that count process-wide and a
 * route's budget caps it per route. The ratio budget allows, over a sliding window, at most
 * retry_ratio * first_attempts + min_retries_per_second * window_s retries. These tests drive
 * an always-failing upstream and check the caps from three sides: the retries_in_flight gauge,
 * what the upstream received, and what each client got back.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <curl/curl.h>
#include <jansson.h>

#include <arpa/inet.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/fixture.h"

#define T 20000 /* ms: upper bound for any single request in these tests */
/* The contract gives a reload one second to apply; room for a loaded machine and sanitizers. */
#define RELOAD_MS 3000

/* ---- suite set-up ---- */

static void setup(void)
{
    /* the metrics sampler and the call threads run libcurl beside the main thread */
    fx_init_curl();
    fx_upstreams(1);
    fx_config_dir("storm"); /* px->dir holds the proxy's output */
}

TestSuite(storm, .init = setup, .fini = fx_stop, .timeout = 90);

/* ---- config and admin ---- */

static void cfg_write(const char *text)
{
    cfg_write_renamed(fx_cfg_path, text);
}

/* Starts the proxy, two workers, on fx_cfg_path (so the test may rewrite it) holding a config
 * with 'top' members and route "r" to tup with 'route' members. */
static void start(const char *top, const char *route)
{
    char *text = cfg_r(top, route);
    cfg_write(text);
    free(text);
    const char *args[] = { "-c",          fx_cfg_path, "--listen", "127.0.0.1:0", "--admin",
                           "127.0.0.1:0", "--workers", "2",        NULL };
    fx_start_argv(args);
}

#define IN_FLIGHT      "retryproxy_retries_in_flight"
#define DENIED(reason) "retryproxy_retries_denied_total{route=\"r\",reason=\"" reason "\"}"

/* Waits until /config shows generation 'gen' with routes[0].timeout_ms == 'timeout_ms';
 * milliseconds waited, -1 after RELOAD_MS. */
static int64_t wait_generation(long gen, long timeout_ms)
{
    int64_t t0 = now_ms();
    for (;;) {
        json_t *c = fx_admin_get_json("/config");
        json_t *route = json_array_get(json_object_get(json_object_get(c, "config"), "routes"), 0);
        bool ok = json_integer_value(json_object_get(c, "generation")) >= gen &&
                  json_integer_value(json_object_get(route, "timeout_ms")) == timeout_ms;
        json_decref(c);
        if (ok)
            return now_ms() - t0;
        if (now_ms() - t0 > RELOAD_MS)
            return -1;
        sleep_ms(20);
    }
}

/* ---- requests ---- */

/* A blocking GET with request id 'id' and tup plan 'plan' (NULL: the default plan). */
static void get(const char *id, const char *plan, struct http_resp *r)
{
    char url[128], idh[96], planh[96];
    snprintf(idh, sizeof(idh), "X-Request-Id: %s", id);
    snprintf(planh, sizeof(planh), "X-Test-Plan: %s", plan ? plan : "");
    const char *h[] = { idh, plan ? planh : NULL, NULL };
    http_do("GET", px_url(px, "/x", url, sizeof(url)), h, NULL, 0, T, r);
    cr_assert_eq(r->rc, 0, "request %s: curl error %d", id, r->rc);
}

static int hdr_int(const struct http_resp *r, const char *name)
{
    const char *v = http_hdr(r, name);
    return v ? atoi(v) : -1;
}

/* ================================ 1. the storm ================================ */

#define STORM_CLIENTS  300
#define STORM_MS       3000
#define STORM_DELAY_MS 20 /* tup's service time: every attempt is held this long */
#define STORM_CAP      20
#define STORM_BOUND_MS 40000 /* everything, stragglers included, ends by then */

struct client {
    CURL *e;
    struct curl_slist *h;
    char stop[32]; /* X-Retry-Stop of the current response, "" if none */
};

struct storm_tally {
    long done, curl_errors, not_503, bad_stop;
    long stops[3]; /* max-attempts, concurrency, budget */
    char first_problem[256];
};

static const char *const storm_stops[3] = { "max-attempts", "concurrency", "budget" };

static size_t on_client_header(char *p, size_t size, size_t n, void *ud)
{
    struct client *c = ud;
    size_t len = size * n;
    static const char name[] = "X-Retry-Stop:";
    if (len > sizeof(name) - 1 && strncasecmp(p, name, sizeof(name) - 1) == 0) {
        const char *v = p + sizeof(name) - 1;
        size_t vl = len - (sizeof(name) - 1);
        while (vl && (*v == ' ' || *v == '\t'))
            v++, vl--;
        while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
            vl--;
        snprintf(c->stop, sizeof(c->stop), "%.*s", (int)vl, v);
    }
    return len;
}

/* Points client 'c' at a new request with a unique X-Request-Id and adds it to 'm'. */
static void client_next(CURLM *m, struct client *c, const char *url, long seq)
{
    char idh[64];
    snprintf(idh, sizeof(idh), "X-Request-Id: storm-%ld", seq);
    curl_slist_free_all(c->h);
    c->h = curl_slist_append(NULL, idh);
    c->stop[0] = '\0';
    curl_easy_setopt(c->e, CURLOPT_URL, url);
    curl_easy_setopt(c->e, CURLOPT_HTTPHEADER, c->h);
    curl_easy_setopt(c->e, CURLOPT_TIMEOUT_MS, (long)T);
    curl_easy_setopt(c->e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->e, CURLOPT_WRITEFUNCTION, http_discard);
    curl_easy_setopt(c->e, CURLOPT_HEADERFUNCTION, on_client_header);
    curl_easy_setopt(c->e, CURLOPT_HEADERDATA, c);
    curl_easy_setopt(c->e, CURLOPT_PRIVATE, c);
    curl_multi_add_handle(m, c->e);
}

static void tally_done(struct storm_tally *t, struct client *c, CURLcode rc)
{
    long code = 0;
    curl_easy_getinfo(c->e, CURLINFO_RESPONSE_CODE, &code);
    t->done++;
    int k = -1;
    for (int i = 0; i < 3; i++)
        if (strcmp(c->stop, storm_stops[i]) == 0)
            k = i;
    if (rc != CURLE_OK)
        t->curl_errors++;
    else if (code != 503)
        t->not_503++;
    else if (k < 0)
        t->bad_stop++;
    else
        t->stops[k]++;
    if ((rc != CURLE_OK || code != 503 || k < 0) && !t->first_problem[0])
        snprintf(t->first_problem, sizeof(t->first_problem),
                 "curl %d (%s), status %ld, X-Retry-Stop \"%s\"", (int)rc, curl_easy_strerror(rc),
                 code, c->stop);
}

/* Runs STORM_CLIENTS clients at once, each sending requests one after the other (each with a
 * new id) until STORM_MS have passed; waits for the last answers. */
static void run_storm(struct storm_tally *t)
{
    char url[128];
    px_url(px, "/storm", url, sizeof(url));
    CURLM *m = curl_multi_init();
    cr_assert_not_null(m);
    /* one connection per client, kept alive: 300 requests in flight at once, no more */
    curl_multi_setopt(m, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)STORM_CLIENTS);
    static struct client cl[STORM_CLIENTS];
    long seq = 0;
    for (size_t i = 0; i < STORM_CLIENTS; i++) {
        cl[i].e = curl_easy_init();
        cr_assert_not_null(cl[i].e);
        client_next(m, &cl[i], url, seq++);
    }
    int64_t t0 = now_ms(), end = t0 + STORM_MS;
    int running = STORM_CLIENTS;
    while (running > 0 && now_ms() < t0 + STORM_BOUND_MS) {
        curl_multi_perform(m, &running);
        void *priv;
        CURLcode rc;
        while (proc_multi_next_done(m, &priv, &rc)) {
            struct client *c = priv;
            tally_done(t, c, rc);
            curl_multi_remove_handle(m, c->e);
            if (now_ms() < end) {
                client_next(m, c, url, seq++);
                running++;
            }
        }
        if (running > 0)
            curl_multi_poll(m, NULL, 0, 20, NULL);
    }
    cr_log_info("storm: %ld requests from %d clients in %lld ms", t->done, STORM_CLIENTS,
                (long long)(now_ms() - t0));
    for (size_t i = 0; i < STORM_CLIENTS; i++) {
        curl_multi_remove_handle(m, cl[i].e);
        curl_easy_cleanup(cl[i].e);
        curl_slist_free_all(cl[i].h);
        cl[i].e = NULL;
        cl[i].h = NULL;
    }
    curl_multi_cleanup(m);
    cr_assert_eq(running, 0, "the storm's last requests were not answered within %d ms",
                 STORM_BOUND_MS);
}

struct sampler {
    pthread_t th;
    atomic_bool stop;
    double max;
    long samples, failures;
};

/* Samples retries_in_flight every 50 ms until told to stop. */
static void *sampler_main(void *arg)
{
    struct sampler *s = arg;
    while (!atomic_load(&s->stop)) {
        double v;
        if (fx_scrape_metric(IN_FLIGHT, &v) == 0 && !isnan(v)) {
            s->samples++;
            if (v > s->max)
                s->max = v;
        } else {
            s->failures++;
        }
        sleep_ms(50);
    }
    return NULL;
}

/* The most retries (X-Retry-Attempt >= 2) the upstream was serving at one instant. tup holds
 * every attempt for 'hold_ms' from the moment it has read it (arrival_ns) before answering,
 * and the proxy only ends a retry once it has that answer, so each retry's upstream interval
 * [arrival, arrival + hold) lies inside its proxy-side in-flight interval: the count here can
 * exceed the proxy's cap only if the proxy broke it. No tolerance is needed: tup's timers
 * never fire early (they fire when deadline <= now, on the same CLOCK_MONOTONIC). */
static size_t upstream_max_concurrent_retries(size_t *n_retries, int64_t hold_ms)
{
    size_t n = tup_count(up), k = 0;
    int64_t *start = calloc(n ? n : 1, sizeof(*start));
    int64_t *stop = calloc(n ? n : 1, sizeof(*stop));
    cr_assert(start && stop);
    for (size_t i = 0; i < n; i++) {
        const struct tup_req *q = tup_get(up, i);
        const char *a = tup_req_header(q, "X-Retry-Attempt");
        if (a && atoi(a) >= 2) {
            start[k] = q->arrival_ns;
            stop[k] = q->arrival_ns + hold_ms * 1000000;
            k++;
        }
    }
    qsort(start, k, sizeof(*start), fx_cmp_i64);
    qsort(stop, k, sizeof(*stop), fx_cmp_i64);
    /* sweep: at equal instants an interval ending counts before one starting (half-open) */
    size_t cur = 0, best = 0;
    for (size_t i = 0, j = 0; i < k;) {
        if (start[i] < stop[j]) {
            cur++;
            i++;
            if (cur > best)
                best = cur;
        } else {
            cur--;
            j++;
        }
    }
    free(start);
    free(stop);
    *n_retries = k;
    return best;
}

Test(storm, concurrency_cap_holds_under_hundreds_of_clients)
{
    char plan[64];
    snprintf(plan, sizeof(plan), "fail=1000000;status=503;delay=%d", STORM_DELAY_MS);
    tup_set_default_plan(up, plan);
    start("\"budget\": {\"max_concurrent_retries\": 20, \"retry_ratio\": 100, "
          "\"min_retries_per_second\": 100000}",
          "\"retry\": {\"max_attempts\": 5, \"backoff\": {\"policy\": \"fixed\", "
          "\"base_ms\": 50, \"jitter\": \"none\"}}, "
          "\"budget\": {\"max_concurrent_retries\": null, \"retry_ratio\": 100, "
          "\"min_retries_per_second\": 100000}");

    struct sampler s = { .max = 0 };
    atomic_init(&s.stop, false);
    cr_assert_eq(pthread_create(&s.th, NULL, sampler_main, &s), 0);
    struct storm_tally t = { 0 };
    run_storm(&t);
    atomic_store(&s.stop, true);
    pthread_join(s.th, NULL);

    size_t n_retries = 0;
    size_t up_max = upstream_max_concurrent_retries(&n_retries, STORM_DELAY_MS);
    double denied_conc = fx_metric(DENIED("concurrency"));
    double denied_budget = fx_metric(DENIED("budget"));
    cr_log_info("storm: retries_in_flight max %.0f over %ld samples (%ld failed scrapes); "
                "upstream: %zu attempts, %zu retries, at most %zu retries at once",
                s.max, s.samples, s.failures, tup_count(up), n_retries, up_max);
    cr_log_info("storm: stops max-attempts %ld, concurrency %ld, budget %ld; "
                "denied_total concurrency %.0f, budget %.0f",
                t.stops[0], t.stops[1], t.stops[2], denied_conc, denied_budget);

    cr_expect_gt(t.done, STORM_CLIENTS, "the storm sent only %ld requests", t.done);
    cr_expect_eq(t.curl_errors, 0, "%ld requests got no answer; first problem: %s", t.curl_errors,
                 t.first_problem);
    cr_expect_eq(t.not_503, 0, "%ld answers were not the upstream's 503; first problem: %s",
                 t.not_503, t.first_problem);
    cr_expect_eq(t.bad_stop, 0, "%ld 503s without an expected X-Retry-Stop; first problem: %s",
                 t.bad_stop, t.first_problem);
    cr_expect_gt(s.samples, 10, "only %ld samples of /metrics", s.samples);
    cr_expect_gt(s.max, 0, "retries_in_flight never above 0: the cap was not exercised");
    cr_expect_leq(s.max, STORM_CAP, "retries_in_flight reached %.0f, cap %d", s.max, STORM_CAP);
    cr_expect_gt(n_retries, 0, "the upstream saw no retry");
    cr_expect_leq(up_max, STORM_CAP, "the upstream served %zu retries at once, cap %d", up_max,
                  STORM_CAP);
    cr_expect_gt(denied_conc, 0, "no retry was denied for concurrency under the storm");
    cr_expect_eq(denied_conc, (double)t.stops[1],
                 "retries_denied_total{reason=concurrency} %.0f, clients saw %ld", denied_conc,
                 t.stops[1]);
    /* every slot is given back once the storm is over */
    double left = fx_wait_metric(IN_FLIGHT, 0, 2000);
    cr_expect_eq(left, 0, "retries_in_flight is %.0f after every request ended", left);
}

/* ================================ 2. the ratio ================================ */

#define RATIO_REQUESTS 300

/* Sends RATIO_REQUESTS requests one after the other to the always-failing upstream; returns
 * the upstream attempts per request. Every answer is the 503 with max-attempts or budget. */
static double run_ratio(const char *what)
{
    tup_set_default_plan(up, "fail=1000000;status=503");
    long stops[2] = { 0 }, other = 0;
    for (int i = 0; i < RATIO_REQUESTS; i++) {
        char id[32];
        snprintf(id, sizeof(id), "ratio-%d", i);
        struct http_resp r;
        get(id, NULL, &r);
        const char *s = http_hdr(&r, "X-Retry-Stop");
        if (r.status == 503 && s && strcmp(s, "max-attempts") == 0)
            stops[0]++;
        else if (r.status == 503 && s && strcmp(s, "budget") == 0)
            stops[1]++;
        else if (other++ == 0)
            cr_expect_fail("%s: request %d: status %ld, X-Retry-Stop %s", what, i, r.status,
                           s ? s : "(none)");
        http_free(&r);
    }
    size_t attempts = tup_count(up);
    double ratio = (double)attempts / RATIO_REQUESTS;
    double denied = fx_metric(DENIED("budget"));
    cr_log_info("ratio (%s): %d requests, %zu upstream attempts (%.3f per request); stops "
                "max-attempts %ld, budget %ld; denied_total budget %.0f",
                what, RATIO_REQUESTS, attempts, ratio, stops[0], stops[1], denied);
    cr_expect_eq(other, 0, "%s: %ld answers were not a 503 with max-attempts or budget", what,
                 other);
    /* retry_ratio 0.2, min 0: at most 0.2 retries per first attempt over the window */
    cr_expect_leq(attempts, (size_t)(RATIO_REQUESTS * 12 / 10),
                  "%s: %zu upstream attempts for %d requests, more than 1.2 per request", what,
                  attempts, RATIO_REQUESTS);
    /* and the budget is spent, not withheld: nearly 0.2 retries per request were made */
    cr_expect_geq(attempts, (size_t)(RATIO_REQUESTS * 115 / 100),
                  "%s: only %zu upstream attempts for %d requests: the budget was not used", what,
                  attempts, RATIO_REQUESTS);
    cr_expect_gt(denied, 0, "%s: no retry was denied for the budget", what);
    cr_expect_eq(denied, (double)stops[1], "%s: denied_total{reason=budget} %.0f, clients saw %ld",
                 what, denied, stops[1]);
    return ratio;
}

#define RATIO_RETRY "\"retry\": {\"max_attempts\": 3, " CFG_FIXED(1) "}"

Test(storm, process_wide_ratio_budget_bounds_retries)
{
    start("\"budget\": {\"max_concurrent_retries\": null, \"retry_ratio\": 0.2, "
          "\"min_retries_per_second\": 0, \"window_ms\": 60000}",
          RATIO_RETRY ", \"budget\": {\"retry_ratio\": 100, \"min_retries_per_second\": 100000}");
    run_ratio("top-level budget binds");
}

Test(storm, route_ratio_budget_bounds_retries)
{
    start("\"budget\": {\"max_concurrent_retries\": null, \"retry_ratio\": 100, "
          "\"min_retries_per_second\": 100000}",
          RATIO_RETRY ", \"budget\": {\"retry_ratio\": 0.2, \"min_retries_per_second\": 0, "
                      "\"window_ms\": 60000}");
    run_ratio("route budget binds");
}

/* ======================= 3, 4. the route's concurrency cap ======================= */

#define SLOT_WAIT_MS 1500
#define SLOT_ROUTE(timeout)                                                                        \
    "\"timeout_ms\": " #timeout ", \"retry\": {\"max_attempts\": 2, \"backoff\": "                 \
    "{\"policy\": \"fixed\", \"base_ms\": 1500, \"jitter\": \"none\"}}, "                          \
    "\"budget\": {\"max_concurrent_retries\": 1}"

/* Starts request A (fails once, then waits SLOT_WAIT_MS in backoff holding the route's one
 * slot) and waits until its retry is in flight. */
static void start_slot_holder(struct http_call *a)
{
    http_call_start(a, fx_url("/x"), "slot-a", "fail=1;status=503");
    fx_wait_upstream("slot-a", 1);
    double v = fx_wait_metric(IN_FLIGHT, 1, 2000);
    cr_assert_eq(v, 1, "request A's retry is not in flight (retries_in_flight %.0f)", v);
}

/* Request B fails once while A holds the slot: answered at once, its own 503, concurrency. */
static void expect_denied_for_concurrency(const char *id)
{
    struct http_resp r;
    get(id, "fail=1;status=503", &r);
    cr_log_info("%s: %ld in %.3f s, X-Retry-Stop %s", id, r.status, r.seconds,
                http_hdr(&r, "X-Retry-Stop") ? http_hdr(&r, "X-Retry-Stop") : "(none)");
    cr_expect_eq(r.status, 503, "%s: status %ld", id, r.status);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Stop") ? http_hdr(&r, "X-Retry-Stop") : "(none)",
                     "concurrency", "%s was not denied for concurrency", id);
    cr_expect_eq(hdr_int(&r, "X-Retry-Attempts"), 1);
    cr_expect_eq(hdr_int(&r, "X-Tup-Attempt"), 1, "%s: not its own first 503", id);
    cr_expect_lt(r.seconds, 0.5, "%s answered after %.3f s, not at once", id, r.seconds);
    cr_expect_eq(tup_count_id(up, id), 1, "%s reached the upstream %zu times", id,
                 tup_count_id(up, id));
    http_free(&r);
}

/* A ends after its wait with the 200 of its second attempt. */
static void expect_slot_holder_succeeds(struct http_call *a)
{
    http_call_join(a);
    double took = (double)(a->t_end - a->t_start) / 1000.0;
    cr_log_info("slot-a: %ld after %.3f s", a->r.status, took);
    cr_expect_eq(a->r.rc, 0, "request A: curl error %d", a->r.rc);
    cr_expect_eq(a->r.status, 200, "request A: status %ld", a->r.status);
    cr_expect_eq(hdr_int(&a->r, "X-Retry-Attempts"), 2);
    cr_expect_geq(took, SLOT_WAIT_MS / 1000.0 - 0.01, "request A did not wait its backoff");
    cr_expect_eq(tup_count_id(up, "slot-a"), 2);
}

Test(storm, route_concurrency_cap_denies_a_second_retry_at_once)
{
    start("", SLOT_ROUTE(15000));
    start_slot_holder(&fx_calls[0]);
    expect_denied_for_concurrency("slot-b");
    cr_expect_eq(fx_metric(DENIED("concurrency")), 1);
    expect_slot_holder_succeeds(&fx_calls[0]);
    cr_expect_eq(fx_wait_metric(IN_FLIGHT, 0, 2000), 0, "the slot was not given back");
}

Test(storm, route_concurrency_slot_survives_a_reload)
{
    start("", SLOT_ROUTE(15000));
    start_slot_holder(&fx_calls[0]);

    /* an unrelated change: the route keeps its name, so its budget state must stay */
    char *text = cfg_r("", SLOT_ROUTE(16000));
    int64_t t0 = now_ms();
    cfg_write(text);
    free(text);
    int64_t lat = wait_generation(2, 16000);
    cr_assert_geq(lat, 0, "the reload was not applied within %d ms", RELOAD_MS);
    cr_log_info("reload applied after %lld ms", (long long)lat);
    cr_assert_lt(now_ms() - t0, SLOT_WAIT_MS - 300,
                 "the reload took too long: A's wait may be over, the check would be void");
    cr_assert_eq(tup_count_id(up, "slot-a"), 1, "A's wait ended before the check");

    expect_denied_for_concurrency("slot-b");
    expect_slot_holder_succeeds(&fx_calls[0]);

    /* the slot is free again under the new generation: C retries and succeeds */
    struct http_resp r;
    get("slot-c", "fail=1;status=503", &r);
    cr_expect_eq(r.status, 200, "request C: status %ld, X-Retry-Stop %s", r.status,
                 http_hdr(&r, "X-Retry-Stop") ? http_hdr(&r, "X-Retry-Stop") : "(none)");
    cr_expect_eq(hdr_int(&r, "X-Retry-Attempts"), 2);
    cr_expect_eq(tup_count_id(up, "slot-c"), 2);
    http_free(&r);
    cr_expect_eq(fx_metric(DENIED("concurrency")), 1);
}

/* ========================== 5. route-scoped backoff ========================== */

/* The request log line for 'id', parsed (the caller decrefs), or NULL if none came within
 * 3 s (logs are flushed once per event-loop turn). */
static json_t *request_line(const char *id)
{
    int64_t deadline = now_ms() + 3000;
    for (;;) {
        char *text = px_stdout(px);
        json_t *found = NULL;
        for (char *line = text, *next; line && *line && !found; line = next) {
            next = strchr(line, '\n');
            if (!next)
                break; /* a partial last line */
            *next++ = '\0';
            json_t *j = json_loads(line, 0, NULL);
            const char *rid = json_string_value(json_object_get(j, "request_id"));
            const char *msg = json_string_value(json_object_get(j, "msg"));
            if (rid && msg && strcmp(msg, "request") == 0 && strcmp(rid, id) == 0)
                found = j;
            else
                json_decref(j);
        }
        free(text);
        if (found || now_ms() > deadline)
            return found;
        sleep_ms(20);
    }
}

/* delays_ms of the request log line for 'id': the number of delays, up to 'cap', or -1 if no
 * line came. */
static int logged_delays(const char *id, long *out, int cap)
{
    json_t *j = request_line(id);
    json_t *d = json_object_get(j, "delays_ms");
    int n = -1;
    if (json_is_array(d)) {
        n = 0;
        for (size_t i = 0; i < json_array_size(d) && n < cap; i++)
            out[n++] = (long)json_integer_value(json_array_get(d, i));
    }
    json_decref(j);
    return n;
}

/* One request that fails once then succeeds; checks that it waited 'want' ms, as logged and
 * as seen at the upstream (the gap between its two attempts). */
static void expect_wait(const char *id, long want)
{
    struct http_resp r;
    get(id, "fail=1;status=503", &r);
    cr_expect_eq(r.status, 200, "%s: status %ld", id, r.status);
    cr_expect_eq(hdr_int(&r, "X-Retry-Attempts"), 2, "%s", id);
    http_free(&r);
    long d[4];
    int n = logged_delays(id, d, 4);
    cr_assert_eq(n, 1, "%s: %d delays logged, want 1", id, n);
    const struct tup_req *q[2] = { NULL, NULL };
    for (size_t i = 0, k = 0; i < tup_count(up) && k < 2; i++)
        if (strcmp(tup_get(up, i)->request_id, id) == 0)
            q[k++] = tup_get(up, i);
    cr_assert(q[0] && q[1], "%s: the upstream did not see two attempts", id);
    double gap = (double)(q[1]->arrival_ns - q[0]->arrival_ns) / 1e6;
    cr_log_info("%s: delays_ms [%ld], upstream gap %.1f ms, want %ld", id, d[0], gap, want);
    cr_expect_eq(d[0], want, "%s waited %ld ms, want %ld", id, d[0], want);
    /* the wait starts after the first answer arrived, so the gap is at least the delay; the
     * upstream stamps an arrival when its thread reads it, which on a loaded machine (ASan, a
     * parallel build) can lag the real arrival by some milliseconds */
    cr_expect(gap >= (double)want - 15 && gap < (double)want + 300,
              "%s: upstream gap %.1f ms, want %ld", id, gap, want);
}

#define ROUTE_SCOPE(timeout, reset)                                                                \
    "\"timeout_ms\": " #timeout ", \"retry\": {\"backoff\": {\"policy\": \"exponential\", "        \
    "\"base_ms\": 100, \"factor\": 2, \"jitter\": \"none\", \"scope\": \"route\", "                \
    "\"reset_after_ms\": " #reset "}}"

Test(storm, route_scoped_backoff_is_one_sequence_that_survives_a_reload)
{
    start("", ROUTE_SCOPE(15000, 60000));
    expect_wait("seq-1", 100);
    expect_wait("seq-2", 200);
    expect_wait("seq-3", 400);

    char *text = cfg_r("", ROUTE_SCOPE(16000, 60000));
    cfg_write(text);
    free(text);
    int64_t lat = wait_generation(2, 16000);
    cr_assert_geq(lat, 0, "the reload was not applied within %d ms", RELOAD_MS);
    expect_wait("seq-4", 800);
}

/* The route's sequence advances for retries that are taken, not for ones the policy then
 * refuses: a POST whose 503 is not retried (the method is not retryable) leaves it where it
 * was, so the next retry waits the next delay of the sequence, not the one after. */
Test(storm, a_refused_retry_does_not_move_the_route_sequence)
{
    start("", ROUTE_SCOPE(15000, 60000));
    expect_wait("moved-1", 100);
    char url[128];
    const char *h[] = { "X-Request-Id: moved-post", "X-Test-Plan: fail=1;status=503", NULL };
    struct http_resp r;
    http_do("POST", px_url(px, "/x", url, sizeof(url)), h, "body", 4, T, &r);
    cr_assert_eq(r.rc, 0);
    cr_expect_eq(r.status, 503);
    cr_expect_str_eq(http_hdr(&r, "X-Retry-Stop"), "not-retryable");
    http_free(&r);
    expect_wait("moved-2", 200);
}

Test(storm, route_scoped_backoff_restarts_after_reset_after_ms)
{
    start("", ROUTE_SCOPE(15000, 300));
    expect_wait("reset-1", 100);
    /* the next retry comes well within 300 ms of the last one: the sequence goes on */
    expect_wait("reset-2", 200);
    sleep_ms(400);
    expect_wait("reset-3", 100);
}

/* ==================== 6. a client that gives up during a wait ==================== */

#define FIXED_WAIT(ms) "\"retry\": {\"max_attempts\": 3, " CFG_FIXED(ms) "}"

/* The request status and stop reason of the log line for 'id' (waits for it). */
static bool logged_outcome(const char *id, long *status, char *stop, size_t cap)
{
    json_t *j = request_line(id);
    if (!j)
        return false;
    *status = (long)json_integer_value(json_object_get(j, "status"));
    const char *s = json_string_value(json_object_get(j, "stop"));
    snprintf(stop, cap, "%s", s ? s : "");
    json_decref(j);
    return true;
}

/* Sends a GET with X-Request-Id 'id' that always fails on a raw connection and waits until
 * the upstream has its first attempt; returns the connection. */
static int send_and_wait_first_attempt(const char *id)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(px->port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    char req[256];
    int n = snprintf(req, sizeof(req),
                     "GET /x HTTP/1.1\r\nHost: t\r\nX-Request-Id: %s\r\n"
                     "X-Test-Plan: fail=5;status=503\r\n\r\n",
                     id);
    cr_assert_eq(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    fx_wait_upstream(id, 1);
    return fd;
}

/* While a request waits out a backoff its connection is the proxy's to watch: a client that
 * closes it ends the retrying there (no further attempt reaches the upstream, the retry slot
 * is given back), counted as 499 like nginx's "client closed request". A client that stays
 * gets every attempt. */
Test(storm, client_closing_during_a_backoff_wait_ends_the_retrying)
{
    start("", FIXED_WAIT(600));

    struct http_resp r;
    get("stay", "fail=5;status=503", &r);
    cr_expect_eq(r.status, 503);
    cr_expect_eq(hdr_int(&r, "X-Retry-Attempts"), 3);
    http_free(&r);
    cr_expect_eq(tup_count_id(up, "stay"), 3);

    int fd = send_and_wait_first_attempt("gone");
    cr_expect_eq(fx_wait_metric(IN_FLIGHT, 1, 2000), 1, "the wait holds a retry slot");
    int64_t t0 = now_ms();
    close(fd); /* the client gives up 0.6 s before the second attempt */

    cr_expect_eq(fx_wait_metric(IN_FLIGHT, 0, 2000), 0, "the slot was not given back");
    cr_expect_eq(fx_wait_metric("retryproxy_requests_total{route=\"r\",code=\"499\"}", 1, 2000), 1);
    cr_log_info("client gone: retry slot back after %lld ms", (long long)(now_ms() - t0));
    sleep_ms(1500); /* past both waits the request would have taken */
    cr_expect_eq(tup_count_id(up, "gone"), 1, "the upstream saw %zu attempts after the client left",
                 tup_count_id(up, "gone"));

    long status = 0;
    char stop[32] = "";
    cr_assert(logged_outcome("gone", &status, stop, sizeof(stop)), "no log line for the request");
    cr_expect_eq(status, 499);
    cr_expect_str_eq(stop, "client-closed");

    /* A reset instead of a close ends it the same way. */
    fd = send_and_wait_first_attempt("reset");
    struct linger lg = { .l_onoff = 1, .l_linger = 0 };
    cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    close(fd); /* RST */
    cr_expect_eq(fx_wait_metric("retryproxy_requests_total{route=\"r\",code=\"499\"}", 2, 2000), 2);
    sleep_ms(1500);
    cr_expect_eq(tup_count_id(up, "reset"), 1, "the upstream saw %zu attempts after the reset",
                 tup_count_id(up, "reset"));
    cr_expect_eq(fx_metric(IN_FLIGHT), 0);
}
