/* resolve -- upstream names as sets of addresses that follow DNS (docs/endpoints.md).
 *
 * One resolver per process, driven by the control thread's loop with c-ares (the only part of
 * proxy/ that calls it). Each host name of routes[].upstreams is a struct dns_name, shared by
 * every upstream that names it and kept while a config snapshot holds it. Its addresses (every A
 * and AAAA record) form an immutable, refcounted struct dns_addrs: the resolver publishes a new
 * one when an answer differs, and bumps the name's generation, which a worker reads with one
 * atomic load per request to learn that its endpoints are stale, as with config snapshots
 * (proxy/core/runtime.h).
 *
 * A name is asked again when its records' TTL runs out (within resolver.min_refresh_ms and
 * max_refresh_ms). A failed lookup (timeout, SERVFAIL, refused, unreachable server) keeps the
 * addresses it had; NXDOMAIN or an answer without addresses keeps them for
 * resolver.nxdomain_keep_ms, then the set is empty. An IP literal is a name of one address that
 * is never asked.
 */
#ifndef RETRYPROXY_PROXY_DNS_RESOLVE_H
#define RETRYPROXY_PROXY_DNS_RESOLVE_H

#include <netinet/in.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct cfg_resolver; /* config/cfg.h: the "resolver" object */
struct loop;
struct metrics;

/* One address, without a port: the upstream's URL gives that. */
struct dns_addr {
    int family; /* AF_INET or AF_INET6 */
    union {
        struct in_addr v4;
        struct in6_addr v6;
    } u;
};

/* Two addresses in a set's order: IPv4 first, then by bytes (the order that makes two sets
 * compare with memcmp); 0 for the same address. */
static inline int dns_addr_cmp(const struct dns_addr *a, const struct dns_addr *b)
{
    if (a->family != b->family)
        return a->family == AF_INET ? -1 : 1;
    return a->family == AF_INET ? memcmp(&a->u.v4, &b->u.v4, 4) : memcmp(&a->u.v6, &b->u.v6, 16);
}

/* A name's addresses at one moment: sorted (IPv4 first, then by bytes) and without duplicates,
 * so two sets compare with memcmp. Immutable once published. */
struct dns_addrs {
    atomic_uint refs;
    size_t n;
    struct dns_addr a[]; /* n of them */
};

/* How a name's last lookup went (the "result" label of retryproxy_dns_resolutions_total). */
enum dns_result {
    DNS_NONE,     /* not asked yet (or an IP literal) */
    DNS_OK,       /* addresses came */
    DNS_NXDOMAIN, /* no such name, or no A/AAAA record */
    DNS_FAILED,   /* timeout, SERVFAIL, refused, no server reachable */
};

struct dns;
struct dns_name;

/* The process's resolver with settings 's' (servers, bounds), or NULL with a message on stderr.
 * Made before the first config snapshot, on the thread that later runs the control loop. */
struct dns *dns_new(const struct cfg_resolver *s);
/* Frees it; every name must have been released. Accepts NULL. */
void dns_free(struct dns *d);
/* From now on lookups run in loop 'l' (the control thread's); before this, dns_name() resolves a
 * new name at once, waiting at most resolver.timeout_ms. 0 or -1. */
int dns_attach(struct dns *d, struct loop *l);
/* New settings (a reload): the servers and bounds apply from the next lookup. */
int dns_configure(struct dns *d, const struct cfg_resolver *s);
/* Counts into 'm' (retryproxy_dns_resolutions_total, retryproxy_dns_stale). */
void dns_set_metrics(struct dns *d, struct metrics *m);
/* Called on the control thread after any name's addresses changed: the workers are woken so
 * that their endpoints follow even when no request comes. */
void dns_on_change(struct dns *d, void (*fn)(void *arg), void *arg);

/* Name 'host' (a DNS name or an IP literal, without brackets or port), with a new reference,
 * made on first use; NULL out of memory. A new name is resolved before this returns (at most
 * resolver.timeout_ms), so that a snapshot starts with addresses. Control thread only. */
struct dns_name *dns_name_get(struct dns *d, const char *host);
/* The same without the wait: a new name is asked, and dns_wait() then waits for every name so
 * made at once, so that a snapshot with N new names waits one resolver.timeout_ms, not N (a
 * reload while DNS is down). Control thread only. */
struct dns_name *dns_name_start(struct dns *d, const char *host);
/* Runs lookups until every name dns_name_start() made has its first answer, at most
 * resolver.timeout_ms (a lookup still running then has failed). Control thread only. */
void dns_wait(struct dns *d);
/* Any thread. */
struct dns_name *dns_name_ref(struct dns_name *n);
void dns_name_unref(struct dns_name *n); /* accepts NULL */

/* Changes (any thread, one atomic load) whenever the name's addresses do. */
uint64_t dns_name_generation(const struct dns_name *n);
/* Its addresses now, with a reference (never NULL: an empty set when it has none). Any
 * thread. */
struct dns_addrs *dns_name_addrs(struct dns_name *n);
void dns_addrs_unref(struct dns_addrs *a); /* accepts NULL */

/* What the admin view shows of a name (docs/admin.md, /upstreams). */
struct dns_status {
    const char *host;         /* the name as configured */
    bool literal;             /* an IP literal: never asked */
    enum dns_result last;     /* its last lookup */
    bool stale;               /* addresses kept though the last lookup failed */
    int64_t resolved_unix_ms; /* when addresses last came (0: never) */
    uint32_t ttl_s;           /* the TTL they came with */
    int64_t next_unix_ms;     /* when it is asked next (0: never) */
};
void dns_name_status(struct dns_name *n, struct dns_status *out); /* any thread */

/* Text of a result for logs and metrics: "ok", "nxdomain", "failure", "none". */
const char *dns_result_name(enum dns_result r);

#endif
