/* deliveries_admin -- /deliveries on the admin listener, and the store's gauges
 * (deliveries_admin.h; docs/delivery.md "Admin API").
 *
 * A request's way: dadmin_answer() checks it and hands its call to the store, suspending the
 * connection -> the store thread runs it -> the control loop's watch on the completion queue
 * runs on_done() -> a replay or drop by filter hands the next batch over, anything else keeps
 * its answer and resumes the connection -> libmicrohttpd calls the admin again, which sends the
 * answer (dadmin_resumed()) -> the request ends and dadmin_conn_free() frees its state.
 */
#include "proxy/ops/deliveries_admin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>

#include "proxy/ops/deliveries.h"
#include "proxy/ops/reply.h"

/* The gauges are read from the store at most this often. */
#define GAUGES_MAX_AGE_MS 1000
/* At shutdown, how long a call still with the store is waited for. */
#define STOP_WAIT_MS 10000

enum dkind { D_LIST, D_GET, D_REPLAY, D_DROP, D_BULK, D_GAUGES };

/* One suspended request. */
struct dconn {
    struct dadmin *d;
    struct MHD_Connection *c;
    struct dconn *next, *prev; /* the pending ones, while the store has its call */
    enum dkind kind;
    struct store_call call;
    struct dq q;
    struct store_bulk b;
    char id[STORE_ID_SIZE];
    struct rt *rt; /* the config its answer is written with (sensitive fields) */
    bool orphan;   /* its call outlived the shutdown's wait: never freed (the store has it) */
    unsigned status;
    json_t *answer; /* NULL until done (a gauges refresh has none) */
};

struct dadmin {
    struct loop *loop;
    struct store *store;
    struct proxy *px;
    struct store_cq *cq;
    struct loop_watch watch;
    void (*kick)(void *arg);
    void *kick_arg;
    struct dconn *pending;
    bool stopping, orphans;
    /* The gauges' view (metrics_set_store()), as the last counts call left it. */
    struct store_count *counts;
    size_t ncounts;
    struct metrics_delivery_row *rows;
    uint64_t read_at;      /* loop ms of the last read; 0: never */
    struct dconn *refresh; /* the counts call under way, if one is */
};

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- the gauges ---- */

static bool view(void *arg, struct metrics_store_view *v)
{
    struct dadmin *d = arg;
    struct store_stats st;
    store_stats(d->store, &st);
    uint64_t now = wall_ms(), total = 0;
    for (size_t i = 0; i < d->ncounts; i++) {
        const struct store_count *k = &d->counts[i];
        struct metrics_delivery_row *r = &d->rows[i];
        r->route = k->route;
        memcpy(r->n, k->n, sizeof(r->n));
        r->oldest_seconds =
            k->oldest_pending
                ? (double)(now > k->oldest_pending ? now - k->oldest_pending : 0) / 1000.0
                : -1;
        for (int s = 0; s < STORE_STATES; s++)
            total += k->n[s];
    }
    *v = (struct metrics_store_view){
        .rows = d->rows,
        .n = d->ncounts,
        .bytes = st.bytes,
        .rows_total = total,
        .up = st.down == 0,
        .disconnects = st.disconnects,
    };
    return true;
}

static void take_counts(struct dadmin *d, struct store_call *c)
{
    struct metrics_delivery_row *rows = calloc(c->ncounts ? c->ncounts : 1, sizeof(*rows));
    if (c->result < 0 || !rows) {
        free(rows);
        return; /* the last view stays */
    }
    for (size_t i = 0; i < d->ncounts; i++)
        free(d->counts[i].route);
    free(d->counts);
    free(d->rows);
    d->counts = c->counts;
    d->ncounts = c->ncounts;
    d->rows = rows;
    c->counts = NULL;
    c->ncounts = 0;
    d->read_at = loop_now(d->loop) ? loop_now(d->loop) : 1;
}

/* ---- completions ---- */

static void unlink_pending(struct dconn *dc)
{
    struct dadmin *d = dc->d;
    if (dc->prev)
        dc->prev->next = dc->next;
    else if (d->pending == dc)
        d->pending = dc->next;
    if (dc->next)
        dc->next->prev = dc->prev;
    dc->next = dc->prev = NULL;
}

static void finish(struct dconn *dc, unsigned status, json_t *answer)
{
    dc->status = status;
    dc->answer = answer ? answer : json_pack("{s:s}", "error", "out_of_memory");
    unlink_pending(dc);
    MHD_resume_connection(dc->c);
}

static void finish_error(struct dconn *dc, unsigned status, const char *error, const char *msg)
{
    finish(dc, status, json_pack("{s:s, s:s}", "error", error, "message", msg));
}

/* A store error as the answer's status and words. */
static void finish_store_error(struct dconn *dc, int r)
{
    switch (r) {
    case STORE_ENOTFOUND:
        finish_error(dc, MHD_HTTP_NOT_FOUND, "not_found", "no delivery has that id");
        break;
    case STORE_EBUSY:
        finish_error(dc, MHD_HTTP_CONFLICT, "in_flight",
                     "the delivery is in flight under a lease: replay it once its attempt ends");
        break;
    case STORE_ECLOSED:
        finish_error(dc, MHD_HTTP_SERVICE_UNAVAILABLE, "stopping", "the store is closing");
        break;
    default:
        finish_error(dc, MHD_HTTP_INTERNAL_SERVER_ERROR, "store_error",
                     "the store failed: see the proxy's log");
    }
}

static int start(struct dconn *dc);

static void on_done(struct store_call *call)
{
    struct dconn *dc = call->arg;
    struct dadmin *d = dc->d;
    const struct cfg *cfg = dc->rt->cfg;
    int r = call->result;
    if (dc->kind == D_GAUGES) {
        take_counts(d, call);
        d->refresh = NULL;
        finish(dc, 0, json_null());
        return;
    }
    if (r < 0) {
        finish_store_error(dc, r);
        return;
    }
    switch (dc->kind) {
    case D_LIST:
        finish(dc, MHD_HTTP_OK, deliveries_page_json(call, cfg));
        break;
    case D_GET:
        finish(dc, MHD_HTTP_OK, deliveries_json(&call->items[0], true, cfg));
        break;
    case D_REPLAY:
    case D_DROP:
        deliveries_log_one(dc->kind == D_REPLAY, dc->id, NULL, "admin");
        finish(dc, MHD_HTTP_OK,
               json_pack("{s:s, s:s}", "id", dc->id, dc->kind == D_REPLAY ? "replayed" : "dropped",
                         dc->kind == D_REPLAY ? "scheduled" : "gone"));
        break;
    case D_BULK:
        if (dc->b.dry_run) {
            finish(dc, MHD_HTTP_OK,
                   json_pack("{s:b, s:I}", "dry_run", 1, "count", (json_int_t)call->total));
            break;
        }
        for (size_t i = 0; i < call->n; i++)
            deliveries_log_one(dc->b.replay, call->items[i].id, call->items[i].route, "admin");
        dc->b.done += call->n;
        dc->b.m.cursor = call->cursor;
        if (call->more && !d->stopping) {
            store_call_clear(call);
            if ((r = start(dc)) < 0)
                finish_store_error(dc, r);
            break;
        }
        deliveries_log_bulk(dc->b.replay, &dc->q, dc->b.done, "admin");
        finish(dc, MHD_HTTP_OK,
               dc->b.replay ? json_pack("{s:I, s:i}", "replayed", (json_int_t)dc->b.done,
                                        "rate_per_second", (int)dc->b.rate)
                            : json_pack("{s:I}", "dropped", (json_int_t)dc->b.done));
        break;
    case D_GAUGES:
        break;
    }
}

static void on_cq(struct loop_watch *w, uint32_t events)
{
    (void)events;
    struct dadmin *d = w->arg;
    if (store_cq_drain(d->cq) && d->kick)
        d->kick(d->kick_arg); /* resumed connections are run by libmicrohttpd */
}

/* Hands dc's call to the store. 0 or a STORE_E*. */
static int start(struct dconn *dc)
{
    struct store *s = dc->d->store;
    dc->call = (struct store_call){ .cq = dc->d->cq, .done = on_done, .arg = dc };
    switch (dc->kind) {
    case D_LIST:
        return store_find(s, &dc->call, &dc->q.m);
    case D_GET:
        return store_get(s, &dc->call, dc->id);
    case D_REPLAY:
        return store_replay(s, &dc->call, dc->id);
    case D_DROP:
        return store_drop(s, &dc->call, dc->id);
    case D_BULK:
        return store_bulk(s, &dc->call, &dc->b);
    case D_GAUGES:
        return store_counts(s, &dc->call);
    }
    return STORE_EINVAL;
}

/* A new request state for 'c', its call handed over and the connection suspended: 0; or a
 * STORE_E* and dc freed. */
static int begin(struct dadmin *d, struct dconn *dc, struct MHD_Connection *c, void **con_cls)
{
    dc->d = d;
    dc->c = c;
    dc->rt = rt_cell_get(&d->px->cell);
    int r = start(dc);
    if (r < 0) {
        rt_unref(dc->rt);
        free(dc);
        return r;
    }
    dc->next = d->pending;
    if (d->pending)
        d->pending->prev = dc;
    d->pending = dc;
    *con_cls = dc;
    MHD_suspend_connection(c);
    return 0;
}

/* ---- the endpoints ---- */

bool dadmin_owns(const char *url)
{
    return strncmp(url, "/deliveries", 11) == 0 && (url[11] == '\0' || url[11] == '/');
}

static bool is_id(const char *s, size_t n)
{
    if (n != STORE_ID_SIZE - 1)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

/* The query string's filters into dc->q; false with the 400 sent in *ret. */
static bool read_query(struct dconn *dc, struct MHD_Connection *c, enum MHD_Result *ret)
{
    char err[200];
    dq_init(&dc->q);
    for (size_t i = 0; dq_keys[i]; i++) {
        const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, dq_keys[i]);
        if (v && dq_set(&dc->q, dq_keys[i], v, err, sizeof(err)) < 0) {
            *ret = reply_error(c, MHD_HTTP_BAD_REQUEST, "bad_request", err, NULL);
            return false;
        }
    }
    return true;
}

enum MHD_Result dadmin_answer(struct dadmin *d, struct MHD_Connection *c, const char *url,
                              const char *method, void **con_cls)
{
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    bool post = strcmp(method, "POST") == 0, del = strcmp(method, "DELETE") == 0;
    if (!d || !d->store)
        return reply_error(c, MHD_HTTP_NOT_FOUND, "no_store",
                           "no delivery store is configured (store.path or store.postgres.url)",
                           NULL);
    const char *rest = url + 11; /* after /deliveries */
    const char *slash = rest[0] == '/' ? strchr(rest + 1, '/') : NULL;
    size_t idlen = rest[0] ? (slash ? (size_t)(slash - rest - 1) : strlen(rest + 1)) : 0;
    struct dconn *dc = calloc(1, sizeof(*dc));
    if (!dc)
        return MHD_NO;
    enum MHD_Result ret = MHD_NO;
    const char *allow = NULL;
    if (!rest[0]) {
        allow = "GET, HEAD";
        dc->kind = D_LIST;
    } else if (!slash && (strcmp(rest, "/replay") == 0 || strcmp(rest, "/drop") == 0)) {
        allow = "POST";
        dc->kind = D_BULK;
        dc->b.replay = rest[1] == 'r';
    } else if (is_id(rest + 1, idlen) && !slash) {
        allow = "GET, HEAD, DELETE";
        dc->kind = get ? D_GET : D_DROP;
    } else if (is_id(rest + 1, idlen) && strcmp(slash, "/replay") == 0) {
        allow = "POST";
        dc->kind = D_REPLAY;
    } else {
        free(dc);
        return reply_error(c, MHD_HTTP_NOT_FOUND, "not_found",
                           "no such endpoint under /deliveries (an id is 32 hex digits)", NULL);
    }
    bool ok_method = (strstr(allow, "GET") && get) || (strstr(allow, "POST") && post) ||
                     (strstr(allow, "DELETE") && del);
    if (!ok_method) {
        free(dc);
        return reply_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed",
                           "see the Allow header", allow);
    }
    if (idlen)
        snprintf(dc->id, sizeof(dc->id), "%.*s", (int)idlen, rest + 1);
    if ((dc->kind == D_LIST || dc->kind == D_BULK) && !read_query(dc, c, &ret)) {
        free(dc);
        return ret;
    }
    if (dc->kind == D_BULK) {
        if (!dc->q.filtered) {
            free(dc);
            return reply_error(c, MHD_HTTP_BAD_REQUEST, "bad_request",
                               "a replay or drop by filter needs a filter: route, state, since, "
                               "until, status or upstream",
                               NULL);
        }
        dc->b.m = dc->q.m;
        dc->b.m.cursor = 0;
        dc->b.dry_run = dc->q.dry_run;
        dc->b.rate = dc->q.rate;
    }
    if (begin(d, dc, c, con_cls) < 0)
        return reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "store_unavailable",
                           "the store did not take the request", NULL);
    return MHD_YES;
}

bool dadmin_metrics(struct dadmin *d, struct MHD_Connection *c, void **con_cls)
{
    if (!d || !d->store || d->refresh)
        return false; /* none, or a refresh under way: the last view serves */
    uint64_t now = loop_now(d->loop);
    if (d->read_at && now - d->read_at < GAUGES_MAX_AGE_MS)
        return false;
    struct dconn *dc = calloc(1, sizeof(*dc));
    if (!dc)
        return false;
    dc->kind = D_GAUGES;
    if (begin(d, dc, c, con_cls) < 0)
        return false;
    d->refresh = dc;
    return true;
}

enum MHD_Result dadmin_resumed(struct MHD_Connection *c, void *con_cls)
{
    struct dconn *dc = con_cls;
    json_t *a = dc->answer;
    dc->answer = NULL;
    return reply_json(c, dc->status, a, NULL);
}

void dadmin_conn_free(void *con_cls)
{
    struct dconn *dc = con_cls;
    if (!dc || dc->orphan)
        return;
    store_call_clear(&dc->call);
    json_decref(dc->answer);
    rt_unref(dc->rt);
    free(dc);
}

/* ---- life ---- */

struct dadmin *dadmin_new(struct loop *l, struct store *store, struct proxy *px,
                          void (*kick)(void *arg), void *arg)
{
    struct dadmin *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->loop = l;
    d->store = store;
    d->px = px;
    d->kick = kick;
    d->kick_arg = arg;
    if (!store)
        return d;
    d->cq = store_cq_new();
    if (!d->cq || loop_watch_add(l, &d->watch, store_cq_fd(d->cq), EPOLLIN, on_cq, d) < 0) {
        store_cq_free(d->cq);
        free(d);
        return NULL;
    }
    metrics_set_store(px->metrics, view, d);
    return d;
}

void dadmin_free(struct dadmin *d)
{
    if (!d)
        return;
    d->stopping = true;
    /* Every call handed over completes (store.h); a bulk one stops chaining. Their answers are
     * queued as the connections resume; the daemon's stop then closes them. */
    while (d->pending) {
        struct dconn *dc = d->pending;
        if (store_call_wait(&dc->call, STOP_WAIT_MS) < 0) {
            /* The store is stuck: this call's state and the queue are left to it, never
             * freed under it. */
            dc->orphan = true;
            d->orphans = true;
            unlink_pending(dc);
        }
    }
    if (d->store) {
        metrics_set_store(d->px->metrics, NULL, NULL);
        loop_watch_del(d->loop, &d->watch);
        if (!d->orphans)
            store_cq_free(d->cq);
    }
    for (size_t i = 0; i < d->ncounts; i++)
        free(d->counts[i].route);
    free(d->counts);
    free(d->rows);
    free(d);
}
