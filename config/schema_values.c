/* schema_values -- what one value of the config may be: the string checks of the table's
 * rows (addresses, names, header names, files), and the parsers of the values and list
 * elements a type of the walker does not cover (match.host, methods, retry_on conditions,
 * upstream URLs, upgrade tokens, DNS servers).
 */
#include "config/schema_int.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <ctype.h>
#include <string.h>
#include <unistd.h>

#include "config/keyfile.h"
#include "config/pem.h"

/* ---- string checks ---- */

static int is_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* A port: 1 to 5 digits, at most 65535 ('allow_zero' for listeners: 0 picks a free port). */
static int valid_port(const char *s, size_t len, int allow_zero)
{
    if (len == 0 || len > 5)
        return 0;
    unsigned v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    return v <= 65535 && (v > 0 || allow_zero);
}

/* A DNS name or IPv4 literal: letters, digits, '-', '.', '_'. */
static int valid_hostname(const char *s, size_t len)
{
    if (len == 0 || len > 253)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!is_alnum(s[i]) && s[i] != '-' && s[i] != '.' && s[i] != '_')
            return 0;
    return 1;
}

static int valid_ipv6_literal(const char *s, size_t len)
{
    char buf[64];
    struct in6_addr a6;
    if (len < 3 || len - 2 >= sizeof(buf) || s[0] != '[' || s[len - 1] != ']')
        return 0;
    memcpy(buf, s + 1, len - 2);
    buf[len - 2] = '\0';
    return inet_pton(AF_INET6, buf, &a6) == 1;
}

/* "host[:port]" as a Host header or URL authority may hold it. */
static int valid_authority(const char *s, size_t len, int need_port, int allow_zero_port)
{
    const char *colon = NULL;
    if (len > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close)
            return 0;
        size_t hl = (size_t)(close - s) + 1;
        if (!valid_ipv6_literal(s, hl))
            return 0;
        if (hl == len)
            return !need_port;
        if (s[hl] != ':')
            return 0;
        return valid_port(s + hl + 1, len - hl - 1, allow_zero_port);
    }
    for (size_t i = 0; i < len; i++)
        if (s[i] == ':')
            colon = s + i;
    size_t hl = colon ? (size_t)(colon - s) : len;
    if (!valid_hostname(s, hl))
        return 0;
    if (!colon)
        return !need_port;
    return valid_port(colon + 1, len - hl - 1, allow_zero_port);
}

const char *schema_check_listen(const char *s, size_t len)
{
    if (!valid_authority(s, len, 1, 1))
        return "expected HOST:PORT such as \"127.0.0.1:15001\", \"0.0.0.0:15001\" or "
               "\"[::1]:15001\"";
    return NULL;
}

const char *cfg_address_problem(const char *s)
{
    return schema_check_listen(s, strlen(s));
}

/* A name of 1 to 'max' characters, each a letter, a digit or one of 'punct': NULL, or the
 * problem ('too_long' or 'bad_char'). */
static const char *check_name(const char *s, size_t len, size_t max, const char *punct,
                              const char *too_long, const char *bad_char)
{
    if (len == 0 || len > max)
        return too_long;
    for (size_t i = 0; i < len; i++)
        if (!is_alnum(s[i]) && (!s[i] || !strchr(punct, s[i])))
            return bad_char;
    return NULL;
}

const char *schema_check_route_name(const char *s, size_t len)
{
    return check_name(s, len, 100, "._-:/", "must be 1 to 100 characters long",
                      "may hold only letters, digits and . _ - : /");
}

/* A header name: a token (RFC 9110 5.1) of at most 64 characters. */
const char *schema_check_field_name(const char *s, size_t len)
{
    return check_name(s, len, 64, "!#$%&'*+-.^_`|~", "must be 1 to 64 characters long",
                      "must be a header name (letters, digits and !#$%&'*+-.^_`|~)");
}

/* A header name the proxy may set on each attempt: not one of the fields the proxy already
 * sets or frames the request with. */
const char *schema_check_header_name(const char *s, size_t len)
{
    static const char *const owned[] = {
        "Host",         "Content-Length",  "Transfer-Encoding", "Connection",
        "X-Request-Id", "X-Retry-Attempt", "X-Forwarded-For",   "X-Forwarded-Proto"
    };
    const char *why = schema_check_field_name(s, len);
    if (why)
        return why;
    for (size_t i = 0; i < COUNT(owned); i++)
        if (strlen(owned[i]) == len && strncasecmp(s, owned[i], len) == 0)
            return "names a header the proxy sets itself";
    return NULL;
}

const char *schema_check_path_prefix(const char *s, size_t len)
{
    if (len == 0 || s[0] != '/')
        return "must start with '/'";
    if (schema_has_ctl_or_space(s, len))
        return "must be printable ASCII without spaces (percent-encode other bytes)";
    if (memchr(s, '?', len) || memchr(s, '#', len))
        return "must not hold a query ('?') or fragment ('#')";
    return NULL;
}

const char *schema_check_ca_file(const char *s, size_t len)
{
    if (len == 0 || memchr(s, '\0', len))
        return "must name a file of PEM certificates";
    if (access(s, R_OK) != 0)
        return "cannot be read (no such file, or no permission)";
    return NULL;
}

const char *schema_check_cert_file(const char *s, size_t len)
{
    if (len == 0 || memchr(s, '\0', len))
        return "must name a file holding a PEM certificate";
    return pem_check_certs(s);
}

const char *schema_check_key_file(const char *s, size_t len)
{
    if (len == 0 || memchr(s, '\0', len))
        return "must name a file holding a PEM private key";
    return pem_check_key(s);
}

/* A DNS name: SNI carries no address (an address URL is verified against the certificate's
 * IP entries already). */
const char *schema_check_server_name(const char *s, size_t len)
{
    unsigned char ip[16];
    if (len == 0 || len > 253 || memchr(s, '\0', len))
        return "must be a host name of 1 to 253 characters";
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '-' || s[i] == '.' || s[i] == '_'))
            return "must be a host name (letters, digits, '-', '_' and '.'; no port)";
    if (inet_pton(AF_INET, s, ip) == 1)
        return "must be a host name, not an address: SNI carries names only";
    return NULL;
}

/* ---- custom fields ---- */

int schema_parse_match_host(struct walk *w, const struct at *at, const json_t *v, void *dst)
{
    const char **out = dst;
    if (json_is_null(v)) {
        *out = NULL;
        return 0;
    }
    if (!json_is_string(v)) {
        schema_err_at(w, at, "expected a string or null, got %s", schema_kind(v));
        return -1;
    }
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    if (schema_has_ctl_or_space(s, len) || !valid_authority(s, len, 0, 0)) {
        schema_err_at(w, at,
                      "expected a host name, optionally with a port (\"api.internal\", "
                      "\"api.internal:8080\")");
        return -1;
    }
    char *low = arena_strndup(w->a, s, len);
    for (char *p = low; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
    *out = low;
    return 0;
}

/* ---- list elements ---- */

/* A kind of strings, each parsed into a T by 'parse_fn' and told apart by its 'key' member. */
#define STRING_LIST(array, elem, T, key, parse_fn)                                                 \
    {                                                                                              \
        .array_doc = array, .elem_doc = elem, .elem_type = JSON_STRING, .size = sizeof(T),         \
        .key_offset = offsetof(T, key), .parse = parse_fn                                          \
    }

/* Indexed by the bit positions of enum cfg_method. */
static const char *const method_names[] = { "GET",   "HEAD", "OPTIONS", "PUT",    "DELETE",
                                            "TRACE", "POST", "PATCH",   "CONNECT" };

uint32_t cfg_method_bit(const char *name, size_t len)
{
    for (size_t i = 0; i < COUNT(method_names); i++)
        if (strlen(method_names[i]) == len && memcmp(method_names[i], name, len) == 0)
            return 1u << i;
    return 0;
}

const char *cfg_method_name(uint32_t bit)
{
    for (size_t i = 0; i < COUNT(method_names); i++)
        if (bit == 1u << i)
            return method_names[i];
    return NULL;
}

/* A method token into its bit (enum cfg_method). */
static int parse_method(struct walk *w, const struct at *at, const json_t *v, void *elem)
{
    const char *s = json_string_value(v);
    uint32_t bit = cfg_method_bit(s, json_string_length(v));
    if (bit) {
        *(uint32_t *)elem = bit;
        return 0;
    }
    const char *near = schema_suggest(s, method_names, COUNT(method_names));
    if (near)
        schema_err_at(w, at,
                      "unknown method \"%s\"; did you mean \"%s\"? (methods are case-sensitive)", s,
                      near);
    else
        schema_err_at(w, at, "unknown method \"%s\" (known: %s)", s,
                      schema_join(&w->tmp, method_names, COUNT(method_names)));
    return -1;
}

const struct list_kind schema_method_list = {
    .array_doc = "an array of method names",
    .elem_doc = "a method name",
    .elem_type = JSON_STRING,
    .size = sizeof(uint32_t),
    .bit_names = method_names,
    .parse = parse_method,
};

static const char *const retry_on_names[] = {
    "connect-failure",    "reset",      "timeout",           "5xx",
    "gateway-error",      "cancelled",  "deadline-exceeded", "internal",
    "resource-exhausted", "unavailable"
};

/* 1 to 3 digits -> their value; -1 otherwise. */
static long grpc_number(const char *s, size_t len)
{
    if (len < 1 || len > 3)
        return -1;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* "grpc:N" or "grpc:N-M": gRPC statuses by number (1 to 999: 0 is OK, never retried). */
static int parse_grpc_cond(struct walk *w, const struct at *at, const char *s, size_t len,
                           struct cfg_retry_cond *c)
{
    const char *n = s + 5;
    size_t nl = len - 5;
    const char *dash = memchr(n, '-', nl);
    long lo = grpc_number(n, dash ? (size_t)(dash - n) : nl);
    long hi = dash ? grpc_number(dash + 1, nl - (size_t)(dash - n) - 1) : lo;
    if (lo < 1 || hi < 1) {
        schema_err_at(w, at,
                      "retry_on \"%s\": expected a gRPC status 1 to 999 (\"grpc:14\") or a range "
                      "(\"grpc:1-4\"); 0 is OK and never retried",
                      s);
        return -1;
    }
    if (lo > hi) {
        schema_err_at(w, at, "range \"%s\" runs backwards; write \"grpc:%ld-%ld\"", s, hi, lo);
        return -1;
    }
    c->kind = CFG_RETRY_GRPC;
    c->lo = (uint16_t)lo;
    c->hi = (uint16_t)hi;
    return 0;
}

/* "header:NAME" or "header:NAME=VALUE" (Envoy's retriable_headers): a response that carries
 * the field (with exactly that value) is retried whatever its status. */
static int parse_header_cond(struct walk *w, const struct at *at, const char *s, size_t len,
                             struct cfg_retry_cond *c)
{
    const char *name = s + 7, *eq = memchr(name, '=', len - 7);
    size_t nl = eq ? (size_t)(eq - name) : len - 7;
    const char *why = schema_check_field_name(name, nl);
    if (why) {
        schema_err_at(w, at, "retry_on \"%s\": \"%.*s\" %s", s, (int)nl, name, why);
        return -1;
    }
    if (eq) {
        for (const char *p = eq + 1; p < s + len; p++) {
            if ((unsigned char)*p < 0x20 || *p == 0x7f) {
                schema_err_at(w, at, "retry_on \"%s\": the header value holds a control character",
                              s);
                return -1;
            }
        }
        c->value = arena_strndup(w->a, eq + 1, len - nl - 8);
    }
    c->kind = CFG_RETRY_HEADER;
    c->name = arena_strndup(w->a, name, nl);
    return 0;
}

/* "NNN" -> code; -1 if not three digits. */
static int status_code(const char *s, size_t len)
{
    if (len != 3)
        return -1;
    int v = 0;
    for (size_t i = 0; i < 3; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* A retry_on token: a named condition, a status or a range of statuses. */
static int parse_retry_cond(struct walk *w, const struct at *at, const json_t *v, void *elem)
{
    static const struct {
        const char *name;
        enum cfg_retry_kind kind;
        uint16_t lo, hi;
    } named[] = {
        { "connect-failure", CFG_RETRY_CONNECT_FAILURE, 0, 0 },
        { "reset", CFG_RETRY_RESET, 0, 0 },
        { "timeout", CFG_RETRY_TIMEOUT, 0, 0 },
        { "5xx", CFG_RETRY_STATUS, 500, 599 },
        { "gateway-error", CFG_RETRY_STATUS, 502, 504 },
        /* gRPC statuses by Envoy's names (x-envoy-retry-grpc-on) */
        { "cancelled", CFG_RETRY_GRPC, 1, 1 },
        { "deadline-exceeded", CFG_RETRY_GRPC, 4, 4 },
        { "resource-exhausted", CFG_RETRY_GRPC, 8, 8 },
        { "internal", CFG_RETRY_GRPC, 13, 13 },
        { "unavailable", CFG_RETRY_GRPC, 14, 14 },
    };
    struct cfg_retry_cond *c = elem;
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    c->token = arena_strdup(w->a, s);
    if (len >= 7 && strncmp(s, "header:", 7) == 0)
        return parse_header_cond(w, at, s, len, c);
    if (len >= 5 && strncmp(s, "grpc:", 5) == 0)
        return parse_grpc_cond(w, at, s, len, c);
    for (size_t i = 0; i < COUNT(named); i++) {
        if (strcmp(s, named[i].name) == 0) {
            c->kind = named[i].kind;
            c->lo = named[i].lo;
            c->hi = named[i].hi;
            return 0;
        }
    }
    const char *dash = memchr(s, '-', len);
    int lo = status_code(s, dash ? (size_t)(dash - s) : len);
    int hi = dash ? status_code(dash + 1, len - (size_t)(dash - s) - 1) : lo;
    if (lo < 0 || hi < 0) {
        const char *near = schema_suggest(s, retry_on_names, COUNT(retry_on_names));
        if (near)
            schema_err_at(w, at, "unknown retry_on condition \"%s\"; did you mean \"%s\"?", s,
                          near);
        else
            schema_err_at(
                w, at,
                "unknown retry_on condition \"%s\" (expected %s, a status such as \"429\", "
                "a range such as \"500-599\", \"header:NAME\" or \"grpc:N\")",
                s, schema_join(&w->tmp, retry_on_names, COUNT(retry_on_names)));
        return -1;
    }
    if (lo < 100 || lo > 599 || hi < 100 || hi > 599) {
        schema_err_at(w, at, "status %d is out of range: status codes are 100 to 599",
                      lo < 100 || lo > 599 ? lo : hi);
        return -1;
    }
    if (lo > hi) {
        schema_err_at(w, at, "range \"%s\" runs backwards; write \"%d-%d\"", s, hi, lo);
        return -1;
    }
    c->kind = CFG_RETRY_STATUS;
    c->lo = (uint16_t)lo;
    c->hi = (uint16_t)hi;
    return 0;
}

const struct list_kind schema_retry_on_list =
    STRING_LIST("an array of conditions", "a condition as a string (\"429\", not 429)",
                struct cfg_retry_cond, token, parse_retry_cond);

/* An upstream base URL: http(s)://authority[/path], no credentials, query or fragment. */
static int parse_upstream(struct walk *w, const struct at *at, const json_t *v, void *elem)
{
    struct cfg_upstream *u = elem;
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c == 0x7f) {
            schema_err_at(w, at, "must not hold whitespace or control characters (at byte %zu)",
                          i + 1);
            return -1;
        }
        if (c >= 0x80) {
            schema_err_at(w, at, "must be ASCII (percent-encode other characters; at byte %zu)",
                          i + 1);
            return -1;
        }
    }
    static const char *const schemes[] = {
        [CFG_PROTO_HTTP] = "http", [CFG_PROTO_HTTPS] = "https", [CFG_PROTO_H2C] = "h2c"
    };
    size_t skip = 0;
    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]) && !skip; i++) {
        size_t sl = strlen(schemes[i]);
        if (len >= sl + 3 && strncasecmp(s, schemes[i], sl) == 0 && memcmp(s + sl, "://", 3) == 0) {
            u->proto = (enum cfg_upstream_proto)i;
            skip = sl + 3;
        }
    }
    if (!skip) {
        schema_err_at(w, at, "must start with http://, https:// or h2c:// (HTTP/2 over cleartext)");
        return -1;
    }
    u->https = u->proto == CFG_PROTO_HTTPS;
    const char *auth = s + skip;
    size_t rest = len - skip;
    const char *slash = memchr(auth, '/', rest);
    size_t alen = slash ? (size_t)(slash - auth) : rest;
    if (memchr(s, '?', len) || memchr(s, '#', len)) {
        schema_err_at(w, at, "must not hold a query ('?') or fragment ('#'): it is a base URL");
        return -1;
    }
    if (memchr(auth, '@', alen)) {
        schema_err_at(w, at, "must not hold credentials (user@host)");
        return -1;
    }
    const char *port = alen && auth[0] != '[' ? memchr(auth, ':', alen) : NULL;
    if (port && !valid_port(port + 1, alen - (size_t)(port + 1 - auth), 0)) {
        schema_err_at(w, at, "has an invalid port \"%.*s\" (1 to 65535)",
                      (int)(alen - (size_t)(port + 1 - auth)), port + 1);
        return -1;
    }
    if (alen == 0 || !valid_authority(auth, alen, 0, 0)) {
        schema_err_at(w, at, "has no valid host[:port] after the scheme");
        return -1;
    }
    size_t plen = slash ? rest - alen : 0;
    while (plen > 0 && slash[plen - 1] == '/')
        plen--;
    u->url = arena_strndup(w->a, s, len);
    u->authority = arena_strndup(w->a, auth, alen);
    /* host and port apart: "[v6]:port", "host:port", or either without the port */
    const char *hend = auth[0] == '[' ? memchr(auth, ']', alen) : (port ? port : auth + alen);
    size_t hoff = auth[0] == '[';
    u->host = arena_strndup(w->a, auth + hoff, (size_t)(hend - auth) - hoff);
    const char *pdigits = auth[0] == '['
                              ? (hend + 1 < auth + alen && hend[1] == ':' ? hend + 2 : NULL)
                              : (port ? port + 1 : NULL);
    u->port = pdigits ? (uint16_t)strtoul(pdigits, NULL, 10) : u->https ? 443 : 80;
    u->origin = arena_printf(w->a, "%s://%.*s/", schemes[u->proto], (int)alen, auth);
    u->base_path = arena_strndup(w->a, slash ? slash : "", plen);
    return 0;
}

const struct list_kind schema_upstream_list =
    STRING_LIST("an array of URLs", "a URL string", struct cfg_upstream, url, parse_upstream);

/* An upgrade token a route tunnels (docs/upgrades.md): an RFC 9110 token, without a version;
 * compared without regard to case. "h2c" is refused: HTTP/2 arrives by prior knowledge, never
 * by an Upgrade (RFC 9113 3.1). */
static int parse_upgrade(struct walk *w, const struct at *at, const json_t *v, void *elem)
{
    struct cfg_upgrade *u = elem;
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    const char *why = check_name(s, len, 64, "!#$%&'*+-.^_`|~", "must be 1 to 64 characters long",
                                 "must be an upgrade token (letters, digits and !#$%&'*+-.^_`|~, "
                                 "no version)");
    if (!why && len == 3 && strncasecmp(s, "h2c", 3) == 0)
        why = "is not tunnelled: HTTP/2 comes by prior knowledge (docs/upgrades.md)";
    if (why) {
        schema_err_at(w, at, "\"%s\" %s", s, why);
        return -1;
    }
    u->token = arena_strndup(w->a, s, len);
    return 0;
}

const struct list_kind schema_upgrade_list =
    STRING_LIST("an array of upgrade tokens", "an upgrade token (\"websocket\")",
                struct cfg_upgrade, token, parse_upgrade);

/* A DNS server: an IP literal and a port. A name is refused: the resolver would need itself to
 * find its server. */
static int parse_dns_server(struct walk *w, const struct at *at, const json_t *v, void *elem)
{
    struct cfg_dns_server *d = elem;
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    const char *colon = memrchr(s, ':', len);
    size_t hl = colon ? (size_t)(colon - s) : 0;
    size_t start = 0;
    char host[64];
    d->family = AF_INET;
    if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') {
        d->family = AF_INET6;
        start = 1;
        hl -= 2;
    }
    if (!colon || strlen(s) != len || !valid_port(colon + 1, len - (hl + 2 * start + 1), 0)) {
        schema_err_at(w, at, "\"%s\" must be IP:PORT, such as \"10.96.0.10:53\" or \"[::1]:53\"",
                      s);
        return -1;
    }
    if (hl == 0 || hl >= sizeof(host) ||
        (memcpy(host, s + start, hl), host[hl] = '\0', inet_pton(d->family, host, d->ip) != 1)) {
        schema_err_at(w, at,
                      "\"%s\" must be an IP address and a port (IPv6 in brackets), not a name", s);
        return -1;
    }
    d->port = (uint16_t)atoi(colon + 1);
    d->addr = arena_strndup(w->a, s, len);
    return 0;
}

const struct list_kind schema_dns_server_list =
    STRING_LIST("an array of \"IP:PORT\" strings", "a DNS server as \"IP:PORT\"",
                struct cfg_dns_server, addr, parse_dns_server);

/* A header field's name (store.sensitive_fields). */
static int parse_field_name(struct walk *w, const struct at *at, const json_t *v, void *elem)
{
    struct cfg_field_name *f = elem;
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    const char *why = schema_check_field_name(s, len);
    if (why) {
        schema_err_at(w, at, "\"%s\" %s", s, why);
        return -1;
    }
    f->name = arena_strndup(w->a, s, len);
    return 0;
}

const struct list_kind schema_field_name_list =
    STRING_LIST("an array of header field names", "a header field name (\"X-Api-Key\")",
                struct cfg_field_name, name, parse_field_name);

const char *schema_check_path(const char *s, size_t len)
{
    if (len == 0 || memchr(s, '\0', len))
        return "must name a file";
    return NULL;
}

/* A password in the config file would be read by whoever reads the config (a ConfigMap, say):
 * it comes from password_file or libpq's PGPASSFILE instead. A URI's password is after a ':'
 * in its user part, or a "password" parameter; a key=value string's is its password key. */
const char *schema_check_pg_url(const char *s, size_t len)
{
    static const char why[] = "holds a password: name its file in store.postgres.password_file, "
                              "or use libpq's PGPASSFILE";
    if (len == 0 || memchr(s, '\0', len))
        return "must be a libpq connection URI (postgresql://user@host/db) or key=value string";
    const char *scheme = strstr(s, "://");
    if (scheme && (strncmp(s, "postgresql://", 13) == 0 || strncmp(s, "postgres://", 11) == 0)) {
        const char *auth = scheme + 3, *end = auth + strcspn(auth, "/?");
        const char *at = memchr(auth, '@', (size_t)(end - auth));
        if (at && memchr(auth, ':', (size_t)(at - auth)))
            return why;
        const char *query = strchr(s, '?');
        for (const char *p = query; p; p = strchr(p + 1, '&'))
            if (strncmp(p + 1, "password=", 9) == 0)
                return why;
        return NULL;
    }
    if (scheme)
        return "must be a postgresql:// URI or a key=value string";
    for (const char *p = s; (p = strstr(p, "password")) != NULL; p += 8) {
        const char *q = p + 8;
        while (*q == ' ')
            q++;
        if ((p == s || p[-1] == ' ') && *q == '=')
            return why;
    }
    return NULL;
}

const char *schema_check_namespace(const char *s, size_t len)
{
    if (len == 0 || len > 63)
        return "must be 1 to 63 characters";
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("._-", s[i]))
            return "may hold letters, digits, '.', '_' and '-' only";
    return NULL;
}

/* Read at load, as the TLS files are: a key that cannot be read is found by `check`, not by
 * the first durable request. The store reads it again with the same rule (keyfile.h). */
const char *schema_check_store_key_file(const char *s, size_t len)
{
    unsigned char key[CFG_KEY_BYTES];
    if (len == 0 || memchr(s, '\0', len))
        return "must name a file holding a 256-bit key";
    int r = cfg_key_file_read(s, key);
    memset(key, 0, sizeof(key));
    __asm__ __volatile__("" : : "r"(key) : "memory");
    if (r == -1)
        return "cannot be read (it must hold a 256-bit key: 32 bytes, or 64 hex digits)";
    return r < 0 ? "must hold a 256-bit key: 32 bytes, or 64 hex digits" : NULL;
}

int schema_parse_dead_letter(struct walk *w, const struct at *at, const json_t *v, void *dst)
{
    int *d = dst;
    if (!v || json_is_null(v)) {
        *d = -1;
        return 0;
    }
    if (!json_is_boolean(v)) {
        schema_err_at(w, at, "expected true, false or null, got %s", schema_kind(v));
        *d = -1;
        return -1;
    }
    *d = json_is_true(v);
    return 0;
}

json_t *schema_dump_dead_letter(const void *src)
{
    int d = *(const int *)src;
    return d < 0 ? json_null() : json_boolean(d);
}
