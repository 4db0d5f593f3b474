/* upstream -- libcurl's multi-socket API inside a worker's event loop.
 *
 * A few multi handles per worker (upstream.c says why): their sockets are loop watches, their
 * timers loop timers, and their connection caches keep upstream connections alive between
 * requests of that worker. Easy handles are pooled and reused (curl_easy_reset) so a request
 * costs no handle setup.
 * A transfer's owner embeds a struct upstream_xfer and learns of its end through 'done',
 * always called from the loop, never from inside a curl callback.
 */
#ifndef RETRYPROXY_PROXY_UPSTREAM_H
#define RETRYPROXY_PROXY_UPSTREAM_H

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
#define UPSTREAM_MAX_CONNECTIONS 1024L
/* libcurl's receive buffer per transfer (CURLOPT_BUFFERSIZE; 16 KiB by default), and so the
 * most one of its writes hands over but for a paused one's: a transfer held by a client that
 * does not read keeps it (docs/http2.md, "What an unread stream costs"). Half the default costs
 * about 10 % more CPU per byte of a large body (bench/README.md). */
#define UPSTREAM_RECV_BUFFER (8 * 1024L)

struct upstream;
struct shard;

struct upstream_target;
struct upstream_xfer;
typedef void (*upstream_done_fn)(struct upstream_xfer *x, CURLcode rc);

struct upstream_xfer {
    CURL *easy;          /* NULL when no transfer is running */
    struct shard *shard; /* the multi handle it runs on (upstream.c) */
    upstream_done_fn done;
    void *arg;
    /* Its slot (proxy/upstream/slots.h): held from its start until it ends or is released; the
     * shares it counts in are set before it starts. */
    struct slot_hold hold;
    /* Set by the owner before upstream_start(): the handle is freed when the transfer ends,
     * not pooled. libcurl 7.88 keeps the state of a chunked upload's trailers (after
     * CURLOPT_TRAILERFUNCTION) through curl_easy_reset(): the next chunked upload on that
     * handle would write its chunk header before its buffer. */
    bool spent;
    int fd; /* upstream.c's: the socket curl last watched for it, -1 none */
    /* Set by the owner before upstream_start(): the endpoint it goes to, whose count a
     * connection it opens joins (NULL: none). */
    const struct upstream_target *to;
};

/* A multi handle driven by 'l', or NULL; its HTTP/2 sessions count into 'h2_counts' (NULL:
 * nowhere). */
struct h2up_counts;
struct upstream *upstream_new(struct loop *l, struct h2up_counts *h2_counts);
/* Frees; every transfer must have ended or been cancelled. Accepts NULL. */
void upstream_free(struct upstream *u);

/* An easy handle from the pool, reset, with the options every transfer shares. */
CURL *upstream_easy_get(struct upstream *u);

/* Starts x->easy (options already set by the owner); 'done' is called once when it ends.
 * 0, or -1 if curl refused it (x->easy is returned to the pool and 'done' is not called). */
int upstream_start(struct upstream *u, struct upstream_xfer *x, upstream_done_fn done, void *arg);

/* Stops a running transfer without calling 'done' and returns its handle to the pool. Not
 * from inside a curl callback of that transfer. */
void upstream_cancel(struct upstream *u, struct upstream_xfer *x);

/* An upstream origin ("http://host:port/", "https://...", "h2c://host:port/") of 'host'
 * (cfg_upstream.host) parsed once, for every transfer to it, with its route's 'tls': libcurl
 * copies a parsed URL instead of parsing the string again per transfer. Read-only once made, so
 * transfers of any worker may share it; it must outlive them (the config snapshot that names the
 * upstream owns it). NULL if out of memory or curl refuses the URL. */
struct upstream_url;
struct cfg_tls;
struct upstream_url *upstream_url_new(const char *origin, const char *host,
                                      const struct cfg_tls *tls, bool tunnels);
void upstream_url_free(struct upstream_url *url); /* accepts NULL */
/* One endpoint of 'url': its origins at address 'a' and libcurl pinned to it (docs/endpoints.md),
 * connections to it counted in 'conns'. Read-only once made but for its share; NULL out of
 * memory. */
struct upstream_target;
struct dns_addr;
struct upstream_target *upstream_target_new(const struct upstream_url *url,
                                            const struct dns_addr *a, _Atomic int64_t *conns);
void upstream_target_free(struct upstream_target *t); /* accepts NULL */
/* Its HTTP/2 origin (as upstream_url_h2 says the URL has one), its tunnels' origin. */
const struct origin *upstream_target_h2(const struct upstream_target *t);
const struct origin *upstream_target_tunnel(const struct upstream_target *t);
/* Its address, and where its worker's share of slots for it is kept (found on its first
 * attempt and let go of before it is freed: proxy/upstream/attempt.c). A target is its
 * worker's alone (proxy/core/balance.h). */
const struct dns_addr *upstream_target_addr(const struct upstream_target *t);
struct share **upstream_target_share(struct upstream_target *t);
/* The endpoint left its name's record: the worker's idle connections to it close (HTTP/2
 * sessions with a GOAWAY), busy ones once their requests end. */
void upstream_target_leave(struct upstream *u, const struct upstream_target *t);
/* Points 'e' at 'url' (one upstream_url_h1() allows), connecting to endpoint 't' (NULL: where
 * the URL says). */
void upstream_easy_url(CURL *e, const struct upstream_url *url, const struct upstream_target *t);
/* The Host field libcurl must be given for 'url' ("Host: authority"), unless the request's
 * fields hold one (preserve_host): NULL when the URL it has says the same. */
const char *upstream_url_host_field(const struct upstream_url *url);
/* An h2c origin, or an https one tried in HTTP/2 first (routes[].tls.http2 "auto" or
 * "required"), goes through proxy/upstream/h2up.h: its origin there, or NULL when libcurl has it.
 */
struct origin;
const struct origin *upstream_url_h2(const struct upstream_url *url);
/* Whether libcurl may carry requests to 'url' (http, https, and https "auto" when the server
 * chooses http/1.1). */
bool upstream_url_h1(const struct upstream_url *url);
/* Where an upgrade's tunnel connects (an http or https origin, resolved with the snapshot when
 * 'tunnels' was given, docs/upgrades.md), NULL for an h2c one (HTTP/2 alone: no HTTP/1.1
 * upgrade) or when it was not. */
const struct origin *upstream_url_tunnel(const struct upstream_url *url);
/* The worker's h2c sessions (made on first use), or NULL out of memory. */
struct h2up;
struct h2up *upstream_h2(struct upstream *u);

/* A burst is over (proxy/http1/server.c's trim): idle easy handles beyond a few are freed, the
 * idle connections of the multi handles that run no transfer are closed, and the shares of
 * endpoints nothing uses go (slots_trim). */
void upstream_trim(struct upstream *u);

/* Transfers running now. */
size_t upstream_active(const struct upstream *u);

/* The worker's attempt slots (limits.max_upstream_requests), which its transfers hold too. */
struct slots *upstream_slots(struct upstream *u);

#endif
