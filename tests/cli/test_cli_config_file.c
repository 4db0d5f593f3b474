/* What the command line does with config files that are not ordinary configs: a file of a
 * size a config never has, a FIFO or device at the path, and lists repeating one entry tens
 * of thousands of times. Each command that reads the file (check, schedule, starting the
 * proxy) answers at once with one plain error line naming the file, and exits 1.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config/cfg.h"
#include "tests/support/harness.h"
#include "tests/support/proc.h"

static char dir[64];
static char path[128];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/retryproxy-cfgfile-XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    snprintf(path, sizeof(path), "%s/config.json", dir);
}

static void teardown(void)
{
    if (dir[0])
        rm_tree(dir);
}

TestSuite(cli_config_file, .init = setup, .fini = teardown, .timeout = 60);

/* Runs retryproxy with 'args' (NULL-terminated) for at most 'timeout_ms'; the elapsed
 * milliseconds in *ms. A run that had to be killed fails the test. */
static struct proc_result run(const char *const *args, int timeout_ms, int64_t *ms)
{
    char *argv[16] = { (char *)proc_bin() };
    size_t n = 1;
    for (; args[n - 1] && n < 15; n++)
        argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    struct proc_result r;
    int64_t t0 = now_ms();
    cr_assert_eq(proc_run(argv, NULL, timeout_ms, &r), 0, "cannot run %s", argv[0]);
    *ms = now_ms() - t0;
    cr_assert_neq(r.status, -1, "%s %s did not finish within %d ms (killed)", argv[0], argv[1],
                  timeout_ms);
    return r;
}

static void write_text(const char *text, size_t len)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(text, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

/* The three commands that read the config, each expected to refuse it with 'msg' as
 * "PATH: $: MSG" on the stream the command reports on, and exit 1 within 'limit_ms'. */
static void expect_refused_everywhere(const char *msg, int limit_ms)
{
    char want[512];
    snprintf(want, sizeof(want), "%s: $: %s\n", path, msg);
    const char *check[] = { "check", "-c", path, NULL };
    const char *sched[] = { "schedule", "-c", path, "--route", "a", NULL };
    const char *serve[] = { "-c", path, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", NULL };
    const char *const *cmds[] = { check, sched, serve };
    const char *names[] = { "check", "schedule", "start" };
    for (size_t i = 0; i < 3; i++) {
        int64_t ms;
        struct proc_result r = run(cmds[i], 10000, &ms);
        cr_log_info("%s: refused after %lld ms", names[i], (long long)ms);
        cr_expect_eq(r.status, 1, "%s: exit %d", names[i], r.status);
        const char *report = i == 0 ? r.out : r.err;
        cr_expect(strstr(report, want) != NULL, "%s: no line '%s' in:\n%s", names[i], want, report);
        cr_expect_lt(ms, limit_ms, "%s took %lld ms", names[i], (long long)ms);
        proc_result_free(&r);
    }
}

Test(cli_config_file, file_above_4_mib_is_refused_naming_the_limit)
{
    /* A valid config followed by spaces: only its size is wrong. */
    static const char head[] = "{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"]}]}";
    size_t len = CFG_MAX_FILE_BYTES + 1;
    char *text = malloc(len);
    memset(text, ' ', len);
    memcpy(text, head, strlen(head));
    write_text(text, len);
    expect_refused_everywhere("larger than 4 MiB (4194304 bytes), the limit for a config file",
                              3000);

    /* One byte less is a config like any other. */
    write_text(text, len - 1);
    const char *check[] = { "check", "-c", path, NULL };
    int64_t ms;
    struct proc_result r = run(check, 10000, &ms);
    cr_expect_eq(r.status, 0, "a file of exactly 4 MiB: %s%s", r.out, r.err);
    proc_result_free(&r);
    free(text);
}

/* Opening a FIFO for reading waits for a writer; the commands must not. */
Test(cli_config_file, fifo_at_the_config_path_is_refused_at_once)
{
    cr_assert_eq(mkfifo(path, 0600), 0, "mkfifo: %s", strerror(errno));
    expect_refused_everywhere("not a regular file (a FIFO)", 3000);
}

Test(cli_config_file, directory_at_the_config_path_is_refused)
{
    cr_assert_eq(mkdir(path, 0700), 0);
    expect_refused_everywhere("not a regular file (a directory)", 3000);
}

/* Issue 9: 20,000 copies of "429" (140 KB) took 30 s to check. Each copy after the first is
 * one error; the first 200 are printed and the rest counted. */
Test(cli_config_file, retry_on_with_20000_duplicates_is_checked_in_well_under_a_second)
{
    size_t n = 20000;
    char *text = malloc(n * 8 + 256), *p = text;
    p += sprintf(p, "{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"],\n"
                    "  \"retry\": {\"retry_on\": [");
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%s\"429\"", i ? ", " : "");
    p += sprintf(p, "]}}]}\n");
    write_text(text, (size_t)(p - text));

    const char *check[] = { "check", "-c", path, NULL };
    int64_t ms;
    struct proc_result r = run(check, 60000, &ms);
    cr_log_info("check of 20,000 duplicate retry_on entries: %lld ms", (long long)ms);
    cr_expect_eq(r.status, 1);
    char want[256];
    snprintf(want, sizeof(want),
             "%s:2:33: $.routes[0].retry.retry_on[1]: \"429\" is listed twice\n", path);
    cr_expect_eq(strncmp(r.out, want, strlen(want)), 0, "first line is not '%s':\n%.300s", want,
                 r.out);
    snprintf(want, sizeof(want), "%s: (19799 more errors not shown)\n", path);
    cr_expect(strstr(r.out, want) != NULL, "no '%s' line", want);
    snprintf(want, sizeof(want), "retryproxy: %s: 19999 errors\n", path);
    cr_expect_str_eq(r.err, want);
    cr_expect_lt(ms, 3000, "check took %lld ms", (long long)ms);
    proc_result_free(&r);
    free(text);
}
