/* The monitoring files under deploy/ against the proxy itself. The Prometheus rules
 * (deploy/prometheus/retryproxy-rules.yml), the series their unit tests feed them
 * (retryproxy-rules.test.yml) and the Grafana dashboard's queries
 * (deploy/grafana/retryproxy-dashboard.json) may name only series a running retryproxy exports
 * on /metrics, with labels it puts on them (or the target labels job and instance), and, for a
 * label whose every value the proxy shows, values it shows: nothing else is scraped, not even a
 * probe (the draining, reload and budget alerts read the proxy's own gauges). Then promtool
 * checks the rules and the example config (prometheus-example.yml), runs the rules' unit tests
 * and parses every dashboard query. Run from the repository root (make test does).
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
#include "tests/support/seed.h"

#define RULES      "deploy/prometheus/retryproxy-rules.yml"
#define RULES_TEST "deploy/prometheus/retryproxy-rules.test.yml"
#define EXAMPLE    "deploy/prometheus/prometheus-example.yml"
#define DASHBOARD  "deploy/grafana/retryproxy-dashboard.json"
#define OPERATIONS "docs/operations.md"
/* Where every runbook_url points: absolute (Alertmanager cannot follow a relative link), under
 * the placeholder base deploy/prometheus/README.md tells operators to replace. */
#define RUNBOOK "https://retryproxy.example/docs/operations.md#"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Labels Prometheus adds to every series it scrapes. */
static const char *const target_labels[] = { "job", "instance" };
/* The sections of docs/operations.md the alerts' runbook_url point at: each is used. */
static const char *const runbook_anchors[] = {
    "retry-storm",      "retries-denied",   "upstream-failures", "grpc-failures",
    "upstream-ejected", "endpoint-failing", "panic-mode",        "no-endpoints",
    "dns-stale",        "reload-failures",  "draining",          "delivery-backlog",
    "old-delivery",     "dead-letters",     "store-full",        "dead-letters-refused"
};
static const char *const severities[] = { "info", "warning", "critical" };

TestSuite(monitoring, .fini = fx_stop, .timeout = 60);

/* ================================ what the proxy exports ================================ */

#define MAX_NAMES  64 /* series names (a histogram has three) */
#define MAX_LABELS 6  /* labels of one series name */
#define MAX_VALUES 32 /* values of one label */

struct label_seen {
    char name[32];
    char values[MAX_VALUES][64];
    size_t n_values;
};

struct name_seen {
    char name[96];
    struct label_seen labels[MAX_LABELS];
    size_t n_labels;
};

static struct name_seen seen[MAX_NAMES];
static size_t n_seen;

/* Length of the metric or label name at p (0 if none starts there). */
static size_t ident_len(const char *p)
{
    size_t n = 0;
    if (!(isalpha((unsigned char)p[0]) || p[0] == '_' || p[0] == ':'))
        return 0;
    while (isalnum((unsigned char)p[n]) || p[n] == '_' || p[n] == ':')
        n++;
    return n;
}

static void copy_n(char *dst, size_t cap, const char *src, size_t n)
{
    cr_assert_lt(n, cap, "a name of %zu bytes: %.*s", n, (int)n, src);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static struct name_seen *seen_find(const char *name)
{
    for (size_t i = 0; i < n_seen; i++)
        if (strcmp(seen[i].name, name) == 0)
            return &seen[i];
    return NULL;
}

static struct label_seen *label_find(struct name_seen *s, const char *label)
{
    for (size_t i = 0; s && i < s->n_labels; i++)
        if (strcmp(s->labels[i].name, label) == 0)
            return &s->labels[i];
    return NULL;
}

/* Whether any series the proxy exports has this label. */
static bool label_anywhere(const char *label)
{
    for (size_t i = 0; i < n_seen; i++)
        if (label_find(&seen[i], label))
            return true;
    return false;
}

static bool value_seen(const struct label_seen *l, const char *v, size_t n)
{
    for (size_t i = 0; i < l->n_values; i++)
        if (strlen(l->values[i]) == n && memcmp(l->values[i], v, n) == 0)
            return true;
    return false;
}

/* Learns one sample line: its name, its labels and their values. */
static void learn_sample(const char *p)
{
    const char *line = p;
    size_t n = ident_len(p);
    cr_assert(n > 0, "cannot read the /metrics line: %.80s", line);
    char name[96];
    copy_n(name, sizeof(name), p, n);
    struct name_seen *s = seen_find(name);
    if (!s) {
        cr_assert_lt(n_seen, MAX_NAMES, "more than %d series names", MAX_NAMES);
        s = &seen[n_seen++];
        strcpy(s->name, name);
    }
    p += n;
    if (*p != '{')
        return;
    p++;
    while (*p != '}') {
        size_t ln = ident_len(p);
        cr_assert(ln > 0 && p[ln] == '=' && p[ln + 1] == '"', "cannot read the labels of: %.80s",
                  line);
        char label[32];
        copy_n(label, sizeof(label), p, ln);
        struct label_seen *l = label_find(s, label);
        if (!l) {
            cr_assert_lt(s->n_labels, MAX_LABELS, "%s: more than %d labels", s->name, MAX_LABELS);
            l = &s->labels[s->n_labels++];
            strcpy(l->name, label);
        }
        p += ln + 2;
        const char *v = p;
        while (*p && *p != '"' && *p != '\n')
            p += p[0] == '\\' && p[1] ? 2 : 1;
        cr_assert_eq(*p, '"', "cannot read the labels of: %.80s", line);
        if (!value_seen(l, v, (size_t)(p - v))) {
            cr_assert_lt(l->n_values, MAX_VALUES, "%s{%s}: more than %d values", s->name, label,
                         MAX_VALUES);
            copy_n(l->values[l->n_values++], sizeof(l->values[0]), v, (size_t)(p - v));
        }
        p++;
        if (*p == ',')
            p++;
    }
}

/* Sends one request through the proxy with a test upstream plan, expecting 'status'. */
/* 'type' is the request's Content-Type (NULL: none). */
static void request_as(const char *method, const char *path, const char *type, const char *plan,
                       long status)
{
    static int id;
    char ph[96], ih[64], th[96];
    snprintf(ph, sizeof(ph), "X-Test-Plan: %s", plan ? plan : "");
    snprintf(ih, sizeof(ih), "X-Request-Id: monitoring-%d", ++id);
    snprintf(th, sizeof(th), "Content-Type: %s", type ? type : "");
    const char *h[] = { ih, type ? th : ph, plan && type ? ph : NULL, NULL };
    struct http_resp r;
    bool post = strcmp(method, "POST") == 0;
    http_do(method, fx_url(path), h, post ? "x" : NULL, post ? 1 : 0, 5000, &r);
    cr_assert_eq(r.status, status, "%s %s (%s): status %ld, want %ld", method, path,
                 plan ? plan : "no plan", r.status, status);
    http_free(&r);
}

static void request(const char *method, const char *path, const char *plan, long status)
{
    request_as(method, path, NULL, plan, status);
}

/* Starts the proxy with one route, sends what makes every family show series (a retried
 * request, a POST it may not retry, a request no route takes, a gRPC call) and learns its /metrics:
 * every sample's name, labels and label values. Each family of a # TYPE line must show a series. */
static void learn_exports(void)
{
    fx_upstreams(1);
    /* a route to a host name too, for the resolver's families (docs/endpoints.md) */
    struct dnsm *dns = dnsm_start();
    cr_assert_not_null(dns);
    const char *lo[] = { "127.0.0.1" };
    cr_assert_eq(dnsm_set(dns, "svc.test", lo, 1), 0);
    /* a delivery store with deliveries in every state a gauge shows (tests/support/seed.h) */
    const char *dir = fx_config_dir("monitoring");
    char db[160];
    snprintf(db, sizeof(db), "%s/deliveries.db", dir);
    struct seeded sd;
    seed_store(db, &sd);
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"resolver\": {\"servers\": [\"%s\"]}, \"store\": {\"path\": \"%s\"}", dns->server,
             db);
    /* ejection on (never reached here) so that the upstream families show their series */
    cfgb_route(b, "r",
               "\"match\": {\"path_prefix\": \"/r\"}, \"retry\": {" CFG_FAST "}, "
               "\"ejection\": {\"consecutive_failures\": 5}");
    cfgb_route(b, "n",
               "\"match\": {\"path_prefix\": \"/n\"}, \"upstreams\": [\"http://svc.test:%s\"]",
               strrchr(fx_up_url(0), ':') + 1);
    fx_start_b(b, NULL);
    request("GET", "/n/1", NULL, 200);
    request("GET", "/r/1", "fail=1;status=503", 200);
    request("POST", "/r/2", "fail=1;status=503", 503);
    request("GET", "/elsewhere", NULL, 404);
    request_as("POST", "/r/3", "application/grpc", "fail=1;status=200;header=grpc-status:14", 200);

    char url[128];
    struct http_resp r;
    http_do("GET", px_admin_url(px, "/metrics", url, sizeof(url)), NULL, NULL, 0, 5000, &r);
    cr_assert_eq(r.status, 200, "GET /metrics: %ld", r.status);
    cr_assert_not_null(r.body);
    const char *text = (const char *)r.body;
    for (const char *p = text; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p))
        if (*p != '#' && *p != '\n')
            learn_sample(p);
    size_t families = 0;
    for (const char *p = strstr(text, "# TYPE "); p; p = strstr(p + 1, "# TYPE ")) {
        char name[96], type[16], want[112];
        cr_assert_eq(sscanf(p, "# TYPE %95s %15s", name, type), 2);
        snprintf(want, sizeof(want), "%s%s", name, strcmp(type, "histogram") == 0 ? "_bucket" : "");
        cr_assert_not_null(seen_find(want), "/metrics shows no %s series", want);
        families++;
    }
    cr_assert_geq(families, 19, "/metrics has %zu families", families);
    http_free(&r);
    dnsm_stop(dns);
}

/* ================================ reading a query ================================ */

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

static const char *const grouping_words[] = { "by",       "without",    "on",
                                              "ignoring", "group_left", "group_right" };
/* PromQL's keywords that are not series (a function is a name followed by '('): binary and
 * aggregation operators, modifiers, the special numbers. */
static const char *const keywords[] = {
    "and",    "or",     "unless", "atan2",   "bool",     "offset",       "start",  "end",
    "inf",    "nan",    "sum",    "avg",     "count",    "min",          "max",    "group",
    "stddev", "stdvar", "topk",   "bottomk", "quantile", "count_values", "limitk", "limit_ratio"
};

static bool word_in(const char *w, size_t n, const char *const *list, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (strlen(list[i]) == n && strncasecmp(w, list[i], n) == 0)
            return true;
    return false;
}

static const char *skip_space(const char *p)
{
    while (isspace((unsigned char)*p))
        p++;
    return p;
}

/* Past the string literal at p ('"', '\'' or '`'), its text in [*s, *e); NULL if it does not
 * end. */
static const char *string_end(const char *p, const char **s, const char **e)
{
    char q = *p++;
    const char *start = p;
    while (*p && *p != q)
        p += p[0] == '\\' && q != '`' && p[1] ? 2 : 1;
    if (!*p)
        return NULL;
    if (s)
        *s = start;
    if (e)
        *e = p;
    return p + 1;
}

static int add_metric(struct uses *u, const char *w, size_t n)
{
    cr_assert_lt(u->n_metrics, MAX_USES, "a query with more than %d series", MAX_USES);
    copy_n(u->metrics[u->n_metrics], sizeof(u->metrics[0]), w, n);
    return (int)u->n_metrics++;
}

/* Reads the matchers of the {...} at p for the series 'selector' (-1: none); past the '}', or
 * NULL with u->error set. */
static const char *read_matchers(const char *p, int selector, struct uses *u)
{
    for (p++;;) {
        p = skip_space(p);
        if (*p == '}')
            return p + 1;
        size_t n = ident_len(p);
        if (!n) {
            snprintf(u->error, sizeof(u->error), "a label matcher at \"%.20s\"", p);
            return NULL;
        }
        cr_assert_lt(u->n_matchers, MAX_USES, "a query with more than %d matchers", MAX_USES);
        struct matcher *m = &u->matchers[u->n_matchers++];
        m->metric = selector;
        copy_n(m->label, sizeof(m->label), p, n);
        p = skip_space(p + n);
        size_t ol = (p[0] == '=' && p[1] == '~') || (p[0] == '!' && (p[1] == '=' || p[1] == '~'))
                        ? 2
                        : p[0] == '=';
        copy_n(m->op, sizeof(m->op), p, ol);
        const char *s, *e;
        const char *q = skip_space(p + ol);
        if (!ol || (*q != '"' && *q != '\'' && *q != '`') || !(p = string_end(q, &s, &e))) {
            snprintf(u->error, sizeof(u->error), "the matcher of label %s", m->label);
            return NULL;
        }
        copy_n(m->value, sizeof(m->value), s, (size_t)(e - s));
        if (strcmp(m->label, "__name__") == 0 && ol == 1)
            m->metric = add_metric(u, s, (size_t)(e - s));
        p = skip_space(p);
        if (*p == ',')
            p++;
    }
}

/* Lists what 'expr' names into 'u'. Grafana variables ($name, ${name}) are skipped, as are
 * strings outside matchers, numbers, durations and [range:step] brackets. */
static void scan_promql(const char *expr, struct uses *u)
{
    memset(u, 0, sizeof(*u));
    int selector = -1; /* the series a '{' at this point belongs to */
    const char *p = expr;
    while (p && *p) {
        unsigned char c = (unsigned char)*p;
        int prev = selector;
        selector = -1;
        if (isspace(c)) {
            selector = prev;
            p++;
        } else if (c == '#') {
            p += strcspn(p, "\n");
        } else if (c == '"' || c == '\'' || c == '`') {
            if (!(p = string_end(p, NULL, NULL)))
                snprintf(u->error, sizeof(u->error), "a string that does not end");
        } else if (c == '[') {
            if ((p = strchr(p, ']')))
                p++;
            else
                snprintf(u->error, sizeof(u->error), "a '[' without ']'");
        } else if (c == '$') {
            p++;
            if (*p == '{' && (p = strchr(p, '}')))
                p++;
            else if (p)
                p += ident_len(p);
            else
                snprintf(u->error, sizeof(u->error), "a '${' without '}'");
        } else if (isdigit(c) || (c == '.' && isdigit((unsigned char)p[1]))) {
            for (p++; isalnum((unsigned char)*p) || *p == '.' || *p == '_' ||
                      ((*p == '+' || *p == '-') && (p[-1] == 'e' || p[-1] == 'E'));
                 p++)
                ;
        } else if (c == '{') {
            p = read_matchers(p, prev, u);
        } else if (ident_len(p) == 0) {
            p++;
        } else {
            const char *w = p;
            size_t n = ident_len(p);
            p += n;
            const char *next = skip_space(p);
            if (word_in(w, n, grouping_words, COUNT(grouping_words))) {
                if (*next != '(')
                    continue;
                for (p = skip_space(next + 1); *p && *p != ')'; p = skip_space(p)) {
                    size_t ln = ident_len(p);
                    if (ln) {
                        cr_assert_lt(u->n_grouping, MAX_USES, "more than %d grouping labels",
                                     MAX_USES);
                        copy_n(u->grouping[u->n_grouping++], sizeof(u->grouping[0]), p, ln);
                        p += ln;
                    } else if (*p == ',') {
                        p++;
                    } else {
                        snprintf(u->error, sizeof(u->error), "the label list at \"%.20s\"", p);
                        return;
                    }
                }
                if (*p == ')')
                    p++;
            } else if (!word_in(w, n, keywords, COUNT(keywords)) && *next != '(') {
                selector = add_metric(u, w, n);
            }
        }
    }
}

/* ================================ checking a query ================================ */

/* Names recorded by the rules file (record:), learnt by read_rules(). */
static char recorded[32][128];
static size_t n_recorded;

static bool in_list(const char *s, const char *const *list, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (strcmp(s, list[i]) == 0)
            return true;
    return false;
}

static bool is_recorded(const char *name)
{
    for (size_t i = 0; i < n_recorded; i++)
        if (strcmp(recorded[i], name) == 0)
            return true;
    return false;
}

/* Whether the proxy shows every value of this label of this series, so that another value is a
 * mistake: not route (the config's names), code (only codes that occurred) or retries_total's
 * reason (the config's retry_on tokens). */
static bool values_enumerated(const char *metric, const char *label)
{
    /* grpc_status: only the statuses seen are shown (docs/metrics.md); upstream: the config's
     * URLs; name: the host names in them (the DNS families); endpoint: the addresses they
     * resolve to */
    if (strcmp(label, "route") == 0 || strcmp(label, "code") == 0 ||
        strcmp(label, "grpc_status") == 0 || strcmp(label, "upstream") == 0 ||
        strcmp(label, "name") == 0 || strcmp(label, "endpoint") == 0)
        return false;
    return !(strcmp(metric, "retryproxy_retries_total") == 0 && strcmp(label, "reason") == 0);
}

/* The values of 'l' joined by ", " into buf. */
static const char *values_text(const struct label_seen *l, char *buf, size_t cap)
{
    buf[0] = '\0';
    for (size_t i = 0; i < l->n_values; i++)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", i ? ", " : "", l->values[i]);
    return buf;
}

/* A matcher's label must be one of its series' (any series' for a recorded one or a bare {...});
 * its value (each alternative of a plain a|b|c regex) one the proxy shows when it shows all. */
static void check_matcher(const struct uses *u, const struct matcher *m, const char *where,
                          const char *expr)
{
    const char *metric = m->metric >= 0 ? u->metrics[m->metric] : NULL;
    if (in_list(m->label, target_labels, COUNT(target_labels)) || strcmp(m->label, "__name__") == 0)
        return;
    struct name_seen *s = metric ? seen_find(metric) : NULL;
    if (!s) {
        cr_expect(label_anywhere(m->label), "%s: no series the proxy exports has a label %s:\n%s",
                  where, m->label, expr);
        return;
    }
    struct label_seen *l = label_find(s, m->label);
    if (!l) {
        cr_expect_fail("%s: the proxy's %s has no label %s:\n%s", where, metric, m->label, expr);
        return;
    }
    bool regex = m->op[1] == '~';
    if (!values_enumerated(metric, m->label) || strchr(m->value, '$') ||
        (regex && m->value[strspn(m->value, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                            "0123456789_-|")] != '\0'))
        return;
    char shown[1024];
    for (const char *v = m->value;;) {
        size_t n = regex ? strcspn(v, "|") : strlen(v);
        cr_expect(value_seen(l, v, n), "%s: the proxy shows no %s{%s=\"%.*s\"} (only %s):\n%s",
                  where, metric, m->label, (int)n, v, values_text(l, shown, sizeof(shown)), expr);
        if (v[n] != '|')
            break;
        v += n + 1;
    }
}

/* Every series 'u' names is one the proxy exports or (if 'recorded_ok') one the rules record;
 * its labels are theirs; it names at least one series. */
static void check_uses(const struct uses *u, const char *where, const char *expr, bool recorded_ok)
{
    cr_expect_eq(u->error[0], '\0', "%s: cannot read %s in:\n%s", where, u->error, expr);
    cr_expect_gt(u->n_metrics, 0, "%s: the query names no series:\n%s", where, expr);
    bool any_label = false; /* a recorded series may carry any label */
    for (size_t i = 0; i < u->n_metrics; i++) {
        const char *m = u->metrics[i];
        if (is_recorded(m)) {
            cr_expect(recorded_ok,
                      "%s: %s is recorded by the rules, not exported by the proxy; read the "
                      "proxy's own series here:\n%s",
                      where, m, expr);
            any_label = true;
        } else {
            cr_expect_not_null(seen_find(m),
                               "%s: %s is not a series retryproxy exports (docs/metrics.md; a "
                               "histogram's are NAME_bucket, NAME_sum and NAME_count)%s:\n%s",
                               where, m, recorded_ok ? " nor one the rules record" : "", expr);
        }
    }
    for (size_t i = 0; i < u->n_matchers; i++)
        check_matcher(u, &u->matchers[i], where, expr);
    for (size_t i = 0; i < u->n_grouping; i++) {
        const char *l = u->grouping[i];
        bool found =
            in_list(l, target_labels, COUNT(target_labels)) || (any_label && label_anywhere(l));
        for (size_t k = 0; k < u->n_metrics && !found; k++)
            found = label_find(seen_find(u->metrics[k]), l) != NULL;
        cr_expect(found, "%s: no series this query reads has a label %s:\n%s", where, l, expr);
    }
}

static void check_query(const char *expr, const char *where, bool recorded_ok)
{
    struct uses u;
    scan_promql(expr, &u);
    check_uses(&u, where, expr, recorded_ok);
}

/* ================================ reading the YAML files ================================ */

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

static int indent_of(const char *line)
{
    return (int)strspn(line, " ");
}

static bool blank_or_comment(const char *line)
{
    const char *p = skip_space(line);
    return *p == '\0' || *p == '#';
}

/* The values of 'keys' in the YAML file 'path', in file order. It reads what these files use: a
 * one-line value (plain, '...' or "...") or a block scalar (| or >) whose lines are indented
 * deeper than its key, and fails the test on anything else behind one of these keys (a plain
 * value continued on the next line, a quoted one that does not end on its line), so that no
 * part of a query goes unread. */
static void yaml_read(const char *path, const char *const *keys, size_t n_keys, struct yfile *f)
{
    char *text = proc_read_file(path);
    cr_assert(text[0], "cannot read %s (run from the repository root)", path);
    char *lines[2048];
    size_t n_lines = 0;
    for (char *p = text; *p;) {
        cr_assert_lt(n_lines, COUNT(lines), "%s: too many lines", path);
        lines[n_lines++] = p;
        p += strcspn(p, "\n");
        if (*p)
            *p++ = '\0';
    }
    f->n = 0;
    for (size_t i = 0; i < n_lines; i++) {
        const char *k = lines[i] + indent_of(lines[i]);
        while (k[0] == '-' && k[1] == ' ')
            k = skip_space(k + 1);
        int col = (int)(k - lines[i]);
        size_t kl = 0;
        for (size_t j = 0; j < n_keys && !kl; j++) {
            size_t l = strlen(keys[j]);
            if (strncmp(k, keys[j], l) == 0 && k[l] == ':' && (k[l + 1] == ' ' || !k[l + 1]))
                kl = l;
        }
        if (!kl)
            continue;
        cr_assert_lt(f->n, MAX_SCALARS, "%s: more than %d values", path, MAX_SCALARS);
        struct yscalar *s = &f->s[f->n++];
        s->line = (int)i + 1;
        copy_n(s->key, sizeof(s->key), k, kl);
        const char *v = skip_space(k + kl + 1);
        size_t cap = strlen(v) + 1, len = 0;
        if (*v == '|' || *v == '>') {
            size_t j = i + 1;
            for (; j < n_lines && (blank_or_comment(lines[j]) || indent_of(lines[j]) > col); j++)
                cap += strlen(lines[j]) + 1;
            s->value = malloc(cap);
            s->value[0] = '\0';
            for (size_t m = i + 1; m < j; m++) {
                strcat(s->value, lines[m]);
                strcat(s->value, "\n");
            }
            i = j - 1;
            continue;
        }
        s->value = malloc(cap);
        if (*v == '\'' || *v == '"') {
            char q = *v++;
            while (*v && (*v != q || (q == '\'' && v[1] == q))) {
                if ((q == '"' && v[0] == '\\' && v[1]) || (q == '\'' && v[0] == q))
                    v++; /* \" in "...", '' in '...' */
                s->value[len++] = *v++;
            }
            cr_assert_eq(*v, q, "%s:%d: a quoted %s value must end on its line", path, s->line,
                         s->key);
            s->value[len] = '\0';
            continue;
        }
        const char *comment = strstr(v, " #");
        len = comment ? (size_t)(comment - v) : strlen(v);
        while (len && v[len - 1] == ' ')
            len--;
        memcpy(s->value, v, len);
        s->value[len] = '\0';
        size_t j = i + 1;
        while (j < n_lines && blank_or_comment(lines[j]))
            j++;
        cr_assert(j >= n_lines || indent_of(lines[j]) <= col,
                  "%s:%d: the %s value goes on at line %zu: write it on one line or as a | block "
                  "(this test reads only those)",
                  path, s->line, s->key, j + 1);
    }
    free(text);
}

static void yaml_free(struct yfile *f)
{
    for (size_t i = 0; i < f->n; i++)
        free(f->s[i].value);
    f->n = 0;
}

static size_t count_key(const struct yfile *f, const char *key)
{
    size_t n = 0;
    for (size_t i = 0; i < f->n; i++)
        n += strcmp(f->s[i].key, key) == 0;
    return n;
}

/* Reads the rules file's record, alert and expr values and learns the recorded names. */
static void read_rules(struct yfile *f)
{
    static const char *const keys[] = { "record", "alert", "expr" };
    yaml_read(RULES, keys, COUNT(keys), f);
    n_recorded = 0;
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->s[i].key, "record") == 0) {
            cr_assert_lt(n_recorded, COUNT(recorded));
            copy_n(recorded[n_recorded++], sizeof(recorded[0]), f->s[i].value,
                   strlen(f->s[i].value));
        }
    cr_assert_eq(count_key(f, "expr"), count_key(f, "record") + count_key(f, "alert"),
                 RULES ": %zu expr values for %zu rules: every rule's expr must be read",
                 count_key(f, "expr"), count_key(f, "record") + count_key(f, "alert"));
    cr_assert_geq(count_key(f, "alert"), COUNT(runbook_anchors));
}

/* ================================ promtool ================================ */

/* Returns when promtool is on PATH. Otherwise the test fails where the Makefile's promtool
 * target could have installed it (root, apt-get), and is skipped elsewhere, saying so. */
static void need_promtool(void)
{
    if (fx_sh("command -v promtool >/dev/null 2>&1") == 0)
        return;
    cr_assert(geteuid() != 0 || fx_sh("command -v apt-get >/dev/null 2>&1") != 0,
              "promtool is not installed, though this machine could install it (root, apt-get): "
              "`make promtool` does (Debian's prometheus package); without it the rules are not "
              "checked");
    cr_log_warn(
        "promtool is not installed and cannot be installed here (that needs root and apt-get): "
        "the promtool checks are SKIPPED (sudo apt-get install -y prometheus runs them)");
    cr_skip_test("promtool is not installed (sudo apt-get install -y prometheus)");
}

/* Runs `promtool ARGS`, its stdout and stderr in *out (malloc'd); its exit status, -1 if it
 * did not exit. */
static int run_capture(const char *args, char **out)
{
    char full[1024];
    snprintf(full, sizeof(full), "promtool %s 2>&1", args);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p, "cannot run %s", full);
    size_t len = 0, cap = 4096;
    *out = malloc(cap);
    for (size_t n; (n = fread(*out + len, 1, cap - len - 1, p)) > 0;) {
        len += n;
        if (cap - len < 1024)
            *out = realloc(*out, cap *= 2);
    }
    (*out)[len] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect_promtool(const char *args)
{
    char *out;
    int rc = run_capture(args, &out);
    cr_expect_eq(rc, 0, "`promtool %s` exited %d:\n%s", args, rc, out);
    free(out);
}

/* ================================ the dashboard ================================ */

struct dash_query {
    char where[160];
    const char *expr; /* borrowed from the dashboard */
};

/* Collects every "expr" of the dashboard, named after the panel it is in. */
static void collect_exprs(const json_t *j, const char *panel, struct dash_query *q, size_t cap,
                          size_t *n)
{
    if (json_is_array(j)) {
        size_t i;
        const json_t *v;
        json_array_foreach(j, i, v) collect_exprs(v, panel, q, cap, n);
        return;
    }
    if (!json_is_object(j))
        return;
    const char *title = json_string_value(json_object_get(j, "title"));
    if (title && json_object_get(j, "type"))
        panel = title;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)j, key, v)
    {
        if (strcmp(key, "expr") == 0) {
            cr_assert(json_is_string(v), DASHBOARD ", panel \"%s\": an expr that is no string",
                      panel);
            cr_assert_lt(*n, cap, DASHBOARD ": more than %zu queries", cap);
            snprintf(q[*n].where, sizeof(q[0].where), DASHBOARD ", panel \"%s\"", panel);
            q[(*n)++].expr = json_string_value(v);
        } else {
            collect_exprs(v, panel, q, cap, n);
        }
    }
}

/* A template variable's label_values(SERIES{...}, LABEL) or label_values(LABEL): the series
 * one the proxy exports, the label one of its. */
static void check_label_values(const char *query, const char *where)
{
    const char *prefix = "label_values(";
    size_t len = strlen(query);
    cr_assert(strncmp(query, prefix, strlen(prefix)) == 0 && len && query[len - 1] == ')',
              "%s: this test reads label_values() variables only, not: %s", where, query);
    char inner[512];
    copy_n(inner, sizeof(inner), query + strlen(prefix), len - strlen(prefix) - 1);
    /* the label comes last and holds no comma */
    char *comma = strrchr(inner, ',');
    const char *label = skip_space(comma ? comma + 1 : inner);
    size_t ln = ident_len(label);
    cr_assert(ln > 0 && *skip_space(label + ln) == '\0', "%s: cannot read the label of %s", where,
              query);
    char l[48];
    copy_n(l, sizeof(l), label, ln);
    if (!comma) {
        cr_expect(label_anywhere(l) || in_list(l, target_labels, COUNT(target_labels)),
                  "%s: no series the proxy exports has a label %s", where, l);
        return;
    }
    *comma = '\0';
    struct uses u;
    scan_promql(inner, &u);
    check_uses(&u, where, query, false);
    cr_expect(in_list(l, target_labels, COUNT(target_labels)) ||
                  (u.n_metrics && label_find(seen_find(u.metrics[0]), l)),
              "%s: %s has no label %s", where, u.n_metrics ? u.metrics[0] : "(nothing)", l);
}

static json_t *load_dashboard(void)
{
    json_error_t err;
    json_t *d = json_load_file(DASHBOARD, 0, &err);
    cr_assert_not_null(d, DASHBOARD ":%d:%d: %s (run from the repository root)", err.line,
                       err.column, err.text);
    return d;
}

/* ================================ the tests ================================ */

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
