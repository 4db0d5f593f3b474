/* Endpoints that leave (docs/endpoints.md#endpoints-that-leave-and-join), end to end over
 * HTTP/1.1 through libcurl, with pods on 127.0.0.2 and up behind a real DNS server (dnsmasq,
 * TTL 1 s): an address that leaves the record closes its idle connections and is gone from
 * /upstreams within about a second, with no request passing; its health goes with it, so a new
 * pod on the same address is used at once; and rolling updates whose old pods go dark (their
 * address stops answering, as a deleted pod's does) while requests run, under CPU load, leave
 * no endpoint behind.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/cfgb.h"
#include "tests/support/dnsmasq.h"
#include "tests/support/fixture.h"
#include "tests/support/pods.h"
#include "tests/support/proc.h"

#define T     20000 /* ms: upper bound for any single request */
#define ADDRS 12    /* 127.0.0.2 ... 127.0.0.13 */

static struct dnsm *dns;
static struct tup *pod[ADDRS]; /* on 127.0.0.2 + i, NULL where none runs */
static int dark[ADDRS];        /* a listener that answers nothing (a deleted pod), or -1 */
static int dark_client[ADDRS]; /* the connection that fills its accept queue */
static uint16_t port;
static pid_t burner[2];

static const char *ip(size_t i)
{
    return pods_ip(i);
}

static void unburn(void)
{
    for (size_t i = 0; i < 2; i++)
        if (burner[i] > 0) {
            kill(burner[i], SIGKILL);
            waitpid(burner[i], NULL, 0);
            burner[i] = 0;
        }
}

static void teardown(void)
{
    unburn();
    fx_stop();
    for (size_t i = 0; i < ADDRS; i++) {
        tup_stop(pod[i]);
        pod[i] = NULL;
        if (dark[i] >= 0)
            close(dark[i]), close(dark_client[i]);
        dark[i] = dark_client[i] = -1;
    }
    dnsm_stop(dns);
    dns = NULL;
}

static void init(void)
{
    for (size_t i = 0; i < ADDRS; i++)
        dark[i] = dark_client[i] = -1;
}

TestSuite(endpoints_leave, .init = init, .fini = teardown, .timeout = 150);

/* Pods on the first 'n' addresses, and the DNS server. */
static void pods(size_t n)
{
    fx_init_curl();
    port = pods_start(pod, n);
    dns = dnsm_start();
    cr_assert_not_null(dns);
}

/* svc.test is the addresses of 'idx[0..n)'. */
static void record(const size_t *idx, size_t n)
{
    const char *a[8];
    cr_assert_leq(n, 8);
    for (size_t i = 0; i < n; i++)
        a[i] = ip(idx[i]);
    cr_assert_eq(dnsm_set(dns, "svc.test", a, n), 0);
}

static void start(const char *more, const char *workers)
{
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"resolver\": {\"servers\": [\"%s\"]}", dns->server);
    cfgb_route(b, "r", "\"upstreams\": [\"http://svc.test:%u\"]%s%s", port, *more ? ", " : "",
               more);
    fx_start_b(b, "--workers", workers, NULL);
}

/* Pod 'i' is deleted: it stops, and its address answers nothing from now on (SYNs dropped: a
 * listener whose accept queue is full), as a deleted pod's address does in a cluster, where no
 * RST comes back. */
static void go_dark(size_t i)
{
    tup_stop(pod[i]);
    pod[i] = NULL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    cr_assert_geq(fd, 0);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
    inet_pton(AF_INET, ip(i), &sa.sin_addr);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "bind %s: %m", ip(i));
    cr_assert_eq(listen(fd, 0), 0);
    /* one connection not accepted fills a queue of 0: every later SYN is dropped */
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0);
    dark[i] = fd;
    dark_client[i] = c;
}

static json_t *endpoint_of(const char *addr_ip)
{
    return pods_endpoint(addr_ip, port);
}

static const char *state_of(const char *addr_ip)
{
    return pods_state(addr_ip, port);
}

/* The endpoints /upstreams shows as leaving, as "ADDR(connections=N in_flight=M) ..." in
 * out[cap]; how many. */
static size_t leaving(char *out, size_t cap)
{
    json_t *j = fx_admin_get_json("/upstreams"), *e;
    json_t *r = json_array_get(json_object_get(j, "routes"), 0);
    json_t *eps = json_object_get(json_array_get(json_object_get(r, "upstreams"), 0), "endpoints");
    size_t k, n = 0, len = 0;
    out[0] = '\0';
    json_array_foreach(eps, k, e)
    {
        if (strcmp(json_str(e, "state"), "leaving") != 0)
            continue;
        n++;
        if (len < cap)
            len +=
                (size_t)snprintf(out + len, cap - len, "%s(connections=%lld in_flight=%lld) ",
                                 json_str(e, "address"),
                                 (long long)json_integer_value(json_object_get(e, "connections")),
                                 (long long)json_integer_value(json_object_get(e, "in_flight")));
    }
    json_decref(j);
    return n;
}

static long get(const char *id)
{
    return fx_get_id(id);
}

/* An address leaves the record while the pod behind it keeps idle connections from the proxy
 * and no request passes: they are closed and the endpoint is gone from /upstreams within about
 * a second of the change (the TTL of 1 s and the next lookup: 5 s allowed). With 'reload', the
 * config is reloaded first (the connections were made under the snapshot before). */
static void idle_endpoint_leaves(bool reload)
{
    pods(8);
    size_t all[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    record(all, 8);
    start("", "1");
    for (int i = 0; i < 16; i++) {
        char id[32];
        snprintf(id, sizeof(id), "w-%d", i);
        cr_assert_eq(get(id), 200);
    }
    cr_assert_geq(tup_count(pod[7]), 1);
    cr_assert_geq(tup_open_connections(pod[7]), 1, "no idle connection to the pod that leaves");
    if (reload) {
        struct cfgb *b = cfgb_new();
        cfgb_top(b, "\"resolver\": {\"servers\": [\"%s\"]}", dns->server);
        cfgb_route(b, "r", "\"upstreams\": [\"http://svc.test:%u\"], \"timeout_ms\": 14000", port);
        char *text = cfgb_text(b);
        cfg_write_renamed(px->cfg_path, text);
        free(text);
        /* the file watch reloads it */
        int64_t until = now_ms() + 5000;
        while (fx_metric("retryproxy_config_generation") < 2 && now_ms() < until)
            sleep_ms(20);
        cr_assert_geq(fx_metric("retryproxy_config_generation"), 2, "no reload");
    }
    /* what it had before: the weights (latency as well as failures) need not give each of 8
     * pods exactly 2 of 16 requests on a loaded machine */
    size_t had = tup_count(pod[7]);
    int64_t t0 = now_ms();
    record(all, 7); /* 127.0.0.9 leaves */
    int64_t gone = 0;
    while (!gone && now_ms() - t0 < 5000) {
        json_t *e = endpoint_of(ip(7));
        if (!e)
            gone = now_ms();
        json_decref(e);
        sleep_ms(20);
    }
    cr_assert(gone, "%s still listed 5 s after it left the record: %s", ip(7), state_of(ip(7)));
    cr_expect_eq(tup_wait_open_at_most(pod[7], 0, 2000), 0,
                 "%zu connection(s) to the pod that left still open", tup_open_connections(pod[7]));
    fprintf(stderr, "idle endpoint gone from /upstreams %lld ms after the record changed%s\n",
            (long long)(gone - t0), reload ? " (after a reload)" : "");
    cr_expect_eq(tup_count(pod[7]), had, "a request reached it after it left");
}

Test(endpoints_leave, an_idle_endpoint_that_leaves_is_gone_without_traffic)
{
    idle_endpoint_leaves(false);
}

Test(endpoints_leave, an_idle_endpoint_that_leaves_after_a_reload_is_gone_without_traffic)
{
    idle_endpoint_leaves(true);
}

/* A pod that fails is ejected (for 30 s), its address leaves the record, and a new pod comes
 * back on the same address (Kubernetes reuses pod addresses): the new pod is used at once, its
 * health its own. */
Test(endpoints_leave, a_new_pod_on_an_ejected_address_is_used_at_once)
{
    pods(3);
    size_t all[3] = { 0, 1, 2 };
    record(all, 3);
    tup_set_default_plan(pod[0], "fail=4000000000;status=503");
    start("\"retry\": {\"max_attempts\": 3, \"retry_on\": [\"5xx\"], " CFG_FAST "}, "
          "\"ejection\": {\"consecutive_failures\": 1, \"backoff\": {\"base_ms\": 30000, "
          "\"jitter\": \"none\"}}",
          "1");
    for (int i = 0; i < 6; i++) {
        char id[32];
        snprintf(id, sizeof(id), "e-%d", i);
        cr_assert_eq(get(id), 200);
    }
    cr_assert_str_eq(state_of(ip(0)), "ejected");
    size_t two[2] = { 1, 2 };
    record(two, 2);
    int64_t until = now_ms() + 5000;
    while (now_ms() < until && strcmp(state_of(ip(0)), "ejected") == 0)
        sleep_ms(20);
    cr_assert_neq(strcmp(state_of(ip(0)), "ejected"), 0, "the change was not seen");
    /* the pod is replaced: a new one on the same address and port */
    tup_stop(pod[0]);
    char err[256];
    pod[0] = tup_try_start_at(ip(0), port, NULL, NULL, err, sizeof(err));
    cr_assert_not_null(pod[0], "%s", err);
    int64_t t0 = now_ms();
    record(all, 3);
    int64_t reached = 0;
    for (int i = 0; i < 200 && !reached && now_ms() - t0 < 10000; i++) {
        char id[32];
        snprintf(id, sizeof(id), "n-%d", i);
        cr_assert_eq(get(id), 200);
        if (tup_count_id(pod[0], id))
            reached = now_ms();
        else
            sleep_ms(20);
    }
    cr_assert(reached, "the new pod on %s got no request in 10 s (%s)", ip(0), state_of(ip(0)));
    fprintf(stderr, "new pod on the ejected address reached %lld ms after it joined\n",
            (long long)(reached - t0));
    cr_expect_lt(reached - t0, 5000, "reached after %lld ms", (long long)(reached - t0));
    cr_expect_str_eq(state_of(ip(0)), "healthy");
}

/* The rolling update's load: requests one after another (5 ms apart) from each of a few
 * clients. */
static volatile int stop_traffic;
static _Atomic long failed_requests, sent_requests;

static void *traffic(void *arg)
{
    char url[256];
    px_url(px, "/", url, sizeof(url));
    for (unsigned i = 0; !stop_traffic; i++) {
        char ih[96];
        snprintf(ih, sizeof(ih), "X-Request-Id: t%ld-%u", (long)(intptr_t)arg, i);
        const char *h[] = { ih, NULL };
        struct http_resp r;
        http_do("GET", url, h, NULL, 0, T, &r);
        sent_requests++;
        if (r.rc != 0 || r.status != 200)
            failed_requests++;
        http_free(&r);
        sleep_ms(5);
    }
    return NULL;
}

/* Two processes that spin for at most 'secs' seconds (they die with the test, too). */
static void burn(int secs)
{
    for (size_t i = 0; i < 2; i++) {
        pid_t p = fork();
        cr_assert_geq(p, 0);
        if (p == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close_range(3, ~0U, 0); /* the pods' sockets are not its to keep open */
            alarm((unsigned)secs);
            for (volatile unsigned long x = 0;; x++)
                ;
        }
        burner[i] = p;
    }
}

/* Measured before the fix: 5 of 6 rounds left their endpoint behind (in a cluster one rolling
 * update in seven showed it): six rounds fail the old code all but surely. */
#define ROUNDS 6

/* Rolling updates under CPU load: each round a new pod joins on a fresh address and an old one
 * leaves the record, then goes dark 0.5 s later (connections to it now time out), while four
 * clients send requests without pause. Afterwards every endpoint that left is gone from
 * /upstreams within a few seconds: none stays "leaving" with a connection that no longer exists. */
Test(endpoints_leave, rolling_updates_under_load_leave_no_endpoint_behind)
{
    pods(4);
    size_t live[4] = { 0, 1, 2, 3 }, next = 4;
    record(live, 4);
    start("\"connect_timeout_ms\": 150, "
          "\"retry\": {\"max_attempts\": 4, \"retry_on\": [\"connect-failure\", \"reset\", "
          "\"gateway-error\"], " CFG_FAST "}",
          "2");
    burn(120);
    pthread_t th[4];
    for (intptr_t i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, traffic, (void *)i), 0);
    size_t stuck_rounds = 0;
    char what[512] = "";
    for (int round = 0; round < ROUNDS; round++) {
        size_t slot = (size_t)round % 4, old = live[slot], fresh = next;
        cr_assert_lt(next++, ADDRS);
        char err[256];
        cr_assert_not_null(pod[fresh] =
                               tup_try_start_at(ip(fresh), port, NULL, NULL, err, sizeof(err)),
                           "%s", err);
        live[slot] = fresh;
        record(live, 4);
        sleep_ms(500);
        go_dark(old);
        /* the change seen (TTL 1 s) and the dark pod's attempts timed out */
        sleep_ms(2500);
        /* the endpoint that left this round is gone within 4 s more */
        int64_t until = now_ms() + 4000;
        json_t *e;
        while ((e = endpoint_of(ip(old))) != NULL && now_ms() < until) {
            json_decref(e);
            sleep_ms(50);
        }
        if (e) {
            stuck_rounds++;
            snprintf(what, sizeof(what), "round %d: %s(connections=%lld in_flight=%lld)", round,
                     ip(old), (long long)json_integer_value(json_object_get(e, "connections")),
                     (long long)json_integer_value(json_object_get(e, "in_flight")));
            json_decref(e);
        }
    }
    stop_traffic = 1;
    for (size_t i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    unburn();
    char now_leaving[512];
    size_t n = leaving(now_leaving, sizeof(now_leaving));
    fprintf(stderr, "rolling updates: %d rounds, %ld requests, %ld failed, %zu rounds stuck\n",
            ROUNDS, (long)sent_requests, (long)failed_requests, stuck_rounds);
    cr_expect_eq(stuck_rounds, 0, "%zu of %d rounds left their endpoint leaving 4 s on; last: %s",
                 stuck_rounds, ROUNDS, what);
    cr_expect_eq(n, 0, "still leaving at the end: %s", now_leaving);
}
