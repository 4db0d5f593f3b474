/* cfgtext -- a config loaded from text in a unit test, with its errors as the CLI prints them. */
#ifndef RETRYPROXY_TESTS_CFGTEXT_H
#define RETRYPROXY_TESTS_CFGTEXT_H

#include "config/cfg.h"

/* The config 'text' (its source named "test"), or NULL when refused; *errors is every problem
 * as `retryproxy check` prints them, one a line ("" when none), for the caller to free. */
struct cfg *cfgt_load(const char *text, char **errors);

#endif
