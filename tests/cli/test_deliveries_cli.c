/* `retryproxy deliveries list|show|replay|drop` (docs/cli.md, docs/delivery.md "CLI"), run as
 * users run it against a store filled beforehand (tests/support/seed.h): the table and --json,
 * the filters, replay and drop by id and by filter, the usage errors (one line and the hint),
 * credentials never shown, and a running proxy sharing the file. */
#include <criterion/criterion.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tests/support/fixture.h"
#include "tests/support/proc.h"
#include "tests/support/seed.h"

TestSuite(deliveries_cli, .fini = fx_stop, .timeout = 120);

static struct seeded sd;
static char cfg_file[200];

/* A seeded store and a config naming it (no proxy). */
static void seed(void)
{
    const char *dir = fx_config_dir("deliveries-cli");
    char db[160];
    snprintf(db, sizeof(db), "%s/deliveries.db", dir);
    seed_store(db, &sd);
    char *cfg = seed_config(db, seed_key_file(dir), "http://127.0.0.1:9");
    snprintf(cfg_file, sizeof(cfg_file), "%s/deliveries.json", dir);
    FILE *f = fopen(cfg_file, "w");
    cr_assert_not_null(f);
    fputs(cfg, f);
    fclose(f);
    free(cfg);
}

/* retryproxy deliveries ARGS... (NULL-terminated); no credential in its output either way. */
static struct proc_result dl(const char *a0, ...)
{
    char *argv[24] = { (char *)proc_bin(), "deliveries" };
    va_list ap;
    va_start(ap, a0);
    proc_args(argv, 24, 2, a0, ap);
    va_end(ap);
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 60000, &r), 0);
    cr_assert_neq(r.status, -1, "timed out");
    cr_expect_null(strstr(r.out, "sEcReT"), "a credential in the output: %s", r.out);
    cr_expect_null(strstr(r.err, "sEcReT"), "a credential in stderr: %s", r.err);
    cr_expect_null(strstr(r.out, SEED_API_KEY));
    return r;
}

static json_t *json_of(struct proc_result *r)
{
    cr_assert_eq(r->status, 0, "exit %d: %s", r->status, r->err);
    json_t *j = json_loads(r->out, 0, NULL);
    cr_assert_not_null(j, "not JSON: %s", r->out);
    proc_result_free(r);
    return j;
}

Test(deliveries_cli, list_prints_a_table_and_takes_the_filters_and_json)
{
    seed();
    struct proc_result r = dl("list", "-c", cfg_file, NULL);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_expect(strncmp(r.out, "ID ", 3) == 0, "a header first: %s", r.out);
    cr_expect_not_null(strstr(r.out, sd.dead_a));
    cr_expect_not_null(strstr(r.out, "5 of 5"), "%s", r.out);
    proc_result_free(&r);

    r = dl("list", "-c", cfg_file, "--route", "hooks", "--state", "dead", "--json", NULL);
    json_t *j = json_of(&r);
    cr_expect_eq(json_integer_value(json_object_get(j, "total")), 2);
    json_decref(j);
    /* --dead is --state dead: the dead letters, every route's */
    r = dl("list", "-c", cfg_file, "--dead", "--json", NULL);
    j = json_of(&r);
    cr_expect_eq(json_integer_value(json_object_get(j, "total")), 3);
    json_decref(j);
    r = dl("list", "-c", cfg_file, "--status", "500", "--json", NULL);
    j = json_of(&r);
    cr_expect_str_eq(json_str(json_array_get(json_object_get(j, "deliveries"), 0), "id"), sd.other);
    json_decref(j);
    r = dl("list", "-c", cfg_file, "--limit", "2", "--order", "newest", NULL);
    cr_expect_not_null(strstr(r.out, "2 of 5 (next page: --cursor "), "%s", r.out);
    proc_result_free(&r);
}

Test(deliveries_cli, show_prints_the_attempts_and_redacts_credentials)
{
    seed();
    struct proc_result r = dl("show", sd.dead_a, "-c", cfg_file, NULL);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_expect_not_null(strstr(r.out, "Authorization: [redacted]"), "%s", r.out);
    cr_expect_not_null(strstr(r.out, "X-Api-Key: [redacted]"), "%s", r.out);
    cr_expect_not_null(strstr(r.out, "reason: final"), "%s", r.out);
    cr_expect_not_null(strstr(r.out, " 503  status"), "the attempt: %s", r.out);
    proc_result_free(&r);
    r = dl("show", sd.dead_a, "-c", cfg_file, "--json", NULL);
    json_t *j = json_of(&r);
    cr_expect_str_eq(json_str(j, "state"), "dead");
    json_decref(j);
    r = dl("show", "0123456789abcdef0123456789abcdef", "-c", cfg_file, NULL);
    cr_expect_eq(r.status, 1);
    cr_expect_not_null(strstr(r.err, "no delivery has the id"), "%s", r.err);
    proc_result_free(&r);
}

Test(deliveries_cli, replay_and_drop_by_id_and_by_filter_are_logged)
{
    seed();
    struct proc_result r = dl("replay", sd.flying, "-c", cfg_file, NULL);
    cr_expect_eq(r.status, 1);
    cr_expect_not_null(strstr(r.err, "in flight"), "%s", r.err);
    proc_result_free(&r);
    r = dl("replay", sd.dead_b, "-c", cfg_file, NULL);
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect_not_null(strstr(r.err, "delivery replayed"), "logged on stderr: %s", r.err);
    proc_result_free(&r);

    r = dl("replay", "-c", cfg_file, "--state", "dead", "--dry-run", NULL);
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect_str_eq(r.out, "2 deliveries match (dry run: nothing replayed)\n");
    proc_result_free(&r);
    r = dl("replay", "-c", cfg_file, "--state", "dead", "--rate", "5", "--json", NULL);
    cr_expect_not_null(strstr(r.err, "deliveries replayed by filter"), "%s", r.err);
    json_t *j = json_of(&r);
    cr_expect_eq(json_integer_value(json_object_get(j, "replayed")), 2);
    json_decref(j);

    r = dl("drop", sd.other, "-c", cfg_file, NULL);
    cr_expect_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    r = dl("drop", "-c", cfg_file, "--route", "hooks", NULL);
    cr_expect_str_eq(r.out, "dropped 4 deliveries\n", "%s", r.err);
    proc_result_free(&r);
    r = dl("list", "-c", cfg_file, "--json", NULL);
    j = json_of(&r);
    cr_expect_eq(json_integer_value(json_object_get(j, "total")), 0);
    json_decref(j);
}

/* A usage error: exit 2, one line and the hint, nothing on stdout. */
static void expect_usage(struct proc_result r, const char *words)
{
    cr_expect_eq(r.status, 2, "exit %d: %s", r.status, r.err);
    cr_expect_str_eq(r.out, "");
    cr_expect_not_null(strstr(r.err, words), "%s", r.err);
    const char *nl = strchr(r.err, '\n');
    cr_expect(nl && strcmp(nl + 1, "Try 'retryproxy --help'.\n") == 0, "one line + hint: %s",
              r.err);
    proc_result_free(&r);
}

Test(deliveries_cli, usage_errors_are_one_line_and_the_hint)
{
    expect_usage(dl(NULL), "deliveries: name an action");
    expect_usage(dl("frob", NULL), "unknown action 'frob'");
    expect_usage(dl("show", "-c", "x.json", NULL), "show needs an ID");
    expect_usage(dl("drop", "-c", "x.json", NULL), "drop needs an ID or a filter");
    expect_usage(dl("list", "--state", "asleep", NULL), "--state must be scheduled, in_flight");
    expect_usage(dl("show", "nothex", NULL), "'nothex' is no delivery id");
    expect_usage(dl("replay", "--state", "dead", "--rate", "0", NULL), "--rate must be");
    expect_usage(dl("list", "--bogus", NULL), "deliveries: unknown option '--bogus'");
}

Test(deliveries_cli, without_a_store_it_says_so)
{
    const char *dir = fx_config_dir("deliveries-cli-none");
    snprintf(cfg_file, sizeof(cfg_file), "%s/plain.json", dir);
    FILE *f = fopen(cfg_file, "w");
    cr_assert_not_null(f);
    fputs("{\"routes\": [{\"name\": \"r\", \"upstreams\": [\"http://127.0.0.1:9\"]}]}", f);
    fclose(f);
    struct proc_result r = dl("list", "-c", cfg_file, NULL);
    cr_expect_eq(r.status, 1);
    cr_expect_not_null(
        strstr(r.err, "the config names no store (store.path or store.postgres.url)"), "%s", r.err);
    proc_result_free(&r);
}

Test(deliveries_cli, works_beside_a_running_proxy_on_the_same_file)
{
    seed();
    char *text = proc_read_file(cfg_file);
    cr_assert_not_null(text);
    fx_start(text, NULL);
    free(text);
    struct proc_result r = dl("replay", sd.dead_a, "-c", cfg_file, NULL);
    cr_expect_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    char path[96];
    snprintf(path, sizeof(path), "/deliveries/%s", sd.dead_a);
    json_t *j = fx_admin_get_json(path);
    cr_expect_eq(json_integer_value(json_object_get(j, "replays")), 1, "the proxy sees it");
    json_decref(j);
}
