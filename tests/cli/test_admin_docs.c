/* docs/admin.md's example answers against what the binary serves: the `GET /upstreams` example
 * has exactly the fields of the running proxy's answer, at every level (a route, an upstream,
 * its name's lookup, an endpoint). A field added to the answer, or shown and no longer
 * served, fails here until the page has it. And the pages that list the admin paths again
 * (docs/deploy.md, the README) name each path of admin.md's table. Run from the repository
 * root (make test does).
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/docjson.h"
#include "tests/support/harness.h"

#define ADMIN_MD "docs/admin.md"

/* 'doc' and 'got' have the same keys, and so have their values that are objects (or arrays
 * of objects: each of got's elements against each of doc's) on both sides; 'where' is the
 * JSON path so far. */
static void same_fields(const json_t *doc, const json_t *got, const char *where)
{
    char at[256];
    if (json_is_array(doc) && json_is_array(got)) {
        for (size_t i = 0; i < json_array_size(got); i++)
            for (size_t k = 0; k < json_array_size(doc); k++) {
                snprintf(at, sizeof(at), "%s[%zu]", where, i);
                same_fields(json_array_get(doc, k), json_array_get(got, i), at);
            }
        return;
    }
    if (!json_is_object(doc) || !json_is_object(got))
        return; /* a value, or null on one side (ejected_until) */
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)got, key, v)
    {
        cr_expect_not_null(json_object_get(doc, key),
                           "the proxy serves %s.%s, which " ADMIN_MD "'s example leaves out", where,
                           key);
    }
    json_object_foreach((json_t *)doc, key, v)
    {
        json_t *g = json_object_get(got, key);
        cr_expect_not_null(g, ADMIN_MD "'s example shows %s.%s, which the proxy does not serve",
                           where, key);
        snprintf(at, sizeof(at), "%s.%s", where, key);
        if (g)
            same_fields(v, g, at);
    }
}

Test(admin_docs, upstreams_example_has_exactly_the_fields_served, .timeout = 30)
{
    /* ejection on, an IP literal (its "dns" has every field, with "result": "none") */
    struct px *px =
        px_start("{\"routes\": [{\"name\": \"r\", \"upstreams\": "
                 "[\"http://127.0.0.1:9\"], \"ejection\": {\"consecutive_failures\": 1}}]}",
                 NULL);
    char url[128];
    struct http_resp r;
    http_do("GET", px_admin_url(px, "/upstreams", url, sizeof(url)), NULL, NULL, 0, 10000, &r);
    cr_assert_eq(r.status, 200, "GET /upstreams: %ld", r.status);
    json_error_t err;
    json_t *got = json_loadb((const char *)r.body, r.body_len, 0, &err);
    cr_assert_not_null(got, "GET /upstreams: no JSON: %s", err.text);
    http_free(&r);
    px_stop_clean(px);

    json_t *ups = json_object_get(json_array_get(json_object_get(got, "routes"), 0), "upstreams");
    json_t *up = json_array_get(ups, 0);
    cr_assert(json_is_object(json_object_get(up, "dns")) &&
                  json_array_size(json_object_get(up, "endpoints")) == 1,
              "GET /upstreams: the upstream has no \"dns\" or not its one endpoint");
    json_t *doc = docjson_block(ADMIN_MD, "## `GET /upstreams`");
    same_fields(doc, got, "$");
    json_decref(doc);
    json_decref(got);
}

/* Each path of admin.md's table of requests ("| `GET /healthz` |") is named in docs/deploy.md's
 * list of what the admin listener serves and in the README's admin table. */
Test(admin_docs, deploy_md_and_the_readme_name_every_admin_path)
{
    char *admin = proc_read_file(ADMIN_MD), *deploy = proc_read_file("docs/deploy.md");
    char *readme = proc_read_file("README.md");
    const char *probes = strstr(deploy, "## Probes and metrics");
    cr_assert_not_null(probes, "docs/deploy.md has no ## Probes and metrics");
    const char *probes_end = strstr(probes + 1, "\n## ");
    size_t n = 0;
    for (const char *p = admin; (p = strstr(p, "\n| `")) != NULL; p++) {
        const char *path = strchr(p + 4, '/'), *end = path ? path + strcspn(path, "`?") : NULL;
        if (!path || path > strchr(p + 4, '`'))
            continue; /* a row of another table (a status) */
        char want[64];
        snprintf(want, sizeof(want), "`%.*s`", (int)(end - path), path);
        const char *in = strstr(probes, want);
        cr_expect(in && (!probes_end || in < probes_end),
                  "docs/deploy.md's ## Probes and metrics does not name %s", want);
        snprintf(want, sizeof(want), "%.*s", (int)(end - path), path);
        cr_expect(strstr(readme, want), "README.md does not name %s", want);
        n++;
    }
    cr_expect_geq(n, 7, ADMIN_MD ": only %zu paths found in its table", n);
    free(admin);
    free(deploy);
    free(readme);
}
