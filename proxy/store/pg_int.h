/* pg_int -- the PostgreSQL store's state, shared by its thread (pg.c), its operations
 * (pg_sql.c) and the operators' ones (pg_ops.c). Everything here but the counters is the store
 * thread's alone: libpq's connection is used by that thread only (docs/delivery.md, "Shared
 * store (PostgreSQL)").
 */
#ifndef RETRYPROXY_PROXY_PG_INT_H
#define RETRYPROXY_PROXY_PG_INT_H

#include <libpq-fe.h>
#include <stdatomic.h>

#include "proxy/store/backend.h"

/* The schema's version (the table retryproxy_schema): each change adds a migration step in
 * pg.c and raises it. A database of a newer version is refused. */
#define PG_SCHEMA_VERSION 1

struct store_impl {
    struct store_q q;  /* first: backend.c's front sees it */
    PGconn *conn;      /* NULL while down */
    const char *ns;    /* the namespace (q.o.pg_namespace, or "default") */
    uint64_t retry_at; /* down: the monotonic ms of the next connection attempt */
    uint32_t backoff_ms;
    /* The namespace's deliveries kept but the delivered ones, and their bytes, as last counted
     * (at most a second ago: other proxies add theirs), with what this store changed since. */
    uint64_t live, bytes, counted_at;
    int64_t live_delta;
    uint64_t bytes_added;
    uint64_t last_sweep;
};

/* A lost connection is tried again this long after, then backing off (pg.c). */
#define PG_RETRY_FIRST_MS 100

static inline uint64_t pg_mono_ms(void)
{
    return store_mono_us() / 1000;
}

/* pg_conn.c: a new connection to o->pg_url, or NULL with why in why[cap]; a libpq message
 * without its newline. */
PGconn *pg_connect(const struct store_opts *o, char *why, size_t cap);
void pg_trim_msg(char *dst, size_t cap, const char *msg);

/* Up to PGQ_MAX parameters of one statement, as libpq takes them: text, or binary (bytea). */
#define PGQ_MAX 16
struct pgq {
    const char *v[PGQ_MAX];
    int len[PGQ_MAX], fmt[PGQ_MAX];
    char num[PGQ_MAX][24];
    int n;
};
void pgq_text(struct pgq *q, const char *s); /* NULL: SQL NULL */
void pgq_int(struct pgq *q, int64_t v);
void pgq_bin(struct pgq *q, const void *b, size_t len); /* NULL: SQL NULL */

/* A PostgreSQL array literal ({"a",NULL,3}) built element by element, for the statements that
 * take one value per call of a batch (pg_end_set) or a list of names. pga_end() closes it and
 * returns it (NULL when out of memory); free(a.buf) after. */
struct pga {
    char *buf;
    size_t len, cap;
    bool oom;
};
void pga_text(struct pga *a, const char *v); /* NULL: SQL NULL */
void pga_int(struct pga *a, int64_t v);
const char *pga_end(struct pga *a);

/* Runs 'sql' with q's parameters (q may be NULL); its result (PQclear() it) and *r 0, or NULL
 * and *r a STORE_E* (a unique key: STORE_ECONFLICT; a full disk: STORE_EFULL; else
 * STORE_EIO). A connection found broken is closed: the store is down until it reconnects. */
PGresult *pg_exec(struct store_impl *s, const char *sql, const struct pgq *q, int *r);
/* The same for a statement whose rows are not read: 0 or a STORE_E*, and the rows it changed
 * in *changed when not NULL. */
int pg_cmd(struct store_impl *s, const char *sql, const struct pgq *q, uint64_t *changed);

/* A result's values: an integer (0 for NULL), a malloc'd copy of a text (NULL for NULL), a
 * bytea's bytes (NULL for NULL; NUL-terminated, its length in *len). */
int64_t pg_int(const PGresult *res, int row, int col);
char *pg_text(const PGresult *res, int row, int col);
char *pg_bytes(const PGresult *res, int row, int col, size_t *len);

/* pg_sql.c: what each operation does inside the open transaction (struct store_runner; the
 * operators' ones are pg_ops.c's). */
int pg_enqueue(struct store_impl *s, struct store_call *c);
int pg_claim(struct store_impl *s, struct store_call *c);
int pg_end(struct store_impl *s, struct store_call *c);
/* The ends of a run of 'n' calls from 'first' that pg_end_settable() takes, as one statement:
 * done[i] true for the i-th when its row was changed (its result 0); the others (a lease no
 * longer held, a row gone, an id twice in the run) are left for pg_end() to answer one by one.
 * A statement that fails (or no memory for it) changes nothing (its own savepoint) and leaves
 * every done[] false. 0, or STORE_EIO when the connection is lost. */
bool pg_end_settable(const struct store_call *c);
int pg_end_set(struct store_impl *s, struct store_call *first, size_t n, bool *done);
int pg_renew(struct store_impl *s, struct store_call *c);
int pg_insert_dead(struct store_impl *s, struct store_call *c);
int pg_list(struct store_impl *s, struct store_call *c);
int pg_get(struct store_impl *s, const char *id, struct store_delivery *d);
int pg_change(struct store_impl *s, struct store_call *c);

/* The deliveries' columns as read into a record, and a row of them (from column 'at'). */
#define PG_COLS                                                                                    \
    "id, route, method, target, fields, body, idem_key, body_hash, created_at, next_at,"           \
    " attempts, replays, state, claimed_until, claimed_by, reason, final_head, final_body,"        \
    " last_delay, upstream"
/* The columns of PG_COLS a list reads: no fields, body (its length) nor final response. */
#define PG_LIST_COLS                                                                               \
    "id, route, method, target, NULL::bytea, octet_length(body), idem_key, body_hash,"             \
    " created_at, next_at, attempts, replays, state, claimed_until, claimed_by, reason,"           \
    " NULL::bytea, NULL::bytea, last_delay, upstream"
int pg_read_row(struct store_impl *s, const PGresult *res, int row, struct store_delivery *d,
                bool full);
/* A delivery's attempts, oldest first, into d->tries. */
int pg_read_tries(struct store_impl *s, struct store_delivery *d);
/* The live count's change when a row of 'state' goes. */
void pg_gone(struct store_impl *s, int state);

/* pg_ops.c: find, bulk, counts; retention, in a transaction of its own once a second. */
int pg_find(struct store_impl *s, struct store_call *c);
int pg_bulk(struct store_impl *s, struct store_call *c);
int pg_counts(struct store_impl *s, struct store_call *c);
void pg_sweep(struct store_impl *s);

#endif
