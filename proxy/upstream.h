/* upstream -- libcurl's multi-socket API inside a worker's event loop.
 *
 * One multi handle per worker: its sockets are loop watches, its timer a loop timer, and its
 * connection cache keeps upstream connections alive between requests of that worker. Easy
 * handles are pooled and reused (curl_easy_reset) so a request costs no handle setup.
 * A transfer's owner embeds a struct upstream_xfer and learns of its end through 'done',
 * always called from the loop, never from inside a curl callback.
 */
#ifndef RETRYPROXY_PROXY_UPSTREAM_H
#define RETRYPROXY_PROXY_UPSTREAM_H

#include <curl/curl.h>

#include "proxy/loop.h"

struct upstream;

struct upstream_xfer;
typedef void (*upstream_done_fn)(struct upstream_xfer *x, CURLcode rc);

struct upstream_xfer {
    CURL *easy; /* NULL when no transfer is running */
    upstream_done_fn done;
    void *arg;
};

/* A multi handle driven by 'l', or NULL. */
struct upstream *upstream_new(struct loop *l);
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

/* An upstream origin ("http://host:port/") parsed once, for every transfer to it: libcurl
 * copies a parsed URL instead of parsing the string again per transfer. Read-only once made,
 * so transfers of any worker may share it; it must outlive them (the config snapshot that
 * names the upstream owns it). NULL if out of memory or curl refuses the URL. */
struct upstream_url;
struct upstream_url *upstream_url_new(const char *origin);
void upstream_url_free(struct upstream_url *url); /* accepts NULL */
/* Points 'e' at 'url'. */
void upstream_easy_url(CURL *e, const struct upstream_url *url);

/* Transfers running now. */
size_t upstream_active(const struct upstream *u);

#endif
