/* curlm -- libcurl's multi-socket engine inside a worker's event loop: the engine under the
 * HTTP/1.1 transport (proxy/upstream/h1up.c), made and freed by the worker (proxy/core/worker.c).
 *
 * A few multi handles per worker (curlm.c says why): their sockets are loop watches, their
 * timers loop timers, and their connection caches keep upstream connections alive between
 * requests of that worker. Easy handles are pooled and reused (curl_easy_reset) so a request
 * costs no handle setup.
 * A transfer's owner embeds a struct curlm_xfer and learns of its end through 'done',
 * always called from the loop, never from inside a curl callback.
 */
#ifndef RETRYPROXY_PROXY_CURLM_H
#define RETRYPROXY_PROXY_CURLM_H

#include <stdatomic.h>
#include <stdbool.h>

#include <curl/curl.h>

#include "proxy/base/loop.h"
#include "proxy/upstream/slots.h"

/* Idle upstream connections a worker keeps at most, over all its multi handles
 * (CURLMOPT_MAXCONNECTS): the soak's descriptor check allows this many (tests/tools/soak.c).
 * libcurl's default is 4 times the transfers running at that moment, so a short dip in load
 * would close connections that the next burst has to open again; a fixed size keeps them
 * (each idle one costs a socket and a few kilobytes). */
#define CURLM_MAX_CONNECTIONS 1024L
/* libcurl's receive buffer per transfer (CURLOPT_BUFFERSIZE; 16 KiB by default), and so the
 * most one of its writes hands over but for a paused one's: a transfer held by a client that
 * does not read keeps it (docs/http2.md, "What an unread stream costs"). Half the default costs
 * about 10 % more CPU per byte of a large body (bench/README.md). */
#define CURLM_RECV_BUFFER (8 * 1024L)

struct curlm;
struct curlm_xfer;
typedef void (*curlm_done_fn)(struct curlm_xfer *x, CURLcode rc);

struct curlm_xfer {
    CURL *easy; /* NULL when no transfer is running */
    curlm_done_fn done;
    void *arg;
    /* Its slot (proxy/upstream/slots.h): held from its start until it ends or is released; the
     * shares it counts in are set before it starts. */
    struct slot_hold hold;
    /* Set by the owner before curlm_start(): the handle is freed when the transfer ends,
     * not pooled. libcurl 7.88 keeps the state of a chunked upload's trailers (after
     * CURLOPT_TRAILERFUNCTION) through curl_easy_reset(): the next chunked upload on that
     * handle would write its chunk header before its buffer. */
    bool spent;
    unsigned char shard; /* curlm.c's: the multi handle it runs on */
    int fd;              /* curlm.c's: the socket curl last watched for it, -1 none */
    /* Set by the owner before curlm_start(): the count of open connections of the endpoint it
     * goes to, which a connection it opens joins (NULL: none). */
    _Atomic int64_t *conns;
};

/* The engine driven by 'l', its transfers holding the worker's attempt slots 'slots' (which
 * outlive it), or NULL. */
struct slots;
struct curlm *curlm_new(struct loop *l, struct slots *slots);
/* Frees; every transfer must have ended or been cancelled. Accepts NULL. */
void curlm_free(struct curlm *u);

/* An easy handle from the pool, reset, with the options every transfer shares. */
CURL *curlm_easy_get(struct curlm *u);

/* Starts x->easy (options already set by the owner); 'done' is called once when it ends.
 * 0, or -1 if curl refused it (x->easy is returned to the pool and 'done' is not called). */
int curlm_start(struct curlm *u, struct curlm_xfer *x, curlm_done_fn done, void *arg);

/* Stops a running transfer without calling 'done' and returns its handle to the pool. Not
 * from inside a curl callback of that transfer. */
void curlm_cancel(struct curlm *u, struct curlm_xfer *x);

/* An endpoint left its name's record: the idle connections counted in its 'conns' (a
 * curlm_xfer's) close now, the busy ones once their transfers end and this is called again. */
void curlm_leave(struct curlm *u, const _Atomic int64_t *conns);

/* A burst is over (proxy/http1/server.c's trim, through proxy/core/worker.c): idle easy handles
 * beyond a few are freed, and the idle connections of the multi handles that run no transfer
 * are closed. */
void curlm_trim(struct curlm *u);

/* Transfers running now. */
size_t curlm_active(const struct curlm *u);

#endif
