#include "proxy/http/head.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proxy/http/fields.h"
#include "proxy/http/grpc.h"
#include "proxy/http/headers.h"

/* CR, LF and other control bytes in a field make the request a 400. A NUL cannot reach the
 * upstream: libmicrohttpd 0.9.75 cuts the value at it while parsing (and reports that shorter
 * length); a version reporting the true length makes such a field a 400 here too. */
/* The names of enum head_field. */
static const struct {
    const char *name;
    size_t len;
} kept[HF_COUNT] = {
    [HF_CONTENT_LENGTH] = { "Content-Length", 14 },
    [HF_TRANSFER_ENCODING] = { "Transfer-Encoding", 17 },
    [HF_HOST] = { "Host", 4 },
    [HF_IDEMPOTENCY_KEY] = { "Idempotency-Key", 15 },
    [HF_MAX_ATTEMPTS] = { "X-Retry-Max-Attempts", 20 },
    [HF_TIMEOUT] = { "X-Retry-Timeout-Ms", 18 },
    [HF_REQUEST_ID] = { "X-Request-Id", 12 },
    [HF_ACCEPT] = { "Accept", 6 },
    [HF_CONTENT_TYPE] = { "Content-Type", 12 },
    [HF_GRPC_TIMEOUT] = { "grpc-timeout", 12 },
    [HF_UPGRADE] = { "Upgrade", 7 },
    [HF_USER_AGENT] = { "User-Agent", 10 },
};

static void scan_field(void *arg, const char *k, size_t k_len, const char *v, size_t v_len)
{
    struct head_scan *s = arg;
    s->n_fields++;
    s->field_bytes += k_len + v_len;
    if (!hdr_name_valid(k) || !hdr_value_valid(v) || strlen(k) != k_len || strlen(v) != v_len)
        s->n_bad++;
    if (memchr(k, '_', k_len) && s->n_underscore++ == 0)
        s->underscore_name = k;
    for (size_t i = 0; i < HF_COUNT; i++) {
        if (k_len == kept[i].len && strcasecmp(k, kept[i].name) == 0) {
            size_t n = v_len;
            s->value[i] = hdr_trim(v, &n);
            s->value_len[i] = n;
            s->count[i]++;
            return;
        }
    }
    if (HDR_NAME_IS(k, k_len, "Connection")) {
        if (s->n_connection < 8)
            s->connection[s->n_connection++] = v;
    } else if (HDR_NAME_IS(k, k_len, "X-Forwarded-For")) {
        s->xff_len += v_len + 2;
    }
}

void head_scan(struct head_scan *s, head_each_fn each, void *src)
{
    memset(s, 0, sizeof(*s));
    each(src, scan_field, s);
}

const char *head_refusal(const struct head_scan *s, bool reject_underscored, char *buf, size_t cap)
{
    const char *cl = s->value[HF_CONTENT_LENGTH];
    unsigned n_cl = s->count[HF_CONTENT_LENGTH];
    if (n_cl > 1)
        return "two Content-Length headers";
    if (n_cl && s->count[HF_TRANSFER_ENCODING])
        return "both Content-Length and Transfer-Encoding";
    if (s->count[HF_HOST] > 1)
        return "two Host headers";
    if (s->n_bad)
        return "a header with a forbidden character";
    if (cl && hdr_value_uint(cl, s->value_len[HF_CONTENT_LENGTH]) < 0)
        return "an invalid Content-Length";
    if (s->value[HF_HOST] && !hdr_host_valid(s->value[HF_HOST], s->value_len[HF_HOST]))
        return "a Host that is not a host name or address with an optional port";
    if (reject_underscored && s->n_underscore) {
        /* the name is a token (no quote or backslash): it goes into the JSON message as it is */
        snprintf(buf, cap, "a header name with an underscore: %.64s%s", s->underscore_name,
                 strlen(s->underscore_name) > 64 ? "..." : "");
        return buf;
    }
    return NULL;
}

bool head_connection_names(const struct head_scan *s, const char *name)
{
    for (unsigned i = 0; i < s->n_connection; i++)
        if (hdr_token_listed(s->connection[i], name))
            return true;
    return false;
}

const struct cfg_route *head_route(const struct cfg *c, const char *host, size_t host_len,
                                   const char *path, size_t path_len, uint32_t method_bit)
{
    for (size_t i = 0; i < c->n_routes; i++) {
        const struct cfg_route *rt = &c->routes[i];
        if (rt->match_methods && !(rt->match_methods & method_bit))
            continue;
        size_t pl = strlen(rt->match_path_prefix);
        if (pl > path_len || memcmp(path, rt->match_path_prefix, pl) != 0)
            continue;
        if (rt->match_host) {
            char h[300];
            bool keep_port = strchr(rt->match_host, ':') != NULL &&
                             (rt->match_host[0] != '[' || strstr(rt->match_host, "]:"));
            if (!host || hdr_match_host(host, host_len, keep_port, h, sizeof(h)) < 0 ||
                strcmp(h, rt->match_host) != 0)
                continue;
        }
        return rt;
    }
    return NULL;
}

bool head_origin_form(char **target, const char *method, char *authority, size_t cap)
{
    const char *t = *target;
    authority[0] = '\0';
    if (strchr(t, '#'))
        return false; /* a fragment is never sent */
    if (t[0] == '/')
        return true;
    if (t[0] == '*')
        return t[1] == '\0' && strcmp(method, "OPTIONS") == 0;
    size_t skip = strncasecmp(t, "http://", 7) == 0    ? 7
                  : strncasecmp(t, "https://", 8) == 0 ? 8
                                                       : 0;
    if (!skip)
        return false;
    const char *a = t + skip;
    size_t al = strcspn(a, "/?");
    if (al == 0 || al >= cap || memchr(a, '@', al) || !hdr_host_valid(a, al))
        return false; /* no host, userinfo (RFC 9110 4.2.4), or no valid host */
    memcpy(authority, a, al);
    authority[al] = '\0';
    const char *rest = a + al;
    size_t rl = strlen(rest);
    char *o = malloc(rl + 2);
    if (!o)
        return false;
    if (*rest == '/') {
        memcpy(o, rest, rl + 1);
    } else {
        o[0] = '/'; /* "http://a?x" is "/?x" */
        memcpy(o + 1, rest, rl + 1);
    }
    free(*target);
    *target = o;
    return true;
}

/* The fields every attempt sends, built once per request into one allocation sized from the
 * scan, so it never grows (and no bound of hlist_add() applies: the head passed its own). */
static void hb_add(struct hlist *b, const char *k, size_t kl, const char *v, size_t vl)
{
    /* no room cannot happen: sized from the scan (the header would be left out) */
    (void)hlist_put(b, k, kl, v, vl);
}

static void hb_field(struct hlist *b, const char *k, const char *v)
{
    hb_add(b, k, strlen(k), v, strlen(v));
}

struct fwd {
    struct hlist *b;
    struct fields_up up; /* what stays out (proxy/http/fields.h) */
    char *xff;           /* the X-Forwarded-For values joined, the peer's address to come */
    size_t xff_len, xff_cap;
};

/* Adds 'v' to the X-Forwarded-For value being built, after ", " unless it is the first. */
static void xff_append(struct fwd *f, const char *v, size_t vl)
{
    if (f->xff_len + vl + 3 > f->xff_cap)
        return; /* cannot happen: sized from the scan */
    if (f->xff_len) {
        memcpy(f->xff + f->xff_len, ", ", 2);
        f->xff_len += 2;
    }
    memcpy(f->xff + f->xff_len, v, vl);
    f->xff_len += vl;
}

static void forward_field(void *arg, const char *k, size_t kl, const char *v, size_t vl)
{
    struct fwd *f = arg;
    if (HDR_NAME_IS(k, kl, "X-Forwarded-For"))
        xff_append(f, v, vl);
    else if (!fields_up_drops(&f->up, k, kl))
        hb_add(f->b, k, kl, v, vl);
}

int head_up_build(struct head_up *h, const struct head_scan *s, head_each_fn each, void *src,
                  const char *peer, const char *request_id, bool preserve_host,
                  const char *deadline_header, bool drop_underscored, bool grpc)
{
    size_t peer_len = strlen(peer);
    /* what is forwarded, and what is added: X-Forwarded-For (the client's values and the
     * peer), X-Forwarded-Proto, X-Request-Id, TE (gRPC), Host */
    size_t xff_cap = s->xff_len + peer_len + 3;
    size_t cap = s->field_bytes + (2 + HLIST_FIELD_BYTES) * s->n_fields +
                 sizeof("X-Forwarded-For") + xff_cap + sizeof("X-Forwarded-Proto\0http") +
                 sizeof("TE\0trailers") + sizeof("X-Request-Id") + HEAD_REQUEST_ID_MAX + 1 +
                 s->value_len[HF_HOST] + sizeof("Host") + 1 + 5 * HLIST_FIELD_BYTES;
    char *block = malloc(cap + xff_cap);
    if (!block)
        return -1;
    struct hlist *b = &h->fields;
    *b = (struct hlist){ .buf = block, .cap = cap };
    struct fwd f = { .b = b,
                     .up = { .deadline_header = deadline_header,
                             .drop_underscored = drop_underscored,
                             .grpc = grpc,
                             .connection = s->connection,
                             .n_connection = s->n_connection },
                     .xff = block + cap,
                     .xff_cap = xff_cap };
    each(src, forward_field, &f);
    if (peer_len)
        xff_append(&f, peer, peer_len);
    if (f.xff_len)
        hb_add(b, "X-Forwarded-For", 15, f.xff, f.xff_len);
    hb_field(b, "X-Forwarded-Proto", "http");
    hb_field(b, "X-Request-Id", request_id);
    /* a gRPC server wants to hear that its client takes trailers (gRPC's PROTOCOL-HTTP2.md);
     * TE is hop-by-hop, so the client's never goes on: the proxy says it for itself */
    if (grpc)
        hb_field(b, "TE", "trailers");
    if (preserve_host && s->value[HF_HOST])
        hb_add(b, "Host", 4, s->value[HF_HOST], s->value_len[HF_HOST]);
    h->deadline_name = deadline_header;
    h->deadline_name_len = deadline_header ? strlen(deadline_header) : 0;
    h->grpc_timeout = grpc;
    return 0;
}

size_t head_up_attempt(const struct head_up *h, struct head_attempt *t, uint32_t attempt,
                       uint64_t wait_ms)
{
    size_t n = 0;
    t->own[n++] =
        (struct hfield){ "X-Retry-Attempt", t->attempt_val, 15,
                         (size_t)(hdr_utoa(attempt, t->attempt_val) - t->attempt_val), false };
    if (h->grpc_timeout)
        t->own[n++] = (struct hfield){ "grpc-timeout", t->grpc_val, 12,
                                       grpc_timeout_format(wait_ms, t->grpc_val), true };
    if (h->deadline_name_len)
        t->own[n++] =
            (struct hfield){ h->deadline_name, t->deadline_val, h->deadline_name_len,
                             (size_t)(hdr_utoa(wait_ms, t->deadline_val) - t->deadline_val), true };
    return n;
}

void head_up_free(struct head_up *h)
{
    free(h->fields.buf);
    memset(&h->fields, 0, sizeof(h->fields));
}

const char *head_upstream_target(const char *base_path, const char *target, char **buf)
{
    *buf = NULL;
    if (!*base_path || strcmp(target, "*") == 0)
        return target;
    size_t bl = strlen(base_path), tl = strlen(target);
    if (!(*buf = malloc(bl + tl + 1)))
        return target;
    memcpy(*buf, base_path, bl);
    memcpy(*buf + bl, target, tl + 1);
    return *buf;
}
