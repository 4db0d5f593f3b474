/* fuzz_cpus: the cgroup file parsers of proxy/base/cpus.h (the default number of workers,
 * docs/cli.md "How many workers") against references written another way.
 *
 * Input: a byte choosing the parser and the capacities, then the file text (cut at the first NUL;
 * for cpus_parse_cfs, the quota file's text, a NUL, then the period file's).
 *
 * - cpus_parse_cpu_max and cpus_parse_cfs give the answer of a reference that reads the numbers
 *   with strspn and strtoull (a quota and a period of digits whose value fits 64 bits, one
 *   space between them, an optional final newline), and a quota it accepts gives
 *   cpus_of_quota() = ceil(quota / period), at least 1;
 * - cpus_cgroup_path's path is a whole line's third field, begins with '/', fits its buffer
 *   (exactly that large, so a write past it is an ASan report), and its controller list names
 *   the controller asked for (v2: the line is "0::PATH").
 */
/* fuzz-link: proxy/base/cpus.c */
#define FUZZ_NAME "fuzz_cpus"
#include "tests/fuzz/fuzz.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>

#include "proxy/base/cpus.h"

/* A run of digits whose value fits 64 bits (leading zeros allowed); advances *s past it. */
static bool ref_number(const char **s, uint64_t *v)
{
    size_t n = strspn(*s, "0123456789");
    if (n == 0)
        return false;
    char *digits = strndup(*s, n);
    if (!digits)
        abort();
    errno = 0;
    unsigned long long x = strtoull(digits, NULL, 10);
    bool fits = errno != ERANGE;
    free(digits);
    if (!fits)
        return false;
    *v = x;
    *s += n;
    return true;
}

static bool ref_end(const char *s)
{
    return strcmp(s, "") == 0 || strcmp(s, "\n") == 0;
}

/* cpu.max: "max", "max PERIOD" (0), "QUOTA PERIOD" with both above 0 (1), else -1. */
static int ref_cpu_max(const char *text, uint64_t *quota, uint64_t *period)
{
    const char *s = text;
    bool max = strncmp(s, "max", 3) == 0;
    if (max && ref_end(s + 3))
        return 0;
    if (max)
        s += 3;
    else if (!ref_number(&s, quota))
        return -1;
    if (*s != ' ')
        return -1;
    s++;
    if (!ref_number(&s, period) || !ref_end(s) || *period == 0)
        return -1;
    if (max)
        return 0;
    return *quota == 0 ? -1 : 1;
}

/* cpu.cfs_quota_us and cpu.cfs_period_us: a period above 0; a quota of "-1" (0) or above 0. */
static int ref_cfs(const char *qt, const char *pt, uint64_t *quota, uint64_t *period)
{
    const char *s = pt;
    if (!ref_number(&s, period) || !ref_end(s) || *period == 0)
        return -1;
    if (strcmp(qt, "-1") == 0 || strcmp(qt, "-1\n") == 0)
        return 0;
    s = qt;
    if (!ref_number(&s, quota) || !ref_end(s) || *quota == 0)
        return -1;
    return 1;
}

static void check_quota(const struct cpus_quota *q)
{
    uint64_t want = q->quota / q->period + (q->quota % q->period ? 1 : 0);
    unsigned n = cpus_of_quota(q);
    FUZZ_CHECK(n >= 1, "no CPU");
    if (want >= 1 && want <= UINT32_MAX)
        FUZZ_CHECK(n == want, "%" PRIu64 "/%" PRIu64 ": %u CPUs, want %" PRIu64, q->quota,
                   q->period, n, want);
}

/* Whether some line of 'text' is "ID:LIST:PATH" with 'list' and 'path' as given, and the list
 * names 'controller' (v2, NULL: the line is "0::PATH"). */
static bool ref_line(const char *text, const char *controller, const char *list, const char *path)
{
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        char *copy = strndup(line, len);
        if (!copy)
            abort();
        char *c1 = strchr(copy, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        bool ok = false;
        if (c2) {
            *c1 = *c2 = '\0';
            const char *l = c1 + 1, *p = c2 + 1;
            if (controller) {
                char padded[512], want[80];
                snprintf(padded, sizeof(padded), ",%s,", l);
                snprintf(want, sizeof(want), ",%s,", controller);
                ok = strstr(padded, want) && list && strcmp(l, list) == 0;
            } else {
                ok = strcmp(copy, "0") == 0 && l[0] == '\0';
            }
            ok = ok && strcmp(p, path) == 0;
        }
        free(copy);
        if (ok)
            return true;
        line += len + (nl ? 1 : 0);
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = { data, size };
    uint8_t how = fuzz_byte(&in);
    size_t len = 0;
    char *a = fuzz_piece(&in, 0, &len);
    char *b = fuzz_piece(&in, 0, &len);
    const char *text = a ? a : "";
    struct cpus_quota q = { 0, 0 };
    uint64_t rq = 0, rp = 0;
    switch (how % 4) {
    case 0: {
        int rc = cpus_parse_cpu_max(text, &q), want = ref_cpu_max(text, &rq, &rp);
        FUZZ_CHECK(rc == want, "cpu.max \"%s\": %d, want %d", text, rc, want);
        if (rc == 1) {
            FUZZ_CHECK(q.quota == rq && q.period == rp, "cpu.max \"%s\": the numbers", text);
            check_quota(&q);
        }
        break;
    }
    case 1: {
        const char *pt = b ? b : "";
        int rc = cpus_parse_cfs(text, pt, &q), want = ref_cfs(text, pt, &rq, &rp);
        FUZZ_CHECK(rc == want, "cfs \"%s\" \"%s\": %d, want %d", text, pt, rc, want);
        if (rc == 1) {
            FUZZ_CHECK(q.quota == rq && q.period == rp, "cfs: the numbers");
            check_quota(&q);
        }
        break;
    }
    default: {
        /* capacities from the flag byte: small ones reach the "does not fit" paths */
        size_t cap = 1 + (size_t)(how >> 2) % 48, list_cap = 1 + (size_t)(how >> 4) % 12;
        const char *controller = how % 4 == 2 ? NULL : "cpu";
        char *path = malloc(cap), *list = malloc(list_cap);
        if (!path || !list)
            abort();
        if (cpus_cgroup_path(text, controller, path, cap, controller ? list : NULL, list_cap) ==
            0) {
            FUZZ_CHECK(strlen(path) < cap && path[0] == '/', "path \"%s\"", path);
            FUZZ_CHECK(!controller || strlen(list) < list_cap, "list \"%s\"", list);
            FUZZ_CHECK(ref_line(text, controller, controller ? list : NULL, path),
                       "no line of \"%s\" has path \"%s\"", text, path);
        }
        free(path);
        free(list);
        break;
    }
    }
    free(a);
    free(b);
    return 0;
}
