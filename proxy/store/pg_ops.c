/* pg_ops -- the operators' side of the PostgreSQL store (docs/delivery.md, "Admin API" and
 * "Retention"), as sqlite_ops.c is the SQLite store's: find with filters and a cursor, replay
 * and drop by filter in bounded batches, the counts the gauges read, retention sweeps. Every
 * query is of the store's namespace: an operator sees the whole fleet's rows of a service,
 * never another service's.
 *
 * Run by the store thread only: find, bulk and counts inside the batch's transaction; a sweep
 * in a transaction of its own, at most once a second, its rows locked SKIP LOCKED so that the
 * proxies of a fleet sweeping at once do not wait on each other.
 */
#include "proxy/store/pg_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The last attempt's status of row d (0 when none), for the status filter and the list. */
#define LAST_STATUS                                                                                \
    "coalesce((SELECT status FROM retryproxy_attempts a WHERE a.delivery = d.id"                   \
    " ORDER BY a.n DESC LIMIT 1), 0)"

/* The WHERE clause of 'm' into 'w' (cap bytes) and its parameters into q (after the
 * namespace, $1); 'cursor' adds the paging condition, 'replay' keeps dead and delivered rows. */
static void where_of(struct store_impl *s, const struct store_match *m, bool cursor, bool replay,
                     struct pgq *q, char *w, size_t cap)
{
    pgq_text(q, s->ns);
    size_t n = (size_t)snprintf(w, cap, " WHERE namespace = $1");
#define ADD(...) n += (size_t)snprintf(w + n, n < cap ? cap - n : 0, __VA_ARGS__)
    if (m->route) {
        pgq_text(q, m->route);
        ADD(" AND route = $%d", q->n);
    }
    if (m->state >= 0) {
        pgq_int(q, m->state);
        ADD(" AND state = $%d", q->n);
    }
    if (replay)
        ADD(" AND state IN (%d, %d)", STORE_DELIVERED, STORE_DEAD);
    if (m->since) {
        pgq_int(q, (int64_t)m->since);
        ADD(" AND created_at >= $%d", q->n);
    }
    if (m->until) {
        pgq_int(q, (int64_t)m->until);
        ADD(" AND created_at < $%d", q->n);
    }
    if (m->status) {
        pgq_int(q, m->status);
        ADD(" AND " LAST_STATUS " = $%d", q->n);
    }
    if (m->upstream) {
        pgq_text(q, m->upstream);
        ADD(" AND upstream = $%d", q->n);
    }
    if (cursor && m->cursor) {
        pgq_int(q, (int64_t)m->cursor);
        ADD(" AND seq %s $%d", m->newest_first ? "<" : ">", q->n);
    }
#undef ADD
}

static uint64_t count_of(struct store_impl *s, const struct store_match *m, bool replay, int *r)
{
    struct pgq q = { 0 };
    char where[768], sql[1024];
    where_of(s, m, false, replay, &q, where, sizeof(where));
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM retryproxy_deliveries d%s", where);
    PGresult *res = pg_exec(s, sql, &q, r);
    uint64_t n = res ? (uint64_t)pg_int(res, 0, 0) : 0;
    PQclear(res);
    return n;
}

/* A page: the list form of each row, newest or oldest first, one row more than asked read to
 * know whether more are left. */
int pg_find(struct store_impl *s, struct store_call *c)
{
    const struct store_match *m = c->in;
    uint32_t limit = m->limit ? m->limit : 100;
    int r;
    c->total = count_of(s, m, false, &r);
    if (r < 0)
        return r;
    struct pgq q = { 0 };
    char where[768], sql[1536];
    where_of(s, m, true, false, &q, where, sizeof(where));
    snprintf(sql, sizeof(sql),
             "SELECT " PG_LIST_COLS ", seq, " LAST_STATUS
             " FROM retryproxy_deliveries d%s ORDER BY seq %s LIMIT %u",
             where, m->newest_first ? "DESC" : "ASC", limit + 1);
    PGresult *res = pg_exec(s, sql, &q, &r);
    int n = res ? PQntuples(res) : 0;
    if (res && !(c->items = calloc(limit, sizeof(*c->items))))
        r = STORE_EIO;
    for (int i = 0; r == 0 && i < n; i++) {
        if (c->n == limit) {
            c->more = true;
            break;
        }
        struct store_delivery *d = &c->items[c->n++];
        r = pg_read_row(s, res, i, d, false);
        c->cursor = d->seq = (uint64_t)pg_int(res, i, 20);
        d->last_status = (int)pg_int(res, i, 21);
    }
    PQclear(res);
    return r;
}

/* Removes a row of 'state' (its attempts go with it: ON DELETE CASCADE). */
static int remove_row(struct store_impl *s, const char *id, int state)
{
    struct pgq q = { 0 };
    pgq_text(&q, id);
    int r = pg_cmd(s, "DELETE FROM retryproxy_deliveries WHERE id = $1", &q, NULL);
    if (r == 0)
        pg_gone(s, state);
    return r;
}

/* One batch of a replay or drop by filter: the rows after the cursor, oldest first. */
int pg_bulk(struct store_impl *s, struct store_call *c)
{
    const struct store_bulk *b = c->in;
    int r = 0;
    if (b->dry_run) {
        c->total = count_of(s, &b->m, b->replay, &r);
        return r;
    }
    struct store_match m = b->m;
    m.newest_first = false;
    struct pgq q = { 0 };
    char where[768], sql[1024];
    where_of(s, &m, true, b->replay, &q, where, sizeof(where));
    snprintf(sql, sizeof(sql),
             "SELECT id, route, state, seq FROM retryproxy_deliveries d%s ORDER BY seq LIMIT %d"
             " FOR UPDATE",
             where, STORE_BULK_BATCH + 1);
    PGresult *res = pg_exec(s, sql, &q, &r);
    if (!res)
        return r;
    int n = PQntuples(res);
    c->items = calloc(STORE_BULK_BATCH, sizeof(*c->items));
    if (!c->items)
        r = STORE_EIO;
    for (int i = 0; r == 0 && i < n; i++) {
        if (c->n == STORE_BULK_BATCH) {
            c->more = true;
            break;
        }
        struct store_delivery *d = &c->items[c->n];
        snprintf(d->id, sizeof(d->id), "%s", PQgetvalue(res, i, 0));
        d->route = pg_text(res, i, 1);
        d->state = (enum store_state)pg_int(res, i, 2);
        c->cursor = d->seq = (uint64_t)pg_int(res, i, 3);
        c->n++;
    }
    PQclear(res);
    uint64_t now = store_q_now(&s->q.o);
    for (size_t i = 0; i < c->n && r == 0; i++) {
        if (!b->replay) {
            r = remove_row(s, c->items[i].id, (int)c->items[i].state);
            continue;
        }
        uint64_t at = store_bulk_due_at(b, now, i);
        struct pgq u = { 0 };
        pgq_text(&u, c->items[i].id);
        pgq_int(&u, (int64_t)at);
        r = pg_cmd(s,
                   "UPDATE retryproxy_deliveries SET state = 0, next_at = $2,"
                   " replays = replays + 1, claimed_until = NULL, claimed_by = NULL"
                   " WHERE id = $1",
                   &u, NULL);
        if (r == 0 && c->items[i].state == STORE_DELIVERED)
            s->live_delta++;
        c->items[i].state = STORE_SCHEDULED;
        c->items[i].next_at = at;
    }
    return r;
}

/* By route and state, with the oldest pending of each route, in one GROUP BY over the
 * (namespace, route, state, created_at) index. */
int pg_counts(struct store_impl *s, struct store_call *c)
{
    struct pgq q = { 0 };
    pgq_text(&q, s->ns);
    int r;
    PGresult *res = pg_exec(s,
                            "SELECT route, state, count(*), min(created_at)"
                            " FROM retryproxy_deliveries WHERE namespace = $1"
                            " GROUP BY route, state ORDER BY route, state",
                            &q, &r);
    int n = res ? PQntuples(res) : 0;
    size_t cap = 0;
    for (int i = 0; r == 0 && i < n; i++) {
        const char *route = PQgetvalue(res, i, 0);
        int state = (int)pg_int(res, i, 1);
        if (state < 0 || state >= STORE_STATES)
            continue;
        struct store_count *k = store_count_row(c, &cap, route);
        if (!k) {
            r = STORE_EIO;
            break;
        }
        k->n[state] = (uint64_t)pg_int(res, i, 2);
        uint64_t at = (uint64_t)pg_int(res, i, 3);
        if ((state == STORE_SCHEDULED || state == STORE_IN_FLIGHT) && at &&
            (!k->oldest_pending || at < k->oldest_pending))
            k->oldest_pending = at;
    }
    PQclear(res);
    return r;
}

/* Deletes up to STORE_SWEEP_BATCH rows of 'state' that ended before 'cut' (their last attempt's
 * end, or their due time when later). How many, or a STORE_E*. */
static int sweep_state(struct store_impl *s, int state, uint64_t cut)
{
    struct pgq q = { 0 };
    pgq_text(&q, s->ns);
    pgq_int(&q, state);
    pgq_int(&q, (int64_t)cut);
    pgq_int(&q, STORE_SWEEP_BATCH);
    uint64_t n = 0;
    int r = pg_cmd(s,
                   "DELETE FROM retryproxy_deliveries WHERE id IN (SELECT id"
                   " FROM retryproxy_deliveries d WHERE namespace = $1 AND state = $2"
                   " AND next_at <= $3 AND coalesce((SELECT max(at + duration_ms)"
                   " FROM retryproxy_attempts a WHERE a.delivery = d.id), 0) <= $3"
                   " LIMIT $4 FOR UPDATE SKIP LOCKED)",
                   &q, &n);
    if (r == 0 && state != STORE_DELIVERED)
        s->live_delta -= (int64_t)n;
    return r < 0 ? r : (int)n;
}

void pg_sweep(struct store_impl *s)
{
    uint64_t cut, dead_cut;
    if (!s->conn || !store_q_sweep_due(&s->q, &s->last_sweep, &cut, &dead_cut) ||
        pg_cmd(s, "BEGIN", NULL, NULL) < 0)
        return;
    s->live_delta = 0;
    int a = sweep_state(s, STORE_DELIVERED, cut);
    int b = a >= 0 && dead_cut ? sweep_state(s, STORE_DEAD, dead_cut) : 0;
    if (a < 0 || b < 0 || pg_cmd(s, "COMMIT", NULL, NULL) < 0) {
        if (s->conn)
            pg_cmd(s, "ROLLBACK", NULL, NULL);
        return;
    }
    s->live = (uint64_t)((int64_t)s->live + s->live_delta);
    s->live_delta = 0;
    atomic_store(&s->q.st.count, s->live);
    store_q_swept(&s->q, &s->last_sweep, a, b);
}
