/* h2hold -- a small h2c upstream (HTTP/2 with prior knowledge, no TLS) for bench/h2peers.sh,
 * about as cheap as nghttpd --no-tls for what the script asks, that can also keep requests
 * waiting without end: the slow upstream of HOLD=N.
 *
 *   h2hold PORT [--stats FILE]
 *
 * Listens on 127.0.0.1:PORT. GET /ok answers 200 with "ok\n" (content-length 3). A POST whose
 * content-type starts with application/grpc (any path) answers, once the request has ended, 200
 * with content-type application/grpc, one 5-byte message ("hello") and grpc-status 0 in the
 * trailers. A path starting with /hold is never answered: the stream stays open until the client
 * resets it or the connection closes; past MAX_HELD such streams in all, more are refused
 * (RST_STREAM REFUSED_STREAM). Anything else answers 404 without a body.
 *
 * With --stats, FILE is rewritten (to FILE.tmp, then renamed) every second with one line:
 * "held=K conns_holding=H conns=C answered=A": the streams held open now, the connections that
 * hold at least one, the connections open, and the requests answered so far.
 *
 * One thread, one epoll loop, level-triggered. A connection reads up to 16 KiB per recv (again
 * while the socket filled the buffer), hands it to nghttp2_session_mem_recv, then gathers what
 * nghttp2_session_mem_send has for it into one buffer and writes that with one send.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define READ_SIZE   16384
#define OUT_MAX     (256 * 1024) /* stop gathering past this until the socket takes it */
#define MAX_HELD    100000
#define MAX_STREAMS 1000 /* SETTINGS_MAX_CONCURRENT_STREAMS: room for the held ones */
#define MAX_EVENTS  64

static const uint8_t GRPC_MSG[] = { 0, 0, 0, 0, 5, 'h', 'e', 'l', 'l', 'o' };
static const uint8_t OK_BODY[] = "ok\n";

enum kind { K_OTHER, K_OK, K_GRPC, K_HOLD };

struct conn;

/* A request's state, from its HEADERS to its close; on its connection's list so that closing
 * the connection frees what nghttp2_session_del would not tell about. */
struct stream {
    struct stream *prev, *next;
    struct conn *c;
    int32_t id;
    bool post, grpc_type, held;
    enum kind kind;
    size_t sent; /* body bytes handed to nghttp2 */
};

struct conn {
    int fd;
    bool want_out; /* EPOLLOUT registered */
    nghttp2_session *s;
    struct stream *streams;
    long held;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
};

static int ep;
static long held_all, conns_holding, conns_open, answered;
static struct stream *free_streams; /* freed streams kept for reuse */

static struct stream *stream_new(struct conn *c, int32_t id)
{
    struct stream *st = free_streams;
    if (st)
        free_streams = st->next;
    else if (!(st = malloc(sizeof(*st))))
        return NULL;
    memset(st, 0, sizeof(*st));
    st->c = c;
    st->id = id;
    st->next = c->streams;
    if (c->streams)
        c->streams->prev = st;
    c->streams = st;
    return st;
}

static void unhold(struct stream *st)
{
    if (!st->held)
        return;
    st->held = false;
    held_all--;
    if (--st->c->held == 0)
        conns_holding--;
}

static void stream_free(struct stream *st)
{
    struct conn *c = st->c;
    unhold(st);
    if (st->prev)
        st->prev->next = st->next;
    else
        c->streams = st->next;
    if (st->next)
        st->next->prev = st->prev;
    st->next = free_streams;
    free_streams = st;
}

static bool starts(const uint8_t *v, size_t len, const char *prefix)
{
    size_t n = strlen(prefix);
    return len >= n && memcmp(v, prefix, n) == 0;
}

static int on_begin_headers(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    struct stream *st = stream_new(ud, f->hd.stream_id);
    if (!st)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    nghttp2_session_set_stream_user_data(s, f->hd.stream_id, st);
    return 0;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags, void *ud)
{
    (void)flags;
    (void)ud;
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    struct stream *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
    if (!st)
        return 0;
    if (namelen == 5 && memcmp(name, ":path", 5) == 0) {
        if (starts(value, valuelen, "/hold"))
            st->kind = K_HOLD;
        else if (valuelen == 3 && memcmp(value, "/ok", 3) == 0)
            st->kind = K_OK;
    } else if (namelen == 7 && memcmp(name, ":method", 7) == 0) {
        st->post = valuelen == 4 && memcmp(value, "POST", 4) == 0;
    } else if (namelen == 12 && memcmp(name, "content-type", 12) == 0) {
        st->grpc_type = starts(value, valuelen, "application/grpc");
    }
    return 0;
}

static ssize_t read_body(nghttp2_session *s, int32_t id, uint8_t *buf, size_t length,
                         uint32_t *flags, nghttp2_data_source *src, void *ud)
{
    (void)ud;
    struct stream *st = src->ptr;
    const uint8_t *body = st->kind == K_GRPC ? GRPC_MSG : OK_BODY;
    size_t len = st->kind == K_GRPC ? sizeof(GRPC_MSG) : sizeof(OK_BODY) - 1;
    size_t n = len - st->sent < length ? len - st->sent : length;
    memcpy(buf, body + st->sent, n);
    st->sent += n;
    if (st->sent < len)
        return (ssize_t)n;
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    if (st->kind == K_GRPC) {
        static const nghttp2_nv trailer[] = {
            { (uint8_t *)"grpc-status", (uint8_t *)"0", 11, 1, NGHTTP2_NV_FLAG_NONE },
        };
        *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
        if (nghttp2_submit_trailer(s, id, trailer, 1) != 0)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    return (ssize_t)n;
}

#define NV(n, v)                                                                                   \
    {                                                                                              \
        (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1, 0                            \
    }

/* The request has ended (or, for /hold, its head is in). */
static void answer(nghttp2_session *s, struct stream *st)
{
    static const nghttp2_nv ok[] = { NV(":status", "200"), NV("content-length", "3") };
    static const nghttp2_nv grpc[] = { NV(":status", "200"),
                                       NV("content-type", "application/grpc") };
    static const nghttp2_nv notfound[] = { NV(":status", "404") };
    nghttp2_data_provider dp = { .source.ptr = st, .read_callback = read_body };
    if (st->kind != K_HOLD && st->post && st->grpc_type)
        st->kind = K_GRPC;
    switch (st->kind) {
    case K_HOLD:
        return;
    case K_OK:
        nghttp2_submit_response(s, st->id, ok, 2, &dp);
        break;
    case K_GRPC:
        nghttp2_submit_response(s, st->id, grpc, 2, &dp);
        break;
    default:
        nghttp2_submit_response(s, st->id, notfound, 1, NULL);
        break;
    }
    answered++;
}

static int on_frame_recv(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
    (void)ud;
    if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA)
        return 0;
    struct stream *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
    if (!st)
        return 0;
    if (st->kind == K_HOLD && f->hd.type == NGHTTP2_HEADERS &&
        f->headers.cat == NGHTTP2_HCAT_REQUEST) {
        if (held_all >= MAX_HELD) {
            nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_REFUSED_STREAM);
            return 0;
        }
        st->held = true;
        held_all++;
        if (st->c->held++ == 0)
            conns_holding++;
        return 0;
    }
    if (f->hd.flags & NGHTTP2_FLAG_END_STREAM)
        answer(s, st);
    return 0;
}

static int on_stream_close(nghttp2_session *s, int32_t id, uint32_t code, void *ud)
{
    (void)code;
    (void)ud;
    struct stream *st = nghttp2_session_get_stream_user_data(s, id);
    if (st)
        stream_free(st);
    return 0;
}

static nghttp2_session_callbacks *callbacks;

static void conn_close(struct conn *c)
{
    while (c->streams)
        stream_free(c->streams);
    nghttp2_session_del(c->s);
    close(c->fd);
    free(c->out);
    free(c);
    conns_open--;
}

static void conn_new(int fd)
{
    static const nghttp2_settings_entry settings[] = {
        { NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, MAX_STREAMS },
    };
    struct conn *c = calloc(1, sizeof(*c));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (!c || nghttp2_session_server_new(&c->s, callbacks, c) != 0) {
        free(c);
        close(fd);
        return;
    }
    c->fd = fd;
    conns_open++;
    nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, settings, 1);
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0)
        conn_close(c);
}

/* Gathers what the session has to send after what is still waiting, and sends it at once.
 * False once the connection is to be closed. */
static bool conn_flush(struct conn *c)
{
    for (;;) {
        while (c->out_len < OUT_MAX) {
            const uint8_t *data;
            ssize_t n = nghttp2_session_mem_send(c->s, &data);
            if (n < 0)
                return false;
            if (n == 0)
                break;
            if (c->out_len + (size_t)n > c->out_cap) {
                size_t cap = c->out_cap ? c->out_cap : 16384;
                while (cap < c->out_len + (size_t)n)
                    cap *= 2;
                uint8_t *p = realloc(c->out, cap);
                if (!p)
                    return false;
                c->out = p;
                c->out_cap = cap;
            }
            memcpy(c->out + c->out_len, data, (size_t)n);
            c->out_len += (size_t)n;
        }
        if (c->out_off == c->out_len)
            break;
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (w < 0)
            return false;
        c->out_off += (size_t)w;
        if (c->out_off < c->out_len)
            break; /* the socket is full: the rest on EPOLLOUT */
        c->out_off = c->out_len = 0;
        if (!nghttp2_session_want_write(c->s))
            break;
    }
    bool pending = c->out_off < c->out_len;
    if (pending != c->want_out) {
        struct epoll_event ev = { .events = EPOLLIN | (pending ? EPOLLOUT : 0), .data.ptr = c };
        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        c->want_out = pending;
    }
    return pending || nghttp2_session_want_read(c->s) || nghttp2_session_want_write(c->s);
}

/* False once the connection is to be closed. */
static bool conn_read(struct conn *c)
{
    static uint8_t buf[READ_SIZE];
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        if (n == 0)
            return false;
        if (nghttp2_session_mem_recv(c->s, buf, (size_t)n) < 0)
            return false;
        if (n < (ssize_t)sizeof(buf))
            return true;
    }
}

static void write_stats(const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fprintf(f, "held=%ld conns_holding=%ld conns=%ld answered=%ld\n", held_all, conns_holding,
            conns_open, answered);
    if (fclose(f) == 0)
        rename(tmp, path);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int listen_on(int port)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 4096) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int main(int argc, char **argv)
{
    const char *stats = NULL;
    char *end = NULL;
    long port = argc >= 2 ? strtol(argv[1], &end, 10) : 0;
    if (argc == 4 && strcmp(argv[2], "--stats") == 0)
        stats = argv[3];
    if (!end || *end || port < 1 || port > 65535 || (argc != 2 && !stats)) {
        fputs("usage: h2hold PORT [--stats FILE]\n", stderr);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int lfd = listen_on((int)port);
    if (lfd < 0) {
        perror("h2hold: listen");
        return 1;
    }
    nghttp2_session_callbacks_new(&callbacks);
    nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(callbacks, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, on_frame_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, on_stream_close);
    ep = epoll_create1(0);
    struct epoll_event lev = { .events = EPOLLIN, .data.ptr = NULL };
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev) != 0) {
        perror("h2hold: epoll");
        return 1;
    }
    if (stats)
        write_stats(stats);
    int64_t next_stats = now_ms() + 1000;
    struct epoll_event evs[MAX_EVENTS];
    for (;;) {
        int timeout = -1;
        if (stats) {
            int64_t left = next_stats - now_ms();
            timeout = left > 0 ? (int)left : 0;
        }
        int n = epoll_wait(ep, evs, MAX_EVENTS, timeout);
        if (n < 0 && errno != EINTR) {
            perror("h2hold: epoll_wait");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (!c) {
                int fd;
                while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0)
                    conn_new(fd);
                continue;
            }
            bool keep = true;
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                keep = conn_read(c);
            if (keep)
                keep = conn_flush(c);
            if (!keep)
                conn_close(c);
        }
        if (stats && now_ms() >= next_stats) {
            write_stats(stats);
            next_stats = now_ms() + 1000;
        }
    }
}
