#include "proxy/base/cpus.h"

#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A whole decimal number from *p on (no sign); advances *p. -1 if there is none or it is out
 * of range. */
static int parse_u64(const char **p, uint64_t *out)
{
    const char *s = *p;
    uint64_t v = 0;
    if (*s < '0' || *s > '9')
        return -1;
    for (; *s >= '0' && *s <= '9'; s++) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *p = s;
    *out = v;
    return 0;
}

/* The rest of a one-line file: nothing, or its newline. */
static bool at_end(const char *p)
{
    return p[0] == '\0' || (p[0] == '\n' && p[1] == '\0');
}

int cpus_parse_cpu_max(const char *text, struct cpus_quota *q)
{
    const char *p = text;
    bool max = strncmp(p, "max", 3) == 0;
    uint64_t quota = 0, period;
    if (max)
        p += 3;
    else if (parse_u64(&p, &quota) < 0)
        return -1;
    if (max && at_end(p))
        return 0; /* "max" alone: the period is left at its default */
    if (*p++ != ' ' || parse_u64(&p, &period) < 0 || !at_end(p) || period == 0)
        return -1;
    if (max)
        return 0;
    if (quota == 0)
        return -1;
    *q = (struct cpus_quota){ quota, period };
    return 1;
}

int cpus_parse_cfs(const char *quota_text, const char *period_text, struct cpus_quota *q)
{
    const char *p = period_text;
    uint64_t quota, period;
    if (parse_u64(&p, &period) < 0 || !at_end(p) || period == 0)
        return -1;
    if (strcmp(quota_text, "-1") == 0 || strcmp(quota_text, "-1\n") == 0)
        return 0;
    p = quota_text;
    if (parse_u64(&p, &quota) < 0 || !at_end(p) || quota == 0)
        return -1;
    *q = (struct cpus_quota){ quota, period };
    return 1;
}

/* Whether the comma-separated list [s, s+n) names 'name'. */
static bool list_names(const char *s, size_t n, const char *name)
{
    size_t nl = strlen(name);
    for (const char *end = s + n; s < end;) {
        const char *comma = memchr(s, ',', (size_t)(end - s));
        size_t len = comma ? (size_t)(comma - s) : (size_t)(end - s);
        if (len == nl && strncmp(s, name, nl) == 0)
            return true;
        s += len + 1;
    }
    return false;
}

int cpus_cgroup_path(const char *text, const char *controller, char *path, size_t cap, char *list,
                     size_t list_cap)
{
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        const char *c1 = memchr(line, ':', len);
        const char *c2 = c1 ? memchr(c1 + 1, ':', len - (size_t)(c1 + 1 - line)) : NULL;
        if (c2) {
            const char *ctl = c1 + 1, *p = c2 + 1;
            size_t ctl_len = (size_t)(c2 - ctl), plen = len - (size_t)(p - line);
            bool fits = controller ? ctl_len > 0 && list_names(ctl, ctl_len, controller)
                                   : c1 - line == 1 && line[0] == '0' && ctl_len == 0;
            if (fits) {
                if (plen == 0 || p[0] != '/' || plen >= cap || (list && ctl_len >= list_cap))
                    return -1;
                snprintf(path, cap, "%.*s", (int)plen, p);
                if (list)
                    snprintf(list, list_cap, "%.*s", (int)ctl_len, ctl);
                return 0;
            }
        }
        line += len + (nl ? 1 : 0);
    }
    return -1;
}

unsigned cpus_of_quota(const struct cpus_quota *q)
{
    uint64_t n = q->quota / q->period + (q->quota % q->period != 0);
    return n == 0 ? 1 : n > UINT_MAX ? UINT_MAX : (unsigned)n;
}

/* ---- reading the files ---- */

/* The text of a small file (a line of cpu.max, /proc/self/cgroup), cut at cap-1 bytes; -1 if it
 * cannot be read. */
static int read_text(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t got = 0;
    ssize_t n;
    while (got + 1 < cap && (n = read(fd, buf + got, cap - 1 - got)) > 0)
        got += (size_t)n;
    close(fd);
    buf[got] = '\0';
    return 0;
}

/* The quota in directory 'dir' of a v2 (cpu.max) or v1 (cfs) hierarchy: as the parsers say, -1
 * also when a file is missing. */
static int quota_in(const char *dir, bool v2, struct cpus_quota *q)
{
    char path[PATH_MAX + 32], a[64], b[64];
    snprintf(path, sizeof(path), "%s/%s", dir, v2 ? "cpu.max" : "cpu.cfs_quota_us");
    if (read_text(path, a, sizeof(a)) < 0)
        return -1;
    if (v2)
        return cpus_parse_cpu_max(a, q);
    snprintf(path, sizeof(path), "%s/cpu.cfs_period_us", dir);
    if (read_text(path, b, sizeof(b)) < 0)
        return -1;
    return cpus_parse_cfs(a, b, q);
}

int cpus_lowest_quota(const char *base, const char *path, bool v2, struct cpus_quota *q)
{
    char dir[PATH_MAX];
    int found = 0;
    if (snprintf(dir, sizeof(dir), "%s%s", base, strcmp(path, "/") ? path : "") >= (int)sizeof(dir))
        snprintf(dir, sizeof(dir), "%s", base); /* too long to be there: the root alone */
    size_t base_len = strlen(base);
    for (;;) {
        struct cpus_quota here;
        if (quota_in(dir, v2, &here) == 1 && (!found || cpus_of_quota(&here) < cpus_of_quota(q))) {
            *q = here;
            found = 1;
        }
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= base_len || !slash || (size_t)(slash - dir) < base_len)
            break;
        *slash = '\0';
    }
    return found;
}

void cpus_detect(const char *root, struct cpus *out)
{
    if (!root)
        root = CPUS_ROOT;
    cpu_set_t set;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        online = CPU_COUNT(&set);
    *out = (struct cpus){ .online = online > 0 ? (unsigned)online : 1 };
    out->n = out->online;
    snprintf(out->source, sizeof(out->source), "cpus");

    char text[4096], path[PATH_MAX], list[128] = "cpu", base[PATH_MAX];
    snprintf(base, sizeof(base), "%s/cgroup.controllers", root);
    bool v2 = access(base, F_OK) == 0;
    if (read_text("/proc/self/cgroup", text, sizeof(text)) < 0 ||
        cpus_cgroup_path(text, v2 ? NULL : "cpu", path, sizeof(path), v2 ? NULL : list,
                         sizeof(list)) < 0)
        snprintf(path, sizeof(path), "/"); /* the root's own limit, if any */
    struct cpus_quota q;
    int found;
    if (v2) {
        found = cpus_lowest_quota(root, path, true, &q);
    } else {
        snprintf(base, sizeof(base), "%s/%s", root, list);
        if (access(base, F_OK) != 0)
            snprintf(base, sizeof(base), "%s/cpu", root);
        found = cpus_lowest_quota(base, path, false, &q);
    }
    if (!found)
        return;
    unsigned n = cpus_of_quota(&q);
    const char *file = v2 ? "cpu.max" : "cpu.cfs_quota_us";
    if (n < out->n) {
        out->n = n;
        out->limited = true;
        snprintf(out->source, sizeof(out->source), "cgroup %s %llu/%llu", file,
                 (unsigned long long)q.quota, (unsigned long long)q.period);
    } else {
        snprintf(out->source, sizeof(out->source), "cpus; cgroup %s %llu/%llu allows %u", file,
                 (unsigned long long)q.quota, (unsigned long long)q.period, n);
    }
}
