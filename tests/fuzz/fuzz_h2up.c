/* The HTTP/2 upstream sessions (proxy/upstream/h2up.h) fed bytes as an upstream server would send
 * them, after its SETTINGS, over a Unix socket the pool connects to (an origin's address may be any
 * stream socket), in a loop of its own. Three streams run on the connection: a GET, a POST with
 * a kept body, and a POST whose upload comes in pieces with a pause between; their owners take
 * body bytes, pause, or stop as the input's first byte says, so that every h2up_ops call, the
 * kept bytes of a paused stream and the upload's deferral are exercised.
 *
 * Invariants:
 *   - each stream ends once (done), or is cancelled by its owner; no callback comes after done;
 *   - a stream that ends H2UP_COMPLETE had its final head (any status but 1xx) reported
 *     once, before any body byte; no body byte comes before the head; a head its owner
 *     refuses (a status outside 100-599) ends the stream H2UP_BROKEN, with no body byte;
 *   - everything is freed (ASan finds no leak or bad access), and no connection is counted open
 *     once the pool is gone.
 */
/* fuzz-link: proxy/upstream/h2up.c proxy/upstream/h2up_conn.c proxy/upstream/connect.c */
/* fuzz-link: proxy/base/loop.c proxy/http/hlist.c */
/* fuzz-link: proxy/upstream/tls.c proxy/base/pool.c */
/* fuzz-link: proxy/telemetry/log.c proxy/upstream/origin.c */
#define FUZZ_NAME "fuzz_h2up"
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "proxy/upstream/connect.h"
#include "proxy/upstream/h2up.h"
#include "proxy/upstream/origin.h"
#include "tests/fuzz/fuzz.h"

#define STREAMS 3

struct owner {
    struct h2up_stream *s;
    struct hlist head, trailers;
    int status;
    unsigned mode; /* 0: take all, 1: pause every other offer, 2: stop at the third */
    unsigned offers, uploads;
    bool headed, refused, done, body_paused, upload_paused;
};

static struct owner owners[STREAMS];

/* Refuses a status outside 100-599, as proxy/upstream/h2up_attempt.c does. */
static bool on_head(void *arg, int status)
{
    struct owner *o = arg;
    FUZZ_CHECK(!o->done && !o->headed && !o->refused, "head after done, or twice");
    FUZZ_CHECK(status >= 0 && status <= 999 && status / 100 != 1, "final head with status %d",
               status);
    if (status < 100 || status > 599) {
        o->refused = true;
        return false;
    }
    o->headed = true;
    o->status = status;
    return true;
}

static size_t on_body(void *arg, const char *p, size_t n)
{
    (void)p;
    struct owner *o = arg;
    FUZZ_CHECK(!o->done && o->headed, "body after done, or before the head");
    o->offers++;
    if (o->mode == 1 && o->offers % 2 == 0) {
        o->body_paused = true;
        return H2UP_PAUSE;
    }
    if (o->mode == 2 && o->offers >= 3)
        return 0;
    return n;
}

static size_t on_upload(void *arg, char *buf, size_t max)
{
    struct owner *o = arg;
    FUZZ_CHECK(!o->done, "upload after done");
    o->uploads++;
    if (o->uploads == 2) {
        o->upload_paused = true;
        return H2UP_PAUSE;
    }
    if (o->uploads > 4)
        return 0;
    size_t n = max < 10 ? max : 10;
    memset(buf, 'u', n);
    return n;
}

static void on_done(void *arg, enum h2up_end end, uint32_t error)
{
    (void)error;
    struct owner *o = arg;
    FUZZ_CHECK(!o->done, "done twice");
    FUZZ_CHECK(end != H2UP_COMPLETE || o->headed, "complete without a head");
    FUZZ_CHECK(end == H2UP_BROKEN || !o->refused, "a refused head ended %d", (int)end);
    o->done = true;
    o->s = NULL;
}

static const struct h2up_ops ops = { on_head, on_body, on_upload, on_done };

/* The socket the pool connects to, made once per process. */
static int listener(struct origin *o)
{
    static int fd = -1;
    static struct sockaddr_un sun;
    if (fd < 0) {
        sun.sun_family = AF_UNIX;
        snprintf(sun.sun_path, sizeof(sun.sun_path), "/tmp/fuzz_h2up-%d.sock", (int)getpid());
        unlink(sun.sun_path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fd < 0 || bind(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 || listen(fd, 16) < 0)
            abort();
    }
    memcpy(&o->addr, &sun, sizeof(sun));
    o->addr_len = sizeof(sun);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct loop *l;
    if (!l)
        l = loop_new();
    struct origin *o = calloc(1, sizeof(*o));
    if (!l || !o)
        abort();
    o->authority = strdup("upstream.test");
    o->host = strdup("upstream.test");
    o->key = strdup("fuzz");
    int ls = listener(o);
    static struct metrics_h2up counts;
    static struct connect_side cs;
    cs.loop = l;
    struct h2up *h = h2up_new(&cs, &counts);
    FUZZ_CHECK(h != NULL, "h2up_new");
    unsigned modes = size ? data[0] : 0;
    static const struct h2up_field field = { "x-fuzz", "1", 6, 1 };
    const struct h2up_req reqs[STREAMS] = {
        { .method = "GET",
          .path = "/a",
          .authority = "upstream.test",
          .fields = &field,
          .n_fields = 1 },
        { .method = "POST", .path = "/b", .authority = "upstream.test", .buf = "hello", .len = 5 },
        { .method = "POST", .path = "/c", .authority = "upstream.test", .has_body = true },
    };
    for (int i = 0; i < STREAMS; i++) {
        owners[i] = (struct owner){ .mode = (modes >> (2 * i)) % 3 };
        owners[i].s = h2up_start(h, o, &reqs[i], 1000, &ops, &owners[i], &owners[i].head,
                                 &owners[i].trailers);
        FUZZ_CHECK(owners[i].s != NULL, "h2up_start");
    }
    loop_turn(l, 0); /* connects */
    int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
    if (fd >= 0) {
        static const uint8_t settings[9] = { 0, 0, 0, 4, 0, 0, 0, 0, 0 };
        if (send(fd, settings, sizeof(settings), MSG_NOSIGNAL) != sizeof(settings))
            abort();
    }
    size_t off = size ? 1 : 0;
    for (int turn = 0; turn < 200 && fd >= 0; turn++) {
        if (off < size) {
            ssize_t n = send(fd, data + off, size - off > 1024 ? 1024 : size - off, MSG_NOSIGNAL);
            if (n > 0)
                off += (size_t)n;
            else if (errno != EAGAIN)
                off = size; /* the pool closed the connection */
        } else {
            shutdown(fd, SHUT_WR);
        }
        loop_turn(l, 0);
        uint8_t sink[1 << 16];
        while (read(fd, sink, sizeof(sink)) > 0) {
        }
        bool all_done = true;
        for (int i = 0; i < STREAMS; i++) {
            struct owner *w = &owners[i];
            if (w->done)
                continue;
            all_done = false;
            if (w->body_paused) {
                w->body_paused = false;
                h2up_resume_body(w->s);
            }
            if (w->upload_paused) {
                w->upload_paused = false;
                h2up_resume_upload(w->s);
            }
        }
        if (all_done && off >= size)
            break;
    }
    for (int i = 0; i < STREAMS; i++)
        if (!owners[i].done)
            h2up_cancel(owners[i].s);
    loop_turn(l, 0);
    if (fd >= 0)
        close(fd);
    loop_turn(l, 0);
    h2up_free(h);
    loop_turn(l, 0); /* the deferred frees */
    for (int i = 0; i < STREAMS; i++) {
        hlist_free(&owners[i].head);
        hlist_free(&owners[i].trailers);
    }
    origin_free(o);
    FUZZ_CHECK(atomic_load(&counts.open) == 0, "%lld connections counted open after the pool went",
               (long long)atomic_load(&counts.open));
    return 0;
}
