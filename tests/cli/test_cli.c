/* The command line of docs/cli.md, run as users run it: the built binary, its output and exit
 * status. Run from the repository root (make test does). */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tests/support/proc.h"

#define VALID   "tests/data/config/valid"
#define INVALID "tests/data/config/invalid"
#define SEQ     VALID "/sequences.json"

/* Runs retryproxy with up to 12 arguments (NULL-terminated list). */
static struct proc_result rp_env(char *const env[], const char *a0, ...)
{
    char *argv[16] = { (char *)proc_bin() };
    va_list ap;
    va_start(ap, a0);
    proc_args(argv, 16, 1, a0, ap);
    va_end(ap);
    struct proc_result r;
    cr_assert_eq(proc_run(argv, env, 10000, &r), 0, "cannot run %s", argv[0]);
    cr_assert_neq(r.status, -1, "%s timed out", argv[0]);
    return r;
}

#define rp(...) rp_env(NULL, __VA_ARGS__, NULL)

/* Checks the exit status and the whole stdout of a run, and frees it. */
static void expect_run(struct proc_result r, int status, const char *out)
{
    cr_expect_eq(r.status, status, "exit %d, stderr: %s", r.status, r.err);
    cr_expect_str_eq(r.out, out);
    proc_result_free(&r);
}

Test(cli, version_prints_name_and_version)
{
    expect_run(rp("--version"), 0, "retryproxy 0.1.0\n");
}

Test(cli, help_lists_every_command_and_exits_zero)
{
    struct proc_result r = rp("--help");
    cr_expect_eq(r.status, 0);
    cr_expect(strstr(r.out, "retryproxy check -c FILE"));
    cr_expect(strstr(r.out, "retryproxy schedule -c FILE --route NAME"));
    cr_expect(strstr(r.out, "--retries N"));
    cr_expect(strstr(r.out, "--log-format"));
    cr_expect_str_eq(r.err, "");
    proc_result_free(&r);
}

Test(cli, check_accepts_a_valid_config)
{
    expect_run(rp("check", "-c", VALID "/minimal.json"), 0, VALID "/minimal.json: OK (1 route)\n");
}

Test(cli, check_accepts_the_bundled_example_configs)
{
    struct proc_result r = rp("check", "-c", "deploy/config.json");
    cr_expect_eq(r.status, 0, "%s%s", r.out, r.err);
    proc_result_free(&r);
    r = rp("check", "-c", "deploy/kubernetes/config.json");
    cr_expect_eq(r.status, 0, "%s%s", r.out, r.err);
    proc_result_free(&r);
    r = rp("check", "-c", "bench/peers-config.json");
    cr_expect_eq(r.status, 0, "%s%s", r.out, r.err);
    proc_result_free(&r);
}

Test(cli, check_prints_every_error_with_file_line_column_and_path)
{
    struct proc_result r = rp("check", "-c", INVALID "/many_errors_all_reported.json");
    cr_expect_eq(r.status, 1);
    const char *f = INVALID "/many_errors_all_reported.json";
    char want[512];
    snprintf(want, sizeof(want),
             "%s:2:21: $.log.format: unknown format \"xml\" (expected one of: json, text)\n", f);
    cr_expect(strncmp(r.out, want, strlen(want)) == 0, "got:\n%s", r.out);
    size_t lines = 0;
    for (const char *p = r.out; *p; p++)
        lines += *p == '\n';
    cr_expect_eq(lines, 7, "got:\n%s", r.out);
    cr_expect(strstr(r.err, "7 errors"), "stderr: %s", r.err);
    proc_result_free(&r);
}

/* Every invalid case fails `check` with exit 1 and exactly the errors of its .err file, each
 * prefixed with the file name. */
Test(cli, check_rejects_every_invalid_case_naming_its_json_path)
{
    DIR *d = opendir(INVALID);
    cr_assert_not_null(d);
    struct dirent *e;
    int cases = 0;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0)
            continue;
        char json[512], errf[512];
        snprintf(json, sizeof(json), INVALID "/%s", e->d_name);
        snprintf(errf, sizeof(errf), INVALID "/%.*s.err", (int)(len - 5), e->d_name);
        FILE *ef = fopen(errf, "r");
        cr_assert_not_null(ef, "%s missing", errf);
        char want_line[1024];
        cr_assert_not_null(fgets(want_line, sizeof(want_line), ef));
        fclose(ef);
        char want[1600];
        snprintf(want, sizeof(want), "%s:%s", json, want_line);

        struct proc_result r = rp("check", "-c", json);
        cr_expect_eq(r.status, 1, "%s: exit %d", json, r.status);
        cr_expect(strncmp(r.out, want, strlen(want)) == 0, "%s:\n got: %s\nwant: %s", json, r.out,
                  want);
        cr_expect(strstr(r.out, ": $"), "%s: no JSON path in %s", json, r.out);
        proc_result_free(&r);
        cases++;
    }
    closedir(d);
    cr_expect_geq(cases, 30);
}

Test(cli, check_reports_a_missing_file)
{
    struct proc_result r = rp("check", "-c", "/nonexistent/retryproxy.json");
    cr_expect_eq(r.status, 1);
    cr_expect_str_eq(r.out,
                     "/nonexistent/retryproxy.json: $: cannot open: No such file or directory\n");
    proc_result_free(&r);
}

/* Issue 27: a first run without -c said only that the default path cannot be opened. */
Test(cli, missing_config_without_c_says_how_to_name_one)
{
    char *env_file[] = { "RETRYPROXY_CONFIG=/nonexistent/rp.json", NULL };
    struct proc_result r = rp_env(env_file, "check", NULL);
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err,
                     "retryproxy: no config file at /nonexistent/rp.json (from "
                     "$RETRYPROXY_CONFIG): name one with -c FILE or RETRYPROXY_CONFIG=FILE\n"),
              "%s", r.err);
    proc_result_free(&r);

    /* the default path, where this machine has no file there (an empty variable is unset) */
    char *env_empty[] = { "RETRYPROXY_CONFIG=", NULL };
    if (access("/etc/retryproxy/config.json", F_OK) != 0) {
        r = rp_env(env_empty, "--listen", "127.0.0.1:0", NULL);
        cr_expect_eq(r.status, 1);
        cr_expect(strstr(r.err, "retryproxy: no config file at /etc/retryproxy/config.json (the "
                                "default): name one with -c FILE or RETRYPROXY_CONFIG=FILE\n"),
                  "%s", r.err);
        proc_result_free(&r);
    }

    /* a file named with -c is the user's own: no hint */
    r = rp("check", "-c", "/nonexistent/rp.json");
    cr_expect_null(strstr(r.err, "no config file"), "%s", r.err);
    proc_result_free(&r);
}

Test(cli, check_print_shows_the_effective_config)
{
    struct proc_result r = rp("check", "-c", VALID "/minimal.json", "--print");
    cr_expect_eq(r.status, 0);
    json_error_t jerr;
    json_t *j = json_loads(r.out, 0, &jerr);
    cr_assert_not_null(j, "%s", jerr.text);
    json_t *b = json_object_get(
        json_object_get(json_object_get(json_array_get(json_object_get(j, "routes"), 0), "retry"),
                        "backoff"),
        "cap_ms");
    cr_expect_eq(json_integer_value(b), 10000);
    /* the resolver's settings, every default filled in */
    json_t *res = json_object_get(j, "resolver");
    cr_expect(json_is_array(json_object_get(res, "servers")));
    cr_expect_eq(json_array_size(json_object_get(res, "servers")), 0);
    cr_expect_eq(json_integer_value(json_object_get(res, "timeout_ms")), 1000);
    cr_expect_eq(json_integer_value(json_object_get(res, "min_refresh_ms")), 1000);
    cr_expect_eq(json_integer_value(json_object_get(res, "max_refresh_ms")), 30000);
    cr_expect_eq(json_integer_value(json_object_get(res, "nxdomain_keep_ms")), 30000);
    json_decref(j);
    proc_result_free(&r);
}

Test(cli, check_uses_RETRYPROXY_CONFIG_when_no_file_is_given)
{
    char *env[] = { "RETRYPROXY_CONFIG=" INVALID "/zero_timeout.json", NULL };
    struct proc_result r = rp_env(env, "check", NULL);
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.out, INVALID "/zero_timeout.json:3:78: $.routes[0].timeout_ms"), "%s",
              r.out);
    proc_result_free(&r);
}

Test(cli, schedule_prints_the_contract_sequences)
{
    static const struct {
        const char *route, *want;
    } cases[] = {
        { "exponential", "10 20 40 80 160 320 640 1280\n" },
        { "fibonacci", "10 10 20 30 50 80 130\n" },
        { "steps", "10 20 40 80 80\n" },
        { "capped", "10 20 30 30\n" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct proc_result r = rp("schedule", "-c", SEQ, "--route", cases[i].route);
        cr_expect_eq(r.status, 0, "%s: %s", cases[i].route, r.err);
        cr_expect_str_eq(r.out, cases[i].want, "%s", cases[i].route);
        proc_result_free(&r);
    }
}

Test(cli, schedule_prints_runs_lines_of_retries_delays)
{
    expect_run(rp("schedule", "-c", SEQ, "--route", "exponential", "--retries", "3", "--runs", "4"),
               0, "10 20 40\n10 20 40\n10 20 40\n10 20 40\n");
    expect_run(rp("schedule", "-c", SEQ, "--route", "exponential", "--retries", "0"), 0, "\n");
}

Test(cli, schedule_seed_makes_jitter_repeatable)
{
    struct proc_result a =
        rp("schedule", "-c", SEQ, "--route", "jittered", "--runs", "5", "--seed", "42");
    struct proc_result b =
        rp("schedule", "-c", SEQ, "--route", "jittered", "--runs", "5", "--seed", "42");
    struct proc_result c =
        rp("schedule", "-c", SEQ, "--route", "jittered", "--runs", "5", "--seed", "43");
    cr_expect_eq(a.status, 0);
    cr_expect_str_eq(a.out, b.out);
    cr_expect_str_neq(a.out, c.out);
    /* 5 lines of max_attempts-1 = 5 delays, full jitter over exponential base 100: U[0, d]. */
    const unsigned cap[5] = { 100, 200, 400, 800, 1600 };
    char *save = NULL, *line = strtok_r(a.out, "\n", &save);
    int lines = 0;
    for (; line; line = strtok_r(NULL, "\n", &save), lines++) {
        unsigned v[6];
        int n = sscanf(line, "%u %u %u %u %u %u", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]);
        cr_expect_eq(n, 5, "line '%s'", line);
        for (int i = 0; i < n && i < 5; i++)
            cr_expect_leq(v[i], cap[i], "line '%s' delay %d", line, i + 1);
    }
    cr_expect_eq(lines, 5);
    proc_result_free(&a);
    proc_result_free(&b);
    proc_result_free(&c);
}

Test(cli, schedule_rejects_an_unknown_route_listing_the_routes)
{
    struct proc_result r = rp("schedule", "-c", SEQ, "--route", "nope");
    cr_expect_eq(r.status, 1);
    cr_expect_str_eq(r.out, "");
    cr_expect(strstr(r.err, "no route named \"nope\" (routes: exponential fibonacci"), "%s", r.err);
    proc_result_free(&r);
}

Test(cli, schedule_on_an_invalid_config_exits_one)
{
    struct proc_result r = rp("schedule", "-c", INVALID "/zero_timeout.json", "--route", "orders");
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, "$.routes[0].timeout_ms"), "%s", r.err);
    proc_result_free(&r);
}

Test(cli, usage_errors_exit_two)
{
    static const char *const bad[][6] = {
        { "schedule", "-c", SEQ, NULL },                             /* no --route */
        { "schedule", "-c", SEQ, "--route", "capped", "--retries" }, /* missing value */
        { "--bogus", NULL },
        { "frobnicate", NULL },
        { "--workers", "0", NULL },
        { "--log-level", "loud", NULL },
        { "--log-format", "xml", NULL },
        { "--listen", "nowhere", NULL },
        { "check", "-c", SEQ, "extra", NULL },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *argv[8] = { (char *)proc_bin() };
        for (size_t k = 0; k < 6 && bad[i][k]; k++)
            argv[k + 1] = (char *)bad[i][k];
        struct proc_result r;
        cr_assert_eq(proc_run(argv, NULL, 10000, &r), 0);
        cr_expect_eq(r.status, 2, "case %zu (%s): exit %d, stderr %s", i, bad[i][0], r.status,
                     r.err);
        cr_expect_neq(r.err_len, 0, "case %zu says nothing", i);
        proc_result_free(&r);
    }
}

/* A usage error is one line saying what was wrong, then the hint, on stderr, and nothing else:
 * not getopt_long()'s own message before ours (docs/cli.md#exit-statuses). */
static void expect_usage_error(const char *what, struct proc_result r)
{
    static const char hint[] = "Try 'retryproxy --help'.\n";
    const char *nl = strchr(r.err, '\n');
    cr_expect_eq(r.status, 2, "%s: exit %d, stderr:\n%s", what, r.status, r.err);
    cr_expect(strncmp(r.err, "retryproxy: ", 12) == 0 && nl && strcmp(nl + 1, hint) == 0,
              "%s: stderr is not one \"retryproxy: \" line and the hint:\n%s", what, r.err);
    cr_expect_str_eq(r.out, "", "%s: stdout", what);
    proc_result_free(&r);
}

/* Runs retryproxy with 'argv' (without the program, at most 14 words) for 'what'. */
static struct proc_result rp_argv(char *const argv[], size_t n)
{
    char *full[16] = { (char *)proc_bin() };
    cr_assert_lt(n, 15);
    memcpy(full + 1, argv, n * sizeof(char *));
    full[n + 1] = NULL;
    struct proc_result r;
    cr_assert_eq(proc_run(full, NULL, 10000, &r), 0);
    cr_assert_neq(r.status, -1, "retryproxy timed out");
    return r;
}

/* Every option of every command, as the usage lines of --help show them: a word starting with
 * '-', taking a value when the next word is one (FILE, json|text); the command is the word
 * after "retryproxy" when it is not an option ("" for the proxy itself). For each: the option
 * without its value, with a value and an unknown option after it, a flag with "=1", and an
 * unknown option are each one usage error with the hint once. */
Test(cli, every_usage_error_prints_one_line_and_the_hint_once)
{
    struct proc_result help = rp("--help");
    char *usage = strdup(help.out);
    proc_result_free(&help);
    char *blank = strstr(usage, "\n\n");
    cr_assert_not_null(blank, "--help: no blank line after the usage lines");
    *blank = '\0';
    char cmd[32] = "";
    bool needs_c = false, needs_route = false;
    int checked = 0;
    for (char *line = strtok(usage, "\n"); line; line = strtok(NULL, "\n")) {
        char words[32][32];
        size_t n = 0;
        for (char *p = line; *p && n < 32;) {
            size_t l = strcspn(p, " []");
            if (l && !(l == 3 && !strncmp(p, "...", 3)))
                snprintf(words[n++], sizeof(words[0]), "%.*s", (int)l, p);
            p += l + (p[l] != '\0');
        }
        size_t i = 0;
        for (; i < n && strcmp(words[i], "retryproxy"); i++)
            ;
        if (i < n) { /* the first line of a command; what it needs before an option, so that
                        none but that option is wrong */
            bool sub = i + 1 < n && words[i + 1][0] != '-';
            snprintf(cmd, sizeof(cmd), "%s", sub ? words[i + 1] : "");
            i += 1 + sub;
            needs_c = strstr(line, "-c FILE") != NULL;
            needs_route = strstr(line, "--route") != NULL;
        } else {
            i = 0; /* a line more of the same command */
        }
        for (; i < n; i++) {
            const char *o = words[i];
            if (o[0] != '-' || o[1] == '\0')
                continue;
            bool value = i + 1 < n && words[i + 1][0] != '-' && strcmp(words[i + 1], "|") != 0;
            char *argv[16], what[160];
            size_t k = 0;
            if (cmd[0])
                argv[k++] = cmd;
            if (needs_c && strcmp(o, "-c"))
                argv[k++] = "-c", argv[k++] = SEQ;
            if (needs_route && strcmp(o, "--route"))
                argv[k++] = "--route", argv[k++] = "capped";
            if (value) {
                argv[k] = (char *)o;
                snprintf(what, sizeof(what), "`retryproxy %s%s%s` (no value)", cmd, *cmd ? " " : "",
                         o);
                expect_usage_error(what, rp_argv(argv, k + 1));
                argv[k + 1] = "x";
                argv[k + 2] = "--bogus-option";
                snprintf(what, sizeof(what), "`retryproxy %s%s%s x --bogus-option`", cmd,
                         *cmd ? " " : "", o);
                expect_usage_error(what, rp_argv(argv, k + 3));
                i++;
            } else if (strncmp(o, "--", 2) == 0) {
                char with[48];
                snprintf(with, sizeof(with), "%s=1", o);
                argv[k] = with;
                snprintf(what, sizeof(what), "`retryproxy %s %s`", cmd, with);
                expect_usage_error(what, rp_argv(argv, k + 1));
            }
            checked++;
        }
    }
    free(usage);
    cr_expect_gt(checked, 25, "only %d options found in the usage lines of --help", checked);
    static const char *const unknown[][3] = {
        { "--bogus" },
        { "-x" },
        { "frobnicate" },
        { "check", "--bogus" },
        { "check", "-x" },
        { "schedule", "--r", "1" }, /* ambiguous: --route, --retries, --runs */
        { "simulate", "--bogus" },
        { "reference", "--bogus" },
    };
    for (size_t u = 0; u < sizeof(unknown) / sizeof(unknown[0]); u++) {
        char *argv[3];
        size_t k = 0;
        for (; k < 3 && unknown[u][k]; k++)
            argv[k] = (char *)unknown[u][k];
        char what[96];
        snprintf(what, sizeof(what), "`retryproxy %s %s`", unknown[u][0],
                 unknown[u][1] ? unknown[u][1] : "");
        expect_usage_error(what, rp_argv(argv, k));
    }
}

Test(cli, schedule_numbers_are_strict)
{
    static const char *const bad[][2] = {
        { "--retries", "-1" }, { "--retries", "3x" }, { "--retries", "10001" },
        { "--runs", "0" },     { "--seed", "1.5" },   { "--seed", "18446744073709551616" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct proc_result r = rp("schedule", "-c", SEQ, "--route", "capped", bad[i][0], bad[i][1]);
        cr_expect_eq(r.status, 2, "%s %s: exit %d", bad[i][0], bad[i][1], r.status);
        proc_result_free(&r);
    }
    expect_run(rp("schedule", "-c", SEQ, "--route", "capped", "--seed", "18446744073709551615",
                  "--retries", "1"),
               0, "10\n");
}

Test(cli, reference_matches_docs_config_md)
{
    struct proc_result r = rp("reference");
    cr_expect_eq(r.status, 0);
    FILE *f = fopen("docs/config.md", "r");
    cr_assert_not_null(f, "docs/config.md is missing");
    static char doc[65536];
    size_t n = fread(doc, 1, sizeof(doc) - 1, f);
    doc[n] = '\0';
    fclose(f);
    cr_expect(strstr(doc, r.out) != NULL,
              "docs/config.md does not hold the current `retryproxy reference` output; "
              "regenerate it with `make docs`");
    proc_result_free(&r);
}

/* A port on 127.0.0.1 held by a listening socket of ours, with SO_REUSEPORT if 'reuseport' (as
 * another retryproxy's workers hold theirs). */
static int busy_port(unsigned *port, int reuseport)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0);
    if (reuseport)
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &reuseport, sizeof(reuseport));
    cr_assert(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, 1) == 0);
    getsockname(fd, (struct sockaddr *)&a, &len);
    *port = ntohs(a.sin_port);
    return fd;
}

Test(cli, a_listener_that_cannot_be_bound_exits_three)
{
    for (int reuseport = 0; reuseport <= 1; reuseport++) {
        unsigned port;
        int fd = busy_port(&port, reuseport);
        char addr[32], want[160];
        snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
        struct proc_result r =
            rp("-c", VALID "/minimal.json", "--listen", addr, "--admin", "127.0.0.1:0");
        cr_expect_eq(r.status, 3, "SO_REUSEPORT %d: exit %d, stderr %s", reuseport, r.status,
                     r.err);
        snprintf(want, sizeof(want),
                 "retryproxy: cannot listen on %s: address already in use by another process\n",
                 addr);
        cr_expect_str_eq(r.err, want, "SO_REUSEPORT %d", reuseport);
        proc_result_free(&r);
        r = rp("-c", VALID "/minimal.json", "--listen", "127.0.0.1:0", "--admin", addr);
        cr_expect_eq(r.status, 3, "SO_REUSEPORT %d: admin: exit %d, stderr %s", reuseport, r.status,
                     r.err);
        snprintf(want, sizeof(want),
                 "retryproxy: admin: cannot listen on %s: address already in use by another "
                 "process\n",
                 addr);
        cr_expect_str_eq(r.err, want, "SO_REUSEPORT %d", reuseport);
        proc_result_free(&r);
        close(fd);
    }
}

Test(cli, serving_an_invalid_config_exits_one_with_its_errors_on_stderr)
{
    struct proc_result r = rp("-c", INVALID "/zero_timeout.json", "--listen", "127.0.0.1:0");
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, INVALID "/zero_timeout.json:3:78: $.routes[0].timeout_ms"), "%s",
              r.err);
    proc_result_free(&r);
}
