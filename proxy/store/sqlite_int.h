/* sqlite_int -- the SQLite store's state, shared by its thread (sqlite.c) and its statements
 * (sqlite_sql.c). Everything here but the counters is the store thread's alone. */
#ifndef RETRYPROXY_PROXY_SQLITE_INT_H
#define RETRYPROXY_PROXY_SQLITE_INT_H

#include <sqlite3.h>
#include <stdatomic.h>

#include "proxy/store/backend.h"

/* The schema's version (PRAGMA user_version): each change adds a migration step in
 * sqlite_sql.c and raises it. A file of a newer version is refused. */
#define SQL_SCHEMA_VERSION 4

enum sql_stmt {
    S_INSERT,
    S_BY_KEY,
    S_DUE,
    S_DUE_ROUTE,
    S_NEXT_ROUTE,
    S_LEASE,
    S_ADD_TRY,
    S_READ,
    S_END,
    S_STATE,
    S_RENEW,
    S_MAKE_DEAD,
    S_TRIES,
    S_REPLAY,
    S_DROP,
    S_DROP_TRIES,
    S_LIST,
    S_LIST_COUNT,
    S_LIVE,
    S_PAGES,
    S_FREE_PAGES,
    S_SAVEPOINT,
    S_ROLLBACK_TO,
    S_RELEASE,
    S_BEGIN,
    S_COMMIT,
    S_ROLLBACK,
    S_COUNT,
};

/* sqlite_ops.c's statements prepared at open. */
enum ops_stmt { OPS_DROP_TRIES, OPS_DROP, OPS_REPLAY, OPS_COUNT };

struct store_impl {
    struct store_q q; /* first: backend.c's front sees it */
    sqlite3 *db;
    sqlite3_stmt *st[S_COUNT];
    sqlite3_stmt *ops_st[OPS_COUNT];
    uint64_t page_size;
    int lock_fd; /* PATH.lock, flock'd (store_opts.exclusive); -1: none */
    /* The store thread's view: deliveries kept but the delivered ones, and the change the
     * open transaction makes to it (applied once committed). */
    uint64_t live;
    int64_t live_delta;
    uint64_t bytes_added; /* by the open transaction's enqueues, roughly */
    uint64_t last_sweep;  /* the store clock's ms of the last retention sweep */
};

/* The store's wall clock, ms. */
#define sql_now(s) store_q_now(&(s)->q.o)
/* An SQLite result code as a STORE_E*. */
int sql_error(int rc);
/* Creates or migrates the schema and prepares the statements. 0 or STORE_E* with err. */
int sql_setup(struct store_impl *s, struct store_err *err);
void sql_finalize(struct store_impl *s);
/* What each operation does inside the open transaction (struct store_runner); its result (0
 * or STORE_E*). */
int sql_enqueue(struct store_impl *s, struct store_call *c);
int sql_claim(struct store_impl *s, struct store_call *c);
int sql_end(struct store_impl *s, struct store_call *c);
int sql_renew(struct store_impl *s, struct store_call *c);
int sql_insert_dead(struct store_impl *s, struct store_call *c);
int sql_list(struct store_impl *s, struct store_call *c);
int sql_get(struct store_impl *s, const char *id, struct store_delivery *d);
int sql_change(struct store_impl *s, struct store_call *c);

/* An exclusive opener's recovery: every delivery in flight (its process is gone) is due now,
 * its lost attempt recorded. How many, or STORE_E*. */
int sql_recover(struct store_impl *s);
/* The file's size in use (pages but the free ones). */
uint64_t sql_bytes(struct store_impl *s);
/* Runs a statement without rows (BEGIN, SAVEPOINT...); its result code. */
int sql_step_reset(sqlite3_stmt *st);
/* Text column i as a malloc'd copy (NULL for SQL NULL, or out of memory). */
char *sql_col_text(sqlite3_stmt *st, int i);

/* sqlite_ops.c: the indexes its filters need (at open); the operators' operations (find,
 * bulk, counts) inside the open transaction; retention, in a transaction of its own, when a
 * second has passed since the last. */
int sql_ops_setup(struct store_impl *s, struct store_err *err);
void sql_ops_finalize(struct store_impl *s);
int sql_find(struct store_impl *s, struct store_call *c);
int sql_bulk(struct store_impl *s, struct store_call *c);
int sql_counts(struct store_impl *s, struct store_call *c);
void sql_sweep(struct store_impl *s);
#endif
