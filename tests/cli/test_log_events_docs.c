/* The event lines the proxy writes against the event table of docs/logs.md, both ways: every
 * event with its level and fields is a row, and every row is an event the proxy writes. Run
 * from the repository root (make test does).
 *
 * The events are read from the sources: every log_event(LEVEL, "msg", fields..., NULL) call of
 * proxy/ (its .c files but the logger's own), a field being a "key" followed by its value or
 * LOG_NUM("key", n) (proxy/telemetry/log.h). In the table, the fields of a row are the
 * backquoted names of its fields cell outside parentheses: `route`, `upstream` (the URL as
 * written) is route and upstream.
 */
#include <criterion/criterion.h>

#include <ctype.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/proc.h"

#define LOGS_MD    "docs/logs.md"
#define TABLE_HEAD "| level | `msg` | fields |"
#define MAX_EVENTS 64
#define MAX_FIELDS 12
#define NAME_CAP   96

struct event {
    char level[8];
    char msg[NAME_CAP];
    char fields[MAX_FIELDS][32];
    size_t n_fields;
    char where[330]; /* file:line, or the table row */
};

struct events {
    struct event e[MAX_EVENTS];
    size_t n;
};

/* ---- the sources ---- */

/* Past the C string or character literal at p (its opening quote). */
static const char *skip_literal(const char *p)
{
    char q = *p++;
    while (*p && *p != q)
        p += *p == '\\' && p[1] ? 2 : 1;
    return *p ? p + 1 : p;
}

/* The concatenated string literals of 'arg' (its whole text) in out; false if 'arg' is
 * anything else. */
static bool literal_of(const char *arg, size_t len, char *out, size_t cap)
{
    size_t n = 0;
    const char *p = arg, *end = arg + len;
    bool any = false;
    while (p < end) {
        if (isspace((unsigned char)*p)) {
            p++;
            continue;
        }
        if (*p != '"')
            return false;
        const char *close = skip_literal(p);
        for (const char *c = p + 1; c < close - 1 && n + 1 < cap; c++)
            out[n++] = *c;
        p = close;
        any = true;
    }
    out[n] = '\0';
    return any;
}

/* The arguments of the call whose '(' is at 'open', split at the commas outside parentheses
 * and literals: their starts and lengths, at most 'cap'; returns how many, the end in *end. */
static size_t split_args(const char *open, const char *args[], size_t lens[], size_t cap,
                         const char **end)
{
    size_t n = 0;
    int depth = 0;
    const char *start = open + 1;
    for (const char *p = open + 1; *p; p++) {
        if (*p == '"' || *p == '\'') {
            p = skip_literal(p) - 1;
        } else if (*p == '(') {
            depth++;
        } else if ((*p == ',' || *p == ')') && depth == 0) {
            cr_assert_lt(n, cap, "a log_event() call with too many arguments");
            while (isspace((unsigned char)*start))
                start++;
            args[n] = start;
            lens[n++] = (size_t)(p - start);
            start = p + 1;
            if (*p == ')') {
                *end = p;
                return n;
            }
        } else if (*p == ')') {
            depth--;
        }
    }
    cr_assert_fail("a log_event() call without its ')'");
    return 0;
}

static bool starts(const char *arg, size_t len, const char *word)
{
    size_t wl = strlen(word);
    return len >= wl && strncmp(arg, word, wl) == 0;
}

/* One log_event() call at 'call' (its name) of 'path', text 'text', into 'ev'. */
static void read_call(const char *path, const char *text, const char *call, struct event *ev)
{
    int line = 1;
    for (const char *p = text; p < call; p++)
        line += *p == '\n';
    snprintf(ev->where, sizeof(ev->where), "%s:%d", path, line);
    const char *args[2 * MAX_FIELDS + 4], *end;
    size_t lens[2 * MAX_FIELDS + 4];
    size_t n = split_args(strchr(call, '('), args, lens, 2 * MAX_FIELDS + 4, &end);
    cr_assert(n >= 3 && starts(args[0], lens[0], "CFG_LOG_"), "%s: no level", ev->where);
    size_t ll = lens[0] - strlen("CFG_LOG_");
    cr_assert_lt(ll, sizeof(ev->level), "%s", ev->where);
    for (size_t i = 0; i < ll; i++)
        ev->level[i] = (char)tolower((unsigned char)args[0][strlen("CFG_LOG_") + i]);
    ev->level[ll] = '\0';
    cr_assert(literal_of(args[1], lens[1], ev->msg, sizeof(ev->msg)),
              "%s: the message is not a string literal", ev->where);
    size_t i = 2;
    while (i < n && !(lens[i] == 4 && starts(args[i], lens[i], "NULL"))) {
        cr_assert_lt(ev->n_fields, MAX_FIELDS, "%s", ev->where);
        char *key = ev->fields[ev->n_fields++];
        if (starts(args[i], lens[i], "LOG_NUM(")) {
            const char *kargs[2], *kend;
            size_t klens[2];
            cr_assert_eq(split_args(args[i] + strlen("LOG_NUM"), kargs, klens, 2, &kend), 2,
                         "%s: LOG_NUM(key, n)", ev->where);
            cr_assert(literal_of(kargs[0], klens[0], key, sizeof(ev->fields[0])),
                      "%s: a LOG_NUM key that is not a string literal", ev->where);
            i++;
            continue;
        }
        cr_assert(literal_of(args[i], lens[i], key, sizeof(ev->fields[0])),
                  "%s: field %zu: a key that is not a string literal: %.*s", ev->where,
                  ev->n_fields, (int)lens[i], args[i]);
        i += 2; /* the key and its value */
    }
    cr_assert(i == n - 1, "%s: the field list does not end in NULL", ev->where);
}

/* Every log_event() call of the .c files under 'dir'. */
static void dir_events(struct events *evs, const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "no %s/ here: run from the repository root", dir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[300];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        size_t nl = strlen(e->d_name);
        if (e->d_type == DT_DIR && e->d_name[0] != '.') {
            dir_events(evs, path);
            continue;
        }
        /* the logger's own file defines log_event() and calls it for nothing */
        if (nl < 3 || strcmp(e->d_name + nl - 2, ".c") != 0 ||
            strcmp(path, "proxy/telemetry/log.c") == 0)
            continue;
        char *text = proc_read_file(path);
        for (const char *p = text; (p = strstr(p, "log_event(")) != NULL; p++) {
            if (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_'))
                continue;
            cr_assert_lt(evs->n, MAX_EVENTS);
            struct event *ev = &evs->e[evs->n];
            memset(ev, 0, sizeof(*ev));
            read_call(path, text, p, ev);
            evs->n++;
        }
        free(text);
    }
    closedir(d);
}

/* ---- the table ---- */

/* The backquoted text of 'cell' (up to 'end') outside parentheses, as names. */
static void cell_fields(const char *cell, const char *end, struct event *ev)
{
    int depth = 0;
    for (const char *p = cell; p < end; p++) {
        if (*p == '(') {
            depth++;
        } else if (*p == ')') {
            depth--;
        } else if (*p == '`') {
            const char *q = memchr(p + 1, '`', (size_t)(end - p - 1));
            cr_assert_not_null(q, "%s: a backquote is not closed", ev->where);
            if (depth == 0) {
                cr_assert_lt(ev->n_fields, MAX_FIELDS, "%s", ev->where);
                snprintf(ev->fields[ev->n_fields++], sizeof(ev->fields[0]), "%.*s",
                         (int)(q - p - 1), p + 1);
            }
            p = q;
        }
    }
}

/* The rows of the event table of 'doc'. */
static void table_events(const char *doc, struct events *evs)
{
    const char *t = strstr(doc, "\n" TABLE_HEAD "\n");
    cr_assert_not_null(t, LOGS_MD ": no table headed %s", TABLE_HEAD);
    const char *row = strchr(t + 1, '\n') + 1;
    cr_assert(strncmp(row, "|---", 4) == 0, LOGS_MD ": the event table has no |---| line");
    for (row = strchr(row, '\n') + 1; strncmp(row, "| ", 2) == 0; row = strchr(row, '\n') + 1) {
        const char *eol = strchr(row, '\n');
        cr_assert_not_null(eol);
        cr_assert_lt(evs->n, MAX_EVENTS);
        struct event *ev = &evs->e[evs->n++];
        memset(ev, 0, sizeof(*ev));
        snprintf(ev->where, sizeof(ev->where), LOGS_MD ": %.*s",
                 (int)(eol - row) > 100 ? 100 : (int)(eol - row), row);
        const char *c1 = row + 2, *c2 = strstr(c1, " | `");
        cr_assert(c2 && c2 < eol, "%s: not | level | `msg` | fields |", ev->where);
        snprintf(ev->level, sizeof(ev->level), "%.*s", (int)(c2 - c1), c1);
        const char *m = c2 + 4, *mq = strstr(m, "` |");
        cr_assert(mq && mq < eol, "%s: the message is not one backquoted text", ev->where);
        snprintf(ev->msg, sizeof(ev->msg), "%.*s", (int)(mq - m), m);
        const char *fields = mq + 3, *fend = eol - 1;
        cr_assert(*fend == '|', "%s: a row ends in |", ev->where);
        cell_fields(fields, fend, ev);
    }
}

/* ---- both ways ---- */

static const struct event *find(const struct events *evs, const char *msg)
{
    for (size_t i = 0; i < evs->n; i++)
        if (strcmp(evs->e[i].msg, msg) == 0)
            return &evs->e[i];
    return NULL;
}

static bool has_field(const struct event *ev, const char *name)
{
    for (size_t i = 0; i < ev->n_fields; i++)
        if (strcmp(ev->fields[i], name) == 0)
            return true;
    return false;
}

Test(log_events_docs, logs_md_has_every_event_the_proxy_writes_with_its_level_and_fields)
{
    static struct events code, doc;
    dir_events(&code, "proxy");
    cr_assert_gt(code.n, 10, "only %zu log_event() calls found in proxy/", code.n);
    char *text = proc_read_file(LOGS_MD);
    table_events(text, &doc);
    free(text);

    for (size_t i = 0; i < code.n; i++) {
        const struct event *c = &code.e[i], *d = find(&doc, c->msg);
        if (!d) {
            cr_expect_fail("%s: event \"%s\" is not in " LOGS_MD "'s event table", c->where,
                           c->msg);
            continue;
        }
        cr_expect_str_eq(d->level, c->level, "%s: \"%s\" is written at %s, the table says %s",
                         c->where, c->msg, c->level, d->level);
        for (size_t k = 0; k < c->n_fields; k++)
            cr_expect(has_field(d, c->fields[k]), "%s: \"%s\" writes `%s`, not in its row",
                      c->where, c->msg, c->fields[k]);
        for (size_t k = 0; k < d->n_fields; k++)
            cr_expect(has_field(c, d->fields[k]), "%s: the row of \"%s\" names `%s`, not written",
                      c->where, c->msg, d->fields[k]);
    }
    for (size_t i = 0; i < doc.n; i++)
        cr_expect_not_null(find(&code, doc.e[i].msg), "%s: no log_event() in proxy/ writes \"%s\"",
                           doc.e[i].where, doc.e[i].msg);
}
