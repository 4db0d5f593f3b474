/* deliveries_cli -- the CLI over the delivery store (deliveries_cli.h). */
#include "proxy/ops/deliveries_cli.h"

#include <stdlib.h>
#include <string.h>

#include "proxy/ops/upstreams.h"
#include "proxy/telemetry/log.h"

/* A call's bound: long enough for a busy proxy's lock (the store's busy timeout is 5 s). */
#define CALL_WAIT_MS 60000

static int wait_call(struct store_call *c, int r, FILE *err)
{
    if (r == 0 && store_call_wait(c, CALL_WAIT_MS) < 0) {
        fputs("retryproxy: deliveries: the store did not answer within a minute\n", err);
        exit(1); /* the call still belongs to the store thread: nothing may free it */
    }
    return r < 0 ? r : c->result;
}

static int store_failed(int r, const char *id, FILE *err)
{
    if (!id)
        id = "";
    if (r == STORE_ENOTFOUND)
        fprintf(err, "retryproxy: deliveries: no delivery has the id %s\n", id);
    else if (r == STORE_EBUSY)
        fprintf(err,
                "retryproxy: deliveries: %s is in flight under a lease: replay it once its attempt "
                "ends\n",
                id);
    else
        fprintf(err, "retryproxy: deliveries: the store failed (%d)\n", r);
    return 1;
}

static void print_json(FILE *out, json_t *j)
{
    char *t = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
    if (t)
        fprintf(out, "%s\n", t);
    free(t);
    json_decref(j);
}

static void table(FILE *out, const struct store_call *c)
{
    fprintf(out, "%-32s  %-9s  %-16s  %8s  %6s  %s\n", "ID", "STATE", "ROUTE", "ATTEMPTS", "LAST",
            "ACCEPTED");
    for (size_t i = 0; i < c->n; i++) {
        const struct store_delivery *d = &c->items[i];
        char when[40], last[8] = "-";
        upstreams_rfc3339((int64_t)d->created_at, when, sizeof(when));
        if (d->last_status)
            snprintf(last, sizeof(last), "%d", d->last_status);
        fprintf(out, "%-32s  %-9s  %-16s  %8u  %6s  %s\n", d->id, store_state_name(d->state),
                d->route, d->attempts, last, when);
    }
    fprintf(out, "%zu of %llu", c->n, (unsigned long long)c->total);
    if (c->more)
        fprintf(out, " (next page: --cursor %llu)", (unsigned long long)c->cursor);
    fputc('\n', out);
}

/* show: the JSON's members as lines, the fields and attempts as their own. */
static void show_text(FILE *out, json_t *j)
{
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v)
    {
        if (json_is_array(v) && strcmp(key, "fields") == 0) {
            fputs("fields:\n", out);
            for (size_t i = 0; i < json_array_size(v); i++)
                fprintf(out, "  %s: %s\n",
                        json_string_value(json_array_get(json_array_get(v, i), 0)),
                        json_string_value(json_array_get(json_array_get(v, i), 1)));
        } else if (json_is_array(v)) {
            fprintf(out, "%s:\n", key);
            for (size_t i = 0; i < json_array_size(v); i++) {
                json_t *a = json_array_get(v, i), *status = json_object_get(a, "status");
                char st[8] = "-";
                if (json_is_integer(status))
                    snprintf(st, sizeof(st), "%lld", (long long)json_integer_value(status));
                fprintf(out, "  %s  %5lld ms  %4s  %s\n",
                        json_string_value(json_object_get(a, "at")),
                        (long long)json_integer_value(json_object_get(a, "duration_ms")), st,
                        json_string_value(json_object_get(a, "outcome")));
            }
        } else if (json_is_object(v)) {
            json_t *t = json_object_get(v, "text");
            fprintf(out, "%s: %s%s\n", key, t ? "" : "(base64) ",
                    json_string_value(t ? t : json_object_get(v, "base64")));
        } else if (json_is_string(v)) {
            fprintf(out, "%s: %s\n", key, json_string_value(v));
        } else if (json_is_integer(v)) {
            fprintf(out, "%s: %lld\n", key, (long long)json_integer_value(v));
        } else {
            fprintf(out, "%s: -\n", key);
        }
    }
    json_decref(j);
}

static int by_filter(struct store *st, struct store_cq *q, bool replay, const struct dq *dq,
                     bool json, FILE *out, FILE *err)
{
    struct store_bulk b = {
        .m = dq->m, .replay = replay, .dry_run = dq->dry_run, .rate = dq->rate
    };
    b.m.cursor = 0;
    struct store_call c = { .cq = q };
    int r;
    for (;;) {
        if ((r = wait_call(&c, store_bulk(st, &c, &b), err)) < 0) {
            store_call_clear(&c);
            return store_failed(r, NULL, err);
        }
        if (b.dry_run)
            break;
        for (size_t i = 0; i < c.n; i++)
            deliveries_log_one(replay, c.items[i].id, c.items[i].route, "cli");
        b.done += c.n;
        b.m.cursor = c.cursor;
        bool more = c.more;
        store_call_clear(&c);
        if (!more)
            break;
    }
    uint64_t n = b.dry_run ? c.total : b.done;
    store_call_clear(&c);
    if (!b.dry_run)
        deliveries_log_bulk(replay, dq, n, "cli");
    if (json)
        print_json(out, b.dry_run ? json_pack("{s:b, s:I}", "dry_run", 1, "count", (json_int_t)n)
                        : replay  ? json_pack("{s:I, s:i}", "replayed", (json_int_t)n,
                                              "rate_per_second", (int)b.rate)
                                  : json_pack("{s:I}", "dropped", (json_int_t)n));
    else if (b.dry_run)
        fprintf(out, "%llu deliveries match (dry run: nothing %s)\n", (unsigned long long)n,
                replay ? "replayed" : "dropped");
    else
        fprintf(out, "%s %llu deliveries\n", replay ? "replayed" : "dropped",
                (unsigned long long)n);
    return 0;
}

int dcli_run(const struct cfg *cfg, enum dcli_action action, const char *id, const struct dq *dq,
             bool json, FILE *out, FILE *err)
{
    char why[512];
    struct store *st = NULL;
    struct store_cq *q = store_cq_new();
    int rc = 1, r;
    log_set_fd(2); /* the log lines of replays and drops stay apart from the output */
    if (!q || deliveries_open(cfg, false, NULL, NULL, &st, why, sizeof(why)) < 0) {
        fprintf(err, "retryproxy: deliveries: %s\n", q ? why : "out of memory");
        goto out;
    }
    struct store_call c = { .cq = q };
    switch (action) {
    case DCLI_LIST:
        if ((r = wait_call(&c, store_find(st, &c, &dq->m), err)) < 0) {
            rc = store_failed(r, NULL, err);
            break;
        }
        if (json)
            print_json(out, deliveries_page_json(&c, cfg));
        else
            table(out, &c);
        rc = 0;
        break;
    case DCLI_SHOW:
        if ((r = wait_call(&c, store_get(st, &c, id), err)) < 0) {
            rc = store_failed(r, id, err);
            break;
        }
        if (json)
            print_json(out, deliveries_json(&c.items[0], true, cfg));
        else
            show_text(out, deliveries_json(&c.items[0], true, cfg));
        rc = 0;
        break;
    case DCLI_REPLAY:
    case DCLI_DROP:
        if (!id) {
            rc = by_filter(st, q, action == DCLI_REPLAY, dq, json, out, err);
            break;
        }
        r = wait_call(&c, action == DCLI_REPLAY ? store_replay(st, &c, id) : store_drop(st, &c, id),
                      err);
        if (r < 0) {
            rc = store_failed(r, id, err);
            break;
        }
        deliveries_log_one(action == DCLI_REPLAY, id, NULL, "cli");
        if (json)
            print_json(out, json_pack("{s:s, s:s}", "id", id,
                                      action == DCLI_REPLAY ? "replayed" : "dropped",
                                      action == DCLI_REPLAY ? "scheduled" : "gone"));
        else
            fprintf(out, "%s %s\n", action == DCLI_REPLAY ? "replayed" : "dropped", id);
        rc = 0;
        break;
    }
    store_call_clear(&c);
out:
    store_close(st);
    store_cq_free(q);
    return rc;
}
