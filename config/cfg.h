/* cfg -- the loaded configuration: an immutable, refcounted snapshot (docs/config.md).
 *
 * cfg_load_*() parse and validate a whole file against the schema table (config/schema.c) and
 * either return a complete snapshot or no snapshot and every problem found. A snapshot never
 * changes after it is built; a request holds a reference to the one it started with, and a
 * reload swaps in a new one. Live state (budget counters, route-scoped backoff sequences) is
 * keyed by route name and lives outside.
 */
#ifndef RETRYPROXY_CONFIG_CFG_H
#define RETRYPROXY_CONFIG_CFG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "config/errors.h"
#include "policy/backoff.h"
#include "policy/budget.h"
#include "policy/health.h"
#include "policy/throttle.h"

/* Largest config file read (4 MiB; docs/config.md): configs are a few kilobytes. This bounds
 * the memory and time one load may take, and a mistaken path. */
#define CFG_MAX_FILE_BYTES (4u << 20)

enum cfg_log_level { CFG_LOG_DEBUG, CFG_LOG_INFO, CFG_LOG_WARN, CFG_LOG_ERROR };
enum cfg_log_format { CFG_LOG_JSON, CFG_LOG_TEXT };
/* limits.headers_with_underscores: what becomes of a request field whose name has an underscore
 * (docs/forwarding.md). CGI and WSGI servers turn '-' and '_' alike into '_', so
 * "X_Forwarded_Proto" would merge with the X-Forwarded-Proto the proxy sets. */
enum cfg_underscores {
    CFG_UNDERSCORES_DROP,   /* not forwarded (nginx's default) */
    CFG_UNDERSCORES_REJECT, /* the request is a 400 naming the field */
    CFG_UNDERSCORES_ALLOW,  /* forwarded like any field */
};

/* Request methods as a bitmask (a route's match and retry lists), in the order the effective
 * config lists them. */
enum cfg_method {
    CFG_METHOD_GET = 1u << 0,
    CFG_METHOD_HEAD = 1u << 1,
    CFG_METHOD_OPTIONS = 1u << 2,
    CFG_METHOD_PUT = 1u << 3,
    CFG_METHOD_DELETE = 1u << 4,
    CFG_METHOD_TRACE = 1u << 5,
    CFG_METHOD_POST = 1u << 6,
    CFG_METHOD_PATCH = 1u << 7,
    CFG_METHOD_CONNECT = 1u << 8,
};

/* The method bit for a request method token ("GET"; case-sensitive), 0 for any other. */
uint32_t cfg_method_bit(const char *name, size_t len);
/* The token for a single method bit, NULL for anything else. */
const char *cfg_method_name(uint32_t bit);
/* The config's names of a log level and a log format ("warn", "json"). */
const char *cfg_log_level_name(enum cfg_log_level level);
const char *cfg_log_format_name(enum cfg_log_format format);

/* One retry_on condition, in file order (the first that fires names the retry in metrics). */
enum cfg_retry_kind {
    CFG_RETRY_CONNECT_FAILURE, /* no connection was made: nothing was sent */
    CFG_RETRY_RESET,           /* closed or reset before complete response headers */
    CFG_RETRY_TIMEOUT,         /* the per-try timeout passed before response headers */
    CFG_RETRY_STATUS,          /* a status in [lo, hi]: "5xx", "gateway-error", "429", "500-504" */
    CFG_RETRY_HEADER,          /* a response field: "header:NAME" or "header:NAME=VALUE" */
    CFG_RETRY_GRPC,            /* a gRPC status in [lo, hi]: "unavailable", "grpc:14", "grpc:1-4" */
};

struct cfg_retry_cond {
    enum cfg_retry_kind kind;
    uint16_t lo, hi;   /* CFG_RETRY_STATUS and CFG_RETRY_GRPC */
    const char *token; /* as written in the file */
    const char *name;  /* CFG_RETRY_HEADER: the field's name (any case matches) */
    const char *value; /* CFG_RETRY_HEADER: the exact value, or NULL for any */
};

/* How an upstream is spoken to (docs/http2.md). */
enum cfg_upstream_proto {
    CFG_PROTO_HTTP,  /* http://: HTTP/1.1 through libcurl */
    CFG_PROTO_HTTPS, /* https://: HTTP/1.1 over TLS through libcurl */
    CFG_PROTO_H2C,   /* h2c://: HTTP/2 over cleartext, prior knowledge (proxy/upstream/h2up.h) */
};

struct cfg_upstream {
    const char *url;    /* as written */
    const char *origin; /* "http://host:port/" (or https, h2c): where connections go */
    enum cfg_upstream_proto proto;
    bool https;
    const char *authority; /* host[:port], as written: the Host sent unless preserve_host */
    const char *host;      /* its host, an IPv6 literal without brackets: the name resolved */
    uint16_t port;         /* its port, or the scheme's (80, 443) */
    const char *base_path; /* "" or a prefix such as "/api" (no trailing '/') */
};

struct cfg_retry {
    uint32_t max_attempts;
    const struct cfg_retry_cond *on;
    size_t n_on;
    uint32_t methods; /* enum cfg_method bits */
    bool idempotency_key;
    uint64_t max_retry_body_bytes;
    bool retry_after_honor;
    uint32_t retry_after_max_ms;
    const char *pushback_header; /* a response field that sets or refuses the retry; NULL: none */
    bool hedge; /* hedge_on_per_try_timeout: an attempt past the per-try timeout runs on */
    uint32_t grpc_hold_ms; /* how long a gRPC response's first message waits for its status */
    struct backoff_spec backoff;
};

/* How an attempt picks among a route's endpoints (routes[].balance, docs/endpoints.md). */
enum cfg_balance {
    CFG_BALANCE_LEAST_REQUEST, /* two choices: the next in turn or one at random, fewer in flight */
    CFG_BALANCE_ROUND_ROBIN,
    CFG_BALANCE_RANDOM,
};

/* Upstream health (routes[].ejection, docs/forwarding.md "Choosing an upstream"): an upstream
 * that fails health.consecutive_failures times in a row leaves the route's rotation for a time
 * its backoff policy sets. */
struct cfg_ejection {
    struct health_spec health;       /* the policy's own type; consecutive_failures 0: off */
    const struct cfg_retry_cond *on; /* what counts as a failure, as retry_on tokens */
    size_t n_on;
};

/* How https upstreams are reached (routes[].tls, docs/http2.md "https upstreams"). */
enum cfg_http2 {
    CFG_HTTP2_AUTO,     /* offer h2 and http/1.1 by ALPN, speak what the server chooses */
    CFG_HTTP2_OFF,      /* HTTP/1.1 only (libcurl) */
    CFG_HTTP2_REQUIRED, /* h2 only: a server that does not choose it is a connect failure */
};
struct cfg_tls {
    const char *ca_file;     /* PEM certificates to trust; NULL: the system's store */
    const char *cert_file;   /* the proxy's client certificate chain (PEM); NULL: none */
    const char *key_file;    /* its private key (PEM); NULL: cert_file holds it too */
    const char *server_name; /* sent in SNI and verified, instead of the URL's host; NULL */
    enum cfg_http2 http2;
};

/* Durable delivery (routes[].delivery, docs/delivery.md). */
enum cfg_delivery_mode {
    CFG_DELIVERY_SYNC,    /* retries while the caller waits (the default) */
    CFG_DELIVERY_DURABLE, /* 202 once stored; delivered by the route's retry policy later */
};
struct cfg_delivery {
    enum cfg_delivery_mode mode;
    /* Keep a request whose attempts are spent (or whose final answer is no success) as a dead
     * letter. -1 while walking: not written, the mode decides (durable: true, sync: false);
     * 0 or 1 in a snapshot. */
    int dead_letter;
    uint64_t max_age_ms;     /* a durable delivery not done this long after its accept is dead */
    const char *id_header;   /* carries the delivery's id on every attempt ("webhook-id") */
    uint64_t max_body_bytes; /* a larger durable request is answered 413, nothing stored */
    uint32_t max_in_flight;  /* the route's durable attempts running at once, process-wide */
    uint32_t max_in_flight_per_upstream; /* ... of them, to one of its upstreams */
    uint32_t max_per_second; /* durable attempts started per second at most: a backlog is paced */
};

/* An upgrade token a route tunnels (routes[].upgrades, docs/upgrades.md). */
struct cfg_upgrade {
    const char *token; /* as written; compared without regard to case */
};

struct cfg_route {
    const char *name;
    const char *match_host;        /* lowercase; NULL matches any host */
    const char *match_path_prefix; /* "/" matches every path */
    uint32_t match_methods;        /* enum cfg_method bits; 0 matches every method */
    const struct cfg_upstream *upstreams;
    size_t n_upstreams;
    enum cfg_balance balance;
    bool weigh_endpoints; /* weights from the endpoints' scores (policy/score.h); false: even */
    struct cfg_ejection ejection; /* endpoint health, kept per endpoint in proxy/core/live.h */
    bool preserve_host;
    uint32_t timeout_ms;
    uint32_t per_try_timeout_ms; /* 0: only the overall timeout */
    uint32_t connect_timeout_ms;
    const char *deadline_header; /* tells each attempt how long the proxy waits; NULL: none */
    struct cfg_retry retry;
    struct budget_limits budget;        /* the policy's own type; max_concurrent_retries -1: null */
    struct throttle_limits throttle;    /* client-side throttling; k 0: off */
    struct cfg_tls tls;                 /* https upstreams */
    const struct cfg_upgrade *upgrades; /* the upgrade tokens tunnelled */
    size_t n_upgrades;
    struct cfg_delivery delivery; /* durable delivery and dead letters */
};

/* A header field's name in a list of them (store.sensitive_fields). */
struct cfg_field_name {
    const char *name; /* as written */
};

/* The delivery store ("store", docs/delivery.md): where durable requests and dead letters are
 * kept. path NULL: none (no route may then be durable or keep dead letters). */
/* store.postgres: the shared store (docs/delivery.md, "Shared store (PostgreSQL)"). */
struct cfg_store_pg {
    const char *url; /* a libpq URI or "key=value" string holding no password; NULL: none */
    const char *password_file; /* its first line is the password; NULL: libpq's (PGPASSFILE) */
    const char *ns;            /* the namespace: the service whose deliveries these are */
};

struct cfg_store {
    const char *path;             /* the SQLite file */
    struct cfg_store_pg postgres; /* or the shared store (exclusive with path) */
    const char *key_file;         /* the AES-256-GCM key of the sensitive fields; NULL: none */
    const struct cfg_field_name *sensitive; /* fields kept only encrypted, besides
                                               Authorization, Cookie, Proxy-Authorization */
    size_t n_sensitive;
    uint64_t max_bytes;         /* accepts refused (503) beyond this size */
    uint64_t max_count;         /* ... or this many deliveries kept, delivered ones aside */
    uint32_t dead_body_bytes;   /* of a dead letter's final response body */
    uint64_t delivered_keep_ms; /* a delivered one is deleted this long after (0: at once) */
    uint64_t dead_keep_ms;      /* a dead letter is deleted this long after (0: never) */
};

/* One DNS server of resolver.servers (docs/endpoints.md). */
struct cfg_dns_server {
    const char *addr; /* as written: "10.96.0.10:53", "[fd00::a]:53" */
    int family;       /* AF_INET or AF_INET6 */
    uint8_t ip[16];   /* the address, 4 or 16 bytes in network order */
    uint16_t port;
};

/* The "resolver" object: how upstream names are followed (proxy/dns/resolve.h). */
struct cfg_resolver {
    const struct cfg_dns_server *servers; /* none: those of /etc/resolv.conf */
    size_t n_servers;
    uint32_t timeout_ms;     /* one lookup's whole time */
    uint32_t min_refresh_ms; /* bounds on asking again: the TTL clamped to them */
    uint32_t max_refresh_ms;
    uint32_t nxdomain_keep_ms; /* how long addresses outlive an NXDOMAIN or empty answer */
};

struct cfg {
    const char *source; /* the file it was loaded from ("" for a buffer) */
    const char *listen;
    const char *admin;
    enum cfg_log_level log_level;
    enum cfg_log_format log_format;
    uint32_t drain_timeout_ms;
    uint32_t max_connections;
    uint32_t connection_timeout_ms;
    uint32_t send_buffer_bytes; /* SO_SNDBUF of client connections, 0: the kernel's sizing */
    uint32_t header_timeout_ms;
    uint32_t max_header_bytes;
    uint32_t max_upstream_requests;
    uint32_t upstream_share_percent;   /* of them, one origin's attempts at most */
    uint32_t connection_share_percent; /* ... one client connection's */
    enum cfg_underscores headers_with_underscores;
    uint32_t tunnel_idle_timeout_ms; /* 0: never */
    uint32_t max_tunnels;            /* upgraded connections open at once, process-wide */
    uint64_t max_body_bytes;
    uint64_t max_buffered_body_bytes;
    struct budget_limits budget;
    struct cfg_resolver resolver;
    struct cfg_store store;
    struct cfg_route defaults; /* the resolved "defaults" object (no name, match, upstreams) */
    const struct cfg_route *routes;
    size_t n_routes;
};

/* Reads and validates the file at 'path'. Returns a new snapshot holding one reference, or
 * NULL with every problem appended to 'errs' (sorted by position). */
struct cfg *cfg_load_file(const char *path, struct cfg_errs *errs);

/* Reads the whole file at 'path' (at most CFG_MAX_FILE_BYTES) into a malloc'd *buf. 0, or -1
 * with the reason in 'errs'. Only a regular file is read, and nothing blocks: a FIFO, a
 * device or a directory at 'path' is an error found without waiting for a writer. */
int cfg_read_file(const char *path, char **buf, size_t *len, struct cfg_errs *errs);

/* The same from 'len' bytes of JSON text; 'source' names it in the snapshot. */
struct cfg *cfg_load_buffer(const char *text, size_t len, const char *source,
                            struct cfg_errs *errs);

/* The allocator underneath jansson's (malloc by default). jansson lets some allocation
 * failures pass silently (a token's text cut short, so a value read differently), so every
 * jansson allocation goes through a wrapper and a load during which one failed is rejected.
 * For tests that make allocations fail; set it while no config is loading. */
void cfg_set_json_malloc(void *(*fn)(size_t));

/* Takes another reference (thread-safe). Returns 'c'. */
struct cfg *cfg_ref(struct cfg *c);
/* Drops a reference; the last one frees the snapshot. Thread-safe; accepts NULL. */
void cfg_unref(struct cfg *c);

/* The route named 'name', or NULL. Borrowed from 'c'. */
const struct cfg_route *cfg_route_by_name(const struct cfg *c, const char *name);

/* The effective configuration, every default filled in, as a new JSON object (the admin
 * /config view and `check --print`). Returns a new reference. */
json_t *cfg_to_json(const struct cfg *c);

/* The keys that are read only at start (the schema rows that docs/config.md marks "at
 * restart") whose values differ between 'was' and 'now': calls 'fn' with each one's path
 * ("listen", "limits.max_header_bytes"), in the order of the reference. Returns how many. */
size_t cfg_restart_changes(const struct cfg *was, const struct cfg *now,
                           void (*fn)(const char *path, void *arg), void *arg);

/* NULL when 's' is a valid listener address (HOST:PORT), else what is wrong with it: the
 * check the schema applies to "listen" and "admin", for command-line overrides. */
const char *cfg_address_problem(const char *s);

/* Writes the configuration reference (every key, type, range, default and meaning) as
 * Markdown, from the schema table. */
void cfg_write_reference(FILE *out);

#endif
