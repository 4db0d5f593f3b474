/* head -- the client's request head turned into what goes upstream (docs/forwarding.md): the
 * fields that steer the proxy picked out, framing conflicts found, the route chosen, the
 * target put in origin-form, and the header list every attempt sends. Pure: the fields come
 * from the caller, one at a time.
 */
#ifndef RETRYPROXY_PROXY_HEAD_H
#define RETRYPROXY_PROXY_HEAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/cfg.h"
#include "proxy/http/hlist.h"

/* X-Request-Id values longer than this are replaced by a fresh id. */
#define HEAD_REQUEST_ID_MAX 128

/* The fields that steer the proxy. */
enum head_field {
    HF_CONTENT_LENGTH,
    HF_TRANSFER_ENCODING,
    HF_HOST,
    HF_IDEMPOTENCY_KEY,
    HF_MAX_ATTEMPTS, /* X-Retry-Max-Attempts */
    HF_TIMEOUT,      /* X-Retry-Timeout-Ms */
    HF_REQUEST_ID,   /* X-Request-Id */
    HF_ACCEPT,
    HF_CONTENT_TYPE,
    HF_GRPC_TIMEOUT, /* grpc-timeout (docs/grpc.md) */
    HF_UPGRADE,      /* Upgrade (docs/upgrades.md) */
    HF_USER_AGENT,   /* for the log */
    HF_COUNT
};

/* What a look at every field found. */
struct head_scan {
    const char *value[HF_COUNT];  /* each field's last value, NULL if absent, from its first */
    size_t value_len[HF_COUNT];   /* non-blank byte: value[i][0..value_len[i]) (hdr_trim) */
    unsigned count[HF_COUNT];     /* and how many times it came */
    unsigned n_bad;               /* fields with a forbidden byte */
    size_t n_fields, field_bytes; /* every field, for sizing what is forwarded */
    const char *connection[8];    /* the Connection values */
    unsigned n_connection;
    size_t xff_len;              /* the X-Forwarded-For values' length */
    unsigned n_underscore;       /* fields whose name has an underscore */
    const char *underscore_name; /* the first of those names, NUL-terminated */
};

/* Walks the fields: calls fn(arg, name, name length, value, value length) for each. */
typedef void (*head_field_fn)(void *arg, const char *k, size_t kl, const char *v, size_t vl);
typedef void (*head_each_fn)(void *src, head_field_fn fn, void *arg);

/* Looks at every field of 'src' into 's' (zeroed first). */
void head_scan(struct head_scan *s, head_each_fn each, void *src);
/* Why the head cannot be forwarded as one unambiguous request (a 400), or NULL. With
 * 'reject_underscored' (limits.headers_with_underscores "reject"), a field name with an
 * underscore is a reason too, written with the name into buf[cap]. */
const char *head_refusal(const struct head_scan *s, bool reject_underscored, char *buf, size_t cap);
/* Whether the client's Connection header names the field 'name': it is then not forwarded
 * (RFC 9110 7.6.1), whatever the proxy reads from it (docs/forwarding.md). */
bool head_connection_names(const struct head_scan *s, const char *name);

/* The first route matching the method, path (its first 'path_len' bytes) and host, or NULL. */
const struct cfg_route *head_route(const struct cfg *c, const char *host, size_t host_len,
                                   const char *path, size_t path_len, uint32_t method_bit);

/* The request target's form (RFC 9112 3.2). Origin-form ("/path?q") goes as it is.
 * Absolute-form ("http://host/path") becomes origin-form in *target (reallocated) and its
 * authority, copied into 'authority', replaces the Host field for routing and preserve_host
 * (3.2.2: the target's authority wins). "*" is for OPTIONS only. Returns false for anything
 * else (a 400). */
bool head_origin_form(char **target, const char *method, char *authority, size_t cap);

/* The target the upstream sees: its 'base_path', then the request's 'target' (an asterisk
 * alone goes alone). Malloc'd in *buf when both are there, else *buf is NULL ('target' itself
 * out of memory too). */
const char *head_upstream_target(const char *base_path, const char *target, char **buf);

/* The fields every attempt sends: the client's but hop-by-hop ones and those the proxy owns,
 * X-Forwarded-For, X-Forwarded-Proto, X-Request-Id, TE on a gRPC call, Host when preserved.
 * Each attempt sends its own X-Retry-Attempt (and the route's deadline header, grpc-timeout)
 * before them (struct head_attempt): attempts of one request may run at once (hedging). A
 * transport turns both into its library's format (proxy/upstream/attempt.h). */
struct head_up {
    struct hlist fields;       /* in one allocation sized from the scan */
    const char *deadline_name; /* the route's (its snapshot outlives the request); NULL: none */
    size_t deadline_name_len;  /* at most 64 bytes (config/schema_values.c) */
    bool grpc_timeout;         /* a gRPC call: each attempt carries its own grpc-timeout */
};

/* One attempt's own fields. */
struct head_attempt {
    struct hfield own[3]; /* X-Retry-Attempt, then grpc-timeout, the deadline header */
    char attempt_val[12];
    char grpc_val[16];
    char deadline_val[24];
};

/* Builds it. 'peer' is the client's address ("" if unknown); 'deadline_header' the route's
 * (NULL: none); 'drop_underscored': fields whose name has an underscore are left out
 * (limits.headers_with_underscores "drop"); 'grpc': a gRPC call, whose grpc-timeout the proxy
 * sets per attempt in place of the client's. 0, or -1 out of memory. */
int head_up_build(struct head_up *h, const struct head_scan *s, head_each_fn each, void *src,
                  const char *peer, const char *request_id, bool preserve_host,
                  const char *deadline_header, bool drop_underscored, bool grpc);
/* The fields of attempt number 'attempt' into t->own (which must live as long as the attempt's
 * transfer), how many: X-Retry-Attempt, and the deadline header's value 'wait_ms', how long
 * the proxy will wait for this attempt's answer (on a gRPC call, grpc-timeout too). */
size_t head_up_attempt(const struct head_up *h, struct head_attempt *t, uint32_t attempt,
                       uint64_t wait_ms);
void head_up_free(struct head_up *h);

#endif
