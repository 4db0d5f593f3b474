/* edge -- a request's two ends with its client (proxy/core/req.h): its head taken in (checked,
 * routed, its limits and policy set) and its answer given (the upstream's response streamed, a
 * saved one, or an error of retryproxy's own), through the front end (proxy/core/front.h).
 * It does what the state machine (retry.c) asks and returns what happened: it sets no state and
 * calls nothing of retry.c.
 */
#include "proxy/core/req.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "proxy/http/answer.h"
#include "proxy/http/fields.h"
#include "proxy/http/grpc.h"
#include "proxy/http/headers.h"
#include "proxy/telemetry/log.h"
#include "proxy/core/proxy.h"
#include "proxy/core/retry.h"
#include "proxy/core/runtime.h"
#include "proxy/core/worker.h"
#include "proxy/dns/resolve.h"

/* The Allow of a 405: the methods of RFC 9110 and 5789 but CONNECT (any other token is
 * forwarded too). */
#define EDGE_ALLOW "GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH"

static void each_field(void *src, head_field_fn fn, void *arg)
{
    struct front *f = src;
    f->ops->fields(f, fn, arg);
}

/* The request's id, sent upstream, logged and returned on every answer: the client's
 * X-Request-Id when its head passed the checks and the value fits, else a new UUID
 * (docs/forwarding.md). */
static void set_request_id(struct retry_req *r, const char *client_id, size_t len)
{
    if (client_id && len > 0 && len <= HEAD_REQUEST_ID_MAX)
        snprintf(r->request_id, sizeof(r->request_id), "%.*s", (int)len, client_id);
    else
        hdr_uuid(&r->w->rng, r->request_id);
}

/* One protocol of an Upgrade list ("websocket", "websocket/13"): whether the route tunnels its
 * name (any case). */
static bool route_tunnels(const struct cfg_route *rt, const char *p, size_t n)
{
    const char *slash = memchr(p, '/', n);
    size_t nl = slash ? (size_t)(slash - p) : n;
    for (size_t i = 0; i < rt->n_upgrades; i++)
        if (strlen(rt->upgrades[i].token) == nl && strncasecmp(rt->upgrades[i].token, p, nl) == 0)
            return true;
    return false;
}

/* A protocol as the client wrote it, for a message: its token characters, '?' for the others
 * (the error body's message is not escaped). */
static void token_text(char *out, size_t cap, const char *p, size_t n)
{
    size_t i = 0;
    for (; i < n && i + 1 < cap; i++)
        out[i] = hdr_name_valid_n(p + i, 1) || p[i] == '/' ? p[i] : '?';
    out[i] = '\0';
}

/* A request with Connection: upgrade and an Upgrade field, on HTTP/1.1 (docs/upgrades.md). The
 * first protocol the route tunnels is asked of the upstream; h2c is ignored (RFC 9110 7.8 lets
 * a server ignore Upgrade: HTTP/2 comes by prior knowledge), and a request naming only h2c goes
 * on as a plain HTTP/1.1 request. Any other protocol is refused with an error of our own,
 * never sent as a plain request. Returns false when the request was answered. */
static bool plan_upgrade(struct retry_req *r, const struct head_scan *s, bool has_body)
{
    const char *v = s->value[HF_UPGRADE];
    size_t vl = s->value_len[HF_UPGRADE];
    bool other = false;
    char first[64];
    first[0] = '\0';
    if (s->count[HF_UPGRADE] > 1) {
        r->flags |= RF_BAD_HEAD;
        edge_error(r, 400, "bad_request", "more than one Upgrade field");
        return false;
    }
    for (size_t i = 0; i < vl && !r->upgrade[0];) {
        while (i < vl && (v[i] == ',' || v[i] == ' ' || v[i] == '\t'))
            i++;
        size_t start = i;
        while (i < vl && v[i] != ',' && v[i] != ' ' && v[i] != '\t')
            i++;
        size_t n = i - start;
        if (!n || (n == 3 && strncasecmp(v + start, "h2c", 3) == 0))
            continue;
        if (route_tunnels(r->route, v + start, n) && n < sizeof(r->upgrade))
            snprintf(r->upgrade, sizeof(r->upgrade), "%.*s", (int)n, v + start);
        else if (!other)
            token_text(first, sizeof(first), v + start, n);
        other = true;
    }
    if (!other)
        return true; /* h2c alone: the Upgrade is ignored */
    char msg[160];
    if (!r->upgrade[0]) {
        snprintf(msg, sizeof(msg), "the route does not tunnel the upgrade '%s' (routes[].upgrades)",
                 first);
        edge_error(r, 501, "upgrade_not_allowed", msg);
        return false;
    }
    if (has_body) {
        edge_error(r, 400, "bad_request", "an upgrade request with a body is not tunnelled");
        return false;
    }
    struct proxy *px = r->w->px;
    if (atomic_load_explicit(&px->draining, memory_order_relaxed)) {
        edge_error(r, 503, "draining", "retryproxy is shutting down: no new tunnels");
        return false;
    }
    if (atomic_load_explicit(&px->tunnels, memory_order_relaxed) >= r->cfg->max_tunnels) {
        edge_error(r, 503, "too_many_tunnels",
                   "limits.max_tunnels upgraded connections are open already");
        return false;
    }
    return true;
}

/* A stored request being delivered (front_ops.delivery): it runs under the snapshot the
 * courier gives (the last one that had its route, docs/delivery.md "Reloads") and goes to its
 * route by name (none: the caller answers 404). */
static void delivery_route(struct retry_req *r)
{
    const char *name = NULL;
    struct rt *rt = r->front->ops->delivery(r->front, &name);
    if (rt && rt != r->rt) {
        rt_unref(r->rt);
        r->rt = rt_ref(rt);
        r->cfg = rt->cfg;
        r->m = rt->no_route;
    }
    for (size_t i = 0; name && i < r->cfg->n_routes && !r->route; i++)
        if (strcmp(r->cfg->routes[i].name, name) == 0)
            r->route = &r->cfg->routes[i];
}

/* A head its client protocol refused (proxy/http/refusal.h): its error, and the connection
 * closes, as what follows on it cannot be framed. The log shows no method or path: they were
 * not read. */
static void answer_refused(struct retry_req *r)
{
    static const struct {
        unsigned status;
        const char *code;
    } codes[] = { { 400, "bad_request" },     { 408, "request_timeout" },
                  { 414, "uri_too_long" },    { 431, "headers_too_large" },
                  { 501, "not_implemented" }, { 505, "version_not_supported" } };
    unsigned status = refusal_status(r->refused);
    const char *code = "bad_request";
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
        if (codes[i].status == status)
            code = codes[i].code;
    r->target[0] = '\0';
    set_request_id(r, NULL, 0);
    const char *text = refusal_text(r->refused);
    char figures[128];
    if (r->refused == REFUSE_HEAD_TOO_LARGE) {
        /* the limit in force: the one the proxy started with */
        uint32_t max = r->w->px->head_max ? r->w->px->head_max : r->cfg->max_header_bytes;
        snprintf(figures, sizeof(figures),
                 "request headers larger than limits.max_header_bytes (%" PRIu32
                 " bytes) or %d fields",
                 max, REQ_FIELDS_MAX);
        text = figures;
    }
    edge_error(r, status, code, text);
}

/* What the head says that every answer needs: the method, the request's id, the log's
 * User-Agent, the head's size (the trailers' bound), whether it is a gRPC call (its errors,
 * these first ones included, are gRPC statuses: docs/grpc.md). Returns why the head is refused
 * as malformed or ambiguous (NULL: it is not). */
static const char *read_head(struct retry_req *r, const char *method, struct head_scan *s,
                             char *why_buf, size_t cap)
{
    snprintf(r->method, sizeof(r->method), "%s", method);
    r->method_bit = cfg_method_bit(method, strlen(method));
    r->front->is_head = strcmp(method, "HEAD") == 0; /* a length comes back, never a body */
    head_scan(s, each_field, r->front);
    const char *why =
        head_refusal(s, r->cfg->headers_with_underscores == CFG_UNDERSCORES_REJECT, why_buf, cap);
    set_request_id(r, why ? NULL : s->value[HF_REQUEST_ID], s->value_len[HF_REQUEST_ID]);
    if (s->value[HF_USER_AGENT] && log_enabled(CFG_LOG_INFO)) /* the log's only */
        r->user_agent = strndup(s->value[HF_USER_AGENT], s->value_len[HF_USER_AGENT]);
    r->head_size = s->field_bytes + 32 * s->n_fields;
    r->head_fields = s->n_fields;
    if (s->n_connection)
        r->flags |= RF_CONNECTION; /* what it names stays out of the trailers too */
    if (s->value[HF_CONTENT_TYPE] &&
        grpc_is_content_type(s->value[HF_CONTENT_TYPE], s->value_len[HF_CONTENT_TYPE])) {
        r->flags |= RF_GRPC;
        r->front->grpc = true;
    }
    return why;
}

/* Which route the request goes to, or why none: CONNECT (405), a head refused as 'why' says
 * or a target of no valid form (400: malformed or ambiguous heads close the connection as the
 * framing check's refusals do, docs/hardening.md), no route matching (404; a 404 or 405
 * leaves the connection open). False when it was answered. */
static bool route_request(struct retry_req *r, struct head_scan *s, const char *why,
                          char *authority, size_t cap)
{
    if (strcmp(r->method, "CONNECT") == 0) {
        edge_error(r, 405, "method_not_allowed",
                   "CONNECT is not supported: retryproxy is a reverse proxy");
        return false;
    }
    if (why || !head_origin_form(&r->target, r->method, authority, cap)) {
        r->flags |= RF_BAD_HEAD;
        edge_error(r, 400, "bad_request", why ? why : "a request target of no valid form");
        return false;
    }
    if (authority[0]) {
        s->value[HF_HOST] = authority; /* the caller's: head_up_build() reads it too */
        s->value_len[HF_HOST] = strlen(authority);
    }
    const char *q = strchr(r->target, '?');
    size_t path_len = q ? (size_t)(q - r->target) : strlen(r->target);
    if (r->front->ops->delivery)
        delivery_route(r);
    else
        r->route = head_route(r->cfg, s->value[HF_HOST], s->value_len[HF_HOST], r->target, path_len,
                              r->method_bit);
    if (!r->route) {
        edge_error(r, 404, "no_route", "no route matches this request");
        return false;
    }
    r->rtr = &r->rt->routes[r->route - r->cfg->routes];
    r->m = r->rtr->metrics;
    const struct cfg_retry *policy = &r->route->retry;
    for (size_t i = 0; (r->flags & RF_GRPC) && i < policy->n_on; i++)
        if (policy->on[i].kind == CFG_RETRY_GRPC)
            r->flags |= RF_GRPC_RETRY; /* its status may be held for (proxy/core/keep.c) */
    return true;
}

/* How many attempts and how long (docs/forwarding.md): the route's, lowered, never raised, by
 * the client's X-Retry-Max-Attempts, X-Retry-Timeout-Ms and a gRPC call's grpc-timeout; whether
 * the method may go twice. False when it was answered (a grpc-timeout of no valid form, 400, or
 * passed already, 504). */
static bool set_policy(struct retry_req *r, const struct head_scan *s)
{
    const struct cfg_retry *policy = &r->route->retry;
    const char *const *field = s->value;
    const size_t *field_len = s->value_len; /* the values without their whitespace */
    /* a key named in Connection does not reach the upstream, so it cannot vouch for a retry */
    if ((policy->methods & r->method_bit) ||
        (policy->idempotency_key && field_len[HF_IDEMPOTENCY_KEY] > 0 &&
         !head_connection_names(s, "Idempotency-Key")))
        r->flags |= RF_RETRYABLE;
    r->max_attempts = policy->max_attempts;
    if (r->front->ops->delivery) {
        /* one attempt of a delivery: the courier waits out the backoff in the store */
        r->flags |= RF_RETRYABLE;
        r->max_attempts = 1;
    }
    if (field[HF_MAX_ATTEMPTS]) {
        int64_t m = hdr_value_uint(field[HF_MAX_ATTEMPTS], field_len[HF_MAX_ATTEMPTS]);
        if (m >= 1 && (uint64_t)m < r->max_attempts)
            r->max_attempts = (uint32_t)m;
    }
    /* The client may shorten the request's time as it may its attempts, never lengthen it. */
    r->timeout_ms = r->route->timeout_ms;
    if (field[HF_TIMEOUT]) {
        int64_t t = hdr_value_uint(field[HF_TIMEOUT], field_len[HF_TIMEOUT]);
        if (t >= 1 && (uint64_t)t < r->timeout_ms)
            r->timeout_ms = (uint32_t)t;
    }
    /* ... and a gRPC client its deadline, the same way (gRPC's grpc-timeout) */
    if ((r->flags & RF_GRPC) && field[HF_GRPC_TIMEOUT]) {
        uint64_t t;
        if (s->count[HF_GRPC_TIMEOUT] > 1 ||
            grpc_timeout_parse(field[HF_GRPC_TIMEOUT], field_len[HF_GRPC_TIMEOUT], &t) < 0) {
            edge_error(r, 400, "bad_request",
                       "a grpc-timeout that is not one gRPC timeout (such as \"250m\")");
            return false;
        }
        if (t == 0) { /* "0m": the deadline has passed, nothing is sent (gRPC's meaning) */
            edge_error(r, 504, "upstream_timeout", "the call's deadline (grpc-timeout) had passed");
            return false;
        }
        if (t < r->timeout_ms)
            r->timeout_ms = (uint32_t)t;
    }
    return true;
}

/* The request goes upstream: its decisions' inputs (decide.c), the fields every attempt
 * sends, and how its body is taken (intake.c). False when it was answered (no memory). */
static bool plan_forward(struct retry_req *r, struct head_scan *s, const struct edge_body *b)
{
    struct worker *w = r->w;
    const struct cfg_retry *policy = &r->route->retry;
    r->dr = (struct decide_req){
        .policy = policy,
        .seq = &r->seq,
        .live = r->rtr->live,
        .rng = &w->rng,
        .throttle = &r->route->throttle,
        .budgets = { .global = &w->px->budget,
                     .global_limits = &r->cfg->budget,
                     .route = &r->rtr->live->budget,
                     .route_limits = &r->route->budget },
    };
    bool drop = s->n_underscore && r->cfg->headers_with_underscores == CFG_UNDERSCORES_DROP;
    if (drop && log_enabled(CFG_LOG_DEBUG))
        log_event(CFG_LOG_DEBUG, "request headers with an underscore in their name not forwarded",
                  "request_id", r->request_id, "first", s->underscore_name, NULL);
    if (head_up_build(&r->up, s, each_field, r->front, r->peer ? r->peer : "", r->request_id,
                      r->route->preserve_host, r->route->deadline_header, drop,
                      r->flags & RF_GRPC) < 0 ||
        intake_plan(&r->body, b->has_body, b->length, policy->max_retry_body_bytes,
                    r->flags & RF_GRPC) < 0) {
        edge_error(r, 500, "internal", "out of memory");
        return false;
    }
    return true;
}

/* First call of the access handler: the head is complete, no body byte read yet. Either an
 * answer is made at once (400, 404, 405, 413...) or the request is planned: stored (a durable
 * route's), or sent upstream once its body is in, or at once with its body flowing. */
enum edge_plan edge_begin(struct retry_req *r, const char *method, struct edge_body *b)
{
    if (r->refused != REFUSE_NONE) {
        answer_refused(r);
        return EDGE_ANSWERED;
    }
    struct head_scan s;
    char why_buf[128], authority[256];
    const char *why = read_head(r, method, &s, why_buf, sizeof(why_buf));
    if (!route_request(r, &s, why, authority, sizeof(authority)))
        return EDGE_ANSWERED;
    bool chunked = s.count[HF_TRANSFER_ENCODING] > 0;
    int64_t cl = s.value[HF_CONTENT_LENGTH]
                     ? hdr_value_uint(s.value[HF_CONTENT_LENGTH], s.value_len[HF_CONTENT_LENGTH])
                     : -1;
    if (cl > 0 && (uint64_t)cl > r->cfg->max_body_bytes) {
        edge_error(r, 413, "body_too_large",
                   "the request body is larger than limits.max_body_bytes");
        return EDGE_ANSWERED;
    }
    b->has_body = chunked || cl >= 0;
    b->length = chunked ? -1 : cl;
    if (r->route->delivery.mode == CFG_DELIVERY_DURABLE && !r->front->ops->delivery)
        return EDGE_DURABLE; /* stored, not forwarded */
    if (s.value[HF_UPGRADE] && r->front->proto == FRONT_HTTP1 &&
        head_connection_names(&s, "upgrade") && !plan_upgrade(r, &s, b->has_body))
        return EDGE_ANSWERED;
    if (!set_policy(r, &s) || !plan_forward(r, &s, b))
        return EDGE_ANSWERED;
    return intake_streams(&r->body) ? EDGE_STREAM : EDGE_BUFFER;
}

/* Request trailers (docs/forwarding.md, "Request trailers"): bounded together with the head,
 * as a head alone is; past the bounds none goes rather than some, and the request goes on (its
 * head and body went upstream already when it streams). */
void edge_trailer(struct retry_req *r, const char *k, size_t kl, const char *v, size_t vl)
{
    if (r->flags & RF_TRAILERS_OFF)
        return;
    /* left out as from the head, by the same filter: the head's Connection values are read
     * again from the front end, which keeps the head until the request ends (rare: a head that
     * has one) */
    struct head_scan s;
    struct fields_up up = { .deadline_header = r->route ? r->route->deadline_header : NULL,
                            .drop_underscored =
                                r->cfg->headers_with_underscores != CFG_UNDERSCORES_ALLOW,
                            .grpc = r->flags & RF_GRPC };
    if (r->flags & RF_CONNECTION) {
        head_scan(&s, each_field, r->front);
        up.connection = s.connection;
        up.n_connection = s.n_connection;
    }
    if (fields_up_drops(&up, k, kl))
        return;
    const char *why = NULL;
    r->head_size += kl + vl + 32;
    if (!hdr_name_valid_n(k, kl) || !hdr_value_valid_n(v, vl))
        why = "a trailer field with a forbidden character";
    else if (r->head_size > r->cfg->max_header_bytes ||
             r->head_fields + r->trailers.count >= REQ_FIELDS_MAX)
        why = "the head and trailers are larger than limits.max_header_bytes or 100 fields";
    else if (hlist_add(&r->trailers, k, kl, v, vl) < 0)
        why = "out of memory";
    if (!why) {
        hlist_lower_last(&r->trailers); /* as HTTP/2 spells names */
        return;
    }
    r->flags |= RF_TRAILERS_OFF;
    hlist_clear(&r->trailers);
    log_event(CFG_LOG_WARN, "request trailers not forwarded", "request_id", r->request_id, "reason",
              why, NULL);
}

/* A retryable response was kept whole: retrying that stops returns it. */
bool edge_saved_whole(const struct retry_req *r)
{
    return (r->flags & (RF_SAVED | RF_SAVED_WHOLE)) == (RF_SAVED | RF_SAVED_WHOLE);
}

static struct answer_tag tag_of(const struct retry_req *r)
{
    return (struct answer_tag){
        .attempts = r->attempts,
        .request_id = r->request_id[0] ? r->request_id : NULL,
        .stop = r->stop != RETRY_STOP_NONE ? retry_stop_name(r->stop) : NULL,
        /* a head that could not be framed or was malformed, an upgrade, or draining: no more
         * requests here */
        .close = r->refused != REFUSE_NONE || (r->flags & RF_BAD_HEAD) || r->upgrade[0] ||
                 atomic_load_explicit(&r->w->px->draining, memory_order_relaxed),
        .throttled = r->flags & RF_THROTTLED ? r->throttle_p : -1,
    };
}

/* The current attempt's response is the answer (the machine is in RS_STREAM): it goes to the
 * client, or, an upgrade's 101, becomes a tunnel (false). */
bool edge_stream(struct retry_req *r)
{
    /* committed: a slow client must not hold a slot meant for upstream attempts */
    attempt_commit(&r->cur->att);
    struct answer_tag tag = tag_of(r);
    if (r->cur->att.status == 101) {
        /* an upgrade the upstream agreed to (proxy/upstream/h1resp.c): committed, and a tunnel once
         * the client has it; an upgrade refused is answered as it came, and the connection
         * closed (tag.close), so no byte sent after it is read as a request */
        struct front_tunnel conf = { r->cfg->tunnel_idle_timeout_ms,
                                     &r->w->px->tunnels,
                                     &r->w->tunnels,
                                     r->w->px->metrics,
                                     r->m,
                                     r->w->id,
                                     r->route ? r->route->name : "",
                                     r->request_id };
        tag.close = false;
        /* timeout_ms covered the handshake; the tunnel has its idle limit instead */
        loop_timer_stop(r->w->loop, &r->deadline_timer);
        r->front->ops->upgrade(r->front, &r->cur->att.head, &tag, attempt_take_tunnel(&r->cur->att),
                               &conf);
        return false;
    }
    r->front->ops->response(r->front, r->cur->att.status, &r->cur->att.head, &tag);
    return true;
}

/* An error of retryproxy's own: {"error": ..., "route": ..., "attempts": N, "message": ...}. */
void edge_error(struct retry_req *r, unsigned status, const char *code, const char *message)
{
    if (r->flags & RF_GRPC)
        tally_grpc(r, (int)grpc_code_of_error(code, status));
    struct answer_tag tag = tag_of(r);
    if (status == 405) /* CONNECT, the one method not forwarded (RFC 9110 15.5.6) */
        tag.allow = EDGE_ALLOW;
    r->front->ops->error(r->front, status, code, r->route ? r->route->name : NULL, message, &tag);
}

/* The saved retryable response, when retrying stopped after it. */
void edge_saved(struct retry_req *r)
{
    struct answer_tag tag = tag_of(r);
    if (r->flags & RF_GRPC)
        tally_grpc(r, grpc_status_seen(r->saved.status, &r->saved.h, &r->saved.trailers));
    r->front->ops->saved(r->front, r->saved.status, &r->saved.h, r->saved.body, r->saved.len,
                         &r->saved.trailers, &tag);
}

/* Why a name has no address, as its last lookup went (proxy/dns/resolve.h). */
static const char *no_address_reason(enum dns_result last)
{
    switch (last) {
    case DNS_NXDOMAIN:
        return "NXDOMAIN or no A/AAAA record";
    case DNS_FAILED:
        return "DNS failing: timeout, SERVFAIL, refused or no server";
    case DNS_NONE:
        return "not resolved yet";
    default:
        return "no address";
    }
}

/* No name of the route has an address now: there is nothing to connect to, and a backoff wait
 * would not change that (a name is asked again on its own schedule, docs/endpoints.md). So the
 * request is answered at once (docs/endpoints.md, "A name without addresses"), by the machine:
 * with the response of an earlier attempt when one was kept whole, else 503 no_address naming
 * each host and why ('msg'). Returns false when the attempt should go on as before (a connect
 * failure): an upstream has an address (one joined since the pick), or an upstream has no name
 * (no resolver). */
bool edge_no_address(struct retry_req *r, char *msg, size_t cap)
{
    const struct cfg_route *rt = r->route;
    size_t len = (size_t)snprintf(msg, cap, "no address for");
    for (size_t k = 0; k < rt->n_upstreams; k++) {
        struct dns_name *name = r->rtr->names[k];
        if (!name)
            return false;
        struct dns_addrs *as = dns_name_addrs(name);
        size_t n = as->n;
        dns_addrs_unref(as);
        if (n)
            return false;
        bool said = false; /* a host two upstreams name is said once */
        for (size_t j = 0; j < k; j++)
            said |= strcmp(rt->upstreams[j].host, rt->upstreams[k].host) == 0;
        struct dns_status st;
        dns_name_status(name, &st);
        if (!said && len < cap)
            len += (size_t)snprintf(msg + len, cap - len, "%s %s (%s)", k ? "," : "",
                                    rt->upstreams[k].host, no_address_reason(st.last));
    }
    return true;
}

/* ---- the client going away ---- */

/* The client left while its answer went out, the upstream still sending its body: the answer
 * is cut short. It keeps the status sent (as nginx keeps it once bytes have gone) and is
 * logged with "stop": "client-closed" unless retrying had stopped for a reason the answer
 * carries, and counted in client_gone_total (tally_done), once. */
void edge_cut_short(struct retry_req *r)
{
    const struct front *f = r->front;
    /* nothing went out (the client left before its answer: status 0), no body was to follow
     * the head (its transfer may end after the head went), or the cut is the proxy's own: it
     * stops, past the drain's grace */
    if (!f->sent || f->is_head || !answer_status_has_body((int)f->status) ||
        atomic_load_explicit(&r->w->stop, memory_order_relaxed))
        return;
    r->flags |= RF_CUT_SHORT;
    if (r->stop == RETRY_STOP_NONE)
        r->stop = RETRY_STOP_CLIENT_CLOSED;
}
