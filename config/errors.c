#include "config/errors.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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

void cfg_errs_add(struct cfg_errs *e, const char *path, uint32_t line, uint32_t col,
                  const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

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
