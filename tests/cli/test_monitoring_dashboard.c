/* The Grafana dashboard under deploy/ against the proxy itself: its queries
 * (deploy/grafana/retryproxy-dashboard.json) may name only series a running retryproxy exports
 * on /metrics, with labels and label values it shows (tests/support/promql.h), and promtool
 * parses every one of them (skipped, saying so, where promtool is missing and could not have
 * been installed: see test_monitoring.c). Run from the repository root (make test does).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <ctype.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/dnsmasq.h"
#include "tests/support/fixture.h"
#include "tests/support/monfiles.h"
#include "tests/support/seed.h"

TestSuite(monitoring, .fini = fx_stop, .timeout = 60);

Test(monitoring, dashboard_queries_read_only_series_the_proxy_exports)
{
    learn_exports();
    json_t *d = load_dashboard();
    struct dash_query q[64];
    size_t n = 0;
    collect_exprs(json_object_get(d, "panels"), "?", q, COUNT(q), &n);
    cr_assert_geq(n, 12, DASHBOARD ": %zu queries", n);
    for (size_t i = 0; i < n; i++)
        check_query(q[i].expr, q[i].where, false);

    /* every panel queries something */
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(d, "panels"), i, p)
    {
        const char *type = json_string_value(json_object_get(p, "type"));
        const char *title = json_string_value(json_object_get(p, "title"));
        if (type && strcmp(type, "row") == 0)
            continue;
        json_t *targets = json_object_get(p, "targets");
        cr_expect(json_array_size(targets) > 0, DASHBOARD ", panel \"%s\": no targets", title);
        size_t k;
        json_t *t;
        json_array_foreach(targets, k, t)
        {
            cr_expect(json_is_string(json_object_get(t, "expr")),
                      DASHBOARD ", panel \"%s\": target %zu has no expr", title, k);
        }
    }

    /* the template variables' label_values(); none stands for a value of the config typed in by
     * hand (a textbox, a constant, a custom list): the proxy exports its settings */
    size_t vars = 0;
    json_array_foreach(json_object_get(json_object_get(d, "templating"), "list"), i, p)
    {
        const char *type = json_string_value(json_object_get(p, "type"));
        cr_expect(type && (strcmp(type, "query") == 0 || strcmp(type, "datasource") == 0),
                  DASHBOARD ", variable %s: a %s variable; read the value from /metrics instead",
                  json_string_value(json_object_get(p, "name")), type ? type : "typeless");
        if (!type || strcmp(type, "query") != 0)
            continue;
        char where[128];
        snprintf(where, sizeof(where), DASHBOARD ", variable %s",
                 json_string_value(json_object_get(p, "name")));
        const json_t *query = json_object_get(p, "query");
        const char *def = json_string_value(json_object_get(p, "definition"));
        const char *qs = json_is_object(query) ? json_string_value(json_object_get(query, "query"))
                                               : json_string_value(query);
        cr_expect(def || qs, "%s: no query", where);
        if (def)
            check_label_values(def, where);
        if (qs)
            check_label_values(qs, where);
        vars++;
    }
    cr_expect_geq(vars, 1, DASHBOARD ": no query variables");
    json_decref(d);
}

/* Slug of a Markdown heading as GitHub makes it: lower case, spaces to '-', punctuation
 * dropped. */
static void substitute_variables(const char *expr, char *out, size_t cap)
{
    size_t n = 0;
    char quote = 0;
    for (const char *p = expr; *p;) {
        cr_assert_lt(n + 8, cap, "a query too long: %s", expr);
        if (*p != '$') {
            if (quote && *p == '\\' && p[1]) {
                out[n++] = *p++;
            } else if (quote ? *p == quote : (*p == '"' || *p == '\'' || *p == '`')) {
                quote = quote ? 0 : *p;
            }
            out[n++] = *p++;
            continue;
        }
        p++;
        const char *name = *p == '{' ? p + 1 : p;
        if (*p == '{')
            p = strchr(p, '}') ? strchr(p, '}') + 1 : p + strlen(p);
        else
            p += ident_len(p);
        const char *with = strncmp(name, "__", 2) == 0 ? "5m" : quote ? ".*" : "1";
        memcpy(out + n, with, strlen(with));
        n += strlen(with);
    }
    out[n] = '\0';
}

Test(monitoring, promtool_parses_every_dashboard_query)
{
    need_promtool();
    json_t *d = load_dashboard();
    struct dash_query q[64];
    size_t n = 0;
    collect_exprs(json_object_get(d, "panels"), "?", q, COUNT(q), &n);
    cr_assert_gt(n, 0);

    char dir[] = "/tmp/retryproxy-monitoring-XXXXXX", path[96], args[160];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/query.yml", dir);
    snprintf(args, sizeof(args), "check rules %s", path);
    /* one query at a time, so that a failure names its panel */
    for (size_t i = 0; i < n; i++) {
        char expr[2048];
        substitute_variables(q[i].expr, expr, sizeof(expr));
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f);
        fprintf(f,
                "# %s\ngroups:\n  - name: dashboard\n    rules:\n"
                "      - record: dashboard_query\n        expr: |\n",
                q[i].where);
        for (const char *l = expr; *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != '\0'))
            fprintf(f, "          %.*s\n", (int)strcspn(l, "\n"), l);
        fclose(f);
        char *out;
        int rc = run_capture(args, &out);
        cr_expect_eq(rc, 0, "%s: promtool cannot parse the query (variables replaced):\n%s\n%s",
                     q[i].where, expr, out);
        free(out);
    }
    rm_tree(dir);
    json_decref(d);
}
