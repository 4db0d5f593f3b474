/* `retryproxy simulate` (docs/cli.md) as users run it: the built binary on a config in a
 * temporary directory, its table, its exit statuses and its SVG. */
#include <criterion/criterion.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/proc.h"

/* The AWS scenario's route: exponential from 100 ms without jitter, 20 attempts, 503 retried,
 * budgets wide enough not to interfere. */
static const char config[] =
    "{\"budget\": {\"max_concurrent_retries\": null, \"min_retries_per_second\": 1000},\n"
    " \"routes\": [{\"name\": \"api\", \"upstreams\": [\"http://127.0.0.1:9001\"],\n"
    "   \"timeout_ms\": 600000,\n"
    "   \"retry\": {\"max_attempts\": 20, \"retry_on\": [\"503\"],\n"
    "             \"backoff\": {\"policy\": \"exponential\", \"base_ms\": 100, \"cap_ms\": 10000,\n"
    "                          \"jitter\": \"none\"}},\n"
    "   \"budget\": {\"min_retries_per_second\": 1000}}]}\n";

static char dir[64], cfg_path[96], svg_path[96];

static void setup(void)
{
    strcpy(dir, "/tmp/rp-simulate-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    snprintf(svg_path, sizeof svg_path, "%s/calls.svg", dir);
    FILE *f = fopen(cfg_path, "w");
    cr_assert_not_null(f);
    fputs(config, f);
    fclose(f);
}

static void teardown(void)
{
    rm_tree(dir);
}

TestSuite(cli_simulate, .init = setup, .fini = teardown);

/* Runs `retryproxy simulate -c CONFIG --route api` and up to 16 more arguments (NULL-ended). */
static struct proc_result sim(const char *a0, ...)
{
    char *argv[24] = { (char *)proc_bin(), "simulate", "-c", cfg_path, "--route", "api" };
    va_list ap;
    va_start(ap, a0);
    proc_args(argv, 24, 6, a0, ap);
    va_end(ap);
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 30000, &r), 0, "cannot run %s", argv[0]);
    cr_assert_neq(r.status, -1, "simulate timed out");
    return r;
}

#define SIM(...) sim(__VA_ARGS__, NULL)

static const char header[] = "policy              calls  calls/req  success  p50_ms  p90_ms  "
                             "p99_ms  max_ms  denied_budget  denied_concurrency\n";

Test(cli_simulate, prints_one_row_per_policy_under_a_header)
{
    struct proc_result r =
        SIM("--capacity", "5/10", "--seed", "1", "--policy", "{\"jitter\": \"full\"}");
    cr_expect_eq(r.status, 0, "stderr: %s", r.err);
    cr_expect_str_eq(r.err, "");
    char want[1024];
    snprintf(want, sizeof want,
             "%s"
             "route                1050      10.50   100.0%%   32700  112700  132700  132700  "
             "            0                   0\n"
             "{\"jitter\": \"full\"}    260       2.60   100.0%%      94     266     402     416  "
             "            0                   0\n",
             header);
    cr_expect_str_eq(r.out, want);
    proc_result_free(&r);
}

Test(cli_simulate, no_failures_one_call_per_request)
{
    struct proc_result r = SIM("--clients", "3", "--requests", "4", "--latency", "5");
    cr_expect_eq(r.status, 0, "stderr: %s", r.err);
    cr_expect_str_eq(r.out, "policy  calls  calls/req  success  p50_ms  p90_ms  p99_ms  max_ms  "
                            "denied_budget  denied_concurrency\n"
                            "route      12       1.00   100.0%       5       5       5       5  "
                            "            0                   0\n");
    proc_result_free(&r);
}

Test(cli_simulate, same_seed_same_table_other_seed_other_table)
{
    struct proc_result a = SIM("--failure-rate", "0.5", "--capacity", "5/10", "--seed", "7",
                               "--policy", "{\"jitter\": \"full\"}");
    struct proc_result b = SIM("--failure-rate", "0.5", "--capacity", "5/10", "--seed", "7",
                               "--policy", "{\"jitter\": \"full\"}");
    struct proc_result c = SIM("--failure-rate", "0.5", "--capacity", "5/10", "--seed", "8",
                               "--policy", "{\"jitter\": \"full\"}");
    cr_expect_eq(a.status, 0, "stderr: %s", a.err);
    cr_expect_str_eq(a.out, b.out);
    cr_expect_str_neq(a.out, c.out);
    proc_result_free(&a);
    proc_result_free(&b);
    proc_result_free(&c);
}

Test(cli_simulate, budget_denials_are_reported)
{
    /* the route's budget with its defaults' ratio and no floor: 0.2 retry per first attempt */
    FILE *f = fopen(cfg_path, "w");
    cr_assert_not_null(f);
    fputs("{\"routes\": [{\"name\": \"api\", \"upstreams\": [\"http://127.0.0.1:9001\"],\n"
          "  \"retry\": {\"max_attempts\": 2, \"retry_on\": [\"503\"]},\n"
          "  \"budget\": {\"min_retries_per_second\": 0}}]}\n",
          f);
    fclose(f);
    struct proc_result r = SIM("--clients", "10", "--outage", "0-1000", "--seed", "1");
    cr_expect_eq(r.status, 0, "stderr: %s", r.err);
    cr_expect(strstr(r.out, "\nroute      12       1.20     0.0%"), "%s", r.out);
    cr_expect(strstr(r.out, "              8                   0\n"), "%s", r.out);
    proc_result_free(&r);
}

Test(cli_simulate, a_bad_policy_is_an_error_naming_the_key)
{
    struct proc_result r =
        SIM("--policy", "{\"jitter\": \"full\"}", "--policy", "{\"jiter\": \"none\"}");
    cr_expect_eq(r.status, 1);
    cr_expect_str_eq(r.out, "");
    cr_expect_str_eq(r.err, "--policy 2: $.jiter: unknown key \"jiter\"; did you mean \"jitter\"?\n"
                            "retryproxy: --policy 2: 1 error\n");
    proc_result_free(&r);

    r = SIM("--policy", "{\"policy\": \"decorrelated\", \"jitter\": \"full\"}");
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, "--policy 1: $.jitter: must be \"none\" with policy \"decorrelated\""),
              "%s", r.err);
    proc_result_free(&r);

    r = SIM("--policy", "{\"cap_ms\": 50}");
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, "--policy 1: $.cap_ms: cap_ms (50) must be at least base_ms (100)\n"),
              "%s", r.err);
    proc_result_free(&r);

    r = SIM("--policy", "{\"jitter\":");
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, "--policy 1: $: invalid JSON"), "%s", r.err);
    proc_result_free(&r);
}

Test(cli_simulate, usage_errors_exit_2)
{
    static const char *const bad[][2] = {
        { "--outage", "5-3" },     { "--outage", "5" },       { "--failure-rate", "1.5" },
        { "--failure-rate", "x" }, { "--capacity", "0/10" },  { "--capacity", "5" },
        { "--clients", "0" },      { "--requests", "10001" }, { "--seed", "-1" },
        { "--bogus", "1" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct proc_result r = SIM(bad[i][0], bad[i][1]);
        cr_expect_eq(r.status, 2, "%s %s: exit %d", bad[i][0], bad[i][1], r.status);
        cr_expect(strstr(r.err, "Try 'retryproxy --help'."), "%s", r.err);
        cr_expect_str_eq(r.out, "");
        proc_result_free(&r);
    }
    char *argv[] = { (char *)proc_bin(), "simulate", "-c", cfg_path, NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 10000, &r), 0);
    cr_expect_eq(r.status, 2);
    cr_expect_str_eq(r.err, "retryproxy: simulate: --route NAME is required\n"
                            "Try 'retryproxy --help'.\n");
    proc_result_free(&r);
}

Test(cli_simulate, an_unknown_route_exits_1)
{
    char *argv[] = { (char *)proc_bin(), "simulate", "-c", cfg_path, "--route", "nope", NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 10000, &r), 0);
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, "no route named \"nope\" (routes: api)"), "%s", r.err);
    proc_result_free(&r);
}

/* Occurrences of 'needle' in 'hay'. */
static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

Test(cli_simulate, svg_draws_one_line_per_policy)
{
    struct proc_result r =
        SIM("--capacity", "5/10", "--seed", "1", "--policy", "{\"jitter\": \"full\"}", "--policy",
            "{\"jitter\": \"equal\"}", "--svg", svg_path);
    cr_expect_eq(r.status, 0, "stderr: %s", r.err);
    proc_result_free(&r);
    char *svg = proc_read_file(svg_path);
    cr_expect_eq(strncmp(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\"", 39), 0, "%.80s", svg);
    size_t len = strlen(svg);
    cr_expect(len > 7 && strcmp(svg + len - 7, "</svg>\n") == 0, "the SVG is not closed");
    cr_expect_eq(count(svg, "<svg"), 1);
    cr_expect_eq(count(svg, "<polyline"), 3, "one line per policy");
    /* a legend naming every policy, XML-escaped; nothing fetched from elsewhere */
    cr_expect(strstr(svg, ">route</text>"));
    cr_expect(strstr(svg, ">{&quot;jitter&quot;: &quot;equal&quot;}</text>"));
    cr_expect(strstr(svg, "time (ms)"));
    cr_expect_eq(count(svg, "href"), 0);
    cr_expect_eq(count(svg, "url("), 0);
    /* every element that opens closes */
    cr_expect_eq(count(svg, "<text"), count(svg, "</text>"));
    cr_expect_eq(count(svg, "<g"), count(svg, "</g>"));
    free(svg);
}

Test(cli_simulate, an_svg_that_cannot_be_written_prints_nothing_and_exits_1)
{
    struct proc_result r = SIM("--svg", "/nonexistent-dir/calls.svg");
    cr_expect_eq(r.status, 1);
    cr_expect_str_eq(r.out, "");
    cr_expect(strstr(r.err, "/nonexistent-dir/calls.svg: cannot write"), "%s", r.err);
    proc_result_free(&r);
}

/* The picture of docs/cli.md "Jitter and contending clients" is what the binary draws now (its
 * table is checked with the page's other console examples, by test_cli_docs). */
Test(cli_simulate, the_docs_picture_is_the_current_drawing)
{
    char *argv[] = { (char *)proc_bin(),
                     "simulate",
                     "-c",
                     "docs/examples/contention.json",
                     "--route",
                     "api",
                     "--capacity",
                     "5/10",
                     "--seed",
                     "1",
                     "--policy",
                     "{\"jitter\":\"full\"}",
                     "--policy",
                     "{\"jitter\":\"equal\"}",
                     "--policy",
                     "{\"policy\":\"decorrelated\"}",
                     "--svg",
                     svg_path,
                     NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 30000, &r), 0);
    cr_expect_eq(r.status, 0, "stderr: %s", r.err);
    proc_result_free(&r);
    char *want = proc_read_file("docs/examples/contention.svg");
    char *got = proc_read_file(svg_path);
    cr_expect_str_eq(got, want,
                     "docs/examples/contention.svg is not the current drawing: regenerate it with "
                     "the command of docs/cli.md and --svg docs/examples/contention.svg");
    free(want);
    free(got);
}
