/* pg_conn -- the PostgreSQL store's connection: made (pg_connect), used (pg_exec and the
 * parameters and values around it), and found lost, for pg.c's thread and the operations of
 * pg_sql.c and pg_ops.c. Store thread only. */
#include "proxy/store/pg_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/telemetry/log.h"

void pgq_text(struct pgq *q, const char *v)
{
    q->v[q->n] = v;
    q->len[q->n] = 0;
    q->fmt[q->n++] = 0;
}

void pgq_int(struct pgq *q, int64_t v)
{
    snprintf(q->num[q->n], sizeof(q->num[0]), "%lld", (long long)v);
    pgq_text(q, q->num[q->n]);
}

void pgq_bin(struct pgq *q, const void *b, size_t len)
{
    q->v[q->n] = b ? (b && len ? b : "") : NULL;
    q->len[q->n] = (int)len;
    q->fmt[q->n++] = 1;
}

/* Room for an element of 'more' bytes after its separator ('{' first, then ','), the closing
 * '}' and the NUL; false (and a->oom) when out of memory. */
static bool pga_room(struct pga *a, size_t more)
{
    if (a->oom)
        return false;
    if (a->len + more + 3 > a->cap) {
        size_t cap = a->cap ? a->cap : 256;
        while (a->len + more + 3 > cap)
            cap *= 2;
        char *b = realloc(a->buf, cap);
        if (!b) {
            a->oom = true;
            return false;
        }
        a->buf = b;
        a->cap = cap;
    }
    if (a->len == 0)
        a->buf[a->len++] = '{';
    else
        a->buf[a->len++] = ',';
    return true;
}

void pga_text(struct pga *a, const char *v)
{
    if (!v) {
        if (pga_room(a, 4))
            a->len += (size_t)sprintf(a->buf + a->len, "NULL");
        return;
    }
    if (!pga_room(a, 2 * strlen(v) + 2))
        return;
    a->buf[a->len++] = '"';
    for (const char *x = v; *x; x++) {
        if (*x == '"' || *x == '\\')
            a->buf[a->len++] = '\\';
        a->buf[a->len++] = *x;
    }
    a->buf[a->len++] = '"';
}

void pga_int(struct pga *a, int64_t v)
{
    if (pga_room(a, 24))
        a->len += (size_t)sprintf(a->buf + a->len, "%lld", (long long)v);
}

const char *pga_end(struct pga *a)
{
    if (a->oom || (a->len == 0 && !pga_room(a, 0))) /* no element: "{}" */
        return NULL;
    a->buf[a->len++] = '}';
    a->buf[a->len] = '\0';
    return a->buf;
}

/* A libpq message without its newline, for a log line or an error. */
void pg_trim_msg(char *dst, size_t cap, const char *msg)
{
    snprintf(dst, cap, "%s", msg && *msg ? msg : "no answer");
    size_t n = strlen(dst);
    while (n && (dst[n - 1] == '\n' || dst[n - 1] == ' '))
        dst[--n] = '\0';
}

/* The connection is gone: closed, the store down until the thread reconnects. */
static void lost(struct store_impl *s)
{
    char why[256];
    pg_trim_msg(why, sizeof(why), PQerrorMessage(s->conn));
    PQfinish(s->conn);
    s->conn = NULL;
    s->retry_at = pg_mono_ms() + PG_RETRY_FIRST_MS;
    s->backoff_ms = PG_RETRY_FIRST_MS;
    atomic_store(&s->q.st.down, 1);
    atomic_fetch_add(&s->q.st.disconnects, 1);
    log_event(CFG_LOG_ERROR, "delivery store: lost the database; accepts refused until it is back",
              "namespace", s->ns, "error", why, NULL);
}

PGresult *pg_exec(struct store_impl *s, const char *sql, const struct pgq *q, int *r)
{
    *r = STORE_EIO;
    if (!s->conn)
        return NULL;
    PGresult *res = PQexecParams(s->conn, sql, q ? q->n : 0, NULL, q ? q->v : NULL,
                                 q ? q->len : NULL, q ? q->fmt : NULL, 0);
    ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
        *r = 0;
        return res;
    }
    const char *code = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    if (code && strcmp(code, "23505") == 0)
        *r = STORE_ECONFLICT; /* unique_violation */
    else if (code && strcmp(code, "53100") == 0)
        *r = STORE_EFULL; /* disk_full */
    PQclear(res);
    if (PQstatus(s->conn) == CONNECTION_BAD)
        lost(s);
    return NULL;
}

int pg_cmd(struct store_impl *s, const char *sql, const struct pgq *q, uint64_t *changed)
{
    int r;
    PGresult *res = pg_exec(s, sql, q, &r);
    if (res && changed)
        *changed = strtoull(PQcmdTuples(res), NULL, 10);
    PQclear(res);
    return r;
}

int64_t pg_int(const PGresult *res, int row, int col)
{
    return PQgetisnull(res, row, col) ? 0 : strtoll(PQgetvalue(res, row, col), NULL, 10);
}

char *pg_text(const PGresult *res, int row, int col)
{
    return PQgetisnull(res, row, col) ? NULL : strdup(PQgetvalue(res, row, col));
}

char *pg_bytes(const PGresult *res, int row, int col, size_t *len)
{
    *len = 0;
    if (PQgetisnull(res, row, col))
        return NULL;
    size_t n = 0;
    unsigned char *u = PQunescapeBytea((const unsigned char *)PQgetvalue(res, row, col), &n);
    char *b = u ? malloc(n + 1) : NULL;
    if (b) {
        memcpy(b, u, n);
        b[n] = '\0';
        *len = n;
    }
    PQfreemem(u);
    return b;
}

/* A new connection to o->pg_url, or NULL with why. libpq's defaults first, so that the URL's
 * own settings win; the password last (a URL holding one is refused by the config). */
PGconn *pg_connect(const struct store_opts *o, char *why, size_t cap)
{
    const char *k[12], *v[12];
    int n = 0;
    k[n] = "connect_timeout", v[n++] = "2";
    k[n] = "application_name", v[n++] = "retryproxy";
    /* a peer gone without a word (a failed-over primary) is found within seconds */
    k[n] = "keepalives_idle", v[n++] = "5";
    k[n] = "keepalives_interval", v[n++] = "2";
    k[n] = "keepalives_count", v[n++] = "3";
    k[n] = "tcp_user_timeout", v[n++] = "10000";
    /* the migration's "already exists, skipping" is no news */
    k[n] = "options", v[n++] = "-c client_min_messages=warning";
    k[n] = "dbname", v[n++] = o->pg_url;
    if (o->pg_password)
        k[n] = "password", v[n++] = o->pg_password;
    k[n] = NULL, v[n] = NULL;
    PGconn *c = PQconnectdbParams(k, v, 1);
    if (c && PQstatus(c) == CONNECTION_OK)
        return c;
    pg_trim_msg(why, cap, c ? PQerrorMessage(c) : "out of memory");
    PQfinish(c);
    return NULL;
}
