/* The monitoring files under deploy/ as the monitoring suites read them (monfiles.h). */
#include "tests/support/monfiles.h"

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

const char *const runbook_anchors[] = {
    "retry-storm",      "retries-denied",   "upstream-failures", "grpc-failures",
    "upstream-ejected", "endpoint-failing", "panic-mode",        "no-endpoints",
    "dns-stale",        "reload-failures",  "draining",          "delivery-backlog",
    "old-delivery",     "dead-letters",     "store-full",        "dead-letters-refused",
    "store-down"
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
void yaml_read(const char *path, const char *const *keys, size_t n_keys, struct yfile *f)
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

void yaml_free(struct yfile *f)
{
    for (size_t i = 0; i < f->n; i++)
        free(f->s[i].value);
    f->n = 0;
}

size_t count_key(const struct yfile *f, const char *key)
{
    size_t n = 0;
    for (size_t i = 0; i < f->n; i++)
        n += strcmp(f->s[i].key, key) == 0;
    return n;
}

/* Reads the rules file's record, alert and expr values and learns the recorded names. */
void read_rules(struct yfile *f)
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

/* Returns when promtool is on PATH. Otherwise the test fails where the Makefile's promtool
 * target could have installed it (root, apt-get), and is skipped elsewhere, saying so. */
void need_promtool(void)
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
int run_capture(const char *args, char **out)
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

void expect_promtool(const char *args)
{
    char *out;
    int rc = run_capture(args, &out);
    cr_expect_eq(rc, 0, "`promtool %s` exited %d:\n%s", args, rc, out);
    free(out);
}

/* Collects every "expr" of the dashboard, named after the panel it is in. */
void collect_exprs(const json_t *j, const char *panel, struct dash_query *q, size_t cap, size_t *n)
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
void check_label_values(const char *query, const char *where)
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

json_t *load_dashboard(void)
{
    json_error_t err;
    json_t *d = json_load_file(DASHBOARD, 0, &err);
    cr_assert_not_null(d, DASHBOARD ":%d:%d: %s (run from the repository root)", err.line,
                       err.column, err.text);
    return d;
}
