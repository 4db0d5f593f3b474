/* Config loading: long lists, each element checked against the others in constant time
 * (issue 9), in CPU time so that a busy machine does not fail them. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <criterion/parameterized.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config/cfg.h"
#include "config/jsonpos.h"
#include "policy/budget.h"
#include "tests/support/cfgtext.h"

/* Built with a sanitizer (make asan): CPU bounds are looser there. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

/* One timeout for the whole suite: Criterion 2.4 leaks a timer record in its runner when tests
 * with different per-test timeouts run in parallel (a LeakSanitizer report under make asan). */
TestSuite(config, .timeout = 120);

/* {"routes": [ROUTE]} where ROUTE's 'key' (a path inside the route, as JSON text up to the
 * list) holds 'n' strings made by 'elem' from their index. */
static char *long_list_config(const char *before, const char *after, size_t n,
                              void (*elem)(char *buf, size_t cap, size_t i))
{
    size_t cap = strlen(before) + strlen(after) + n * 40 + 64;
    char *text = malloc(cap), *p = text;
    p += sprintf(p, "%s", before);
    for (size_t i = 0; i < n; i++) {
        char e[40];
        elem(e, sizeof(e), i);
        p += sprintf(p, "%s\"%s\"", i ? ", " : "", e);
    }
    sprintf(p, "%s", after);
    return text;
}

static void same_status(char *buf, size_t cap, size_t i)
{
    (void)i;
    snprintf(buf, cap, "429");
}

static void same_url(char *buf, size_t cap, size_t i)
{
    (void)i;
    snprintf(buf, cap, "http://127.0.0.1:9001");
}

/* Every range lo-hi with 100 <= lo <= hi <= 599, in order: 125,250 distinct tokens. */
static void distinct_range(char *buf, size_t cap, size_t i)
{
    unsigned lo = 100;
    while (i >= 600 - lo) {
        i -= 600 - lo;
        lo++;
    }
    snprintf(buf, cap, "%u-%u", lo, lo + (unsigned)i);
}

static void distinct_url(char *buf, size_t cap, size_t i)
{
    snprintf(buf, cap, "http://10.%zu.%zu.%zu:80", i >> 16, (i >> 8) & 255, i & 255);
}

/* Loads 'text', returns the milliseconds of CPU it took (not wall-clock: a busy machine must
 * not fail the test); 'errs' keeps what was found. */
static double timed_load(const char *text, struct cfg_errs *errs, struct cfg **out)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    struct cfg *c = cfg_load_buffer(text, strlen(text), "t", errs);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    if (out)
        *out = c;
    else
        cfg_unref(c);
    return cfgt_ms_between(&t0, &t1);
}

/* The case of issue 9: 20,000 copies of "429" (140 KB) took 30 s, comparing each entry with
 * every earlier one and reporting each pair. Now each duplicate is one error, found in one
 * lookup. */
Test(config, retry_on_repeating_one_entry_20000_times_is_one_error_per_copy)
{
    char *text = long_list_config("{\"routes\": [{\"name\": \"a\", \"upstreams\": "
                                  "[\"http://h:1\"], \"retry\": {\"retry_on\": [",
                                  "]}}]}", 20000, same_status);
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    double ms = timed_load(text, &errs, NULL);
    cr_log_info("20,000 x \"429\" in retry_on: %.0f ms", ms);
    cr_expect_eq(errs.n + errs.dropped, 19999, "%zu errors, want one per copy after the first",
                 errs.n + errs.dropped);
    cr_assert_gt(errs.n, 0);
    cr_expect_str_eq(errs.v[0].path, "$.routes[0].retry.retry_on[1]");
    cr_expect_str_eq(errs.v[0].msg, "\"429\" is listed twice");
    cr_expect_lt(ms, 1000.0, "loading took %.0f ms", ms);
    cfg_errs_clear(&errs);
    free(text);
}

Test(config, upstreams_repeating_one_url_20000_times_is_one_error_per_copy)
{
    char *text = long_list_config("{\"routes\": [{\"name\": \"a\", \"upstreams\": [", "]}]}", 20000,
                                  same_url);
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    double ms = timed_load(text, &errs, NULL);
    cr_log_info("20,000 x the same upstream: %.0f ms", ms);
    cr_expect_eq(errs.n + errs.dropped, 19999, "%zu errors, want one per copy after the first",
                 errs.n + errs.dropped);
    cr_assert_gt(errs.n, 0);
    cr_expect_str_eq(errs.v[0].path, "$.routes[0].upstreams[1]");
    cr_expect_str_eq(errs.v[0].msg, "\"http://127.0.0.1:9001\" is listed twice");
    cr_expect_lt(ms, 1000.0, "loading took %.0f ms", ms);
    cfg_errs_clear(&errs);
    free(text);
}

/* Valid lists as long as a 4 MiB file allows: no element is compared with all the others. */
Test(config, long_lists_of_distinct_entries_load_in_linear_time)
{
    char *text = long_list_config("{\"routes\": [{\"name\": \"a\", \"upstreams\": "
                                  "[\"http://h:1\"], \"retry\": {\"retry_on\": [",
                                  "]}}]}", 125250, distinct_range);
    cr_assert_lt(strlen(text), CFG_MAX_FILE_BYTES);
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct cfg *c;
    double ms = timed_load(text, &errs, &c);
    cr_log_info("125,250 distinct retry_on ranges: %.0f ms", ms);
    cr_assert_not_null(c, "%s", errs.n ? errs.v[0].msg : "");
    cr_expect_eq(c->routes[0].retry.n_on, 125250);
    cr_expect_lt(ms, 3000.0, "loading took %.0f ms", ms);
    cfg_unref(c);
    free(text);

    text = long_list_config("{\"routes\": [{\"name\": \"a\", \"upstreams\": [", "]}]}", 100000,
                            distinct_url);
    cr_assert_lt(strlen(text), CFG_MAX_FILE_BYTES);
    ms = timed_load(text, &errs, &c);
    cr_log_info("100,000 distinct upstreams: %.0f ms", ms);
    cr_assert_not_null(c, "%s", errs.n ? errs.v[0].msg : "");
    cr_expect_eq(c->routes[0].n_upstreams, 100000);
    cr_expect_lt(ms, 3000.0, "loading took %.0f ms", ms);
    cfg_unref(c);
    cfg_errs_clear(&errs);
    free(text);
}

/* Route names are checked for duplicates the same way: the first copy is the one named.
 * 60,000 routes with names sharing a 90-character prefix cost about 40 s of CPU when each
 * name was compared with every earlier one, about 1.5 s now (5 s under ASan). CPU time, not
 * wall-clock, so that a busy machine does not fail the test. */
Test(config, route_names_among_60000_routes_are_checked_in_linear_time)
{
    size_t n = 60000;
    char *text = malloc(n * 200 + 64), *p = text;
    p += sprintf(p, "{\"routes\": [");
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%s{\"name\": \"%090d-%zu\", \"upstreams\": [\"http://h:1\"]}",
                     i ? "," : "", 0, i < n - 1 ? i : 12345);
    strcpy(p, "]}");
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    struct cfg *c = cfg_load_buffer(text, strlen(text), "t", &errs);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    double ms = cfgt_ms_between(&t0, &t1);
    cr_log_info("60,000 routes: %.0f ms of CPU", ms);
    cr_expect_null(c);
    cr_assert_eq(errs.n, 1);
    cr_expect_str_eq(errs.v[0].path, "$.routes[59999].name");
    char want[200];
    snprintf(want, sizeof(want), "duplicate route name \"%090d-12345\" (also $.routes[12345].name)",
             0);
    cr_expect_str_eq(errs.v[0].msg, want);
    /* about 5 s here; a sanitizer's build runs three times slower or more (CI's ASan run once
     * took 15.2 s on a loaded machine) */
    cr_expect_lt(ms, SANITIZED ? 60000.0 : 15000.0, "loading took %.0f ms of CPU", ms);
    cfg_errs_clear(&errs);
    free(text);
}
