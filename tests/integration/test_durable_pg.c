/* Durable routes on the shared PostgreSQL store (docs/delivery.md, "Shared store
 * (PostgreSQL)"): the real binary, a private server of the run's (tests/support/pgserver.h),
 * the test upstream. An accept is answered 202 once its row is committed (the test reads it
 * from the database right after), delivered, and a dead letter is listed by the CLI from the
 * same database; with the database stopped, durable accepts answer 503 with Retry-After while
 * a synchronous route goes on, and come back once it is started again. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/pgserver.h"
#include "tests/support/pgserver_hooks.h"
#include "tests/support/proc.h"

#define T 20000 /* ms: upper bound for any single request */

static struct pgserver pg;
static char ns[48];

static void setup(void)
{
    fx_upstreams(1);
    fx_config_dir("durable-pg");
    cr_assert_eq(pgserver_env(&pg), 0, "the runner started no PostgreSQL server");
    snprintf(ns, sizeof(ns), "it-%ld", (long)getpid());
}

TestSuite(durable_pg, .init = setup, .fini = fx_stop, .timeout = 120);

/* The proxy on 'server', route "s" synchronous on /sync, route "r" durable (two attempts 300 ms
 * apart) on the rest. */
static void start(const struct pgserver *server)
{
    struct cfgb *b = cfgb_new();
    cfgb_top(b,
             "\"store\": {\"postgres\": {\"url\": \"%s\", \"password_file\": \"%s\","
             " \"namespace\": \"%s\"}}",
             server->url, server->password_file, ns);
    cfgb_route(b, "s", "\"match\": {\"path_prefix\": \"/sync\"}");
    cfgb_route(b, "r",
               "\"delivery\": {\"mode\": \"durable\"}, \"retry\": {\"max_attempts\": 2, " CFG_FIXED(
                   300) "}");
    char *json = cfgb_text(b);
    FILE *f = fopen(fx_cfg_path, "w"); /* the CLI's, the same */
    cr_assert_not_null(f);
    fputs(json, f);
    fclose(f);
    fx_start(json, "--workers", "2", NULL);
    free(json);
}

static void post(const char *path, const char *rid, const char *plan, struct http_resp *out)
{
    char idh[128];
    snprintf(idh, sizeof(idh), "X-Request-Id: %s", rid);
    const char *h[3] = { idh, plan, NULL };
    http_do("POST", fx_url(path), h, "x", 1, T, out);
    cr_assert_eq(out->rc, 0, "the transfer failed");
}

/* The delivery id of a 202 into id[33]. */
static void post_accepted(const char *rid, const char *plan, char *id)
{
    struct http_resp r;
    post("/hook", rid, plan, &r);
    cr_assert_eq(r.status, 202, "status %ld: %.*s", r.status, (int)r.body_len,
                 (const char *)r.body);
    snprintf(id, 33, "%s", http_hdr(&r, "X-Delivery-Id"));
    http_free(&r);
}

/* Rows of the test's namespace with id 'id' in the database of 'server'. */
static long rows_with(const struct pgserver *server, const char *id)
{
    char info[256];
    snprintf(info, sizeof(info), "%s?password=%s", server->url, PGSERVER_PASSWORD);
    PGconn *c = PQconnectdb(info);
    cr_assert_eq(PQstatus(c), CONNECTION_OK, "%s", PQerrorMessage(c));
    const char *v[2] = { ns, id };
    PGresult *res = PQexecParams(
        c, "SELECT count(*) FROM retryproxy_deliveries WHERE namespace = $1 AND id = $2", 2, NULL,
        v, NULL, NULL, 0);
    cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQerrorMessage(c));
    long n = atol(PQgetvalue(res, 0, 0));
    PQclear(res);
    PQfinish(c);
    return n;
}

/* `retryproxy deliveries list -c CONFIG --state dead --json`: its total, -1 when it failed. */
static long cli_dead(void)
{
    char *argv[] = { (char *)proc_bin(), "deliveries", "list",   "-c", fx_cfg_path,
                     "--state",          "dead",       "--json", NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 60000, &r), 0);
    json_t *j = r.status == 0 ? json_loads(r.out, 0, NULL) : NULL;
    long n = j ? (long)json_integer_value(json_object_get(j, "total")) : -1;
    if (!j)
        cr_log_warn("deliveries list: exit %d: %s", r.status, r.err);
    json_decref(j);
    proc_result_free(&r);
    return n;
}

static bool one_dead(void *arg)
{
    (void)arg;
    return cli_dead() == 1;
}

static bool delivered(void *arg)
{
    return tup_count_id(up, arg) >= 1;
}

Test(durable_pg, accepted_after_commit_delivered_and_dead_letters_listed_by_the_cli)
{
    start(&pg);
    char id[33];
    post_accepted("pg-ok", NULL, id);
    cr_expect_eq(rows_with(&pg, id), 1, "the 202 came before its row was committed");
    cr_assert(fx_wait(delivered, "pg-ok", 10000, 50), "not delivered within 10 s");

    char dead[33];
    post_accepted("pg-dead", "X-Test-Plan: fail=100; status=503", dead);
    cr_assert(fx_wait(one_dead, NULL, 20000, 200), "no dead letter listed within 20 s");
    cr_expect_eq(tup_count_id(up, "pg-dead"), 2, "max_attempts 2");

    char *argv[] = { (char *)proc_bin(), "deliveries", "show", dead, "-c",
                     fx_cfg_path,        "--json",     NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 60000, &r), 0);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_expect_not_null(strstr(r.out, "\"dead\""), "%s", r.out);
    proc_result_free(&r);
    /* the admin API reads the same namespace */
    json_t *j = fx_admin_get_json("/deliveries?state=dead");
    cr_expect_eq(json_integer_value(json_object_get(j, "total")), 1);
    json_decref(j);
}

static bool accepted_again(void *arg)
{
    (void)arg;
    struct http_resp r;
    post("/hook", "pg-after", NULL, &r);
    bool ok = r.status == 202;
    http_free(&r);
    return ok;
}

/* A server of the test's own: stopping the run's would fail the other tests meanwhile. */
Test(durable_pg, database_down_accepts_get_503_with_retry_after_and_sync_routes_go_on)
{
    struct pgserver own;
    cr_assert_eq(pgserver_start(&own), 0);
    start(&own);
    char id[33];
    post_accepted("pg-before", NULL, id);
    cr_assert_eq(pgserver_halt(&own), 0);
    for (int i = 0; i < 3; i++) { /* the first may meet the loss itself */
        struct http_resp r;
        char rid[32];
        snprintf(rid, sizeof(rid), "pg-down-%d", i);
        post("/hook", rid, NULL, &r);
        cr_expect_eq(r.status, 503, "status %ld: %.*s", r.status, (int)r.body_len,
                     (const char *)r.body);
        cr_expect_not_null(http_hdr(&r, "Retry-After"), "a 503 without Retry-After");
        http_free(&r);
        post("/sync", "pg-sync", NULL, &r);
        cr_expect_eq(r.status, 200, "a synchronous route during the outage: %ld", r.status);
        http_free(&r);
    }
    cr_assert_eq(pgserver_restart(&own), 0);
    cr_expect(fx_wait(accepted_again, NULL, 30000, 200), "no 202 within 30 s of the restart");
    cr_expect(fx_wait(delivered, "pg-after", 10000, 50), "not delivered after the restart");
    pgserver_stop(&own);
}

/* retryproxy store migrate ARGS: its result. */
static struct proc_result migrate(const char *cfg)
{
    char *argv[] = { (char *)proc_bin(), "store", "migrate", "-c", (char *)cfg, NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 60000, &r), 0);
    return r;
}

Test(durable_pg, store_migrate_makes_the_schema_once_and_says_so)
{
    struct pgserver own;
    cr_assert_eq(pgserver_start(&own), 0);
    char cfg[200];
    snprintf(cfg, sizeof(cfg), "%s.own.json", fx_cfg_path);
    FILE *f = fopen(cfg, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "{\"store\": {\"postgres\": {\"url\": \"%s\", \"password_file\": \"%s\"}},"
            " \"routes\": [{\"name\": \"r\", \"upstreams\": [\"http://127.0.0.1:9\"],"
            " \"delivery\": {\"mode\": \"durable\"}}]}",
            own.url, own.password_file);
    fclose(f);
    struct proc_result r = migrate(cfg);
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect_str_eq(r.out, "schema version 0 -> 1\n");
    proc_result_free(&r);
    r = migrate(cfg);
    cr_expect_str_eq(r.out, "schema version 1: up to date\n");
    proc_result_free(&r);
    /* a file store has nothing to migrate here: said, exit 1 */
    f = fopen(cfg, "w");
    fputs("{\"store\": {\"path\": \"/tmp/x.db\"}, \"routes\": [{\"name\": \"r\","
          " \"upstreams\": [\"http://127.0.0.1:9\"]}]}",
          f);
    fclose(f);
    r = migrate(cfg);
    cr_expect_eq(r.status, 1);
    cr_expect_not_null(strstr(r.err, "store migrate is for the shared store"), "%s", r.err);
    proc_result_free(&r);
    pgserver_stop(&own);
}
