/* pg_sql -- what each operation of the PostgreSQL store does in its transaction: the same
 * model and the same answers as the SQLite store's (sqlite_sql.c; tests/unit/test_store.c runs
 * one set of cases on both), with every row and query scoped by the store's namespace.
 *
 * Run by the store thread only (pg.c), inside the transaction it commits for a batch. Claims
 * take due rows with FOR UPDATE SKIP LOCKED: a row another proxy is claiming in its own open
 * transaction is skipped, not waited for, and never claimed by both. The ends of an attempt
 * (complete, reschedule, bury) change a row only while the caller still holds its lease
 * (docs/delivery.md, "Shared store (PostgreSQL)").
 */
#include "proxy/store/pg_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pg_gone(struct store_impl *s, int state)
{
    if (state != STORE_DELIVERED)
        s->live_delta--;
}

int pg_read_row(struct store_impl *s, const PGresult *res, int row, struct store_delivery *d,
                bool full)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->id, sizeof(d->id), "%s", PQgetvalue(res, row, 0));
    d->route = pg_text(res, row, 1);
    d->method = pg_text(res, row, 2);
    d->target = pg_text(res, row, 3);
    if (full) {
        size_t n;
        char *f = pg_bytes(res, row, 4, &n);
        int r = f ? sql_fields_unpack(d, f, n) : STORE_EIO;
        free(f);
        if (r < 0)
            return r;
        d->body = pg_bytes(res, row, 5, &d->body_len);
        d->final_head = pg_bytes(res, row, 16, &d->final_head_len);
        d->final_body = pg_bytes(res, row, 17, &d->final_body_len);
        sql_open_fields(&s->q.o, d);
    } else {
        d->body_len = (size_t)pg_int(res, row, 5);
    }
    d->idem_key = pg_text(res, row, 6);
    d->body_hash = (uint64_t)pg_int(res, row, 7);
    d->created_at = (uint64_t)pg_int(res, row, 8);
    d->next_at = (uint64_t)pg_int(res, row, 9);
    d->attempts = (uint32_t)pg_int(res, row, 10);
    d->replays = (uint32_t)pg_int(res, row, 11);
    d->state = (enum store_state)pg_int(res, row, 12);
    d->claimed_until = (uint64_t)pg_int(res, row, 13);
    d->claimed_by = pg_text(res, row, 14);
    d->reason = pg_text(res, row, 15);
    d->last_delay_ms = (uint32_t)pg_int(res, row, 18);
    d->upstream = pg_text(res, row, 19);
    return d->route && d->method && d->target ? 0 : STORE_EIO;
}

int pg_read_tries(struct store_impl *s, struct store_delivery *d)
{
    struct pgq q = { 0 };
    pgq_text(&q, d->id);
    int r;
    PGresult *res = pg_exec(s,
                            "SELECT at, duration_ms, status, outcome, upstream"
                            " FROM retryproxy_attempts WHERE delivery = $1 ORDER BY n",
                            &q, &r);
    int n = res ? PQntuples(res) : 0;
    if (n && !(d->tries = calloc((size_t)n, sizeof(*d->tries))))
        r = STORE_EIO;
    for (int i = 0; r == 0 && i < n; i++) {
        struct store_attempt *a = &d->tries[d->ntries++];
        a->at_ms = (uint64_t)pg_int(res, i, 0);
        a->duration_ms = (uint32_t)pg_int(res, i, 1);
        a->status = (int)pg_int(res, i, 2);
        snprintf(a->outcome, sizeof(a->outcome), "%s", PQgetvalue(res, i, 3));
        a->upstream = pg_text(res, i, 4);
    }
    if (d->ntries)
        d->last_status = d->tries[d->ntries - 1].status;
    PQclear(res);
    return r;
}

/* Delivery 'id' of the namespace, whole, into 'd' (with its attempts when 'tries'). */
static int read_one(struct store_impl *s, const char *id, struct store_delivery *d, bool tries)
{
    struct pgq q = { 0 };
    pgq_text(&q, s->ns);
    pgq_text(&q, id);
    int r;
    PGresult *res =
        pg_exec(s, "SELECT " PG_COLS " FROM retryproxy_deliveries WHERE namespace = $1 AND id = $2",
                &q, &r);
    if (res)
        r = PQntuples(res) ? pg_read_row(s, res, 0, d, true) : STORE_ENOTFOUND;
    PQclear(res);
    return r == 0 && tries ? pg_read_tries(s, d) : r;
}

static int add_try(struct store_impl *s, const char *id, const struct store_attempt *a)
{
    struct pgq q = { 0 };
    pgq_text(&q, id);
    pgq_int(&q, (int64_t)a->at_ms);
    pgq_int(&q, a->duration_ms);
    pgq_int(&q, a->status);
    pgq_text(&q, a->outcome);
    pgq_text(&q, a->upstream);
    return pg_cmd(s,
                  "INSERT INTO retryproxy_attempts(delivery, at, duration_ms, status, outcome,"
                  " upstream) VALUES($1, $2, $3, $4, $5, $6)",
                  &q, NULL);
}

/* The earlier accept of the route with d's Idempotency-Key: *found, and then c->id is its id and
 * the answer its body decides (0 and c->dup for the same body, STORE_ECONFLICT for another). */
static int by_key(struct store_impl *s, struct store_call *c, const struct store_new *d,
                  uint64_t hash, bool *found)
{
    struct pgq q = { 0 };
    pgq_text(&q, s->ns);
    pgq_text(&q, d->route);
    pgq_text(&q, d->idem_key);
    int r;
    PGresult *res = pg_exec(s,
                            "SELECT id, body_hash, body FROM retryproxy_deliveries"
                            " WHERE namespace = $1 AND route = $2 AND idem_key = $3",
                            &q, &r);
    *found = res && PQntuples(res) > 0;
    if (*found) {
        size_t len;
        char *body = pg_bytes(res, 0, 2, &len);
        bool same = (uint64_t)pg_int(res, 0, 1) == hash && body && len == d->body_len &&
                    (len == 0 || memcmp(body, d->body, len) == 0);
        free(body);
        snprintf(c->id, sizeof(c->id), "%s", PQgetvalue(res, 0, 0));
        c->dup = same;
        r = same ? 0 : STORE_ECONFLICT;
    }
    PQclear(res);
    return r;
}

/* The accept: an earlier one of the route with the same Idempotency-Key answers for it (same
 * body), or refuses it (another body); then the namespace's bounds; then the row. Two proxies
 * taking the same key at once: the second's insert waits for the first's commit and does
 * nothing (ON CONFLICT), and the key's row, committed by then, answers as above. */
int pg_enqueue(struct store_impl *s, struct store_call *c)
{
    const struct store_new *d = c->in;
    uint64_t hash = store_body_hash(d->body, d->body_len);
    bool found = false;
    int r = d->idem_key ? by_key(s, c, d, hash, &found) : 0;
    if (r < 0 || found)
        return r;
    struct sql_row row;
    const struct store_opts *o = &s->q.o;
    if ((r = sql_new_row(o, c, d, s->live + (uint64_t)s->live_delta, s->bytes + s->bytes_added,
                         &row)) < 0)
        return r;
    uint64_t now = store_q_now(o);
    struct pgq q = { 0 };
    pgq_text(&q, s->ns);
    pgq_text(&q, c->id);
    pgq_text(&q, d->route);
    pgq_text(&q, d->method);
    pgq_text(&q, d->target);
    pgq_bin(&q, row.fields, row.flen);
    pgq_bin(&q, d->body_len ? d->body : "", d->body_len);
    pgq_text(&q, d->idem_key);
    pgq_int(&q, (int64_t)hash);
    pgq_int(&q, (int64_t)now);
    pgq_int(&q, (int64_t)(d->next_at ? d->next_at : now));
    pgq_int(&q, (int64_t)row.size);
    uint64_t added = 0;
    r = pg_cmd(s,
               "INSERT INTO retryproxy_deliveries(namespace, id, route, method, target, fields,"
               " body, idem_key, body_hash, created_at, next_at, size, state)"
               " VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 0)"
               " ON CONFLICT (namespace, route, idem_key) WHERE idem_key IS NOT NULL DO NOTHING",
               &q, &added);
    free(row.fields);
    if (r == 0 && added == 0)
        return (r = by_key(s, c, d, hash, &found)) < 0 || found ? r : STORE_EIO;
    if (r == 0) {
        s->live_delta++;
        s->bytes_added += row.size;
    }
    return r;
}

/* insert_dead: the row as an enqueue makes it (the same bounds), then dead at once, with its
 * attempts and final answer. */
int pg_insert_dead(struct store_impl *s, struct store_call *c)
{
    const struct store_dead_new *d = c->in;
    int r = pg_enqueue(s, c); /* reads d->req, the first member */
    if (r < 0)
        return r;
    size_t cap = s->q.o.dead_body_bytes ? s->q.o.dead_body_bytes : 4096;
    struct pgq q = { 0 };
    pgq_int(&q, d->attempts);
    pgq_text(&q, d->dead.reason ? d->dead.reason : "");
    pgq_bin(&q, d->dead.head, d->dead.head_len);
    pgq_bin(&q, d->dead.body, d->dead.body_len < cap ? d->dead.body_len : cap);
    pgq_text(&q, c->id);
    pgq_text(&q, d->ntries ? d->tries[d->ntries - 1].upstream : NULL);
    r = pg_cmd(s,
               "UPDATE retryproxy_deliveries SET state = 3, attempts = $1, reason = $2,"
               " final_head = $3, final_body = $4, upstream = $6 WHERE id = $5",
               &q, NULL);
    for (size_t i = 0; r == 0 && i < d->ntries; i++)
        r = add_try(s, c->id, &d->tries[i]);
    return r;
}

/* 'n' names as a text[] literal ({"a","b"}) in a->buf; NULL when out of memory. */
static const char *text_array(struct pga *a, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        pga_text(a, names[i]);
    return pga_end(a);
}

/* Due rows, oldest due first, each leased to the caller in the one statement that finds them;
 * one whose lease ran out had an attempt under way when its owner died (or lost its way to the
 * database): that attempt is recorded as lost and counted. Rows another transaction holds are
 * skipped (SKIP LOCKED): two proxies never claim the same row. */
int pg_claim(struct store_impl *s, struct store_call *c)
{
    char sql[2048];
    struct pga routes = { 0 };
    const char *by = "";
    uint64_t now = store_q_now(&s->q.o);
    struct pgq q = { 0 };
    pgq_text(&q, s->ns);
    pgq_int(&q, (int64_t)now);
    pgq_int(&q, (int64_t)c->max);
    pgq_int(&q, (int64_t)(now + s->q.o.lease_ms));
    pgq_text(&q, c->owner);
    if (c->op == OP_CLAIM_EXCEPT) {
        if (!text_array(&routes, c->in, (size_t)c->when)) {
            free(routes.buf);
            return STORE_EIO;
        }
        pgq_text(&q, routes.buf);
        by = " AND route <> ALL($6::text[])";
    } else if (c->key) {
        pgq_text(&q, c->key);
        by = " AND route = $6";
    }
    snprintf(sql, sizeof(sql),
             "WITH due0 AS (SELECT id, next_at FROM retryproxy_deliveries"
             " WHERE namespace = $1 AND state = 0 AND next_at <= $2%s"
             " ORDER BY next_at LIMIT $3 FOR UPDATE SKIP LOCKED),"
             " due1 AS (SELECT id, next_at FROM retryproxy_deliveries"
             " WHERE namespace = $1 AND state = 1 AND claimed_until <= $2%s"
             " ORDER BY claimed_until LIMIT $3 FOR UPDATE SKIP LOCKED),"
             " due AS (SELECT id, next_at, 0 AS lost FROM due0 UNION ALL"
             " SELECT id, next_at, 1 FROM due1 ORDER BY next_at LIMIT $3),"
             " tries AS (INSERT INTO retryproxy_attempts(delivery, at, duration_ms, status,"
             " outcome) SELECT id, $2, 0, 0, 'lease_expired' FROM due WHERE lost = 1),"
             " up AS (UPDATE retryproxy_deliveries d SET state = 1, claimed_until = $4,"
             " claimed_by = $5, attempts = d.attempts + due.lost FROM due WHERE d.id = due.id"
             " RETURNING d.*)"
             " SELECT " PG_COLS " FROM up ORDER BY next_at, seq",
             by, by);
    int r;
    PGresult *res = pg_exec(s, sql, &q, &r);
    free(routes.buf);
    int n = res ? PQntuples(res) : 0;
    if (res && !(c->items = calloc(n ? (size_t)n : 1, sizeof(*c->items))))
        r = STORE_EIO;
    for (int i = 0; r == 0 && i < n; i++)
        if ((r = pg_read_row(s, res, i, &c->items[i], true)) == 0)
            c->n = (size_t)i + 1;
    PQclear(res);
    return r;
}

/* complete, reschedule, bury: the lease's owner ends an attempt. */
int pg_end(struct store_impl *s, struct store_call *c)
{
    const struct store_dead *dead = c->op == OP_BURY ? c->in : NULL;
    enum store_state to = c->op == OP_COMPLETE     ? STORE_DELIVERED
                          : c->op == OP_RESCHEDULE ? STORE_SCHEDULED
                                                   : STORE_DEAD;
    size_t cap = s->q.o.dead_body_bytes ? s->q.o.dead_body_bytes : 4096;
    bool resched = c->op == OP_RESCHEDULE;
    struct pgq q = { 0 };
    pgq_int(&q, to);
    if (resched)
        pgq_int(&q, (int64_t)c->when);
    else
        pgq_text(&q, NULL);
    pgq_int(&q, c->attempt != NULL);
    pgq_text(&q, dead ? (dead->reason ? dead->reason : "") : NULL);
    pgq_bin(&q, dead ? dead->head : NULL, dead ? dead->head_len : 0);
    pgq_bin(&q, dead ? dead->body : NULL, dead ? (dead->body_len < cap ? dead->body_len : cap) : 0);
    pgq_text(&q, c->key);
    pgq_text(&q, c->owner);
    if (resched && c->attempt)
        pgq_int(&q, c->attempt->delay_ms);
    else
        pgq_text(&q, NULL);
    pgq_text(&q, c->attempt ? c->attempt->upstream : NULL);
    pgq_text(&q, s->ns);
    uint64_t changed = 0;
    int r = pg_cmd(s,
                   "UPDATE retryproxy_deliveries SET state = $1, next_at = coalesce($2, next_at),"
                   " attempts = attempts + $3, claimed_until = NULL, claimed_by = NULL,"
                   " reason = $4, final_head = $5, final_body = $6,"
                   " last_delay = coalesce($9, last_delay), upstream = coalesce($10, upstream)"
                   " WHERE namespace = $11 AND id = $7 AND state = 1 AND claimed_by = $8",
                   &q, &changed);
    if (r == 0 && changed == 0) {
        struct store_delivery d = { 0 }; /* read_one() leaves it as is when it finds none */
        r = read_one(s, c->key, &d, false) == 0 ? STORE_ESTALE : STORE_ENOTFOUND;
        store_delivery_clear(&d);
    }
    if (r == 0 && dead && dead->discard) { /* nothing of it is kept: no attempt row either */
        struct pgq k = { 0 };
        pgq_text(&k, c->key);
        if ((r = pg_cmd(s, "DELETE FROM retryproxy_deliveries WHERE id = $1", &k, NULL)) == 0)
            s->live_delta--;
        return r;
    }
    if (r == 0 && c->attempt)
        r = add_try(s, c->key, c->attempt);
    if (r == 0 && to == STORE_DELIVERED)
        s->live_delta--;
    return r;
}

/* The ends a set statement takes: completes and reschedules (a bury keeps a final answer of
 * its own and goes one by one). */
bool pg_end_settable(const struct store_call *c)
{
    return c->op == OP_COMPLETE || c->op == OP_RESCHEDULE;
}

/* One column of pg_end_set's statement: an array of one value per call. */
enum {
    EV_ORD,
    EV_ID,
    EV_OWNER,
    EV_STATE,
    EV_NEXT,
    EV_INC,
    EV_DELAY,
    EV_UP,
    EV_AT,
    EV_DUR,
    EV_STATUS,
    EV_OUTCOME,
    EV_COLS
};

/* What pg_end() does for each call, for a run of them in one round trip (docs/delivery.md,
 * "Shared store (PostgreSQL)"): each row changed only where its call's owner still holds it,
 * the first call of an id only (a second one finds it ended, as one by one), and the attempts
 * of the rows changed written by the same statement. The calls are numbered (ord) so that
 * RETURNING names the calls done. */
int pg_end_set(struct store_impl *s, struct store_call *first, size_t n, bool *done)
{
    struct pga a[EV_COLS] = { 0 };
    struct store_call *c = first;
    for (size_t i = 0; i < n; i++, c = c->next) {
        const struct store_attempt *t = c->attempt;
        bool resched = c->op == OP_RESCHEDULE;
        pga_int(&a[EV_ORD], (int64_t)i);
        pga_text(&a[EV_ID], c->key);
        pga_text(&a[EV_OWNER], c->owner);
        pga_int(&a[EV_STATE], resched ? STORE_SCHEDULED : STORE_DELIVERED);
        if (resched)
            pga_int(&a[EV_NEXT], (int64_t)c->when);
        else
            pga_text(&a[EV_NEXT], NULL);
        pga_int(&a[EV_INC], t != NULL);
        if (resched && t)
            pga_int(&a[EV_DELAY], t->delay_ms);
        else
            pga_text(&a[EV_DELAY], NULL);
        pga_text(&a[EV_UP], t ? t->upstream : NULL);
        pga_int(&a[EV_AT], t ? (int64_t)t->at_ms : 0);
        pga_int(&a[EV_DUR], t ? t->duration_ms : 0);
        pga_int(&a[EV_STATUS], t ? t->status : 0);
        pga_text(&a[EV_OUTCOME], t ? t->outcome : "");
    }
    struct pgq q = { 0 };
    pgq_text(&q, s->ns);
    int r = 0;
    for (int k = 0; k < EV_COLS; k++)
        if (!pga_end(&a[k]))
            r = STORE_EIO;
        else
            pgq_text(&q, a[k].buf);
    /* out of memory: the calls go one by one */
    bool saved = r == 0 && pg_cmd(s, "SAVEPOINT ends", NULL, NULL) == 0;
    PGresult *res =
        !saved ? NULL
               : pg_exec(
                     s,
                     "WITH v AS (SELECT * FROM unnest($2::int[], $3::text[], $4::text[], "
                     "$5::smallint[],"
                     " $6::bigint[], $7::int[], $8::bigint[], $9::text[], $10::bigint[], "
                     "$11::bigint[],"
                     " $12::int[], $13::text[]) AS v(ord, id, owner, state, next_at, inc, delay, "
                     "upstream,"
                     " at, dur, status, outcome)),"
                     " u AS (SELECT DISTINCT ON (id) * FROM v ORDER BY id, ord),"
                     " up AS (UPDATE retryproxy_deliveries d SET state = u.state,"
                     " next_at = coalesce(u.next_at, d.next_at), attempts = d.attempts + u.inc,"
                     " claimed_until = NULL, claimed_by = NULL, reason = NULL, final_head = NULL,"
                     " final_body = NULL, last_delay = coalesce(u.delay, d.last_delay),"
                     " upstream = coalesce(u.upstream, d.upstream) FROM u WHERE d.namespace = $1"
                     " AND d.id = u.id AND d.state = 1 AND d.claimed_by = u.owner RETURNING u.ord),"
                     " tries AS (INSERT INTO retryproxy_attempts(delivery, at, duration_ms, status,"
                     " outcome, upstream) SELECT v.id, v.at, v.dur, v.status, v.outcome, v.upstream"
                     " FROM v JOIN up USING (ord) WHERE v.inc = 1 ORDER BY v.ord)"
                     " SELECT ord FROM up",
                     &q, &r);
    for (int k = 0; k < EV_COLS; k++)
        free(a[k].buf);
    if (!res) { /* nothing of it is kept (its savepoint undone): the calls go one by one */
        if (saved && s->conn && pg_cmd(s, "ROLLBACK TO SAVEPOINT ends", NULL, NULL) == 0)
            pg_cmd(s, "RELEASE SAVEPOINT ends", NULL, NULL);
        return s->conn ? 0 : STORE_EIO;
    }
    for (int i = 0; i < PQntuples(res); i++) {
        size_t k = (size_t)pg_int(res, i, 0);
        if (k < n)
            done[k] = true;
    }
    PQclear(res);
    c = first;
    for (size_t i = 0; i < n; i++, c = c->next)
        if (done[i] && c->op == OP_COMPLETE)
            s->live_delta--;
    r = pg_cmd(s, "RELEASE SAVEPOINT ends", NULL, NULL);
    return s->conn ? r : STORE_EIO;
}

/* renew: the leases the owner still holds, extended, in one statement (a claimer renews what
 * it holds once per tick, batched). */
int pg_renew(struct store_impl *s, struct store_call *c)
{
    struct pga ids = { 0 };
    if (!text_array(&ids, c->in, c->max)) {
        free(ids.buf);
        return STORE_EIO;
    }
    struct pgq q = { 0 };
    pgq_text(&q, s->ns);
    pgq_text(&q, ids.buf);
    pgq_text(&q, c->owner);
    pgq_int(&q, (int64_t)(store_q_now(&s->q.o) + s->q.o.lease_ms));
    int r = pg_cmd(s,
                   "UPDATE retryproxy_deliveries SET claimed_until = $4 WHERE namespace = $1"
                   " AND id = ANY($2::text[]) AND state = 1 AND claimed_by = $3",
                   &q, &c->total);
    free(ids.buf);
    return r;
}

int pg_list(struct store_impl *s, struct store_call *c)
{
    const struct store_filter *f = c->in;
    uint32_t limit = f->limit ? f->limit : 100;
    struct pgq q = { 0 };
    pgq_text(&q, s->ns);
    pgq_text(&q, f->route);
    pgq_int(&q, f->state);
    int r;
    const char *where = " FROM retryproxy_deliveries WHERE namespace = $1"
                        " AND ($2::text IS NULL OR route = $2) AND ($3::int < 0 OR state = $3)";
    char sql[512];
    snprintf(sql, sizeof(sql), "SELECT count(*)%s", where);
    PGresult *res = pg_exec(s, sql, &q, &r);
    c->total = res ? (uint64_t)pg_int(res, 0, 0) : 0;
    PQclear(res);
    if (r < 0)
        return r;
    pgq_int(&q, limit);
    pgq_int(&q, (int64_t)f->offset);
    snprintf(sql, sizeof(sql), "SELECT " PG_LIST_COLS "%s ORDER BY seq LIMIT $4 OFFSET $5", where);
    res = pg_exec(s, sql, &q, &r);
    int n = res ? PQntuples(res) : 0;
    if (res && !(c->items = calloc(limit, sizeof(*c->items))))
        r = STORE_EIO;
    for (int i = 0; r == 0 && i < n && (uint32_t)i < limit; i++) {
        r = pg_read_row(s, res, i, &c->items[i], false);
        c->n++;
    }
    PQclear(res);
    return r;
}

/* replay and drop, by the row's state (locked): a live lease is not replayed; a dropped row
 * takes its attempts with it. */
int pg_change(struct store_impl *s, struct store_call *c)
{
    struct pgq q = { 0 };
    pgq_text(&q, s->ns);
    pgq_text(&q, c->key);
    int r;
    PGresult *res = pg_exec(s,
                            "SELECT state, claimed_until FROM retryproxy_deliveries"
                            " WHERE namespace = $1 AND id = $2 FOR UPDATE",
                            &q, &r);
    if (!res)
        return r;
    bool found = PQntuples(res) > 0;
    int state = found ? (int)pg_int(res, 0, 0) : 0;
    uint64_t until = found ? (uint64_t)pg_int(res, 0, 1) : 0;
    PQclear(res);
    if (!found)
        return STORE_ENOTFOUND;
    if (c->op == OP_DROP) {
        if ((r = pg_cmd(s, "DELETE FROM retryproxy_deliveries WHERE namespace = $1 AND id = $2", &q,
                        NULL)) == 0)
            pg_gone(s, state);
        return r;
    }
    uint64_t now = store_q_now(&s->q.o);
    if (state == STORE_SCHEDULED)
        return 0;
    if (state == STORE_IN_FLIGHT && until > now)
        return STORE_EBUSY;
    pgq_int(&q, (int64_t)now);
    r = pg_cmd(s,
               "UPDATE retryproxy_deliveries SET state = 0, next_at = $3, replays = replays + 1,"
               " claimed_until = NULL, claimed_by = NULL WHERE namespace = $1 AND id = $2",
               &q, NULL);
    if (r == 0 && state == STORE_DELIVERED)
        s->live_delta++;
    return r;
}

int pg_get(struct store_impl *s, const char *id, struct store_delivery *d)
{
    return read_one(s, id, d, true);
}
