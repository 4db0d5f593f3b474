#include "proxy/http1/server.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "proxy/http1/accept.h"
#include "proxy/base/dlist.h"
#include "proxy/http2/h2front.h"
#include "proxy/base/loop.h"
#include "proxy/http1/relay.h"
#include "proxy/core/retry.h"
#include "proxy/http1/tunnel.h"
#include "proxy/http1/wire.h"
#include "proxy/http1/wiretab.h"
#include "proxy/core/worker.h"

/* libmicrohttpd's per-connection memory holds the request head, one record per header, and
 * the response head being written; it is zeroed after every request, so a kept-alive
 * connection holds all of it. Twice limits.max_header_bytes leaves room for a head of that
 * size with its records and a response head; never less than CONN_MEMORY_MIN. */
#define CONN_MEMORY_MIN (16 * 1024)
/* How often the worker looks for request heads past limits.header_timeout_ms, and for freed
 * replay buffers worth giving back to the system. */
#define SWEEP_MS   250
#define TRIM_BYTES (1024 * 1024)
/* A burst is over when this many connections, requests and upstream transfers fewer are alive
 * than at the busiest moment since the last trim, or when at most a quarter of that many are
 * (from TRIM_LOW on: the tail of a burst, however large, is given back too): what they used
 * is given back. Under a steady load the count falls neither that far nor that low, and
 * nothing is trimmed. */
#define TRIM_DROP 512
#define TRIM_LOW  64

/* A client connection: its framing state (proxy/http1/wire.h), on the server's list. */
struct client {
    struct wire wire;
    struct client *prev, *next;
    int fd;
    char peer[INET6_ADDRSTRLEN]; /* the client's address, for X-Forwarded-For */
    struct relay_conn rc;        /* its socket watched for the client leaving */
    unsigned port;               /* and its port (the log) */
};

struct server {
    struct worker *w;
    struct MHD_Daemon *d;
    struct acceptor *acc; /* the listening socket and the first bytes of each connection */
    struct h2front *h2;   /* the HTTP/2 connections */
    struct loop_watch watch;
    struct loop_timer timer;
    struct loop_timer sweep;
    struct client *clients;
    uint32_t head_max; /* limits.max_header_bytes at start */
    unsigned conns;    /* HTTP/1.1 connections open (libmicrohttpd's) */
    size_t busiest;    /* most connections (of either protocol, or not yet known) + requests +
                        * transfers alive since the last trim */
    unsigned closed;   /* connections closed since the sweep was last brought forward */
    bool relisten;     /* a connection closed: the acceptor may take another */
};

/* Returns glibc's free heap memory to the system. In a sanitizer build the heap is the
 * sanitizer's, so there is nothing for malloc_trim() to give back, and glibc's arena code run
 * beside it has aborted a worker thread at exit ("a->attached_threads > 0"): skipped there. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define heap_trim() ((void)0)
#else
#define heap_trim() malloc_trim(0)
#endif

static void schedule(struct server *s);
static void h2_closed(void *arg);
static void on_timer(struct loop_timer *t);
static void server_kick(struct server *s);

static void run(struct server *s)
{
    MHD_run(s->d);
    if (s->relisten) {
        /* Told here, after libmicrohttpd's run: an accepted connection may be handed to it. */
        s->relisten = false;
        if (s->acc)
            accept_closed(s->acc);
    }
    schedule(s);
}

static void on_timer(struct loop_timer *t)
{
    run(t->arg);
}

static void on_epoll(struct loop_watch *w, uint32_t events)
{
    (void)events;
    run(w->arg);
}

/* libmicrohttpd's own timeouts (idle connections) become a loop timer. */
static void schedule(struct server *s)
{
    MHD_UNSIGNED_LONG_LONG ms;
    struct loop *l = s->w->loop;
    if (MHD_get_timeout(s->d, &ms) == MHD_YES)
        loop_timer_start(l, &s->timer, loop_now(l) + ms, on_timer, s);
    else
        loop_timer_stop(l, &s->timer);
}

/* Has libmicrohttpd run at the end of this loop turn. Needed after MHD_resume_connection():
 * in external-epoll mode libmicrohttpd has no inter-thread channel to wake itself. The relay
 * (proxy/http1/relay.h) calls it through the worker's 'kick'. */
static void server_kick(struct server *s)
{
    struct loop *l = s->w->loop;
    loop_timer_start(l, &s->timer, loop_now(l), on_timer, s);
}

static void kick(void *s)
{
    server_kick(s);
}

/* A head held past its deadline: the read side is shut so that libmicrohttpd reads once more,
 * and that read hands it the stand-in that the access handler answers 408 (proxy/http1/wire.h). */
static void on_sweep(struct loop_timer *t)
{
    struct server *s = t->arg;
    struct loop *l = s->w->loop;
    uint64_t now = loop_now(l);
    for (struct client *cl = s->clients; cl; cl = cl->next)
        if (wire_head_expired(&cl->wire, now)) {
            cl->wire.expired = true;
            shutdown(cl->fd, SHUT_RD);
        }
    /* glibc keeps freed heap memory for reuse; after a burst (of connections, of requests
     * waiting, of buffered uploads) it is returned to the system */
    size_t alive = s->conns + (s->h2 ? h2front_count(s->h2) : 0) +
                   (s->acc ? accept_pending(s->acc) : 0) + worker_load(s->w);
    if (alive > s->busiest)
        s->busiest = alive;
    if (s->w->body_freed >= TRIM_BYTES || s->busiest - alive >= TRIM_DROP ||
        (s->busiest >= TRIM_LOW && alive <= s->busiest / 4)) {
        s->w->body_freed = 0;
        s->busiest = alive;
        worker_trim(s->w);
        if (s->h2)
            h2front_trim(s->h2);
        heap_trim();
    }
    loop_timer_start(l, &s->sweep, now + SWEEP_MS, on_sweep, s);
}

/* The client's address as text, and its port, once per connection. */
static void peer_address(struct MHD_Connection *c, struct client *cl)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    cl->peer[0] = '\0';
    if (ci && ci->client_addr) {
        accept_peer_text(ci->client_addr, cl->peer, sizeof(cl->peer));
        cl->port = accept_peer_port(ci->client_addr);
    }
}

static void client_open(struct server *s, struct MHD_Connection *c, void **socket_context)
{
    struct worker *w = s->w;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct client *cl = calloc(1, sizeof(*cl));
    *socket_context = NULL;
    if (cl)
        wire_init(&cl->wire, w->rt->cfg->header_timeout_ms, s->head_max);
    if (!cl || !ci || wiretab_attach(ci->connect_fd, &cl->wire) < 0) {
        /* unchecked bytes never reach libmicrohttpd: this connection reads nothing */
        if (ci)
            shutdown(ci->connect_fd, SHUT_RDWR);
        free(cl);
        return;
    }
    *socket_context = cl;
    cl->fd = ci->connect_fd; /* its send buffer is sized already (proxy/http1/accept.c) */
    peer_address(c, cl);
    relay_conn_open(&cl->rc, w->loop, cl->fd);
    DLIST_PUSH(s->clients, cl);
}

static void client_close(struct server *s, void **socket_context)
{
    struct client *cl = *socket_context;
    if (!cl)
        return;
    wiretab_detach(cl->fd); /* before libmicrohttpd closes the descriptor */
    relay_conn_close(&cl->rc);
    wire_release(&cl->wire);
    DLIST_UNLINK(s->clients, cl);
    free(cl);
    *socket_context = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct server *s = cls;
    struct worker *w = s->w;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        s->conns++;
        metrics_connections_add(w->px->metrics, w->id, 1);
        client_open(s, c, socket_context);
        /* The idle timeout of the snapshot in force when the connection opened: a reload
         * changes it for new connections. */
        unsigned ms = w->rt->cfg->connection_timeout_ms;
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (ms + 999) / 1000);
    } else {
        client_close(s, socket_context);
        s->relisten = true;
        s->conns--;
        metrics_connections_add(w->px->metrics, w->id, -1);
        /* many connections closing at once: look at the memory now rather than at the next
         * sweep, so that their buffers go back before the burst's end piles up more */
        if (++s->closed >= TRIM_DROP) {
            s->closed = 0;
            loop_timer_start(w->loop, &s->sweep, loop_now(w->loop), on_sweep, s);
        }
    }
}

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
    /* Every head libmicrohttpd parses passes here once, in order: the framing check tells
     * whether this one stands in for a head it refused. */
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct client *cl = ci ? ci->socket_context : NULL;
    enum refusal refused = cl ? wire_take_reject(&cl->wire) : REFUSE_NONE;
    struct worker *w = cls;
    return relay_new(w, w->loop, w->kick, w->kick_arg, c, cl ? &cl->rc : NULL, uri,
                     cl ? cl->peer : "", cl ? cl->port : 0, refused);
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls)
{
    (void)cls;
    (void)c;
    (void)url;
    (void)version;
    if (!*con_cls)
        return MHD_NO; /* out of memory at the request line */
    return relay_access(*con_cls, method, upload_data, upload_data_size) ? MHD_YES : MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    if (*con_cls)
        relay_completed(*con_cls);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    /* libmicrohttpd reports client misbehaviour (bad requests, resets) here; each is
     * answered or closed already, so only debugging wants them. */
    if (getenv("RETRYPROXY_DEBUG_MHD")) {
        fputs("retryproxy: libmicrohttpd: ", stderr);
        vfprintf(stderr, fmt, ap);
    }
}

/* ---- the connections the acceptor hands over ---- */

static unsigned acc_open(void *arg)
{
    struct server *s = arg;
    return s->conns + h2front_count(s->h2);
}

static void acc_limits(void *arg, struct accept_limits *lim)
{
    const struct cfg *c = ((struct server *)arg)->w->rt->cfg;
    lim->header_timeout_ms = c->header_timeout_ms;
    lim->idle_ms = c->connection_timeout_ms;
    lim->send_buffer = c->send_buffer_bytes;
}

static void acc_count(void *arg, int delta)
{
    struct worker *w = ((struct server *)arg)->w;
    metrics_connections_add(w->px->metrics, w->id, delta);
}

static void acc_limited(void *arg)
{
    struct worker *w = ((struct server *)arg)->w;
    metrics_connections_limited(w->px->metrics, w->id);
}

static void acc_take(void *arg, enum accept_proto proto, int fd, const struct sockaddr *sa,
                     socklen_t sa_len, const char *peer)
{
    struct server *s = arg;
    struct worker *w = s->w;
    if (proto == ACCEPT_HTTP1) {
        /* counted and watched by libmicrohttpd from here (on_connection); it closes fd if it
         * cannot take it */
        MHD_add_connection(s->d, fd, sa, sa_len);
        server_kick(s);
        return;
    }
    const struct cfg *c = w->rt->cfg;
    struct h2front_limits lim = { c->max_header_bytes, c->connection_timeout_ms };
    acc_count(s, 1);
    if (h2front_open(s->h2, fd, peer, accept_peer_port(sa), &lim) < 0)
        h2_closed(s);
}

static void h2_closed(void *arg)
{
    struct server *s = arg;
    acc_count(s, -1);
    if (s->acc)
        accept_closed(s->acc);
}

static const struct accept_ops accept_ops = { .open = acc_open,
                                              .limits = acc_limits,
                                              .count = acc_count,
                                              .limited = acc_limited,
                                              .take = acc_take };

static struct server *server_start(struct worker *w, int listen_fd, const struct cfg *c)
{
    const char *failed = "start";
    struct server *s = calloc(1, sizeof(*s));
    if (!s)
        goto fail;
    s->w = w;
    w->kick = kick;
    w->kick_arg = s;
    s->head_max = c->max_header_bytes;
    size_t conn_memory = 2 * (size_t)c->max_header_bytes;
    if (conn_memory < CONN_MEMORY_MIN)
        conn_memory = CONN_MEMORY_MIN;
    /* libmicrohttpd counts connection timeouts in whole seconds. */
    unsigned timeout_s = (c->connection_timeout_ms + 999) / 1000;
    /* clang-format off */
    /* The worker accepts connections itself (proxy/http1/accept.c) and hands libmicrohttpd the
     * HTTP/1.1 ones. */
    s->d = MHD_start_daemon(MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                            MHD_USE_NO_LISTEN_SOCKET | MHD_ALLOW_UPGRADE, 0,
                            NULL, NULL, on_access, w,
                            MHD_OPTION_URI_LOG_CALLBACK, on_uri, w,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, w,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_CONNECTION_TIMEOUT, timeout_s,
                            MHD_OPTION_CONNECTION_LIMIT, w->conn_limit,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, conn_memory,
                            MHD_OPTION_STRICT_FOR_CLIENT, 1,
                            MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
                            MHD_OPTION_END);
    /* clang-format on */
    if (!s->d)
        goto fail;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_EPOLL_FD);
    if (!info || loop_watch_add(w->loop, &s->watch, info->epoll_fd, EPOLLIN, on_epoll, s) < 0) {
        failed = "watch";
        goto fail;
    }
    if (!(s->h2 = h2front_new(w, w->loop, h2_closed, s))) {
        failed = "start HTTP/2 for";
        goto fail;
    }
    s->acc = accept_new(w->loop, listen_fd, w->conn_limit, &accept_ops, s);
    listen_fd = -1; /* the acceptor's, started or not */
    if (!s->acc) {
        failed = "accept for";
        goto fail;
    }
    schedule(s);
    loop_timer_start(w->loop, &s->sweep, loop_now(w->loop) + SWEEP_MS, on_sweep, s);
    return s;
fail:
    fprintf(stderr, "retryproxy: worker %u: cannot %s the HTTP server\n", w->id, failed);
    if (listen_fd >= 0)
        close(listen_fd);
    if (s && s->d) {
        loop_watch_del(w->loop, &s->watch);
        loop_timer_stop(w->loop, &s->timer);
        MHD_stop_daemon(s->d);
    }
    if (s)
        h2front_free(s->h2);
    free(s);
    return NULL;
}

static void server_quiesce(struct server *s)
{
    /* Closing the listening socket stops this worker's share of the port from accepting (the
     * kernel refuses new connections once every worker's is closed); HTTP/2 connections get
     * a GOAWAY. */
    accept_quiesce(s->acc);
    h2front_drain(s->h2);
    server_kick(s);
}

static void server_stop(struct server *s)
{
    if (!s)
        return;
    accept_free(s->acc);
    s->acc = NULL;
    h2front_free(s->h2); /* completes the HTTP/2 requests */
    loop_watch_del(s->w->loop, &s->watch);
    loop_timer_stop(s->w->loop, &s->timer);
    loop_timer_stop(s->w->loop, &s->sweep);
    tunnel_close_all(&s->w->tunnels); /* each gives its socket back to libmicrohttpd first */
    for (struct client *cl = s->clients; cl; cl = cl->next)
        relay_conn_stop(&cl->rc); /* libmicrohttpd refuses to stop with one suspended */
    MHD_stop_daemon(s->d);        /* completes every request */
    free(s);
}

static void quiesce(void *s)
{
    server_quiesce(s);
}

/* The drain deadline passed. */
static void expire(void *s)
{
    retry_expire_all(((struct server *)s)->w);
    tunnel_close_all(&((struct server *)s)->w->tunnels); /* docs/upgrades.md "Drain" */
}

static void stop(void *s)
{
    server_stop(s);
}

int server_serve(struct worker *w, int listen_fd)
{
    struct server *s = server_start(w, listen_fd, w->rt->cfg);
    if (!s)
        return -1;
    w->service =
        (struct worker_service){ .arg = s, .quiesce = quiesce, .expire = expire, .stop = stop };
    return 0;
}
