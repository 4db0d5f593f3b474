/* tls -- TLS client connections for proxy/upstream/h2up.c (proxy/upstream/tls.h; docs/http2.md
 * "https upstreams"). OpenSSL, as libcurl uses it in the same process: every call clears the
 * thread's error queue first, so neither reads the other's errors. */
#include "proxy/upstream/tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

/* Contexts kept per worker: one per set of files routes name (and the system store's). */
#define CTXS_MAX 16

struct ctx_entry {
    struct tls_conf files; /* the name left NULL */
    time_t mtime;          /* the files' latest when loaded: one rewritten is loaded again */
    SSL_CTX *ctx;
};

struct tls_ctxs {
    struct ctx_entry e[CTXS_MAX];
    size_t n;
};

struct tls {
    SSL *ssl;
    char error[160];
};

/* ALPN's wire form: length-prefixed names, h2 first. */
static const unsigned char ALPN_H2_H1[] = "\x02h2\x08http/1.1";
static const unsigned char ALPN_H2[] = "\x02h2";
static const unsigned char ALPN_H1[] = "\x08http/1.1";

void tls_ctxs_free(struct tls_ctxs *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++) {
        SSL_CTX_free(c->e[i].ctx);
        tls_conf_clear(&c->e[i].files);
    }
    free(c);
}

static int dup_or_null(char **dst, const char *s)
{
    return s && !(*dst = strdup(s)) ? -1 : 0;
}

int tls_conf_copy(struct tls_conf *dst, const struct tls_conf *src)
{
    *dst = (struct tls_conf){ 0 };
    if (dup_or_null(&dst->ca_file, src->ca_file) < 0 ||
        dup_or_null(&dst->cert_file, src->cert_file) < 0 ||
        dup_or_null(&dst->key_file, src->key_file) < 0 || dup_or_null(&dst->name, src->name) < 0) {
        tls_conf_clear(dst);
        return -1;
    }
    return 0;
}

void tls_conf_clear(struct tls_conf *c)
{
    free(c->ca_file);
    free(c->cert_file);
    free(c->key_file);
    free(c->name);
    *c = (struct tls_conf){ 0 };
}

static SSL_CTX *ctx_make(const struct tls_conf *f)
{
    const char *ca_file = f->ca_file;
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        return NULL;
    /* RFC 9113 9.2: HTTP/2 needs TLS 1.2 or later */
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    /* a write may take part of a buffer, and be retried from a copy of the rest (h2up's) */
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS);
    int ok = ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL)
                     : SSL_CTX_set_default_verify_paths(ctx);
    /* the client certificate, sent only to a server that asks for one; its chain too */
    if (ok == 1 && f->cert_file)
        ok = SSL_CTX_use_certificate_chain_file(ctx, f->cert_file) == 1 &&
             SSL_CTX_use_PrivateKey_file(ctx, f->key_file ? f->key_file : f->cert_file,
                                         SSL_FILETYPE_PEM) == 1 &&
             SSL_CTX_check_private_key(ctx) == 1;
    if (ok != 1) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

static time_t mtime_of(const char *path)
{
    struct stat st;
    return path && stat(path, &st) == 0 ? st.st_mtime : 0;
}

static time_t latest(time_t a, time_t b)
{
    return a > b ? a : b;
}

static bool same(const char *a, const char *b)
{
    return a ? b && strcmp(a, b) == 0 : !b;
}

static SSL_CTX *ctx_for(struct tls_ctxs **cs, const struct tls_conf *f)
{
    if (!*cs && !(*cs = calloc(1, sizeof(**cs))))
        return NULL;
    struct tls_ctxs *c = *cs;
    time_t mtime =
        latest(mtime_of(f->ca_file), latest(mtime_of(f->cert_file), mtime_of(f->key_file)));
    struct ctx_entry *e = NULL;
    for (size_t i = 0; i < c->n && !e; i++)
        if (same(c->e[i].files.ca_file, f->ca_file) &&
            same(c->e[i].files.cert_file, f->cert_file) &&
            same(c->e[i].files.key_file, f->key_file))
            e = &c->e[i];
    if (e && e->mtime == mtime)
        return e->ctx;
    SSL_CTX *ctx = ctx_make(f);
    if (!ctx)
        return NULL;
    if (!e) {
        struct tls_conf copy;
        if (tls_conf_copy(&copy, f) < 0) {
            SSL_CTX_free(ctx);
            return NULL;
        }
        free(copy.name); /* the context serves every name */
        copy.name = NULL;
        if (c->n == CTXS_MAX) { /* the oldest goes: connections hold their own references */
            SSL_CTX_free(c->e[0].ctx);
            tls_conf_clear(&c->e[0].files);
            memmove(&c->e[0], &c->e[1], sizeof(c->e[0]) * (CTXS_MAX - 1));
            c->n--;
        }
        e = &c->e[c->n++];
        e->files = copy;
    } else {
        SSL_CTX_free(e->ctx); /* SSL objects made from it keep their own reference */
    }
    e->ctx = ctx;
    e->mtime = mtime;
    return ctx;
}

struct tls *tls_new(struct tls_ctxs **ctxs, int fd, const struct tls_conf *conf, enum tls_alpn alpn)
{
    ERR_clear_error();
    const char *host = conf->name;
    SSL_CTX *ctx = ctx_for(ctxs, conf);
    struct tls *t = ctx ? calloc(1, sizeof(*t)) : NULL;
    if (!t)
        return NULL;
    if (!(t->ssl = SSL_new(ctx)) || SSL_set_fd(t->ssl, fd) != 1)
        goto fail;
    SSL_set_connect_state(t->ssl);
    /* returns 0 on success, unlike the rest of the API */
    if (alpn == TLS_ALPN_H2_H1 ? SSL_set_alpn_protos(t->ssl, ALPN_H2_H1, sizeof(ALPN_H2_H1) - 1)
        : alpn == TLS_ALPN_H1  ? SSL_set_alpn_protos(t->ssl, ALPN_H1, sizeof(ALPN_H1) - 1)
                               : SSL_set_alpn_protos(t->ssl, ALPN_H2, sizeof(ALPN_H2) - 1))
        goto fail;
    unsigned char ip[16];
    if (inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1) {
        /* an address is checked against the certificate's IP entries and sent in no SNI */
        if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), host) != 1)
            goto fail;
    } else if (SSL_set1_host(t->ssl, host) != 1 || SSL_set_tlsext_host_name(t->ssl, host) != 1) {
        goto fail;
    }
    return t;
fail:
    tls_free(t);
    return NULL;
}

void tls_free(struct tls *t)
{
    if (!t)
        return;
    SSL_free(t->ssl);
    free(t);
}

enum tls_want tls_handshake(struct tls *t)
{
    ERR_clear_error();
    int r = SSL_do_handshake(t->ssl);
    if (r == 1)
        return TLS_DONE;
    int e = SSL_get_error(t->ssl, r);
    if (e == SSL_ERROR_WANT_READ)
        return TLS_WANT_READ;
    if (e == SSL_ERROR_WANT_WRITE)
        return TLS_WANT_WRITE;
    long v = SSL_get_verify_result(t->ssl);
    unsigned long err = ERR_peek_error();
    if (v != X509_V_OK)
        snprintf(t->error, sizeof(t->error), "certificate verify failed: %s",
                 X509_verify_cert_error_string(v));
    else if (err)
        ERR_error_string_n(err, t->error, sizeof(t->error));
    else
        snprintf(t->error, sizeof(t->error), "handshake failed (%s)",
                 e == SSL_ERROR_SYSCALL ? "connection closed" : "protocol error");
    ERR_clear_error();
    return TLS_FAILED;
}

bool tls_is_h2(const struct tls *t)
{
    const unsigned char *p = NULL;
    unsigned int n = 0;
    SSL_get0_alpn_selected(t->ssl, &p, &n);
    return n == 2 && memcmp(p, "h2", 2) == 0;
}

const char *tls_error(const struct tls *t)
{
    return t->error[0] ? t->error : "handshake failed";
}

/* The outcome of SSL_read/SSL_write's 'r' as recv/send would say it. */
static ssize_t io_result(struct tls *t, int r)
{
    if (r > 0)
        return r;
    int e = SSL_get_error(t->ssl, r);
    ERR_clear_error();
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        errno = EAGAIN;
        return -1;
    }
    if (e == SSL_ERROR_ZERO_RETURN)
        return 0; /* close_notify */
    errno = EPIPE;
    return -1;
}

ssize_t tls_recv(struct tls *t, void *buf, size_t n)
{
    ERR_clear_error();
    return io_result(t, SSL_read(t->ssl, buf, n > INT32_MAX ? INT32_MAX : (int)n));
}

ssize_t tls_send(struct tls *t, const void *buf, size_t n)
{
    if (!n)
        return 0;
    ERR_clear_error();
    return io_result(t, SSL_write(t->ssl, buf, n > INT32_MAX ? INT32_MAX : (int)n));
}

bool tls_pending(const struct tls *t)
{
    return SSL_pending(t->ssl) > 0;
}
