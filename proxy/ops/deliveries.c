/* deliveries -- the admin API's and the CLI's shared part (deliveries.h). */
#include "proxy/ops/deliveries.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config/utf8.h"
#include "proxy/ops/upstreams.h"
#include "proxy/store/seal.h"
#include "proxy/telemetry/log.h"

/* The CLI claims nothing: a lease longer than any attempt can last, never used. */
#define LEASE_MS 600000
/* The process's lease outlasts any attempt: the longest route's timeout and a margin for the
 * answer's way to the store. */
#define LEASE_MARGIN_MS 30000

static uint64_t process_lease_ms(const struct cfg *cfg)
{
    /* For the fleet tests only (docs/delivery.md "Shared store"): a lease shorter than an
     * attempt, to see it renewed and a killed proxy's deliveries taken over within seconds. */
    const char *test = getenv("RETRYPROXY_TEST_LEASE_MS");
    if (test && strtoull(test, NULL, 10) >= 100)
        return strtoull(test, NULL, 10);
    uint64_t lease = 0;
    for (size_t i = 0; i < cfg->n_routes; i++)
        if (cfg->routes[i].timeout_ms > lease)
            lease = cfg->routes[i].timeout_ms;
    return lease + LEASE_MARGIN_MS;
}

/* The settings of 'cfg' a reload may change, its names in *names (malloc'd, freed by the
 * caller). 0, or -1 when out of memory. */
static int tuning_of(const struct cfg *cfg, struct store_tuning *t, const char ***names)
{
    const struct cfg_store *cs = &cfg->store;
    *names = cs->n_sensitive ? calloc(cs->n_sensitive, sizeof(**names)) : NULL;
    if (cs->n_sensitive && !*names)
        return -1;
    for (size_t i = 0; i < cs->n_sensitive; i++)
        (*names)[i] = cs->sensitive[i].name;
    *t = (struct store_tuning){ .sensitive = *names,
                                .n_sensitive = cs->n_sensitive,
                                .dead_body_bytes = cs->dead_body_bytes,
                                .delivered_keep_ms = cs->delivered_keep_ms,
                                .dead_keep_ms = cs->dead_keep_ms };
    return 0;
}

/* The first line of store.postgres.password_file, malloc'd into *out (NULL: no file named).
 * 0, or -1 with why. Read at open, so that a rotated Secret is taken at the next start. */
static int read_password(const struct cfg_store_pg *pg, char **out, char *err, size_t cap)
{
    *out = NULL;
    if (!pg->password_file)
        return 0;
    FILE *f = fopen(pg->password_file, "r");
    char line[1024];
    if (!f || !fgets(line, sizeof(line), f)) {
        snprintf(err, cap, "store.postgres.password_file %s: %s", pg->password_file,
                 f ? "empty" : strerror(errno));
        if (f)
            fclose(f);
        return -1;
    }
    fclose(f);
    line[strcspn(line, "\r\n")] = '\0';
    *out = strdup(line);
    explicit_bzero(line, sizeof(line));
    if (!*out) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    return 0;
}

/* The options of the store 'cfg' names, but the ones deliveries_open() adds. */
static struct store_opts opts_of(const struct cfg_store *cs, const char *password)
{
    return (struct store_opts){ .path = cs->postgres.url ? NULL : cs->path,
                                .pg_url = cs->postgres.url,
                                .pg_password = password,
                                .pg_namespace = cs->postgres.ns,
                                .max_bytes = cs->max_bytes,
                                .max_count = cs->max_count,
                                .lease_ms = LEASE_MS };
}

static void free_password(char *password)
{
    if (password)
        explicit_bzero(password, strlen(password));
    free(password);
}

int deliveries_migrate(const struct cfg *cfg, int *from, int *to, char *err, size_t cap)
{
    const struct cfg_store *cs = &cfg->store;
    if (!cs->postgres.url) {
        snprintf(err, cap,
                 "store migrate is for the shared store: the config names no "
                 "store.postgres.url (a SQLite file is migrated when it is opened)");
        return -1;
    }
    char *password;
    if (read_password(&cs->postgres, &password, err, cap) < 0)
        return -1;
    struct store_opts o = opts_of(cs, password);
    struct store_err e;
    int r = store_pg_migrate(&o, from, to, &e);
    if (r < 0)
        snprintf(err, cap, "%s", e.msg);
    free_password(password);
    return r < 0 ? -1 : 0;
}

int deliveries_open(const struct cfg *cfg, bool process, void (*on_commit)(void *, double),
                    void *arg, struct store **out, char *err, size_t cap)
{
    const struct cfg_store *cs = &cfg->store;
    unsigned char key[SEAL_KEY_BYTES];
    const char **names = NULL;
    char *password = NULL;
    struct store_tuning t;
    int r = -1;
    if (!cs->path && !cs->postgres.url) {
        snprintf(err, cap, "the config names no store (store.path or store.postgres.url)");
        return -1;
    }
    if (cs->key_file && seal_key_load(cs->key_file, key, err, cap) < 0)
        return -1;
    if (read_password(&cs->postgres, &password, err, cap) < 0)
        goto out;
    if (tuning_of(cfg, &t, &names) < 0) {
        snprintf(err, cap, "out of memory");
        goto out;
    }
    struct store_opts o = opts_of(cs, password);
    o.lease_ms = process ? process_lease_ms(cfg) : LEASE_MS;
    o.dead_body_bytes = t.dead_body_bytes;
    o.key = cs->key_file ? key : NULL;
    o.sensitive = t.sensitive;
    o.n_sensitive = t.n_sensitive;
    o.retention = process;
    /* the process's own file; a shared store never is (its rows wait out their leases) */
    o.exclusive = process && !cs->postgres.url;
    o.delivered_keep_ms = t.delivered_keep_ms;
    o.dead_keep_ms = t.dead_keep_ms;
    o.on_commit = on_commit;
    o.on_commit_arg = arg;
    struct store_err e;
    if ((cs->postgres.url ? store_pg_open(&o, out, &e) : store_sqlite_open(&o, out, &e)) < 0) {
        snprintf(err, cap, "%s", e.msg[0] ? e.msg : "cannot open the store");
        goto out;
    }
    r = 0;
out:
    free(names);
    free_password(password);
    explicit_bzero(key, sizeof(key));
    return r;
}

int deliveries_tune(struct store *s, const struct cfg *cfg)
{
    const char **names = NULL;
    struct store_tuning t;
    int r = s && tuning_of(cfg, &t, &names) == 0 ? store_tune(s, &t) : -1;
    free(names);
    return s ? r : 0;
}

static json_t *time_json(uint64_t ms)
{
    char t[40];
    if (!ms)
        return json_null();
    upstreams_rfc3339((int64_t)ms, t, sizeof(t));
    return json_string(t);
}

static bool is_utf8(const char *s, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if (!(k = utf8_len((const unsigned char *)s + i, n - i)) || s[i] == '\0')
            return false;
    return true;
}

/* Bytes as {"text": ...} when they are UTF-8, else {"base64": ...}. */
static json_t *bytes_json(const char *b, size_t n)
{
    if (!b)
        return json_null();
    if (is_utf8(b, n))
        return json_pack("{s:s%}", "text", b, n);
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc(4 * ((n + 2) / 3) + 1), *p = o;
    if (!o)
        return json_null();
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned char)b[i] << 16;
        if (i + 1 < n)
            v |= (unsigned char)b[i + 1] << 8;
        if (i + 2 < n)
            v |= (unsigned char)b[i + 2];
        *p++ = tab[v >> 18 & 63];
        *p++ = tab[v >> 12 & 63];
        *p++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
        *p++ = i + 2 < n ? tab[v & 63] : '=';
    }
    *p = '\0';
    json_t *j = json_pack("{s:s}", "base64", o);
    free(o);
    return j;
}

static bool sensitive(const char *name, const struct cfg *cfg)
{
    const struct cfg_store *cs = &cfg->store;
    if (seal_sensitive(name, NULL, 0))
        return true;
    for (size_t i = 0; i < cs->n_sensitive; i++)
        if (strcasecmp(name, cs->sensitive[i].name) == 0)
            return true;
    return false;
}

json_t *deliveries_json(const struct store_delivery *d, bool full, const struct cfg *cfg)
{
    json_t *j = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:I, s:o, s:o, s:I, s:I, s:o, s:o, s:o}", "id", d->id, "route",
        d->route, "state", store_state_name(d->state), "method", d->method, "target", d->target,
        "body_bytes", (json_int_t)d->body_len, "accepted_at", time_json(d->created_at), "next_at",
        d->state == STORE_SCHEDULED ? time_json(d->next_at) : json_null(), "attempts",
        (json_int_t)d->attempts, "replays", (json_int_t)d->replays, "last_status",
        d->last_status ? json_integer(d->last_status) : json_null(), "idempotency_key",
        d->idem_key ? json_string(d->idem_key) : json_null(), "reason",
        d->reason && d->reason[0] ? json_string(d->reason) : json_null());
    if (j)
        json_object_set_new(j, "upstream", d->upstream ? json_string(d->upstream) : json_null());
    if (!j || !full)
        return j;
    json_t *fields = json_array(), *tries = json_array();
    for (size_t i = 0; i < d->nfields; i++) {
        const struct store_field *f = &d->fields[i];
        bool hide = sensitive(f->name, cfg) || seal_is_sealed(f->value);
        json_array_append_new(fields,
                              json_pack("[s, s]", f->name, hide ? SEAL_REDACTED : f->value));
    }
    for (size_t i = 0; i < d->ntries; i++) {
        const struct store_attempt *a = &d->tries[i];
        json_array_append_new(tries,
                              json_pack("{s:o, s:I, s:o, s:s, s:o}", "at", time_json(a->at_ms),
                                        "duration_ms", (json_int_t)a->duration_ms, "status",
                                        a->status ? json_integer(a->status) : json_null(),
                                        "outcome", a->outcome, "upstream",
                                        a->upstream ? json_string(a->upstream) : json_null()));
    }
    json_object_set_new(j, "fields", fields);
    json_object_set_new(j, "body", bytes_json(d->body, d->body_len));
    json_object_set_new(j, "attempts_made", tries);
    if (d->state == STORE_DEAD) {
        json_object_set_new(j, "final_head", bytes_json(d->final_head, d->final_head_len));
        json_object_set_new(j, "final_body", bytes_json(d->final_body, d->final_body_len));
    }
    return j;
}

json_t *deliveries_page_json(const struct store_call *c, const struct cfg *cfg)
{
    json_t *list = json_array();
    for (size_t i = 0; i < c->n; i++)
        json_array_append_new(list, deliveries_json(&c->items[i], false, cfg));
    return json_pack("{s:o, s:I, s:o}", "deliveries", list, "total", (json_int_t)c->total,
                     "next_cursor", c->more ? json_integer((json_int_t)c->cursor) : json_null());
}

void deliveries_log_one(bool replay, const char *id, const char *route, const char *how)
{
    if (!route)
        route = "";
    if (replay)
        log_event(CFG_LOG_INFO, "delivery replayed", "id", id, "route", route, "by", how, NULL);
    else
        log_event(CFG_LOG_INFO, "delivery dropped", "id", id, "route", route, "by", how, NULL);
}

void deliveries_log_bulk(bool replay, const struct dq *q, uint64_t n, const char *how)
{
    const struct store_match *m = &q->m;
    const char *route = m->route ? m->route : "", *upstream = m->upstream ? m->upstream : "";
    const char *state = m->state >= 0 ? store_state_name((enum store_state)m->state) : "";
    if (replay)
        log_event(CFG_LOG_INFO, "deliveries replayed by filter", "route", route, "state", state,
                  "upstream", upstream, LOG_NUM("since", m->since), LOG_NUM("until", m->until),
                  LOG_NUM("status", m->status), LOG_NUM("count", n), LOG_NUM("rate", q->rate), "by",
                  how, NULL);
    else
        log_event(CFG_LOG_INFO, "deliveries dropped by filter", "route", route, "state", state,
                  "upstream", upstream, LOG_NUM("since", m->since), LOG_NUM("until", m->until),
                  LOG_NUM("status", m->status), LOG_NUM("count", n), "by", how, NULL);
}
