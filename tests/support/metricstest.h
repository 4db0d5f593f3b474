/* metricstest -- what the suites of the metrics registry (tests/unit/test_metrics*.c) share:
 * readers over the rendered exposition text (proxy/telemetry/metrics.h) and the families every
 * registry exports. */
#ifndef RETRYPROXY_TESTS_SUPPORT_METRICSTEST_H
#define RETRYPROXY_TESTS_SUPPORT_METRICSTEST_H

#include <stdbool.h>
#include <stddef.h>

#include "proxy/telemetry/metrics.h"

/* The exposition of 'm', malloc'd; asserts its length and final newline. */
char *mt_render(struct metrics *m);
/* Whether 'line' is one whole line of 'text'. */
bool mt_has_line(const char *text, const char *line);
/* Start of the line whose series (everything before the value) is exactly 'series', or NULL. */
const char *mt_find_series(const char *text, const char *series);
/* The integer value of 'series', or -1 when it is not rendered. */
long long mt_value_of(const char *text, const char *series);
/* Lines that start with 'prefix'. */
size_t mt_count_lines(const char *text, const char *prefix);

#define expect_line(text, line) cr_expect(mt_has_line(text, line), "missing line: %s", line)

/* expect_line() for each of 'lines'. */
void mt_expect_lines(const char *text, const char *const *lines, size_t n);

/* expect_line() for each line that follows. */
#define EXPECT_LINES(text, ...)                                                                    \
    do {                                                                                           \
        static const char *const lines_[] = { __VA_ARGS__ };                                       \
        mt_expect_lines((text), lines_, sizeof(lines_) / sizeof(lines_[0]));                       \
    } while (0)

/* The families every registry exports (without the retryproxy_ prefix) and their types. */
struct mt_family {
    const char *name, *type;
};
extern const struct mt_family mt_families[];
extern const size_t mt_nfamilies;

#endif
