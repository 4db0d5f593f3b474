/* logtest -- what the log suites (tests/unit/test_log*.c) share: the log written into a fresh
 * unlinked file (a pipe where a test says so), read back as lines, sample request and attempt
 * records, and a checker of event lines.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_LOGTEST_H
#define RETRYPROXY_TESTS_SUPPORT_LOGTEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/telemetry/log.h"

/* log.c's worker buffer: the bound on every line and every write. */
#define BUF_SIZE (64 * 1024)

#define T_MS INT64_C(1795256130123)

#define T_STR "2026-11-21T10:15:30.123Z"

/* Every test writes into a fresh unlinked file (a pipe where the test says so). Criterion runs
 * each test in its own process, so the log's process-wide state starts anew each time. */
extern int lt_fd;

void lt_setup(void);

void lt_teardown(void);

/* ---- helpers ---- */

/* Everything written to lt_fd so far, NUL-terminated (lines never hold a NUL). */
char *lt_output(size_t *len);

struct lines {
    char *all;
    char **v;
    size_t n;
};

/* Splits text (taken over) into lines, checking that it ends with a newline. */
struct lines split_lines(char *text, size_t len);

struct lines read_lines(void);

void free_lines(struct lines *l);

json_t *lt_parse(const char *line);

/* No byte a terminal or a line splitter would act on. */
void expect_no_control(const char *line);

struct log_request sample_request(void);

struct log_attempt sample_attempt(void);

/* Logs r through a fresh buffer and returns everything written (the caller frees it). */
char *request_output(const struct log_request *r);

void expect_request(const struct log_request *r, const char *want);

/* Logs r and checks that its line holds 'want'. */
void expect_request_has(const struct log_request *r, const char *want);

char *lt_fill(char c, size_t n);

/* Checks an event line: a current time, then exactly 'rest' after it. */
void expect_event_line(const char *line, const char *rest, bool json);

#endif
