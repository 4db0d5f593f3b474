/* The Prometheus rules under deploy/ against the proxy itself. The rules
 * (deploy/prometheus/retryproxy-rules.yml) and the series their unit tests feed them
 * (retryproxy-rules.test.yml) may name only series a running retryproxy exports on /metrics,
 * with labels it puts on them (or the target labels job and instance), and, for a label whose
 * every value the proxy shows, values it shows: nothing else is scraped, not even a probe (the
 * draining, reload and budget alerts read the proxy's own gauges) (tests/support/promql.h).
 * Every alert has a severity, a runbook and a unit test. Then promtool checks the rules and the
 * example config (prometheus-example.yml) and runs the rules' unit tests. Run from the
 * repository root (make test does). The dashboard: test_monitoring_dashboard.c.
 *
 * promtool comes with Debian's prometheus package, which the Makefile's promtool target installs
 * when it runs as root. Where it could have (root, apt-get) a missing promtool fails the
 * promtool tests; elsewhere they are skipped, saying so.
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

static const char *const severities[] = { "info", "warning", "critical" };
Test(monitoring, rules_read_only_series_the_proxy_exports)
{
    learn_exports();
    struct yfile f;
    read_rules(&f);
    for (size_t i = 0; i < f.n; i++) {
        if (strcmp(f.s[i].key, "expr") != 0)
            continue;
        char where[96];
        snprintf(where, sizeof(where), RULES ":%d", f.s[i].line);
        check_query(f.s[i].value, where, true);
    }
    yaml_free(&f);
}

Test(monitoring, rules_tests_feed_only_series_the_proxy_exports)
{
    learn_exports();
    struct yfile f;
    read_rules(&f);
    yaml_free(&f);
    static const char *const keys[] = { "series", "expr" };
    yaml_read(RULES_TEST, keys, COUNT(keys), &f);
    cr_assert_gt(count_key(&f, "series"), 0, RULES_TEST ": no input_series");
    for (size_t i = 0; i < f.n; i++) {
        char where[96];
        snprintf(where, sizeof(where), RULES_TEST ":%d", f.s[i].line);
        bool series = strcmp(f.s[i].key, "series") == 0;
        struct uses u;
        scan_promql(f.s[i].value, &u);
        /* an input series is what a scrape of the proxy gives, never a recorded one */
        check_uses(&u, where, f.s[i].value, !series);
        if (series)
            cr_expect_eq(u.n_metrics, 1, "%s: a series is one name and its labels: %s", where,
                         f.s[i].value);
    }
    yaml_free(&f);
}

static void heading_slug(const char *h, char *out, size_t cap)
{
    size_t n = 0;
    for (; *h && *h != '\n' && n + 1 < cap; h++) {
        unsigned char c = (unsigned char)*h;
        if (isalnum(c) || c == '-' || c == '_')
            out[n++] = (char)tolower(c);
        else if (c == ' ')
            out[n++] = '-';
    }
    out[n] = '\0';
}

/* Whether docs/operations.md has a heading, or an explicit id, for 'anchor'. */
static bool operations_has_anchor(const char *doc, const char *anchor)
{
    char id[96];
    snprintf(id, sizeof(id), "id=\"%s\"", anchor);
    if (strstr(doc, id))
        return true;
    for (const char *p = doc; p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (*p != '#')
            continue;
        char slug[160];
        heading_slug(skip_space(p + strspn(p, "#")), slug, sizeof(slug));
        if (strcmp(slug, anchor) == 0)
            return true;
    }
    return false;
}

Test(monitoring, every_alert_has_a_severity_a_runbook_and_a_unit_test)
{
    static const char *const keys[] = { "alert",   "record",      "severity",
                                        "summary", "description", "runbook_url" };
    struct yfile f, t;
    yaml_read(RULES, keys, COUNT(keys), &f);
    static const char *const test_keys[] = { "alertname" };
    yaml_read(RULES_TEST, test_keys, COUNT(test_keys), &t);
    char *ops = proc_read_file(OPERATIONS);
    if (!ops[0])
        cr_log_warn(OPERATIONS " does not exist yet: the runbook anchors were not looked for");

    bool anchor_used[COUNT(runbook_anchors)] = { false };
    size_t alerts = 0;
    for (size_t i = 0; i < f.n; i++) {
        if (strcmp(f.s[i].key, "alert") != 0)
            continue;
        alerts++;
        const char *name = f.s[i].value;
        const char *severity = NULL, *summary = NULL, *description = NULL, *runbook = NULL;
        for (size_t k = i + 1;
             k < f.n && strcmp(f.s[k].key, "alert") != 0 && strcmp(f.s[k].key, "record") != 0;
             k++) {
            const char *v = f.s[k].value;
            if (strcmp(f.s[k].key, "severity") == 0)
                severity = v;
            else if (strcmp(f.s[k].key, "summary") == 0)
                summary = v;
            else if (strcmp(f.s[k].key, "description") == 0)
                description = v;
            else
                runbook = v;
        }
        cr_expect(severity && in_list(severity, severities, COUNT(severities)),
                  RULES ":%d: %s: severity is %s, not info, warning or critical", f.s[i].line, name,
                  severity ? severity : "missing");
        cr_expect(summary && summary[0], RULES ":%d: %s has no summary", f.s[i].line, name);
        cr_expect(description && description[0], RULES ":%d: %s has no description", f.s[i].line,
                  name);
        cr_expect(runbook && strstr(runbook, "://"),
                  RULES ":%d: %s: runbook_url %s is relative: an alert receiver cannot follow it",
                  f.s[i].line, name, runbook ? runbook : "missing");
        const char *anchor = runbook && strncmp(runbook, RUNBOOK, strlen(RUNBOOK)) == 0
                                 ? runbook + strlen(RUNBOOK)
                                 : NULL;
        bool known = false;
        for (size_t a = 0; anchor && a < COUNT(runbook_anchors); a++)
            if (strcmp(anchor, runbook_anchors[a]) == 0)
                known = anchor_used[a] = true;
        cr_expect(known,
                  RULES ":%d: %s: runbook_url %s is not " RUNBOOK "ANCHOR of a known section",
                  f.s[i].line, name, runbook ? runbook : "missing");
        if (known && ops[0])
            cr_expect(operations_has_anchor(ops, anchor), "%s: " OPERATIONS " has no section %s",
                      name, anchor);
        bool tested = false;
        for (size_t k = 0; k < t.n && !tested; k++)
            tested = strcmp(t.s[k].value, name) == 0;
        cr_expect(tested, "%s is not tested in " RULES_TEST " (alert_rule_test)", name);
    }
    cr_expect_geq(alerts, COUNT(runbook_anchors));
    for (size_t a = 0; a < COUNT(runbook_anchors); a++)
        cr_expect(anchor_used[a], "no alert points at " RUNBOOK "%s", runbook_anchors[a]);
    free(ops);
    yaml_free(&f);
    yaml_free(&t);
}

Test(monitoring, promtool_checks_the_rules)
{
    need_promtool();
    expect_promtool("check rules " RULES);
}

Test(monitoring, promtool_runs_the_rules_unit_tests)
{
    need_promtool();
    expect_promtool("test rules " RULES_TEST);
}

/* The example config loads the rules and scrapes the proxy, and nothing else: the rules read
 * only the proxy's own series (no blackbox probe for the draining alert any more). */
Test(monitoring, promtool_checks_the_example_config)
{
    char *text = proc_read_file(EXAMPLE);
    cr_expect(strstr(text, "\n  - retryproxy-rules.yml\n"), EXAMPLE " does not load the rules");
    cr_expect(strstr(text, "job_name: retryproxy\n"), EXAMPLE " has no retryproxy job");
    size_t jobs = 0;
    for (const char *p = strstr(text, "job_name:"); p; p = strstr(p + 1, "job_name:"))
        jobs++;
    cr_expect_eq(jobs, 1, EXAMPLE " has %zu scrape jobs: the rules need the proxy's only", jobs);
    cr_expect_null(strstr(text, "/probe"), EXAMPLE " still runs a probe");
    free(text);
    need_promtool();
    expect_promtool("check config " EXAMPLE);
}

/* 'expr' with its Grafana variables replaced so that promtool can parse it: $__interval and
 * the like by 5m, a variable inside a string by .*, any other by 1. */
