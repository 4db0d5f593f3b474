/* cfgb -- build the JSON text of a retryproxy config for a test.
 *
 * A test names what its config is about and nothing else: members are written as JSON object
 * members without the braces, printf-style ("\"retry\": {\"max_attempts\": %d}"), and merged
 * (recursively, a later value replacing an earlier one) into the top level or into a route. A
 * route's "upstreams" defaults to the fixture's first test upstream (fixture.h). The text comes
 * out through jansson, one line, members in the order they were first given.
 *
 *   struct cfgb *b = cfgb_new();
 *   cfgb_top(b, "\"budget\": {\"max_concurrent_retries\": %d}", 2);
 *   cfgb_route(b, "r", "\"retry\": {" CFG_FAST "}");
 *   char *json = cfgb_text(b);   // {"budget": {...}, "routes": [{"name": "r", ...}]}
 *
 * A member text that does not parse fails the test, naming it. A config that is itself the
 * point of a test (an invalid one, one whose error positions are checked) stays a literal in
 * the test.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_CFGB_H
#define RETRYPROXY_TESTS_SUPPORT_CFGB_H

#include <stddef.h>

/* A retry policy fragment most tests want: 10 ms backoff, no jitter, so retries come at once
 * and their timing is exact. */
#define CFG_FAST "\"backoff\": {\"base_ms\": 10, \"jitter\": \"none\"}"
/* A fixed backoff of 'ms' milliseconds without jitter, as a complete "backoff" member. */
#define CFG_FIXED(ms)                                                                              \
    "\"backoff\": {\"policy\": \"fixed\", \"base_ms\": " #ms ", \"jitter\": \"none\"}"

struct cfgb;

/* An empty config: {"routes": []}. Never NULL. */
struct cfgb *cfgb_new(void);
/* Merges 'fmt' (printf; object members without braces; "" adds nothing) into the top level. */
void cfgb_top(struct cfgb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends route 'name' with upstream 0 of the fixture and 'fmt' merged into it ("upstreams"
 * among them replaces the default). */
void cfgb_route(struct cfgb *b, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The JSON text (malloc'd, the caller frees); frees the builder. */
char *cfgb_text(struct cfgb *b);

/* The commonest config in one call: 'top' members, and one route "r" to upstream 0 with
 * 'route' members (either may be ""). Malloc'd. */
char *cfg_r(const char *top, const char *route);

/* Writes 'text' to 'path' through a temporary file and rename(), as an editor saves. */
void cfg_write_renamed(const char *path, const char *text);
/* Rewrites 'path' in place (truncate and write), as some editors and `echo >` do. */
void cfg_write_in_place(const char *path, const char *text, size_t len);

#endif
