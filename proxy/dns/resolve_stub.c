/* TEMPORARY stub (not committed): getaddrinfo once. */
#include "proxy/dns/resolve.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>

struct dns {
    int dummy;
};
struct dns_name {
    atomic_uint refs;
    char *host;
    struct dns_addrs *addrs;
};

struct dns *dns_new(const struct cfg_resolver *s)
{
    (void)s;
    return calloc(1, sizeof(struct dns));
}
void dns_free(struct dns *d)
{
    free(d);
}
int dns_attach(struct dns *d, struct loop *l)
{
    (void)d, (void)l;
    return 0;
}
int dns_configure(struct dns *d, const struct cfg_resolver *s)
{
    (void)d, (void)s;
    return 0;
}
void dns_set_metrics(struct dns *d, struct metrics *m)
{
    (void)d, (void)m;
}
void dns_on_change(struct dns *d, void (*fn)(void *arg), void *arg)
{
    (void)d, (void)fn, (void)arg;
}
static int cmp(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(struct dns_addr));
}
struct dns_name *dns_name_get(struct dns *d, const char *host)
{
    (void)d;
    struct dns_name *n = calloc(1, sizeof(*n));
    n->refs = 1;
    n->host = strdup(host);
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
    size_t cnt = 0;
    if (getaddrinfo(host, NULL, &hints, &res) == 0)
        for (struct addrinfo *p = res; p; p = p->ai_next)
            cnt++;
    n->addrs = calloc(1, sizeof(struct dns_addrs) + cnt * sizeof(struct dns_addr));
    n->addrs->refs = 1;
    for (struct addrinfo *p = res; p; p = p->ai_next) {
        struct dns_addr a;
        memset(&a, 0, sizeof(a));
        a.family = p->ai_family;
        if (p->ai_family == AF_INET)
            a.u.v4 = ((struct sockaddr_in *)p->ai_addr)->sin_addr;
        else
            a.u.v6 = ((struct sockaddr_in6 *)p->ai_addr)->sin6_addr;
        bool dup = false;
        for (size_t i = 0; i < n->addrs->n; i++)
            dup |= memcmp(&n->addrs->a[i], &a, sizeof(a)) == 0;
        if (!dup)
            n->addrs->a[n->addrs->n++] = a;
    }
    qsort(n->addrs->a, n->addrs->n, sizeof(struct dns_addr), cmp);
    if (res)
        freeaddrinfo(res);
    return n;
}
struct dns_name *dns_name_ref(struct dns_name *n)
{
    n->refs++;
    return n;
}
void dns_name_unref(struct dns_name *n)
{
    if (n && --n->refs == 0) {
        dns_addrs_unref(n->addrs);
        free(n->host);
        free(n);
    }
}
uint64_t dns_name_generation(const struct dns_name *n)
{
    (void)n;
    return 1;
}
struct dns_addrs *dns_name_addrs(struct dns_name *n)
{
    n->addrs->refs++;
    return n->addrs;
}
void dns_addrs_unref(struct dns_addrs *a)
{
    if (a && --a->refs == 0)
        free(a);
}
void dns_name_status(struct dns_name *n, struct dns_status *out)
{
    memset(out, 0, sizeof(*out));
    out->host = n->host;
}
const char *dns_result_name(enum dns_result r)
{
    return r == DNS_OK ? "ok" : r == DNS_NXDOMAIN ? "nxdomain" : r == DNS_FAILED ? "failure" : "none";
}
