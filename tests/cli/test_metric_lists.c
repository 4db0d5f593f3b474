/* Lists of names the binary defines, where a page repeats them by hand: the README's list of
 * metric families (and their labels) against `retryproxy reference --metrics`, the table that
 * docs/metrics.md holds (tests/cli/test_cli_docs.c keeps that one in step), and the README's
 * request log line against docs/logs.md's. A family added to the proxy, or a field to the log
 * line, fails here until the README has it too. Run from the repository root (make test does).
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/docjson.h"
#include "tests/support/proc.h"

#define README     "README.md"
#define LOGS_MD    "docs/logs.md"
#define LIST_START "<!-- metrics list:"
#define LIST_END   "<!-- end of the metrics list -->"
#define MAX_FAMILY 80
#define PREFIX     "retryproxy_"
#define NAME_CAP   96
#define LABELS_CAP 96

/* A family as "name{label,label}" ("name" without labels), the name after the prefix. */
struct family {
    char text[NAME_CAP + LABELS_CAP];
    bool seen;
};

/* The families `retryproxy reference --metrics` prints, one row of its table each: the name
 * without retryproxy_ and the labels in order, their fixed values left out. */
static size_t reference_families(struct family *out, size_t cap)
{
    char *argv[] = { (char *)proc_bin(), "reference", "--metrics", NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 10000, &r), 0);
    cr_assert_eq(r.status, 0, "%s", r.err);
    size_t n = 0;
    for (const char *line = r.out; line && *line;
         line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, "| `", 3) != 0)
            continue;
        cr_assert_lt(n, cap, "more than %zu families", cap);
        const char *name = line + 3;
        size_t nl = strcspn(name, "`");
        if (strncmp(name, PREFIX, strlen(PREFIX)) == 0) {
            name += strlen(PREFIX);
            nl -= strlen(PREFIX);
        }
        char *t = out[n].text;
        snprintf(t, NAME_CAP, "%.*s", (int)nl, name);
        /* the third column: `a`, `b` (`v1`, `v2`) */
        const char *col = line;
        for (int bars = 0; bars < 2 && col; bars++)
            col = strchr(col + 1, '|');
        cr_assert_not_null(col, "cannot read the row: %.80s", line);
        const char *end = strchr(col + 1, '|');
        size_t labels = 0;
        for (const char *p = col + 1; p < end; p++) {
            if (*p == '(') {
                p = strchr(p, ')');
                continue;
            }
            if (*p != '`')
                continue;
            size_t ln = strcspn(p + 1, "`");
            snprintf(t + strlen(t), NAME_CAP + LABELS_CAP - strlen(t), "%s%.*s",
                     labels++ ? "," : "{", (int)ln, p + 1);
            p += ln + 1;
        }
        if (labels)
            strcat(t, "}");
        out[n].seen = false;
        n++;
    }
    proc_result_free(&r);
    cr_assert_gt(n, 0, "`retryproxy reference --metrics` printed no family");
    return n;
}

Test(metric_lists, readme_lists_every_family_the_binary_exports_with_its_labels)
{
    struct family fam[MAX_FAMILY];
    size_t n = reference_families(fam, MAX_FAMILY);
    char *doc = proc_read_file(README);
    const char *start = strstr(doc, LIST_START);
    cr_assert_not_null(start, README " has no line starting with " LIST_START);
    start = strchr(start, '\n');
    const char *end = strstr(start, LIST_END);
    cr_assert_not_null(end, README ": the metrics list has no " LIST_END);

    /* every code span of the list is one family as name{labels} */
    size_t listed = 0;
    for (const char *p = strchr(start, '`'); p && p < end; p = strchr(p + 1, '`')) {
        size_t len = strcspn(p + 1, "`");
        char span[NAME_CAP + LABELS_CAP];
        cr_assert_lt(len, sizeof(span), README ": a code span too long: %.40s", p + 1);
        snprintf(span, sizeof(span), "%.*s", (int)len, p + 1);
        p += len + 1;
        listed++;
        bool found = false;
        for (size_t i = 0; i < n && !found; i++)
            if (strcmp(fam[i].text, span) == 0)
                found = fam[i].seen = true;
        if (!found) {
            /* say whether the name is wrong or its labels */
            const char *as = NULL;
            size_t nl = strcspn(span, "{");
            for (size_t i = 0; i < n; i++)
                if (strncmp(fam[i].text, span, nl) == 0 && strchr("{", fam[i].text[nl]))
                    as = fam[i].text;
            cr_expect_fail(README
                           ": the metrics list has `%s`, which the binary does not export%s%s",
                           span, as ? "; it exports " : "", as ? as : "");
        }
    }
    for (size_t i = 0; i < n; i++)
        cr_expect(fam[i].seen,
                  README ": the metrics list leaves out `%s` (`retryproxy reference --metrics`); "
                         "add it, with its labels, between the list's two comment lines",
                  fam[i].text);
    cr_expect_eq(listed, n, README ": %zu families listed, the binary exports %zu", listed, n);
    free(doc);
}

/* The README's request line has the fields of docs/logs.md's, in the same order. */
Test(metric_lists, readme_request_log_line_has_the_fields_of_logs_md)
{
    json_t *readme = docjson_block(README, "**Logs**");
    json_t *logs = docjson_block(LOGS_MD, "### The request line");
    cr_expect_str_eq(json_string_value(json_object_get(readme, "msg")), "request");
    void *a = json_object_iter(readme), *b = json_object_iter(logs);
    for (; a && b; a = json_object_iter_next(readme, a), b = json_object_iter_next(logs, b))
        cr_expect_str_eq(json_object_iter_key(a), json_object_iter_key(b),
                         README "'s log example has %s where " LOGS_MD "'s has %s",
                         json_object_iter_key(a), json_object_iter_key(b));
    cr_expect_null(a, README "'s log example has %s, which " LOGS_MD "'s has not",
                   a ? json_object_iter_key(a) : "");
    cr_expect_null(b, README "'s log example lacks %s (" LOGS_MD " has it)",
                   b ? json_object_iter_key(b) : "");
    json_decref(readme);
    json_decref(logs);
}
