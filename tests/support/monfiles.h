/* monfiles -- the monitoring files under deploy/ as the monitoring suites
 * (tests/cli/test_monitoring*.c) read them: the Prometheus rules and their unit tests (a reader
 * of the YAML they are written in, enough for them), promtool, and the Grafana dashboard's
 * queries.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_MONFILES_H
#define RETRYPROXY_TESTS_SUPPORT_MONFILES_H

#include <jansson.h>
#include <stddef.h>

#include "tests/support/promql.h"

#define RULES      "deploy/prometheus/retryproxy-rules.yml"
#define RULES_TEST "deploy/prometheus/retryproxy-rules.test.yml"
#define EXAMPLE    "deploy/prometheus/prometheus-example.yml"
#define DASHBOARD  "deploy/grafana/retryproxy-dashboard.json"
#define OPERATIONS "docs/operations.md"

/* Where every runbook_url points: absolute (Alertmanager cannot follow a relative link), under
 * the placeholder base deploy/prometheus/README.md tells operators to replace. */
#define RUNBOOK "https://retryproxy.example/docs/operations.md#"

#define MAX_SCALARS 256

struct yscalar {
    int line;
    char key[24];
    char *value;
};

struct yfile {
    struct yscalar s[MAX_SCALARS];
    size_t n;
};

/* The values of 'keys' in the YAML file 'path', in file order. It reads what these files use: a
 * one-line value (plain, '...' or "...") or a block scalar (| or >) whose lines are indented
 * deeper than its key, and fails the test on anything else behind one of these keys (a plain
 * value continued on the next line, a quoted one that does not end on its line), so that no
 * part of a query goes unread. */
void yaml_read(const char *path, const char *const *keys, size_t n_keys, struct yfile *f);

void yaml_free(struct yfile *f);

size_t count_key(const struct yfile *f, const char *key);

/* Reads the rules file's record, alert and expr values and learns the recorded names. */
void read_rules(struct yfile *f);

/* Returns when promtool is on PATH. Otherwise the test fails where the Makefile's promtool
 * target could have installed it (root, apt-get), and is skipped elsewhere, saying so. */
void need_promtool(void);

/* Runs `promtool ARGS`, its stdout and stderr in *out (malloc'd); its exit status, -1 if it
 * did not exit. */
int run_capture(const char *args, char **out);

void expect_promtool(const char *args);

struct dash_query {
    char where[160];
    const char *expr; /* borrowed from the dashboard */
};

/* Collects every "expr" of the dashboard, named after the panel it is in. */
void collect_exprs(const json_t *j, const char *panel, struct dash_query *q, size_t cap, size_t *n);

/* A template variable's label_values(SERIES{...}, LABEL) or label_values(LABEL): the series
 * one the proxy exports, the label one of its. */
void check_label_values(const char *query, const char *where);

json_t *load_dashboard(void);

/* The sections of docs/operations.md the alerts' runbook_url point at: each is used. */
extern const char *const runbook_anchors[17];

#endif
