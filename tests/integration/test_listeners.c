/* One process per address (README: exit 3, "cannot bind a listener"): a second retryproxy
 * started on the proxy or admin address of a running one fails at once with one stderr line
 * naming the address, while the first keeps serving every request; the workers of one process
 * still share one port, the one the kernel picked for port 0 included. The real binary, on
 * 127.0.0.1.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "tests/support/fixture.h"

#define MINIMAL "tests/data/config/valid/minimal.json"
#define IN_USE  "address already in use by another process"

TestSuite(listeners, .fini = fx_stop, .timeout = 60);

/* The first instance: two workers, route "r" to a test upstream. */
static void start_first(void)
{
    fx_start_r("", "", "--workers", "2", NULL);
}

/* Runs a second retryproxy on the first one's config with 'listen' and 'admin'; it must not
 * keep running (a second instance that starts would serve until killed after 20 s: one that
 * exits does so at once, but a busy machine took more than 5 s to start it). */
static struct proc_result second(const char *listen, const char *admin)
{
    char *argv[] = { (char *)proc_bin(), "-c",          px->cfg_path, "--listen", (char *)listen,
                     "--admin",          (char *)admin, "--workers",  "2",        NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 20000, &r), 0, "cannot run %s", argv[0]);
    cr_assert_neq(r.status, -1,
                  "a second retryproxy on %s / %s started and served (killed after 20 s); "
                  "stderr:\n%s",
                  listen, admin, r.err);
    return r;
}

/* The first instance answers every one of 'n' requests on new connections, proxied and
 * admin alike: none went to a process that has gone. */
static void first_keeps_serving(int n)
{
    char url[128];
    for (int i = 0; i < n; i++) {
        struct http_resp r;
        http_do("GET", px_url(px, "/x", url, sizeof(url)), NULL, NULL, 0, 5000, &r);
        cr_expect_eq(r.rc, 0, "request %d: curl error %d", i, r.rc);
        cr_expect_eq(r.status, 200, "request %d: status %ld", i, r.status);
        http_free(&r);
        http_do("GET", px_admin_url(px, "/healthz", url, sizeof(url)), NULL, NULL, 0, 5000, &r);
        cr_expect_eq(r.rc, 0, "healthz %d: curl error %d", i, r.rc);
        cr_expect_eq(r.status, 200, "healthz %d: status %ld", i, r.status);
        http_free(&r);
    }
}

Test(listeners, second_instance_on_the_same_listen_address_exits_three)
{
    start_first();
    char addr[32], want[160];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", px->port);
    struct proc_result r = second(addr, "127.0.0.1:0");
    cr_expect_eq(r.status, 3, "exit %d, stderr:\n%s", r.status, r.err);
    snprintf(want, sizeof(want), "retryproxy: cannot listen on %s: " IN_USE "\n", addr);
    cr_expect_str_eq(r.err, want);
    proc_result_free(&r);

    /* the wildcard address overlaps 127.0.0.1: it would take its clients too */
    snprintf(addr, sizeof(addr), "0.0.0.0:%u", px->port);
    r = second(addr, "127.0.0.1:0");
    cr_expect_eq(r.status, 3, "exit %d, stderr:\n%s", r.status, r.err);
    snprintf(want, sizeof(want), "retryproxy: cannot listen on %s: " IN_USE "\n", addr);
    cr_expect_str_eq(r.err, want);
    proc_result_free(&r);

    first_keeps_serving(20);
}

Test(listeners, second_instance_on_the_same_admin_address_exits_three)
{
    start_first();
    char addr[32], want[160];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", px->admin_port);
    struct proc_result r = second("127.0.0.1:0", addr);
    cr_expect_eq(r.status, 3, "exit %d, stderr:\n%s", r.status, r.err);
    snprintf(want, sizeof(want), "retryproxy: admin: cannot listen on %s: " IN_USE "\n", addr);
    cr_expect_str_eq(r.err, want);
    proc_result_free(&r);

    first_keeps_serving(20);
}

/* Before, the admin listener joined the proxy's SO_REUSEPORT group and took a share of its
 * clients; now the start stops, and the line says the other listener is this process's. */
Test(listeners, listen_and_admin_on_one_address_exits_three)
{
    start_first(); /* only to learn a port that is free once it has stopped */
    char addr[32], want[160];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", px->port);
    cr_assert_eq(px_stop(px, 10000), 0);
    px = NULL;
    char *argv[] = { (char *)proc_bin(), "-c", MINIMAL, "--listen", addr, "--admin", addr, NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 20000, &r), 0);
    cr_expect_eq(r.status, 3, "exit %d, stderr:\n%s", r.status, r.err);
    snprintf(want, sizeof(want),
             "retryproxy: admin: cannot listen on %s: address already in use by this process's "
             "other listener\n",
             addr);
    cr_expect_str_eq(r.err, want);
    proc_result_free(&r);
}

/* Listening sockets on 127.0.0.1:'port' in /proc/net/tcp. */
static int listeners_on(unsigned port)
{
    FILE *f = fopen("/proc/net/tcp", "r");
    cr_assert_not_null(f);
    char line[512], want[32];
    snprintf(want, sizeof(want), "0100007F:%04X", port); /* 127.0.0.1, as a little-endian word */
    int n = 0;
    while (fgets(line, sizeof(line), f)) {
        char local[64];
        unsigned state;
        if (sscanf(line, " %*s %63s %*s %x", local, &state) == 2 && state == 0x0A &&
            strcmp(local, want) == 0)
            n++;
    }
    fclose(f);
    return n;
}

Test(listeners, workers_on_port_0_share_the_one_port_the_kernel_picked)
{
    start_first();
    char *err = px_stderr(px);
    cr_expect(strstr(err, "(2 workers: --workers)"), "%s", err);
    free(err);
    cr_expect_eq(listeners_on(px->port), 2, "one listening socket per worker on port %u", px->port);
    cr_expect_eq(listeners_on(px->admin_port), 1);
    first_keeps_serving(20);
}

/* A restart on a fixed port: the stopped instance's connections, some now in TIME_WAIT, do not
 * count as another process. */
Test(listeners, restart_on_the_same_ports_after_a_clean_stop_works)
{
    start_first();
    first_keeps_serving(5);
    unsigned port = px->port, admin_port = px->admin_port;
    cr_assert_eq(px_stop(px, 10000), 0);
    px = NULL;

    char listen[32], admin[32];
    snprintf(listen, sizeof(listen), "127.0.0.1:%u", port);
    snprintf(admin, sizeof(admin), "127.0.0.1:%u", admin_port);
    const char *args[] = { "-c",  MINIMAL,     "--listen", listen, "--admin",
                           admin, "--workers", "2",        NULL };
    px = px_start_argv(args);
    cr_expect_eq(px->port, port);
    cr_expect_eq(px->admin_port, admin_port);
}

/* The process's CPU time so far (user and system), in ms. */
static long cpu_ms(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    unsigned long ut = 0, st = 0;
    /* after "(comm)": state and 10 more fields, then utime and stime */
    const char *p = strrchr(buf, ')');
    cr_assert(p &&
              sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2);
    return (long)((ut + st) * 1000 / (unsigned long)sysconf(_SC_CLK_TCK));
}

/* Out of descriptors with connections waiting in the backlog, the acceptor pauses (and says
 * so in the log) instead of failing accept() thousands of times a second; once connections
 * close, new ones are served. */
Test(listeners, out_of_descriptors_pauses_accepting_instead_of_spinning)
{
    fx_start_r("", "", "--workers", "1", NULL);
    struct rlimit rl = { 48, 48 };
    cr_assert_eq(prlimit(px->pid, RLIMIT_NOFILE, &rl, NULL), 0, "prlimit: %s", strerror(errno));
    int fds[60];
    for (int i = 0; i < 60; i++)
        fds[i] = raw_dial(px->port);
    usleep(300 * 1000);
    long c0 = cpu_ms(px->pid);
    usleep(2000 * 1000);
    long used = cpu_ms(px->pid) - c0;
    /* spinning, it took about 2,000 ms of the 2,000 */
    cr_expect_lt(used, 600, "the proxy used %ld ms of CPU in 2 s out of descriptors", used);
    char log[1 << 16] = "";
    FILE *f = fopen(px->out_path, "r");
    cr_assert_not_null(f);
    log[fread(log, 1, sizeof(log) - 1, f)] = '\0';
    fclose(f);
    cr_expect_not_null(strstr(log, "accepting paused"), "no log line: %.2000s", log);
    for (int i = 0; i < 60; i++)
        close(fds[i]);
    char url[128];
    struct http_resp r = { 0 };
    for (int i = 0; i < 50 && r.status != 200; i++) {
        if (i)
            http_free(&r), usleep(100 * 1000);
        http_do("GET", px_url(px, "/x", url, sizeof(url)), NULL, NULL, 0, 5000, &r);
    }
    cr_expect_eq(r.status, 200, "not served after the connections closed: %d %ld", r.rc, r.status);
    http_free(&r);
}
