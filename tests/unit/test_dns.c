/* dns: the resolver (proxy/dns/resolve.h) against a real DNS server, Debian's dnsmasq
 * (tests/support/dnsmasq.h), in a loop of its own: the first answer, A and AAAA, a change
 * followed within the TTL, a server killed or frozen (addresses kept, counted, logged once),
 * NXDOMAIN (kept for a while, then none), IP literals, and new servers on reload. Wall-clock
 * bounds are generous: the box is loaded. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/cfg.h"
#include "proxy/base/loop.h"
#include "proxy/dns/resolve.h"
#include "proxy/telemetry/log.h"
#include "proxy/telemetry/metrics.h"
#include "tests/support/dnsmasq.h"
#include "tests/support/proc.h"
#include "tests/support/promtext.h"

static struct dnsm *srv, *srv2;
static struct dns *dns;
static struct loop *loop;
static struct metrics *met;
static char log_path[64] = "";
static int changes;

static void teardown(void)
{
    dns_free(dns);
    dns = NULL;
    loop_free(loop);
    loop = NULL;
    metrics_free(met);
    met = NULL;
    dnsm_stop(srv);
    dnsm_stop(srv2);
    srv = srv2 = NULL;
    if (log_path[0])
        unlink(log_path);
}

TestSuite(dns, .fini = teardown, .timeout = 60);

/* Settings asking 'server' only ("IP:PORT"). */
static struct cfg_resolver settings(const char *server, struct cfg_dns_server *one)
{
    memset(one, 0, sizeof(*one));
    char ip[64];
    unsigned port = 0;
    cr_assert_eq(sscanf(server, "%63[^:]:%u", ip, &port), 2);
    one->addr = server;
    one->family = AF_INET;
    one->port = (uint16_t)port;
    cr_assert_eq(inet_pton(AF_INET, ip, one->ip), 1);
    return (struct cfg_resolver){ .servers = one,
                                  .n_servers = 1,
                                  .timeout_ms = 500,
                                  .min_refresh_ms = 200,
                                  .max_refresh_ms = 30000,
                                  .nxdomain_keep_ms = 1000 };
}

static void on_change(void *arg)
{
    (void)arg;
    changes++;
}

/* A server, the resolver asking it (with 'adjust' applied to its settings) and metrics; the
 * log goes to a file of the test's own. */
static void start(void (*adjust)(struct cfg_resolver *))
{
    srv = dnsm_start();
    cr_assert_not_null(srv, "dnsmasq did not start");
    struct cfg_dns_server one;
    struct cfg_resolver s = settings(srv->server, &one);
    if (adjust)
        adjust(&s);
    dns = dns_new(&s);
    cr_assert_not_null(dns);
    met = metrics_new(1);
    dns_set_metrics(dns, met);
    dns_on_change(dns, on_change, NULL);
    snprintf(log_path, sizeof(log_path), "/tmp/retryproxy-dnslog-XXXXXX");
    int fd = mkstemp(log_path);
    cr_assert_geq(fd, 0);
    log_set_fd(fd);
    log_configure(CFG_LOG_DEBUG, CFG_LOG_JSON);
}

static void attach(void)
{
    loop = loop_new();
    cr_assert_not_null(loop);
    cr_assert_eq(dns_attach(dns, loop), 0);
}

static void set(struct dnsm *d, const char *name, const char *a, const char *b, const char *c)
{
    const char *v[3] = { a, b, c };
    size_t n = c ? 3 : b ? 2 : a ? 1 : 0;
    cr_assert_eq(dnsm_set(d, name, v, n), 0, "dnsmasq does not answer the new set of %s", name);
}

/* The name's addresses as text, "a,b" in the set's order. */
static const char *addrs_text(struct dns_name *n)
{
    static char out[512];
    struct dns_addrs *a = dns_name_addrs(n);
    out[0] = '\0';
    for (size_t i = 0; i < a->n; i++) {
        char t[64];
        inet_ntop(a->a[i].family, &a->a[i].u, t, sizeof(t));
        snprintf(out + strlen(out), sizeof(out) - strlen(out), "%s%s", i ? "," : "", t);
    }
    dns_addrs_unref(a);
    return out;
}

static struct dns_status status(struct dns_name *n)
{
    struct dns_status st;
    dns_name_status(n, &st);
    return st;
}

/* Runs the loop until 'cond' holds or 'ms' pass; whether it held. */
#define RUN_UNTIL(cond, ms)                                                                        \
    ({                                                                                             \
        int64_t until_ = now_ms() + (ms);                                                          \
        while (!(cond) && now_ms() < until_)                                                       \
            loop_turn(loop, 50);                                                                   \
        (cond);                                                                                    \
    })

static double metric(const char *series)
{
    size_t len;
    char *text = metrics_render(met, &len);
    cr_assert_not_null(text);
    double v = prom_sum(text, series);
    free(text);
    return v;
}

/* Log lines holding 'needle'. */
static int log_lines(const char *needle)
{
    char *text = proc_read_file(log_path);
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++)
        n++;
    free(text);
    return n;
}

Test(dns, a_new_name_is_resolved_before_dns_name_get_returns)
{
    start(NULL);
    set(srv, "one.test", "127.0.0.2", NULL, NULL);
    struct dns_name *n = dns_name_get(dns, "one.test");
    cr_assert_not_null(n);
    cr_expect_str_eq(addrs_text(n), "127.0.0.2");
    struct dns_status st = status(n);
    cr_expect_eq(st.last, DNS_OK);
    cr_expect_not(st.stale);
    cr_expect_not(st.literal);
    cr_expect_gt(st.resolved_unix_ms, 0);
    cr_expect_leq(st.ttl_s, 1);
    cr_expect_str_eq(st.host, "one.test");
    cr_expect_eq(metric("retryproxy_dns_resolutions_total{name=\"one.test\",result=\"ok\"}"), 1);
    cr_expect_eq(metric("retryproxy_dns_stale{name=\"one.test\"}"), 0);
    /* The same name, in any case, is the same object. */
    struct dns_name *again = dns_name_get(dns, "ONE.test");
    cr_expect_eq(again, n);
    dns_name_unref(again);
    dns_name_unref(n);
}

Test(dns, a_and_aaaa_records_are_all_addresses_ipv4_first)
{
    start(NULL);
    set(srv, "both.test", "::2", "127.0.0.3", "127.0.0.2");
    struct dns_name *n = dns_name_get(dns, "both.test");
    cr_expect_str_eq(addrs_text(n), "127.0.0.2,127.0.0.3,::2");
    dns_name_unref(n);
}

Test(dns, a_changed_record_is_followed_within_the_ttl_and_a_second)
{
    start(NULL);
    set(srv, "moving.test", "127.0.0.2", NULL, NULL);
    struct dns_name *n = dns_name_get(dns, "moving.test");
    attach();
    uint64_t gen = dns_name_generation(n);
    int seen = changes;
    set(srv, "moving.test", "127.0.0.3", "127.0.0.4", NULL);
    int64_t t0 = now_ms();
    /* TTL 1 s, plus about a second; more room for a loaded box. */
    cr_assert(RUN_UNTIL(dns_name_generation(n) != gen, 4000), "not followed");
    cr_expect_lt(now_ms() - t0, 4000);
    cr_expect_str_eq(addrs_text(n), "127.0.0.3,127.0.0.4");
    cr_expect_gt(changes, seen, "dns_on_change() was not called");
    /* Unchanged answers publish nothing. */
    gen = dns_name_generation(n);
    RUN_UNTIL(false, 1500);
    cr_expect_eq(dns_name_generation(n), gen);
    cr_expect_geq(metric("retryproxy_dns_resolutions_total{name=\"moving.test\",result=\"ok\"}"),
                  3);
    dns_name_unref(n);
}

Test(dns, a_dead_server_leaves_the_addresses_stale_counted_and_logged_once)
{
    start(NULL);
    set(srv, "kept.test", "127.0.0.2", NULL, NULL);
    struct dns_name *n = dns_name_get(dns, "kept.test");
    attach();
    uint64_t gen = dns_name_generation(n);
    dnsm_kill(srv);
    cr_assert(RUN_UNTIL(status(n).last == DNS_FAILED, 5000), "no failed lookup");
    /* Several more lookups fail (min_refresh_ms 200): still one line. */
    cr_assert(RUN_UNTIL(metric("retryproxy_dns_resolutions_total{name=\"kept.test\","
                               "result=\"failure\"}") >= 3,
                        8000));
    cr_expect_str_eq(addrs_text(n), "127.0.0.2");
    cr_expect_eq(dns_name_generation(n), gen);
    cr_expect(status(n).stale);
    cr_expect_eq(metric("retryproxy_dns_stale{name=\"kept.test\"}"), 1);
    cr_expect_eq(log_lines("name lookup failed"), 1);
    dns_name_unref(n);
}

static void slow_timeout(struct cfg_resolver *s)
{
    s->timeout_ms = 800;
}

Test(dns, a_frozen_server_times_out_within_timeout_ms_and_its_return_is_logged)
{
    start(slow_timeout);
    set(srv, "frozen.test", "127.0.0.2", NULL, NULL);
    set(srv, "later.test", "127.0.0.5", NULL, NULL);
    struct dns_name *n = dns_name_get(dns, "frozen.test");
    attach();
    dnsm_freeze(srv);
    /* A new name while the server is frozen: dns_name_get() waits timeout_ms, not more. */
    int64_t t0 = now_ms();
    struct dns_name *late = dns_name_get(dns, "later.test");
    int64_t took = now_ms() - t0;
    cr_expect_geq(took, 700, "gave up after %lld ms", (long long)took);
    cr_expect_lt(took, 2000, "took %lld ms", (long long)took);
    cr_expect_eq(status(late).last, DNS_FAILED);
    cr_expect_str_eq(addrs_text(late), "");
    cr_assert(RUN_UNTIL(status(n).last == DNS_FAILED, 5000), "no failed lookup");
    cr_expect_str_eq(addrs_text(n), "127.0.0.2");
    cr_expect(status(n).stale);
    cr_expect_eq(log_lines("\"frozen.test\""), 1);
    /* Thawed: both resolve again, one info line each. */
    dnsm_thaw(srv);
    cr_assert(RUN_UNTIL(!status(n).stale && !status(late).stale, 5000), "still stale");
    cr_expect_str_eq(addrs_text(late), "127.0.0.5");
    cr_expect_eq(metric("retryproxy_dns_stale{name=\"frozen.test\"}"), 0);
    cr_expect_eq(log_lines("name resolves again"), 2);
    dns_name_unref(late);
    dns_name_unref(n);
}

/* A snapshot's new names are asked side by side: three while the server is frozen wait one
 * timeout_ms, not three; those that can be answered are. */
Test(dns, new_names_started_together_wait_one_timeout_at_most)
{
    start(slow_timeout);
    set(srv, "a.test", "127.0.0.2", NULL, NULL);
    set(srv, "b.test", "127.0.0.3", NULL, NULL);
    attach();
    dnsm_freeze(srv);
    int64_t t0 = now_ms();
    struct dns_name *v[3] = { dns_name_start(dns, "a.test"), dns_name_start(dns, "b.test"),
                              dns_name_start(dns, "c.test") };
    dns_wait(dns);
    int64_t took = now_ms() - t0;
    cr_expect_geq(took, 700);
    cr_expect_lt(took, 2000, "took %lld ms for three names", (long long)took);
    for (int i = 0; i < 3; i++)
        cr_expect_eq(status(v[i]).last, DNS_FAILED);
    /* Thawed: two new names, both answered before dns_wait() returns. */
    dnsm_thaw(srv);
    set(srv, "d.test", "127.0.0.4", NULL, NULL);
    struct dns_name *w[2] = { dns_name_start(dns, "a.test"), dns_name_start(dns, "d.test") };
    cr_expect_eq(w[0], v[0], "a name known already is not new");
    dns_wait(dns);
    cr_expect_eq(status(w[1]).last, DNS_OK);
    cr_expect_str_eq(addrs_text(w[1]), "127.0.0.4");
    for (int i = 0; i < 3; i++)
        dns_name_unref(v[i]);
    dns_name_unref(w[0]);
    dns_name_unref(w[1]);
}

static void keep_3s(struct cfg_resolver *s)
{
    s->nxdomain_keep_ms = 3000;
}

Test(dns, nxdomain_keeps_the_addresses_for_nxdomain_keep_ms_then_none)
{
    start(keep_3s);
    set(srv, "gone.test", "127.0.0.2", NULL, NULL);
    struct dns_name *n = dns_name_get(dns, "gone.test");
    attach();
    set(srv, "gone.test", NULL, NULL, NULL);
    cr_assert(RUN_UNTIL(status(n).last == DNS_NXDOMAIN, 4000), "no NXDOMAIN seen");
    int64_t t0 = now_ms();
    cr_expect_str_eq(addrs_text(n), "127.0.0.2");
    cr_expect_not(status(n).stale);
    /* nxdomain_keep_ms is 3000: still kept after a third of it, gone a little after it. */
    RUN_UNTIL(false, 1000);
    cr_expect_str_eq(addrs_text(n), "127.0.0.2", "dropped before nxdomain_keep_ms");
    cr_assert(RUN_UNTIL(addrs_text(n)[0] == '\0', 5000), "still kept");
    cr_expect_lt(now_ms() - t0, 6000);
    cr_expect_geq(metric("retryproxy_dns_resolutions_total{name=\"gone.test\",result="
                         "\"nxdomain\"}"),
                  1);
    /* A name that never existed: none at once. */
    struct dns_name *never = dns_name_get(dns, "never.test");
    cr_expect_eq(status(never).last, DNS_NXDOMAIN);
    cr_expect_str_eq(addrs_text(never), "");
    dns_name_unref(never);
    dns_name_unref(n);
}

Test(dns, an_ip_literal_is_one_address_never_asked)
{
    start(NULL);
    struct dns_name *v4 = dns_name_get(dns, "127.0.0.7");
    struct dns_name *v6 = dns_name_get(dns, "::1");
    attach();
    cr_expect_str_eq(addrs_text(v4), "127.0.0.7");
    cr_expect_str_eq(addrs_text(v6), "::1");
    cr_expect(status(v4).literal);
    cr_expect_eq(status(v4).last, DNS_NONE);
    uint64_t gen = dns_name_generation(v4);
    dnsm_kill(srv);
    RUN_UNTIL(false, 800);
    cr_expect_eq(dns_name_generation(v4), gen);
    cr_expect_not(status(v4).stale);
    cr_expect(isnan(metric("retryproxy_dns_resolutions_total{name=\"127.0.0.7\"}")),
              "a literal has series");
    dns_name_unref(v4);
    dns_name_unref(v6);
}

Test(dns, new_servers_on_reload_are_asked_from_then_on)
{
    start(NULL);
    srv2 = dnsm_start();
    cr_assert_not_null(srv2);
    set(srv, "svc.test", "127.0.0.2", NULL, NULL);
    set(srv2, "svc.test", "127.0.0.3", NULL, NULL);
    struct dns_name *n = dns_name_get(dns, "svc.test");
    attach();
    cr_expect_str_eq(addrs_text(n), "127.0.0.2");
    struct cfg_dns_server one;
    struct cfg_resolver s = settings(srv2->server, &one);
    cr_assert_eq(dns_configure(dns, &s), 0);
    dnsm_kill(srv); /* nothing more from the first */
    cr_assert(RUN_UNTIL(strcmp(addrs_text(n), "127.0.0.3") == 0, 4000), "still %s", addrs_text(n));
    cr_expect_not(status(n).stale);
    dns_name_unref(n);
}

Test(dns, a_name_only_the_registry_holds_is_no_longer_asked)
{
    start(NULL);
    set(srv, "dropped.test", "127.0.0.2", NULL, NULL);
    struct dns_name *n = dns_name_get(dns, "dropped.test");
    attach();
    dns_name_unref(n);
    RUN_UNTIL(false, 2500);
    double asked = metric("retryproxy_dns_resolutions_total{name=\"dropped.test\"}");
    RUN_UNTIL(false, 2500);
    cr_expect_eq(metric("retryproxy_dns_resolutions_total{name=\"dropped.test\"}"), asked,
                 "still asked");
    cr_expect_leq(asked, 3);
}

/* Workers and the admin thread read names while the control thread publishes: each read is a
 * whole set, one of those published (run under TSan: make BUILD=build-tsan SAN=-fsanitize=thread).
 */
static atomic_bool reading_done;
static atomic_int bad_reads, reads;

static void *reader(void *arg)
{
    struct dns_name *n = arg;
    while (!atomic_load(&reading_done)) {
        struct dns_name *r = dns_name_ref(n);
        uint64_t gen = dns_name_generation(r);
        struct dns_addrs *a = dns_name_addrs(r);
        struct dns_status st;
        dns_name_status(r, &st);
        char t[64] = "";
        if (a->n)
            inet_ntop(AF_INET, &a->a[0].u.v4, t, sizeof(t));
        bool ok =
            (a->n == 1 && strcmp(t, "127.0.0.2") == 0) ||
            (a->n == 2 && strcmp(t, "127.0.0.3") == 0 && a->a[1].u.v4.s_addr == htonl(0x7f000004));
        /* a whole set, whatever the last lookup said: under load one may time out, and the
         * name keeps its set (stale) */
        (void)st;
        if (!ok || gen == 0)
            atomic_fetch_add(&bad_reads, 1);
        atomic_fetch_add(&reads, 1);
        dns_addrs_unref(a);
        dns_name_unref(r);
        /* two readers spinning on two cores starved the loop and dnsmasq (make test beside
         * other jobs: the changes were not followed within 4 s, and lookups timed out) */
        sched_yield();
    }
    return NULL;
}

Test(dns, other_threads_read_whole_sets_while_the_loop_publishes)
{
    start(NULL);
    set(srv, "busy.test", "127.0.0.2", NULL, NULL);
    struct dns_name *n = dns_name_get(dns, "busy.test");
    attach();
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, reader, n), 0);
    uint64_t gen = dns_name_generation(n);
    for (int round = 0; round < 4; round++) {
        if (round % 2 == 0)
            set(srv, "busy.test", "127.0.0.3", "127.0.0.4", NULL);
        else
            set(srv, "busy.test", "127.0.0.2", NULL, NULL);
        RUN_UNTIL(dns_name_generation(n) != gen, 10000);
        gen = dns_name_generation(n);
    }
    atomic_store(&reading_done, true);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    cr_expect_eq(atomic_load(&bad_reads), 0, "%d of %d reads saw no whole set",
                 atomic_load(&bad_reads), atomic_load(&reads));
    cr_expect_gt(atomic_load(&reads), 0);
    cr_expect_geq(dns_name_generation(n), 5, "the changes were not all followed");
    dns_name_unref(n);
}

/* servers [] is /etc/resolv.conf's, with the hosts file first: "localhost" is 127.0.0.1 there
 * (Debian's /etc/hosts), never asked of a server. */
Test(dns, no_servers_means_the_system_s_resolv_conf_and_hosts_file)
{
    struct cfg_resolver s = { .timeout_ms = 1000,
                              .min_refresh_ms = 1000,
                              .max_refresh_ms = 30000,
                              .nxdomain_keep_ms = 1000 };
    dns = dns_new(&s);
    cr_assert_not_null(dns);
    struct dns_name *n = dns_name_get(dns, "localhost");
    cr_expect_eq(status(n).last, DNS_OK);
    cr_expect(strstr(addrs_text(n), "127.0.0.1"), "localhost is %s", addrs_text(n));
    dns_name_unref(n);
}
