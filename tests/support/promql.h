/* promql -- what a running retryproxy exports, and PromQL queries checked against it: the
 * monitoring suites (tests/cli/test_monitoring*.c) learn every series name, label and label value
 * from a proxy's /metrics after a scenario that makes them appear (learn_exports()), then read a
 * query's selectors and matchers and check each names only series the proxy exports, with
 * labels it puts on them (or the target labels job and instance), and, for a label whose every
 * value the proxy shows, values it shows.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_PROMQL_H
#define RETRYPROXY_TESTS_SUPPORT_PROMQL_H

#include <stdbool.h>
#include <stddef.h>

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Labels Prometheus adds to every series it scrapes. */
extern const char *const target_labels[2];

/* Length of the metric or label name at p (0 if none starts there). */
size_t ident_len(const char *p);

void copy_n(char *dst, size_t cap, const char *src, size_t n);

struct name_seen;
struct label_seen;

struct name_seen *seen_find(const char *name);

struct label_seen *label_find(struct name_seen *s, const char *label);

/* Whether any series the proxy exports has this label. */
bool label_anywhere(const char *label);

/* Starts the proxy with one route, sends what makes every family show series (a retried
 * request, a POST it may not retry, a request no route takes, a gRPC call) and learns its /metrics:
 * every sample's name, labels and label values. Each family of a # TYPE line must show a series. */
void learn_exports(void);

#define MAX_USES 32

struct matcher {
    int metric; /* index into uses.metrics of its selector, -1 for a bare {...} */
    char label[48];
    char op[3];
    char value[256];
};

/* What one PromQL query names: series, label matchers, labels in by/without/on/ignoring/
 * group_left/group_right lists. */
struct uses {
    char metrics[MAX_USES][128];
    size_t n_metrics;
    struct matcher matchers[MAX_USES];
    size_t n_matchers;
    char grouping[MAX_USES][48];
    size_t n_grouping;
    char error[128]; /* what could not be read, "" when all was */
};

const char *skip_space(const char *p);

/* Lists what 'expr' names into 'u'. Grafana variables ($name, ${name}) are skipped, as are
 * strings outside matchers, numbers, durations and [range:step] brackets. */
void scan_promql(const char *expr, struct uses *u);

/* Names recorded by the rules file (record:), learnt by read_rules(). */
extern char recorded[32][128];

extern size_t n_recorded;

bool in_list(const char *s, const char *const *list, size_t count);

/* Every series 'u' names is one the proxy exports or (if 'recorded_ok') one the rules record;
 * its labels are theirs; it names at least one series. */
void check_uses(const struct uses *u, const char *where, const char *expr, bool recorded_ok);

void check_query(const char *expr, const char *where, bool recorded_ok);

#endif
