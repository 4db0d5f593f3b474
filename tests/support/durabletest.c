/* durabletest -- what the suites of durable routes (tests/integration/test_durable*.c) share:
 * the proxy started on a store and route "r", the durable POST and its 202, and the store's file
 * read with SQLite (durabletest.h). */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/durabletest.h"
#include "tests/support/fixture.h"

char dur_store_path[160], dur_disk_store[160]; /* the store, and where dur_setup() put it */

void dur_setup(void)
{
    fx_upstreams(1);
    snprintf(dur_store_path, sizeof(dur_store_path), "%s/store.db", fx_config_dir("durable"));
    snprintf(dur_disk_store, sizeof(dur_disk_store), "%s", dur_store_path);
}

/* The config: 'store' members besides its path; route "r" durable, a fixed 300 ms backoff, with
 * 'retry' and 'delivery' members more, and 'route' members (each "" or ", "-led text). */
char *dur_cfg(const char *store, const char *retry, const char *delivery, const char *route)
{
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"%s}", dur_store_path, store);
    cfgb_route(b, "r",
               "\"delivery\": {\"mode\": \"durable\"%s}, \"retry\": {" CFG_FIXED(300) "%s}%s",
               delivery, retry, route);
    return cfgb_text(b);
}

void dur_start(const char *store, const char *retry, const char *delivery, const char *route)
{
    char *json = dur_cfg(store, retry, delivery, route);
    fx_start(json, "--workers", "2", NULL);
    free(json);
}

/* The proxy on the store and route "r" of 'members' alone (its JSON members, as written). */
void dur_start_route(const char *members)
{
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "\"store\": {\"path\": \"%s\"}", dur_store_path);
    cfgb_route(b, "r", "%s", members);
    char *json = cfgb_text(b);
    fx_start(json, "--workers", "2", NULL);
    free(json);
}

/* POST 'body' to the durable route with X-Request-Id 'id' and 'more' headers (NULL-ended). */
void dur_post(const char *id, const char *body, const char *const *more, struct http_resp *out)
{
    char idh[128];
    snprintf(idh, sizeof(idh), "X-Request-Id: %s", id);
    const char *h[8] = { idh };
    for (size_t i = 0; more && more[i] && i < 6; i++)
        h[i + 1] = more[i];
    http_do("POST", fx_url("/hook"), h, body, strlen(body), DUR_T, out);
    cr_assert_eq(out->rc, 0, "the accept's transfer failed");
}

/* ---- the store's file, read by the test ---- */

sqlite3 *dur_db_open(void)
{
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open_v2(dur_store_path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK,
                 "cannot open %s", dur_store_path);
    sqlite3_busy_timeout(db, 5000);
    return db;
}

/* One integer of 'sql' (with 'id' bound to ?1 when not NULL); -1 when no row. */
long long dur_db_int(const char *sql, const char *id)
{
    sqlite3 *db = dur_db_open();
    sqlite3_stmt *st = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql,
                 sqlite3_errmsg(db));
    if (id)
        sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    long long v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* One text of 'sql' for 'id', malloc'd ("" when none). */
char *dur_db_text(const char *sql, const char *id)
{
    sqlite3 *db = dur_db_open();
    sqlite3_stmt *st = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s", sql);
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    char *v = NULL;
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
        const void *p = sqlite3_column_blob(st, 0);
        int n = sqlite3_column_bytes(st, 0);
        v = strndup(p, (size_t)n);
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v ? v : strdup("");
}

long long dur_state_of(const char *id)
{
    return dur_db_int("SELECT state FROM deliveries WHERE id = ?1", id);
}

struct state_wait {
    const char *id;
    long long want;
};

static bool has_state(void *arg)
{
    struct state_wait *w = arg;
    return dur_state_of(w->id) == w->want;
}

/* Waits up to 'ms' for delivery 'id' to reach state 'want' (2 delivered, 3 dead); asserts. */
void dur_wait_state(const char *id, long long want, int ms)
{
    struct state_wait w = { id, want };
    cr_assert(fx_wait(has_state, &w, ms, 50), "delivery %s: state %lld, not %lld after %d ms", id,
              dur_state_of(id), want, ms);
}

/* The delivery's id from a 202, copied to 'id' (33 bytes); asserts the 202's shape. */
void dur_accepted(struct http_resp *r, char *id)
{
    cr_assert_eq(r->status, 202, "status %ld: %.*s", r->status, (int)r->body_len,
                 (const char *)r->body);
    const char *h = http_hdr(r, "X-Delivery-Id");
    cr_assert_not_null(h, "no X-Delivery-Id");
    cr_assert_eq(strlen(h), 32, "X-Delivery-Id %s", h);
    snprintf(id, 33, "%s", h);
    char loc[64];
    snprintf(loc, sizeof(loc), "/deliveries/%s", id);
    cr_assert_str_eq(http_hdr(r, "Location"), loc);
    char want[128];
    snprintf(want, sizeof(want), "\"id\": \"%s\"", id);
    cr_assert_not_null(memmem(r->body, r->body_len, want, strlen(want)), "body %.*s",
                       (int)r->body_len, (const char *)r->body);
}

/* POSTs as dur_post() does and asserts its 202; the delivery's id into 'id' (33 bytes). */
void dur_post_accepted(const char *rid, const char *body, const char *const *more, char *id)
{
    struct http_resp r;
    dur_post(rid, body, more, &r);
    dur_accepted(&r, id);
    http_free(&r);
}

/* 'n' requests with ids PREFIX-0 ..., each answered 202. */
void dur_post_many(const char *prefix, int n)
{
    for (int i = 0; i < n; i++) {
        char rid[32], id[33];
        snprintf(rid, sizeof(rid), "%s-%d", prefix, i);
        dur_post_accepted(rid, "x", NULL, id);
    }
}

/* ms from the upstream's request 'a' to its request 'b' (tup's records, by arrival). */
int64_t dur_between_ms(size_t a, size_t b)
{
    return (tup_get(up, b)->arrival_ns - tup_get(up, a)->arrival_ns) / 1000000;
}

/* Delivery 'id' of route "r" becomes a dead letter for 'reason' (within 10 s), counted so. */
void dur_wait_dead(const char *id, const char *reason)
{
    dur_wait_state(id, 3, 10000);
    char *got = dur_db_text("SELECT reason FROM deliveries WHERE id = ?1", id);
    cr_assert_str_eq(got, reason, "delivery %s", id);
    free(got);
    char series[128];
    snprintf(series, sizeof(series), "retryproxy_dead_letters_total{route=\"r\",reason=\"%s\"}",
             reason);
    cr_assert_eq(fx_wait_metric(series, 1, 5000), 1, "%s", series);
}

/* ---- accepted, then delivered ---- */
