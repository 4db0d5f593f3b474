/* durabletest -- what the suites of durable routes share (tests/integration/test_durable*.c,
 * docs/delivery.md): the proxy on a SQLite store in the test's directory with route "r", a
 * durable POST and its 202, and the store's file read by the test. Policies are short (fixed
 * backoffs of a few hundred ms, no jitter); the courier looks for due deliveries every 200 ms, so
 * spacings are asserted with that much slack and more (a loaded machine), and every wait is
 * bounded. Criterion asserts. */
#ifndef RETRYPROXY_TESTS_SUPPORT_DURABLETEST_H
#define RETRYPROXY_TESTS_SUPPORT_DURABLETEST_H

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/support/fixture.h"

#define DUR_T 20000 /* ms: upper bound for any single request */

/* The store, and where dur_setup() put it. */
extern char dur_store_path[160], dur_disk_store[160];

/* The suites' .init: one test upstream, the store's path in the test's config directory. */
void dur_setup(void);
/* The config: 'store' members besides its path; route "r" durable, a fixed 300 ms backoff, with
 * 'retry' and 'delivery' members more, and 'route' members (each "" or ", "-led text). */
char *dur_cfg(const char *store, const char *retry, const char *delivery, const char *route);
/* The proxy (2 workers) on dur_cfg()'s config. */
void dur_start(const char *store, const char *retry, const char *delivery, const char *route);
/* The proxy on the store and route "r" of 'members' alone (its JSON members, as written). */
void dur_start_route(const char *members);
/* POST 'body' to the durable route with X-Request-Id 'id' and 'more' headers (NULL-ended). */
void dur_post(const char *id, const char *body, const char *const *more, struct http_resp *out);
/* POSTs as dur_post() does and asserts its 202; the delivery's id into 'id' (33 bytes). */
void dur_post_accepted(const char *rid, const char *body, const char *const *more, char *id);
/* The delivery's id from a 202, copied to 'id' (33 bytes); asserts the 202's shape. */
void dur_accepted(struct http_resp *r, char *id);
/* 'n' requests with ids PREFIX-0 ..., each answered 202. */
void dur_post_many(const char *prefix, int n);

/* ---- the store's file, read by the test ---- */

sqlite3 *dur_db_open(void);
/* One integer of 'sql' (with 'id' bound to ?1 when not NULL); -1 when no row. */
long long dur_db_int(const char *sql, const char *id);
/* One text of 'sql' for 'id', malloc'd ("" when none). */
char *dur_db_text(const char *sql, const char *id);
/* Delivery 'id''s state (the row's integer), -1 when there is no row. */
long long dur_state_of(const char *id);
/* Waits up to 'ms' for delivery 'id' to reach state 'want' (2 delivered, 3 dead); asserts. */
void dur_wait_state(const char *id, long long want, int ms);
/* Delivery 'id' of route "r" becomes a dead letter for 'reason' (within 10 s), counted so. */
void dur_wait_dead(const char *id, const char *reason);
/* ms from the upstream's request 'a' to its request 'b' (tup's records, by arrival). */
int64_t dur_between_ms(size_t a, size_t b);

#endif
