/* Config loading: how errors are reported (once, where they are, sorted, capped), the files
 * refused without reading them whole, and every allocation of jansson's failing in turn. Run
 * from the repository root (make test does). */
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

#define DATA "tests/data/config"

/* One timeout for the whole suite: Criterion 2.4 leaks a timer record in its runner when tests
 * with different per-test timeouts run in parallel (a LeakSanitizer report under make asan). */
TestSuite(config, .timeout = 120);

Test(config, value_inherited_from_defaults_is_reported_once)
{
    char *e = cfgt_load_errors("{\"defaults\": {\"retry\": {\"max_attempts\": 0}}, \"routes\": ["
                               "{\"name\": \"a\", \"upstreams\": [\"http://h:1\"]},"
                               "{\"name\": \"b\", \"upstreams\": [\"http://h:1\"]}]}");
    cr_expect_str_eq(e, "1:41: $.defaults.retry.max_attempts: must be an integer from 1 to 100, "
                        "got 0\n");
    free(e);
}

Test(config, rule_broken_only_by_defaults_is_reported_at_defaults)
{
    char *e = cfgt_load_errors("{\"defaults\": {\"retry\": {\"backoff\": {\"base_ms\": 500, "
                               "\"cap_ms\": 100}}}, \"routes\": ["
                               "{\"name\": \"a\", \"upstreams\": [\"http://h:1\"]}]}");
    cr_expect_str_eq(e, "1:63: $.defaults.retry.backoff.cap_ms: cap_ms (100) must be at least "
                        "base_ms (500)\n");
    free(e);
}

Test(config, invalid_value_does_not_cascade_into_rules)
{
    /* base_ms is invalid, so "cap_ms >= base_ms" is not checked against a made-up base. */
    char *e = cfgt_load_errors("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"],"
                               " \"retry\": {\"backoff\": {\"base_ms\": \"x\", \"cap_ms\": 1}}}]}");
    cr_expect_str_eq(e, "1:89: $.routes[0].retry.backoff.base_ms: expected an integer, got a "
                        "string\n");
    free(e);
}

Test(config, errors_come_sorted_by_position)
{
    char *e = cfgt_load_errors("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"],\n"
                               " \"timeout_ms\": 0}],\n \"zzz\": 1, \"drain_timeout_ms\": -1}");
    cr_expect_str_eq(e, "2:16: $.routes[0].timeout_ms: must be an integer from 1 to 86400000, "
                        "got 0\n"
                        "3:2: $.zzz: unknown key \"zzz\" (expected one of: listen, admin, log, "
                        "drain_timeout_ms, limits, budget, resolver, store, defaults, routes)\n"
                        "3:32: $.drain_timeout_ms: must be an integer from 0 to 86400000, "
                        "got -1\n");
    free(e);
}

Test(config, file_that_cannot_be_read_is_an_error_without_position)
{
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    cr_expect_null(cfg_load_file(DATA "/no-such-file.json", &errs));
    cr_assert_eq(errs.n, 1);
    cr_expect_eq(errs.v[0].line, 0);
    cr_expect_str_eq(errs.v[0].msg, "cannot open: No such file or directory");
    cfg_errs_clear(&errs);
    cr_expect_null(cfg_load_file(DATA, &errs));
    cr_assert_eq(errs.n, 1);
    cr_expect_str_eq(errs.v[0].msg, "not a regular file (a directory)");
    cfg_errs_clear(&errs);
}

/* A FIFO at the config path: opening it for reading would wait for a writer that may never
 * come (the control thread stuck, health checks timing out). It is refused at once, and a
 * writer that does come finds nobody reading. */
Test(config, fifo_is_refused_without_waiting_for_a_writer)
{
    char dir[] = "/tmp/retryproxy-fifo-XXXXXX", path[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/config.json", dir);
    cr_assert_eq(mkfifo(path, 0600), 0, "mkfifo: %s", strerror(errno));
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_expect_null(cfg_load_file(path, &errs));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_assert_eq(errs.n, 1);
    cr_expect_eq(errs.v[0].line, 0);
    cr_expect_str_eq(errs.v[0].msg, "not a regular file (a FIFO)");
    cr_expect_lt(cfgt_ms_between(&t0, &t1), 1000.0);
    cfg_errs_clear(&errs);
    unlink(path);
    rmdir(dir);
}

Test(config, device_is_refused)
{
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    cr_expect_null(cfg_load_file("/dev/zero", &errs));
    cr_assert_eq(errs.n, 1);
    cr_expect_str_eq(errs.v[0].msg, "not a regular file (a character device)");
    cfg_errs_clear(&errs);
}

Test(config, oversized_file_is_refused)
{
    char path[] = "/tmp/retryproxy-big-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    for (unsigned i = 0; i <= CFG_MAX_FILE_BYTES; i += 8)
        fputs("        ", f);
    fclose(f);
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    cr_expect_null(cfg_load_file(path, &errs));
    cr_assert_eq(errs.n, 1);
    cr_expect_eq(errs.v[0].line, 0);
    cr_expect_str_eq(errs.v[0].msg,
                     "larger than 4 MiB (4194304 bytes), the limit for a config file");
    cfg_errs_clear(&errs);
    unlink(path);
}

Test(config, file_of_exactly_the_limit_is_read)
{
    /* A valid config padded with spaces to exactly CFG_MAX_FILE_BYTES. */
    static const char head[] = "{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"]}]}";
    char path[] = "/tmp/retryproxy-big-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs(head, f);
    for (size_t i = strlen(head); i < CFG_MAX_FILE_BYTES; i++)
        fputc(' ', f);
    fclose(f);
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct cfg *c = cfg_load_file(path, &errs);
    cr_expect_not_null(c, "%s", errs.n ? errs.v[0].msg : "");
    cfg_unref(c);
    cfg_errs_clear(&errs);
    unlink(path);
}

/* ---- long lists: each element is checked against the others in constant time ---- */

Test(config, error_list_is_capped_and_counts_the_rest)
{
    /* 300 unknown keys: CFG_ERRS_MAX kept, the rest counted. */
    char *text = malloc(300 * 16 + 128), *p = text;
    p += sprintf(p, "{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"]}]");
    for (int i = 0; i < 300; i++)
        p += sprintf(p, ", \"k%d\": 1", i);
    strcpy(p, "}");
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    cr_expect_null(cfg_load_buffer(text, strlen(text), "t", &errs));
    cr_expect_eq(errs.n, CFG_ERRS_MAX);
    cr_expect_eq(errs.dropped, 300 - CFG_ERRS_MAX);
    cfg_errs_clear(&errs);
    free(text);
}

/* ---- allocation failures ---- */

/* The allocator under jansson's, failing its Nth call (0: never). */
static long jfail_at, jcalls;
static void *jmalloc(size_t size)
{
    if (jfail_at && ++jcalls == jfail_at)
        return NULL;
    return malloc(size);
}

/* Every allocation jansson makes while a config loads fails in turn: each load either
 * succeeds with exactly the values of a load without failures or reports an error, and never
 * crashes or leaks (the ASan build checks leaks at exit). jansson itself lets some failures
 * pass (a token's text cut short), which only the allocator wrapper notices. */
Test(config, every_jansson_allocation_failure_is_an_error_not_a_crash)
{
    char *text = cfgt_read_file(DATA "/valid/contract_example.json");
    cr_assert_not_null(text);
    struct cfg *good = cfgt_load_ok(text);
    json_t *want = cfg_to_json(good);
    cfg_set_json_malloc(jmalloc);
    long failed = 0;
    for (long n = 1;; n++) {
        jfail_at = n;
        jcalls = 0;
        struct cfg_errs errs;
        cfg_errs_init(&errs);
        struct cfg *c = cfg_load_buffer(text, strlen(text), "test", &errs);
        bool reached = jcalls >= n;
        jfail_at = 0;
        if (c) {
            cr_expect_eq(errs.n, 0);
            json_t *got = cfg_to_json(c);
            cr_expect(json_equal(got, want), "allocation %ld failed and the config changed", n);
            json_decref(got);
            cfg_unref(c);
        } else {
            cr_expect_gt(errs.n, 0, "allocation %ld failed without an error", n);
            failed++;
        }
        cfg_errs_clear(&errs);
        if (!reached)
            break; /* fewer than n allocations: every one has been failed once */
        cr_assert_lt(n, 100000, "no end to jansson's allocations");
    }
    cfg_set_json_malloc(NULL);
    cr_expect_gt(failed, 10, "only %ld loads saw a failure", failed);
    json_decref(want);
    cfg_unref(good);
    free(text);
}
