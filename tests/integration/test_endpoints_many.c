/* Endpoints without a cap (docs/endpoints.md, "No cap on endpoints"), end to end: a name that
 * dnsmasq (tests/support/dnsmasq.h) gives 300 addresses is 300 endpoints, every one of them
 * gets attempts, and /upstreams lists them all. The pods are one test upstream listening on
 * 0.0.0.0, which answers on every 127.x address (all loopback on Linux) and records which one
 * each request was sent to.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/cfgb.h"
#include "tests/support/dnsmasq.h"
#include "tests/support/fixture.h"
#include "tests/support/proc.h"

#define ADDRS 300

static struct dnsm *dns;
static struct tup *pods; /* on 0.0.0.0: every address */
static char ip[ADDRS][24];

static void teardown(void)
{
    fx_stop();
    tup_stop(pods);
    pods = NULL;
    dnsm_stop(dns);
    dns = NULL;
}

TestSuite(endpoints_many, .fini = teardown, .timeout = 120);

/* The index of address 'a' among ip[], -1: none. */
static int index_of(const char *a)
{
    for (int i = 0; i < ADDRS; i++)
        if (strcmp(ip[i], a) == 0)
            return i;
    return -1;
}

/* dnsmasq giving many.test the ADDRS addresses 127.0.0.2 and on (past 127.0.0.254 into
 * 127.0.1.x, leaving out .0 and .255), the pods on all of them, and the proxy with route "r"
 * to http://many.test:PORT, balanced by 'balance', on one worker. */
static void start(const char *balance)
{
    fx_init_curl();
    char err[256];
    pods = tup_try_start_at("0.0.0.0", 0, NULL, NULL, err, sizeof(err));
    cr_assert_not_null(pods, "%s", err);
    const char *list[ADDRS];
    for (int i = 0, v = 2; i < ADDRS; v++) {
        if (v % 256 == 0 || v % 256 == 255)
            continue;
        snprintf(ip[i], sizeof(ip[i]), "127.0.%d.%d", v / 256, v % 256);
        list[i] = ip[i];
        i++;
    }
    dns = dnsm_start();
    cr_assert_not_null(dns);
    cr_assert_eq(dnsm_set(dns, "many.test", list, ADDRS), 0, "dnsmasq serves the 300");
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"resolver\": {\"servers\": [\"%s\"]}", dns->server);
    cfgb_route(b, "r", "\"upstreams\": [\"http://many.test:%u\"], \"balance\": \"%s\"",
               tup_port(pods), balance);
    fx_start_b(b, "--workers", "1", NULL);
}

/* 900 requests one after another over a name of 300 addresses, round-robin: every address gets
 * first attempts (3 each with even weights; at least one whatever the weights), and /upstreams
 * lists the 300, each healthy. With the cap of 64 the other 236 got none. */
Test(endpoints_many, three_hundred_addresses_all_get_attempts)
{
    start("round_robin");
    int64_t t0 = now_ms();
    for (int q = 0; q < 3 * ADDRS; q++) {
        char id[32];
        snprintf(id, sizeof(id), "q%d", q);
        cr_assert_eq(fx_get_id_plan(id, NULL), 200, "%s", id);
    }
    int64_t took = now_ms() - t0;
    static unsigned got[ADDRS];
    size_t n = tup_count(pods);
    cr_assert_eq(n, 3 * ADDRS, "one attempt a request");
    for (size_t k = 0; k < n; k++) {
        int i = index_of(tup_get(pods, k)->local);
        cr_assert_geq(i, 0, "sent to %s, not an address of the name", tup_get(pods, k)->local);
        got[i]++;
    }
    unsigned lo = UINT32_MAX, hi = 0;
    for (int i = 0; i < ADDRS; i++) {
        cr_expect_gt(got[i], 0, "%s got no attempt", ip[i]);
        lo = got[i] < lo ? got[i] : lo;
        hi = got[i] > hi ? got[i] : hi;
    }
    fprintf(stderr, "300 addresses, 900 requests in %lld ms: %u to %u attempts an address\n",
            (long long)took, lo, hi);
    json_t *j = fx_admin_get_json("/upstreams");
    json_t *r = json_array_get(json_object_get(j, "routes"), 0);
    json_t *eps = json_object_get(json_array_get(json_object_get(r, "upstreams"), 0), "endpoints");
    cr_expect_eq(json_array_size(eps), ADDRS, "/upstreams lists every endpoint");
    size_t k;
    json_t *e;
    json_array_foreach(eps, k, e)
    {
        char a[32];
        snprintf(a, sizeof(a), "%s", json_string_value(json_object_get(e, "address")));
        char *colon = strrchr(a, ':');
        if (colon)
            *colon = '\0';
        cr_expect_geq(index_of(a), 0, "%s listed", a);
        cr_expect_str_eq(json_string_value(json_object_get(e, "state")), "healthy");
    }
    json_decref(j);
}

/* A request's attempts among 300 endpoints go to as many addresses: its first two fail, and
 * each retry goes to an address it has not tried (least_request, the default). Twenty of them:
 * their 40 retries stay within the retry budget's floor. */
#define RETRIED 20
Test(endpoints_many, a_retry_goes_to_another_of_three_hundred)
{
    start("least_request");
    for (int q = 0; q < RETRIED; q++) {
        char id[32];
        snprintf(id, sizeof(id), "f%d", q);
        cr_assert_eq(fx_get_id_plan(id, "fail=2"), 200, "%s", id);
    }
    cr_assert_eq(tup_count(pods), 3 * RETRIED);
    for (int q = 0; q < RETRIED; q++) {
        char id[32];
        snprintf(id, sizeof(id), "f%d", q);
        const char *seen[3];
        size_t m = 0;
        for (size_t k = 0; k < tup_count(pods) && m < 3; k++)
            if (strcmp(tup_get(pods, k)->request_id, id) == 0)
                seen[m++] = tup_get(pods, k)->local;
        cr_assert_eq(m, 3);
        cr_expect(strcmp(seen[0], seen[1]) && strcmp(seen[0], seen[2]) && strcmp(seen[1], seen[2]),
                  "%s: attempts on %s, %s, %s", id, seen[0], seen[1], seen[2]);
    }
}
