#include "proxy/ops/deliveries.h"
#include "proxy/ops/reload.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "config/watch.h"
#include "proxy/dns/resolve.h"
#include "proxy/telemetry/log.h"
#include "proxy/telemetry/metrics.h"
#include "proxy/core/runtime.h"
#include "proxy/core/worker.h"

/* An in-place write is seen while the writer may still be writing, and comes as a burst of
 * events: such a change is read once the burst has been over this long. A change the watch
 * reports as complete (a rename into place, kubelet's ..data swap) is read at once. */
#define DEBOUNCE_MS 100
/* The backstop for events inotify could not deliver (a watch lost with its directory, an
 * unusual filesystem): the file's content is compared this often. */
#define POLL_MS 2000

struct reload {
    struct proxy *px;
    char *path;
    struct reload_pins pins;
    struct cfg *start; /* the config loaded at start: what the keys read only then hold */
    struct worker **workers;
    unsigned n_workers;

    struct loop *loop;
    struct watch *watch;
    struct loop_watch lw;
    struct loop_timer debounce, poll;

    uint64_t generation;
    int64_t loaded_at;
    bool tried_once;     /* 'tried_hash' holds something */
    uint64_t tried_hash; /* content of the last attempt, applied or not */
    bool tried_missing;  /* the last attempt found no readable file */
    char *last_error;
    char restart[160];
    char listen_bound[80], admin_bound[80]; /* the listeners' addresses, once bound */
};

static uint64_t hash(const char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 0x100000001b3ULL;
    return h;
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

static void apply_log_settings(const struct reload *rl, const struct cfg *c)
{
    enum cfg_log_level level =
        rl->pins.log_level >= 0 ? (enum cfg_log_level)rl->pins.log_level : c->log_level;
    enum cfg_log_format format =
        rl->pins.log_format >= 0 ? (enum cfg_log_format)rl->pins.log_format : c->log_format;
    log_configure(level, format);
}

/* Appends one changed key read only at start to rl->restart, unless the command line set it:
 * then the file's value was never the one in force. */
static void note_restart_key(const char *path, void *arg)
{
    struct reload *rl = arg;
    if ((rl->pins.listen && strcmp(path, "listen") == 0) ||
        (rl->pins.admin && strcmp(path, "admin") == 0))
        return;
    size_t n = strlen(rl->restart);
    snprintf(rl->restart + n, sizeof(rl->restart) - n, "%s%s", n ? "," : "", path);
}

/* Settings that only take effect at start (the schema says which), compared with what the
 * process started with. */
static void note_restart_required(struct reload *rl, const struct cfg *c)
{
    rl->restart[0] = '\0';
    cfg_restart_changes(rl->start, c, note_restart_key, rl);
    if (rl->restart[0])
        log_event(CFG_LOG_WARN, "config change needs a restart; the running values stay",
                  "settings", rl->restart, "source", rl->path, NULL);
}

/* Publishes 'c' as the next generation and wakes every worker to pick it up. */
static int publish(struct reload *rl, struct cfg *c)
{
    /* The new servers and bounds first: the snapshot's new names are asked with them. */
    if (rl->px->dns && rl->generation && dns_configure(rl->px->dns, &c->resolver) < 0)
        return -1;
    struct rt *rt = rt_new(c, rl->generation + 1, rl->px->metrics, rl->px->live, rl->px->dns,
                           rl->px->n_workers);
    if (!rt)
        return -1;
    budget_set_window(&rl->px->budget, c->budget.window_ms);
    /* Nothing can fail from here on: the settings shown are those of the config served. */
    metrics_process_budget(rl->px->metrics, &c->budget);
    const uint64_t limits[METRICS_LIMIT_COUNT] = {
        /* read at start only: a reload leaves the one in effect */
        [METRICS_LIMIT_CONNECTIONS] = rl->generation ? METRICS_LIMIT_KEEP : c->max_connections,
        [METRICS_LIMIT_UPSTREAM_REQUESTS] = c->max_upstream_requests,
        [METRICS_LIMIT_BUFFERED_BODY_BYTES] = c->max_buffered_body_bytes
    };
    metrics_limits(rl->px->metrics, limits);
    for (size_t i = 0; i < c->n_routes; i++)
        metrics_route_budget(rt->routes[i].metrics, &c->routes[i].budget);
    rl->generation++;
    rl->loaded_at = rt->loaded_unix_ms;
    rt_cell_publish(&rl->px->cell, rt);
    for (unsigned i = 0; i < rl->n_workers; i++)
        worker_wake(rl->workers[i]);
    apply_log_settings(rl, c);
    /* the store's settings that apply on reload (docs/config.md): sealing and retention */
    if (rl->generation > 1 && deliveries_tune(rl->px->store, c) < 0)
        log_event(CFG_LOG_WARN, "the store keeps its settings: out of memory", NULL);
    free(rl->last_error);
    rl->last_error = NULL;
    metrics_reload(rl->px->metrics, true, rl->generation, (double)rl->loaded_at / 1000.0);
    return 0;
}

/* Records a failed reload: counted, logged one line per error, kept for /config. */
static void failed(struct reload *rl, const struct cfg_errs *errs, const char *trigger)
{
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (m) {
        cfg_errs_print(m, rl->path, errs);
        fclose(m);
    }
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        char *one = strndup(line, n);
        if (one)
            log_event(CFG_LOG_ERROR, "config reload failed; the running config stays", "error", one,
                      "trigger", trigger, NULL);
        free(one);
        line += n + (end != NULL);
    }
    if (text && len && text[len - 1] == '\n')
        text[len - 1] = '\0';
    free(rl->last_error);
    rl->last_error = text; /* every error, one per line */
    metrics_reload(rl->px->metrics, false, rl->generation, 0);
}

/* What made a reload happen, as logged ("trigger"). */
#define BY_REPLACED "replaced" /* the watch saw a complete change: read at once */
#define BY_CHANGED  "changed"  /* the watch saw a change in progress: read after the debounce */
#define BY_POLL     "poll"     /* the content poll */
#define BY_FORCED   "forced"   /* SIGHUP or POST /reload */

/* Reads, validates and (if valid) publishes the file. Unless 'force', content already tried
 * (applied or refused) is left alone. 'trigger' is one of the BY_ values, for the log.
 * Returns 0 when the served config is the file's, -1 otherwise (errors in 'out' if not NULL). */
static int load(struct reload *rl, bool force, const char *trigger, struct cfg_errs *out)
{
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    char *buf = NULL;
    size_t len = 0;
    int rc = -1;

    if (cfg_read_file(rl->path, &buf, &len, &errs) < 0) {
        /* A missing file keeps the running config; reported once until it changes. */
        if (force || !rl->tried_missing)
            failed(rl, &errs, trigger);
        rl->tried_missing = true;
        goto out;
    }
    uint64_t h = hash(buf, len);
    if (!force && !rl->tried_missing && rl->tried_once && h == rl->tried_hash) {
        rc = rl->last_error ? -1 : 0;
        goto out;
    }
    rl->tried_missing = false;
    rl->tried_once = true;
    rl->tried_hash = h;
    struct cfg *c = cfg_load_buffer(buf, len, rl->path, &errs);
    if (!c) {
        failed(rl, &errs, trigger);
        goto out;
    }
    note_restart_required(rl, c);
    if (publish(rl, c) < 0) {
        cfg_errs_add(&errs, "$", 0, 0, "out of memory publishing the config");
        failed(rl, &errs, trigger);
    } else {
        log_event(CFG_LOG_INFO, "config reloaded", LOG_NUM("generation", rl->generation), "source",
                  rl->path, "trigger", trigger, NULL);
        rc = 0;
    }
    cfg_unref(c);
out:
    if (out)
        for (size_t i = 0; i < errs.n; i++)
            cfg_errs_add(out, errs.v[i].path, errs.v[i].line, errs.v[i].col, "%s", errs.v[i].msg);
    cfg_errs_clear(&errs);
    free(buf);
    return rc;
}

struct reload *reload_new(struct proxy *px, const char *path, struct cfg *initial,
                          const struct reload_pins *pins)
{
    struct reload *rl = calloc(1, sizeof(*rl));
    if (!rl)
        return NULL;
    rl->px = px;
    rl->path = strdup(path);
    rl->pins = *pins;
    rl->pins.listen = dup_or_null(pins->listen);
    rl->pins.admin = dup_or_null(pins->admin);
    rl->start = cfg_ref(initial);
    if (!rl->path || publish(rl, initial) < 0) {
        reload_free(rl);
        return NULL;
    }
    /* The content now served is what the file held at start. */
    char *buf;
    size_t len;
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    if (cfg_read_file(path, &buf, &len, &errs) == 0) {
        rl->tried_once = true;
        rl->tried_hash = hash(buf, len);
        free(buf);
    }
    cfg_errs_clear(&errs);
    return rl;
}

void reload_free(struct reload *rl)
{
    if (!rl)
        return;
    if (rl->loop) {
        loop_timer_stop(rl->loop, &rl->debounce);
        loop_timer_stop(rl->loop, &rl->poll);
        if (rl->watch)
            loop_watch_del(rl->loop, &rl->lw);
    }
    watch_free(rl->watch);
    free(rl->path);
    free((void *)rl->pins.listen);
    free((void *)rl->pins.admin);
    cfg_unref(rl->start);
    free(rl->last_error);
    free(rl);
}

void reload_set_workers(struct reload *rl, struct worker **workers, unsigned n)
{
    rl->workers = workers;
    rl->n_workers = n;
}

static void on_debounced(struct loop_timer *t);

/* An in-place change is read DEBOUNCE_MS after its last event. */
static void arm_debounce(struct reload *rl)
{
    loop_timer_start(rl->loop, &rl->debounce, loop_now(rl->loop) + DEBOUNCE_MS, on_debounced, rl);
}

/* The debounce ran out. Events may have come since, in this very loop turn (a ConfigMap swap
 * completed just now): they are taken first, as on_watch() would have taken them, so that a
 * complete change is read as one and a change still in progress waits again. */
static void on_debounced(struct loop_timer *t)
{
    struct reload *rl = t->arg;
    enum watch_change ch = watch_read(rl->watch);
    if (ch != WATCH_NONE)
        watch_repair(rl->watch);
    if (ch == WATCH_IN_PROGRESS)
        arm_debounce(rl);
    else
        load(rl, false, ch == WATCH_COMPLETE ? BY_REPLACED : BY_CHANGED, NULL);
}

static void on_watch(struct loop_watch *lw, uint32_t events)
{
    (void)events;
    struct reload *rl = lw->arg;
    enum watch_change ch = watch_read(rl->watch);
    if (ch == WATCH_NONE)
        return;
    watch_repair(rl->watch); /* the directory may be back already */
    if (ch == WATCH_COMPLETE) {
        /* Whole when its event arrives: read now, in this loop turn. A pending debounce is
         * cancelled: this read is newer than every event it waited on, and an in-place writer
         * that goes on writing arms it again with its next event. Kept, it would re-read the
         * same content and, the hash unchanged, do nothing. */
        loop_timer_stop(rl->loop, &rl->debounce);
        load(rl, false, BY_REPLACED, NULL);
    } else {
        arm_debounce(rl);
    }
}

static void on_poll(struct loop_timer *t)
{
    struct reload *rl = t->arg;
    if (rl->watch && !watch_active(rl->watch))
        watch_repair(rl->watch);
    load(rl, false, BY_POLL, NULL);
    loop_timer_start(rl->loop, &rl->poll, loop_now(rl->loop) + POLL_MS, on_poll, rl);
}

int reload_attach(struct reload *rl, struct loop *l)
{
    int rc = 0;
    rl->loop = l;
    rl->watch = watch_new(rl->path);
    if (!rl->watch) {
        rc = -errno;
        log_event(CFG_LOG_WARN, "cannot watch the config file; polling it instead", "error",
                  strerror(errno), NULL);
    } else if (loop_watch_add(l, &rl->lw, watch_fd(rl->watch), EPOLLIN, on_watch, rl) < 0) {
        rc = -errno;
        watch_free(rl->watch);
        rl->watch = NULL;
    }
    loop_timer_start(l, &rl->poll, loop_now(l) + POLL_MS, on_poll, rl);
    return rc;
}

int reload_force(struct reload *rl, struct cfg_errs *errs, uint64_t *generation)
{
    int rc = load(rl, true, BY_FORCED, errs);
    if (generation)
        *generation = rl->generation;
    return rc;
}

uint64_t reload_generation(const struct reload *rl)
{
    return rl->generation;
}

int64_t reload_loaded_at(const struct reload *rl)
{
    return rl->loaded_at;
}

void reload_set_bound(struct reload *rl, const char *listen, const char *admin)
{
    snprintf(rl->listen_bound, sizeof(rl->listen_bound), "%s", listen);
    snprintf(rl->admin_bound, sizeof(rl->admin_bound), "%s", admin);
}

struct in_force {
    json_t *now, *start;
};

/* A key read only at start that the file has changed since: its value in force is the start's. */
static void keep_start_value(const char *path, void *arg)
{
    struct in_force *f = arg;
    json_t *now = f->now, *start = f->start;
    char key[128];
    for (const char *p = path;;) {
        size_t n = strcspn(p, ".");
        snprintf(key, sizeof(key), "%.*s", (int)n, p);
        if (!p[n]) {
            json_t *v = json_object_get(start, key);
            if (v)
                json_object_set(now, key, v);
            return;
        }
        now = json_object_get(now, key);
        start = json_object_get(start, key);
        if (!json_is_object(now) || !json_is_object(start))
            return;
        p += n + 1;
    }
}

json_t *reload_config_in_force(const struct reload *rl, const struct cfg *c)
{
    json_t *j = cfg_to_json(c);
    if (!j)
        return NULL;
    struct in_force f = { j, cfg_to_json(rl->start) };
    if (f.start)
        cfg_restart_changes(rl->start, c, keep_start_value, &f);
    json_decref(f.start);
    if (rl->listen_bound[0])
        json_object_set_new(j, "listen", json_string(rl->listen_bound));
    if (rl->admin_bound[0])
        json_object_set_new(j, "admin", json_string(rl->admin_bound));
    json_t *log = json_object_get(j, "log");
    if (json_is_object(log) && rl->pins.log_level >= 0)
        json_object_set_new(
            log, "level", json_string(cfg_log_level_name((enum cfg_log_level)rl->pins.log_level)));
    if (json_is_object(log) && rl->pins.log_format >= 0)
        json_object_set_new(
            log, "format",
            json_string(cfg_log_format_name((enum cfg_log_format)rl->pins.log_format)));
    return j;
}

const char *reload_source(const struct reload *rl)
{
    return rl->path;
}

const char *reload_last_error(const struct reload *rl)
{
    return rl->last_error;
}

const char *reload_restart_required(const struct reload *rl)
{
    return rl->restart;
}
