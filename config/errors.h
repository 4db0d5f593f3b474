/* errors -- the list of problems found in a config file.
 *
 * Each error names where it is: the JSON path ("$.routes[0].retry.max_attempts") and the line
 * and column of the offending text (1-based; 0 when the problem has no place in the file, such
 * as a file that cannot be read). Printed as "FILE:LINE:COL: PATH: MESSAGE".
 */
#ifndef RETRYPROXY_CONFIG_ERRORS_H
#define RETRYPROXY_CONFIG_ERRORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* More errors than this in one file are counted, not kept: past a point they are noise. */
#define CFG_ERRS_MAX 200

struct cfg_err {
    char *path; /* "$" for the whole document */
    uint32_t line, col;
    char *msg;
};

struct cfg_errs {
    struct cfg_err *v;
    size_t n, cap;
    size_t dropped; /* errors beyond CFG_ERRS_MAX */
};

void cfg_errs_init(struct cfg_errs *e);
/* Frees every error; 'e' is empty and reusable. Accepts NULL. */
void cfg_errs_clear(struct cfg_errs *e);

/* Appends an error unless an identical one (same place, path and message) is already listed:
 * a value inherited from "defaults" by several routes is reported once. */
void cfg_errs_add(struct cfg_errs *e, const char *path, uint32_t line, uint32_t col,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* 'msg' as a message is kept, in 'out' (at least 6 * strlen(msg) + 4 bytes): one line of valid
 * UTF-8 whatever 'msg' holds, control characters and bad bytes escaped, ending in "..." when
 * 'cut'. Also for messages that quote other untrusted text (the admin API's query values). */
void cfg_errs_tidy(char *out, const char *msg, int cut);

/* Orders errors by position in the file (errors without a position first), keeping the order
 * in which they were found among equals. */
void cfg_errs_sort(struct cfg_errs *e);

/* Writes one line per error: "FILE:LINE:COL: PATH: MESSAGE" ("FILE: PATH: MESSAGE" without a
 * position), then a line for dropped errors if any. 'file' may be NULL to omit the file part
 * (the line then starts with "LINE:COL: "). */
void cfg_errs_print(FILE *out, const char *file, const struct cfg_errs *e);

#endif
