/* live_upstream_sync(): each address of an upstream's record gets an endpoint slot, kept while
 * it stays (its health with it), given to another address only once its own left and nothing
 * uses it, as many as the record has (docs/endpoints.md). */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proxy/core/live.h"
#include "proxy/telemetry/metrics.h"

static struct live *lv;
static struct live_upstream *u;

static void setup(void)
{
    lv = live_new();
    cr_assert_not_null(live_route(lv, "r", 1000));
    u = live_upstream(lv, "r", "http://svc:80");
    cr_assert_not_null(u);
}

static void teardown(void)
{
    live_free(lv);
}

TestSuite(live_endpoints, .init = setup, .fini = teardown);

static struct dns_addr v4(const char *s)
{
    struct dns_addr a;
    memset(&a, 0, sizeof(a));
    a.family = AF_INET;
    inet_pton(AF_INET, s, &a.u.v4);
    return a;
}

/* Ejected for 'ms' at the first failure. */
static struct health_spec eject_on_first(uint32_t ms)
{
    struct health_spec hs = { .consecutive_failures = 1 };
    hs.backoff.policy = BACKOFF_FIXED;
    hs.backoff.base_ms = ms;
    hs.backoff.cap_ms = ms;
    return hs;
}

Test(live_endpoints, an_address_keeps_its_slot_while_it_stays)
{
    struct dns_addr a[2] = { v4("10.0.0.1"), v4("10.0.0.2") };
    struct live_endpoint *e[2], *f[2];
    live_upstream_sync(u, a, 2, e);
    cr_assert(e[0] && e[1] && e[0] != e[1]);
    struct dns_addr b[2] = { v4("10.0.0.2"), v4("10.0.0.3") };
    live_upstream_sync(u, b, 2, f);
    cr_expect_eq(f[0], e[1], "10.0.0.2 kept its slot");
    cr_expect_eq(atomic_load(&f[0]->epoch), atomic_load(&e[1]->epoch));
    /* 10.0.0.1 left and nothing uses it: 10.0.0.3 takes its slot, as another address */
    cr_expect_eq(f[1], e[0]);
    cr_expect_eq(atomic_load(&f[1]->epoch), 1);
}

Test(live_endpoints, a_left_address_that_nothing_uses_gives_its_slot_and_health_away)
{
    struct health_spec hs = eject_on_first(1000);
    struct rng rng;
    rng_seed(&rng, 1);
    struct dns_addr a[1] = { v4("10.0.0.1") };
    struct live_endpoint *e[1], *f[1];
    live_upstream_sync(u, a, 1, e);
    uint32_t epoch = atomic_load(&e[0]->epoch);
    cr_expect(live_endpoint_record(e[0], epoch, &hs, true, 100, &rng), "ejected");
    cr_expect(!live_endpoint_available(e[0], 200));
    /* in use when it left: the slot stays its own ("leaving") */
    atomic_store(&e[0]->in_flight, 1);
    struct dns_addr b[1] = { v4("10.0.0.2") };
    live_upstream_sync(u, b, 1, f);
    cr_expect_neq(f[0], e[0]);
    struct live_ep_row rows[4];
    size_t n = live_upstream_endpoints(u, 200, rows, 4);
    cr_assert_eq(n, 2);
    cr_expect_eq(rows[0].state, LIVE_EP_LEAVING);
    cr_expect_eq(rows[1].state, LIVE_EP_HEALTHY);
    /* once unused, a third address may take it: health and epoch start over */
    atomic_store(&e[0]->in_flight, 0);
    struct dns_addr c[2] = { v4("10.0.0.2"), v4("10.0.0.3") };
    struct live_endpoint *g[2];
    live_upstream_sync(u, c, 2, g);
    cr_expect_eq(g[1], e[0], "the unused slot is reused");
    cr_expect_neq(atomic_load(&g[1]->epoch), epoch);
    cr_expect(live_endpoint_available(g[1], 200), "the new address is not ejected");
    cr_expect(!live_endpoint_record(g[1], epoch, &hs, true, 300, &rng),
              "an outcome for the old address is not recorded against the new one");
    cr_expect(live_endpoint_available(g[1], 400));
    cr_expect_eq(u->ejections_gone, 1, "the old address's ejection still counts");
}

/* The slot table grows with the record (no cap): each of 5,000 addresses gets its own slot, the
 * slots made first stay where they were while the table grows (the workers hold pointers to
 * them), and a record that then changes half its addresses keeps the others' slots and gives
 * the left ones' to those that joined. */
Test(live_endpoints, five_thousand_addresses_get_five_thousand_slots)
{
    enum { N = 5000 };
    struct dns_addr *a = calloc(N, sizeof(*a));
    struct live_endpoint **e = calloc(N, sizeof(*e)), **f = calloc(N, sizeof(*f));
    cr_assert(a && e && f);
    for (int i = 0; i < N; i++) {
        char s[32];
        snprintf(s, sizeof(s), "10.1.%d.%d", i / 250, i % 250 + 1);
        a[i] = v4(s);
    }
    live_upstream_sync(u, a, 8, e); /* the table's first size */
    struct live_endpoint *first = e[0];
    live_upstream_sync(u, a, N, e);
    cr_expect_eq(e[0], first, "a slot stays where it was while the table grows");
    size_t distinct = 0;
    for (int i = 0; i < N; i++) {
        cr_expect_not_null(e[i], "address %d has no slot", i);
        cr_expect_eq(dns_addr_cmp(&e[i]->addr, &a[i]), 0);
        distinct += i == 0 || e[i] != e[i - 1];
    }
    cr_expect_eq(distinct, N);
    struct live_ep_row *rows;
    cr_expect_eq(live_upstream_endpoints_all(u, 0, &rows), N);
    free(rows);
    /* the even ones leave, as many new ones join */
    for (int i = 0; i < N; i += 2) {
        char s[32];
        snprintf(s, sizeof(s), "10.2.%d.%d", i / 250, i % 250 + 1);
        a[i] = v4(s);
    }
    live_upstream_sync(u, a, N, f);
    size_t kept = 0, reused = 0;
    for (int i = 0; i < N; i++) {
        kept += i % 2 == 1 && f[i] == e[i];
        reused += i % 2 == 0 && f[i] != NULL;
    }
    cr_expect_eq(kept, N / 2, "the addresses that stayed keep their slots");
    cr_expect_eq(reused, N / 2);
    cr_expect_eq(u->n, (size_t)N, "the left addresses' slots went to those that joined");
    cr_expect_eq(live_upstream_endpoints_all(u, 0, &rows), N);
    free(rows);
    free(a);
    free(e);
    free(f);
}

/* upstream_endpoint_failure_ratio's rows (docs/metrics.md): an upstream's worst endpoints by
 * failure ratio, at most METRICS_WORST_ENDPOINTS of them and only those at 0.1 or more, the worst
 * first (equals in slot order), whatever the number of failing ones. */
Test(live_endpoints, the_metrics_name_at_most_three_worst_endpoints)
{
    struct dns_addr a[5] = { v4("10.0.0.1"), v4("10.0.0.2"), v4("10.0.0.3"), v4("10.0.0.4"),
                             v4("10.0.0.5") };
    struct live_endpoint *e[5];
    live_upstream_sync(u, a, 5, e);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    /* 10.0.0.1 healthy; .2 fails one attempt in two; .3, .4, .5 every one */
    for (int i = 0; i < 40; i++) {
        score_record(&e[0]->h.score, false, 1000, now);
        score_record(&e[1]->h.score, i % 2, 1000, now);
        for (int k = 2; k < 5; k++)
            score_record(&e[k]->h.score, true, 1000, now);
    }
    struct metrics_upstream *rows;
    size_t n = live_upstream_rows(lv, &rows);
    cr_assert_eq(n, 1);
    cr_assert_eq(rows[0].n_worst, METRICS_WORST_ENDPOINTS);
    cr_expect_str_eq(rows[0].worst[0].ip, "10.0.0.3");
    cr_expect_str_eq(rows[0].worst[1].ip, "10.0.0.4");
    cr_expect_str_eq(rows[0].worst[2].ip, "10.0.0.5");
    cr_expect_gt(rows[0].worst[2].failure_ratio, 0.9);
    free(rows);
    /* .3 .. .5 heal: .2 is the only one left at 0.1 or more */
    for (int i = 0; i < 60; i++)
        for (int k = 2; k < 5; k++)
            score_record(&e[k]->h.score, false, 1000, now);
    n = live_upstream_rows(lv, &rows);
    cr_assert_eq(rows[0].n_worst, 1);
    cr_expect_str_eq(rows[0].worst[0].ip, "10.0.0.2");
    cr_expect(rows[0].worst[0].failure_ratio > 0.3 && rows[0].worst[0].failure_ratio < 0.7, "%g",
              rows[0].worst[0].failure_ratio);
    free(rows);
}

/* An address leaves while a connection to it is open: it is "leaving" until the connection
 * closes, then gone from the view, and its slot is free for the next address that joins. */
Test(live_endpoints, a_left_address_goes_once_its_connections_close)
{
    struct dns_addr a[2] = { v4("10.0.0.1"), v4("10.0.0.2") };
    struct live_endpoint *e[2], *f[1], *g[2];
    live_upstream_sync(u, a, 2, e);
    atomic_store(&e[1]->conns, 1); /* an idle connection to 10.0.0.2 */
    live_upstream_sync(u, a, 1, f);
    struct live_ep_row rows[4];
    cr_assert_eq(live_upstream_endpoints(u, 0, rows, 4), 2);
    cr_expect_eq(rows[1].state, LIVE_EP_LEAVING);
    cr_expect_eq(rows[1].conns, 1);
    atomic_store(&e[1]->conns, 0); /* the worker closed it */
    cr_expect_eq(live_upstream_endpoints(u, 0, rows, 4), 1, "gone once nothing uses it");
    cr_expect_eq(dns_addr_cmp(&rows[0].addr, &a[0]), 0);
    struct dns_addr b[2] = { v4("10.0.0.1"), v4("10.0.0.3") };
    live_upstream_sync(u, b, 2, g);
    cr_expect_eq(g[1], e[1], "its slot is free again");
}

/* Health belongs to the pod, not the address: an ejected address that leaves the record and
 * comes back (a new pod on a reused IP) starts healthy, whether or not its slot was still in use
 * meanwhile, and late outcomes of the old pod's attempts are not recorded against the new one. */
static void rejoin_starts_fresh(bool busy)
{
    struct health_spec hs = eject_on_first(30000);
    struct rng rng;
    rng_seed(&rng, 1);
    struct dns_addr a[2] = { v4("10.0.0.1"), v4("10.0.0.2") };
    struct live_endpoint *e[2], *f[1], *g[2];
    live_upstream_sync(u, a, 2, e);
    uint32_t old = atomic_load(&e[0]->epoch);
    cr_assert(live_endpoint_record(e[0], old, &hs, true, 100, &rng), "ejected");
    if (busy)
        atomic_store(&e[0]->in_flight, 1);
    live_upstream_sync(u, &a[1], 1, f); /* 10.0.0.1 leaves */
    live_upstream_sync(u, a, 2, g);     /* and comes back */
    cr_expect_eq(g[0], e[0], "the same slot");
    cr_expect(live_endpoint_available(g[0], 200), "the new pod inherited the ejection");
    struct health h;
    live_endpoint_read(g[0], &h);
    cr_expect_eq(h.ejections_total, 0);
    cr_expect_neq(atomic_load(&g[0]->epoch), old);
    cr_expect(!live_endpoint_record(g[0], old, &hs, true, 300, &rng),
              "an outcome of the old pod is not recorded against the new one");
    cr_expect(live_endpoint_available(g[0], 400));
    cr_expect_eq(u->ejections_gone, 1, "the old pod's ejection still counts");
    struct live_ep_row rows[4];
    cr_assert_eq(live_upstream_endpoints(u, 400, rows, 4), 2);
    cr_expect_eq(rows[0].state, LIVE_EP_HEALTHY);
}

Test(live_endpoints, an_address_that_comes_back_starts_healthy)
{
    rejoin_starts_fresh(false);
}

Test(live_endpoints, an_address_that_comes_back_while_still_in_use_starts_healthy)
{
    rejoin_starts_fresh(true);
}
