/* Every recording rule and alert of deploy/prometheus/retryproxy-rules.yml is named, in
 * backquotes, by each page that lists them: docs/operations.md, deploy/prometheus/README.md and
 * docs/metrics.md. A rule added to the file and to none of the pages fails here (the gRPC alert
 * and its two rules once went out that way). And every series the rules read is drawn on the
 * Grafana dashboard, so that an alert has a panel to look at. Run from the repository root
 * (make test does).
 */
#include <criterion/criterion.h>

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/proc.h"

#define RULES     "deploy/prometheus/retryproxy-rules.yml"
#define DASHBOARD "deploy/grafana/retryproxy-dashboard.json"

static const char *const pages[] = { "docs/operations.md", "deploy/prometheus/README.md",
                                     "docs/metrics.md" };

#define MAX_RULES 64

struct rule {
    char kind[8]; /* record or alert */
    char name[128];
    int line;
};

/* The rules file's "- record: NAME" and "- alert: NAME" entries, in file order. */
static size_t read_rules(struct rule *out, size_t cap)
{
    char *text = proc_read_file(RULES);
    cr_assert(text[0], "cannot read " RULES " (run from the repository root)");
    size_t n = 0;
    int line = 1;
    for (char *p = text; *p; line++) {
        char *end = p + strcspn(p, "\n");
        bool more = *end;
        *end = '\0'; /* one line at a time: the scan's spaces would go on past a newline */
        char kind[8], name[128];
        if (sscanf(p, " - %7[a-z]: %127[A-Za-z0-9_:]", kind, name) == 2 &&
            (strcmp(kind, "record") == 0 || strcmp(kind, "alert") == 0)) {
            cr_assert_lt(n, cap, RULES ": more than %zu rules", cap);
            snprintf(out[n].kind, sizeof(out[n].kind), "%s", kind);
            snprintf(out[n].name, sizeof(out[n].name), "%s", name);
            out[n].line = line;
            n++;
        }
        p = more ? end + 1 : end;
    }
    free(text);
    return n;
}

Test(rules_docs, every_rule_and_alert_is_named_in_each_page)
{
    struct rule rules[MAX_RULES];
    size_t n = read_rules(rules, MAX_RULES);
    size_t alerts = 0;
    for (size_t i = 0; i < n; i++)
        alerts += strcmp(rules[i].kind, "alert") == 0;
    /* the file's rules were read at all: it had 7 of each when the gRPC ones were added */
    cr_assert_geq(n - alerts, 7, RULES ": only %zu recording rules read", n - alerts);
    cr_assert_geq(alerts, 7, RULES ": only %zu alerts read", alerts);
    for (size_t p = 0; p < sizeof(pages) / sizeof(pages[0]); p++) {
        char *doc = proc_read_file(pages[p]);
        cr_assert(doc[0], "cannot read %s", pages[p]);
        for (size_t i = 0; i < n; i++) {
            char quoted[160];
            snprintf(quoted, sizeof(quoted), "`%s`", rules[i].name);
            cr_expect(strstr(doc, quoted), "%s does not name the %s %s (" RULES ":%d)", pages[p],
                      strcmp(rules[i].kind, "alert") == 0 ? "alert" : "recording rule",
                      rules[i].name, rules[i].line);
        }
        free(doc);
    }
}

Test(rules_docs, every_series_the_rules_read_is_on_the_dashboard)
{
    char *rules = proc_read_file(RULES);
    char *dash = proc_read_file(DASHBOARD);
    cr_assert(rules[0] && dash[0], "cannot read " RULES " or " DASHBOARD);
    size_t names = 0;
    for (const char *p = strstr(rules, "retryproxy_"); p; p = strstr(p + 1, "retryproxy_")) {
        if (p > rules && (p[-1] == '_' || p[-1] == ':' || isalnum((unsigned char)p[-1])))
            continue; /* inside a longer name */
        size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_");
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)n, p);
        names++;
        cr_expect(strstr(dash, name), DASHBOARD " has no panel reading %s, which " RULES " reads",
                  name);
    }
    cr_assert_geq(names, 8, RULES ": only %zu series names read", names);
    free(rules);
    free(dash);
}
