/* reloadtest -- what the reload suites (tests/integration/test_reload*.c) share: a config
 * directory of each test's own, config texts written in place or by rename, the proxy started
 * on them, and the admin API's /config, /schedule and /metrics read back.
 *
 * The config always has one route "r" with a fixed, jitter-free backoff, so a base_ms change is
 * visible as is in /config and /schedule, and max_attempts is visible in X-Retry-Attempts.
 * Each test keeps its config in a directory of its own (not px->dir, which holds the proxy's
 * stdout and stderr), so it may delete, re-create or restructure that directory at will.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_RELOADTEST_H
#define RETRYPROXY_TESTS_SUPPORT_RELOADTEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/support/fixture.h"

/* The contract says "within one second of the write"; this leaves room for a loaded machine
 * and sanitizers while still failing if only the 2 s poll backstop noticed the change. */
#define VISIBLE_MS 1500

/* Longer than the 100 ms debounce plus a reload, for "nothing happened" checks. */
#define SETTLE_MS 500

/* For an event that must follow one the test caused or saw (a refused file counted, the log
 * line of a generation seen): waited on, up to a bound generous enough for a loaded machine
 * (the control thread may be held for a while); a test passing does not wait it out. */
#define EVENT_MS 10000

extern char rl_dir[64]; /* the config's directory */

extern const char *rl_cfg_path; /* rl_dir/config.json */

/* The request of request_in_flight_keeps_the_policy_it_started_with, sent from its own thread so
 * that the config can change while it waits. */
extern struct http_call rl_flight;

void rl_setup(void);

void rl_teardown(void);

/* ---- config files ---- */

/* The config text: route "r" to tup, 'max_attempts', a fixed backoff of 'base_ms' under the
 * key 'base_key' ("base_ms", or a typo), and 'top' (complete members with a trailing comma, or
 * "") first. Several lines, so that error positions have a line and a column to check. */
void cfg_text(char *buf, size_t cap, int max_attempts, int base_ms, const char *base_key,
              const char *top);

void cfg_simple(char *buf, size_t cap, int max_attempts, int base_ms);

/* open(O_TRUNC) + write: the file keeps its inode and is briefly empty or partial. */
void write_in_place(const char *path, const char *text, size_t len);

/* An editor's save: the whole new content under a temporary name in the same directory, then
 * rename(2) over the config (a new inode appears atomically). */
void write_renamed(const char *path, const char *text);

/* ---- the proxy and its admin API ---- */

/* Starts the proxy on rl_cfg_path, with the listeners on free ports given on the command line
 * ('pin_listeners') or taken from the file. */
void rl_launch(bool pin_listeners);

json_t *rl_get_config(void);

long generation_of(const json_t *c);

/* routes[0].retry.backoff.base_ms of the effective config, -1 if absent. */
long base_ms_of(const json_t *c);

/* /config's last_error (NULL when it is JSON null), copied into 'buf'. */
const char *last_error_of(const json_t *c, char *buf, size_t cap);

long generation_now(void);

long base_ms_now(void);

/* The two delays /schedule gives route r with a fixed seed. Checked apart from /config
 * because it goes through the published runtime's policy, not the config's JSON rendering. */
void schedule2(long *d1, long *d2);

/* The first delay of route r's fixed policy without jitter: exactly base_ms, both times. */
long schedule_delay(void);

/* Polls /config every 20 ms until 'ok' holds for it. Returns the milliseconds since 't0'
 * (the write), or -1 after 'timeout_ms'. */
int64_t poll_config(int64_t t0, int timeout_ms, bool (*ok)(json_t *c, void *arg), void *arg);

struct want_config {
    long gen, base;
};

bool config_is(json_t *c, void *arg);

/* Waits until 'generation' reaches 'gen' (if >= 0) and base_ms equals 'base' (if >= 0). */
int64_t wait_config(int64_t t0, long gen, long base, int timeout_ms);

#define FAILURES "retryproxy_config_reloads_total{result=\"failure\"}"

#define SUCCESSES "retryproxy_config_reloads_total{result=\"success\"}"

/* 1 after a load that worked, 0 while the last file tried was refused. */
#define LAST_OK "retryproxy_config_last_reload_successful"

/* fx_wait_metric() for 'timeout_ms' from 't0': the milliseconds since 't0' when 'series'
 * reached 'want', or -1. */
int64_t rl_wait_metric(int64_t t0, const char *series, double want, int timeout_ms);

/* ---- the reload log ---- */

/* The "trigger" of the "config reloaded" log line for generation 'gen' (copied into 'buf'),
 * polled from the proxy's stdout for up to EVENT_MS (the line follows the publication the
 * test saw in /config), or NULL if there is none: "replaced" (the watch saw a complete change
 * and read it at once), "changed" (a change in progress, read after the debounce), "poll" or
 * "forced". */
const char *reload_trigger(long gen, char *buf, size_t cap);

/* Generation 'gen' was published through the path 'want' ("replaced" or "changed"). The 2 s
 * content poll may get there first, in the moment between a change and the reading of its
 * event (a race of microseconds per 2 s), so "poll" passes too: it never stands for the
 * debounce. */
void expect_trigger(long gen, const char *want, const char *what);

/* ---- requests through the proxy ---- */

/* GET through the proxy with request id 'id' and tup plan 'plan'; returns X-Retry-Attempts
 * (-1 if missing) and the status in '*status'. */
int rl_attempts(const char *id, const char *plan, long *status);

/* An always-failing request: shows the max_attempts in force (and its tup count agrees). */
void expect_max_attempts(const char *id, int want);

/* Writes the initial config (max_attempts, base_ms) and starts the proxy on it. */
void rl_start(int max_attempts, int base_ms);

#endif
