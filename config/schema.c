/* schema -- the config schema table: one row per key (its type, bounds, default, whether
 * "defaults" may hold it, when a change takes effect, what it means), and the rules across
 * the keys of one object. config/schema_walk.c applies the table; config/schema_values.c
 * checks the values a row names a check or parser for.
 */
#include "config/schema_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/pem.h"

/* ---- cross-field rules ---- */

static const struct origin *origin_of(const struct ctx *x, const char *key)
{
    for (size_t i = 0; i < x->s->n; i++)
        if (strcmp(x->s->fields[i].key, key) == 0)
            return &x->origin[i];
    abort(); /* a rule naming a key its schema lacks is a bug */
}

/* Describes where an inherited value comes from, for messages: "" when written here. */
static const char *provenance(struct walk *w, const struct origin *o)
{
    if (o->layer == 0)
        return "";
    if (o->layer < 0)
        return ", the default";
    return arena_printf(&w->tmp, ", from %s", o->at.path);
}

/* Reports a rule broken by 'blame' together with 'other' (may be NULL) at 'blame's path in
 * this object. When neither value is written in this object itself, both come from
 * "defaults", where the same rule has already been reported. */
static void rule_error(struct walk *w, const struct ctx *x, const char *blame, const char *other,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void rule_error(struct walk *w, const struct ctx *x, const char *blame, const char *other,
                       const char *fmt, ...)
{
    const struct origin *b = origin_of(x, blame), *o = other ? origin_of(x, other) : NULL;
    /* An invalid value (layer -2) was reported already; a rule on it would mislead. */
    if (b->layer == -2 || (o && o->layer == -2))
        return;
    if (b->layer != 0 && (!o || o->layer != 0))
        return;
    const struct jpos_entry *pos = b->layer == 0 ? b->at.pos : o->at.pos;
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    struct at at = { jpos_path_key(&w->tmp, x->path, blame, strlen(blame)), pos };
    schema_err_at(w, &at, "%s", msg);
}

static void check_backoff(struct walk *w, const struct ctx *x, void *dst)
{
    const struct backoff_spec *b = dst;
    const char *pname = backoff_policy_names[b->policy];
    if (b->base_ms == 0 && b->policy != BACKOFF_RANDOM)
        rule_error(w, x, "base_ms", "policy",
                   "must be at least 1 with policy \"%s\" (only \"random\" allows 0), got 0",
                   pname);
    if (b->cap_ms < b->base_ms)
        rule_error(w, x, "cap_ms", "base_ms", "cap_ms (%u%s) must be at least base_ms (%u%s)",
                   b->cap_ms, provenance(w, origin_of(x, "cap_ms")), b->base_ms,
                   provenance(w, origin_of(x, "base_ms")));
    if (b->policy == BACKOFF_DECORRELATED && b->jitter != JITTER_NONE)
        rule_error(w, x, "jitter", "policy",
                   "must be \"none\" with policy \"decorrelated\" (its delays are already "
                   "random), got \"%s\"%s",
                   backoff_jitter_names[b->jitter],
                   origin_of(x, "jitter")->layer < 0 ? " (the default)" : "");
}

static void check_throttle(struct walk *w, const struct ctx *x, void *dst)
{
    const struct throttle_limits *t = dst;
    if (t->k > 0 && t->k < 1)
        rule_error(w, x, "k", "k",
                   "must be 0 (no throttling) or at least 1: below 1 a healthy upstream is "
                   "throttled too, got %g",
                   t->k);
}

/* Hedging starts the next attempt the way a "timeout" retry would: without that token in
 * retry_on it could never start one. */
static void check_retry(struct walk *w, const struct ctx *x, void *dst)
{
    const struct cfg_retry *r = dst;
    bool on_timeout = false;
    for (size_t i = 0; i < r->n_on; i++)
        on_timeout |= r->on[i].kind == CFG_RETRY_TIMEOUT;
    if (r->hedge && !on_timeout)
        rule_error(w, x, "hedge_on_per_try_timeout", "retry_on",
                   "needs \"timeout\" in retry_on: a hedge is the retry of an attempt that "
                   "passed per_try_timeout_ms");
}

/* A client certificate needs its key: in key_file, or in cert_file itself. */
static void check_tls(struct walk *w, const struct ctx *x, void *dst)
{
    const struct cfg_tls *t = dst;
    if (t->key_file && !t->cert_file)
        rule_error(w, x, "key_file", "cert_file",
                   "needs cert_file: the key is of a client certificate");
    else if (t->cert_file && !t->key_file && !pem_has_key(t->cert_file))
        rule_error(w, x, "cert_file", "key_file",
                   "holds no private key: name the key's file in key_file");
}

/* dead_letter not written: the mode decides, for each route ("defaults" keeps null, so that
 * a durable route inheriting it still keeps dead letters). */
static void check_delivery(struct walk *w, const struct ctx *x, void *dst)
{
    (void)w;
    struct cfg_delivery *d = dst;
    if (d->dead_letter < 0 && !x->in_defaults)
        d->dead_letter = d->mode == CFG_DELIVERY_DURABLE;
}

/* A route that keeps requests needs somewhere to keep them. */
static void check_root(struct walk *w, const struct ctx *x, void *dst)
{
    (void)x;
    const struct cfg *c = dst;
    if (c->store.path || c->store.postgres.url)
        return;
    for (size_t i = 0; i < c->n_routes; i++) {
        const struct cfg_route *r = &c->routes[i];
        bool durable = r->delivery.mode == CFG_DELIVERY_DURABLE;
        if (!r->name || (!durable && r->delivery.dead_letter <= 0))
            continue;
        const char *route = jpos_path_index(&w->tmp, "$.routes", i);
        struct at at = schema_child_at(w, route, "delivery");
        if (!at.pos)
            at = schema_child_at(w, "$", "defaults");
        schema_err_at(w, &at,
                      "route \"%s\" %s, but no store is configured: set store.path or "
                      "store.postgres.url (docs/delivery.md)",
                      r->name,
                      durable ? "is durable (delivery.mode \"durable\")"
                              : "keeps dead letters (delivery.dead_letter)");
    }
}

static void check_route(struct walk *w, const struct ctx *x, void *dst)
{
    const struct cfg_route *r = dst;
    if (r->retry.hedge && r->per_try_timeout_ms == 0)
        rule_error(w, x, "per_try_timeout_ms", "retry",
                   "must be above 0 with retry.hedge_on_per_try_timeout: hedging starts the next "
                   "attempt when an attempt passes it");
    if (r->per_try_timeout_ms > r->timeout_ms)
        rule_error(w, x, "per_try_timeout_ms", "timeout_ms",
                   "per_try_timeout_ms (%u%s) must not exceed timeout_ms (%u%s)",
                   r->per_try_timeout_ms, provenance(w, origin_of(x, "per_try_timeout_ms")),
                   r->timeout_ms, provenance(w, origin_of(x, "timeout_ms")));
}

/* ---- the table ---- */

#define UINT_FIELD_F(k, T, member, fl, lo, hi, d, text)                                            \
    {                                                                                              \
        .key = k, .type = FT_UINT, .flags = fl, .offset = offsetof(T, member),                     \
        .size = sizeof(((T *)0)->member), .min = lo, .max = hi, .def = d, .doc = text              \
    }
#define UINT_FIELD(k, T, member, lo, hi, d, text) UINT_FIELD_F(k, T, member, 0, lo, hi, d, text)
#define NUM_FIELD(k, T, member, lo, hi, d, text)                                                   \
    {                                                                                              \
        .key = k, .type = FT_NUMBER, .offset = offsetof(T, member), .min = lo, .max = hi,          \
        .def = d, .doc = text                                                                      \
    }
#define STRING_FIELD(k, T, member, fl, check, d, text)                                             \
    {                                                                                              \
        .key = k, .type = FT_STRING, .flags = fl, .offset = offsetof(T, member),                   \
        .check_str = check, .def = d, .doc = text                                                  \
    }
#define BOOL_FIELD(k, T, member, d, text)                                                          \
    {                                                                                              \
        .key = k, .type = FT_BOOL, .offset = offsetof(T, member), .def = d, .doc = text            \
    }
#define ENUM_FIELD(k, T, member, table, d, text)                                                   \
    {                                                                                              \
        .key = k, .type = FT_ENUM, .offset = offsetof(T, member), .names = table,                  \
        .n_names = COUNT(table), .def = d, .doc = text                                             \
    }
#define OBJ_FIELD(k, T, member, sch, fl, text)                                                     \
    {                                                                                              \
        .key = k, .type = FT_OBJECT, .flags = fl, .offset = offsetof(T, member), .sub = &sch,      \
        .doc = text                                                                                \
    }

/* A list kept as an array and its count, members 'member' and 'count' of T. */
#define LIST_FIELD(k, T, member, count, kind_, fl, why_empty, d, text)                             \
    {                                                                                              \
        .key = k, .type = FT_LIST, .flags = fl, .offset = offsetof(T, member),                     \
        .count_offset = offsetof(T, count), .list = &kind_, .empty = why_empty, .def = d,          \
        .doc = text                                                                                \
    }
/* A list of a kind of bits, kept as their union in the uint32_t 'member' of T. */
#define SET_FIELD(k, T, member, kind_, fl, why_empty, d, text)                                     \
    {                                                                                              \
        .key = k, .type = FT_LIST, .flags = fl, .offset = offsetof(T, member), .list = &kind_,     \
        .empty = why_empty, .def = d, .doc = text                                                  \
    }

/* An object's keys: the rows of 'fields' and the rule 'check' (NULL: none) across them. */
#define SCHEMA(fields, check)                                                                      \
    {                                                                                              \
        fields, COUNT(fields), check                                                               \
    }

/* An object whose keys are stored in the enclosing struct itself (its fields' offsets are
 * relative to that struct). */
#define INLINE_OBJ(k, sch, text)                                                                   \
    {                                                                                              \
        .key = k, .type = FT_OBJECT, .offset = 0, .sub = &sch, .doc = text                         \
    }

static const char *const log_level_names[] = { "debug", "info", "warn", "error" };
static const char *const log_format_names[] = { "json", "text" };
static const char *const underscores_names[] = { "drop", "reject", "allow" };
static const char *const balance_names[] = { [CFG_BALANCE_LEAST_REQUEST] = "least_request",
                                             [CFG_BALANCE_ROUND_ROBIN] = "round_robin",
                                             [CFG_BALANCE_RANDOM] = "random" };
static const char *const http2_names[] = {
    [CFG_HTTP2_AUTO] = "auto", [CFG_HTTP2_OFF] = "off", [CFG_HTTP2_REQUIRED] = "required"
};

const char *cfg_log_level_name(enum cfg_log_level level)
{
    return (size_t)level < COUNT(log_level_names) ? log_level_names[level] : "";
}

const char *cfg_log_format_name(enum cfg_log_format format)
{
    return (size_t)format < COUNT(log_format_names) ? log_format_names[format] : "";
}

/* A backoff policy's keys, with the defaults of where it is used: retry.backoff (the delay
 * before each retry) and ejection.backoff (how long each ejection lasts). */
#define BACKOFF_FIELDS(base_default, cap_default, jitter_default)                                  \
    ENUM_FIELD("policy", struct backoff_spec, policy, backoff_policy_names, "\"exponential\"",     \
               "how the delay grows: fixed, random, fibonacci, exponential or decorrelated"),      \
        UINT_FIELD("base_ms", struct backoff_spec, base_ms, 0, MS_MAX, base_default,               \
                   "the first delay (at least 1, except for the random policy)"),                  \
        UINT_FIELD("cap_ms", struct backoff_spec, cap_ms, 0, MS_MAX, cap_default,                  \
                   "hard limit on every delay, jitter included; at least base_ms"),                \
        NUM_FIELD("factor", struct backoff_spec, factor, 1.0, 100.0, "2.0",                        \
                  "growth factor of the exponential policy"),                                      \
        UINT_FIELD("steps", struct backoff_spec, steps, 0, 1000, "0",                              \
                   "0: keep growing; N: stop growing after N retries (Kubernetes Steps)"),         \
        ENUM_FIELD("jitter", struct backoff_spec, jitter, backoff_jitter_names, jitter_default,    \
                   "none, full, equal, proportional, additive, bounded or constant; decorrelated " \
                   "needs none"),                                                                  \
        NUM_FIELD("jitter_ratio", struct backoff_spec, jitter_ratio, 0.0, 1.0, "0.2",              \
                  "spread of the proportional and additive jitter"),                               \
        UINT_FIELD("jitter_ms", struct backoff_spec, jitter_ms, 0, MS_MAX, "0",                    \
                   "spread of the constant jitter")

static const struct field backoff_fields[] = {
    BACKOFF_FIELDS("100", "10000", "\"full\""),
    ENUM_FIELD("scope", struct backoff_spec, scope, backoff_scope_names, "\"request\"",
               "request: a sequence per request; route: one sequence shared by the route, moved by "
               "each retry taken"),
    UINT_FIELD("reset_after_ms", struct backoff_spec, reset_after_ms, 0, MS_MAX, "0",
               "scope route: restart the sequence after this long without a retry (0: never)"),
};
static const struct schema backoff_schema = SCHEMA(backoff_fields, check_backoff);

/* ejection.backoff: the same policy without scope (every upstream has its own sequence) and
 * reset_after_ms (ejection's own); the n-th ejection lasts the n-th delay. */
static const struct field ejection_backoff_fields[] = {
    BACKOFF_FIELDS("1000", "30000", "\"none\""),
};
static const struct schema ejection_backoff_schema = SCHEMA(ejection_backoff_fields, check_backoff);

/* ejection's keys land in struct cfg_ejection, the policy's spec in its 'health'. */
static const struct field ejection_fields[] = {
    UINT_FIELD("consecutive_failures", struct cfg_ejection, health.consecutive_failures, 0, 1000,
               "0",
               "failures in a row that eject an upstream from the route's rotation (0: never, "
               "every upstream stays in turn)"),
    LIST_FIELD("on", struct cfg_ejection, on, n_on, schema_retry_on_list, 0,
               "must name at least one condition (set consecutive_failures to 0 to turn "
               "ejection off)",
               "[\"connect-failure\", \"reset\", \"timeout\", \"5xx\"]",
               "what counts as a failure, as retry_on tokens; any other outcome is a success"),
    OBJ_FIELD("backoff", struct cfg_ejection, health.backoff, ejection_backoff_schema, 0,
              "how long each ejection lasts: the n-th ejection in a row lasts the n-th delay of "
              "this policy (docs/backoff.md)"),
    UINT_FIELD("reset_after_ms", struct cfg_ejection, health.reset_after_ms, 0, MS_MAX, "60000",
               "after this long healthy (no failure, not ejected) the next ejection is the first "
               "again (0: never)"),
};
static const struct schema ejection_schema = SCHEMA(ejection_fields, NULL);

static const struct field retry_after_fields[] = {
    BOOL_FIELD("honor", struct cfg_retry, retry_after_honor, "true",
               "a Retry-After on a retryable response replaces the computed delay"),
    UINT_FIELD("max_ms", struct cfg_retry, retry_after_max_ms, 0, MS_MAX, "30000",
               "a longer Retry-After ends retrying and returns the response"),
};
/* retry_after's two keys land directly in struct cfg_retry. */
static const struct schema retry_after_schema = SCHEMA(retry_after_fields, NULL);

static const struct field retry_fields[] = {
    UINT_FIELD("max_attempts", struct cfg_retry, max_attempts, 1, 100, "3",
               "attempts in total, the first included (1 disables retries)"),
    LIST_FIELD("retry_on", struct cfg_retry, on, n_on, schema_retry_on_list, 0, NULL,
               "[\"connect-failure\", \"reset\", \"timeout\", \"gateway-error\", \"429\"]",
               "connect-failure, reset, timeout, 5xx, gateway-error, a status (\"429\"), a "
               "range (\"500-599\"), a response header (\"header:NAME\", "
               "\"header:NAME=VALUE\"), or on gRPC calls a gRPC status: cancelled, "
               "deadline-exceeded, resource-exhausted, internal, unavailable, \"grpc:N\", "
               "\"grpc:N-M\" (docs/grpc.md)"),
    SET_FIELD("methods", struct cfg_retry, methods, schema_method_list, 0, NULL,
              "[\"GET\", \"HEAD\", \"OPTIONS\", \"PUT\", \"DELETE\", \"TRACE\"]",
              "methods retried once bytes reached the upstream (connect-failure retries every "
              "method)"),
    BOOL_FIELD("idempotency_key", struct cfg_retry, idempotency_key, "true",
               "a request with an Idempotency-Key header is retryable whatever its method"),
    UINT_FIELD("max_retry_body_bytes", struct cfg_retry, max_retry_body_bytes, 0, 1073741824.0,
               "1048576",
               "larger request bodies are streamed once and never retried (held in memory "
               "up to this size)"),
    INLINE_OBJ("retry_after", retry_after_schema, "how Retry-After is honoured"),
    STRING_FIELD("pushback_header", struct cfg_retry, pushback_header, F_NULLABLE,
                 schema_check_field_name, "null",
                 "a response header that steers the retry (gRPC's grpc-retry-pushback-ms): a "
                 "whole number of milliseconds is the next wait, anything else stops retrying "
                 "(null: none)"),
    BOOL_FIELD("hedge_on_per_try_timeout", struct cfg_retry, hedge, "false",
               "an attempt that passes per_try_timeout_ms is not cancelled: the next attempt "
               "starts beside it and the first response retry_on does not name wins (Envoy's "
               "hedging)"),
    UINT_FIELD("grpc_hold_ms", struct cfg_retry, grpc_hold_ms, 0, MS_MAX, "500",
               "on a gRPC call whose retry_on names a gRPC status, how long the first message of a "
               "response is held back for the status in its trailers: then it goes to the client "
               "and the call is never retried (0: never held; docs/grpc.md)"),
    OBJ_FIELD("backoff", struct cfg_retry, backoff, backoff_schema, 0,
              "the delay before each retry (docs/backoff.md)"),
};
static const struct schema retry_schema = SCHEMA(retry_fields, check_retry);

/* The process-wide and per-route budgets differ only in the default concurrency cap. */
#define BUDGET_FIELDS(max_concurrent_default)                                                      \
    { .key = "max_concurrent_retries",                                                             \
      .type = FT_UINT,                                                                             \
      .flags = F_NULLABLE,                                                                         \
      .offset = offsetof(struct budget_limits, max_concurrent_retries),                            \
      .size = sizeof(int64_t),                                                                     \
      .min = 0,                                                                                    \
      .max = 1000000000.0,                                                                         \
      .def = max_concurrent_default,                                                               \
      .doc = "retries in flight at once, backoff waits included (null: no cap)" },                 \
        NUM_FIELD("retry_ratio", struct budget_limits, retry_ratio, 0.0, NO_MAX, "0.2",            \
                  "retries allowed per first attempt over the window"),                            \
        NUM_FIELD("min_retries_per_second", struct budget_limits, min_retries_per_second, 0.0,     \
                  NO_MAX, "10", "retries always allowed per second of window"),                    \
        UINT_FIELD("window_ms", struct budget_limits, window_ms, 1, MS_MAX, "10000",               \
                   "the sliding window of the ratio budget")

static const struct field top_budget_fields[] = { BUDGET_FIELDS("100") };
static const struct schema top_budget_schema = SCHEMA(top_budget_fields, NULL);
static const struct field route_budget_fields[] = { BUDGET_FIELDS("null") };
static const struct schema route_budget_schema = SCHEMA(route_budget_fields, NULL);

static const struct field throttle_fields[] = {
    NUM_FIELD("k", struct throttle_limits, k, 0, 100, "0",
              "throttle when attempts exceed k times those the upstream accepts: reject locally "
              "with probability (requests - k * accepts) / (requests + 1) (0: never; the SRE "
              "book uses 2)"),
    UINT_FIELD("window_ms", struct throttle_limits, window_ms, 1, MS_MAX, "120000",
               "the sliding window the requests and accepts are counted over"),
};
static const struct schema throttle_schema = SCHEMA(throttle_fields, check_throttle);

static const struct field tls_fields[] = {
    STRING_FIELD("ca_file", struct cfg_tls, ca_file, F_NULLABLE, schema_check_ca_file, "null",
                 "a file of PEM certificates that https upstreams' certificates are verified "
                 "against, instead of the system's store (null: the system's store)"),
    STRING_FIELD("cert_file", struct cfg_tls, cert_file, F_NULLABLE, schema_check_cert_file, "null",
                 "a PEM file of the client certificate (and its chain) the proxy presents to "
                 "https upstreams that ask for one, mutual TLS (null: none)"),
    STRING_FIELD("key_file", struct cfg_tls, key_file, F_NULLABLE, schema_check_key_file, "null",
                 "a PEM file of cert_file's private key, unencrypted (null: cert_file holds it)"),
    STRING_FIELD("server_name", struct cfg_tls, server_name, F_NULLABLE, schema_check_server_name,
                 "null",
                 "the name sent in SNI and verified against the upstream's certificate, "
                 "instead of the URL's host; connections still go to the URL's host, and Host "
                 "is unchanged (null: the URL's host)"),
    ENUM_FIELD("http2", struct cfg_tls, http2, http2_names, "\"auto\"",
               "auto: offer h2 and http/1.1 by ALPN and speak what the upstream chooses; off: "
               "HTTP/1.1 only; required: h2 only, an upstream that does not choose it is a "
               "connect failure (docs/http2.md)"),
};
static const struct schema tls_schema = SCHEMA(tls_fields, check_tls);

/* match's keys land directly in struct cfg_route. */
static const struct field match_fields[] = {
    STRING_FIELD("path_prefix", struct cfg_route, match_path_prefix, 0, schema_check_path_prefix,
                 "\"/\"", "requests whose path starts with this"),
    { .key = "host",
      .type = FT_CUSTOM,
      .flags = F_NULLABLE,
      .offset = offsetof(struct cfg_route, match_host),
      .def = "null",
      .parse = schema_parse_match_host,
      .dump = schema_dump_string_or_null,
      .type_doc = "string or null",
      .doc = "the Host header, compared without its port unless this holds one (null: any)" },
    SET_FIELD("methods", struct cfg_route, match_methods, schema_method_list, F_NULLABLE,
              "must not be empty (leave the key out to match every method)", "null",
              "request methods (null: any)"),
};
static const struct schema match_schema = SCHEMA(match_fields, NULL);

static const char *const delivery_mode_names[] = {
    [CFG_DELIVERY_SYNC] = "sync", [CFG_DELIVERY_DURABLE] = "durable"
};

static const struct field delivery_fields[] = {
    ENUM_FIELD("mode", struct cfg_delivery, mode, delivery_mode_names, "\"sync\"",
               "sync: retries while the caller waits; durable: the caller gets 202 Accepted with "
               "X-Delivery-Id once the request is stored, and the proxy delivers it by the "
               "route's retry policy (docs/delivery.md)"),
    { .key = "dead_letter",
      .type = FT_CUSTOM,
      .offset = offsetof(struct cfg_delivery, dead_letter),
      .def = "null",
      .parse = schema_parse_dead_letter,
      .dump = schema_dump_dead_letter,
      .type_doc = "boolean or null",
      .doc = "keep a request whose attempts are spent, or whose final answer is no success, as "
             "a dead letter to replay (null: true for durable routes, false for sync ones, "
             "whose callers still get the final answer at once)" },
    UINT_FIELD("max_age_ms", struct cfg_delivery, max_age_ms, 1, 2592000000.0, "86400000",
               "a durable delivery not done this long after its accept is dead, whatever "
               "retry.max_attempts says (at most 30 days)"),
    STRING_FIELD("id_header", struct cfg_delivery, id_header, 0, schema_check_header_name,
                 "\"webhook-id\"",
                 "carries the delivery's id on every attempt, so that the upstream can "
                 "de-duplicate (a caller's Idempotency-Key is forwarded as well)"),
    UINT_FIELD("max_body_bytes", struct cfg_delivery, max_body_bytes, 0, 67108864.0, "1048576",
               "a larger durable request is answered 413 before anything is stored"),
    UINT_FIELD("max_in_flight", struct cfg_delivery, max_in_flight, 1, 100000, "64",
               "the route's durable attempts running at once in the process; more wait, due"),
    UINT_FIELD("max_in_flight_per_upstream", struct cfg_delivery, max_in_flight_per_upstream, 1,
               100000, "32", "... of them, to one of the route's upstreams"),
    UINT_FIELD("max_per_second", struct cfg_delivery, max_per_second, 1, 1000000, "100",
               "durable attempts started per second on this route at most: a backlog due at "
               "once (a replay, the end of an outage) reaches a recovering upstream paced"),
};
static const struct schema delivery_schema = SCHEMA(delivery_fields, check_delivery);

static const struct field route_fields[] = {
    STRING_FIELD("name", struct cfg_route, name, F_REQUIRED | F_ROUTE_ONLY, schema_check_route_name,
                 NULL, "unique name, used in metrics, logs and /schedule"),
    { .key = "match",
      .type = FT_OBJECT,
      .flags = F_ROUTE_ONLY,
      .offset = 0, /* inline: match's keys live in struct cfg_route */
      .sub = &match_schema,
      .doc = "which requests the route takes (first match in file order wins)" },
    LIST_FIELD("upstreams", struct cfg_route, upstreams, n_upstreams, schema_upstream_list,
               F_REQUIRED | F_ROUTE_ONLY, "must hold at least one upstream URL", NULL,
               "http://, https:// or h2c:// (HTTP/2 over cleartext, docs/http2.md) base URLs; a "
               "host name stands for every address it resolves to (docs/endpoints.md)"),
    ENUM_FIELD("balance", struct cfg_route, balance, balance_names, "\"least_request\"",
               "how each attempt picks among the route's endpoints: least_request (two choices, "
               "the next in turn and one at random: the one with fewer requests in flight for its "
               "weight; "
               "round-robin when none wait), round_robin, random (docs/endpoints.md)"),
    BOOL_FIELD("weigh_endpoints", struct cfg_route, weigh_endpoints, "true",
               "weigh each endpoint by how it answered lately (failure ratio as retry_on judges "
               "it, latency): one that fails or is slow gets fewer attempts; false: all alike "
               "(docs/endpoints.md)"),
    OBJ_FIELD("ejection", struct cfg_route, ejection, ejection_schema, 0,
              "endpoint health: an endpoint that keeps failing leaves the rotation for a while "
              "(docs/forwarding.md)"),
    BOOL_FIELD("preserve_host", struct cfg_route, preserve_host, "false",
               "send the client's Host instead of the upstream's authority"),
    UINT_FIELD("timeout_ms", struct cfg_route, timeout_ms, 1, MS_MAX, "15000",
               "the whole request: every attempt and backoff wait"),
    UINT_FIELD("per_try_timeout_ms", struct cfg_route, per_try_timeout_ms, 0, MS_MAX, "0",
               "one attempt until its response headers (0: only timeout_ms)"),
    UINT_FIELD("connect_timeout_ms", struct cfg_route, connect_timeout_ms, 0, MS_MAX, "1000",
               "establishing one upstream connection (0: no separate limit)"),
    STRING_FIELD("deadline_header", struct cfg_route, deadline_header, F_NULLABLE,
                 schema_check_header_name, "null",
                 "a header sent with each attempt: the milliseconds the proxy will still wait "
                 "for its answer (null: none)"),
    OBJ_FIELD("retry", struct cfg_route, retry, retry_schema, 0, "when and how to retry"),
    OBJ_FIELD("budget", struct cfg_route, budget, route_budget_schema, 0,
              "this route's retry budget, checked as well as the process-wide one"),
    OBJ_FIELD("throttle", struct cfg_route, throttle, throttle_schema, 0,
              "client-side throttling: fewer attempts to an upstream that keeps failing"),
    OBJ_FIELD("tls", struct cfg_route, tls, tls_schema, 0,
              "how https upstreams are reached: the certificates trusted, the client "
              "certificate, the name verified, and HTTP/2 by ALPN"),
    LIST_FIELD("upgrades", struct cfg_route, upgrades, n_upgrades, schema_upgrade_list, 0, NULL,
               "[\"websocket\"]",
               "HTTP/1.1 upgrade tokens tunnelled to the upstream once it answers 101 (any case; "
               "[]: none); a request for another is answered 501 (docs/upgrades.md)"),
    OBJ_FIELD("delivery", struct cfg_route, delivery, delivery_schema, 0,
              "durable delivery and dead letters (docs/delivery.md)"),
};
static const struct schema route_schema = SCHEMA(route_fields, check_route);

static const struct field log_fields[] = {
    ENUM_FIELD("level", struct cfg, log_level, log_level_names, "\"info\"",
               "debug, info, warn or error"),
    ENUM_FIELD("format", struct cfg, log_format, log_format_names, "\"json\"",
               "json (one object per line) or text"),
};
static const struct schema log_schema = SCHEMA(log_fields, NULL);

static const struct field limits_fields[] = {
    UINT_FIELD_F("max_connections", struct cfg, max_connections, F_RESTART, 1, 1000000, "10000",
                 "client connections open at once"),
    UINT_FIELD("connection_timeout_ms", struct cfg, connection_timeout_ms, 0, MS_MAX, "30000",
               "an idle or slow client connection is closed after this, counted in whole "
               "seconds rounded up (0: never)"),
    UINT_FIELD("send_buffer_bytes", struct cfg, send_buffer_bytes, 0, 16777216, "262144",
               "the kernel's send buffer of each new client connection (SO_SNDBUF, at most "
               "net.core.wmem_max), so that a client reading slowly cannot queue megabytes of "
               "responses in the kernel (0: the kernel's own sizing, up to 4 MiB a connection)"),
    UINT_FIELD("max_body_bytes", struct cfg, max_body_bytes, 0, 1099511627776.0, "67108864",
               "larger request bodies are answered 413"),
    UINT_FIELD("max_buffered_body_bytes", struct cfg, max_buffered_body_bytes, 0, 1099511627776.0,
               "134217728",
               "request-body bytes held for replay by the whole process; a body that does not "
               "fit streams to the upstream once and is not retried"),
    UINT_FIELD_F("max_header_bytes", struct cfg, max_header_bytes, F_RESTART, 1024, 65536, "8192",
                 "a request line and headers above this many bytes are answered 431; a client "
                 "connection holds up to twice this in memory"),
    UINT_FIELD("max_upstream_requests", struct cfg, max_upstream_requests, 1, 1000000, "1024",
               "upstream attempts in flight at once, shared evenly by the workers; more wait "
               "their turn in order, the wait counting against the route's timeout_ms. A "
               "transfer going at its client's pace holds none: a response streaming to the "
               "client, a body streamed once (docs/hardening.md)"),
    UINT_FIELD("upstream_share_percent", struct cfg, upstream_share_percent, 1, 100, "75",
               "the most of a worker's max_upstream_requests the attempts to one upstream "
               "endpoint (its origin at one address) hold at once; more wait their turn while "
               "attempts to other endpoints go on, so that a slow endpoint cannot take every "
               "slot (100: no such bound; docs/hardening.md)"),
    UINT_FIELD("connection_share_percent", struct cfg, connection_share_percent, 1, 100, "25",
               "the most of a worker's max_upstream_requests the attempts of one client "
               "connection (its HTTP/2 streams) hold at once; more wait their turn (100: no "
               "such bound)"),
    UINT_FIELD("header_timeout_ms", struct cfg, header_timeout_ms, 0, MS_MAX, "10000",
               "a request line and headers not complete this long after their first byte are "
               "answered 408 and the connection closed (0: no limit beyond "
               "connection_timeout_ms)"),
    ENUM_FIELD("headers_with_underscores", struct cfg, headers_with_underscores, underscores_names,
               "\"drop\"",
               "a request header whose name has an underscore (X_Forwarded_Proto), which CGI and "
               "WSGI upstreams merge with the dashed name the proxy sets: drop (not forwarded), "
               "reject (a 400 naming it) or allow (forwarded)"),
    UINT_FIELD("tunnel_idle_timeout_ms", struct cfg, tunnel_idle_timeout_ms, 0, MS_MAX, "300000",
               "an upgraded connection (a WebSocket) with no byte either way this long is closed "
               "(0: never; docs/upgrades.md)"),
    UINT_FIELD("max_tunnels", struct cfg, max_tunnels, 0, 1000000, "10000",
               "upgraded connections open at once in the process; an upgrade past it is answered "
               "503 (docs/upgrades.md)"),
};
static const struct schema limits_schema = SCHEMA(limits_fields, NULL);

/* Each name is asked again between the two bounds, whatever its TTL. */
static void check_resolver(struct walk *w, const struct ctx *x, void *dst)
{
    const struct cfg_resolver *r = dst;
    if (r->min_refresh_ms > r->max_refresh_ms)
        rule_error(w, x, "min_refresh_ms", "max_refresh_ms",
                   "min_refresh_ms (%u%s) must not exceed max_refresh_ms (%u%s)", r->min_refresh_ms,
                   provenance(w, origin_of(x, "min_refresh_ms")), r->max_refresh_ms,
                   provenance(w, origin_of(x, "max_refresh_ms")));
}

static const struct field resolver_fields[] = {
    LIST_FIELD("servers", struct cfg_resolver, servers, n_servers, schema_dns_server_list, 0, NULL,
               "[]",
               "the DNS servers asked for the upstreams' names, as \"IP:PORT\" (\"[::1]:53\" for "
               "IPv6), tried in order ([]: those of /etc/resolv.conf)"),
    UINT_FIELD("timeout_ms", struct cfg_resolver, timeout_ms, 1, 60000, "1000",
               "one lookup's whole time, every server and try included; past it the lookup "
               "failed and the name keeps its addresses"),
    UINT_FIELD("min_refresh_ms", struct cfg_resolver, min_refresh_ms, 1, MS_MAX, "1000",
               "a name is asked again when its records' TTL runs out, but never sooner than this "
               "(nor sooner after a failed lookup)"),
    UINT_FIELD("max_refresh_ms", struct cfg_resolver, max_refresh_ms, 1, MS_MAX, "30000",
               "... and never later than this, whatever the TTL; at least min_refresh_ms"),
    UINT_FIELD("nxdomain_keep_ms", struct cfg_resolver, nxdomain_keep_ms, 0, MS_MAX, "30000",
               "how long a name that had addresses keeps them once the answer is NXDOMAIN or "
               "holds none; then it has none (docs/endpoints.md)"),
};
static const struct schema resolver_schema = SCHEMA(resolver_fields, check_resolver);

static const struct field store_pg_fields[] = {
    STRING_FIELD("url", struct cfg_store_pg, url, F_NULLABLE | F_RESTART | F_NO_ECHO,
                 schema_check_pg_url, "null",
                 "the shared PostgreSQL store: a libpq connection URI "
                 "(postgresql://user@host:5432/db?sslmode=verify-full) holding no password "
                 "(null: none; docs/delivery.md)"),
    STRING_FIELD("password_file", struct cfg_store_pg, password_file, F_NULLABLE | F_RESTART,
                 schema_check_path, "null",
                 "a file whose first line is the database password, read at start (a mounted "
                 "Secret); null: libpq's own, PGPASSFILE or ~/.pgpass"),
    STRING_FIELD("namespace", struct cfg_store_pg, ns, F_RESTART, schema_check_namespace,
                 "\"default\"",
                 "the service these deliveries belong to: proxies of one namespace share its "
                 "deliveries, its bounds and its dead letters, and never see another's"),
};
static const struct schema store_pg_schema = SCHEMA(store_pg_fields, NULL);

/* One store: the process's SQLite file, or the shared PostgreSQL database. */
static void check_store(struct walk *w, const struct ctx *x, void *dst)
{
    const struct cfg_store *s = dst;
    if (!s->path || !s->postgres.url)
        return;
    struct at at = schema_child_at(w, x->path, "postgres");
    schema_err_at(w, &at,
                  "store.path and store.postgres.url are exclusive: one store, the process's "
                  "SQLite file or the shared PostgreSQL database (docs/delivery.md)");
}

static const struct field store_fields[] = {
    STRING_FIELD("path", struct cfg_store, path, F_NULLABLE | F_RESTART, schema_check_path, "null",
                 "the SQLite file of durable deliveries and dead letters, on a volume that "
                 "outlives the process (null: no store; docs/delivery.md)"),
    OBJ_FIELD("postgres", struct cfg_store, postgres, store_pg_schema, 0,
              "or a PostgreSQL database that a fleet of proxies shares (docs/delivery.md, "
              "\"Shared store (PostgreSQL)\")"),
    STRING_FIELD("key_file", struct cfg_store, key_file, F_NULLABLE | F_RESTART,
                 schema_check_store_key_file, "null",
                 "a 256-bit key (32 bytes, or 64 hex digits) that encrypts the sensitive fields "
                 "of stored requests (AES-256-GCM); null: those fields are not stored"),
    LIST_FIELD("sensitive_fields", struct cfg_store, sensitive, n_sensitive, schema_field_name_list,
               0, NULL, "[]",
               "request fields that carry credentials besides Authorization, Cookie and "
               "Proxy-Authorization: never shown by the admin API, the CLI or the log, never "
               "stored in clear"),
    UINT_FIELD_F("max_bytes", struct cfg_store, max_bytes, F_RESTART, 1048576, 1099511627776.0,
                 "1073741824",
                 "accepts are refused (503 with Retry-After) once the store is this large"),
    UINT_FIELD_F("max_count", struct cfg_store, max_count, F_RESTART, 1, 1000000000, "1000000",
                 "... or holds this many deliveries and dead letters (delivered ones aside)"),
    UINT_FIELD("dead_body_bytes", struct cfg_store, dead_body_bytes, 0, 1048576, "4096",
               "the first bytes of a dead letter's final response body kept with it"),
    UINT_FIELD("delivered_keep_ms", struct cfg_store, delivered_keep_ms, 0, 2592000000.0,
               "86400000", "a delivered request is deleted this long after (0: at once)"),
    UINT_FIELD("dead_keep_ms", struct cfg_store, dead_keep_ms, 0, 31536000000.0, "0",
               "a dead letter is deleted this long after it died (0: never; a full store then "
               "refuses new ones, never drops old ones)"),
};
static const struct schema store_schema = SCHEMA(store_fields, check_store);

/* ---- routes, "defaults" and the root ---- */

/* Walks the route object 'v' written at 'at' (NULL: not written) into 'dst': a route, over
 * "defaults", or with 'in_defaults' the "defaults" object itself. */
static void walk_route(struct walk *w, const struct at *at, const json_t *v, bool in_defaults,
                       struct cfg_route *dst)
{
    struct ctx x = { .s = &route_schema, .path = at->path, .in_defaults = in_defaults };
    if (v) {
        x.layer[0] = v;
        x.layer_path[0] = at->path;
        x.pos = at->pos;
    }
    if (!in_defaults) {
        x.layer[1] = w->defaults;
        x.layer_path[1] = "$.defaults";
    }
    schema_walk_object(w, &x, dst);
}

static int parse_defaults(struct walk *w, const struct at *at, const json_t *v, void *dst)
{
    if (v && !json_is_object(v)) {
        schema_err_at(w, at, "expected an object, got %s", schema_kind(v));
        v = NULL;
    }
    walk_route(w, at, v, true, &((struct cfg *)dst)->defaults);
    return 0;
}

/* Always 0: a route's problems are reported, and its name still counts for duplicates. */
static int parse_route(struct walk *w, const struct at *at, const json_t *v, void *elem)
{
    walk_route(w, at, v, false, elem);
    return 0;
}

static json_t *dump_defaults(const void *src)
{
    return schema_dump_object(&route_schema, &((const struct cfg *)src)->defaults, true);
}

static json_t *dump_route(const void *elem)
{
    return schema_dump_object(&route_schema, elem, false);
}

static void route_twice(struct walk *w, const struct at *at, const char *name, size_t first)
{
    struct at name_at = schema_child_at(w, at->path, "name");
    schema_err_at(w, &name_at, "duplicate route name \"%s\" (also $.routes[%zu].name)", name,
                  first);
}

/* Each route is walked over "defaults"; its problems are its own, so two routes are compared
 * by name whatever else is wrong with them. */
static const struct list_kind route_list = {
    .array_doc = "an array of routes",
    .elem_doc = "a route object",
    .elem_type = JSON_OBJECT,
    .sub = &route_schema,
    .size = sizeof(struct cfg_route),
    .key_offset = offsetof(struct cfg_route, name),
    .parse = parse_route,
    .twice = route_twice,
    .dump = dump_route,
};

static const struct field root_fields[] = {
    STRING_FIELD("listen", struct cfg, listen, F_RESTART, schema_check_listen,
                 "\"127.0.0.1:15001\"", "address of the proxy listener"),
    STRING_FIELD("admin", struct cfg, admin, F_RESTART, schema_check_listen, "\"127.0.0.1:15000\"",
                 "address of the admin listener"),
    INLINE_OBJ("log", log_schema, "request and reload logs"),
    UINT_FIELD("drain_timeout_ms", struct cfg, drain_timeout_ms, 0, MS_MAX, "10000",
               "how long requests in flight may finish after SIGTERM"),
    INLINE_OBJ("limits", limits_schema, "client-side limits"),
    OBJ_FIELD("budget", struct cfg, budget, top_budget_schema, 0, "the process-wide retry budget"),
    OBJ_FIELD("resolver", struct cfg, resolver, resolver_schema, 0,
              "how the upstreams' host names are resolved and followed (docs/endpoints.md)"),
    OBJ_FIELD("store", struct cfg, store, store_schema, 0,
              "where durable deliveries and dead letters are kept (docs/delivery.md)"),
    { .key = "defaults",
      .type = FT_CUSTOM,
      .offset = 0,
      .parse = parse_defaults,
      .dump = dump_defaults,
      .type_doc = "object",
      .doc = "values every route inherits: any route key except name, match and upstreams" },
    LIST_FIELD("routes", struct cfg, routes, n_routes, route_list, F_REQUIRED,
               "must hold at least one route", NULL, "at least one route"),
};
const struct schema schema_root = SCHEMA(root_fields, check_root);
