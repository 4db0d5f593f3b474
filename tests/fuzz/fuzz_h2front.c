/* The HTTP/2 front end (proxy/http2/h2front.h) fed bytes as a client would send them, after the
 * connection preface, over a socket pair in a loop of its own. The request core is a fake one
 * (the retry_req_* calls below): by the request's method it answers at once with an error,
 * streams a response with trailers, keeps a whole one, resets the stream, or takes the upload
 * a few bytes at a time before answering, so that every front_ops call and the upload
 * backpressure are exercised.
 *
 * Invariants:
 *   - every request the front end started is completed once, and only after it started; none
 *     is left when the connection has gone (and ASan finds no leak or bad access);
 *   - no core call comes for a request after it was completed.
 */
/* fuzz-link: proxy/http2/h2front.c proxy/http2/h2stream.c proxy/base/loop.c */
/* fuzz-link: proxy/http/hlist.c proxy/base/ring.c */
/* fuzz-link: proxy/http/answer.c proxy/http/grpc.c proxy/http2/h2guard.c */
/* fuzz-link: proxy/upstream/share.c proxy/http/fields.c proxy/base/pool.c */
#define FUZZ_NAME "fuzz_h2front"
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proxy/http2/h2front.h"
#include "proxy/core/retry.h"
#include "proxy/http/answer.h"
#include "tests/fuzz/fuzz.h"

struct retry_req {
    struct front *f;
    int refs;
    bool completed, headed;
    char method;
    unsigned pauses;
    size_t body;
    struct hlist head, trailers;
};

static size_t live;

struct front *retry_req_new(struct worker *w, const struct front_ops *ops, size_t front_size,
                            enum front_proto proto, const char *raw_target, const char *peer,
                            unsigned peer_port, enum refusal refused)
{
    (void)w;
    (void)raw_target;
    (void)peer;
    (void)peer_port;
    (void)refused;
    struct retry_req *r = calloc(1, sizeof(*r));
    struct front *f = calloc(1, front_size);
    if (!r || !f) {
        free(r);
        free(f);
        return NULL;
    }
    f->ops = ops;
    f->req = r;
    f->proto = proto;
    r->f = f;
    r->refs = 1;
    live++;
    return f;
}

static void release(struct retry_req *r)
{
    if (--r->refs)
        return;
    r->f->ops->fini(r->f);
    hlist_free(&r->head);
    hlist_free(&r->trailers);
    free(r->f);
    free(r);
    live--;
}

static void count_field(void *arg, const char *k, size_t kl, const char *v, size_t vl)
{
    (void)k;
    (void)v;
    *(size_t *)arg += kl + vl;
}

static const struct answer_tag tag = { .attempts = 2, .request_id = "id-1", .throttled = -1 };

/* The answer, by the method's first letter. */
static void answer(struct retry_req *r)
{
    struct front *f = r->f;
    switch (r->method) {
    case 'G':
        hlist_add(&r->head, "Content-Type", 12, "text/plain", 10);
        hlist_add(&r->head, "Connection", 10, "x-hop", 5);
        hlist_add(&r->head, "X-Hop", 5, "1", 1);
        hlist_add(&r->trailers, "grpc-status", 11, "0", 1);
        f->ops->response(f, 200, &r->head, &tag);
        for (int i = 0; i < 3; i++)
            f->ops->body(f, "0123456789abcdef", 16);
        f->ops->end(f, &r->trailers, false);
        break;
    case 'P':
        hlist_add(&r->trailers, "grpc-status", 11, "14", 2);
        f->ops->saved(f, 503, &r->head, "saved", 5, &r->trailers, &tag);
        break;
    case 'H':
        f->ops->response(f, 204, &r->head, &tag);
        f->ops->end(f, NULL, false);
        break;
    case 'D':
        f->ops->reset(f, 502);
        break;
    case 'O':
        f->ops->response(f, 200, &r->head, &tag);
        f->ops->body(f, "part", 4);
        f->ops->end(f, NULL, true);
        break;
    case 'T': /* a gRPC call's error: Trailers-Only */
        f->grpc = true;
        f->ops->error(f, 503, "upstream_unavailable", "r", "no response from any upstream attempt",
                      &tag);
        break;
    default:
        f->ops->error(f, 404, "no_route", NULL, "no route matches this request", &tag);
        break;
    }
}

void retry_req_head(struct retry_req *r, const char *method)
{
    FUZZ_CHECK(!r->completed && !r->headed, "head after completion or twice");
    r->headed = true;
    size_t bytes = 0;
    r->f->ops->fields(r->f, count_field, &bytes);
    r->method = method[0];
    if (r->method == 'C' || r->method == 'G' || r->method == 'D')
        answer(r); /* at once, before any body */
    else if (r->method == 'O')
        r->f->ops->watch(r->f);
}

size_t retry_req_body(struct retry_req *r, const char *data, size_t n)
{
    (void)data;
    FUZZ_CHECK(!r->completed, "body after completion");
    if (r->f->answered)
        return r->body > 100000 ? RETRY_BODY_CLOSE : (r->body += n, n);
    /* a few bytes at a time: the rest waits for upload_room */
    size_t take = n > 7 ? 7 : n;
    r->body += take;
    if (take < n)
        r->f->ops->wait_upload(r->f);
    if (r->body % 3 == 0)
        r->f->ops->upload_room(r->f);
    return take;
}

void retry_req_trailer(struct retry_req *r, const char *k, size_t kl, const char *v, size_t vl)
{
    FUZZ_CHECK(r->headed && !r->completed, "trailer before the head or after completion");
    /* proxy/core/retry.h: the core reads the name as a string */
    FUZZ_CHECK(strlen(k) == kl && strlen(v) == vl, "a trailer not NUL-terminated at its length");
}

void retry_req_end(struct retry_req *r)
{
    FUZZ_CHECK(!r->completed, "end after completion");
    if (!r->f->answered) {
        r->f->ops->unwatch(r->f);
        answer(r);
    }
}

void retry_req_completed(struct retry_req *r)
{
    FUZZ_CHECK(r->headed && !r->completed, "completed before its head, or twice");
    r->completed = true;
    release(r);
}

void retry_req_client_gone(struct retry_req *r)
{
    FUZZ_CHECK(!r->completed, "client gone after completion");
    r->f->ops->reset(r->f, 499);
}

void retry_req_sending(struct retry_req *r)
{
    FUZZ_CHECK(!r->completed, "sending after completion");
}

/* The fake upstream pauses on every other ask, so that both of the front end's ways on are
 * taken: marked full at once, or FRONT_FULL at the next write. */
bool retry_req_pause(struct retry_req *r)
{
    FUZZ_CHECK(!r->completed, "pause after completion");
    r->pauses++;
    return r->pauses % 2 == 0;
}

void retry_req_room(struct retry_req *r)
{
    FUZZ_CHECK(!r->completed, "room after completion");
}

void retry_req_hold(struct retry_req *r)
{
    r->refs++;
}

void retry_req_release(struct retry_req *r)
{
    release(r);
}

void retry_expire_all(struct worker *w)
{
    (void)w;
}

static bool closed;

static void on_closed(void *arg)
{
    (void)arg;
    closed = true;
}

/* Reads what the proxy wrote, frame by frame (the client side's socket never fills). */
static size_t drain_out(int fd, size_t *frame_left)
{
    static uint8_t buf[1 << 16];
    static uint8_t hdr[9];
    static size_t hdr_len;
    size_t total = 0;
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) {
        total += (size_t)n;
        for (ssize_t i = 0; i < n;) {
            if (*frame_left) {
                size_t k = (size_t)(n - i) < *frame_left ? (size_t)(n - i) : *frame_left;
                *frame_left -= k;
                i += (ssize_t)k;
                continue;
            }
            hdr[hdr_len++] = buf[i++];
            if (hdr_len == 9) {
                *frame_left = ((size_t)hdr[0] << 16) | ((size_t)hdr[1] << 8) | hdr[2];
                hdr_len = 0;
            }
        }
    }
    return total;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct loop *l;
    if (!l)
        l = loop_new();
    int sv[2];
    if (!l || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) < 0)
        return 0;
    struct h2front *hf = h2front_new(NULL, l, on_closed, NULL);
    FUZZ_CHECK(hf != NULL, "h2front_new");
    closed = false;
    struct h2front_limits lim = { 4096, 60000 };
    if (write(sv[1], "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24) != 24)
        abort();
    FUZZ_CHECK(h2front_open(hf, sv[0], "192.0.2.1", 40000, &lim) == 0, "h2front_open");
    size_t frame_left = 0, off = 0;
    for (int turns = 0; turns < 200 && !closed; turns++) {
        if (off < size) {
            ssize_t n = write(sv[1], data + off, size - off > 4096 ? 4096 : size - off);
            if (n > 0)
                off += (size_t)n;
        } else if (sv[1] >= 0) {
            shutdown(sv[1], SHUT_WR); /* the client is done: EOF */
        }
        loop_turn(l, 0);
        drain_out(sv[1], &frame_left);
    }
    close(sv[1]);
    for (int turns = 0; turns < 5 && !closed; turns++)
        loop_turn(l, 0);
    h2front_free(hf);
    loop_turn(l, 0); /* the deferred frees */
    FUZZ_CHECK(live == 0, "%zu requests never completed", live);
    return 0;
}
