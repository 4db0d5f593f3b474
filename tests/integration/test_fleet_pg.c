/* A fleet on one PostgreSQL store (docs/delivery.md, "Shared store (PostgreSQL)"): two and three
 * real proxies on one database and namespace, the test upstream recording each attempt's
 * delivery id (webhook-id) and arrival. What one accepts any delivers; no delivery is attempted
 * by two at once (for one id, no attempt starts before the one before it ended); a lease is
 * renewed while a long attempt runs; SIGTERM gives leases back within the drain; a proxy killed
 * with SIGKILL mid-attempt leaves deliveries the others take once their leases end; the dead
 * letters of several proxies are listed and replayed by one CLI call. Leases are shortened for
 * the test by RETRYPROXY_TEST_LEASE_MS (proxy/ops/deliveries.c). */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/pgserver.h"
#include "tests/support/pgserver_hooks.h"
#include "tests/support/proc.h"

#define T 20000 /* ms: upper bound for any single request */

static struct pgserver pg;
static char ns[48];
static struct px *fleet[3];

static void setup(void)
{
    fx_upstreams(1);
    fx_config_dir("fleet-pg");
    cr_assert_eq(pgserver_env(&pg), 0, "the runner started no PostgreSQL server");
    snprintf(ns, sizeof(ns), "fleet-%ld", (long)getpid());
}

static void teardown(void)
{
    for (size_t i = 0; i < 3; i++)
        if (fleet[i])
            px_stop(fleet[i], 20000);
    fx_stop();
}

TestSuite(fleet_pg, .init = setup, .fini = teardown, .timeout = 180);

/* Proxy i of the fleet on the run's server and the test's namespace: route "r" durable, with
 * 'route' members added, and 'top' members. */
static struct px *start_px(size_t i, const char *top, const char *route)
{
    struct cfgb *b = cfgb_new();
    cfgb_top(b,
             "\"store\": {\"postgres\": {\"url\": \"%s\", \"password_file\": \"%s\","
             " \"namespace\": \"%s\"}}",
             pg.url, pg.password_file, ns);
    cfgb_top(b, "%s", top);
    cfgb_route(b, "r",
               "\"delivery\": {\"mode\": \"durable\", \"max_in_flight\": 8},"
               " \"retry\": {" CFG_FIXED(200) "}%s%s",
               route[0] ? ", " : "", route);
    char *json = cfgb_text(b);
    fleet[i] = px_start(json, "--workers", "2", NULL);
    free(json);
    return fleet[i];
}

/* A durable accept of request 'rid' by proxy p: its delivery id into id[33]. */
static void accept_on(struct px *p, const char *rid, const char *plan, char *id)
{
    char idh[128], url[128];
    snprintf(idh, sizeof(idh), "X-Request-Id: %s", rid);
    const char *h[3] = { idh, plan, NULL };
    struct http_resp r;
    http_do("POST", px_url(p, "/hook", url, sizeof(url)), h, "x", 1, T, &r);
    cr_assert_eq(r.rc, 0, "the transfer failed");
    cr_assert_eq(r.status, 202, "status %ld: %.*s", r.status, (int)r.body_len,
                 (const char *)r.body);
    snprintf(id, 33, "%s", http_hdr(&r, "X-Delivery-Id"));
    http_free(&r);
}

/* The row's column 'col' (a trusted name) of delivery 'id' in the namespace; malloc'd or NULL. */
static char *column(const char *col, const char *id)
{
    char sql[200];
    snprintf(sql, sizeof(sql),
             "SELECT %s::text FROM retryproxy_deliveries WHERE namespace = $2 AND id = $1", col);
    return pgserver_query(&pg, sql, id, ns);
}

static bool is_delivered(const char *id)
{
    char *st = column("state", id);
    bool ok = st && strcmp(st, "2") == 0;
    free(st);
    return ok;
}

struct ids {
    char (*id)[33];
    size_t n;
};

static bool all_delivered(void *arg)
{
    const struct ids *s = arg;
    for (size_t i = 0; i < s->n; i++)
        if (!is_delivered(s->id[i]))
            return false;
    return true;
}

static bool attempted(void *arg)
{
    return tup_count_id(up, arg) >= 1;
}

/* The arrivals (ms, monotonic) of the attempts of delivery 'id' at the upstream, in order;
 * how many (at most 'cap'). */
static size_t arrivals(const char *id, int64_t *at, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < tup_count(up) && n < cap; i++) {
        const struct tup_req *q = tup_get(up, i);
        const char *w = tup_req_header(q, "webhook-id");
        if (w && strcmp(w, id) == 0)
            at[n++] = q->arrival_ns / 1000000;
    }
    return n;
}

/* No attempt of one delivery began before the one before it ended: an attempt lasts 'took' ms
 * (the upstream's delay), or ends at 'killed' (ms, 0: none), its proxy gone. */
static void no_overlap(const struct ids *s, int64_t took, int64_t killed)
{
    for (size_t i = 0; i < s->n; i++) {
        int64_t at[16];
        size_t n = arrivals(s->id[i], at, 16);
        for (size_t k = 1; k < n; k++) {
            int64_t end = at[k - 1] + took;
            if (killed && killed >= at[k - 1] && killed < end)
                end = killed;
            cr_expect_geq(at[k], end,
                          "delivery %s: attempt %zu began %lld ms before the one"
                          " before it ended",
                          s->id[i], k + 1, (long long)(end - at[k]));
        }
    }
}

/* The lease's owner names the host, the pid, the start and random bits: two pods whose proxies
 * are PID 1 never share one. One proxy after the other (either may claim what the other
 * accepted): the owner of each one's claim. */
static char *owner_of(size_t i, const char *rid, char *id)
{
    accept_on(fleet[i], rid, "X-Test-Plan: fail=1; action=hang", id);
    cr_assert(fx_wait(attempted, (void *)rid, 10000, 50), "not attempted within 10 s");
    char *o = column("claimed_by", id), pid[24];
    cr_assert_not_null(o, "in flight without an owner");
    snprintf(pid, sizeof(pid), "-%ld-", (long)fleet[i]->pid);
    cr_expect_not_null(strstr(o, pid), "owner %s: not proxy %zu's pid", o, i);
    return o;
}

Test(fleet_pg, the_lease_owner_names_the_host_and_differs_between_processes)
{
    char id[2][33], host[128] = "";
    gethostname(host, sizeof(host) - 1);
    start_px(0, "\"drain_timeout_ms\": 500", "\"timeout_ms\": 30000");
    char *a = owner_of(0, "own-a", id[0]);
    px_stop(fleet[0], 20000);
    fleet[0] = NULL;
    start_px(1, "\"drain_timeout_ms\": 500", "\"timeout_ms\": 30000");
    char *b = owner_of(1, "own-b", id[1]);
    cr_expect_eq(strncmp(a, host, strlen(host)), 0, "owner %s: no host name %s", a, host);
    int dashes = 0;
    for (const char *p = a + strlen(host); *p; p++)
        dashes += *p == '-';
    cr_expect_eq(dashes, 3, "owner %s: not HOST-PID-START-RANDOM", a);
    cr_expect_str_neq(a, b);
    cr_expect_str_neq(strrchr(a, '-'), strrchr(b, '-'), "owners %s and %s", a, b);
    free(a);
    free(b);
}

/* An attempt that runs three times the lease keeps its delivery: the lease is renewed while it
 * runs, so neither proxy takes it again until the attempt ends (its route's timeout). */
Test(fleet_pg, a_long_attempt_renews_its_lease_and_is_never_attempted_twice_at_once)
{
    setenv("RETRYPROXY_TEST_LEASE_MS", "2000", 1);
    start_px(0, "", "\"timeout_ms\": 6000");
    start_px(1, "", "\"timeout_ms\": 6000");
    char id[1][33];
    accept_on(fleet[0], "long", "X-Test-Plan: fail=1; action=hang", id[0]);
    struct ids s = { id, 1 };
    cr_assert(fx_wait(all_delivered, &s, 40000, 100), "not delivered within 40 s");
    int64_t at[16];
    size_t n = arrivals(id[0], at, 16);
    cr_expect_eq(n, 2, "%zu attempts: the hanging one and the next", n);
    if (n >= 2)
        cr_expect_geq(at[1] - at[0], 5500,
                      "attempt 2 came %lld ms after attempt 1, which ran"
                      " 6000 ms: taken while it ran",
                      (long long)(at[1] - at[0]));
    char *tries = column("attempts", id[0]);
    cr_expect_str_eq(tries ? tries : "", "2", "no lost (lease_expired) attempt");
    free(tries);
}

static bool attempted_twice(void *arg)
{
    return tup_count_id(up, arg) >= 2;
}

/* SIGTERM: an attempt still running at the drain's deadline is cut and its lease given back,
 * due now: the other proxy takes it at once, not after the lease (30 s and more here). */
Test(fleet_pg, sigterm_gives_leases_back_within_the_drain)
{
    unsetenv("RETRYPROXY_TEST_LEASE_MS");
    start_px(0, "\"drain_timeout_ms\": 1000", "\"timeout_ms\": 20000");
    char id[1][33];
    accept_on(fleet[0], "drain", "X-Test-Plan: fail=1; action=hang", id[0]);
    cr_assert(fx_wait(attempted, "drain", 10000, 50), "not attempted within 10 s");
    start_px(1, "", "\"timeout_ms\": 20000");
    int64_t t0 = now_ms();
    int rc = px_stop(fleet[0], 20000);
    fleet[0] = NULL;
    cr_expect_eq(rc, 0, "the drained proxy's exit");
    cr_assert(fx_wait(attempted_twice, "drain", 10000, 50),
              "the other proxy did not take it within 10 s of SIGTERM (lease kept?)");
    struct ids s = { id, 1 };
    cr_expect(fx_wait(all_delivered, &s, 10000, 100), "not delivered");
    cr_log_info("taken over %lld ms after SIGTERM", (long long)(now_ms() - t0));
    char *tries = column("attempts", id[0]);
    cr_expect_str_eq(tries ? tries : "", "1", "a released lease records no attempt");
    free(tries);
}

/* Three proxies, accepts spread over them, each delivery failing once (503) then slow: every
 * one delivered, by whichever proxy claims it, and never two attempts of one at once. */
Test(fleet_pg, three_proxies_deliver_what_any_accepted_never_two_attempts_at_once)
{
    unsetenv("RETRYPROXY_TEST_LEASE_MS");
    for (size_t i = 0; i < 3; i++)
        start_px(i, "", "\"timeout_ms\": 20000");
    enum { N = 60 };
    char id[N][33];
    for (size_t i = 0; i < N; i++) {
        char rid[32];
        snprintf(rid, sizeof(rid), "fl-%zu", i);
        accept_on(fleet[i % 3], rid, "X-Test-Plan: fail=1; status=503; delay=100", id[i]);
    }
    struct ids s = { id, N };
    cr_assert(fx_wait(all_delivered, &s, 60000, 200), "not all delivered within 60 s");
    no_overlap(&s, 100, 0);
    for (size_t i = 0; i < N; i++) {
        int64_t at[16];
        cr_expect_eq(arrivals(id[i], at, 16), 2, "delivery %zu: fail once, then delivered", i);
    }
}

/* The first proxy accepts and attempts (each attempt 1.5 s), two others join, the first is
 * killed with SIGKILL: its deliveries wait out their leases (2 s), then the others deliver them;
 * none lost, none attempted while its lease could still run. */
Test(fleet_pg, a_proxy_killed_mid_attempt_its_deliveries_taken_over_after_their_leases)
{
    setenv("RETRYPROXY_TEST_LEASE_MS", "2000", 1);
    start_px(0, "", "\"timeout_ms\": 20000");
    enum { N = 12 };
    char id[N][33];
    for (size_t i = 0; i < N; i++) {
        char rid[32];
        snprintf(rid, sizeof(rid), "kill-%zu", i);
        accept_on(fleet[0], rid, "X-Test-Plan: delay=1500", id[i]);
    }
    cr_assert_eq(tup_wait_count(up, 4, 10000), 0, "no attempts within 10 s");
    start_px(1, "", "\"timeout_ms\": 20000");
    start_px(2, "", "\"timeout_ms\": 20000");
    sleep_ms(300); /* mid-attempt: each runs 1.5 s */
    int64_t killed = now_ms();
    kill(fleet[0]->pid, SIGKILL);
    waitpid(fleet[0]->pid, NULL, 0);
    px_stop(fleet[0], 1000); /* frees it; the process is gone */
    fleet[0] = NULL;
    struct ids s = { id, N };
    /* 2 s leases: well within 30 s (the lease of a 20 s timeout would be 50 s) */
    cr_assert(fx_wait(all_delivered, &s, 30000, 200), "not all delivered within 30 s");
    no_overlap(&s, 1500, killed);
    size_t taken = 0;
    for (size_t i = 0; i < N; i++) {
        int64_t at[16];
        size_t n = arrivals(id[i], at, 16);
        cr_expect_geq(n, 1, "delivery %zu never attempted", i);
        if (n < 2 || at[0] > killed)
            continue;
        taken++; /* attempted by the killed proxy: taken again, only after its lease */
        cr_expect_geq(at[1] - killed, 1000,
                      "delivery %zu attempted again %lld ms after the kill,"
                      " within its lease",
                      i, (long long)(at[1] - killed));
    }
    cr_expect_geq(taken, 1, "no delivery was in flight at the kill");
    cr_log_info("%zu deliveries taken over after the kill", taken);
}

/* `retryproxy deliveries ARGS -c CONFIG`: its result. */
static struct proc_result cli(const char *verb, const char *extra)
{
    char *argv[] = { (char *)proc_bin(), "deliveries", (char *)verb,  "-c", fleet[0]->cfg_path,
                     "--state",          "dead",       (char *)extra, NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 60000, &r), 0);
    return r;
}

static bool dead_listed(void *arg)
{
    struct proc_result r = cli("list", "--json");
    json_t *j = r.status == 0 ? json_loads(r.out, 0, NULL) : NULL;
    long n = j ? (long)json_integer_value(json_object_get(j, "total")) : -1;
    json_decref(j);
    proc_result_free(&r);
    return n == *(long *)arg;
}

Test(fleet_pg, dead_letters_of_several_proxies_listed_and_replayed_by_one_cli_call)
{
    unsetenv("RETRYPROXY_TEST_LEASE_MS");
    start_px(0, "", "");
    start_px(1, "", "");
    char id[4][33];
    const char *plan = "X-Test-Plan: fail=1; status=400";
    accept_on(fleet[0], "dead-0", plan, id[0]);
    accept_on(fleet[1], "dead-1", plan, id[1]);
    accept_on(fleet[0], "dead-2", plan, id[2]);
    accept_on(fleet[1], "dead-3", plan, id[3]);
    long four = 4, none = 0;
    cr_assert(fx_wait(dead_listed, &four, 30000, 200), "4 dead letters not listed in 30 s");
    struct proc_result r = cli("replay", NULL);
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect_not_null(strstr(r.out, "4"), "replay said: %s", r.out);
    proc_result_free(&r);
    struct ids s = { id, 4 };
    cr_expect(fx_wait(all_delivered, &s, 30000, 200), "the replayed were not delivered");
    cr_expect(dead_listed(&none), "dead letters left after the replay");
}
