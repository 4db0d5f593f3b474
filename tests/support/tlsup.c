#include "tests/support/tlsup.h"

#include <criterion/criterion.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/fixture.h"

char tlsup_byte(size_t i)
{
    return (char)('a' + i % 26);
}

/* Reads the request head (up to its empty line, or the peer's end). */
static bool read_head(SSL *ssl)
{
    char buf[8192];
    size_t n = 0;
    while (n < sizeof(buf) && !memmem(buf, n, "\r\n\r\n", 4)) {
        int k = SSL_read(ssl, buf + n, (int)(sizeof(buf) - n));
        if (k <= 0)
            return false;
        n += (size_t)k;
    }
    return n < sizeof(buf);
}

/* The records after 'resp', corked so that they leave the socket together, as a busy server
 * sends them: the peer finds them all at once. */
static bool send_records(struct tlsup *s, SSL *ssl, int c)
{
    char *rec = malloc(s->record);
    size_t at = 0;
    int on = 1, off = 0;
    setsockopt(c, IPPROTO_TCP, TCP_CORK, &on, sizeof(on));
    bool ok = rec != NULL;
    for (size_t r = 0; ok && r < s->n_records; r++) {
        for (size_t i = 0; i < s->record; i++)
            rec[i] = tlsup_byte(at++);
        ok = SSL_write(ssl, rec, (int)s->record) == (int)s->record;
    }
    setsockopt(c, IPPROTO_TCP, TCP_CORK, &off, sizeof(off));
    free(rec);
    return ok;
}

/* Holds the connection, dropping what comes, until the peer's end or the stop. */
static void hold(struct tlsup *s, SSL *ssl, int c)
{
    while (!s->stop) {
        struct pollfd q = { c, POLLIN, 0 };
        if (poll(&q, 1, 50) <= 0)
            continue;
        char buf[4096];
        if (SSL_read(ssl, buf, sizeof(buf)) <= 0)
            return;
    }
}

static void *tlsup_main(void *arg)
{
    struct tlsup *s = arg;
    for (int c; (c = fx_accept(s->lfd, &s->stop)) >= 0;) {
        SSL *ssl = SSL_new(s->ctx);
        SSL_set_fd(ssl, c);
        if (SSL_accept(ssl) == 1 && read_head(ssl) &&
            SSL_write(ssl, s->resp, (int)strlen(s->resp)) == (int)strlen(s->resp) &&
            send_records(s, ssl, c)) {
            s->served++;
            hold(s, ssl, c);
        }
        SSL_free(ssl);
        close(c);
    }
    return NULL;
}

struct tlsup *tlsup_start(const char *pem, const char *key, const char *resp, size_t n_records,
                          size_t record)
{
    struct tlsup *s = calloc(1, sizeof(*s));
    cr_assert_not_null(s);
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    cr_assert_not_null(ctx);
    cr_assert_eq(SSL_CTX_use_certificate_file(ctx, pem, SSL_FILETYPE_PEM), 1, "%s", pem);
    cr_assert_eq(SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM), 1, "%s", key);
    s->ctx = ctx;
    s->resp = resp;
    s->n_records = n_records;
    s->record = record;
    s->lfd = fx_listen(&s->port);
    cr_assert_eq(pthread_create(&s->th, NULL, tlsup_main, s), 0);
    return s;
}

void tlsup_stop(struct tlsup *s)
{
    if (!s)
        return;
    s->stop = 1;
    pthread_join(s->th, NULL);
    close(s->lfd);
    SSL_CTX_free(s->ctx);
    free(s);
}
