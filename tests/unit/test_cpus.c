/* The CPU quota of a cgroup, read as the kernel writes it (proxy/base/cpus.h): cgroup v2's
 * cpu.max, v1's cpu.cfs_quota_us and cpu.cfs_period_us, and the process's cgroup path in
 * /proc/self/cgroup, from text alone; then the lowest quota along a nested path, in a
 * directory tree of the test's own. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "proxy/base/cpus.h"
#include "tests/support/proc.h"

Test(cpus, cpu_max_with_a_quota_allows_its_ceiling)
{
    struct cpus_quota q;
    cr_assert_eq(cpus_parse_cpu_max("50000 100000\n", &q), 1);
    cr_expect_eq(q.quota, 50000);
    cr_expect_eq(q.period, 100000);
    cr_expect_eq(cpus_of_quota(&q), 1);
    cr_assert_eq(cpus_parse_cpu_max("150000 100000", &q), 1);
    cr_expect_eq(cpus_of_quota(&q), 2); /* 1.5 CPUs: rounded up */
    cr_assert_eq(cpus_parse_cpu_max("200000 100000\n", &q), 1);
    cr_expect_eq(cpus_of_quota(&q), 2);
    cr_assert_eq(cpus_parse_cpu_max("1000 1000000\n", &q), 1); /* 1m CPU */
    cr_expect_eq(cpus_of_quota(&q), 1);
}

Test(cpus, cpu_max_of_max_is_no_limit)
{
    struct cpus_quota q = { 7, 7 };
    cr_expect_eq(cpus_parse_cpu_max("max 100000\n", &q), 0);
    cr_expect_eq(cpus_parse_cpu_max("max", &q), 0);
    cr_expect_eq(q.quota, 7, "a file without a limit leaves the quota alone");
}

Test(cpus, malformed_cpu_max_is_refused)
{
    static const char *const bad[] = { "",
                                       "\n",
                                       "50000",
                                       "50000\n",
                                       "50000 0\n",
                                       "0 100000\n",
                                       "-1 100000\n",
                                       "50000  100000\n",
                                       "50000 100000 7\n",
                                       "5e4 100000\n",
                                       "maximum 100000\n",
                                       "max 0\n",
                                       "50000 100000\n\n",
                                       "99999999999999999999999 100000\n" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct cpus_quota q;
        cr_expect_eq(cpus_parse_cpu_max(bad[i], &q), -1, "'%s' was taken", bad[i]);
    }
}

Test(cpus, cfs_quota_and_period)
{
    struct cpus_quota q;
    cr_assert_eq(cpus_parse_cfs("250000\n", "100000\n", &q), 1);
    cr_expect_eq(cpus_of_quota(&q), 3);
    cr_expect_eq(cpus_parse_cfs("-1\n", "100000\n", &q), 0);
    cr_expect_eq(cpus_parse_cfs("-1", "100000", &q), 0);
    cr_expect_eq(cpus_parse_cfs("50000\n", "0\n", &q), -1);
    cr_expect_eq(cpus_parse_cfs("50000\n", "\n", &q), -1);
    cr_expect_eq(cpus_parse_cfs("-2\n", "100000\n", &q), -1);
    cr_expect_eq(cpus_parse_cfs("0\n", "100000\n", &q), -1);
    cr_expect_eq(cpus_parse_cfs("abc\n", "100000\n", &q), -1);
    cr_expect_eq(cpus_parse_cfs("-1\n", "x\n", &q), -1, "a bad period is bad, quota or not");
}

Test(cpus, v2_path_of_proc_self_cgroup)
{
    char path[128];
    cr_assert_eq(cpus_cgroup_path("0::/\n", NULL, path, sizeof(path), NULL, 0), 0);
    cr_expect_str_eq(path, "/");
    /* a Kubernetes pod's container, nested, on a hybrid host with v1 lines first */
    const char *text = "12:cpu,cpuacct:/kubepods/pod1/c1\n"
                       "1:name=systemd:/kubepods/pod1/c1\n"
                       "0::/kubepods.slice/kubepods-burstable.slice/cri-containerd-ab.scope\n";
    cr_assert_eq(cpus_cgroup_path(text, NULL, path, sizeof(path), NULL, 0), 0);
    cr_expect_str_eq(path, "/kubepods.slice/kubepods-burstable.slice/cri-containerd-ab.scope");
    cr_expect_eq(cpus_cgroup_path("1:cpu:/a\n", NULL, path, sizeof(path), NULL, 0), -1,
                 "no v2 line");
    cr_expect_eq(cpus_cgroup_path("0::relative\n", NULL, path, sizeof(path), NULL, 0), -1);
    cr_expect_eq(cpus_cgroup_path("garbage", NULL, path, sizeof(path), NULL, 0), -1);
    cr_expect_eq(cpus_cgroup_path("0::/a/long/path\n", NULL, path, 8, NULL, 0), -1,
                 "a path that does not fit is not cut");
}

Test(cpus, v1_path_names_the_cpu_controller)
{
    char path[128], list[32];
    const char *text = "11:cpuset:/x\n"
                       "4:cpuacct,cpu:/docker/abc\n"
                       "0::/\n";
    cr_assert_eq(cpus_cgroup_path(text, "cpu", path, sizeof(path), list, sizeof(list)), 0);
    cr_expect_str_eq(path, "/docker/abc");
    cr_expect_str_eq(list, "cpuacct,cpu");
    cr_expect_eq(cpus_cgroup_path("11:cpuset:/x\n", "cpu", path, sizeof(path), list, sizeof(list)),
                 -1, "cpuset is not cpu");
}

/* ---- along a path, in a tree of the test's ---- */

static char root[64];

static void tree_init(void)
{
    snprintf(root, sizeof(root), "/tmp/retryproxy-cpus-XXXXXX");
    cr_assert_not_null(mkdtemp(root));
}

static void tree_fini(void)
{
    rm_tree(root);
}

/* File root/'dir'/'name' holds 'text', its directories made. */
static void put(const char *dir, const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof(path), "%s", root);
    for (const char *p = dir; *p;) {
        const char *next = strchr(p + 1, '/');
        size_t n = next ? (size_t)(next - p) : strlen(p);
        snprintf(path + strlen(path), sizeof(path) - strlen(path), "%.*s", (int)n, p);
        mkdir(path, 0700);
        p += n;
    }
    snprintf(path + strlen(path), sizeof(path) - strlen(path), "/%s", name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

Test(cpus_tree, the_lowest_limit_on_the_way_up_applies, .init = tree_init, .fini = tree_fini)
{
    put("/kubepods/pod1/c1", "cpu.max", "max 100000\n");
    put("/kubepods/pod1", "cpu.max", "50000 100000\n"); /* the pod's limit */
    put("/kubepods", "cpu.max", "400000 100000\n");
    struct cpus_quota q;
    cr_assert_eq(cpus_lowest_quota(root, "/kubepods/pod1/c1", true, &q), 1);
    cr_expect_eq(q.quota, 50000);
    put("/kubepods/pod1/c1", "cpu.max", "20000 100000\n"); /* the container's, lower */
    cr_assert_eq(cpus_lowest_quota(root, "/kubepods/pod1/c1", true, &q), 1);
    cr_expect_eq(q.quota, 20000);
    cr_assert_eq(cpus_lowest_quota(root, "/kubepods", true, &q), 1, "no look down");
    cr_expect_eq(q.quota, 400000);
}

/* A container without a cgroup namespace sees the host's path, its own cgroup at the root. */
Test(cpus_tree, a_path_not_under_the_root_reads_the_root, .init = tree_init, .fini = tree_fini)
{
    put("", "cpu.max", "150000 100000\n");
    struct cpus_quota q;
    cr_assert_eq(cpus_lowest_quota(root, "/system.slice/docker-ab.scope", true, &q), 1);
    cr_expect_eq(cpus_of_quota(&q), 2);
    cr_assert_eq(cpus_lowest_quota(root, "/", true, &q), 1);
    cr_expect_eq(q.quota, 150000);
}

Test(cpus_tree, no_limit_anywhere_is_none, .init = tree_init, .fini = tree_fini)
{
    put("", "cpu.max", "max 100000\n");
    put("/a", "cpu.max", "garbage\n");
    struct cpus_quota q;
    cr_expect_eq(cpus_lowest_quota(root, "/a/b", true, &q), 0);
}

Test(cpus_tree, v1_reads_the_cfs_files, .init = tree_init, .fini = tree_fini)
{
    put("", "cpu.cfs_quota_us", "-1\n");
    put("", "cpu.cfs_period_us", "100000\n");
    put("/docker/abc", "cpu.cfs_quota_us", "250000\n");
    put("/docker/abc", "cpu.cfs_period_us", "100000\n");
    struct cpus_quota q;
    cr_assert_eq(cpus_lowest_quota(root, "/docker/abc", false, &q), 1);
    cr_expect_eq(cpus_of_quota(&q), 3);
    cr_expect_eq(cpus_lowest_quota(root, "/", false, &q), 0);
}
