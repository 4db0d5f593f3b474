/* attempt_int -- between the attempt's dispatcher (proxy/upstream/attempt.c) and the upstream
 * transports behind it (proxy/upstream/h1up.c, proxy/upstream/h2up_attempt.c,
 * proxy/upstream/tunnel_up_attempt.c). Not for the request core, which sees
 * proxy/upstream/attempt.h only.
 *
 * struct attempt's 'state' bytes hold a struct attempt_priv: the dispatcher's part (the slot,
 * the target, what an https attempt needs to go through libcurl after all) and the running
 * transport's own state in 't', each transport's type private to its file.
 */
#ifndef RETRYPROXY_PROXY_ATTEMPT_INT_H
#define RETRYPROXY_PROXY_ATTEMPT_INT_H

#include <stddef.h>

#include "proxy/upstream/attempt.h"
#include "proxy/upstream/curlm.h"

struct h1up_url;

/* What a running transport does for the dispatcher. */
struct attempt_transport {
    /* Ends it without ops->done (the dispatcher has forgotten it already). */
    void (*cancel)(struct attempt *a);
    /* attempt_pause_body() (NULL: the transport cannot). */
    bool (*pause_body)(struct attempt *a);
    void (*resume_body)(struct attempt *a);
    void (*resume_upload)(struct attempt *a);
    /* An upgrade's connection, its 101 agreed to (NULL: no upgrade transport). */
    struct tunnel_up *(*take_tunnel)(struct attempt *a);
};

/* A transport's state, at most this many bytes. */
#define ATTEMPT_TX_BYTES 64

struct attempt_priv {
    struct attempt_side *up;
    const struct attempt_transport *tx; /* the running transport; NULL: none */
    char *target_buf;                   /* the upstream's base path + the target */
    struct upstream_wait slot;          /* queued for a transfer slot */
    /* The slot it holds (any transport), and libcurl's transfer (proxy/upstream/h1up.c). */
    struct curlm_xfer xfer;
    /* An https attempt tried in HTTP/2 first: what it needs to go through libcurl instead if
     * the server chooses http/1.1 by ALPN (the request outlives the attempt). */
    struct {
        const struct h1up_url *url;   /* NULL: none (its endpoint's count in xfer.conns) */
        const struct curl_slist *pin; /* its endpoint's (NULL: none) */
        const char *base_path;
        struct attempt_req req;
        uint64_t connect_timeout_ms;
    } h1;
    /* Set by proxy/upstream/attempt.c with h1 (NULL: none), called by the HTTP/2 transport when the
     * server chose http/1.1 by ALPN: the same attempt goes through libcurl. True if it did;
     * false: it ends unsent. A pointer, so that the transport never calls its dispatcher. */
    bool (*fallback_h1)(struct attempt *a);
    _Alignas(8) unsigned char t[ATTEMPT_TX_BYTES];
};

static inline struct attempt_priv *attempt_priv(struct attempt *a)
{
    return (struct attempt_priv *)(void *)a->state;
}

/* The attempt whose priv holds 'p'. */
static inline struct attempt *attempt_of_priv(struct attempt_priv *p)
{
    return (struct attempt *)(void *)((char *)p - offsetof(struct attempt, state));
}

/* The transport starts running / has ended (before it calls ops->done). */
static inline void attempt_running_as(struct attempt *a, const struct attempt_transport *tx)
{
    attempt_priv(a)->tx = tx;
}

/* A transport without a curl transfer holds a slot from its start to its end. */
static inline void attempt_take_slot(struct attempt *a)
{
    struct attempt_priv *p = attempt_priv(a);
    slots_take(p->up->slots, &p->xfer.hold);
}
static inline void attempt_release_slot(struct attempt *a)
{
    struct attempt_priv *p = attempt_priv(a);
    slots_release(p->up->slots, &p->xfer.hold);
}

/* The transports' launches: 0, or -1 if it could not start (ops->done not called). */
/* proxy/upstream/h1up.c: libcurl, HTTP/1.1, to 'url' (pinned to an endpoint's address by 'pin',
 * NULL: none), a connection it opens counted in 'conns' (NULL: nowhere). */
struct h1up_url;
int h1up_launch(struct attempt *a, const struct h1up_url *url, const struct curl_slist *pin,
                _Atomic int64_t *conns, const char *target, const struct attempt_req *req,
                uint64_t connect_timeout_ms);
/* The request's fields in libcurl's terms, built per attempt in one allocation (*block: the
 * nodes, then their text; freed when the transfer ends): "Name: value", or "Name;" for an
 * empty value (libcurl reads "Name:" as a removal). Led by 'host_field' ("Host: authority",
 * what the upstream's URL no longer gives libcurl, tls.server_name; NULL: none) unless the
 * fields hold a Host (preserve_host), then the attempt's own fields; libcurl's own additions
 * removed after them. NULL for no field at all (or out of memory). (proxy/upstream/h1up.c) */
struct curl_slist;
struct curl_slist *h1up_fields(const char *host_field, const struct attempt_req *req, void **block);
/* proxy/upstream/h1up_url.c: an upstream's URL as libcurl takes it (attempt_url_new()'s, for
 * an http or https origin), NULL out of memory or when curl refuses it; an endpoint's pin to
 * address 'a' in *pin (NULL for a URL whose host is an address: none needed), 0 or -1 out of
 * memory; the URL set on an easy handle with the pin; the Host field libcurl must be given for
 * 'url' ("Host: authority"), unless the request's fields hold one (preserve_host): NULL when
 * the URL it has says the same. */
struct cfg_tls;
struct dns_addr;
struct h1up_url *h1up_url_new(const char *origin, const char *host, const struct cfg_tls *tls);
void h1up_url_free(struct h1up_url *url); /* accepts NULL */
int h1up_url_pin(const struct h1up_url *url, const struct dns_addr *a, struct curl_slist **pin);
void h1up_pin_free(struct curl_slist *pin); /* accepts NULL */
void h1up_url_easy(CURL *e, const struct h1up_url *url, const struct curl_slist *pin);
const char *h1up_url_host_field(const struct h1up_url *url);
/* proxy/upstream/h2up_attempt.c: a stream of the worker's HTTP/2 sessions to 'o'. */
struct h2up;
struct origin;
int h2up_attempt_launch(struct attempt *a, struct h2up *h, const struct origin *o,
                        const char *target, const struct attempt_req *req,
                        uint64_t connect_timeout_ms);
/* proxy/upstream/tunnel_up_attempt.c: an upgrade's handshake on a connection of its own, made on
 * the connector's side 'cs'. */
struct connect_side;
int tunnel_up_attempt_launch(struct attempt *a, struct connect_side *cs, const struct origin *o,
                             const char *target, const struct attempt_req *req,
                             uint64_t connect_timeout_ms);

/* An attempt's own fields, then proxy/http/head.c's list, as HTTP/2 fields for an h2c upstream (RFC
 * 9113 8.2) into 'f' (at most 'max'), their names lowercased into 'names' (room for every
 * name): connection-specific fields (Connection, Keep-Alive, Proxy-Connection,
 * Transfer-Encoding, Upgrade) and Host are left out, TE unless it is "trailers", and, as
 * libcurl would, an empty value. Host's value goes to *host (it becomes :authority). Returns
 * how many; the values point into the lists. (proxy/upstream/h2up_attempt.c) */
struct h2up_field;
size_t attempt_h2_fields(const struct hfield *own, size_t n_own, const struct hlist *l,
                         struct h2up_field *f, size_t max, char *names, const char **host,
                         size_t *host_len);

#endif
