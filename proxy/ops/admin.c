#include "proxy/ops/admin.h"

#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "policy/backoff.h"
#include "policy/health.h"
#include "proxy/telemetry/metrics.h"
#include "proxy/core/runtime.h"
#include "proxy/ops/deliveries_admin.h"
#include "proxy/ops/reply.h"
#include "proxy/ops/upstreams.h"

/* /schedule answers at most this many delays: enough to study any policy. */
#define SCHEDULE_MAX_RETRIES 1000

struct admin {
    struct loop *loop;
    struct MHD_Daemon *d;
    struct loop_watch watch;
    struct loop_timer timer;
    struct proxy *px;
    struct reload *rl;
    struct dadmin *dl; /* /deliveries and the store's gauges */
};

static void schedule_run(struct admin *a);

static void quiet(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    (void)fmt;
    (void)ap; /* client misbehaviour on the admin port is answered or closed; nothing to log */
}

static void on_timer(struct loop_timer *t)
{
    struct admin *a = t->arg;
    MHD_run(a->d);
    schedule_run(a);
}

static void on_epoll(struct loop_watch *w, uint32_t events)
{
    (void)events;
    struct admin *a = w->arg;
    MHD_run(a->d);
    schedule_run(a);
}

static void schedule_run(struct admin *a)
{
    MHD_UNSIGNED_LONG_LONG ms;
    if (MHD_get_timeout(a->d, &ms) == MHD_YES)
        loop_timer_start(a->loop, &a->timer, loop_now(a->loop) + ms, on_timer, a);
    else
        loop_timer_stop(a->loop, &a->timer);
}

static enum MHD_Result get_config(struct admin *a, struct MHD_Connection *c)
{
    struct rt *rt = rt_cell_get(&a->px->cell);
    char when[40];
    upstreams_rfc3339(reload_loaded_at(a->rl), when, sizeof(when));
    const char *err = reload_last_error(a->rl);
    const char *restart = reload_restart_required(a->rl);
    json_t *restart_list = json_array();
    for (const char *p = restart; *p;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        json_array_append_new(restart_list, json_stringn(p, n));
        p += n + (comma != NULL);
    }
    json_t *j = json_pack("{s:I, s:s, s:s, s:o, s:o, s:o}", "generation",
                          (json_int_t)reload_generation(a->rl), "loaded_at", when, "source",
                          reload_source(a->rl), "last_error", err ? json_string(err) : json_null(),
                          "restart_required", restart_list, "config",
                          reload_config_in_force(a->rl, rt->cfg));
    rt_unref(rt);
    return reply_json(c, MHD_HTTP_OK, j, NULL);
}

/* A whole decimal number in [0, max] in *out and 0, or -1. */
static int parse_u64(const char *s, unsigned long long max, unsigned long long *out)
{
    if (!s || !*s)
        return -1;
    unsigned long long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9' || v > (max - (unsigned)(*p - '0')) / 10)
            return -1;
        v = v * 10 + (unsigned)(*p - '0');
    }
    *out = v;
    return 0;
}

/* The same, small enough for a long long, or -1. */
static long long parse_arg(const char *s, unsigned long long max)
{
    unsigned long long v;
    return parse_u64(s, max, &v) < 0 ? -1 : (long long)v;
}

static enum MHD_Result get_schedule(struct admin *a, struct MHD_Connection *c)
{
    const char *name = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "route");
    const char *retries_s = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "retries");
    const char *seed_s = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "seed");
    if (!name)
        return reply_error(c, MHD_HTTP_BAD_REQUEST, "bad_request", "route=NAME is required", NULL);
    long long retries = retries_s ? parse_arg(retries_s, SCHEDULE_MAX_RETRIES) : -2;
    if (retries == -1)
        return reply_error(c, MHD_HTTP_BAD_REQUEST, "bad_request",
                           "retries must be a whole number from 0 to 1000", NULL);
    unsigned long long seed;
    if (seed_s) {
        /* without a sign or base, up to 2^64-1 as `schedule --seed` takes */
        if (parse_u64(seed_s, UINT64_MAX, &seed) < 0)
            return reply_error(c, MHD_HTTP_BAD_REQUEST, "bad_request",
                               "seed must be a whole number from 0 to 2^64-1", NULL);
    } else {
        if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
            seed = (unsigned long long)time(NULL);
        seed &= INT64_MAX; /* a seed of our own fits any JSON reader's signed integers */
    }

    struct rt *rt = rt_cell_get(&a->px->cell);
    const struct cfg_route *r = cfg_route_by_name(rt->cfg, name);
    if (!r) {
        rt_unref(rt);
        return reply_error(c, MHD_HTTP_NOT_FOUND, "no_route", "no route has that name", NULL);
    }
    uint32_t n = retries >= 0 ? (uint32_t)retries : r->retry.max_attempts - 1;
    uint32_t *d = calloc(n ? n : 1, sizeof(*d));
    struct rng rng;
    rng_seed(&rng, seed);
    json_t *delays = json_array();
    if (d) {
        backoff_schedule(&r->retry.backoff, n, &rng, d);
        for (uint32_t i = 0; i < n; i++)
            json_array_append_new(delays, json_integer(d[i]));
    }
    free(d);
    json_t *j = json_pack("{s:s, s:o}", "route", r->name, "delays_ms", delays);
    rt_unref(rt);
    /* jansson's integers are signed: the seed, up to 2^64-1, is written after them */
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    size_t len = text ? strlen(text) : 0;
    char *body = len ? malloc(len + 32) : NULL;
    if (!body) {
        free(text);
        return MHD_NO;
    }
    len = (size_t)snprintf(body, len + 32, "%.*s,\"seed\":%llu}\n", (int)(len - 1), text, seed);
    free(text);
    return reply_text(c, MHD_HTTP_OK, "application/json", body, len, MHD_RESPMEM_MUST_FREE, NULL);
}

/* Every route of the running config with its upstreams' endpoints (proxy/ops/upstreams.h). */
static enum MHD_Result get_upstreams(struct admin *a, struct MHD_Connection *c)
{
    struct rt *rt = rt_cell_get(&a->px->cell);
    uint64_t now = loop_now(a->loop); /* the workers' clock: CLOCK_MONOTONIC */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t wall_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    json_t *j = upstreams_json(rt, now, wall_ms);
    rt_unref(rt);
    return reply_json(c, MHD_HTTP_OK, j, NULL);
}

static enum MHD_Result post_reload(struct admin *a, struct MHD_Connection *c)
{
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    uint64_t gen;
    enum MHD_Result ret;
    if (reload_force(a->rl, &errs, &gen) == 0) {
        ret = reply_json(c, MHD_HTTP_OK, json_pack("{s:I}", "generation", (json_int_t)gen), NULL);
    } else {
        json_t *list = json_array();
        for (size_t i = 0; i < errs.n; i++) {
            /* whole, never cut: a cut in the middle of a UTF-8 character would make jansson
             * drop the line */
            char *line = NULL;
            int n = errs.v[i].line
                        ? asprintf(&line, "%s:%u:%u: %s: %s", reload_source(a->rl), errs.v[i].line,
                                   errs.v[i].col, errs.v[i].path, errs.v[i].msg)
                        : asprintf(&line, "%s: %s: %s", reload_source(a->rl), errs.v[i].path,
                                   errs.v[i].msg);
            json_t *js = n >= 0 ? json_string(line) : NULL;
            json_array_append_new(list,
                                  js ? js : json_string("(an error that could not be shown)"));
            if (n >= 0)
                free(line);
        }
        ret = reply_json(c, MHD_HTTP_UNPROCESSABLE_CONTENT,
                         json_pack("{s:o, s:I}", "errors", list, "generation", (json_int_t)gen),
                         NULL);
    }
    cfg_errs_clear(&errs);
    return ret;
}

/* What kubelet probes and Prometheus scrapes need, served to every client. */
static const char *const public_paths[] = { "/healthz", "/readyz", "/metrics" };

static bool is_loopback(const struct sockaddr *sa)
{
    if (!sa)
        return false;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

bool admin_allows(const struct sockaddr *peer, const char *path)
{
    for (size_t i = 0; i < sizeof(public_paths) / sizeof(public_paths[0]); i++)
        if (strcmp(path, public_paths[i]) == 0)
            return true;
    return is_loopback(peer);
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls)
{
    (void)version;
    (void)upload_data;
    struct admin *a = cls;
    /* Bodies (of a POST /reload, say) are read and ignored; answer once they are in. A client
     * that may not ask is answered at once, with its body left unread. */
    if (!*con_cls) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (!admin_allows(ci ? ci->client_addr : NULL, url))
            return reply_error(c, MHD_HTTP_FORBIDDEN, "forbidden",
                               "only /healthz, /readyz and /metrics answer clients that are not on "
                               "a loopback address",
                               NULL);
        *con_cls = a;
        return MHD_YES;
    }
    /* Back from a suspension for the store (deliveries_admin.h): /metrics renders with the
     * gauges just read, anything else has its answer. */
    bool resumed = *con_cls != a;
    if (resumed && strcmp(url, "/metrics") != 0)
        return dadmin_resumed(c, *con_cls);
    if (*upload_data_size) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    bool post = strcmp(method, "POST") == 0;

    if (dadmin_owns(url))
        return dadmin_answer(a->dl, c, url, method, con_cls);
    if (strcmp(url, "/reload") == 0) {
        if (!post)
            return reply_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed", "use POST",
                               "POST");
        return post_reload(a, c);
    }
    static const char *const gets[] = { "/healthz", "/readyz",   "/metrics",
                                        "/config",  "/schedule", "/upstreams" };
    bool known = false;
    for (size_t i = 0; i < sizeof(gets) / sizeof(gets[0]); i++)
        known |= strcmp(url, gets[i]) == 0;
    if (!known)
        return reply_error(c, MHD_HTTP_NOT_FOUND, "not_found", "no such admin endpoint", NULL);
    if (!get)
        return reply_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed", "use GET",
                           "GET, HEAD");

    if (strcmp(url, "/healthz") == 0)
        return reply_json(c, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"), NULL);
    if (strcmp(url, "/readyz") == 0) {
        bool draining = atomic_load(&a->px->draining);
        return reply_json(c, draining ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK,
                          json_pack("{s:s}", "status", draining ? "draining" : "ready"), NULL);
    }
    if (strcmp(url, "/metrics") == 0) {
        if (!resumed && dadmin_metrics(a->dl, c, con_cls))
            return MHD_YES; /* resumed once the store's counts are in */
        size_t len;
        char *text = metrics_render(a->px->metrics, &len);
        if (!text)
            return MHD_NO;
        return reply_text(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, len,
                          MHD_RESPMEM_MUST_FREE, NULL);
    }
    if (strcmp(url, "/config") == 0)
        return get_config(a, c);
    if (strcmp(url, "/upstreams") == 0)
        return get_upstreams(a, c);
    return get_schedule(a, c);
}

/* The end of a request: the state of one that waited for the store goes. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode why)
{
    (void)c;
    (void)why;
    if (*con_cls && *con_cls != cls)
        dadmin_conn_free(*con_cls);
    *con_cls = NULL;
}

/* Store calls completed and resumed connections: libmicrohttpd runs them now. */
static void kick(void *arg)
{
    struct admin *a = arg;
    MHD_run(a->d);
    schedule_run(a);
}

struct admin *admin_start(struct loop *l, int listen_fd, struct proxy *px, struct reload *rl,
                          struct store *store)
{
    struct admin *a = calloc(1, sizeof(*a));
    if (!a) {
        close(listen_fd);
        return NULL;
    }
    a->loop = l;
    a->px = px;
    a->rl = rl;
    a->dl = dadmin_new(l, store, px, kick, a);
    if (!a->dl) {
        close(listen_fd);
        free(a);
        return NULL;
    }
    /* clang-format off */
    a->d = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME, 0,
                            NULL, NULL, on_access, a,
                            MHD_OPTION_LISTEN_SOCKET, listen_fd,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, a,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
                            MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL,
                            MHD_OPTION_END);
    /* clang-format on */
    const union MHD_DaemonInfo *info =
        a->d ? MHD_get_daemon_info(a->d, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
    if (!info || loop_watch_add(l, &a->watch, info->epoll_fd, EPOLLIN, on_epoll, a) < 0) {
        fputs("retryproxy: cannot start the admin listener\n", stderr);
        if (a->d)
            MHD_stop_daemon(a->d);
        else
            close(listen_fd);
        dadmin_free(a->dl);
        free(a);
        return NULL;
    }
    schedule_run(a);
    return a;
}

void admin_stop(struct admin *a)
{
    if (!a)
        return;
    dadmin_free(a->dl); /* first: it waits for the store's calls and resumes their requests */
    a->dl = NULL;
    MHD_run(a->d);
    loop_watch_del(a->loop, &a->watch);
    loop_timer_stop(a->loop, &a->timer);
    MHD_stop_daemon(a->d);
    free(a);
}
