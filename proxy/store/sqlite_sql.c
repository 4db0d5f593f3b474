/* sqlite_sql -- the SQLite store's schema and what each operation does in its transaction.
 *
 * Run by the store thread only (sqlite.c), inside the transaction it commits for a batch of
 * calls: nothing here commits, and a call's changes count only once the batch's COMMIT has
 * succeeded. A delivery is one row of 'deliveries' (its head's fields one blob of
 * "name\0value\0" pairs), its attempts rows of 'attempts'; docs/delivery.md has the model.
 */
#include "proxy/store/sqlite_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Each step takes the file from the version before it to its own (index + 1). */
static const char *const migrations[SQL_SCHEMA_VERSION] = {
    "CREATE TABLE deliveries("
    " seq INTEGER PRIMARY KEY,"
    " id TEXT NOT NULL UNIQUE,"
    " route TEXT NOT NULL, method TEXT NOT NULL, target TEXT NOT NULL,"
    " fields BLOB NOT NULL, body BLOB NOT NULL,"
    " idem_key TEXT, body_hash INTEGER NOT NULL,"
    " created_at INTEGER NOT NULL, next_at INTEGER NOT NULL,"
    " attempts INTEGER NOT NULL DEFAULT 0, replays INTEGER NOT NULL DEFAULT 0,"
    " state INTEGER NOT NULL,"
    " claimed_until INTEGER, claimed_by TEXT,"
    " reason TEXT, final_head BLOB, final_body BLOB);"
    "CREATE INDEX deliveries_due ON deliveries(state, next_at);"
    "CREATE INDEX deliveries_lease ON deliveries(state, claimed_until);"
    "CREATE INDEX deliveries_route ON deliveries(route, state);"
    "CREATE UNIQUE INDEX deliveries_key ON deliveries(route, idem_key)"
    " WHERE idem_key IS NOT NULL;"
    "CREATE TABLE attempts("
    " delivery TEXT NOT NULL, at INTEGER NOT NULL, duration_ms INTEGER NOT NULL,"
    " status INTEGER NOT NULL, outcome TEXT NOT NULL);"
    "CREATE INDEX attempts_delivery ON attempts(delivery);",
    /* 2: the delay a reschedule waited, the previous delay of the next (decorrelated backoff) */
    "ALTER TABLE deliveries ADD COLUMN last_delay INTEGER NOT NULL DEFAULT 0;",
    /* 3: the upstream (its URL as configured) of each attempt, and of the row's last one (the
     * operators' upstream filter); NULL in the rows before */
    "ALTER TABLE attempts ADD COLUMN upstream TEXT;"
    "ALTER TABLE deliveries ADD COLUMN upstream TEXT;",
    /* 4: a route's due rows in the order they are claimed, read off the index a few at a time
     * (a backlog of thousands was read and sorted whole at every claim: bench/README.md) */
    "CREATE INDEX deliveries_route_due ON deliveries(route, state, next_at);",
};

#define COLS                                                                                       \
    "id, route, method, target, fields, body, idem_key, body_hash, created_at, next_at,"           \
    " attempts, replays, state, claimed_until, claimed_by, reason, final_head, final_body,"        \
    " last_delay, upstream"

static const char *const sql_text[S_COUNT] = {
    [S_INSERT] = "INSERT INTO deliveries(id, route, method, target, fields, body, idem_key,"
                 " body_hash, created_at, next_at, state) VALUES(?,?,?,?,?,?,?,?,?,?,0)",
    [S_BY_KEY] = "SELECT id, body_hash, body FROM deliveries WHERE route = ? AND idem_key = ?",
    /* Due: scheduled rows whose time came, and in-flight ones whose lease ran out, each side
     * read off its index in order and cut at the LIMIT before the two are merged: a backlog is
     * never read whole (deliveries_due, deliveries_lease; deliveries_route_due and
     * deliveries_route for one route's) */
    [S_DUE] = "SELECT id, state FROM ("
              "SELECT * FROM (SELECT id, state, next_at FROM deliveries"
              " WHERE state = 0 AND next_at <= ?1 ORDER BY next_at LIMIT ?2)"
              " UNION ALL SELECT * FROM (SELECT id, state, next_at FROM deliveries"
              " WHERE state = 1 AND claimed_until <= ?1 ORDER BY claimed_until LIMIT ?2))"
              " ORDER BY next_at LIMIT ?2",
    [S_DUE_ROUTE] = "SELECT id, state FROM ("
                    "SELECT * FROM (SELECT id, state, next_at FROM deliveries"
                    " WHERE route = ?3 AND state = 0 AND next_at <= ?1 ORDER BY next_at LIMIT ?2)"
                    " UNION ALL SELECT * FROM (SELECT id, state, next_at FROM deliveries"
                    " WHERE route = ?3 AND state = 1 AND claimed_until <= ?1 LIMIT ?2))"
                    " ORDER BY next_at LIMIT ?2",
    /* The routes the rows name, one after another by index seeks: a few, however many rows */
    [S_NEXT_ROUTE] = "SELECT route FROM deliveries WHERE route > ?1 ORDER BY route LIMIT 1",
    [S_LEASE] = "UPDATE deliveries SET state = 1, claimed_until = ?, claimed_by = ?,"
                " attempts = attempts + ? WHERE id = ?",
    [S_ADD_TRY] = "INSERT INTO attempts(delivery, at, duration_ms, status, outcome, upstream)"
                  " VALUES(?,?,?,?,?,?)",
    [S_READ] = "SELECT " COLS " FROM deliveries WHERE id = ?",
    [S_END] =
        "UPDATE deliveries SET state = ?1, next_at = coalesce(?2, next_at),"
        " attempts = attempts + ?3, claimed_until = NULL, claimed_by = NULL,"
        " reason = ?4, final_head = ?5, final_body = ?6, last_delay = coalesce(?9, last_delay),"
        " upstream = coalesce(?10, upstream)"
        " WHERE id = ?7 AND state = 1 AND claimed_by = ?8",
    [S_STATE] = "SELECT state, claimed_until FROM deliveries WHERE id = ?",
    [S_RENEW] = "UPDATE deliveries SET claimed_until = ?1 WHERE id = ?2 AND state = 1"
                " AND claimed_by = ?3",
    [S_MAKE_DEAD] = "UPDATE deliveries SET state = 3, attempts = ?1, reason = ?2, final_head = ?3,"
                    " final_body = ?4, upstream = ?6 WHERE id = ?5",
    [S_TRIES] = "SELECT at, duration_ms, status, outcome, upstream FROM attempts WHERE delivery = ?"
                " ORDER BY rowid",
    [S_REPLAY] = "UPDATE deliveries SET state = 0, next_at = ?, replays = replays + 1,"
                 " claimed_until = NULL, claimed_by = NULL WHERE id = ?",
    [S_DROP] = "DELETE FROM deliveries WHERE id = ?",
    [S_DROP_TRIES] = "DELETE FROM attempts WHERE delivery = ?",
    [S_LIST] = "SELECT " COLS " FROM deliveries WHERE (?1 IS NULL OR route = ?1)"
               " AND (?2 < 0 OR state = ?2) ORDER BY seq LIMIT ?3 OFFSET ?4",
    [S_LIST_COUNT] = "SELECT count(*) FROM deliveries WHERE (?1 IS NULL OR route = ?1)"
                     " AND (?2 < 0 OR state = ?2)",
    [S_LIVE] = "SELECT count(*) FROM deliveries WHERE state <> 2",
    [S_PAGES] = "PRAGMA page_count",
    [S_FREE_PAGES] = "PRAGMA freelist_count",
    [S_SAVEPOINT] = "SAVEPOINT call",
    [S_ROLLBACK_TO] = "ROLLBACK TO call",
    [S_RELEASE] = "RELEASE call",
    [S_BEGIN] = "BEGIN IMMEDIATE",
    [S_COMMIT] = "COMMIT",
    [S_ROLLBACK] = "ROLLBACK",
};

int sql_error(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_OK:
    case SQLITE_DONE:
    case SQLITE_ROW:
        return 0;
    case SQLITE_FULL:
        return STORE_EFULL;
    case SQLITE_CONSTRAINT:
        return STORE_ECONFLICT;
    default:
        return STORE_EIO;
    }
}

int sql_step_reset(sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? SQLITE_DONE : rc;
}

/* A statement's one integer (PRAGMA page_count, count(*)), 0 when it fails. */
static uint64_t one_int(sqlite3_stmt *st)
{
    uint64_t v = 0;
    if (sqlite3_step(st) == SQLITE_ROW)
        v = (uint64_t)sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return v;
}

uint64_t sql_bytes(struct store_impl *s)
{
    uint64_t pages = one_int(s->st[S_PAGES]), free_pages = one_int(s->st[S_FREE_PAGES]);
    return (pages - (free_pages < pages ? free_pages : pages)) * s->page_size;
}

int sql_setup(struct store_impl *s, struct store_err *err)
{
    int r = STORE_EIO;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->db, "PRAGMA user_version", -1, &st, NULL);
    if (rc != SQLITE_OK || sqlite3_step(st) != SQLITE_ROW)
        goto fail;
    int version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    st = NULL;
    if (version > SQL_SCHEMA_VERSION) {
        snprintf(err->msg, sizeof(err->msg),
                 "%s: the store's schema is version %d, newer than this program's %d", s->q.o.path,
                 version, SQL_SCHEMA_VERSION);
        return STORE_EINVAL;
    }
    for (int v = version; v < SQL_SCHEMA_VERSION; v++) {
        char set[64];
        snprintf(set, sizeof(set), "PRAGMA user_version = %d", v + 1);
        if ((rc = sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL)) != SQLITE_OK)
            goto fail;
        if ((rc = sqlite3_exec(s->db, migrations[v], NULL, NULL, NULL)) != SQLITE_OK ||
            (rc = sqlite3_exec(s->db, set, NULL, NULL, NULL)) != SQLITE_OK ||
            (rc = sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL)) != SQLITE_OK) {
            snprintf(err->msg, sizeof(err->msg), "%s: migrating the schema to version %d: %s",
                     s->q.o.path, v + 1, sqlite3_errmsg(s->db));
            sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
            return sql_error(rc) == STORE_EFULL ? STORE_EFULL : STORE_EIO;
        }
    }
    for (int i = 0; i < S_COUNT; i++)
        if ((rc = sqlite3_prepare_v3(s->db, sql_text[i], -1, SQLITE_PREPARE_PERSISTENT, &s->st[i],
                                     NULL)) != SQLITE_OK)
            goto fail;
    s->live = one_int(s->st[S_LIVE]);
    return 0;
fail:
    snprintf(err->msg, sizeof(err->msg), "%s: %s", s->q.o.path, sqlite3_errmsg(s->db));
    sqlite3_finalize(st);
    return r;
}

void sql_finalize(struct store_impl *s)
{
    for (int i = 0; i < S_COUNT; i++) {
        sqlite3_finalize(s->st[i]);
        s->st[i] = NULL;
    }
}

char *sql_col_text(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? strdup((const char *)t) : NULL;
}

/* A blob column as a malloc'd copy with a NUL after it (NULL for SQL NULL). */
static char *col_blob(sqlite3_stmt *st, int i, size_t *len)
{
    *len = 0;
    if (sqlite3_column_type(st, i) == SQLITE_NULL)
        return NULL;
    const void *p = sqlite3_column_blob(st, i);
    size_t n = (size_t)sqlite3_column_bytes(st, i);
    char *b = malloc(n + 1);
    if (b) {
        if (n)
            memcpy(b, p, n);
        b[n] = '\0';
        *len = n;
    }
    return b;
}

/* A row of COLS into 'd'; 'full' reads the fields, body and final response too. */
static int read_row(sqlite3_stmt *st, struct store_delivery *d, bool full)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->id, sizeof(d->id), "%s", (const char *)sqlite3_column_text(st, 0));
    d->route = sql_col_text(st, 1);
    d->method = sql_col_text(st, 2);
    d->target = sql_col_text(st, 3);
    if (full) {
        size_t n;
        char *f = col_blob(st, 4, &n);
        int r = f ? sql_fields_unpack(d, f, n) : STORE_EIO;
        free(f);
        if (r < 0)
            return r;
        d->body = col_blob(st, 5, &d->body_len);
        d->final_head = col_blob(st, 16, &d->final_head_len);
        d->final_body = col_blob(st, 17, &d->final_body_len);
    } else {
        d->body_len = (size_t)sqlite3_column_bytes(st, 5);
    }
    d->idem_key = sql_col_text(st, 6);
    d->body_hash = (uint64_t)sqlite3_column_int64(st, 7);
    d->created_at = (uint64_t)sqlite3_column_int64(st, 8);
    d->next_at = (uint64_t)sqlite3_column_int64(st, 9);
    d->attempts = (uint32_t)sqlite3_column_int64(st, 10);
    d->replays = (uint32_t)sqlite3_column_int64(st, 11);
    d->state = (enum store_state)sqlite3_column_int(st, 12);
    d->claimed_until = (uint64_t)sqlite3_column_int64(st, 13);
    d->claimed_by = sql_col_text(st, 14);
    d->reason = sql_col_text(st, 15);
    d->last_delay_ms = (uint32_t)sqlite3_column_int64(st, 18);
    d->upstream = sql_col_text(st, 19);
    return d->route && d->method && d->target ? 0 : STORE_EIO;
}

/* Reads delivery 'id' whole into 'd' (and its attempts when 'tries'). */
static int read_one(struct store_impl *s, const char *id, struct store_delivery *d, bool tries)
{
    sqlite3_stmt *st = s->st[S_READ];
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int r = rc == SQLITE_ROW    ? read_row(st, d, true)
            : rc == SQLITE_DONE ? STORE_ENOTFOUND
                                : sql_error(rc);
    sqlite3_reset(st);
    if (r == 0)
        sql_open_fields(&s->q.o, d);
    if (r < 0 || !tries)
        return r;
    st = s->st[S_TRIES];
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    size_t cap = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (d->ntries == cap) {
            cap = cap ? 2 * cap : 8;
            struct store_attempt *t = realloc(d->tries, cap * sizeof(*t));
            if (!t) {
                r = STORE_EIO;
                break;
            }
            d->tries = t;
        }
        struct store_attempt *a = &d->tries[d->ntries++];
        a->at_ms = (uint64_t)sqlite3_column_int64(st, 0);
        a->duration_ms = (uint32_t)sqlite3_column_int64(st, 1);
        a->status = sqlite3_column_int(st, 2);
        snprintf(a->outcome, sizeof(a->outcome), "%s", (const char *)sqlite3_column_text(st, 3));
        a->upstream = sql_col_text(st, 4);
    }
    if (r == 0 && rc != SQLITE_DONE)
        r = sql_error(rc);
    sqlite3_reset(st);
    if (d->ntries)
        d->last_status = d->tries[d->ntries - 1].status;
    return r;
}

static int add_try(struct store_impl *s, const char *id, const struct store_attempt *a)
{
    sqlite3_stmt *st = s->st[S_ADD_TRY];
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)a->at_ms);
    sqlite3_bind_int64(st, 3, a->duration_ms);
    sqlite3_bind_int(st, 4, a->status);
    sqlite3_bind_text(st, 5, a->outcome, -1, SQLITE_STATIC);
    if (a->upstream)
        sqlite3_bind_text(st, 6, a->upstream, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 6);
    return sql_error(sql_step_reset(st));
}

/* The accept: an earlier one of the route with the same Idempotency-Key answers for it (same
 * body), or refuses it (another body); then the bounds; then the row. */
int sql_enqueue(struct store_impl *s, struct store_call *c)
{
    const struct store_new *d = c->in;
    uint64_t hash = store_body_hash(d->body, d->body_len);
    int rc, r = 0;
    if (d->idem_key) {
        sqlite3_stmt *st = s->st[S_BY_KEY];
        sqlite3_bind_text(st, 1, d->route, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, d->idem_key, -1, SQLITE_STATIC);
        if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            const void *body = sqlite3_column_blob(st, 2);
            bool same = (uint64_t)sqlite3_column_int64(st, 1) == hash &&
                        (size_t)sqlite3_column_bytes(st, 2) == d->body_len &&
                        (d->body_len == 0 || memcmp(body, d->body, d->body_len) == 0);
            snprintf(c->id, sizeof(c->id), "%s", (const char *)sqlite3_column_text(st, 0));
            c->dup = same;
            r = same ? 0 : STORE_ECONFLICT;
        }
        sqlite3_reset(st);
        if (rc == SQLITE_ROW)
            return r;
        if (rc != SQLITE_DONE)
            return sql_error(rc);
    }
    struct sql_row row;
    if ((r = sql_new_row(&s->q.o, c, d, s->live + (uint64_t)s->live_delta,
                         atomic_load(&s->q.st.bytes) + s->bytes_added, &row)) < 0)
        return r;
    uint64_t now = sql_now(s);
    sqlite3_stmt *st = s->st[S_INSERT];
    sqlite3_bind_text(st, 1, c->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, d->route, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, d->method, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, d->target, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 5, row.fields, (int)row.flen, SQLITE_STATIC);
    sqlite3_bind_blob(st, 6, d->body_len ? d->body : "", (int)d->body_len, SQLITE_STATIC);
    if (d->idem_key)
        sqlite3_bind_text(st, 7, d->idem_key, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 7);
    sqlite3_bind_int64(st, 8, (sqlite3_int64)hash);
    sqlite3_bind_int64(st, 9, (sqlite3_int64)now);
    sqlite3_bind_int64(st, 10, (sqlite3_int64)(d->next_at ? d->next_at : now));
    r = sql_error(sql_step_reset(st));
    sqlite3_clear_bindings(st);
    free(row.fields);
    if (r == 0) {
        s->live_delta++;
        s->bytes_added += row.size;
    }
    return r;
}

/* insert_dead: the row as an enqueue makes it (the same bounds), then dead at once, with its
 * attempts and final answer. */
int sql_insert_dead(struct store_impl *s, struct store_call *c)
{
    const struct store_dead_new *d = c->in;
    if (d->req.idem_key)
        return STORE_EINVAL;
    int r = sql_enqueue(s, c); /* reads d->req, the first member */
    if (r < 0)
        return r;
    size_t cap = s->q.o.dead_body_bytes ? s->q.o.dead_body_bytes : 4096;
    sqlite3_stmt *st = s->st[S_MAKE_DEAD];
    sqlite3_bind_int64(st, 1, d->attempts);
    sqlite3_bind_text(st, 2, d->dead.reason ? d->dead.reason : "", -1, SQLITE_STATIC);
    if (d->dead.head)
        sqlite3_bind_blob(st, 3, d->dead.head, (int)d->dead.head_len, SQLITE_STATIC);
    if (d->dead.body)
        sqlite3_bind_blob(st, 4, d->dead.body,
                          (int)(d->dead.body_len < cap ? d->dead.body_len : cap), SQLITE_STATIC);
    sqlite3_bind_text(st, 5, c->id, -1, SQLITE_STATIC);
    if (d->ntries && d->tries[d->ntries - 1].upstream)
        sqlite3_bind_text(st, 6, d->tries[d->ntries - 1].upstream, -1, SQLITE_STATIC);
    r = sql_error(sql_step_reset(st));
    sqlite3_clear_bindings(st);
    for (size_t i = 0; r == 0 && i < d->ntries; i++)
        r = add_try(s, c->id, &d->tries[i]);
    return r;
}

/* Whether 'route' is one of the 'n' names of 'routes'. */
static bool named(const void *routes, size_t n, const char *route)
{
    const char *const *r = routes;
    for (size_t i = 0; route && i < n; i++)
        if (strcmp(r[i], route) == 0)
            return true;
    return false;
}

/* Up to 'max' due rows of 'route' (NULL: any), oldest due first, into ids and was (their
 * state). How many. */
static size_t due_rows(struct store_impl *s, const char *route, uint64_t now, size_t max,
                       char (*ids)[STORE_ID_SIZE], int *was)
{
    sqlite3_stmt *st = s->st[route ? S_DUE_ROUTE : S_DUE];
    size_t n = 0;
    sqlite3_bind_int64(st, 1, (sqlite3_int64)now);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)max);
    if (route)
        sqlite3_bind_text(st, 3, route, -1, SQLITE_STATIC);
    while (n < max && sqlite3_step(st) == SQLITE_ROW) {
        snprintf(ids[n], STORE_ID_SIZE, "%s", (const char *)sqlite3_column_text(st, 0));
        was[n++] = sqlite3_column_int(st, 1);
    }
    sqlite3_reset(st);
    return n;
}

/* Due rows, oldest due first, each leased to the caller; one whose lease ran out had an
 * attempt under way when its owner died: that attempt is recorded as lost and counted. */
int sql_claim(struct store_impl *s, struct store_call *c)
{
    uint64_t now = sql_now(s);
    size_t cap = c->max, n = 0;
    char(*ids)[STORE_ID_SIZE] = calloc(cap, sizeof(*ids));
    int *was = calloc(cap, sizeof(*was));
    int r = 0;
    if (!ids || !was) {
        r = STORE_EIO;
        goto out;
    }
    sqlite3_stmt *st;
    if (c->op == OP_CLAIM_EXCEPT) {
        /* the routes no claimer names, found one after another by index seeks */
        char *last = strdup("");
        while (last && n < cap) {
            st = s->st[S_NEXT_ROUTE];
            sqlite3_bind_text(st, 1, last, -1, SQLITE_TRANSIENT);
            const unsigned char *route =
                sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_text(st, 0) : NULL;
            char *next = route ? strdup((const char *)route) : NULL;
            sqlite3_reset(st);
            free(last);
            last = next;
            if (last && !named(c->in, (size_t)c->when, last))
                n += due_rows(s, last, now, cap - n, ids + n, was + n);
        }
        free(last);
    } else {
        n = due_rows(s, c->key, now, cap, ids, was);
    }
    c->items = calloc(n ? n : 1, sizeof(*c->items));
    if (!c->items) {
        r = STORE_EIO;
        goto out;
    }
    for (size_t i = 0; i < n && r == 0; i++) {
        bool lost = was[i] == STORE_IN_FLIGHT;
        if (lost) {
            struct store_attempt a = { .at_ms = now, .outcome = "lease_expired" };
            if ((r = add_try(s, ids[i], &a)) < 0)
                break;
        }
        st = s->st[S_LEASE];
        sqlite3_bind_int64(st, 1, (sqlite3_int64)(now + s->q.o.lease_ms));
        sqlite3_bind_text(st, 2, c->owner, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 3, lost);
        sqlite3_bind_text(st, 4, ids[i], -1, SQLITE_STATIC);
        if ((r = sql_error(sql_step_reset(st))) == 0 &&
            (r = read_one(s, ids[i], &c->items[i], false)) == 0)
            c->n = i + 1;
    }
out:
    free(ids);
    free(was);
    return r;
}

int sql_recover(struct store_impl *s)
{
    char sql[512];
    uint64_t now = sql_now(s);
    snprintf(sql, sizeof(sql),
             "BEGIN IMMEDIATE;"
             "INSERT INTO attempts(delivery, at, duration_ms, status, outcome)"
             " SELECT id, %llu, 0, 0, 'lease_expired' FROM deliveries WHERE state = 1;"
             "UPDATE deliveries SET state = 0, next_at = %llu, attempts = attempts + 1,"
             " claimed_until = NULL, claimed_by = NULL WHERE state = 1;",
             (unsigned long long)now, (unsigned long long)now);
    if (sqlite3_exec(s->db, sql, NULL, NULL, NULL) != SQLITE_OK) {
        int r = sql_error(sqlite3_errcode(s->db));
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
        return r ? r : STORE_EIO;
    }
    int n = sqlite3_changes(s->db);
    int rc = sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
        return sql_error(rc) ? sql_error(rc) : STORE_EIO;
    }
    return n;
}

/* complete, reschedule, bury: the lease's owner ends an attempt. */
int sql_end(struct store_impl *s, struct store_call *c)
{
    const struct store_dead *dead = c->op == OP_BURY ? c->in : NULL;
    enum store_state to = c->op == OP_COMPLETE     ? STORE_DELIVERED
                          : c->op == OP_RESCHEDULE ? STORE_SCHEDULED
                                                   : STORE_DEAD;
    sqlite3_stmt *st = s->st[S_END];
    sqlite3_bind_int(st, 1, to);
    if (c->op == OP_RESCHEDULE) {
        sqlite3_bind_int64(st, 2, (sqlite3_int64)c->when);
        if (c->attempt)
            sqlite3_bind_int64(st, 9, c->attempt->delay_ms);
    }
    if (c->attempt && c->attempt->upstream)
        sqlite3_bind_text(st, 10, c->attempt->upstream, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, c->attempt != NULL);
    if (dead) {
        size_t cap = s->q.o.dead_body_bytes ? s->q.o.dead_body_bytes : 4096;
        sqlite3_bind_text(st, 4, dead->reason ? dead->reason : "", -1, SQLITE_STATIC);
        if (dead->head)
            sqlite3_bind_blob(st, 5, dead->head, (int)dead->head_len, SQLITE_STATIC);
        if (dead->body)
            sqlite3_bind_blob(st, 6, dead->body, (int)(dead->body_len < cap ? dead->body_len : cap),
                              SQLITE_STATIC);
    }
    sqlite3_bind_text(st, 7, c->key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, c->owner, -1, SQLITE_STATIC);
    int r = sql_error(sql_step_reset(st));
    sqlite3_clear_bindings(st);
    if (r == 0 && sqlite3_changes(s->db) == 0) {
        st = s->st[S_STATE];
        sqlite3_bind_text(st, 1, c->key, -1, SQLITE_STATIC);
        r = sqlite3_step(st) == SQLITE_ROW ? STORE_ESTALE : STORE_ENOTFOUND;
        sqlite3_reset(st);
    }
    if (r == 0 && dead && dead->discard) { /* nothing of it is kept: no attempt row either */
        st = s->st[S_DROP_TRIES];
        sqlite3_bind_text(st, 1, c->key, -1, SQLITE_STATIC);
        r = sql_error(sql_step_reset(st));
        st = s->st[S_DROP];
        sqlite3_bind_text(st, 1, c->key, -1, SQLITE_STATIC);
        if (r == 0 && (r = sql_error(sql_step_reset(st))) == 0)
            s->live_delta--;
        return r;
    }
    if (r == 0 && c->attempt)
        r = add_try(s, c->key, c->attempt);
    if (r == 0 && to == STORE_DELIVERED)
        s->live_delta--;
    return r;
}

/* renew: the leases the owner still holds, extended. */
int sql_renew(struct store_impl *s, struct store_call *c)
{
    const char *const *ids = c->in;
    sqlite3_stmt *st = s->st[S_RENEW];
    int r = 0;
    for (size_t i = 0; r == 0 && i < c->max; i++) {
        sqlite3_bind_int64(st, 1, (sqlite3_int64)(store_q_now(&s->q.o) + s->q.o.lease_ms));
        sqlite3_bind_text(st, 2, ids[i], -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, c->owner, -1, SQLITE_STATIC);
        if ((r = sql_error(sql_step_reset(st))) == 0)
            c->total += (uint64_t)sqlite3_changes(s->db);
    }
    sqlite3_clear_bindings(st);
    return r;
}

int sql_list(struct store_impl *s, struct store_call *c)
{
    const struct store_filter *f = c->in;
    int r = 0, rc;
    sqlite3_stmt *st = s->st[S_LIST_COUNT];
    for (int k = 0; k < 2; k++, st = s->st[S_LIST]) {
        if (f->route)
            sqlite3_bind_text(st, 1, f->route, -1, SQLITE_STATIC);
        else
            sqlite3_bind_null(st, 1);
        sqlite3_bind_int(st, 2, f->state);
    }
    c->total = one_int(s->st[S_LIST_COUNT]);
    st = s->st[S_LIST];
    uint32_t limit = f->limit ? f->limit : 100;
    sqlite3_bind_int64(st, 3, limit);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)f->offset);
    c->items = calloc(limit, sizeof(*c->items));
    if (!c->items)
        r = STORE_EIO;
    while (r == 0 && c->n < limit && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        r = read_row(st, &c->items[c->n], false);
        c->n++;
    }
    sqlite3_reset(st);
    return r;
}

/* replay and drop, by the row's state: a live lease is not replayed; a dropped row takes its
 * attempts with it. */
int sql_change(struct store_impl *s, struct store_call *c)
{
    sqlite3_stmt *st = s->st[S_STATE];
    sqlite3_bind_text(st, 1, c->key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int state = sqlite3_column_int(st, 0);
    uint64_t until = (uint64_t)sqlite3_column_int64(st, 1);
    sqlite3_reset(st);
    if (rc != SQLITE_ROW)
        return rc == SQLITE_DONE ? STORE_ENOTFOUND : sql_error(rc);
    if (c->op == OP_DROP) {
        st = s->st[S_DROP_TRIES];
        sqlite3_bind_text(st, 1, c->key, -1, SQLITE_STATIC);
        int r = sql_error(sql_step_reset(st));
        st = s->st[S_DROP];
        sqlite3_bind_text(st, 1, c->key, -1, SQLITE_STATIC);
        if (r == 0 && (r = sql_error(sql_step_reset(st))) == 0 && state != STORE_DELIVERED)
            s->live_delta--;
        return r;
    }
    uint64_t now = sql_now(s);
    if (state == STORE_SCHEDULED)
        return 0;
    if (state == STORE_IN_FLIGHT && until > now)
        return STORE_EBUSY;
    st = s->st[S_REPLAY];
    sqlite3_bind_int64(st, 1, (sqlite3_int64)now);
    sqlite3_bind_text(st, 2, c->key, -1, SQLITE_STATIC);
    int r = sql_error(sql_step_reset(st));
    if (r == 0 && state == STORE_DELIVERED)
        s->live_delta++;
    return r;
}

int sql_get(struct store_impl *s, const char *id, struct store_delivery *d)
{
    return read_one(s, id, d, true);
}
