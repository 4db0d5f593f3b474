/* admintest -- what the admin suites (tests/integration/test_admin*.c) share: a tup and a proxy
 * with its admin port, requests to both, the proxy's /metrics series and its stdout log lines.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_ADMINTEST_H
#define RETRYPROXY_TESTS_SUPPORT_ADMINTEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "tests/support/fixture.h"

/* Log lines are flushed once per event-loop turn and metrics settle soon after a response:
 * how long to poll for them before asserting. */
#define ADM_SETTLE_MS 2000

/* A fast retry policy for route "r" (cfgb.h). */
#define FAST CFG_FAST

/* A tup and a proxy (two workers) with route "r" to it. 'top' holds extra top-level members,
 * 'route' extra members of route "r", 'more' a further route object (each of the three may be
 * ""); 'arg' and 'val' are one extra command-line option, or NULL. */
void adm_start_with(const char *top, const char *route, const char *more, const char *arg,
                    const char *val);

void adm_start(const char *route);

/* Rewrites the config file in place, as an operator's editor might. The proxy's watcher would
 * reload it some 100 ms later (debounce); the tests POST /reload at once, so theirs is the
 * reload that counts and the watcher then finds that content already tried. */
void adm_write_cfg(const char *json);

/* The route "r" config of adm_start() with 'route' as its extra members. */
void adm_route_cfg(char *buf, size_t cap, const char *route);

/* ---- HTTP helpers ---- */

void admin_do(const char *method, const char *path, struct http_resp *r);

/* Parses a JSON answer, checking its status and Content-Type; the caller decrefs. */
json_t *admin_json(const char *method, const char *path, long want_status);

/* Sends one proxied request; the caller frees. */
struct http_resp adm_send_req(const char *method, const char *path, const char *const *h,
                              const char *body);

/* A proxied request with a test plan and request id (a POST carries a one-byte body),
 * expecting 'want' as the final status. */
void adm_send_plan(const char *method, const char *path, const char *plan, const char *id,
                   long want);

/* A blocking TCP connection to the proxy's listener. */
int adm_connect_proxy(void);

/* ---- time ---- */

/* True when 's' is RFC 3339 UTC with milliseconds (2026-11-21T10:15:30.123Z) naming a real
 * instant; its Unix seconds go to *out. */
bool rfc3339_ms(const char *s, time_t *out);

/* The time field is a recent instant: guards against an epoch-zero or local-time stamp. */
void expect_recent_time(const char *what, const char *s);

/* ---- metrics ---- */

char *adm_scrape(void);

/* The value of series name{labels} ("" for none) as prom_sum() reads it: label order does not
 * matter (it does not in the format), labels left out are summed over; NAN if none matches. */
double adm_metric(const char *text, const char *name, const char *labels);

void adm_expect_metric(const char *text, const char *name, const char *labels, double want);

/* Polls /metrics until the series equals 'want'; returns the last value seen. */
double adm_wait_metric(const char *name, const char *labels, double want, int timeout_ms);

/* ---- logs ---- */

/* Every complete stdout line parsed as JSON, in order; *bad counts lines that are not a JSON
 * object. The caller decrefs. */
json_t *adm_log_lines(size_t *bad);

/* Lines whose msg is 'msg' (and request_id 'rid', unless NULL); the first goes to *first. */
size_t adm_count_msg(const json_t *lines, const char *msg, const char *rid, json_t **first);

/* Polls stdout until at least n lines match (msg, rid), for up to ADM_SETTLE_MS; returns the
 * lines (the caller decrefs) with the number of non-JSON lines in *bad. */
json_t *adm_wait_logs(const char *msg, const char *rid, size_t n, size_t *bad);

/* Lines of stdout containing 'needle'. */
size_t adm_count_raw(const char *out, const char *needle);

/* Two mistakes an operator makes: a typo'd key and an out-of-range value. */
void adm_write_invalid_cfg(void);

#endif
