/* fixture -- the proxy and its test upstreams for an integration test, and what such tests share.
 *
 * Criterion runs every test in a process of its own, so the fixture is global: a test starts
 * upstreams (fx_upstreams) and the proxy on a config (fx_start, fx_start_r), then talks to
 * 'px' and asserts what 'up' received; the suite's .fini is fx_stop, which stops everything the
 * test left running. Every port is a free one the kernel picked.
 *
 *   TestSuite(retry, .fini = fx_stop);
 *   Test(retry, x) {
 *       fx_start_r("", "\"retry\": {" CFG_FAST "}", "--workers", "2", NULL);
 *       ... http_do(px_url(px, ...)) ... tup_count_id(up, "id") ...
 *   }
 *
 * Criterion 2.4 prints but does not count a failed assertion in a .fini: fx_stop aborts instead
 * (the test is then reported as crashed) when the proxy did not exit 0, as px_stop_clean does.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_FIXTURE_H
#define RETRYPROXY_TESTS_SUPPORT_FIXTURE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tests/support/cfgb.h"
#include "tests/support/harness.h"
#include "tests/support/tup.h"

#define FX_UPSTREAMS 4   /* test upstreams one test may run */
#define FX_CALLS     4   /* requests in threads of their own (fx_calls) */
#define FX_HELD      256 /* raw client sockets closed by fx_stop */

/* The proxy under test (NULL until started, and after fx_stop) and upstream 0. A test that
 * stops the proxy itself (px_stop) sets px to NULL. */
extern struct px *px;
extern struct tup *up;
/* Requests sent from their own threads: fx_stop joins and frees every one started. */
extern struct http_call fx_calls[FX_CALLS];
/* The config of fx_config_dir(), "" before. */
extern char fx_cfg_path[128];

/* Starts test upstreams until 'n' run (up is the first). */
void fx_upstreams(size_t n);
/* Upstream i (NULL if not started), and "http://127.0.0.1:PORT" of it (static per index). */
struct tup *fx_up(size_t i);
const char *fx_up_url(size_t i);

/* Starts the proxy on the config text 'json' with up to 8 extra arguments (NULL-terminated):
 * px_start(). */
void fx_start(const char *json, ...);
/* Starts upstream 0 if none runs, then the proxy on cfg_r(top, route) with the extra
 * arguments (NULL-terminated). */
void fx_start_r(const char *top, const char *route, ...);
/* Starts the proxy on the config 'b' builds (and frees) with the extra arguments. */
void fx_start_b(struct cfgb *b, ...);
/* px_start_argv(): for a test that keeps its config at fx_cfg_path. */
void fx_start_argv(const char *const *args);

/* A config directory of the test's own, /tmp/retryproxy-NAME-XXXXXX (px->dir holds the
 * proxy's output): sets fx_cfg_path to DIR/config.json and returns the directory; fx_stop
 * removes it. */
const char *fx_config_dir(const char *name);

/* Closes 'fd' in fx_stop if the test has not (a test cut short by an assertion); returns it. */
int fx_hold(int fd);
/* Forgets a held descriptor the test closed itself. */
void fx_release(int fd);

/* .init of a suite whose tests run libcurl in several threads: curl_global_init() once before
 * any of them (fx_stop cleans up). */
void fx_init_curl(void);
/* .fini: joins fx_calls, closes held sockets, stops the proxy (exit status 0 or abort), the
 * upstreams, removes fx_config_dir(). */
void fx_stop(void);
/* .fini for tests that end the proxy with a signal of their own: the proxy is stopped first
 * (which also ends the calls still waiting on it) and its exit status is not checked. */
void fx_stop_any(void);

/* ---- helpers the suites share ---- */

/* "http://127.0.0.1:PROXY_PORT" + path, in a static buffer (copy it to keep it). */
const char *fx_url(const char *path);
/* Whether the proxy under test is an ASan build (a path with "asan"): RSS bounds are looser. */
bool fx_under_asan(void);
/* Whether it is a sanitizer build of either kind ("asan" or "tsan" in its path): its heap is
 * the sanitizer's, which glibc's malloc_trim() does not give back. */
bool fx_under_sanitizer(void);
/* A 127.0.0.1 port nothing listens on: bound and never listening for as long as the test's
 * process runs, so that a connect to it is refused and nothing else takes it meanwhile. */
uint16_t fx_closed_port(void);
/* A 127.0.0.1 port free now (bound, then closed), for a server the test starts on it. */
uint16_t fx_free_port(void);
/* A listening socket on 127.0.0.1 (blocking), its port in *port: a bare peer of the test's. */
int fx_listen(uint16_t *port);
/* The next connection on listening socket 'lfd', looking at '*stop' every 50 ms meanwhile: -1
 * once it is set. For a scripted peer's thread. */
int fx_accept(int lfd, volatile int *stop);
/* A config of route "r" whose upstreams are fx_closed_port() and then upstream 0 (started if
 * need be), with max_attempts 2 and CFG_FAST: a connect failure, then its retry. */
struct cfgb *fx_cfg_closed_then_up(void);
/* system(cmd): its exit status, -1 if it did not exit. */
int fx_sh(const char *cmd);
/* qsort comparator of int64_t. */
int fx_cmp_i64(const void *a, const void *b);

/* Polls cond(arg) every 'step_ms' until it holds or 'timeout_ms' passed; whether it held. */
bool fx_wait(bool (*cond)(void *arg), void *arg, int timeout_ms, int step_ms);
/* Waits up to 5 s for upstream 0 to have seen 'n' attempts with request id 'id'; asserts. */
void fx_wait_upstream(const char *id, size_t n);

/* ---- the admin API ---- */

/* The value of one series ("name{labels}", or a bare name) in a /metrics text, NAN if absent:
 * the sum of the samples carrying those labels (prom_sum(), tests/support/promtext.h). */
double metric_in(const char *text, const char *series);
/* One scrape of /metrics: 0 and the series' value (NAN if absent) in *v, or -1 when the scrape
 * failed. Never asserts (a sampler thread may call it). */
int fx_scrape_metric(const char *series, double *v);
/* The same, asserting that the scrape worked. */
double fx_metric(const char *series);
/* Polls a series until it equals 'want' or 'timeout_ms' passed; the last value seen. */
double fx_wait_metric(const char *series, double want, int timeout_ms);
/* A self-signed certificate in IN/NAME.pem (key IN/NAME.key) whose subjectAltName is 'san'
 * ("IP:127.0.0.1"), made by openssl (asserted). */
void fx_make_cert(const char *in, const char *name, const char *san);
/* The whole lines of a file of JSON lines (a test upstream's records), as a JSON array (caller
 * decrefs); a line still being written is left out. */
json_t *fx_read_jsonl(const char *path);
/* One GET of "/" through the proxy with X-Request-Id 'id' (20 s at most); its status. A
 * transfer that fails (no status) fails the test. */
long fx_get_id(const char *id);
/* The same with X-Test-Plan 'plan' (NULL: none). */
long fx_get_id_plan(const char *id, const char *plan);

/* GET 'path' on the admin listener, status 200 and a JSON body asserted (caller decrefs). */
json_t *fx_admin_get_json(const char *path);
/* 'method' 'path' on the admin listener, whatever its status (in *status if not NULL): its
 * JSON body, asserted (caller decrefs). */
json_t *fx_admin_json(const char *method, const char *path, long *status);
/* A string member of a JSON object, NULL when absent or not a string. */
const char *json_str(const json_t *o, const char *key);
/* The first JSON log line in 'out' (the proxy's stdout) whose "msg" is 'msg', or NULL (caller
 * decrefs). */
json_t *fx_log_line(const char *out, const char *msg);
/* The request log line of the running proxy whose string member 'key' is 'value', polled for
 * up to 10 s: NULL if none came (caller decrefs). */
json_t *fx_request_logged(const char *key, const char *value);
/* The same for the running proxy's log line whose "msg" is 'msg'. */
json_t *fx_logged(const char *msg, const char *key, const char *value);

/* ---- a raw client, for the bytes on the wire ---- */

/* A TCP connection to 127.0.0.1:port (asserts). */
int raw_dial(uint16_t port);
/* Sends all of p; false (errno set) if the peer closed or reset first. */
bool raw_send_all(int fd, const void *p, size_t n);
/* Waits up to 'timeout_ms' for bytes: >0 bytes read, 0 end of stream, -1 error (errno set;
 * ECONNRESET is a close too), -2 nothing arrived in time. */
ssize_t raw_recv(int fd, char *buf, size_t cap, int timeout_ms);
/* Sends the 'n' bytes at 'p' (asserts) and waits up to 'timeout_ms' for the answer: the status
 * of its status line, or -1 when none came. */
int raw_send_status(int fd, const void *p, size_t n, int timeout_ms);

#endif
