/* sqlite_ops -- the operators' side of the SQLite store (docs/delivery.md, "Admin API" and
 * "Retention"): find with filters and a cursor, replay and drop by filter in bounded batches,
 * the counts the gauges read, retention sweeps. sqlite.c runs them; they use sqlite_sql.c's
 * helpers, which never call back here.
 *
 * Run by the store thread only, like sqlite_sql.c: find, bulk and counts inside the batch's
 * transaction (sql_find, sql_bulk, sql_counts), a sweep in a transaction of its own between
 * batches. The statements with a variable filter are prepared per call (an operator's request, not
 * the accept path); the indexes they need are created at open (IF NOT EXISTS: no schema version).
 */
#include "proxy/store/sqlite_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Created at every open, after the migrations: the filters' orders (route, state, accepted at)
 * and retention's (state, due). */
static const char ops_indexes[] =
    "CREATE INDEX IF NOT EXISTS deliveries_route_created ON deliveries(route, state, created_at);"
    "CREATE INDEX IF NOT EXISTS deliveries_state_created ON deliveries(state, created_at);";

/* The statements a bulk replay or drop runs per row (the filtered ones are per call). */
static const char *const ops_sql[OPS_COUNT] = {
    [OPS_DROP_TRIES] = "DELETE FROM attempts WHERE delivery = ?1",
    [OPS_DROP] = "DELETE FROM deliveries WHERE id = ?1",
    [OPS_REPLAY] = "UPDATE deliveries SET state = 0, next_at = ?2, replays = replays + 1,"
                   " claimed_until = NULL, claimed_by = NULL WHERE id = ?1",
};

int sql_ops_setup(struct store_impl *s, struct store_err *err)
{
    const char *what = "creating the filters' indexes";
    if (sqlite3_exec(s->db, ops_indexes, NULL, NULL, NULL) != SQLITE_OK)
        goto fail;
    what = "preparing";
    for (int i = 0; i < OPS_COUNT; i++)
        if (sqlite3_prepare_v3(s->db, ops_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->ops_st[i],
                               NULL) != SQLITE_OK)
            goto fail;
    return 0;
fail:
    snprintf(err->msg, sizeof(err->msg), "%s: %s: %s", s->q.o.path, what, sqlite3_errmsg(s->db));
    return STORE_EIO;
}

void sql_ops_finalize(struct store_impl *s)
{
    for (int i = 0; i < OPS_COUNT; i++) {
        sqlite3_finalize(s->ops_st[i]);
        s->ops_st[i] = NULL;
    }
}

/* ---- find and bulk: one filter, written as SQL with only the conditions asked for ---- */

/* The last attempt's status of row d (0 when none), for the status filter and the list. */
#define LAST_STATUS                                                                                \
    "coalesce((SELECT status FROM attempts a WHERE a.delivery = d.id ORDER BY a.rowid DESC"        \
    " LIMIT 1), 0)"

/* The WHERE clause of 'm' into 'w' (cap bytes); 'cursor' adds the paging condition, 'replay'
 * keeps dead and delivered rows only. */
static void where_of(const struct store_match *m, bool cursor, bool replay, char *w, size_t cap)
{
    size_t n = (size_t)snprintf(w, cap, " WHERE 1");
#define ADD(...) n += (size_t)snprintf(w + n, n < cap ? cap - n : 0, __VA_ARGS__)
    if (m->route)
        ADD(" AND route = :route");
    if (m->state >= 0)
        ADD(" AND state = :state");
    if (replay)
        ADD(" AND state IN (%d, %d)", STORE_DELIVERED, STORE_DEAD);
    if (m->since)
        ADD(" AND created_at >= :since");
    if (m->until)
        ADD(" AND created_at < :until");
    if (m->status)
        ADD(" AND " LAST_STATUS " = :status");
    if (m->upstream)
        ADD(" AND upstream = :upstream");
    if (cursor && m->cursor)
        ADD(" AND seq %s :cursor", m->newest_first ? "<" : ">");
#undef ADD
}

static void bind_named(sqlite3_stmt *st, const char *name, sqlite3_int64 v)
{
    int i = sqlite3_bind_parameter_index(st, name);
    if (i > 0)
        sqlite3_bind_int64(st, i, v);
}

static void bind_match(sqlite3_stmt *st, const struct store_match *m)
{
    int i = sqlite3_bind_parameter_index(st, ":route");
    if (i > 0)
        sqlite3_bind_text(st, i, m->route, -1, SQLITE_STATIC);
    if ((i = sqlite3_bind_parameter_index(st, ":upstream")) > 0)
        sqlite3_bind_text(st, i, m->upstream, -1, SQLITE_STATIC);
    bind_named(st, ":state", m->state);
    bind_named(st, ":since", (sqlite3_int64)m->since);
    bind_named(st, ":until", (sqlite3_int64)m->until);
    bind_named(st, ":status", m->status);
    bind_named(st, ":cursor", (sqlite3_int64)m->cursor);
}

/* Prepares "head WHERE... tail" for 'm'. 0 or STORE_EIO. */
static int prepare(struct store_impl *s, sqlite3_stmt **st, const char *head,
                   const struct store_match *m, bool cursor, bool replay, const char *tail)
{
    char where[512], sql[1536];
    where_of(m, cursor, replay, where, sizeof(where));
    snprintf(sql, sizeof(sql), "%s%s%s", head, where, tail);
    if (sqlite3_prepare_v2(s->db, sql, -1, st, NULL) != SQLITE_OK)
        return STORE_EIO;
    bind_match(*st, m);
    return 0;
}

static uint64_t count_of(struct store_impl *s, const struct store_match *m, bool replay, int *r)
{
    sqlite3_stmt *st = NULL;
    uint64_t n = 0;
    if ((*r = prepare(s, &st, "SELECT count(*) FROM deliveries d", m, false, replay, "")) == 0) {
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW)
            n = (uint64_t)sqlite3_column_int64(st, 0);
        else
            *r = sql_error(rc) ? sql_error(rc) : STORE_EIO;
    }
    sqlite3_finalize(st);
    return n;
}

/* A page: the list form of each row (no fields, body nor final response), newest or oldest
 * first, one row more than asked read to know whether more are left. */
int sql_find(struct store_impl *s, struct store_call *c)
{
    const struct store_match *m = c->in;
    uint32_t limit = m->limit ? m->limit : 100;
    char tail[96];
    snprintf(tail, sizeof(tail), " ORDER BY seq %s LIMIT %u", m->newest_first ? "DESC" : "ASC",
             limit + 1);
    int r;
    c->total = count_of(s, m, false, &r);
    sqlite3_stmt *st = NULL;
    if (r < 0 ||
        (r = prepare(s, &st,
                     "SELECT id, route, method, target, length(body), idem_key, created_at,"
                     " next_at, attempts, replays, state, claimed_until, claimed_by, reason, "
                     "seq, " LAST_STATUS ", upstream FROM deliveries d",
                     m, true, false, tail)) < 0)
        goto out;
    c->items = calloc(limit, sizeof(*c->items));
    if (!c->items) {
        r = STORE_EIO;
        goto out;
    }
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (c->n == limit) {
            c->more = true;
            break;
        }
        struct store_delivery *d = &c->items[c->n++];
        snprintf(d->id, sizeof(d->id), "%s", (const char *)sqlite3_column_text(st, 0));
        d->route = sql_col_text(st, 1);
        d->method = sql_col_text(st, 2);
        d->target = sql_col_text(st, 3);
        d->body_len = (size_t)sqlite3_column_int64(st, 4);
        d->idem_key = sql_col_text(st, 5);
        d->created_at = (uint64_t)sqlite3_column_int64(st, 6);
        d->next_at = (uint64_t)sqlite3_column_int64(st, 7);
        d->attempts = (uint32_t)sqlite3_column_int64(st, 8);
        d->replays = (uint32_t)sqlite3_column_int64(st, 9);
        d->state = (enum store_state)sqlite3_column_int(st, 10);
        d->claimed_until = (uint64_t)sqlite3_column_int64(st, 11);
        d->claimed_by = sql_col_text(st, 12);
        d->reason = sql_col_text(st, 13);
        d->seq = (uint64_t)sqlite3_column_int64(st, 14);
        d->last_status = sqlite3_column_int(st, 15);
        d->upstream = sql_col_text(st, 16);
        c->cursor = d->seq;
        if (!d->route || !d->method || !d->target) {
            r = STORE_EIO;
            break;
        }
    }
    if (r == 0 && rc != SQLITE_ROW && rc != SQLITE_DONE)
        r = sql_error(rc) ? sql_error(rc) : STORE_EIO;
out:
    sqlite3_finalize(st);
    return r;
}

/* Runs statement 'which' with ?1 = id (and ?2 = v when given). 0 or a STORE_E*. */
static int exec_id(struct store_impl *s, int which, const char *id, const uint64_t *v)
{
    sqlite3_stmt *st = s->ops_st[which];
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (v)
        sqlite3_bind_int64(st, 2, (sqlite3_int64)*v);
    int rc = sql_step_reset(st);
    sqlite3_clear_bindings(st);
    return sql_error(rc) ? sql_error(rc) : rc == SQLITE_DONE ? 0 : STORE_EIO;
}

/* Removes a row and its attempts; the live count follows. */
static int remove_row(struct store_impl *s, const char *id, int state)
{
    int r = exec_id(s, OPS_DROP_TRIES, id, NULL);
    if (r == 0)
        r = exec_id(s, OPS_DROP, id, NULL);
    if (r == 0 && state != STORE_DELIVERED)
        s->live_delta--;
    return r;
}

/* One batch of a replay or drop by filter: the rows after the cursor, oldest first. */
int sql_bulk(struct store_impl *s, struct store_call *c)
{
    const struct store_bulk *b = c->in;
    int r = 0;
    if (b->dry_run) {
        c->total = count_of(s, &b->m, b->replay, &r);
        return r;
    }
    struct store_match m = b->m;
    m.newest_first = false;
    char tail[64];
    snprintf(tail, sizeof(tail), " ORDER BY seq LIMIT %d", STORE_BULK_BATCH + 1);
    sqlite3_stmt *st = NULL;
    if ((r = prepare(s, &st, "SELECT id, route, state, seq FROM deliveries d", &m, true, b->replay,
                     tail)) < 0)
        goto out;
    c->items = calloc(STORE_BULK_BATCH, sizeof(*c->items));
    if (!c->items) {
        r = STORE_EIO;
        goto out;
    }
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (c->n == STORE_BULK_BATCH) {
            c->more = true;
            break;
        }
        struct store_delivery *d = &c->items[c->n];
        snprintf(d->id, sizeof(d->id), "%s", (const char *)sqlite3_column_text(st, 0));
        d->route = sql_col_text(st, 1);
        d->state = (enum store_state)sqlite3_column_int(st, 2);
        c->cursor = d->seq = (uint64_t)sqlite3_column_int64(st, 3);
        c->n++;
    }
    sqlite3_finalize(st);
    st = NULL;
    uint64_t now = sql_now(s);
    for (size_t i = 0; i < c->n && r == 0; i++) {
        if (!b->replay) {
            r = remove_row(s, c->items[i].id, (int)c->items[i].state);
            continue;
        }
        uint64_t at = store_bulk_due_at(b, now, i);
        r = exec_id(s, OPS_REPLAY, c->items[i].id, &at);
        if (r == 0 && c->items[i].state == STORE_DELIVERED)
            s->live_delta++;
        c->items[i].state = STORE_SCHEDULED;
        c->items[i].next_at = at;
    }
out:
    sqlite3_finalize(st);
    return r;
}

/* By route and state: one GROUP BY over the (route, state, created_at) index; then per route
 * the oldest pending, a seek on the same index for each pending state. */
int sql_counts(struct store_impl *s, struct store_call *c)
{
    sqlite3_stmt *st = NULL, *old = NULL;
    int r = STORE_EIO, rc;
    size_t cap = 0;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT route, state, count(*) FROM deliveries GROUP BY route, state",
                           -1, &st, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(s->db,
                           "SELECT min(created_at) FROM deliveries WHERE route = ?1 AND state = ?2",
                           -1, &old, NULL) != SQLITE_OK)
        goto out;
    r = 0;
    while (r == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *route = (const char *)sqlite3_column_text(st, 0);
        int state = sqlite3_column_int(st, 1);
        if (!route || state < 0 || state >= STORE_STATES)
            continue;
        struct store_count *k = store_count_row(c, &cap, route);
        if (!k) {
            r = STORE_EIO;
            break;
        }
        k->n[state] = (uint64_t)sqlite3_column_int64(st, 2);
        if (state == STORE_SCHEDULED || state == STORE_IN_FLIGHT) {
            sqlite3_bind_text(old, 1, k->route, -1, SQLITE_STATIC);
            sqlite3_bind_int(old, 2, state);
            if (sqlite3_step(old) == SQLITE_ROW) {
                uint64_t at = (uint64_t)sqlite3_column_int64(old, 0);
                if (at && (!k->oldest_pending || at < k->oldest_pending))
                    k->oldest_pending = at;
            }
            sqlite3_reset(old);
        }
    }
out:
    sqlite3_finalize(st);
    sqlite3_finalize(old);
    return r;
}

/* ---- retention ---- */

/* Deletes up to STORE_SWEEP_BATCH rows of 'state' that ended before 'cut': their last attempt's
 * end, or their due time when later (a dead letter buried between attempts). How many, or -1. */
static int sweep_state(struct store_impl *s, int state, uint64_t cut)
{
    sqlite3_stmt *st = NULL;
    char(*ids)[STORE_ID_SIZE] = calloc(STORE_SWEEP_BATCH, sizeof(*ids));
    int n = 0, r = -1;
    if (!ids ||
        sqlite3_prepare_v2(s->db,
                           "SELECT id FROM deliveries d WHERE state = ?1 AND next_at <= ?2 AND"
                           " coalesce((SELECT max(at + duration_ms) FROM attempts a"
                           " WHERE a.delivery = d.id), 0) <= ?2 LIMIT ?3",
                           -1, &st, NULL) != SQLITE_OK)
        goto out;
    sqlite3_bind_int(st, 1, state);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)cut);
    sqlite3_bind_int(st, 3, STORE_SWEEP_BATCH);
    while (n < STORE_SWEEP_BATCH && sqlite3_step(st) == SQLITE_ROW)
        snprintf(ids[n++], STORE_ID_SIZE, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    st = NULL;
    r = 0;
    for (int i = 0; i < n && r == 0; i++)
        r = remove_row(s, ids[i], state);
    if (r == 0)
        r = n;
out:
    sqlite3_finalize(st);
    free(ids);
    return r;
}

void sql_sweep(struct store_impl *s)
{
    uint64_t cut, dead_cut;
    if (!store_q_sweep_due(&s->q, &s->last_sweep, &cut, &dead_cut) ||
        sql_step_reset(s->st[S_BEGIN]) != SQLITE_DONE)
        return;
    s->live_delta = 0;
    int a = sweep_state(s, STORE_DELIVERED, cut);
    int b = a >= 0 && dead_cut ? sweep_state(s, STORE_DEAD, dead_cut) : 0;
    if (a < 0 || b < 0 || sql_step_reset(s->st[S_COMMIT]) != SQLITE_DONE) {
        if (!sqlite3_get_autocommit(s->db))
            sql_step_reset(s->st[S_ROLLBACK]);
        return;
    }
    s->live = (uint64_t)((int64_t)s->live + s->live_delta);
    s->live_delta = 0;
    atomic_store(&s->q.st.count, s->live);
    atomic_store(&s->q.st.bytes, sql_bytes(s));
    store_q_swept(&s->q, &s->last_sweep, a, b);
}
