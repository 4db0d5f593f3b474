/* deliveries -- what the admin API and the CLI share about the delivery store
 * (docs/delivery.md, "Admin API" and "CLI"): opening the config's store, the filters of a
 * request, a delivery as JSON (sensitive fields "[redacted]", always), and the log lines of
 * replays and drops.
 *
 * The admin listener's endpoints are in deliveries_admin.c, the CLI in deliveries_cli.c.
 */
#ifndef RETRYPROXY_PROXY_OPS_DELIVERIES_H
#define RETRYPROXY_PROXY_OPS_DELIVERIES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "config/cfg.h"
#include "proxy/store/store.h"

/* A replay by filter goes at this many deliveries a second unless `rate` says, and never
 * faster than the maximum. */
#define DELIVERIES_RATE_DEFAULT 10
#define DELIVERIES_RATE_MAX     1000

/* The filters and options of one request (a query string, or the CLI's options). */
struct dq {
    struct store_match m;
    uint32_t rate; /* replay by filter, per second */
    bool dry_run;
    bool filtered; /* any filter given: replay and drop by filter need one */
};

/* An empty query: every state, oldest first, 100 a page, the default rate. */
void dq_init(struct dq *q);

/* Sets 'key' (route, state, since, until, status, limit, cursor, order, rate, dry_run) from
 * its text 'value'. 0; 1 for a key that is none of those; -1 with the reason in 'err' for a
 * bad value. Strings are borrowed. */
int dq_set(struct dq *q, const char *key, const char *value, char *err, size_t cap);
/* The keys dq_set() takes, NULL-terminated. */
extern const char *const dq_keys[];

/* Opens the store 'cfg' names (store.path or store.postgres, key_file...) for the process
 * ('process': a SQLite file its own, exclusive (an flock on PATH.lock), retention on, leases
 * outlasting its routes' timeouts) or for the CLI beside it. 0, or -1 with why in 'err'.
 * 'on_commit' may be NULL. */
int deliveries_open(const struct cfg *cfg, bool process, void (*on_commit)(void *, double),
                    void *arg, struct store **out, char *err, size_t cap);

/* `retryproxy store migrate`: creates or migrates the schema of the shared store 'cfg' names
 * (store.postgres), the versions before and after in *from and *to. 0, or -1 with why. */
int deliveries_migrate(const struct cfg *cfg, int *from, int *to, char *err, size_t cap);

/* A reload's settings of the store (store.sensitive_fields, dead_body_bytes,
 * delivered_keep_ms, dead_keep_ms) handed to the open store 's' (NULL: nothing). 0 or -1. */
int deliveries_tune(struct store *s, const struct cfg *cfg);

/* A delivery as JSON (a new reference): the list form, or 'full' (get) with its fields,
 * body, attempts and, for a dead letter, its final response. Sensitive fields (those of
 * 'cfg', seal.h) and any value still sealed show "[redacted]". */
json_t *deliveries_json(const struct store_delivery *d, bool full, const struct cfg *cfg);

/* A page of find as {"deliveries": [...], "total": N, "next_cursor": C or null}. */
json_t *deliveries_page_json(const struct store_call *c, const struct cfg *cfg);

/* One log line per delivery replayed or dropped ('how': "admin" or "cli"), and one for a
 * replay or drop by filter once done. */
void deliveries_log_one(bool replay, const char *id, const char *route, const char *how);
void deliveries_log_bulk(bool replay, const struct dq *q, uint64_t n, const char *how);

#endif
