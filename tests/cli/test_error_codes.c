/* The error codes of retryproxy's own answers against the tables that document them: the
 * errors table of docs/forwarding.md (status and code) and that of docs/grpc.md (the gRPC status
 * each code becomes, as grpc_code_of_error() maps it). Run from the repository root (make test
 * does).
 *
 * The codes are read from the sources: every `NNN, "code"` in the proxy's sources (proxy/, every
 * .c), which is how an error is answered (edge_error(r, 404, "no_route", ...)) and how the framing
 * refusals' codes are listed (edge.c). A new code, or a code answered with another status, fails
 * here until the tables say so; a row for a code the proxy no longer answers with fails too.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <dirent.h>
#include <regex.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/http/grpc.h"
#include "tests/support/proc.h"

#define MAX_PAIRS 64

struct pair {
    unsigned status;
    char code[40];
};

struct pairs {
    struct pair p[MAX_PAIRS];
    size_t n;
};

static bool has(const struct pairs *ps, unsigned status, const char *code)
{
    for (size_t i = 0; i < ps->n; i++)
        if ((!status || ps->p[i].status == status) && strcmp(ps->p[i].code, code) == 0)
            return true;
    return false;
}

static void add(struct pairs *ps, unsigned status, const char *code, size_t len)
{
    char c[40];
    snprintf(c, sizeof(c), "%.*s", (int)len, code);
    if (has(ps, status, c))
        return;
    cr_assert_lt(ps->n, MAX_PAIRS);
    ps->p[ps->n].status = status;
    snprintf(ps->p[ps->n].code, sizeof(ps->p[ps->n].code), "%s", c);
    ps->n++;
}

/* Every `NNN, "code"` of the .c files under 'dir' (proxy/ and its part folders). */
static void dir_pairs(struct pairs *ps, const regex_t *re, const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "no %s/ here: run from the repository root", dir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t nl = strlen(e->d_name);
        char path[300];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (e->d_type == DT_DIR && e->d_name[0] != '.') {
            dir_pairs(ps, re, path);
            continue;
        }
        if (nl < 3 || strcmp(e->d_name + nl - 2, ".c") != 0)
            continue;
        char *text = proc_read_file(path);
        regmatch_t m[3];
        for (const char *p = text; regexec(re, p, 3, m, 0) == 0; p += m[0].rm_eo)
            add(ps, (unsigned)atoi(p + m[1].rm_so), p + m[2].rm_so,
                (size_t)(m[2].rm_eo - m[2].rm_so));
        free(text);
    }
    closedir(d);
}

static void source_pairs(struct pairs *ps)
{
    regex_t re;
    cr_assert_eq(regcomp(&re, "([1-5][0-9][0-9]),[[:space:]]*\"([a-z_]+)\"", REG_EXTENDED), 0);
    dir_pairs(ps, &re, "proxy");
    regfree(&re);
}

/* The table rows ("| ... |" lines) of 'doc' in its section headed 'heading', one by one: *at
 * moves past each; NULL after the last. */
static const char *next_row(const char *doc, const char *heading, const char **at)
{
    if (!*at) {
        const char *h = strstr(doc, heading);
        cr_assert_not_null(h, "no section \"%s\"", heading);
        *at = h + strlen(heading);
    }
    const char *end = strstr(*at, "\n## ");
    for (const char *p = *at; (p = strstr(p, "\n| ")) != NULL && (!end || p < end); p++) {
        *at = p + 1;
        if (strncmp(p, "\n| status", 9) != 0 && strncmp(p, "\n|---", 5) != 0 &&
            strncmp(p, "\n| error", 8) != 0)
            return p + 1;
    }
    return NULL;
}

/* The backquoted names of the cell at 'cell' (up to the next " |"), at most 'cap'. */
static size_t cell_codes(const char *cell, const char *names[], size_t lens[], size_t cap)
{
    const char *end = strstr(cell, " |");
    size_t n = 0;
    for (const char *p = cell; (p = strchr(p, '`')) != NULL && p < end && n < cap;) {
        const char *q = strchr(p + 1, '`');
        if (!q || q > end)
            break;
        names[n] = p + 1;
        lens[n++] = (size_t)(q - p - 1);
        p = q + 1;
    }
    return n;
}

Test(error_codes, forwarding_md_lists_every_error_code_with_its_status)
{
    struct pairs src = { 0 }, doc_pairs = { 0 };
    source_pairs(&src);
    cr_assert_geq(src.n, 15, "only %zu error codes found in proxy/", src.n);
    cr_assert(has(&src, 404, "no_route"));

    char *doc = proc_read_file("docs/forwarding.md");
    const char *at = NULL, *row;
    while ((row = next_row(doc, "## Errors of retryproxy's own", &at)) != NULL) {
        /* "| 408, 414 | `a`, `b` | when |": statuses paired with codes, or one for all */
        unsigned st[8];
        size_t ns = 0;
        const char *p = row + 2;
        while (ns < 8 && *p >= '1' && *p <= '5') {
            st[ns++] = (unsigned)strtoul(p, (char **)&p, 10);
            if (strncmp(p, ", ", 2) == 0)
                p += 2;
        }
        cr_assert_gt(ns, 0, "docs/forwarding.md: a row without a status: %.80s", row);
        const char *cell = strstr(p, "| ");
        cr_assert_not_null(cell);
        const char *names[8];
        size_t lens[8];
        size_t nc = cell_codes(cell + 2, names, lens, 8);
        cr_assert(nc == ns || ns == 1, "docs/forwarding.md: %zu statuses for %zu codes: %.80s", ns,
                  nc, row);
        for (size_t i = 0; i < nc; i++)
            add(&doc_pairs, st[ns == 1 ? 0 : i], names[i], lens[i]);
    }
    for (size_t i = 0; i < src.n; i++)
        cr_expect(has(&doc_pairs, src.p[i].status, src.p[i].code),
                  "docs/forwarding.md: the errors table has no %u `%s`", src.p[i].status,
                  src.p[i].code);
    for (size_t i = 0; i < doc_pairs.n; i++)
        cr_expect(has(&src, doc_pairs.p[i].status, doc_pairs.p[i].code),
                  "docs/forwarding.md: the errors table lists %u `%s`, which proxy/ never answers",
                  doc_pairs.p[i].status, doc_pairs.p[i].code);
    free(doc);
}

Test(error_codes, grpc_md_gives_every_error_code_its_grpc_status)
{
    struct pairs src = { 0 };
    source_pairs(&src);
    char *doc = proc_read_file("docs/grpc.md");
    for (size_t i = 0; i < src.n; i++) {
        const char *at = NULL, *row;
        int documented = -1;
        while ((row = next_row(doc, "## Errors of retryproxy's own", &at)) != NULL) {
            const char *names[16];
            size_t lens[16];
            size_t nc = cell_codes(row + 2, names, lens, 16);
            for (size_t k = 0; k < nc; k++)
                if (lens[k] == strlen(src.p[i].code) &&
                    strncmp(names[k], src.p[i].code, lens[k]) == 0)
                    documented = atoi(strstr(row + 2, " | ") + 3);
        }
        unsigned want = (unsigned)grpc_code_of_error(src.p[i].code, src.p[i].status);
        cr_expect_eq(documented, (int)want,
                     "docs/grpc.md: `%s` (HTTP %u) becomes gRPC status %u, the table says %d (-1: "
                     "not listed)",
                     src.p[i].code, src.p[i].status, want, documented);
    }
    free(doc);
}
