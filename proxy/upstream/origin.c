#include "proxy/upstream/origin.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    /* Resolved once, with the snapshot (not in a worker: a lookup blocks). */
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
    struct addrinfo *res = NULL;
    char addr[64] = "";
    if (getaddrinfo(host, port, &hints, &res) == 0 && res && res->ai_addrlen <= sizeof(o->addr)) {
        memcpy(&o->addr, res->ai_addr, res->ai_addrlen);
        o->addr_len = res->ai_addrlen;
        getnameinfo(res->ai_addr, res->ai_addrlen, addr, sizeof(addr), NULL, 0, NI_NUMERICHOST);
    }
    if (res)
        freeaddrinfo(res);
    /* the address too: after a reload that resolved the name anew, connections to the old
     * address take no new stream */
    /* and how it is reached: the same address trusting other certificates, presenting
     * another client certificate or verifying another name is another origin */
    const struct tls_conf *tc = &o->tls_conf;
    if (asprintf(&o->key, "%s:%s@%s%s%s%s%s%s%s%s%s%s%s", host, port, addr, tls ? "/tls" : "",
                 tls && tls->h1_too ? "+h1" : "", tc->ca_file ? "\n" : "",
                 tc->ca_file ? tc->ca_file : "", tc->cert_file ? "\ncert " : "",
                 tc->cert_file ? tc->cert_file : "", tc->key_file ? "\nkey " : "",
                 tc->key_file ? tc->key_file : "", tls ? "\nname " : "", tls ? tc->name : "") < 0) {
        o->key = NULL;
        goto fail;
    }
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
