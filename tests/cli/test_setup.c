/* The first ten minutes (README.md): what make installs for which target, the demo, and the
 * docs index. Run from the repository root (make test does); needs make.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <dirent.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/support/proc.h"

/* make on the PATH, into make[cap] (proc_run takes a path). */
static void find_make(char *make, size_t cap)
{
    const char *path = getenv("PATH");
    make[0] = '\0';
    for (const char *d = path ? path : "/usr/bin"; *d && !make[0];) {
        size_t dl = strcspn(d, ":");
        snprintf(make, cap, "%.*s/make", (int)dl, d);
        if (access(make, X_OK) != 0)
            make[0] = '\0';
        d += dl + (d[dl] == ':');
    }
    cr_assert(make[0], "no make on the PATH");
}

/* `make -n ARGS` (a dry run: nothing is built or installed), its stdout; the caller frees. */
static char *make_dry_run(const char *target)
{
    char make[512];
    find_make(make, sizeof(make));
    char *argv[] = { make, "-n", "--no-print-directory", (char *)target, NULL };
    /* not the jobserver of a make running this suite, nor the variables it was given (make
     * asan passes BUILD=build-asan, which reaches this make through the environment) */
    char *env[] = { "MAKEFLAGS=", "MAKELEVEL=", "MFLAGS=", "BUILD=build", NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, env, 30000, &r), 0, "cannot run make");
    cr_assert_eq(r.status, 0, "make -n %s: exit %d: %s", target, r.status, r.err);
    char *out = r.out;
    free(r.err);
    return out;
}

/* Issue 27: `make run` installed promtool and the HTTP/2 test tools, and a machine without
 * Criterion could not build the binary. The build's targets ask for the build libraries only;
 * make test for the rest. */
Test(setup, make_and_make_run_install_the_build_dependencies_only, .timeout = 60)
{
    static const char *const test_only[] = {
        "libcriterion-dev", "libyaml-dev",    "prometheus",         "promtool",    "nghttp2-client",
        "python3-h2",       "python3-grpcio", "python3-websockets", "dnsmasq-base"
    };
    static const char *const targets[] = { "all", "run", "demo-upstream", "build/retryproxy" };
    for (size_t t = 0; t < sizeof(targets) / sizeof(targets[0]); t++) {
        char *out = make_dry_run(targets[t]);
        cr_expect(strstr(out, "libmicrohttpd-dev"), "make -n %s checks no build dependency:\n%s",
                  targets[t], out);
        for (size_t i = 0; i < sizeof(test_only) / sizeof(test_only[0]); i++)
            cr_expect_null(strstr(out, test_only[i]), "make %s would install %s (a test tool)",
                           targets[t], test_only[i]);
        free(out);
    }
    /* ... which make test does install */
    char *out = make_dry_run("check-tests");
    for (size_t i = 0; i < sizeof(test_only) / sizeof(test_only[0]); i++)
        cr_expect(strstr(out, test_only[i]), "make check-tests does not see to %s", test_only[i]);
    free(out);
}

/* Writes an executable shell script 'name' into 'dir' running 'body'. */
static void fake_tool(const char *dir, const char *name, const char *body)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fprintf(f, "#!/bin/sh\n%s\n", body);
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(chmod(path, 0755), 0);
}

/* Issue 37: a minimal Debian 12 (a container image, a netinst without build tools) has neither a
 * C compiler nor pkg-config, and `make run` went on to fail on `cc: not found`. deps-core
 * installs them with the libraries; here, as a user who is not root (a fake `id` on a PATH of
 * nothing else), it prints the one command to run, which names them. */
Test(setup, deps_core_installs_the_compiler_and_pkg_config_when_missing, .timeout = 60)
{
    char make[512];
    find_make(make, sizeof(make));
    char dir[] = "/tmp/retryproxy-setup-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    fake_tool(dir, "id", "echo 1000");
    char path_env[300];
    snprintf(path_env, sizeof(path_env), "PATH=%s", dir);
    char *env[] = { path_env, "MAKEFLAGS=", "MAKELEVEL=", "MFLAGS=", "BUILD=build", NULL };
    char *argv[] = { make, "--no-print-directory", "deps-core", NULL };
    /* neither cc nor pkg-config; then pkg-config finding every library, but no cc */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            fake_tool(dir, "pkg-config", "exit 0");
        struct proc_result r;
        cr_assert_eq(proc_run(argv, env, 30000, &r), 0, "cannot run make");
        cr_expect_neq(r.status, 0, "pass %d: make deps-core went on without a compiler", pass);
        const char *cmd = strstr(r.err, "apt-get install -y ");
        cr_expect(cmd && strstr(cmd, " gcc ") && strstr(cmd, " libc6-dev "),
                  "pass %d: make deps-core does not install the compiler: %s", pass, r.err);
        cr_expect(cmd && strstr(cmd, " pkg-config "),
                  "pass %d: make deps-core does not install pkg-config: %s", pass, r.err);
        proc_result_free(&r);
    }
    rm_tree(dir);
}

/* The recipe lines of 'target' in the Makefile text 'mk', joined by '\n' (malloc'd). */
static char *recipe_of(const char *mk, const char *target)
{
    char head[64];
    snprintf(head, sizeof(head), "\n%s:", target);
    const char *t = strstr(mk, head);
    cr_assert_not_null(t, "Makefile: no %s target", target);
    const char *p = strchr(t + 1, '\n');
    size_t len = 0;
    while (p && p[1] == '\t') {
        const char *eol = strchr(p + 1, '\n');
        len = (size_t)((eol ? eol : p + strlen(p)) - t);
        p = eol;
    }
    return strndup(t, len);
}

/* Issue 27: the README's demo sent /orders to 127.0.0.1:9002 too, which `make demo-upstream`
 * did not start: 503 after 4 attempts. Every upstream of the config `make run` starts on is
 * one `make demo-upstream` starts. */
Test(setup, demo_upstream_serves_every_upstream_of_the_example_config)
{
    char *mk = proc_read_file("Makefile");
    const char *ec = strstr(mk, "\nEXAMPLE_CONFIG := ");
    cr_assert_not_null(ec, "Makefile: no `EXAMPLE_CONFIG := ` line");
    ec += strlen("\nEXAMPLE_CONFIG := ");
    char config[256];
    snprintf(config, sizeof(config), "%.*s", (int)strcspn(ec, " \n"), ec);
    char *run = recipe_of(mk, "run");
    cr_expect(strstr(run, "-c $(EXAMPLE_CONFIG)"), "make run does not start on $(EXAMPLE_CONFIG)");
    free(run);

    char *recipe = recipe_of(mk, "demo-upstream");
    unsigned ports[8];
    size_t n = 0;
    for (const char *p = recipe; (p = strstr(p, "tests/upstream --port ")) != NULL && n < 8;) {
        p += strlen("tests/upstream --port ");
        ports[n++] = (unsigned)atoi(p);
    }
    cr_assert_gt(n, 0, "make demo-upstream starts no `tests/upstream --port N`:\n%s", recipe);

    json_error_t e;
    json_t *j = json_load_file(config, 0, &e);
    cr_assert_not_null(j, "%s: %s", config, e.text);
    size_t ri, ui, seen = 0;
    json_t *route, *up;
    json_array_foreach(json_object_get(j, "routes"), ri, route)
    {
        json_array_foreach(json_object_get(route, "upstreams"), ui, up)
        {
            const char *url = json_string_value(up);
            cr_assert_not_null(url);
            bool started = false;
            for (size_t i = 0; i < n; i++) {
                char want[64];
                snprintf(want, sizeof(want), "http://127.0.0.1:%u", ports[i]);
                started |= strcmp(url, want) == 0;
            }
            cr_expect(started, "%s: route %s sends to %s, which make demo-upstream does not start",
                      config, json_string_value(json_object_get(route, "name")), url);
            seen++;
        }
    }
    cr_expect_gt(seen, 0, "%s: no upstream", config);
    json_decref(j);
    free(recipe);
    free(mk);
}

/* Issue 27: docs/README.md listed http2.md twice. Each page has one row of its table. */
Test(setup, docs_index_has_one_row_per_page)
{
    char *doc = proc_read_file("docs/README.md");
    cr_assert(*doc);
    size_t rows = 0;
    for (const char *p = doc; (p = strstr(p, "\n| [")) != NULL; p++) {
        const char *end = strchr(p + 4, ']');
        cr_assert_not_null(end);
        char page[64];
        snprintf(page, sizeof(page), "\n| [%.*s]", (int)(end - p - 4), p + 4);
        cr_expect_eq(strstr(p + 1, page), NULL, "docs/README.md: %s has two rows", page + 3);
        rows++;
    }
    cr_expect_geq(rows, 10, "docs/README.md: %zu rows in its table of pages", rows);
    free(doc);
}

/* Issue 37: the README's line of ways to deploy it left out deploy/kubernetes-headless/. Each
 * directory of deploy/ holding a kustomization (a Kubernetes example) is named in it. */
Test(setup, readme_names_every_kubernetes_example_of_deploy)
{
    char *readme = proc_read_file("README.md");
    DIR *d = opendir("deploy");
    cr_assert_not_null(d, "no deploy/ here: run from the repository root");
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        char path[300];
        snprintf(path, sizeof(path), "deploy/%s/kustomization.yaml", e->d_name);
        if (e->d_name[0] == '.' || access(path, F_OK) != 0)
            continue;
        char want[300];
        snprintf(want, sizeof(want), "`deploy/%s/`", e->d_name);
        cr_expect(strstr(readme, want), "README.md does not name %s", want);
        n++;
    }
    closedir(d);
    cr_expect_geq(n, 3, "only %zu Kubernetes examples found under deploy/", n);
    free(readme);
}
