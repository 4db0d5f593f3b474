/* The default number of workers follows the process's CPU quota (docs/cli.md, "How many
 * workers"): the binary run with a cgroup root of the test's own (the hidden option
 * --cgroup-root-for-tests, docs/testing.md), as cgroup v2 and v1 lay it out, says how many
 * workers it starts and why, in `check --print` and in its start line, and starts that many. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/support/harness.h"
#include "tests/support/proc.h"

#define CONFIG "tests/data/config/valid/minimal.json"

static char root[64];

static void setup(void)
{
    /* make tsan's forced --workers would hide the default */
    unsetenv("RETRYPROXY_TEST_WORKERS");
    snprintf(root, sizeof(root), "/tmp/retryproxy-cgroup-XXXXXX");
    cr_assert_not_null(mkdtemp(root));
}

static void teardown(void)
{
    rm_tree(root);
}

TestSuite(workers, .init = setup, .fini = teardown, .timeout = 60);

/* File 'name' under the root holds 'text' (its directory made). */
static void put(const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", root, name);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    mkdir(path, 0700);
    *slash = '/';
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

/* `check --print` with the root: its stderr line, "retryproxy: workers: N (SOURCE)". */
static void expect_check(const char *line)
{
    char *argv[] = { (char *)proc_bin(),        "check", "-c", CONFIG, "--print",
                     "--cgroup-root-for-tests", root,    NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 10000, &r), 0);
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.err, line), "check --print said: %s (wanted %s)", r.err, line);
    cr_expect_eq(r.out[0], '{', "stdout is the config alone");
    proc_result_free(&r);
}

/* The proxy started with the root, and "--workers 'option'" unless it is NULL: its start line
 * holds 'line', its listening event the number of workers. */
static void expect_run(const char *line, int workers, const char *option)
{
    const char *args[] = { "-c",
                           CONFIG,
                           "--listen",
                           "127.0.0.1:0",
                           "--admin",
                           "127.0.0.1:0",
                           "--cgroup-root-for-tests",
                           root,
                           option ? "--workers" : NULL,
                           option,
                           NULL };
    struct px *p = px_start_argv(args);
    char *err = px_stderr(p);
    cr_expect(strstr(err, line), "the start line: %s (wanted %s)", err, line);
    free(err);
    char want[32];
    snprintf(want, sizeof(want), "\"workers\":%d,", workers);
    char *out = px_stdout_holding(p, "\"listening\"", 10000);
    cr_expect(strstr(out, want), "the listening event: %s (wanted %s)", out, want);
    free(out);
    px_stop_clean(p);
}

Test(workers, a_v2_quota_of_half_a_cpu_starts_one_worker)
{
    put("cgroup.controllers", "cpu memory\n");
    put("cpu.max", "50000 100000\n");
    expect_check("retryproxy: workers: 1 (cgroup cpu.max 50000/100000)\n");
    expect_run("(1 worker: cgroup cpu.max 50000/100000)", 1, NULL);
}

/* The lowest limit on the way up applies: the process's own cgroup is not under the test's
 * root (its path there is passed over), a parent of it would be. */
Test(workers, a_v2_root_without_a_limit_is_the_cpu_count)
{
    put("cgroup.controllers", "cpu\n");
    put("cpu.max", "max 100000\n");
    expect_check("retryproxy: workers: ");
    expect_check(" (cpus)\n");
}

Test(workers, a_v1_quota_is_read_from_the_cpu_hierarchy)
{
    put("cpu/cpu.cfs_quota_us", "50000\n");
    put("cpu/cpu.cfs_period_us", "100000\n");
    expect_check("retryproxy: workers: 1 (cgroup cpu.cfs_quota_us 50000/100000)\n");
    expect_run("(1 worker: cgroup cpu.cfs_quota_us 50000/100000)", 1, NULL);
}

Test(workers, a_malformed_quota_leaves_the_cpu_count)
{
    put("cgroup.controllers", "cpu\n");
    put("cpu.max", "half a cpu\n");
    expect_check(" (cpus)\n");
}

Test(workers, the_workers_option_wins_over_the_quota)
{
    put("cgroup.controllers", "cpu\n");
    put("cpu.max", "50000 100000\n");
    expect_run("(2 workers: --workers)", 2, "2");
}
