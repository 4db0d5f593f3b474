/* The shared store's database failing under load (docs/delivery.md, "Shared store
 * (PostgreSQL)", the database failing): two real proxies on a PostgreSQL server of the test's
 * own, a steady load of durable accepts and synchronous requests on both, the server stopped for
 * a few seconds and started again. Accepts during the outage get 503 with Retry-After, every 202
 * before or after is delivered, no synchronous request fails, and /metrics says the store was
 * down (retryproxy_store_up 0) and the connection lost (retryproxy_store_disconnects_total). */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/pgserver.h"
#include "tests/support/proc.h"

#define T    20000 /* ms: upper bound for any single request */
#define MAXR 4000  /* durable requests the load sends at most */

static struct pgserver own;
static struct px *fleet[2];

static void setup(void)
{
    fx_upstreams(1);
    fx_config_dir("fleet-pg-outage");
}

static void teardown(void)
{
    for (size_t i = 0; i < 2; i++)
        if (fleet[i])
            px_stop(fleet[i], 20000);
    pgserver_stop(&own);
    fx_stop();
}

TestSuite(fleet_pg_outage, .init = setup, .fini = teardown, .timeout = 180);

/* What the load saw. */
static struct {
    atomic_bool stop;
    atomic_size_t n;   /* durable requests sent */
    long status[MAXR]; /* each one's answer */
    bool retry_after[MAXR];
    size_t sync_sent, sync_failed;
    long sync_bad; /* the first failed one's status */
} load;

static void post(struct px *p, const char *path, const char *rid, struct http_resp *r)
{
    char idh[64], url[128];
    snprintf(idh, sizeof(idh), "X-Request-Id: %s", rid);
    const char *h[2] = { idh, NULL };
    http_do("POST", px_url(p, path, url, sizeof(url)), h, "x", 1, T, r);
}

static void *durable_load(void *arg)
{
    (void)arg;
    while (!atomic_load(&load.stop) && load.n < MAXR) {
        size_t i = load.n;
        char rid[32];
        snprintf(rid, sizeof(rid), "out-%zu", i);
        struct http_resp r;
        post(fleet[i % 2], "/hook", rid, &r);
        load.status[i] = r.rc == 0 ? r.status : -1;
        load.retry_after[i] = r.rc == 0 && http_hdr(&r, "Retry-After") != NULL;
        http_free(&r);
        load.n = i + 1;
        sleep_ms(10);
    }
    return NULL;
}

static void *sync_load(void *arg)
{
    (void)arg;
    for (size_t i = 0; !atomic_load(&load.stop); i++) {
        struct http_resp r;
        post(fleet[i % 2], "/sync", "sync", &r);
        load.sync_sent++;
        if (r.rc != 0 || r.status != 200) {
            if (!load.sync_failed++)
                load.sync_bad = r.rc == 0 ? r.status : -1;
        }
        http_free(&r);
        sleep_ms(10);
    }
    return NULL;
}

static double metric_of(struct px *p, const char *series)
{
    char url[128];
    struct http_resp r;
    http_do("GET", px_admin_url(p, "/metrics", url, sizeof(url)), NULL, NULL, 0, T, &r);
    char *text = strndup((const char *)r.body, r.body_len);
    double v = r.rc == 0 && r.status == 200 ? metric_in(text, series) : NAN;
    free(text);
    http_free(&r);
    return v;
}

static bool all_delivered(void *arg)
{
    (void)arg;
    for (size_t i = 0; i < load.n; i++) {
        char rid[32];
        snprintf(rid, sizeof(rid), "out-%zu", i);
        if (load.status[i] == 202 && tup_count_id(up, rid) < 1)
            return false;
    }
    return true;
}

static bool store_up_again(void *arg)
{
    return metric_of(arg, "retryproxy_store_up") == 1;
}

Test(fleet_pg_outage, database_stopped_under_load_503s_then_every_202_delivered_sync_unaffected)
{
    cr_assert_eq(pgserver_start(&own), 0);
    /* short leases: an end whose write the outage lost is attempted again within seconds */
    setenv("RETRYPROXY_TEST_LEASE_MS", "3000", 1);
    for (size_t i = 0; i < 2; i++) {
        struct cfgb *b = cfgb_new();
        cfgb_top(b,
                 "\"store\": {\"postgres\": {\"url\": \"%s\", \"password_file\": \"%s\","
                 " \"namespace\": \"outage\"}}",
                 own.url, own.password_file);
        cfgb_route(b, "s", "\"match\": {\"path_prefix\": \"/sync\"}");
        cfgb_route(b, "r",
                   "\"delivery\": {\"mode\": \"durable\"}, \"retry\": {" CFG_FIXED(200) "}");
        char *json = cfgb_text(b);
        fleet[i] = px_start(json, "--workers", "2", NULL);
        free(json);
    }
    cr_expect_eq(metric_of(fleet[0], "retryproxy_store_up"), 1, "store_up before the outage");
    pthread_t th[2];
    pthread_create(&th[0], NULL, durable_load, NULL);
    pthread_create(&th[1], NULL, sync_load, NULL);
    sleep_ms(1500);
    size_t before = atomic_load(&load.n);
    cr_assert_eq(pgserver_halt(&own), 0);
    sleep_ms(1500);
    double up0 = metric_of(fleet[0], "retryproxy_store_up");
    double up1 = metric_of(fleet[1], "retryproxy_store_up");
    sleep_ms(1500);
    cr_assert_eq(pgserver_restart(&own), 0);
    bool back = fx_wait(store_up_again, fleet[0], 30000, 100) &&
                fx_wait(store_up_again, fleet[1], 30000, 100);
    sleep_ms(1500); /* accepts again after it came back */
    atomic_store(&load.stop, true);
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);

    cr_expect_eq(up0, 0, "retryproxy_store_up during the outage (proxy 0)");
    cr_expect_eq(up1, 0, "retryproxy_store_up during the outage (proxy 1)");
    cr_expect(back, "retryproxy_store_up not 1 within 30 s of the restart");
    for (size_t i = 0; i < 2; i++)
        cr_expect_geq(metric_of(fleet[i], "retryproxy_store_disconnects_total"), 1,
                      "proxy %zu counted no disconnect", i);
    size_t accepted = 0, refused = 0, after = 0;
    for (size_t i = 0; i < load.n; i++) {
        if (load.status[i] == 202) {
            accepted++;
            after += i > before;
            continue;
        }
        cr_expect_eq(load.status[i], 503, "durable request %zu: %ld", i, load.status[i]);
        cr_expect(load.retry_after[i], "durable request %zu: a 503 without Retry-After", i);
        refused++;
    }
    cr_log_info("%zu durable requests: %zu accepted, %zu refused during the outage; %zu sync",
                load.n, accepted, refused, load.sync_sent);
    cr_expect_gt(refused, 0, "no accept was refused while the database was down");
    cr_expect_gt(after, 0, "no accept after the outage");
    cr_expect_eq(load.sync_failed, 0, "%zu of %zu synchronous requests failed (first: %ld)",
                 load.sync_failed, load.sync_sent, load.sync_bad);
    cr_expect(fx_wait(all_delivered, NULL, 60000, 200), "a 202 not delivered within 60 s");
}
