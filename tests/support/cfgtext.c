/* cfgtext -- a config loaded from text in a unit test (cfgtext.h). */
#include "tests/support/cfgtext.h"

#include <stdio.h>
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
