/* cpus -- how many CPUs the process may use: the default number of workers (docs/cli.md,
 * "How many workers").
 *
 * A container's CPU limit is a cgroup quota, not a smaller CPU count: a 50m-CPU sidecar on a
 * 64-core node sees 64 CPUs in sysconf() and in its affinity mask. As Go's runtime (GOMAXPROCS
 * since Go 1.25) and the JVM (-XX:ActiveProcessorCount) do, the quota is read and the count is
 * min(CPUs in the affinity mask, ceil(quota / period)), at least 1:
 *
 * - cgroup v2 (ROOT/cgroup.controllers exists): "QUOTA PERIOD" or "max PERIOD" in cpu.max;
 * - cgroup v1: cpu.cfs_quota_us (-1: none) and cpu.cfs_period_us under ROOT/CONTROLLERS (the
 *   hierarchy's controller list, "cpu,cpuacct"), or ROOT/cpu.
 *
 * The directory is the process's cgroup of /proc/self/cgroup under ROOT, and each of its
 * parents up to ROOT: the lowest limit of any of them applies, and a directory that is not
 * there is passed over (a container whose own cgroup is mounted at ROOT, without a cgroup
 * namespace, sees its path from the host's root). ROOT is /sys/fs/cgroup; the hidden option
 * --cgroup-root-for-tests of the command line names another (docs/testing.md).
 *
 * The cpus_parse_* functions read the text of one file and do no I/O (tests/unit/test_cpus.c).
 */
#ifndef RETRYPROXY_PROXY_BASE_CPUS_H
#define RETRYPROXY_PROXY_BASE_CPUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CPUS_ROOT "/sys/fs/cgroup"

/* A quota: 'quota' microseconds of CPU time per 'period'. */
struct cpus_quota {
    uint64_t quota, period;
};

/* cgroup v2's cpu.max: "QUOTA PERIOD" (1 and the quota set), "max PERIOD" or "max" (0: no
 * limit), anything else -1. */
int cpus_parse_cpu_max(const char *text, struct cpus_quota *q);
/* cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us: 1 with the quota set, 0 for a quota of
 * -1 (no limit), -1 for text that is no such number (or a period of 0). */
int cpus_parse_cfs(const char *quota_text, const char *period_text, struct cpus_quota *q);
/* The cgroup path of /proc/self/cgroup's text 'text' ("ID:CONTROLLERS:PATH" lines): for v2
 * ('controller' NULL) the "0::PATH" line's, else the line whose controller list names
 * 'controller' ("cpu" in "cpu,cpuacct"), whose list is copied to 'list' (cap 'list_cap').
 * 0 with the path copied to 'path' (cap 'cap'), -1 when no line fits or it does not fit. */
int cpus_cgroup_path(const char *text, const char *controller, char *path, size_t cap, char *list,
                     size_t list_cap);
/* The CPUs a quota allows: ceil(quota / period), at least 1. */
unsigned cpus_of_quota(const struct cpus_quota *q);

/* The lowest quota (in CPUs) of directory 'base' + 'path' ("/" or "/a/b", as /proc/self/cgroup
 * names it) and of each of its parents up to 'base', from cpu.max ('v2') or the cfs files: 1
 * with it in *q, 0 when none has one (a directory not there, a file unreadable or malformed,
 * sets none). */
int cpus_lowest_quota(const char *base, const char *path, bool v2, struct cpus_quota *q);

/* How many CPUs, and what said so. */
struct cpus {
    unsigned n;       /* at least 1 */
    unsigned online;  /* CPUs in the affinity mask */
    bool limited;     /* a cgroup quota set 'n' */
    char source[160]; /* "cpus", "cgroup cpu.max 50000/100000", "cpus; cgroup ... allows 4" */
};

/* The CPUs of this process with cgroup root 'root' (NULL: CPUS_ROOT). */
void cpus_detect(const char *root, struct cpus *out);

#endif
