/* docs/endpoints.md against docs/config.md, which the schema generates: the resolver table
 * names every resolver.* key of the config with its default, and no other; the balance table
 * every value routes[].balance takes, its default marked. A key or a default changed in the
 * schema and not on the page, or the other way, fails here. Run from the repository root (make
 * test does).
 */
#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/proc.h"

#define PAGE   "docs/endpoints.md"
#define CONFIG "docs/config.md"

#define MAX_ROWS 16

struct row {
    char key[64];
    char value[64]; /* a cell's first text in backquotes, without JSON quotes */
};

/* The first `...` of the cell that starts at p (up to the next '|'), without JSON quotes. */
static void first_code(const char *p, char *out, size_t cap)
{
    const char *end = strchr(p, '|'), *q = strchr(p, '`');
    out[0] = '\0';
    if (!q || (end && q > end))
        return;
    q++;
    size_t n = strcspn(q, "`");
    if (n >= 2 && q[0] == '"' && q[n - 1] == '"') {
        q++;
        n -= 2;
    }
    snprintf(out, cap, "%.*s", (int)n, q);
}

/* The rows of 'doc' whose first cell is `PREFIX...`: the key and the first code of the cell
 * 'cell' (1: the one after the key). */
static size_t rows_of(const char *doc, const char *prefix, int cell, struct row *out)
{
    char start[80];
    size_t n = 0;
    snprintf(start, sizeof(start), "\n| `%s", prefix);
    for (const char *p = doc; (p = strstr(p, start)) != NULL; p++) {
        cr_assert_lt(n, MAX_ROWS);
        const char *k = p + 4;
        snprintf(out[n].key, sizeof(out[n].key), "%.*s", (int)strcspn(k, "`"), k);
        const char *c = k;
        for (int i = 0; i < cell && c; i++)
            c = strchr(c, '|') ? strchr(c, '|') + 1 : NULL;
        cr_assert_not_null(c, "%s: the row of %s has no cell %d", PAGE, out[n].key, cell + 1);
        first_code(c, out[n].value, sizeof(out[n].value));
        n++;
    }
    return n;
}

static const struct row *find(const struct row *rows, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(rows[i].key, key) == 0)
            return &rows[i];
    return NULL;
}

Test(endpoints_docs, resolver_table_has_every_key_with_its_default)
{
    char *page = proc_read_file(PAGE), *config = proc_read_file(CONFIG);
    cr_assert(page[0] && config[0], "cannot read " PAGE " or " CONFIG);
    struct row doc[MAX_ROWS], cfg[MAX_ROWS];
    size_t nd = rows_of(page, "resolver.", 1, doc);
    /* config.md: key | type | default | ... */
    size_t nc = rows_of(config, "resolver.", 2, cfg);
    cr_expect_geq(nc, 5, CONFIG ": %zu resolver.* keys", nc);
    for (size_t i = 0; i < nc; i++) {
        const struct row *r = find(doc, nd, cfg[i].key);
        cr_expect_not_null(r, PAGE ": the resolver table has no row for %s", cfg[i].key);
        if (r)
            cr_expect_str_eq(r->value, cfg[i].value,
                             PAGE ": %s defaults to `%s`, " CONFIG " says `%s`", r->key, r->value,
                             cfg[i].value);
    }
    for (size_t i = 0; i < nd; i++)
        cr_expect_not_null(find(cfg, nc, doc[i].key), PAGE ": %s is no key of " CONFIG, doc[i].key);
    free(page);
    free(config);
}

Test(endpoints_docs, balance_table_has_every_value_and_the_default)
{
    char *page = proc_read_file(PAGE), *config = proc_read_file(CONFIG);
    cr_assert(page[0] && config[0], "cannot read " PAGE " or " CONFIG);
    const char *row = strstr(config, "\n| `routes[].balance` |");
    cr_assert_not_null(row, CONFIG ": no row for routes[].balance");
    const char *type = strchr(row + 3, '|') + 1, *dflt = strchr(type, '|') + 1;
    char want[64];
    first_code(dflt, want, sizeof(want));

    /* the type cell: one of `a`, `b`, `c` */
    size_t values = 0;
    for (const char *p = type; (p = strchr(p, '`')) != NULL && p < dflt; p++) {
        size_t n = strcspn(p + 1, "`");
        char value[64], cell[96];
        snprintf(value, sizeof(value), "%.*s", (int)n, p + 1);
        snprintf(cell, sizeof(cell), "\n| `%s`", value);
        const char *hit = strstr(page, cell);
        cr_expect_not_null(hit, PAGE ": the balance table has no row for %s", value);
        bool marked = hit && strncmp(hit + strlen(cell), " (default)", 10) == 0;
        cr_expect_eq(marked, strcmp(value, want) == 0,
                     PAGE ": %s is %smarked (default); " CONFIG " says the default is %s", value,
                     marked ? "" : "not ", want);
        values++;
        p += n + 1;
    }
    cr_expect_geq(values, 3, CONFIG ": routes[].balance takes %zu values", values);
    free(page);
    free(config);
}
