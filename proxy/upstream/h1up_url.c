/* h1up_url -- an upstream's URL as libcurl takes it, parsed once per config snapshot for every
 * HTTP/1.1 transfer to it (proxy/upstream/h1up.c), and the pin that sends an endpoint's
 * transfers to its address (CURLOPT_CONNECT_TO; docs/endpoints.md). The attempt's dispatcher
 * (proxy/upstream/attempt.c) makes both, beside the HTTP/2 and upgrade origins of the same URL.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "config/cfg.h"
#include "proxy/dns/resolve.h"
#include "proxy/upstream/attempt_int.h"

struct h1up_url {
    CURLU *curl;
    bool https;
    char *cainfo, *capath;  /* what libcurl verifies an https upstream's certificate against */
    char *sslcert, *sslkey; /* the client certificate (tls.cert_file, key_file) */
    struct curl_slist *connect_to; /* with tls.server_name: where connections really go */
    bool literal;     /* its host is an IP address: its one endpoint needs no CONNECT_TO */
    char *host_field; /* ... and the Host the URL no longer gives */
};

/* libcurl's own CA bundle and directory, which a pooled handle is given back after serving a
 * route with its own tls.ca_file. */
static int curl_ca_defaults(char **cainfo, char **capath)
{
    CURL *e = curl_easy_init();
    char *info = NULL, *path = NULL;
    if (!e)
        return -1;
    curl_easy_getinfo(e, CURLINFO_CAINFO, &info);
    curl_easy_getinfo(e, CURLINFO_CAPATH, &path);
    *cainfo = info ? strdup(info) : NULL;
    *capath = path ? strdup(path) : NULL;
    curl_easy_cleanup(e);
    return (info && !*cainfo) || (path && !*capath) ? -1 : 0;
}

/* libcurl (7.88) sends in SNI and verifies the URL's host, and has no option to name another:
 * the URL is given tls.server_name for host, CURLOPT_CONNECT_TO sends its connections to the
 * host and port 'origin' has, and the Host field, which libcurl would take from the URL, is
 * given as 'origin' has it. libcurl keeps connections made through CONNECT_TO apart from
 * others (its cache compares the host connected to as well as the URL's). */
static int server_name(struct h1up_url *url, const char *origin, const char *name)
{
    char *host = NULL, *port = NULL, *ct = NULL;
    const char *auth = strstr(origin, "://") + 3;
    int len = (int)strcspn(auth, "/");
    int rc = -1;
    if (curl_url_get(url->curl, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
        curl_url_get(url->curl, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK ||
        asprintf(&ct, "::%s:%s", host, port) < 0 ||
        asprintf(&url->host_field, "Host: %.*s", len, auth) < 0)
        goto out;
    if (curl_url_set(url->curl, CURLUPART_HOST, name, 0) != CURLUE_OK ||
        !(url->connect_to = curl_slist_append(NULL, ct)))
        goto out;
    rc = 0;
out:
    curl_free(host);
    curl_free(port);
    free(ct);
    return rc;
}

struct h1up_url *h1up_url_new(const char *origin, const char *host, const struct cfg_tls *tls)
{
    struct h1up_url *url = calloc(1, sizeof(*url));
    if (!url)
        return NULL;
    url->curl = curl_url();
    if (!url->curl || curl_url_set(url->curl, CURLUPART_URL, origin, 0) != CURLUE_OK)
        goto fail;
    unsigned char b[16];
    url->literal = inet_pton(AF_INET, host, b) == 1 || inet_pton(AF_INET6, host, b) == 1;
    if ((url->https = strncmp(origin, "https://", 8) == 0)) {
        if (tls->ca_file ? !(url->cainfo = strdup(tls->ca_file))
                         : curl_ca_defaults(&url->cainfo, &url->capath) < 0)
            goto fail;
        if ((tls->cert_file && !(url->sslcert = strdup(tls->cert_file))) ||
            (tls->key_file && !(url->sslkey = strdup(tls->key_file))))
            goto fail;
        if (tls->server_name && server_name(url, origin, tls->server_name) < 0)
            goto fail;
    }
    return url;
fail:
    h1up_url_free(url);
    return NULL;
}

void h1up_url_free(struct h1up_url *url)
{
    if (!url)
        return;
    curl_url_cleanup(url->curl);
    free(url->cainfo);
    free(url->capath);
    free(url->sslcert);
    free(url->sslkey);
    free(url->host_field);
    curl_slist_free_all(url->connect_to);
    free(url);
}

int h1up_url_pin(const struct h1up_url *url, const struct dns_addr *a, struct curl_slist **pin)
{
    *pin = NULL;
    if (url->literal)
        return 0;
    char *port = NULL, ip[INET6_ADDRSTRLEN], *ct = NULL;
    inet_ntop(a->family, &a->u, ip, sizeof(ip));
    if (curl_url_get(url->curl, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK &&
        asprintf(&ct, a->family == AF_INET6 ? "::[%s]:%s" : "::%s:%s", ip, port) >= 0)
        *pin = curl_slist_append(NULL, ct);
    curl_free(port);
    free(ct);
    return *pin ? 0 : -1;
}

void h1up_pin_free(struct curl_slist *pin)
{
    curl_slist_free_all(pin);
}

void h1up_url_easy(CURL *e, const struct h1up_url *url, const struct curl_slist *pin)
{
    /* curl only reads the handle (it works on a copy of it) */
    curl_easy_setopt(e, CURLOPT_CURLU, url->curl);
    if (url->https) { /* a route's own tls.ca_file replaces the system's store */
        curl_easy_setopt(e, CURLOPT_CAINFO, url->cainfo);
        curl_easy_setopt(e, CURLOPT_CAPATH, url->capath);
        /* sent when the server asks; NULL clears a pooled handle's (no key: in the cert).
         * libcurl's connection and session caches compare the certificate's file, so no
         * connection made with one is used without it, or with another */
        curl_easy_setopt(e, CURLOPT_SSLCERT, url->sslcert);
        curl_easy_setopt(e, CURLOPT_SSLKEY, url->sslkey);
    }
    /* every time: a pooled handle must not keep another route's. The endpoint's, which with
     * tls.server_name sends connections to the address instead of the URL's host too. */
    curl_easy_setopt(e, CURLOPT_CONNECT_TO, pin ? pin : url->connect_to);
}

const char *h1up_url_host_field(const struct h1up_url *url)
{
    return url->host_field;
}
