/* connect: one connection to an origin in a loop (proxy/upstream/connect.h), against listeners of
 * the test's own on 127.0.0.1: plain TCP with TCP_NODELAY, a refused connect, the connect timeout,
 * TLS whose decrypted bytes no socket event announces (the pending-TLS kick), and a TLS
 * failure, logged once with the origin and the reason. */
#include <criterion/criterion.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include "proxy/upstream/connect.h"
#include "proxy/telemetry/log.h"
#include "proxy/base/loop.h"
#include "proxy/upstream/origin.h"
#include "proxy/upstream/tls.h"
#include "tests/support/fixture.h"

/* What the connector told its user. */
struct user {
    struct connector k;
    int ups, fails, ios;
    bool h2;
    char why[160];
    size_t read_max; /* bytes read per 'io' (one connector_recv) */
    char got[32 * 1024];
    size_t got_len;
    bool eof;
};

static void on_up(void *arg, bool h2)
{
    struct user *u = arg;
    u->ups++;
    u->h2 = h2;
    cr_assert_eq(connector_watch(&u->k, EPOLLIN), 0);
}

static void on_failed(void *arg, const char *why)
{
    struct user *u = arg;
    u->fails++;
    snprintf(u->why, sizeof(u->why), "%s", why);
}

static void on_io(void *arg, uint32_t events)
{
    struct user *u = arg;
    (void)events;
    u->ios++;
    size_t room = sizeof(u->got) - u->got_len;
    ssize_t n = connector_recv(&u->k, u->got + u->got_len, room < u->read_max ? room : u->read_max);
    if (n > 0)
        u->got_len += (size_t)n;
    else if (n == 0 || !connector_again())
        u->eof = true;
}

static const struct connector_ops ops = { .up = on_up, .failed = on_failed, .io = on_io };

static struct origin *origin_on(uint16_t port, const struct origin_tls *tls)
{
    char a[32];
    snprintf(a, sizeof(a), "127.0.0.1:%u", port);
    struct origin *o = origin_new(a, tls);
    cr_assert(o && o->addr_len);
    return o;
}

/* Turns 'l' until 'done' holds, for at most 10 s (a loaded machine). */
#define TURN_UNTIL(l, done)                                                                        \
    for (int turns_ = 0; !(done) && turns_ < 10000; turns_++)                                      \
    cr_assert_geq(loop_turn(l, 1), 0)

Test(connect, plain_tcp_is_up_with_nodelay_and_reads)
{
    struct loop *l = loop_new();
    struct connect_side cs = { .loop = l };
    uint16_t port;
    int lfd = fx_listen(&port);
    struct origin *o = origin_on(port, NULL);
    struct user u = { .read_max = sizeof(u.got) };
    cr_assert_eq(connector_start(&u.k, &cs, o, TLS_ALPN_H1, 5000, &ops, &u), 0);
    TURN_UNTIL(l, u.ups || u.fails);
    cr_assert_eq(u.ups, 1, "failed: %s", u.why);
    cr_expect(!u.h2);
    cr_expect_null(u.k.tls);
    cr_expect_not(loop_timer_armed(&u.k.timer), "the connect timeout outlived the connect");
    int one = 0;
    socklen_t len = sizeof(one);
    cr_assert_eq(getsockopt(u.k.fd, IPPROTO_TCP, TCP_NODELAY, &one, &len), 0);
    cr_expect(one, "TCP_NODELAY not set");
    int peer = accept(lfd, NULL, NULL);
    cr_assert_eq(write(peer, "hello", 5), 5);
    TURN_UNTIL(l, u.got_len == 5);
    cr_expect_eq(u.got_len, 5);
    cr_expect_eq(connector_send(&u.k, "back", 4), 4);
    connector_close(&u.k);
    connector_close(&u.k); /* again: harmless */
    close(peer);
    close(lfd);
    origin_free(o);
    loop_free(l);
}

Test(connect, a_refused_connect_fails_with_its_reason)
{
    struct loop *l = loop_new();
    struct connect_side cs = { .loop = l };
    uint16_t port = fx_closed_port();
    struct origin *o = origin_on(port, NULL);
    struct user u = { .read_max = 1 };
    cr_assert_eq(connector_start(&u.k, &cs, o, TLS_ALPN_H1, 5000, &ops, &u), 0);
    TURN_UNTIL(l, u.ups || u.fails);
    cr_expect_eq(u.fails, 1);
    cr_expect_eq(u.ups, 0);
    cr_expect_str_eq(u.why, "Connection refused");
    cr_expect_eq(u.k.fd, -1, "closed before 'failed'");
    cr_expect_eq(loop_timer_count(l), 0);
    origin_free(o);
    loop_free(l);
}

/* 0 is no limit of its own (routes[].connect_timeout_ms); a limit is one timer until up. */
Test(connect, the_connect_timeout_is_a_timer_unless_0)
{
    struct loop *l = loop_new();
    struct connect_side cs = { .loop = l };
    uint16_t port;
    int lfd = fx_listen(&port);
    struct origin *o = origin_on(port, NULL);
    struct user u = { .read_max = 1 }, v = { .read_max = 1 };
    cr_assert_eq(connector_start(&u.k, &cs, o, TLS_ALPN_H1, 0, &ops, &u), 0);
    cr_expect_eq(loop_timer_count(l), 0);
    cr_assert_eq(connector_start(&v.k, &cs, o, TLS_ALPN_H1, 5000, &ops, &v), 0);
    cr_expect_eq(loop_timer_count(l), 1);
    TURN_UNTIL(l, u.ups && v.ups);
    cr_expect_eq(loop_timer_count(l), 0);
    connector_close(&u.k);
    connector_close(&v.k);
    close(lfd);
    origin_free(o);
    loop_free(l);
}

/* ---- TLS ---- */

static char dir[64];

static const char *cert_path(const char *ext)
{
    static char p[2][96];
    static int k;
    k ^= 1;
    snprintf(p[k], sizeof(p[k]), "%s/up.%s", dir, ext);
    return p[k];
}

static void make_cert(void)
{
    snprintf(dir, sizeof(dir), "/tmp/retryproxy-connect-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    fx_make_cert(dir, "up", "IP:127.0.0.1");
}

static void remove_cert(void)
{
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    fx_sh(cmd);
}

/* A TLS server of one connection on a thread: it sends 'send' bytes in one record, then holds
 * the connection until the client closes it. */
struct server {
    int lfd;
    size_t send;
};

static void *serve(void *arg)
{
    struct server *s = arg;
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    SSL_CTX_use_certificate_file(ctx, cert_path("pem"), SSL_FILETYPE_PEM);
    SSL_CTX_use_PrivateKey_file(ctx, cert_path("key"), SSL_FILETYPE_PEM);
    int fd = accept(s->lfd, NULL, NULL);
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (SSL_accept(ssl) == 1 && s->send) {
        static char data[16000];
        for (size_t i = 0; i < sizeof(data); i++)
            data[i] = (char)('a' + i % 26);
        SSL_write(ssl, data, (int)s->send);
        char b[64];
        while (SSL_read(ssl, b, sizeof(b)) > 0) {
        }
    }
    SSL_free(ssl);
    close(fd);
    SSL_CTX_free(ctx);
    return NULL;
}

/* The server's one record is read 100 bytes an event: the rest waits decrypted in OpenSSL,
 * which the socket never signals; the connector hands it over in the next turns. */
Test(connect, tls_bytes_held_by_openssl_come_without_a_socket_event, .fini = remove_cert)
{
    make_cert();
    struct loop *l = loop_new();
    struct connect_side cs = { .loop = l }; /* its TLS contexts made on first use */
    struct server s = { .send = 16000 };
    uint16_t port;
    s.lfd = fx_listen(&port);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, serve, &s), 0);
    struct origin *o = origin_on(port, &(struct origin_tls){ .ca_file = cert_path("pem") });
    struct user u = { .read_max = 100 };
    cr_assert_eq(connector_start(&u.k, &cs, o, TLS_ALPN_H1, 10000, &ops, &u), 0);
    TURN_UNTIL(l, u.ups || u.fails);
    cr_assert_eq(u.ups, 1, "failed: %s", u.why);
    cr_assert_not_null(u.k.tls);
    TURN_UNTIL(l, u.got_len == 16000 || u.eof);
    cr_expect_eq(u.got_len, 16000, "%zu bytes of 16000 came", u.got_len);
    cr_expect(u.got_len && u.got[u.got_len - 1] == (char)('a' + (u.got_len - 1) % 26));
    connector_close(&u.k);
    pthread_join(th, NULL);
    close(s.lfd);
    origin_free(o);
    tls_ctxs_free(cs.tls);
    loop_free(l);
}

/* A certificate no store trusts: 'failed' with OpenSSL's reason, and one warn line naming the
 * origin (a second failure within the second is not logged again). */
Test(connect, a_tls_failure_is_logged_once_with_the_origin_and_the_reason, .fini = remove_cert)
{
    make_cert();
    int p[2];
    cr_assert_eq(pipe(p), 0);
    log_set_fd(p[1]);
    struct loop *l = loop_new();
    struct connect_side cs = { .loop = l }; /* its TLS contexts made on first use */
    struct server s = { .send = 0 };
    uint16_t port;
    s.lfd = fx_listen(&port);
    struct origin *o = origin_on(port, &(struct origin_tls){ .ca_file = NULL });
    for (int i = 0; i < 2; i++) {
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, serve, &s), 0);
        struct user u = { .read_max = 1 };
        cr_assert_eq(connector_start(&u.k, &cs, o, TLS_ALPN_H2, 10000, &ops, &u), 0);
        TURN_UNTIL(l, u.ups || u.fails);
        cr_expect_eq(u.fails, 1);
        cr_expect(strstr(u.why, "certificate verify failed"), "why: %s", u.why);
        pthread_join(th, NULL);
    }
    log_set_fd(1);
    close(p[1]);
    char buf[4096];
    ssize_t n = read(p[0], buf, sizeof(buf) - 1);
    cr_assert_gt(n, 0);
    buf[n] = '\0';
    char want[64];
    snprintf(want, sizeof(want), "\"upstream\":\"127.0.0.1:%u\"", port);
    cr_expect(strstr(buf, "\"msg\":\"upstream TLS failed; its requests were not sent\""), "%s",
              buf);
    cr_expect(strstr(buf, want), "%s", buf);
    cr_expect(strstr(buf, "\"host\":\"127.0.0.1\""), "%s", buf);
    cr_expect(strstr(buf, "certificate verify failed"), "%s", buf);
    cr_expect_eq(strchr(buf, '\n'), strrchr(buf, '\n'), "more than one line:\n%s", buf);
    close(p[0]);
    close(s.lfd);
    origin_free(o);
    tls_ctxs_free(cs.tls);
    loop_free(l);
}
