/* What a running retryproxy exports, and PromQL queries checked against it (promql.h). */
#include "tests/support/promql.h"

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

/* Labels Prometheus adds to every series it scrapes. */
const char *const target_labels[] = { "job", "instance" };

/* ================================ what the proxy exports ================================ */
#define MAX_NAMES 96 /* series names (a histogram has three) */

#define MAX_LABELS 6 /* labels of one series name */

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
size_t ident_len(const char *p)
{
    size_t n = 0;
    if (!(isalpha((unsigned char)p[0]) || p[0] == '_' || p[0] == ':'))
        return 0;
    while (isalnum((unsigned char)p[n]) || p[n] == '_' || p[n] == ':')
        n++;
    return n;
}

void copy_n(char *dst, size_t cap, const char *src, size_t n)
{
    cr_assert_lt(n, cap, "a name of %zu bytes: %.*s", n, (int)n, src);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

struct name_seen *seen_find(const char *name)
{
    for (size_t i = 0; i < n_seen; i++)
        if (strcmp(seen[i].name, name) == 0)
            return &seen[i];
    return NULL;
}

struct label_seen *label_find(struct name_seen *s, const char *label)
{
    for (size_t i = 0; s && i < s->n_labels; i++)
        if (strcmp(s->labels[i].name, label) == 0)
            return &s->labels[i];
    return NULL;
}

/* Whether any series the proxy exports has this label. */
bool label_anywhere(const char *label)
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
void learn_exports(void)
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

const char *skip_space(const char *p)
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
void scan_promql(const char *expr, struct uses *u)
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
char recorded[32][128];

size_t n_recorded;

bool in_list(const char *s, const char *const *list, size_t count)
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
void check_uses(const struct uses *u, const char *where, const char *expr, bool recorded_ok)
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

void check_query(const char *expr, const char *where, bool recorded_ok)
{
    struct uses u;
    scan_promql(expr, &u);
    check_uses(&u, where, expr, recorded_ok);
}
