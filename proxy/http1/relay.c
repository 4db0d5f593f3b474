#include "proxy/http1/relay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "proxy/http/answer.h"
#include "proxy/http/fields.h"
#include "proxy/core/retry.h"
#include "proxy/base/ring.h"
#include "proxy/http1/tunnel.h"
#include "proxy/upstream/tunnel_up.h"
#include "proxy/http1/wiretab.h"

/* libmicrohttpd asks the content reader for at most this much at a time. */
#define READER_BLOCK (32 * 1024)
/* The most the upstream side delivers in one write (libcurl's CURL_MAX_WRITE_SIZE): once the
 * buffer has this much room, a paused upstream may go on. */
#define UPSTREAM_WRITE_MAX (16 * 1024)

/* Response bytes waiting for the client; when full, the upstream is paused (backpressure). */
#define RELAY_BUFFER (64 * 1024)
/* How long a response that fits RELAY_BUFFER is held after its head, to go out whole if it is
 * whole by then (docs/forwarding.md "Responses to the client"): a body that follows its head
 * within the same few reads, not a stream's next part. */
#define RELAY_HOLD_MS 10

/* Relay flags (struct relay 'flags'). */
enum {
    RL_SUSPENDED = 1u << 0,  /* the connection is suspended by us */
    RL_IN_HANDLER = 1u << 1, /* inside the access handler: an answer is queued on leaving */
    RL_BEGUN = 1u << 2,      /* the head went to the core */
    RL_ENDED = 1u << 3,      /* ... and the body's end: the upstream side has the request */
    RL_READER = 1u << 4,     /* suspended because the body reader found nothing to send */
    RL_UPLOAD = 1u << 5,     /* suspended until the upstream takes upload bytes */
    RL_COLLECT = 1u << 6,    /* holding a short body back to answer it in one piece ('hold') */
    RL_DOWN_DONE = 1u << 7,  /* the upstream's body is complete */
    RL_DOWN_FAIL = 1u << 8,  /* ... or broke off: the client must see a truncation */
    RL_GONE = 1u << 9,       /* the client left (relay_conn): no answer goes out */
    RL_HELD = 1u << 10,      /* answered at the head of a bodiless request: queued next call */
};

/* f.answered: an answer is ready ('resp'; NULL: close the connection); f.sent: it was handed
 * to libmicrohttpd. */
struct relay {
    struct front f;
    struct MHD_Connection *conn; /* NULL once libmicrohttpd is done with it */
    struct relay_conn *rc;       /* its watch, while 'conn' is set (NULL: none) */
    struct loop *loop;
    void (*kick)(void *); /* makes libmicrohttpd run this turn (after a resume) */
    void *kick_arg;
    unsigned flags;
    int status;                /* of the streamed response */
    const struct hlist *head;  /* its fields (the core keeps them until the request ends) */
    struct answer_tag tag;     /* what its answer carries */
    struct MHD_Response *resp; /* the answer, until queued */
    size_t resp_len;           /* ... its body when in one piece (read_body() counts the rest) */
    struct ring down;          /* body bytes for the client */
    struct loop_timer hold;    /* RL_COLLECT: its end, RELAY_HOLD_MS after the head */
    struct tunnel_up *tun_up;  /* an upgrade's upstream, until the client has the 101 */
    struct front_tunnel tun_conf;
};

static const struct front_ops relay_ops;

static struct relay *of_front(struct front *f)
{
    return (struct relay *)f;
}

struct relay *relay_new(struct worker *w, struct loop *l, void (*kick)(void *), void *kick_arg,
                        struct MHD_Connection *c, struct relay_conn *rc, const char *raw_target,
                        const char *peer, unsigned peer_port, enum refusal refused)
{
    struct front *f = retry_req_new(w, &relay_ops, sizeof(struct relay), FRONT_HTTP1, raw_target,
                                    peer, peer_port, refused);
    if (!f)
        return NULL;
    struct relay *rl = of_front(f);
    rl->conn = c;
    rl->loop = l;
    rl->kick = kick;
    rl->kick_arg = kick_arg;
    rl->down.max = RELAY_BUFFER;
    if (rc) {
        rl->rc = rc;
        rc->cur = rl;
        if (rc->left)
            rl->flags |= RL_GONE; /* its FIN came with the request, or after an earlier one */
    }
    return rl;
}

static void relay_fini(struct front *f)
{
    loop_timer_stop(of_front(f)->loop, &of_front(f)->hold);
    ring_free(&of_front(f)->down);
    tunnel_up_free(of_front(f)->tun_up); /* the 101 never reached the client */
}

struct each {
    void (*fn)(void *arg, const char *k, size_t kl, const char *v, size_t vl);
    void *arg;
};

static enum MHD_Result each_field(void *cls, enum MHD_ValueKind kind, const char *k, size_t kl,
                                  const char *v, size_t vl)
{
    (void)kind;
    struct each *e = cls;
    e->fn(e->arg, k, kl, v ? v : "", v ? vl : 0);
    return MHD_YES;
}

static enum MHD_Result each_trailer(void *cls, enum MHD_ValueKind kind, const char *k, size_t kl,
                                    const char *v, size_t vl)
{
    (void)kind;
    retry_req_trailer(cls, k, kl, v ? v : "", v ? vl : 0);
    return MHD_YES;
}

static void relay_fields(struct front *f,
                         void (*fn)(void *arg, const char *k, size_t kl, const char *v, size_t vl),
                         void *arg)
{
    struct relay *rl = of_front(f);
    struct each e = { fn, arg };
    MHD_get_connection_values_n(rl->conn, MHD_HEADER_KIND, each_field, &e);
}

/* ---- answers ---- */

/* libmicrohttpd 0.9.75 refuses an empty value: a field with one goes with a lone space, which
 * is optional whitespace that every recipient strips to the same empty value (RFC 9110 5.5,
 * docs/forwarding.md). */
static void add_field(void *resp, const struct hfield *f)
{
    MHD_add_response_header(resp, f->name, *f->value ? f->value : " ");
}

static void add_tag(struct MHD_Response *resp, const struct answer_tag *tag)
{
    if (tag->close)
        MHD_add_response_header(resp, "Connection", "close"); /* no more requests here */
    answer_tag_fields(tag, add_field, resp);
}

/* Resumes the suspended connection (libmicrohttpd looks at it in its next run). */
static void unsuspend(struct relay *rl)
{
    rl->flags &= ~(RL_SUSPENDED | RL_UPLOAD | RL_READER);
    MHD_resume_connection(rl->conn);
}

/* ... and has libmicrohttpd run this turn. */
static void resume(struct relay *rl)
{
    unsuspend(rl);
    rl->kick(rl->kick_arg);
}

static void suspend(struct relay *rl, unsigned why)
{
    rl->flags |= RL_SUSPENDED | why;
    MHD_suspend_connection(rl->conn);
}

/* Makes 'resp' the answer. Inside the access handler it is queued on leaving; otherwise the
 * suspended connection is resumed and libmicrohttpd calls the handler, which queues it. */
static void answer(struct relay *rl, struct MHD_Response *resp, unsigned status)
{
    /* resp NULL (out of memory): closing the connection is the only honest answer left */
    rl->flags &= ~RL_COLLECT;
    loop_timer_stop(rl->loop, &rl->hold);
    rl->resp = resp;
    rl->f.status = status;
    rl->f.answered = true;
    if (!(rl->flags & RL_IN_HANDLER) && (rl->flags & RL_SUSPENDED) && rl->conn)
        resume(rl);
}

static void relay_reset(struct front *f, unsigned status)
{
    answer(of_front(f), NULL, status);
}

/* An error on a gRPC call: a Trailers-Only response, its status in the head (docs/grpc.md). */
static void grpc_error(struct relay *rl, unsigned status, const char *code, const char *message,
                       const struct answer_tag *tag)
{
    struct answer_grpc g;
    answer_grpc_error(code, status, message, &g);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (resp) {
        MHD_add_response_header(resp, "Content-Type", "application/grpc");
        MHD_add_response_header(resp, "grpc-status", g.status);
        MHD_add_response_header(resp, "grpc-message", g.message);
        add_tag(resp, tag);
    }
    answer(rl, resp, 200);
}

static void relay_error(struct front *f, unsigned status, const char *code, const char *route,
                        const char *message, const struct answer_tag *tag)
{
    struct relay *rl = of_front(f);
    if (f->grpc) {
        grpc_error(rl, status, code, message, tag);
        return;
    }
    /* libmicrohttpd frees the body with the response */
    size_t n = 0;
    char *body = answer_error_body(code, route, tag->attempts, message, &n);
    struct MHD_Response *resp =
        body ? MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE) : NULL;
    rl->resp_len = n;
    if (!resp)
        free(body);
    if (resp) {
        MHD_add_response_header(resp, "Content-Type", "application/json");
        add_tag(resp, tag);
    }
    answer(rl, resp, status);
}

/* The upstream's fields but hop-by-hop ones, Content-Length (libmicrohttpd frames the body),
 * ours (X-Request-Id too: the client gets the id the request went up and was logged with, as
 * Envoy's always_set_request_id_in_response does), and any named in a Connection field; then
 * ours. */
static void copy_fields(struct MHD_Response *resp, const struct hlist *h,
                        const struct answer_tag *tag)
{
    fields_down_each(h, tag->request_id != NULL, add_field, resp);
    add_tag(resp, tag);
}

static ssize_t never_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)cls;
    (void)pos;
    (void)buf;
    (void)max;
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

/* Whether the answer has a head that describes a body it does not carry: a response to HEAD,
 * or a 304 (RFC 9110 8.6, 15.4.5). (A 1xx or 204 has neither: libmicrohttpd writes no length.) */
static bool head_only(const struct relay *rl, int status)
{
    return rl->f.is_head || status == 304;
}

/* Such an answer, with the upstream's Content-Length if it sent one and no other (RFC 9112 6.3:
 * nothing follows the head on the wire). libmicrohttpd 0.9.75 writes the response's size as its
 * Content-Length, or for an unknown size goes chunked and sends a last chunk, "0\r\n\r\n",
 * after the head: five stray bytes before the next response on the connection. So the size is
 * the upstream's length, of a body never read; without one, an unknown size that may not go
 * chunked: no length at all, and the connection closes after the head (the only way 0.9.75
 * frames a response without one). */
static struct MHD_Response *head_only_response(int64_t cl)
{
    if (cl >= 0)
        return MHD_create_response_from_callback((uint64_t)cl, 1024, never_read, NULL, NULL);
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1024, never_read, NULL, NULL);
    if (resp &&
        MHD_set_response_options(resp, MHD_RF_HTTP_1_0_COMPATIBLE_STRICT, MHD_RO_END) != MHD_YES) {
        MHD_destroy_response(resp);
        resp = NULL;
    }
    return resp;
}

/* HTTP/1.1 trailers would need a chunked response: they are not relayed (relay_end). */
static void relay_saved(struct front *f, int status, const struct hlist *h, const char *body,
                        size_t len, const struct hlist *trailers, const struct answer_tag *tag)
{
    (void)trailers;
    struct relay *rl = of_front(f);
    struct MHD_Response *resp;
    if (head_only(rl, status))
        resp = head_only_response(hlist_content_length(h));
    else
        resp =
            MHD_create_response_from_buffer(len, body ? (void *)body : "", MHD_RESPMEM_MUST_COPY);
    rl->resp_len = len;
    if (resp)
        copy_fields(resp, h, tag);
    answer(rl, resp, (unsigned)status);
}

/* ---- the response body ---- */

static void release_reader(void *cls)
{
    struct relay *rl = cls;
    retry_req_release(rl->f.req);
}

static void resume_reader(struct relay *rl)
{
    if ((rl->flags & RL_READER) && (rl->flags & RL_SUSPENDED) && rl->conn)
        resume(rl);
}

/* libmicrohttpd wants body bytes for the client. With none buffered and the upstream still
 * sending, the connection is suspended until more come (returning 0 alone would make
 * libmicrohttpd call again at once, a busy loop). */
static ssize_t read_body(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct relay *rl = cls;
    if (rl->flags & RL_GONE)
        return MHD_CONTENT_READER_END_WITH_ERROR; /* nobody to send it to (hang_up) */
    if (rl->down.len) {
        size_t n = ring_get(&rl->down, buf, max);
        rl->f.body_sent += n;
        if (ring_space(&rl->down) >= UPSTREAM_WRITE_MAX)
            retry_req_room(rl->f.req);
        return (ssize_t)n;
    }
    if (rl->flags & RL_DOWN_FAIL)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    if (rl->flags & RL_DOWN_DONE)
        return MHD_CONTENT_READER_END_OF_STREAM;
    if (rl->conn)
        suspend(rl, RL_READER);
    return 0;
}

/* Answers with the response whose head is in, its body read through read_body(). */
static void start_streaming(struct relay *rl)
{
    int64_t cl = hlist_content_length(rl->head);
    uint64_t size = MHD_SIZE_UNKNOWN;
    if (cl >= 0 && answer_status_has_body(rl->status))
        size = (uint64_t)cl;
    struct MHD_Response *resp;
    if (head_only(rl, rl->status)) {
        resp = head_only_response(cl);
    } else {
        resp = MHD_create_response_from_callback(size, READER_BLOCK, read_body, rl, release_reader);
        if (resp)
            retry_req_hold(rl->f.req); /* the reader's, until release_reader() */
    }
    if (resp)
        copy_fields(resp, rl->head, &rl->tag);
    answer(rl, resp, (unsigned)rl->status);
}

/* The whole body is in the buffer: answer with it in one piece (libmicrohttpd writes headers
 * and body together), handing the buffer over rather than copying it. */
static void answer_collected(struct relay *rl)
{
    struct MHD_Response *resp;
    if (head_only(rl, rl->status)) {
        resp = head_only_response(hlist_content_length(rl->head));
    } else if (rl->down.start == 0 && rl->down.buf) {
        resp = MHD_create_response_from_buffer(rl->down.len, rl->down.buf, MHD_RESPMEM_MUST_FREE);
        if (resp)
            rl->down.buf = NULL;
    } else {
        resp = MHD_create_response_from_buffer(rl->down.len, (void *)"", MHD_RESPMEM_PERSISTENT);
    }
    rl->resp_len = rl->down.len;
    rl->down.len = 0;
    if (resp)
        copy_fields(resp, rl->head, &rl->tag);
    answer(rl, resp, (unsigned)rl->status);
}

/* The hold is over and the body is not whole yet: what came goes now, the rest as it comes. */
static void on_hold_over(struct loop_timer *t)
{
    struct relay *rl = t->arg;
    if ((rl->flags & RL_COLLECT) && !rl->f.answered)
        start_streaming(rl);
}

/* Whether the upstream asks for its response to go out as it comes, never held: a Server-Sent
 * Events stream (text/event-stream), or X-Accel-Buffering: no, the field nginx reads for it
 * (docs/forwarding.md "Responses to the client"). */
static bool wants_streaming(const struct hlist *h)
{
    static const char sse[] = "text/event-stream";
    const char *ct = hlist_get(h, "Content-Type");
    const char *xab = hlist_get(h, "X-Accel-Buffering");
    if (ct) {
        ct += strspn(ct, " \t");
        size_t n = strcspn(ct, "; \t");
        if (n == sizeof(sse) - 1 && strncasecmp(ct, sse, n) == 0)
            return true;
    }
    return xab && strcasecmp(xab, "no") == 0;
}

/* A response whose body fits the buffer is held for RELAY_HOLD_MS, to go out in one piece
 * with its length (libmicrohttpd writes the head and a whole body together) if it is complete
 * by then: what holding buys, since a response whose head has gone to the front end is the
 * answer, never retried. Any other streams at once. */
static void relay_response(struct front *f, int status, const struct hlist *h,
                           const struct answer_tag *tag)
{
    struct relay *rl = of_front(f);
    rl->status = status;
    rl->head = h;
    rl->tag = *tag;
    int64_t cl = hlist_content_length(h);
    if (!answer_status_has_body(status)) {
        /* 1xx, 204 and 304 have no body whatever the upstream sends (RFC 9112 6.3): answered
         * once the transfer ends, with none */
        rl->flags |= RL_COLLECT;
    } else if (!rl->f.is_head && (cl < 0 || (uint64_t)cl <= RELAY_BUFFER) && !wants_streaming(h)) {
        rl->flags |= RL_COLLECT;
        loop_timer_start(rl->loop, &rl->hold, loop_now(rl->loop) + RELAY_HOLD_MS, on_hold_over, rl);
        if (cl > 0 && !rl->down.buf && (rl->down.buf = malloc((size_t)cl)) != NULL)
            rl->down.cap = (size_t)cl;
    } else {
        start_streaming(rl);
    }
}

static size_t relay_body(struct front *f, const char *p, size_t n)
{
    struct relay *rl = of_front(f);
    if (!rl->conn)
        return 0;
    if (!answer_status_has_body(rl->status))
        return n; /* never relayed */
    if ((rl->flags & RL_COLLECT) && n > ring_space(&rl->down))
        start_streaming(rl); /* too large to answer in one piece */
    if (n > ring_space(&rl->down))
        return FRONT_FULL;
    if (ring_put(&rl->down, p, n) < 0)
        return 0;
    resume_reader(rl);
    return n;
}

/* ---- upgrades (docs/upgrades.md) ---- */

struct upgraded {
    struct MHD_UpgradeResponseHandle *urh;
    void (*kick)(void *);
    void *kick_arg;
};

/* The tunnel ended: libmicrohttpd closes the client's socket in its next run. */
static void close_upgraded(void *arg)
{
    struct upgraded *u = arg;
    MHD_upgrade_action(u->urh, MHD_UPGRADE_ACTION_CLOSE);
    u->kick(u->kick_arg);
    free(u);
}

/* The client has the 101: the connection is the tunnel's. */
static void on_upgraded(void *cls, struct MHD_Connection *c, void *con_cls, const char *extra_in,
                        size_t extra_in_size, MHD_socket sock,
                        struct MHD_UpgradeResponseHandle *urh)
{
    (void)c;
    (void)con_cls;
    struct relay *rl = cls;
    struct tunnel_up *up = rl->tun_up;
    rl->tun_up = NULL;
    /* Bytes the client sent before it had the 101 go first, but only those the framing check
     * passed (libmicrohttpd's extra_in): bytes it holds or refused end the tunnel at once,
     * never reaching the upstream (docs/upgrades.md). */
    struct upgraded *u = wiretab_quiet(sock) ? malloc(sizeof(*u)) : NULL;
    if (!u || !up) {
        free(u);
        tunnel_up_free(up);
        MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
        return;
    }
    *u = (struct upgraded){ urh, rl->kick, rl->kick_arg };
    if (rl->rc)
        relay_conn_close(rl->rc); /* the tunnel watches the socket in the same loop */
    struct tunnel_client tc = { sock, extra_in, extra_in_size, close_upgraded, u };
    tunnel_open(rl->loop, &tc, up, &rl->tun_conf);
}

/* The 101 with the upstream's fields: Upgrade as it came (a hop-by-hop field the answer must
 * carry), the others as for any response; libmicrohttpd adds Connection: Upgrade. */
static void relay_upgrade(struct front *f, const struct hlist *h, const struct answer_tag *tag,
                          struct tunnel_up *up, const struct front_tunnel *conf)
{
    struct relay *rl = of_front(f);
    rl->tun_up = up;
    rl->tun_conf = *conf;
    struct MHD_Response *resp = MHD_create_response_for_upgrade(on_upgraded, rl);
    if (resp) {
        MHD_add_response_header(resp, "Upgrade", hlist_get(h, "Upgrade"));
        copy_fields(resp, h, tag);
    }
    answer(rl, resp, 101);
}

/* HTTP/1.1 trailers would need a chunked response: they are not relayed. */
static void relay_end(struct front *f, const struct hlist *trailers, bool failed)
{
    (void)trailers;
    struct relay *rl = of_front(f);
    rl->flags |= failed ? RL_DOWN_FAIL : RL_DOWN_DONE;
    if ((rl->flags & RL_COLLECT) && !failed)
        answer_collected(rl);
    else if (rl->flags & RL_COLLECT)
        start_streaming(rl); /* what came, then the truncation */
    else
        resume_reader(rl);
}

/* ---- the access handler ---- */

/* Leaving the access handler: an answer made meanwhile is queued when libmicrohttpd can take
 * one ('can_answer': the call came without upload data), or the connection is suspended while
 * the upstream side has the request. Returns false when the connection must close
 * ('close_now', or no answer could be made). */
static bool leave(struct relay *rl, bool can_answer, bool close_now)
{
    rl->flags &= ~RL_IN_HANDLER;
    if (close_now)
        return false;
    if ((rl->flags & (RL_GONE | RL_ENDED)) == (RL_GONE | RL_ENDED) && !rl->f.answered)
        retry_req_client_gone(rl->f.req); /* it left before the core had the whole request */
    if (rl->f.answered && !rl->f.sent && can_answer) {
        /* Right after the headers (400, 404, 405, 413 by Content-Length) libmicrohttpd then
         * reads none of the body; after the body, the connection may be kept alive. */
        rl->f.sent = true;
        if (!rl->resp)
            return false;
        retry_req_sending(rl->f.req);
        if (!head_only(rl, (int)rl->f.status) && answer_status_has_body((int)rl->f.status))
            rl->f.body_sent += rl->resp_len; /* libmicrohttpd writes it all, or closes */
        enum MHD_Result ret = MHD_queue_response(rl->conn, rl->f.status, rl->resp);
        MHD_destroy_response(rl->resp);
        rl->resp = NULL;
        return ret == MHD_YES;
    }
    if (!rl->f.answered && !(rl->flags & RL_SUSPENDED) && (rl->flags & RL_ENDED))
        suspend(rl, 0); /* the upstream side has the request: nothing to do until it answers */
    return true;
}

/* Whether the request has no body (the framing check let through one framing at most). */
static bool bodiless(struct relay *rl)
{
    const char *cl = MHD_lookup_connection_value(rl->conn, MHD_HEADER_KIND, "Content-Length");
    return !MHD_lookup_connection_value(rl->conn, MHD_HEADER_KIND, "Transfer-Encoding") &&
           (!cl || strcmp(cl, "0") == 0);
}

bool relay_access(struct relay *rl, const char *method, const char *upload_data,
                  size_t *upload_data_size)
{
    struct retry_req *r = rl->f.req;
    /* libmicrohttpd takes an answer only on the first call (headers) or once the body is
     * complete, the calls that come without upload data. */
    bool can_answer = *upload_data_size == 0;
    bool close_now = false;
    rl->flags |= RL_IN_HANDLER;
    if (!(rl->flags & RL_BEGUN)) {
        rl->flags |= RL_BEGUN;
        retry_req_head(r, method);
        /* An answer queued on this call makes libmicrohttpd 0.9.75 close the connection after
         * it (it has not read the request's end). With no body to read, the next call comes at
         * once, and the connection stays open for the next request (a 404 no_route, say). */
        if (rl->f.answered && bodiless(rl)) {
            rl->flags |= RL_HELD;
            can_answer = false;
        }
    } else if (rl->flags & RL_HELD) {
        rl->flags &= ~RL_HELD; /* that call: the answer goes */
    } else if (*upload_data_size) {
        size_t took = retry_req_body(r, upload_data, *upload_data_size);
        if (took == RETRY_BODY_CLOSE) {
            close_now = true;
        } else {
            *upload_data_size -= took; /* the core has the rest wait (relay_wait_upload) */
        }
    } else if (!(rl->flags & RL_ENDED)) {
        /* a chunked body's trailers: libmicrohttpd has parsed them by this call, the last */
        rl->flags |= RL_ENDED;
        MHD_get_connection_values_n(rl->conn, MHD_FOOTER_KIND, each_trailer, r);
        retry_req_end(r);
    }
    return leave(rl, can_answer, close_now);
}

static void relay_wait_upload(struct front *f)
{
    suspend(of_front(f), RL_UPLOAD);
}

static void relay_upload_room(struct front *f)
{
    struct relay *rl = of_front(f);
    if ((rl->flags & RL_UPLOAD) && rl->conn)
        resume(rl);
}

/* ---- the client going away ---- */

/* The client left while its answer went out: libmicrohttpd is made to close the connection
 * now, whatever it waits for. Suspended until more of the body comes, it is resumed to find
 * the body broken off (read_body); otherwise it may be waiting to write to a client that reads
 * nothing (a half-close), so the socket is shut down both ways, which it sees at once. */
static void hang_up(struct relay *rl)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(rl->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci)
        shutdown(ci->connect_fd, SHUT_RDWR);
    if (rl->flags & RL_SUSPENDED)
        resume(rl);
    else
        rl->kick(rl->kick_arg);
}

/* The client left while the request was in flight (the core may not have it yet, see leave()):
 * the core cancels what runs for it, then resets it, which closes the connection; or, its
 * answer going out, ends the upstream transfer sending it, and the connection closes now. */
static void client_left(struct relay *rl)
{
    rl->flags |= RL_GONE;
    if (rl->flags & RL_IN_HANDLER)
        return;
    retry_req_client_gone(rl->f.req);
    if (rl->f.sent && rl->conn)
        hang_up(rl);
}

/* A FIN or a reset: the connection only closes after this, so the watch ends here, once. */
static void on_conn_event(struct loop_watch *w, uint32_t events)
{
    (void)events;
    struct relay_conn *rc = w->arg;
    rc->left = true;
    relay_conn_close(rc);
    if (rc->cur)
        client_left(rc->cur);
}

void relay_conn_open(struct relay_conn *rc, struct loop *l, int fd)
{
    *rc = (struct relay_conn){ .loop = l };
    rc->w.fd = -1;
    loop_watch_add(l, &rc->w, fd, EPOLLRDHUP | EPOLLET, on_conn_event, rc);
}

void relay_conn_close(struct relay_conn *rc)
{
    loop_watch_del(rc->loop, &rc->w);
}

void relay_conn_stop(struct relay_conn *rc)
{
    struct relay *rl = rc->cur;
    if (!rl || !rl->conn || !(rl->flags & RL_SUSPENDED))
        return;
    rl->flags |= RL_GONE; /* read_body() ends the body broken off */
    unsuspend(rl);        /* no kick: MHD_stop_daemon() follows at once and completes it */
}

/* The connection's socket is watched all along (relay_conn): a backoff wait needs nothing more. */
static void relay_watch(struct front *f)
{
    (void)f;
}

void relay_completed(struct relay *rl)
{
    loop_timer_stop(rl->loop, &rl->hold);
    if (rl->rc && rl->rc->cur == rl)
        rl->rc->cur = NULL;
    rl->rc = NULL;
    rl->conn = NULL;
    if (rl->resp && !rl->f.sent)
        MHD_destroy_response(rl->resp); /* its reader's reference is released here */
    rl->resp = NULL;
    retry_req_completed(rl->f.req);
}

static const struct front_ops relay_ops = { .fields = relay_fields,
                                            .error = relay_error,
                                            .saved = relay_saved,
                                            .response = relay_response,
                                            .upgrade = relay_upgrade,
                                            .body = relay_body,
                                            .end = relay_end,
                                            .reset = relay_reset,
                                            .wait_upload = relay_wait_upload,
                                            .upload_room = relay_upload_room,
                                            .watch = relay_watch,
                                            .unwatch = relay_watch,
                                            .fini = relay_fini };
