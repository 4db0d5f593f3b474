/* routes[].delivery and "store" (docs/config.md, docs/delivery.md): the defaults, dead_letter
 * following the mode unless written (and "defaults" keeping null), a route that keeps requests
 * without a store refused naming the route and its line, the key file read at load, and the
 * sensitive field names checked. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/cfg.h"
#include "tests/support/cfgtext.h"

TestSuite(config_delivery, .timeout = 60);

static struct cfg *load_ok(const char *text)
{
    char *errors;
    struct cfg *c = cfgt_load(text, &errors);
    cr_assert_not_null(c, "refused: %s", errors);
    free(errors);
    return c;
}

static char *load_err(const char *text)
{
    char *errors;
    struct cfg *c = cfgt_load(text, &errors);
    cr_assert_null(c, "accepted: %s", text);
    return errors;
}

Test(config_delivery, defaults_are_sync_without_dead_letters_and_no_store)
{
    struct cfg *c =
        load_ok("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://10.0.0.1\"]}]}");
    const struct cfg_delivery *d = &c->routes[0].delivery;
    cr_expect_eq(d->mode, CFG_DELIVERY_SYNC);
    cr_expect_eq(d->dead_letter, 0);
    cr_expect_eq(d->max_age_ms, 86400000);
    cr_expect_str_eq(d->id_header, "webhook-id");
    cr_expect_eq(d->max_body_bytes, 1048576);
    cr_expect_null(c->store.path);
    cr_expect_null(c->store.key_file);
    cr_expect_eq(c->store.n_sensitive, 0);
    cr_expect_eq(c->store.max_count, 1000000);
    cr_expect_eq(c->store.dead_keep_ms, 0);
    cfg_unref(c);
}

Test(config_delivery, dead_letter_follows_the_mode_unless_written)
{
    struct cfg *c = load_ok("{\"store\": {\"path\": \"/tmp/x.db\"},\n"
                            " \"defaults\": {\"delivery\": {\"max_age_ms\": 60000}},\n"
                            " \"routes\": [\n"
                            "  {\"name\": \"a\", \"upstreams\": [\"http://10.0.0.1\"],\n"
                            "   \"delivery\": {\"mode\": \"durable\"}},\n"
                            "  {\"name\": \"b\", \"upstreams\": [\"http://10.0.0.1\"],\n"
                            "   \"delivery\": {\"mode\": \"durable\", \"dead_letter\": false}},\n"
                            "  {\"name\": \"c\", \"upstreams\": [\"http://10.0.0.1\"],\n"
                            "   \"delivery\": {\"dead_letter\": true}},\n"
                            "  {\"name\": \"d\", \"upstreams\": [\"http://10.0.0.1\"]}]}");
    cr_expect_eq(c->routes[0].delivery.dead_letter, 1);
    cr_expect_eq(c->routes[0].delivery.max_age_ms, 60000, "inherited from defaults");
    cr_expect_eq(c->routes[1].delivery.dead_letter, 0);
    cr_expect_eq(c->routes[2].delivery.mode, CFG_DELIVERY_SYNC);
    cr_expect_eq(c->routes[2].delivery.dead_letter, 1);
    cr_expect_eq(c->routes[3].delivery.dead_letter, 0);
    /* "defaults" shows null: printed and loaded again, a durable route still keeps them */
    cr_expect_eq(c->defaults.delivery.dead_letter, -1);
    json_t *j = cfg_to_json(c);
    cr_expect(json_is_null(json_object_get(
        json_object_get(json_object_get(j, "defaults"), "delivery"), "dead_letter")));
    cr_expect(json_is_true(json_object_get(
        json_object_get(json_array_get(json_object_get(j, "routes"), 0), "delivery"),
        "dead_letter")));
    json_decref(j);
    cfg_unref(c);
}

Test(config_delivery, a_route_that_keeps_requests_needs_a_store)
{
    char *e = load_err("{\"routes\": [\n"
                       "  {\"name\": \"ok\", \"upstreams\": [\"http://10.0.0.1\"]},\n"
                       "  {\"name\": \"hooks\", \"upstreams\": [\"http://10.0.0.1\"],\n"
                       "   \"delivery\": {\"mode\": \"durable\"}},\n"
                       "  {\"name\": \"pay\", \"upstreams\": [\"http://10.0.0.1\"],\n"
                       "   \"delivery\": {\"dead_letter\": true}}]}");
    cr_expect(strstr(e, "4:16: ") && strstr(e, "$.routes[1].delivery: route \"hooks\" is durable"),
              "%s", e);
    cr_expect(strstr(e, "6:16: ") && strstr(e, "$.routes[2].delivery: route \"pay\" keeps dead"),
              "%s", e);
    cr_expect(strstr(e, "set store.path"), "%s", e);
    cr_expect_null(strstr(e, "\"ok\""), "%s", e);
    free(e);
    /* made durable by "defaults": the error says so, at "defaults" */
    e = load_err("{\"defaults\": {\"delivery\": {\"mode\": \"durable\"}},\n"
                 " \"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://10.0.0.1\"]}]}");
    cr_expect(strstr(e, "1:14: $.defaults: route \"a\" is durable"), "%s", e);
    free(e);
}

Test(config_delivery, bad_values_are_named)
{
    char *e = load_err("{\"store\": {\"path\": \"\", \"sensitive_fields\": [\"X Key\"]},\n"
                       " \"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://10.0.0.1\"],\n"
                       "   \"delivery\": {\"mode\": \"later\", \"dead_letter\": \"yes\",\n"
                       "   \"id_header\": \"Host\", \"max_age_ms\": 0}}]}");
    cr_expect(strstr(e, "$.store.path: must name a file"), "%s", e);
    cr_expect(strstr(e, "$.store.sensitive_fields[0]"), "%s", e);
    cr_expect(strstr(e, "$.routes[0].delivery.mode"), "%s", e);
    cr_expect(strstr(e, "$.routes[0].delivery.dead_letter: expected true, false or null"), "%s", e);
    cr_expect(strstr(e, "$.routes[0].delivery.id_header: names a header the proxy sets"), "%s", e);
    cr_expect(strstr(e, "$.routes[0].delivery.max_age_ms"), "%s", e);
    free(e);
}

/* The key is read at load: 32 bytes, or 64 hex digits; anything else is refused there. */
Test(config_delivery, the_key_file_is_read_at_load)
{
    char dir[] = "/tmp/retryproxy-cfgdel-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    const char *bodies[] = {
        "0123456789abcdef0123456789abcdef",                                   /* 32 bytes */
        "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", /* hex */
        "too short\n", NULL
    };
    for (int i = 0; i < 4; i++) {
        char path[96], text[512];
        snprintf(path, sizeof(path), "%s/k%d", dir, i);
        if (bodies[i]) {
            FILE *f = fopen(path, "w");
            cr_assert_not_null(f);
            fputs(bodies[i], f);
            fclose(f);
        }
        snprintf(text, sizeof(text),
                 "{\"store\": {\"path\": \"%s/db\", \"key_file\": \"%s\"},\n"
                 " \"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://10.0.0.1\"]}]}",
                 dir, path);
        char *errors;
        struct cfg *c = cfgt_load(text, &errors);
        if (i < 2) {
            cr_expect_not_null(c, "key %d refused: %s", i, errors);
        } else {
            cr_expect_null(c, "key %d accepted", i);
            cr_expect(strstr(errors, "$.store.key_file:") && strstr(errors, "256-bit key"), "%s",
                      errors);
        }
        cfg_unref(c);
        free(errors);
        unlink(path);
    }
    rmdir(dir);
}

/* store.postgres (docs/delivery.md, "Shared store"): a durable route may use it instead of a
 * file; its namespace defaults to "default". */
Test(config_delivery, a_postgres_store_serves_durable_routes)
{
    struct cfg *c = load_ok(
        "{\"store\": {\"postgres\": {\"url\": \"postgresql://rp@db:5432/rp?sslmode=require\","
        " \"password_file\": \"/run/secrets/pg\"}},\n"
        " \"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://10.0.0.1\"],\n"
        "   \"delivery\": {\"mode\": \"durable\"}}]}");
    cr_expect_str_eq(c->store.postgres.url, "postgresql://rp@db:5432/rp?sslmode=require");
    cr_expect_str_eq(c->store.postgres.password_file, "/run/secrets/pg");
    cr_expect_str_eq(c->store.postgres.ns, "default");
    cr_expect_null(c->store.path);
    cfg_unref(c);
}

/* A password in the config file is read by whoever reads the file: refused, wherever a libpq
 * string can hold one, and never repeated in the error. */
Test(config_delivery, a_password_in_the_postgres_url_is_refused_without_showing_it)
{
    static const char *const urls[] = {
        "postgresql://rp:hunter2@db/rp",
        "postgres://rp:hunter2@db:5432/rp",
        "postgresql://rp@db/rp?sslmode=require&password=hunter2",
        "host=db user=rp password=hunter2",
        "host=db password = hunter2 user=rp",
    };
    for (size_t i = 0; i < sizeof(urls) / sizeof(urls[0]); i++) {
        char text[512];
        snprintf(text, sizeof(text), "{\"store\": {\"postgres\": {\"url\": \"%s\"}}}", urls[i]);
        char *e = load_err(text);
        cr_expect(strstr(e, "$.store.postgres.url: holds a password") &&
                      strstr(e, "password_file") && strstr(e, "PGPASSFILE"),
                  "%s: %s", urls[i], e);
        cr_expect_null(strstr(e, "hunter2"), "the password is shown: %s", e);
        free(e);
    }
    /* a user without a password, and a key named like one, are fine */
    struct cfg *c =
        load_ok("{\"store\": {\"postgres\": {\"url\": \"host=db user=passworder\"}},"
                " \"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://10.0.0.1\"]}]}");
    cfg_unref(c);
}

Test(config_delivery, a_file_and_a_postgres_store_are_exclusive_and_the_namespace_checked)
{
    char *e = load_err("{\"store\": {\"path\": \"/tmp/x.db\",\n"
                       "  \"postgres\": {\"url\": \"postgresql://rp@db/rp\"}}}");
    cr_expect(strstr(e, "2:15: $.store.postgres: store.path and store.postgres.url are exclusive"),
              "%s", e);
    free(e);
    e = load_err("{\"store\": {\"postgres\": {\"url\": \"postgresql://rp@db/rp\","
                 " \"namespace\": \"a b\"}}}");
    cr_expect(strstr(e, "$.store.postgres.namespace: may hold letters"), "%s", e);
    free(e);
}
