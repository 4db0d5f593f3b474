/* HTTP/1.1 upgrades, end to end (docs/upgrades.md): a real WebSocket client and server
 * (tests/tools/ws_peer.py, python3-websockets) through the real binary, raw bytes for what a
 * client or an upstream may try, and a scripted upstream for answers no real server gives. */
#include <criterion/criterion.h>

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/rawup.h"
#include "tests/support/tlsfix.h"
#include "tests/support/tlsup.h"
#include "tests/support/wsu.h"

static void stop(void)
{
    wsu_stop_all();
    tlsfix_stop(); /* the proxy too, and the certificates' directory */
}

TestSuite(upgrades, .fini = stop, .timeout = 120);

/* A WebSocket handshake for 'path', as a browser sends it (RFC 6455 1.3's key). */
#define HANDSHAKE(path, extra)                                                                     \
    "GET " path " HTTP/1.1\r\nHost: ws.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"      \
    "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" extra "\r\n"

/* "ws://127.0.0.1:PORT" + path, the proxy's. */
static const char *ws_url(const char *path)
{
    static char url[256];
    snprintf(url, sizeof(url), "ws://127.0.0.1:%u%s", px->port, path);
    return url;
}

/* The proxy with one route "ws" to 'upstreams' (JSON array members), 'extra' more route
 * members ("max_attempts" alone: one attempt), 'top' more top-level members (either ""). One
 * worker: round-robin starts at the first upstream. */
static void start(const char *upstreams, const char *extra, const char *top)
{
    struct cfgb *b = cfgb_new();
    if (*top)
        cfgb_top(b, "%s", top);
    cfgb_route(b, "ws", "\"upstreams\": [%s], \"retry\": {" CFG_FAST "%s}%s%s", upstreams,
               strstr(extra, "max_attempts") ? ", \"max_attempts\": 1" : "",
               *extra && !strstr(extra, "max_attempts") ? ", " : "",
               strstr(extra, "max_attempts") ? "" : extra);
    fx_start_b(b, "--workers", "1", NULL);
}

static void start_ws(struct wsu *u, const char *extra, const char *top)
{
    char ups[96];
    snprintf(ups, sizeof(ups), "\"%s\"", wsu_url(u));
    start(ups, extra, top);
}

/* Reads until the end of a response head (or the peer's end, or 'timeout_ms'): what came. */
static size_t read_head(int fd, char *buf, size_t cap, int timeout_ms)
{
    size_t n = 0;
    while (n + 1 < cap && !memmem(buf, n, "\r\n\r\n", 4)) {
        ssize_t k = raw_recv(fd, buf + n, cap - 1 - n, timeout_ms);
        if (k <= 0)
            break;
        n += (size_t)k;
        buf[n] = '\0';
    }
    buf[n] = '\0';
    return n;
}

/* Reads until the peer's end or 'timeout_ms': what came. */
static size_t read_all(int fd, char *buf, size_t cap, int timeout_ms)
{
    size_t n = 0;
    for (;;) {
        ssize_t k = raw_recv(fd, buf + n, cap - 1 - n, timeout_ms);
        if (k <= 0)
            break;
        n += (size_t)k;
        if (n + 1 >= cap)
            break;
    }
    buf[n] = '\0';
    return n;
}

/* Sends 'req' ('len' bytes) on a new connection to the proxy and reads the whole answer, up to
 * the connection's end, into buf[cap]. */
static void ask(const char *req, size_t len, char *buf, size_t cap)
{
    int fd = raw_dial(px->port);
    cr_assert(raw_send_all(fd, req, len));
    read_all(fd, buf, cap, 5000);
    close(fd);
}

/* The same, reading only the answer's head: the connection, left open. */
static int ask_head(const char *req, size_t len, char *buf, size_t cap)
{
    int fd = raw_dial(px->port);
    cr_assert(raw_send_all(fd, req, len));
    read_head(fd, buf, cap, 5000);
    return fd;
}

static void expect_ok(json_t *res, const char *what)
{
    char *text = json_dumps(res, 0);
    cr_expect(json_is_true(json_object_get(res, "ok")), "%s: %s", what, text);
    free(text);
    json_decref(res);
}

/* ---- a real WebSocket client and server ---- */

Test(upgrades, text_binary_and_a_mebibyte_echo_through_the_tunnel)
{
    struct wsu *u = wsu_start(0);
    start_ws(u, "", "");
    expect_ok(wsu_client(ws_url("/chat"), "text"), "text");
    expect_ok(wsu_client(ws_url("/chat"), "binary"), "binary");
    expect_ok(wsu_client(ws_url("/chat"), "big"), "1 MiB");
    cr_expect_eq(wsu_count(u, "handshake", "/chat"), 3);
}

/* What operators see of a tunnel (docs/upgrades.md "Seen by operators"): the upgrade counted as
 * tunnelled, the tunnel open while it is, the bytes each way, and a log line when it closes
 * saying how long it lasted, what it carried and who ended it. */
Test(upgrades, a_tunnel_is_seen_in_metrics_and_its_closing_log_line)
{
    struct wsu *u = wsu_start(0);
    start_ws(u, "", "");
    expect_ok(wsu_client(ws_url("/chat"), "big"), "1 MiB");
    cr_expect_eq(fx_wait_metric("retryproxy_tunnels_open", 0, 5000), 0);
    cr_expect_eq(fx_metric("retryproxy_upgrades_total{route=\"ws\",outcome=\"tunnelled\"}"), 1);
    cr_expect_eq(fx_metric("retryproxy_upgrades_total{route=\"ws\",outcome=\"refused\"}"), 0);
    double from_client =
        fx_metric("retryproxy_tunnel_bytes_total{route=\"ws\",direction=\"from_client\"}");
    double from_upstream =
        fx_metric("retryproxy_tunnel_bytes_total{route=\"ws\",direction=\"from_upstream\"}");
    /* the mebibyte each way, in WebSocket frames (a client's are masked: 4 bytes more) */
    cr_expect(from_client >= 1048576 && from_client < 1048576 + 4096, "from the client: %.0f",
              from_client);
    cr_expect(from_upstream >= 1048576 && from_upstream < 1048576 + 4096, "from the upstream: %.0f",
              from_upstream);
    json_t *l = fx_logged("tunnel closed", "route", "ws");
    cr_assert_not_null(l, "no tunnel closed line");
    /* the client's close frame is answered, and the server ends the TCP connection first
     * (RFC 6455 7.1.1): the connection's end is what the line says */
    cr_expect_str_eq(json_str(l, "closed_by"), "upstream");
    cr_expect_eq(json_number_value(json_object_get(l, "bytes_from_client")), from_client);
    cr_expect_eq(json_number_value(json_object_get(l, "bytes_from_upstream")), from_upstream);
    cr_expect(json_is_integer(json_object_get(l, "duration_ms")), "no duration_ms");
    cr_expect(json_str(l, "request_id") && *json_str(l, "request_id"), "no request_id");
    json_decref(l);
}

/* An https upstream: TLS offering http/1.1 alone by ALPN, the certificate checked against the
 * route's tls.ca_file. */
Test(upgrades, an_https_upstream_is_tunnelled_over_tls)
{
    char extra[600];
    struct tls_pair cert = tlsfix_cert("up", "IP:127.0.0.1");
    struct wsu *u = wsu_start_tls(cert.pem, cert.key);
    snprintf(extra, sizeof(extra), "\"tls\": {%s}", tlsfix_trust(cert.pem));
    start_ws(u, extra, "");
    expect_ok(wsu_client(ws_url("/tls"), "text"), "text over TLS");
    expect_ok(wsu_client(ws_url("/tls"), "big"), "1 MiB over TLS");
    cr_expect_eq(wsu_count(u, "handshake", "/tls"), 2);
}

/* An https upstream that requires a client certificate and whose certificate names another
 * host than the URL's: the route's tls.cert_file and tls.server_name serve the tunnel's own TLS
 * connection as they serve libcurl's and h2's; without the certificate nothing is tunnelled. */
Test(upgrades, an_https_upstream_gets_the_client_certificate_and_server_name)
{
    char extra[1200];
    struct tls_pair srv = tlsfix_cert("srv", "DNS:ws.test");
    struct tls_pair cli = tlsfix_cert("cli", "DNS:client.test");
    struct wsu *u = wsu_start_mtls(srv.pem, srv.key, cli.pem);
    snprintf(extra, sizeof(extra), "\"tls\": {%s, \"server_name\": \"ws.test\", %s}",
             tlsfix_trust(srv.pem), tlsfix_present(cli.pem, cli.key));
    start_ws(u, extra, "");
    expect_ok(wsu_client(ws_url("/mtls"), "text"), "text over mutual TLS");
    cr_expect_eq(wsu_count(u, "handshake", "/mtls"), 1);
    fx_stop();
    snprintf(extra, sizeof(extra), "\"tls\": {%s, \"server_name\": \"ws.test\"}",
             tlsfix_trust(srv.pem));
    start_ws(u, extra, "");
    json_t *res = wsu_client(ws_url("/none"), "text");
    cr_expect(!json_is_true(json_object_get(res, "ok")), "tunnelled without a certificate");
    json_decref(res);
    cr_expect_eq(wsu_count(u, "handshake", "/none"), 0);
}

/* A tunnel's TLS handshake that fails (a certificate no store trusts) is a connect failure,
 * logged as the HTTP/2 side logs one (proxy/upstream/connect.c): the upstream, the name verified
 * and OpenSSL's reason. */
Test(upgrades, a_failed_tls_handshake_is_logged_naming_the_upstream_and_the_reason)
{
    char authority[32], buf[4096];
    struct tls_pair cert = tlsfix_cert("up", "IP:127.0.0.1");
    struct wsu *u = wsu_start_tls(cert.pem, cert.key);
    start_ws(u, "\"max_attempts\": 1", ""); /* no ca_file: the system's store */
    ask(HANDSHAKE("/bad", ""), strlen(HANDSHAKE("/bad", "")), buf, sizeof(buf));
    cr_expect(!strncmp(buf, "HTTP/1.1 502", 12), "got:\n%s", buf);
    snprintf(authority, sizeof(authority), "127.0.0.1:%u", wsu_port(u));
    json_t *line =
        fx_logged("upstream TLS failed; its requests were not sent", "upstream", authority);
    cr_expect_not_null(line, "no TLS failure logged for %s", authority);
    cr_expect_str_eq(json_str(line, "level"), "warn");
    cr_expect_str_eq(json_str(line, "host"), "127.0.0.1");
    const char *error = json_str(line, "error");
    cr_expect(error && strstr(error, "certificate verify failed"), "error: %s", error);
    json_decref(line);
    cr_expect_eq(wsu_count(u, "handshake", "/bad"), 0);
}

/* The route's timeout_ms bounds the handshake, limits.connection_timeout_ms an idle HTTP
 * connection: neither ends a tunnel (limits.tunnel_idle_timeout_ms does). */
Test(upgrades, a_tunnel_outlives_timeout_ms_and_connection_timeout_ms)
{
    struct wsu *u = wsu_start(0);
    start_ws(u, "\"timeout_ms\": 500", "\"limits\": {\"connection_timeout_ms\": 1000}");
    expect_ok(wsu_client(ws_url("/slow"), "slow"), "2.5 s of silence");
}

Test(upgrades, ping_is_answered_by_a_pong)
{
    struct wsu *u = wsu_start(0);
    start_ws(u, "", "");
    expect_ok(wsu_client(ws_url("/p"), "ping"), "ping");
}

static bool closed_seen(void *arg)
{
    return wsu_count(arg, "closed", NULL) >= 1;
}

Test(upgrades, close_handshake_from_either_side)
{
    struct wsu *u = wsu_start(0);
    start_ws(u, "", "");
    expect_ok(wsu_client(ws_url("/c"), "close-client"), "client closes");
    expect_ok(wsu_client(ws_url("/s"), "close-server"), "server closes");
    cr_expect(fx_wait(closed_seen, u, 5000, 20));
}

Test(upgrades, a_vanished_client_closes_the_upstream_side_within_a_second)
{
    struct wsu *u = wsu_start(0);
    start_ws(u, "", "");
    json_t *res = wsu_client(ws_url("/v"), "vanish");
    int64_t gone = json_integer_value(json_object_get(res, "at_ms"));
    json_decref(res);
    cr_assert(fx_wait(closed_seen, u, 3000, 10), "the upstream never saw the tunnel close");
    json_t *all = wsu_records(u), *r;
    size_t i;
    int64_t closed = 0;
    json_array_foreach(all, i,
                       r) if (json_str(r, "event") && !strcmp(json_str(r, "event"), "closed"))
        closed = json_integer_value(json_object_get(r, "at_ms"));
    json_decref(all);
    cr_expect(closed - gone < 1000, "the upstream side closed %lld ms after the client left",
              (long long)(closed - gone));
}

Test(upgrades, an_upstream_refusing_the_upgrade_is_answered_as_it_came)
{
    struct wsu *u = wsu_start(403);
    start_ws(u, "", "");
    char buf[4096];
    ask(HANDSHAKE("/no", ""), strlen(HANDSHAKE("/no", "")), buf, sizeof(buf));
    cr_expect(!strncmp(buf, "HTTP/1.1 403", 12), "got:\n%s", buf);
    cr_expect(strstr(buf, "\r\n\r\nrefused\n"), "not the upstream's body:\n%s", buf);
    cr_expect(strcasestr(buf, "X-Retry-Attempts: 1\r\n"), "got:\n%s", buf);
    cr_expect_eq(wsu_count(u, "handshake", "/no"), 1, "a 403 is not retried");
    json_t *res = wsu_client(ws_url("/no"), "status");
    cr_expect_eq(json_integer_value(json_object_get(res, "status")), 403);
    json_decref(res);
}

Test(upgrades, a_503_handshake_is_retried_on_another_upstream)
{
    struct wsu *bad = wsu_start(503), *good = wsu_start(0);
    char ups[192];
    snprintf(ups, sizeof(ups), "\"%s\", ", wsu_url(bad));
    snprintf(ups + strlen(ups), sizeof(ups) - strlen(ups), "\"%s\"", wsu_url(good));
    /* retry_on names the status alone: a retry here is the 503's, not a reset's */
    start(ups, "", "\"defaults\": {\"retry\": {\"retry_on\": [\"503\"]}}");
    char buf[4096];
    int fd = ask_head(HANDSHAKE("/r", ""), strlen(HANDSHAKE("/r", "")), buf, sizeof(buf));
    close(fd);
    cr_expect(!strncmp(buf, "HTTP/1.1 101", 12), "got:\n%s", buf);
    cr_expect(strcasestr(buf, "X-Retry-Attempts: 2\r\n"), "got:\n%s", buf);
    cr_expect(strcasestr(buf, "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
              "the upstream's accept key did not come through:\n%s", buf);
    cr_expect_eq(wsu_count(bad, "handshake", "/r"), 1);
    cr_expect_eq(wsu_count(good, "handshake", "/r"), 1);
    /* and the tunnel after a retry carries messages */
    expect_ok(wsu_client(ws_url("/r2"), "text"), "text after a retry");
}

Test(upgrades, the_handshake_reaches_the_upstream_with_upgrade_and_connection_put_back)
{
    struct wsu *u = wsu_start(0);
    start_ws(u, "", "");
    expect_ok(wsu_client(ws_url("/h?q=1"), "text"), "text");
    json_t *all = wsu_records(u), *r = json_array_get(all, 0);
    json_t *h = json_object_get(r, "headers");
    cr_assert_not_null(h);
    cr_expect_str_eq(json_str(r, "path"), "/h?q=1");
    cr_expect_str_eq(json_str(h, "Upgrade"), "websocket");
    cr_expect_str_eq(json_str(h, "Connection"), "upgrade");
    cr_expect_not_null(json_str(h, "Sec-WebSocket-Key"));
    cr_expect_not_null(json_str(h, "X-Request-Id"));
    cr_expect_not_null(json_str(h, "X-Forwarded-For"));
    json_decref(all);
}

/* A client that reads nothing while the upstream echoes 3 MiB back: the proxy stops reading
 * the upstream once its buffer for the client is full (the bytes wait in the kernel's socket
 * buffers, not in the proxy), and every byte arrives once the client reads. */
Test(upgrades, a_client_that_does_not_read_pauses_the_upstream)
{
    struct wsu *u = wsu_start(0);
    start_ws(u, "", "");
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(px->port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert(raw_send_all(fd, HANDSHAKE("/bp", ""), strlen(HANDSHAKE("/bp", ""))));
    char head[4096];
    read_head(fd, head, sizeof(head), 5000);
    cr_assert(!strncmp(head, "HTTP/1.1 101", 12), "got:\n%s", head);
    enum { N = 3 * 1024 * 1024 };
    /* one masked binary frame (mask 0: the payload as it is), N bytes of a pattern */
    unsigned char *frame = malloc(14 + N);
    frame[0] = 0x82;
    frame[1] = 0x80 | 127;
    for (int i = 0; i < 8; i++)
        frame[2 + i] = (unsigned char)((uint64_t)N >> (56 - 8 * i));
    memset(frame + 10, 0, 4);
    for (size_t i = 0; i < N; i++)
        frame[14 + i] = (unsigned char)(i * 7 + i / 251);
    long rss0 = px_rss_kb(px);
    cr_assert(raw_send_all(fd, frame, 14 + N));
    sleep_ms(1000); /* the echo comes back and finds no reader */
    long grew = px_rss_kb(px) - rss0;
    /* then every byte arrives, unchanged: a 10-byte frame head, then the payload */
    unsigned char *got = malloc(10 + N);
    size_t n = 0;
    while (n < 10 + (size_t)N) {
        ssize_t k = raw_recv(fd, (char *)got + n, 10 + N - n, 5000);
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    close(fd);
    cr_expect_eq(n, 10 + (size_t)N, "only %zu bytes came back", n);
    cr_expect(n == 10 + (size_t)N && got[0] == 0x82 && memcmp(got + 10, frame + 14, N) == 0,
              "the echo is not the message");
    cr_expect(grew < 1024, "the proxy grew by %ld KiB holding what the client did not read", grew);
    free(frame);
    free(got);
}

/* ---- what the route allows ---- */

Test(upgrades, a_token_the_route_does_not_tunnel_gets_our_501_naming_it)
{
    fx_upstreams(1);
    char ups[96];
    snprintf(ups, sizeof(ups), "\"%s\"", fx_up_url(0));
    start(ups, "\"upgrades\": []", "");
    char buf[4096];
    ask(HANDSHAKE("/x", ""), strlen(HANDSHAKE("/x", "")), buf, sizeof(buf));
    cr_expect(!strncmp(buf, "HTTP/1.1 501", 12), "got:\n%s", buf);
    cr_expect(strstr(buf, "\"error\": \"upgrade_not_allowed\""), "got:\n%s", buf);
    cr_expect(strstr(buf, "'websocket'"), "the token is not named:\n%s", buf);
    cr_expect_eq(tup_count(up), 0, "an upgrade not allowed went upstream as a plain request");
}

Test(upgrades, h2c_is_ignored_and_the_request_served_as_http1)
{
    fx_upstreams(1);
    char ups[96];
    snprintf(ups, sizeof(ups), "\"%s\"", fx_up_url(0));
    start(ups, "", "");
    static const char req[] =
        "GET /h2c HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n";
    char buf[4096];
    int fd = ask_head(req, strlen(req), buf, sizeof(buf));
    close(fd);
    cr_expect(!strncmp(buf, "HTTP/1.1 200", 12), "got:\n%s", buf);
    cr_assert_eq(tup_count(up), 1);
    const struct tup_req *r = tup_get(up, 0);
    cr_expect_null(tup_req_header(r, "Upgrade"));
    cr_expect_null(tup_req_header(r, "HTTP2-Settings"));
}

Test(upgrades, past_max_tunnels_an_upgrade_gets_503)
{
    struct wsu *u = wsu_start(0);
    start_ws(u, "", "\"limits\": {\"max_tunnels\": 1}");
    char buf[4096];
    int fd = ask_head(HANDSHAKE("/1", ""), strlen(HANDSHAKE("/1", "")), buf, sizeof(buf));
    cr_assert(!strncmp(buf, "HTTP/1.1 101", 12), "got:\n%s", buf);
    int fd2 = raw_dial(px->port);
    cr_assert(raw_send_all(fd2, HANDSHAKE("/2", ""), strlen(HANDSHAKE("/2", ""))));
    read_all(fd2, buf, sizeof(buf), 5000);
    close(fd2);
    cr_expect(!strncmp(buf, "HTTP/1.1 503", 12), "got:\n%s", buf);
    cr_expect(strstr(buf, "\"error\": \"too_many_tunnels\""), "got:\n%s", buf);
    cr_expect_eq(wsu_count(u, "handshake", "/2"), 0);
    close(fd); /* the first tunnel ends: room for another */
    cr_expect(fx_wait(closed_seen, u, 3000, 10));
    sleep_ms(100);
    expect_ok(wsu_client(ws_url("/3"), "text"), "after the first closed");
}

Test(upgrades, an_idle_tunnel_is_closed_after_tunnel_idle_timeout_ms)
{
    struct wsu *u = wsu_start(0);
    start_ws(u, "", "\"limits\": {\"tunnel_idle_timeout_ms\": 300}");
    char buf[4096];
    int fd = ask_head(HANDSHAKE("/idle", ""), strlen(HANDSHAKE("/idle", "")), buf, sizeof(buf));
    cr_assert(!strncmp(buf, "HTTP/1.1 101", 12), "got:\n%s", buf);
    int64_t t0 = now_ms();
    ssize_t k = raw_recv(fd, buf, sizeof(buf), 5000);
    int64_t took = now_ms() - t0;
    close(fd);
    cr_expect_eq(k, 0, "the idle tunnel was not closed (%zd)", k);
    cr_expect(took >= 250 && took < 3000, "closed after %lld ms", (long long)took);
    cr_expect(fx_wait(closed_seen, u, 3000, 10), "the upstream side stayed open");
    json_t *l = fx_logged("tunnel closed", "closed_by", "idle");
    cr_expect_not_null(l, "no tunnel closed line saying idle");
    json_decref(l);
}

/* SIGTERM with a tunnel open: the tunnel is closed when drain_timeout_ms ends (both sides see
 * the end) and the process exits 0 (px_stop only reaps it then). */
Test(upgrades, open_tunnels_are_closed_when_the_drain_time_ends)
{
    struct wsu *u = wsu_start(0);
    start_ws(u, "", "\"drain_timeout_ms\": 1000");
    char buf[4096];
    int fd = ask_head(HANDSHAKE("/drain", ""), strlen(HANDSHAKE("/drain", "")), buf, sizeof(buf));
    cr_assert(!strncmp(buf, "HTTP/1.1 101", 12), "got:\n%s", buf);
    cr_assert_eq(kill(px->pid, SIGTERM), 0);
    int64_t t0 = now_ms();
    ssize_t k = raw_recv(fd, buf, sizeof(buf), 8000);
    int64_t took = now_ms() - t0;
    close(fd);
    cr_expect_eq(k, 0, "the tunnel did not end (%zd)", k);
    cr_expect(took >= 800 && took < 1800, "the tunnel ended %lld ms after SIGTERM",
              (long long)took);
    cr_expect(fx_wait(closed_seen, u, 3000, 10), "the upstream side stayed open");
    siginfo_t si;
    int64_t until = now_ms() + 5000;
    do {
        memset(&si, 0, sizeof(si));
        if (waitid(P_PID, (id_t)px->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
            si.si_pid == px->pid)
            break;
        sleep_ms(20);
    } while (now_ms() < until);
    cr_expect_eq(px_stop(px, 5000), 0, "not a clean exit");
    px = NULL;
}

/* ---- raw bytes: what may not be smuggled through an upgrade ---- */

Test(upgrades, an_upgrade_with_a_body_is_refused_and_sends_nothing)
{
    struct wsu *u = wsu_start(0);
    start_ws(u, "", "");
    static const char req[] =
        HANDSHAKE("/b", "Content-Length: 38\r\n") "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
    char buf[4096];
    ask(req, strlen(req), buf, sizeof(buf));
    cr_expect(!strncmp(buf, "HTTP/1.1 400", 12), "got:\n%s", buf);
    cr_expect(strstr(buf, "upgrade request with a body"), "got:\n%s", buf);
    sleep_ms(100);
    cr_expect_eq(wsu_count(u, "handshake", NULL), 0, "something went upstream");
}

Test(upgrades, bytes_after_a_refused_upgrade_are_not_read_as_a_request)
{
    struct wsu *u = wsu_start(403);
    start_ws(u, "", "");
    static const char req[] = HANDSHAKE("/first", "") "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
    char buf[8192];
    ask(req, strlen(req), buf, sizeof(buf));
    cr_expect(!strncmp(buf, "HTTP/1.1 403", 12), "got:\n%s", buf);
    cr_expect_null(strstr(buf + 12, "HTTP/1.1"), "a second answer came:\n%s", buf);
    sleep_ms(200);
    cr_expect_eq(wsu_count(u, "handshake", "/first"), 1);
    cr_expect_eq(wsu_count(u, "handshake", "/smuggled"), 0, "the bytes after it went upstream");
}

static void start_script(struct rawup *s, const char *extra)
{
    char ups[64];
    snprintf(ups, sizeof(ups), "\"http://127.0.0.1:%u\"", s->port);
    start(ups, extra, "");
}

static const char SWITCH[] = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                             "Connection: Upgrade\r\n\r\nRAW-TUNNEL-BYTES";
/* The same head alone. */
static const char SWITCH_ONLY[] = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                                  "Connection: Upgrade\r\n\r\n";

Test(upgrades, a_101_to_a_plain_request_never_becomes_a_tunnel)
{
    struct rawup *s = rawup_start(SWITCH, 1000);
    start_script(s, "max_attempts");
    static const char req[] = "GET /plain HTTP/1.1\r\nHost: x\r\n\r\n";
    char buf[8192];
    int fd = ask_head(req, strlen(req), buf, sizeof(buf));
    close(fd);
    rawup_stop(s);
    cr_expect(!strncmp(buf, "HTTP/1.1 5", 10), "got:\n%s", buf);
    /* not "101" alone: the answer's X-Request-Id may hold those digits */
    cr_expect_null(strstr(buf, " 101 "), "got:\n%s", buf);
    cr_expect_null(strstr(buf, "Switching"), "got:\n%s", buf);
    cr_expect_null(strstr(buf, "RAW-TUNNEL-BYTES"), "got:\n%s", buf);
}

Test(upgrades, a_101_to_another_protocol_is_a_malformed_answer)
{
    struct rawup *s = rawup_start("HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n"
                                  "Connection: Upgrade\r\n\r\nRAW-TUNNEL-BYTES",
                                  1000);
    start_script(s, "max_attempts");
    char buf[8192];
    ask(HANDSHAKE("/w", ""), strlen(HANDSHAKE("/w", "")), buf, sizeof(buf));
    rawup_stop(s);
    cr_expect(!strncmp(buf, "HTTP/1.1 502", 12), "got:\n%s", buf);
    cr_expect(strstr(buf, "upstream_invalid_response"), "got:\n%s", buf);
    cr_expect_null(strstr(buf, "RAW-TUNNEL-BYTES"), "got:\n%s", buf);
}

/* What each side sent past the handshake goes first: the upstream's bytes read with its 101
 * head to the client, the client's pipelined bytes (passed by the framing check) to the
 * upstream. */
Test(upgrades, bytes_past_the_handshake_go_first_both_ways)
{
    struct rawup *s = rawup_start(SWITCH, 1000);
    start_script(s, "");
    static const char req[] = HANDSHAKE("/w", "") "GET /early HTTP/1.1\r\nHost: x\r\n\r\n";
    int fd = raw_dial(px->port);
    cr_assert(raw_send_all(fd, req, strlen(req)));
    char buf[8192];
    size_t n = read_head(fd, buf, sizeof(buf), 5000);
    while (n < sizeof(buf) - 1 && !strstr(buf, "RAW-TUNNEL-BYTES")) {
        ssize_t k = raw_recv(fd, buf + n, sizeof(buf) - 1 - n, 3000);
        if (k <= 0)
            break;
        n += (size_t)k;
        buf[n] = '\0';
    }
    close(fd);
    sleep_ms(100);
    cr_expect(!strncmp(buf, "HTTP/1.1 101", 12), "got:\n%s", buf);
    cr_expect(strstr(buf, "\r\n\r\nRAW-TUNNEL-BYTES"), "got:\n%s", buf);
    cr_expect(strstr(s->got, "\r\n\r\nGET /early HTTP/1.1\r\n"), "the upstream got:\n%s", s->got);
    rawup_stop(s);
}

/* Bytes the framing check held or refused (no HTTP head) before the 101 never reach the
 * upstream: the tunnel is not opened. */
Test(upgrades, unchecked_bytes_before_the_101_end_the_tunnel)
{
    struct rawup *s = rawup_start(SWITCH, 1000);
    start_script(s, "");
    static const char req[] = HANDSHAKE("/w", "") "\x81\x85\x01\x02\x03\x04junk";
    char buf[8192];
    ask(req, sizeof(req) - 1, buf, sizeof(buf));
    sleep_ms(100);
    cr_expect_null(strstr(s->got, "junk"), "the upstream got:\n%s", s->got);
    cr_expect_null(strstr(s->got, "Host: -\r\n"), "the framing check's stand-in went up:\n%s",
                   s->got);
    cr_expect_null(strstr(s->got + 4, "GET /"), "the upstream got:\n%s", s->got);
    rawup_stop(s);
}

enum { HELD_RECORDS = 33, HELD_RECORD = 16000, HELD_TOTAL = HELD_RECORDS * HELD_RECORD };

/* One tunnel to a tlsup upstream: how many of its bytes after the 101 came, the first 'bad'
 * differing from what it sent (got if none), and in how long. */
static size_t held_tunnel(size_t *bad, int64_t *took)
{
    static char buf[HELD_TOTAL + 8192];
    int fd = ask_head(HANDSHAKE("/held", ""), strlen(HANDSHAKE("/held", "")), buf, sizeof(buf));
    cr_assert(!strncmp(buf, "HTTP/1.1 101", 12), "got:\n%.200s", buf);
    char *end = strstr(buf, "\r\n\r\n");
    cr_assert_not_null(end);
    size_t got = strlen(end + 4); /* what came with the head */
    memmove(buf, end + 4, got);
    int64_t t0 = now_ms();
    while (got < HELD_TOTAL) {
        ssize_t k = raw_recv(fd, buf + got, sizeof(buf) - got, 2000);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    *took = now_ms() - t0;
    close(fd);
    for (*bad = 0; *bad < got && buf[*bad] == tlsup_byte(*bad);)
        ++*bad;
    return got;
}

/* Bytes the upstream's TLS has decrypted and holds reach the client at once, though no socket
 * event will announce them: 33 records of 16,000 bytes after the 101, queued together and then
 * nothing, leave a record's tail in OpenSSL where a pump of the tunnel stops with its buffer
 * full and its rounds spent (8 x 64 KiB), which the connector's kick hands over in the next
 * turn. Where the last pump stops depends on how the bytes arrive: eight tunnels. */
Test(upgrades, bytes_held_by_the_upstreams_tls_reach_the_client_at_once)
{
    char ups[64], extra[600];
    struct tls_pair cert = tlsfix_cert("up", "IP:127.0.0.1");
    struct tlsup *s = tlsup_start(cert.pem, cert.key, SWITCH_ONLY, HELD_RECORDS, HELD_RECORD);
    snprintf(ups, sizeof(ups), "\"https://127.0.0.1:%u\"", s->port);
    snprintf(extra, sizeof(extra), "\"tls\": {%s}", tlsfix_trust(cert.pem));
    start(ups, extra, "");
    for (int i = 0; i < 8; i++) {
        size_t bad;
        int64_t took;
        size_t got = held_tunnel(&bad, &took);
        cr_expect_eq(got, HELD_TOTAL, "tunnel %d: %zu of %d bytes came (none more in 2 s)", i, got,
                     HELD_TOTAL);
        cr_expect_eq(bad, got, "tunnel %d: byte %zu differs", i, bad);
        cr_log_info("tunnel %d: %zu bytes in %lld ms", i, got, (long long)took);
    }
    tlsup_stop(s);
}

Test(upgrades, a_chunked_refusal_is_read_by_its_framing)
{
    struct rawup *s = rawup_start("HTTP/1.1 426 Upgrade Required\r\nTransfer-Encoding: chunked\r\n"
                                  "\r\n5\r\nhello\r\n7;x=y\r\n, world\r\n0\r\n\r\n",
                                  1000);
    start_script(s, "");
    char buf[8192];
    ask(HANDSHAKE("/w", ""), strlen(HANDSHAKE("/w", "")), buf, sizeof(buf));
    rawup_stop(s);
    cr_expect(!strncmp(buf, "HTTP/1.1 426", 12), "got:\n%s", buf);
    cr_expect(strstr(buf, "\r\n\r\nhello, world"), "got:\n%s", buf);
}

static bool closed_all(void *arg)
{
    return wsu_count(arg, "closed", NULL) >= 2001;
}

/* 2,000 idle tunnels at once (a WebSocket server with as many quiet clients): each costs the
 * proxy a bounded amount of memory, measured here as its RSS growth over the tunnels opened,
 * and all of it is given back when they close. */
Test(upgrades, two_thousand_idle_tunnels_have_a_bounded_cost_each)
{
    enum { N = 2000 };
    struct wsu *u = wsu_start(0);
    start_ws(u, "", "");
    /* one first, so that what every tunnel shares (buffers, pools) is in the baseline */
    char buf[4096];
    int first = ask_head(HANDSHAKE("/idle", ""), strlen(HANDSHAKE("/idle", "")), buf, sizeof(buf));
    cr_assert(!strncmp(buf, "HTTP/1.1 101", 12), "got:\n%s", buf);
    cr_assert_eq(fx_wait_metric("retryproxy_tunnels_open", 1, 5000), 1);
    long rss0 = px_rss_kb(px), fds0 = px_fds(px);
    static int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = ask_head(HANDSHAKE("/idle", ""), strlen(HANDSHAKE("/idle", "")), buf, sizeof(buf));
        cr_assert(!strncmp(buf, "HTTP/1.1 101", 12), "tunnel %d got:\n%s", i, buf);
    }
    cr_assert_eq(fx_wait_metric("retryproxy_tunnels_open", N + 1, 10000), N + 1);
    long rss1 = px_rss_kb(px), fds1 = px_fds(px);
    double per_kib = (double)(rss1 - rss0) / N;
    fprintf(stderr,
            "[upgrades] %d idle tunnels: proxy RSS %ld KiB -> %ld KiB, %.1f KiB each; "
            "descriptors %ld -> %ld\n",
            N, rss0, rss1, per_kib, fds0, fds1);
    /* the few beyond 2 a tunnel: the admin connections of the metric reads around the two
     * counts, which may not be closed yet (4,038 against 37 was seen once) */
    cr_expect_leq(fds1 - fds0, 2 * N + 4, "more than two descriptors a tunnel");
    if (!fx_under_sanitizer())
        cr_expect_lt(per_kib, 48.0, "%.1f KiB per idle tunnel", per_kib);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    close(first);
    cr_expect_eq(fx_wait_metric("retryproxy_tunnels_open", 0, 20000), 0, "tunnels left open");
    cr_expect(fx_wait(closed_all, u, 20000, 50), "the upstream side stayed open");
}

/* A 101 commits the request: an upstream that ends the tunnel at once (its connection closed
 * right after the 101) is never tried again, whatever retry_on says about resets, and the
 * client sees the tunnel end. */
Test(upgrades, nothing_is_retried_once_the_101_is_out)
{
    struct rawup *s = rawup_start(SWITCH, 0);
    start_script(s, "\"retry_on\": [\"reset\", \"connect-failure\", \"5xx\"], \"max_attempts\": 3");
    char buf[4096];
    int fd = ask_head(HANDSHAKE("/once", ""), strlen(HANDSHAKE("/once", "")), buf, sizeof(buf));
    cr_expect(!strncmp(buf, "HTTP/1.1 101", 12), "got:\n%s", buf);
    size_t n = read_all(fd, buf, sizeof(buf), 3000);
    close(fd);
    cr_expect(strstr(buf, "RAW-TUNNEL-BYTES") || n == 0, "got:\n%s", buf);
    sleep_ms(300);
    cr_expect_eq(atomic_load(&s->served), 1, "the upstream was asked %d times",
                 atomic_load(&s->served));
    cr_expect_eq(fx_metric("retryproxy_upgrades_total{route=\"ws\",outcome=\"tunnelled\"}"), 1);
    cr_expect_eq(fx_metric("retryproxy_attempts_total{route=\"ws\",outcome=\"reset\"}"), 0);
    rawup_stop(s);
}
