/* resolve -- names as sets of addresses that follow DNS, with c-ares in the control loop
 * (proxy/dns/resolve.h).
 *
 * One ares channel asks for every name (A and AAAA at once, ares_getaddrinfo); its sockets are
 * watched by the loop and its timeouts are one loop timer. Each name has a timer of its own for
 * when it is asked next. A lookup has a guard timer of resolver.timeout_ms: past it the lookup
 * counts as failed and its answer, if one still comes, is dropped. This file and channel.c call
 * each other: they are one state machine, a name's lookups and the channel that runs them.
 */
#include "proxy/dns/resolve.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proxy/dns/dns_int.h"
#include "proxy/telemetry/log.h"
#include "proxy/telemetry/metrics.h"

static int64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *dns_result_name(enum dns_result r)
{
    switch (r) {
    case DNS_OK:
        return "ok";
    case DNS_NXDOMAIN:
        return "nxdomain";
    case DNS_FAILED:
        return "failure";
    default:
        return "none";
    }
}

/* ---- address sets ---- */

static struct dns_addrs *addrs_new(size_t n)
{
    struct dns_addrs *a = calloc(1, sizeof(*a) + n * sizeof(a->a[0]));
    if (a) {
        atomic_init(&a->refs, 1);
        a->n = n;
    }
    return a;
}

void dns_addrs_unref(struct dns_addrs *a)
{
    if (a && atomic_fetch_sub_explicit(&a->refs, 1, memory_order_acq_rel) == 1)
        free(a);
}

/* dns_addr_cmp() for qsort. */
static int addr_cmp(const void *x, const void *y)
{
    return dns_addr_cmp(x, y);
}

/* The set of an answer, sorted and without duplicates; its least TTL in *ttl. Every address
 * of the answer is kept: no cap but the DNS message's own (64 KiB over TCP, about 4,000 A
 * records), so a Service of a thousand pods is a thousand endpoints (docs/endpoints.md). NULL
 * out of memory. */
static struct dns_addrs *addrs_of(const struct ares_addrinfo *res, uint32_t *ttl)
{
    size_t max = 0;
    for (const struct ares_addrinfo_node *p = res ? res->nodes : NULL; p; p = p->ai_next)
        max++;
    struct dns_addrs *set = addrs_new(max);
    if (!set)
        return NULL;
    struct dns_addr *tmp = set->a;
    size_t n = 0;
    *ttl = UINT32_MAX;
    for (const struct ares_addrinfo_node *p = res ? res->nodes : NULL; p; p = p->ai_next) {
        struct dns_addr *a = &tmp[n];
        memset(a, 0, sizeof(*a));
        if (p->ai_family == AF_INET && p->ai_addrlen >= sizeof(struct sockaddr_in))
            a->u.v4 = ((const struct sockaddr_in *)(const void *)p->ai_addr)->sin_addr;
        else if (p->ai_family == AF_INET6 && p->ai_addrlen >= sizeof(struct sockaddr_in6))
            a->u.v6 = ((const struct sockaddr_in6 *)(const void *)p->ai_addr)->sin6_addr;
        else
            continue;
        a->family = p->ai_family;
        n++;
        uint32_t t = p->ai_ttl > 0 ? (uint32_t)p->ai_ttl : 0;
        if (t < *ttl)
            *ttl = t;
    }
    if (*ttl == UINT32_MAX)
        *ttl = 0;
    qsort(tmp, n, sizeof(tmp[0]), addr_cmp);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || addr_cmp(&tmp[k - 1], &tmp[i]) != 0)
            tmp[k++] = tmp[i];
    set->n = k;
    return set;
}

static bool addrs_equal(const struct dns_addrs *a, const struct dns_addrs *b)
{
    return a->n == b->n && memcmp(a->a, b->a, a->n * sizeof(a->a[0])) == 0;
}

/* Publishes 'a' (taking its reference) as the name's set when it differs. */
static void publish(struct dns_name *n, struct dns_addrs *a)
{
    pthread_mutex_lock(&n->lock);
    struct dns_addrs *old = n->addrs;
    bool same = old && addrs_equal(old, a);
    if (!same)
        n->addrs = a;
    pthread_mutex_unlock(&n->lock);
    if (same) {
        dns_addrs_unref(a);
        return;
    }
    dns_addrs_unref(old);
    atomic_fetch_add_explicit(&n->gen, 1, memory_order_release);
    n->d->changed = true;
}

/* ---- names: what each lookup's end does ---- */

static void set_status(struct dns_name *n, enum dns_result r, bool stale, uint32_t ttl_s,
                       bool resolved)
{
    int64_t now = unix_ms();
    pthread_mutex_lock(&n->lock);
    n->st.last = r;
    n->st.stale = stale;
    if (resolved) {
        n->st.resolved_unix_ms = now;
        n->st.ttl_s = ttl_s;
    }
    n->st.next_unix_ms = now + ((int64_t)n->ask_ms - (int64_t)dns_mono_ms(n->d));
    pthread_mutex_unlock(&n->lock);
}

static uint64_t clamp_ms(const struct dns *d, uint64_t ms)
{
    if (ms < d->s.min_refresh_ms)
        return d->s.min_refresh_ms;
    return ms > d->s.max_refresh_ms ? d->s.max_refresh_ms : ms;
}

static void count(struct dns_name *n, enum metrics_dns r, bool stale)
{
    metrics_dns_result(n->mn, r);
    metrics_dns_stale(n->mn, stale);
}

/* Addresses came: published, asked again when their TTL runs out. */
static void answered(struct dns_name *n, struct dns_addrs *a, uint32_t ttl)
{
    uint64_t now = dns_mono_ms(n->d);
    if (n->st.stale)
        log_event(CFG_LOG_INFO, "name resolves again", "name", n->shown, LOG_NUM("addresses", a->n),
                  NULL);
    n->nx_until_ms = 0;
    n->ask_ms = now + clamp_ms(n->d, (uint64_t)ttl * 1000u);
    publish(n, a);
    set_status(n, DNS_OK, false, ttl, true);
    count(n, METRICS_DNS_OK, false);
}

/* The addresses kept after an NXDOMAIN have had their time: the name has none now. */
static void drop_kept(struct dns_name *n)
{
    struct dns_addrs *none = addrs_new(0);
    if (none)
        publish(n, none);
    n->nx_until_ms = 0;
    log_event(CFG_LOG_WARN, "name not found: its addresses are dropped", "name", n->shown, NULL);
}

/* NXDOMAIN, or no A or AAAA record: the addresses it had are kept for nxdomain_keep_ms. */
static void not_found(struct dns_name *n)
{
    struct dns *d = n->d;
    uint64_t now = dns_mono_ms(d);
    if (n->addrs->n > 0 && !n->nx_until_ms) {
        n->nx_until_ms = now + d->s.nxdomain_keep_ms;
        log_event(CFG_LOG_WARN, "name not found: keeping its addresses for a while", "name",
                  n->shown, LOG_NUM("keep_ms", d->s.nxdomain_keep_ms), NULL);
    }
    if (n->nx_until_ms && now >= n->nx_until_ms)
        drop_kept(n);
    n->ask_ms = now + d->s.min_refresh_ms;
    set_status(n, DNS_NXDOMAIN, false, 0, false);
    count(n, METRICS_DNS_NXDOMAIN, false);
}

/* Timeout, SERVFAIL, refused...: the addresses stay, marked stale, and the name is asked
 * again after min_refresh_ms. */
static void failed(struct dns_name *n, const char *why)
{
    if (!n->st.stale)
        log_event(CFG_LOG_WARN, "name lookup failed: keeping its last addresses", "name", n->shown,
                  "error", why, LOG_NUM("addresses", n->addrs->n), NULL);
    n->ask_ms = dns_mono_ms(n->d) + n->d->s.min_refresh_ms;
    set_status(n, DNS_FAILED, true, 0, false);
    count(n, METRICS_DNS_FAILURE, true);
}

static void lookup_end(struct lookup *l)
{
    struct dns_name *n = l->n;
    if (n->d->loop)
        loop_timer_stop(n->d->loop, &l->guard);
    l->n = NULL;
    n->pending = NULL;
}

void dns_on_answer(void *arg, int status, int timeouts, struct ares_addrinfo *res)
{
    (void)timeouts;
    struct lookup *l = arg;
    struct dns_name *n = l->n;
    if (!n) { /* abandoned: the guard or the name's end came first */
        free(l);
        ares_freeaddrinfo(res);
        return;
    }
    lookup_end(l);
    free(l);
    if (status == ARES_EDESTRUCTION || status == ARES_ECANCELLED) {
        n->ask_ms = dns_mono_ms(n->d); /* the channel was replaced: ask the new one */
    } else if (status == ARES_SUCCESS || status == ARES_ENOTFOUND || status == ARES_ENODATA) {
        uint32_t ttl;
        struct dns_addrs *a = status == ARES_SUCCESS ? addrs_of(res, &ttl) : NULL;
        bool oom = status == ARES_SUCCESS && !a;
        if (a && a->n) {
            answered(n, a, ttl); /* takes 'a' */
        } else {
            dns_addrs_unref(a);
            if (oom)
                failed(n, "out of memory");
            else
                not_found(n);
        }
    } else {
        failed(n, ares_strerror(status));
    }
    ares_freeaddrinfo(res);
    dns_schedule(n);
}

void dns_timed_out(struct dns_name *n)
{
    lookup_end(n->pending); /* c-ares frees it with its answer, or at the channel's end */
    failed(n, "timeout");
}

static void on_guard(struct loop_timer *t)
{
    struct lookup *l = t->arg;
    struct dns_name *n = l->n;
    dns_timed_out(n);
    dns_schedule(n);
    dns_flush_changes(n->d);
}

static void on_name_timer(struct loop_timer *t)
{
    struct dns_name *n = t->arg;
    struct dns *d = n->d;
    /* Only the registry holds it: no snapshot names it any more. */
    if (atomic_load_explicit(&n->refs, memory_order_acquire) == 1) {
        dns_name_free(n);
        return;
    }
    uint64_t now = dns_mono_ms(d);
    if (n->nx_until_ms && now >= n->nx_until_ms)
        drop_kept(n);
    if (now >= n->ask_ms)
        dns_ask(n);
    else
        dns_schedule(n);
    dns_rearm(d);
    dns_flush_changes(d);
}

/* Arms the name's timer for its next lookup (or the end of an NXDOMAIN's keep). */
void dns_schedule(struct dns_name *n)
{
    struct dns *d = n->d;
    if (!d->loop || n->literal || n->pending)
        return;
    uint64_t when = n->ask_ms;
    if (n->nx_until_ms && n->nx_until_ms < when)
        when = n->nx_until_ms;
    loop_timer_start(d->loop, &n->timer, when, on_name_timer, n);
}

void dns_ask(struct dns_name *n)
{
    struct dns *d = n->d;
    if (n->pending || n->literal)
        return;
    struct lookup *l = calloc(1, sizeof(*l));
    if (!l) {
        failed(n, "out of memory");
        dns_schedule(n);
        return;
    }
    l->n = n;
    n->pending = l;
    if (d->loop)
        loop_timer_stop(d->loop, &n->timer);
    struct ares_addrinfo_hints h;
    memset(&h, 0, sizeof(h));
    h.ai_family = AF_UNSPEC;
    h.ai_flags = ARES_AI_NOSORT;
    ares_getaddrinfo(d->ch, n->host, NULL, &h, dns_on_answer, l);
    /* The answer may have come already (a hosts file, an error at once). */
    if (n->pending == l && d->loop)
        loop_timer_start(d->loop, &l->guard, loop_now(d->loop) + d->s.timeout_ms, on_guard, l);
}

/* ---- the registry ---- */

void dns_name_free(struct dns_name *n)
{
    struct dns *d = n->d;
    for (size_t i = 0; i < d->nnames; i++)
        if (d->names[i] == n) {
            d->names[i] = d->names[--d->nnames];
            break;
        }
    if (n->pending)
        lookup_end(n->pending);
    if (d->loop)
        loop_timer_stop(d->loop, &n->timer);
    if (n->mn)
        metrics_dns_stale(n->mn, false);
    dns_addrs_unref(n->addrs);
    pthread_mutex_destroy(&n->lock);
    free(n->host);
    free(n->shown);
    free(n);
}

/* One address when 'host' is an IP literal. */
static struct dns_addrs *literal_of(const char *host)
{
    struct dns_addr a;
    memset(&a, 0, sizeof(a));
    if (inet_pton(AF_INET, host, &a.u.v4) == 1)
        a.family = AF_INET;
    else if (inet_pton(AF_INET6, host, &a.u.v6) == 1)
        a.family = AF_INET6;
    else
        return NULL;
    struct dns_addrs *s = addrs_new(1);
    if (s)
        s->a[0] = a;
    return s;
}

struct dns_name *dns_name_start(struct dns *d, const char *host)
{
    char *key = strdup(host);
    if (!key)
        return NULL;
    for (char *p = key; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    for (size_t i = 0; i < d->nnames; i++)
        if (strcmp(d->names[i]->host, key) == 0) {
            free(key);
            return dns_name_ref(d->names[i]);
        }
    if (d->nnames == d->capnames) {
        size_t cap = d->capnames ? 2 * d->capnames : 8;
        struct dns_name **v = realloc(d->names, cap * sizeof(*v));
        if (!v) {
            free(key);
            return NULL;
        }
        d->names = v;
        d->capnames = cap;
    }
    struct dns_name *n = calloc(1, sizeof(*n));
    if (!n) {
        free(key);
        return NULL;
    }
    n->d = d;
    n->host = key;
    n->shown = strdup(host);
    pthread_mutex_init(&n->lock, NULL);
    struct dns_addrs *lit = literal_of(key);
    n->literal = lit != NULL;
    n->addrs = lit ? lit : addrs_new(0);
    if (!n->shown || !n->addrs) {
        dns_addrs_unref(n->addrs);
        free(n->shown);
        free(key);
        free(n);
        return NULL;
    }
    atomic_init(&n->refs, 2); /* the registry's and the caller's */
    atomic_init(&n->gen, 1);
    n->st.host = n->shown;
    n->st.literal = n->literal;
    d->names[d->nnames++] = n;
    if (!n->literal) {
        n->mn = d->m ? metrics_dns_name(d->m, n->shown) : NULL;
        n->first = true;
        dns_ask(n);
    }
    return n;
}

struct dns_name *dns_name_get(struct dns *d, const char *host)
{
    struct dns_name *n = dns_name_start(d, host);
    if (n)
        dns_wait(d);
    return n;
}

struct dns_name *dns_name_ref(struct dns_name *n)
{
    atomic_fetch_add_explicit(&n->refs, 1, memory_order_relaxed);
    return n;
}

void dns_name_unref(struct dns_name *n)
{
    /* Never the last: the registry's reference goes with the name, on the control thread. */
    if (n)
        atomic_fetch_sub_explicit(&n->refs, 1, memory_order_acq_rel);
}

uint64_t dns_name_generation(const struct dns_name *n)
{
    return atomic_load_explicit(&n->gen, memory_order_acquire);
}

struct dns_addrs *dns_name_addrs(struct dns_name *n)
{
    pthread_mutex_lock(&n->lock);
    struct dns_addrs *a = n->addrs;
    atomic_fetch_add_explicit(&a->refs, 1, memory_order_relaxed);
    pthread_mutex_unlock(&n->lock);
    return a;
}

void dns_name_status(struct dns_name *n, struct dns_status *out)
{
    pthread_mutex_lock(&n->lock);
    *out = n->st;
    pthread_mutex_unlock(&n->lock);
}
