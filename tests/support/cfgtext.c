/* cfgtext -- a config loaded from text in a unit test (cfgtext.h). */
#include "tests/support/cfgtext.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cfg *cfgt_load(const char *text, char **errors)
{
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct cfg *c = cfg_load_buffer(text, strlen(text), "test", &errs);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (m) {
        cfg_errs_print(m, NULL, &errs);
        fclose(m);
    }
    cfg_errs_clear(&errs);
    *errors = buf;
    return c;
}

double cfgt_ms_between(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) * 1e3 + (double)(b->tv_nsec - a->tv_nsec) / 1e6;
}

char *cfgt_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    return s;
}

char *cfgt_errors_text(const struct cfg_errs *errs)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    cfg_errs_print(m, NULL, errs);
    fclose(m);
    return buf;
}

struct cfg *cfgt_load_ok(const char *text)
{
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct cfg *c = cfg_load_buffer(text, strlen(text), "test", &errs);
    char *etext = cfgt_errors_text(&errs);
    cr_assert_not_null(c, "rejected:\n%s", etext);
    free(etext);
    cfg_errs_clear(&errs);
    return c;
}

char *cfgt_load_errors(const char *text)
{
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct cfg *c = cfg_load_buffer(text, strlen(text), "test", &errs);
    cr_assert_null(c, "accepted: %s", text);
    char *s = cfgt_errors_text(&errs);
    cfg_errs_clear(&errs);
    return s;
}
