/* relay -- the client side of one request: the answer (an error of retryproxy's own, a saved
 * upstream response, or the upstream response streamed as it arrives), the request's header
 * fields as libmicrohttpd parsed them, suspending and resuming the connection, and watching
 * the client's socket during a backoff wait. With server.c, the only part that calls
 * libmicrohttpd.
 *
 * The owner embeds a struct relay and hears back through struct relay_ops. Answers made while
 * inside the access handler go out when relay_leave() returns; others resume the suspended
 * connection so that libmicrohttpd calls the handler again to take them.
 */
#ifndef RETRYPROXY_PROXY_RELAY_H
#define RETRYPROXY_PROXY_RELAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/hlist.h"
#include "proxy/loop.h"
#include "proxy/ring.h"

struct MHD_Connection;
struct MHD_Response;
struct relay;

/* Response bytes waiting for the client; when full, the upstream is paused (backpressure). */
#define RELAY_BUFFER (64 * 1024)
/* relay_body(): the buffer is full, offer the bytes again after ops->room. */
#define RELAY_FULL ((size_t)-1)

struct relay_ops {
    /* A streamed response's body reader now refers to the owner (hold) / no longer does
     * (release): libmicrohttpd may call it after the connection is done. */
    void (*hold)(struct relay *rl);
    void (*release)(struct relay *rl);
    /* The client took body bytes and the buffer has room for a full read again. */
    void (*room)(struct relay *rl);
    /* The watched socket (relay_watch) says the client closed or reset the connection. */
    void (*client_gone)(struct relay *rl);
    /* The answer is about to be queued: count it before a byte leaves. */
    void (*sending)(struct relay *rl);
};

/* What every answer carries besides its own fields (docs/forwarding.md). */
struct relay_tag {
    uint32_t attempts;      /* X-Retry-Attempts */
    const char *request_id; /* X-Request-Id, in place of the upstream's; NULL: none */
    const char *stop;       /* X-Retry-Stop, NULL: none */
    bool close;             /* Connection: close (draining, or a head that could not be framed) */
    double throttled;       /* X-Retry-Throttled: the rejection probability; < 0: none */
};

/* Relay flags (struct relay 'flags'). */
enum {
    RL_SUSPENDED = 1u << 0,  /* the connection is suspended by us */
    RL_IN_HANDLER = 1u << 1, /* inside the access handler: an answer is queued on leaving */
    RL_ANSWERED = 1u << 2,   /* an answer is ready ('resp'; NULL: close the connection) */
    RL_QUEUED = 1u << 3,     /* it was handed to libmicrohttpd */
    RL_READER = 1u << 4,     /* suspended because the body reader found nothing to send */
    RL_UPLOAD = 1u << 5,     /* suspended until the upstream takes upload bytes */
    RL_COLLECT = 1u << 6,    /* holding a short body back to answer it in one piece */
    RL_DOWN_DONE = 1u << 7,  /* the upstream's body is complete */
    RL_DOWN_FAIL = 1u << 8,  /* ... or broke off: the client must see a truncation */
    RL_WATCHED = 1u << 9,    /* the client's socket is watched (backoff wait) */
};

struct relay {
    const struct relay_ops *ops;
    void *arg;                   /* the owner's */
    struct MHD_Connection *conn; /* NULL once libmicrohttpd is done with it */
    struct loop *loop;
    void (*kick)(void *); /* makes libmicrohttpd run this turn (after a resume) */
    void *kick_arg;
    unsigned flags;
    int status;                /* of the streamed response */
    const struct hlist *head;  /* its fields (the owner keeps them until the request ends) */
    struct relay_tag tag;      /* what its answer carries */
    bool is_head;              /* a HEAD request: the length without a body */
    struct MHD_Response *resp; /* the answer, until queued */
    unsigned resp_status;
    struct ring down; /* body bytes for the client */
    struct loop_watch client_w;
};

void relay_init(struct relay *rl, struct MHD_Connection *c, struct loop *l, void (*kick)(void *),
                void *kick_arg, const struct relay_ops *ops, void *arg);
void relay_fini(struct relay *rl);

static inline bool relay_answered(const struct relay *rl)
{
    return rl->flags & RL_ANSWERED;
}

/* Calls fn(arg, name, name length, value, value length) for each request header field. */
void relay_each_field(struct relay *rl,
                      void (*fn)(void *arg, const char *k, size_t kl, const char *v, size_t vl),
                      void *arg);

/* An error of retryproxy's own: {"error": code, "route": route (null if NULL), "attempts": N,
 * "message": message}. */
void relay_error(struct relay *rl, unsigned status, const char *code, const char *route,
                 const char *message, const struct relay_tag *tag);
/* A response kept whole: its fields and body as they came (for HEAD, its length alone). */
void relay_saved(struct relay *rl, int status, const struct hlist *h, const char *body, size_t len,
                 const struct relay_tag *tag);
/* The upstream response whose head is 'h': its body follows through relay_body() and
 * relay_body_end(). A body that fits the buffer is collected and answered in one piece. */
void relay_response(struct relay *rl, int status, const struct hlist *h,
                    const struct relay_tag *tag);
/* Body bytes of that response: 'n' taken, or RELAY_FULL, or 0 when no client takes them. */
size_t relay_body(struct relay *rl, const char *p, size_t n);
/* The body is complete, or broke off ('failed': the client sees the truncation). */
void relay_body_end(struct relay *rl, bool failed);
/* No answer: libmicrohttpd closes the connection ('status' is what the log says). */
void relay_close(struct relay *rl, unsigned status);

/* Access-handler bracket: relay_enter() on entry; relay_leave() queues an answer made
 * meanwhile when libmicrohttpd can take one ('can_answer': the call came without upload
 * data), or suspends the connection while the upstream side has the request ('waiting').
 * Returns false when the connection must close ('close_now', or no answer could be made). */
void relay_enter(struct relay *rl);
bool relay_leave(struct relay *rl, bool can_answer, bool waiting, bool close_now);

/* The upstream has not taken the upload bytes offered yet: suspend until relay_upload_room(). */
void relay_wait_upload(struct relay *rl);
void relay_upload_room(struct relay *rl);

/* Watches the suspended connection's socket for the client going away (a backoff wait). */
void relay_watch(struct relay *rl);
void relay_unwatch(struct relay *rl);

/* libmicrohttpd is done with the connection: an answer never queued is dropped. */
void relay_done(struct relay *rl);

#endif
