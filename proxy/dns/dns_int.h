/* dns_int -- the resolver's own types, shared by resolve.c (names, their lookups and what an
 * answer does to them) and channel.c (the c-ares channel in the loop, the resolver itself).
 * Nothing outside proxy/dns/ includes it.
 */
#ifndef RETRYPROXY_PROXY_DNS_INT_H
#define RETRYPROXY_PROXY_DNS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <ares.h>

#include "config/cfg.h"
#include "proxy/base/loop.h"
#include "proxy/dns/resolve.h"

struct lookup;
struct metrics_name;

struct dns_name {
    struct dns *d;
    atomic_uint refs; /* the registry holds one */
    char *host;       /* lowercase: the registry's key */
    char *shown;      /* as first asked for: the metrics' label */
    bool literal;
    _Atomic uint64_t gen;

    pthread_mutex_t lock; /* the set and the status, read from any thread */
    struct dns_addrs *addrs;
    struct dns_status st;

    /* control thread only */
    struct loop_timer timer; /* the next lookup, or the end of an NXDOMAIN's keep */
    uint64_t ask_ms;         /* when it is asked next (monotonic ms) */
    uint64_t nx_until_ms;    /* not 0: addresses kept after an NXDOMAIN until then */
    struct lookup *pending;  /* the lookup in flight */
    bool first;              /* made by dns_name_start(), not yet through dns_wait() */
    struct metrics_name *mn;
};

struct lookup {
    struct dns_name *n; /* NULL once abandoned: its answer is dropped */
    struct loop_timer guard;
};

/* One of the channel's sockets. */
struct sock {
    struct loop_watch w;
    struct dns *d;
    int fd;
    uint32_t events; /* what c-ares waits for */
    bool watched;    /* by the loop */
};

struct dns {
    ares_channel ch;
    struct cfg_resolver s; /* the settings (servers copied below) */
    struct cfg_dns_server *servers;
    struct loop *loop; /* NULL until dns_attach() */
    struct loop_timer ares_timer;
    struct sock **socks; /* the channel's open sockets */
    size_t nsocks, capsocks;
    struct dns_name **names; /* the registry */
    size_t nnames, capnames;
    struct metrics *m;
    void (*change_fn)(void *);
    void *change_arg;
    bool changed; /* a name's set changed in this round */
};

/* The monotonic clock in ms: the loop's once attached (its timers run on it). */
uint64_t dns_mono_ms(const struct dns *d);
/* The loop timer at c-ares' next timeout (nothing before dns_attach()). */
void dns_rearm(struct dns *d);
/* Calls the dns_on_change() callback if a set changed since the last call (once attached). */
void dns_flush_changes(struct dns *d);

/* resolve.c */
void dns_ask(struct dns_name *n);
/* Arms the name's timer for its next lookup (or the end of an NXDOMAIN's keep). */
void dns_schedule(struct dns_name *n);
/* Unregisters and frees 'n', its lookup abandoned. */
void dns_name_free(struct dns_name *n);
/* The c-ares callback of a lookup: 'arg' is its struct lookup. */
/* The lookup of 'n' passed timeout_ms: abandoned, and the name's lookup failed. */
void dns_timed_out(struct dns_name *n);
void dns_on_answer(void *arg, int status, int timeouts, struct ares_addrinfo *res);

#endif
