#include "proxy/upstream/origin.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/dns/resolve.h"

/* Sets o->addr to 'a' at o's port. */
static void set_addr(struct origin *o, const struct dns_addr *a)
{
    memset(&o->addr, 0, sizeof(o->addr));
    if (a->family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)&o->addr;
        sin->sin_family = AF_INET;
        sin->sin_port = htons(o->port);
        sin->sin_addr = a->u.v4;
        o->addr_len = sizeof(*sin);
    } else {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&o->addr;
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons(o->port);
        sin6->sin6_addr = a->u.v6;
        o->addr_len = sizeof(*sin6);
    }
}

/* The origin's key: its name and port, where it connects, and how it is reached (the same
 * address trusting other certificates, presenting another client certificate or verifying
 * another name is another origin). */
static int make_key(struct origin *o)
{
    char addr[INET6_ADDRSTRLEN] = "";
    if (o->addr_len)
        getnameinfo((const struct sockaddr *)&o->addr, o->addr_len, addr, sizeof(addr), NULL, 0,
                    NI_NUMERICHOST);
    const struct tls_conf *tc = &o->tls_conf;
    bool tls = o->tls;
    free(o->key);
    if (asprintf(&o->key, "%s:%u@%s%s%s%s%s%s%s%s%s%s%s", o->host, o->port, addr, tls ? "/tls" : "",
                 tls && o->h1_too ? "+h1" : "", tc->ca_file ? "\n" : "",
                 tc->ca_file ? tc->ca_file : "", tc->cert_file ? "\ncert " : "",
                 tc->cert_file ? tc->cert_file : "", tc->key_file ? "\nkey " : "",
                 tc->key_file ? tc->key_file : "", tls ? "\nname " : "", tls ? tc->name : "") < 0) {
        o->key = NULL;
        return -1;
    }
    return 0;
}

struct origin *origin_new(const char *authority, const struct origin_tls *tls)
{
    struct origin *o = calloc(1, sizeof(*o));
    if (!o || !(o->authority = strdup(authority)))
        goto fail;
    char host[256];
    const char *port = tls ? "443" : "80";
    const char *a = authority, *end;
    if (a[0] == '[') {
        end = strchr(a, ']');
        if (!end)
            end = a + strlen(a);
        a++;
        if (*end == ']' && end[1] == ':')
            port = end + 2;
    } else {
        end = strchr(a, ':');
        if (end)
            port = end + 1;
        else
            end = a + strlen(a);
    }
    size_t hl = (size_t)(end - a);
    if (hl >= sizeof(host))
        hl = sizeof(host) - 1;
    memcpy(host, a, hl);
    host[hl] = '\0';
    o->port = (uint16_t)strtoul(port, NULL, 10);
    if (!(o->host = strdup(host)))
        goto fail;
    if (tls) {
        o->tls = true;
        o->h1_too = tls->h1_too;
        struct tls_conf tc = { (char *)tls->ca_file, (char *)tls->cert_file, (char *)tls->key_file,
                               (char *)(tls->server_name ? tls->server_name : host) };
        if (tls_conf_copy(&o->tls_conf, &tc) < 0)
            goto fail;
    }
    /* An IP literal is its own address; a name has its endpoints (origin_at). */
    struct dns_addr lit = { .family = AF_INET };
    if (inet_pton(AF_INET, host, &lit.u.v4) == 1 ||
        (lit.family = AF_INET6, inet_pton(AF_INET6, host, &lit.u.v6) == 1))
        set_addr(o, &lit);
    if (make_key(o) < 0)
        goto fail;
    return o;
fail:
    origin_free(o);
    return NULL;
}

struct origin *origin_at(const struct origin *t, const struct dns_addr *a, _Atomic int64_t *conns)
{
    struct origin *o = calloc(1, sizeof(*o));
    if (!o)
        return NULL;
    o->port = t->port;
    o->tls = t->tls;
    o->h1_too = t->h1_too;
    o->conns = conns;
    if (!(o->authority = strdup(t->authority)) || !(o->host = strdup(t->host)) ||
        (t->tls && tls_conf_copy(&o->tls_conf, &t->tls_conf) < 0))
        goto fail;
    set_addr(o, a);
    if (make_key(o) < 0)
        goto fail;
    return o;
fail:
    origin_free(o);
    return NULL;
}

void origin_free(struct origin *o)
{
    if (!o)
        return;
    free(o->authority);
    free(o->host);
    tls_conf_clear(&o->tls_conf);
    free(o->key);
    free(o);
}
