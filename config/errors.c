#include "config/errors.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "config/utf8.h"

static char *xstrdup(const char *s)
{
    char *p = strdup(s);
    if (!p) {
        fputs("retryproxy: out of memory\n", stderr);
        abort();
    }
    return p;
}

void cfg_errs_init(struct cfg_errs *e)
{
    memset(e, 0, sizeof(*e));
}

void cfg_errs_clear(struct cfg_errs *e)
{
    if (!e)
        return;
    for (size_t i = 0; i < e->n; i++) {
        free(e->v[i].path);
        free(e->v[i].msg);
    }
    free(e->v);
    cfg_errs_init(e);
}

/* Messages quote strings from the file, which may hold any character once their escapes are
 * decoded, and end up in line-oriented output and in JSON (the admin API): a control character
 * is written as an escape ("\n", "\u001b"), so that one error stays one line, and a byte that
 * is not part of a well-formed UTF-8 character as "\xNN" (jansson refuses to hold invalid
 * UTF-8). A message cut short ('cut', or a character cut at its end) ends in "...". */
void cfg_errs_tidy(char *out, const char *msg, int cut)
{
    const unsigned char *p = (const unsigned char *)msg;
    size_t n = strlen(msg);
    char *o = out;
    while (n > 0) {
        size_t k = utf8_len(p, n);
        size_t need = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : 2;
        if (k == 0 && p[0] >= 0xc2 && p[0] <= 0xf4 && n < need) {
            /* A character cut off at the end, as vsnprintf leaves it. */
            size_t i = 1;
            while (i < n && (p[i] & 0xc0) == 0x80)
                i++;
            if (i == n) {
                cut = 1;
                break;
            }
        }
        if (k == 0) {
            o += sprintf(o, "\\x%02x", p[0]);
            k = 1;
        } else if (p[0] == '\n') {
            o += sprintf(o, "\\n");
        } else if (p[0] == '\t') {
            o += sprintf(o, "\\t");
        } else if (p[0] == '\r') {
            o += sprintf(o, "\\r");
        } else if (p[0] < 0x20 || p[0] == 0x7f) {
            o += sprintf(o, "\\u%04x", p[0]);
        } else {
            memcpy(o, p, k);
            o += k;
        }
        p += k;
        n -= k;
    }
    if (cut)
        o += sprintf(o, "...");
    *o = '\0';
}

void cfg_errs_add(struct cfg_errs *e, const char *path, uint32_t line, uint32_t col,
                  const char *fmt, ...)
{
    char raw[1024];
    va_list ap;
    va_start(ap, fmt);
    int full = vsnprintf(raw, sizeof(raw), fmt, ap);
    va_end(ap);
    char msg[6 * sizeof(raw) + 4];
    cfg_errs_tidy(msg, raw, full < 0 || (size_t)full >= sizeof(raw));

    for (size_t i = 0; i < e->n; i++) {
        const struct cfg_err *x = &e->v[i];
        if (x->line == line && x->col == col && strcmp(x->path, path) == 0 &&
            strcmp(x->msg, msg) == 0)
            return;
    }
    if (e->n >= CFG_ERRS_MAX) {
        e->dropped++;
        return;
    }
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 8;
        struct cfg_err *v = realloc(e->v, cap * sizeof(*v));
        if (!v) {
            fputs("retryproxy: out of memory\n", stderr);
            abort();
        }
        e->v = v;
        e->cap = cap;
    }
    e->v[e->n++] = (struct cfg_err){ xstrdup(path), line, col, xstrdup(msg) };
}

void cfg_errs_sort(struct cfg_errs *e)
{
    /* Insertion sort: stable, and the lists are short. */
    for (size_t i = 1; i < e->n; i++) {
        struct cfg_err x = e->v[i];
        size_t j = i;
        while (j > 0 && (e->v[j - 1].line > x.line ||
                         (e->v[j - 1].line == x.line && e->v[j - 1].col > x.col))) {
            e->v[j] = e->v[j - 1];
            j--;
        }
        e->v[j] = x;
    }
}

void cfg_errs_print(FILE *out, const char *file, const struct cfg_errs *e)
{
    for (size_t i = 0; i < e->n; i++) {
        const struct cfg_err *x = &e->v[i];
        if (file)
            fprintf(out, "%s:", file);
        if (x->line)
            fprintf(out, "%u:%u:", x->line, x->col);
        fprintf(out, "%s%s: %s\n", file || x->line ? " " : "", x->path, x->msg);
    }
    if (e->dropped)
        fprintf(out, "%s%s(%zu more errors not shown)\n", file ? file : "", file ? ": " : "",
                e->dropped);
}
