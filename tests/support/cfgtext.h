/* cfgtext -- a config loaded from text in a unit test, with its errors as the CLI prints them. */
#ifndef RETRYPROXY_TESTS_CFGTEXT_H
#define RETRYPROXY_TESTS_CFGTEXT_H

#include <time.h>

#include "config/cfg.h"

/* The config 'text' (its source named "test"), or NULL when refused; *errors is every problem
 * as `retryproxy check` prints them, one a line ("" when none), for the caller to free. */
struct cfg *cfgt_load(const char *text, char **errors);
/* The config 'text', asserted accepted (the errors in the failure's message). */
struct cfg *cfgt_load_ok(const char *text);
/* The errors of config 'text', asserted refused, as cfgt_load() gives them; malloc'd. */
char *cfgt_load_errors(const char *text);
/* 'errs' as `retryproxy check` prints them, malloc'd. */
char *cfgt_errors_text(const struct cfg_errs *errs);
/* The file at 'path' whole, malloc'd; NULL when it cannot be opened. */
char *cfgt_read_file(const char *path);
/* Milliseconds from 'a' to 'b'. */
double cfgt_ms_between(const struct timespec *a, const struct timespec *b);

#endif
