/* Bounds a crowd of HTTP/2 clients meets (docs/hardening.md): the memory of a burst of
 * connections goes back when they close.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/fixture.h"

TestSuite(bounds, .fini = fx_stop, .timeout = 120);

static bool rss_back(void *arg)
{
    return px_rss_kb(px) <= *(long *)arg;
}

/* The client preface and an empty SETTINGS frame. */
static const char PREFACE[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0";

/* 3,000 idle HTTP/2 connections on one worker (about 13 KiB each), then closed: their memory
 * is given back within a few seconds. glibc's heap only: a sanitizer build keeps freed memory
 * in its own allocator. */
Test(bounds, memory_of_a_burst_of_http2_connections_goes_back)
{
    enum { N = 3000 };
    fx_start_r("", "", "--workers", "1", NULL);
    char url[128];
    struct http_resp r;
    http_do("GET", px_url(px, "/x", url, sizeof(url)), NULL, NULL, 0, 5000, &r);
    http_free(&r);
    sleep_ms(300);
    long idle = px_rss_kb(px);
    static int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = raw_dial(px->port);
        cr_assert(raw_send_all(fds[i], PREFACE, sizeof(PREFACE) - 1));
    }
    /* every connection has its session when the proxy's SETTINGS came on the last one */
    char buf[256];
    cr_assert_gt(raw_recv(fds[N - 1], buf, sizeof(buf), 10000), 0);
    sleep_ms(300);
    long held = px_rss_kb(px);
    cr_assert_gt(held, idle + 16 * 1024,
                 "RSS %ld KiB with %d connections, %ld idle: the test measures nothing", held, N,
                 idle);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    /* what stays is the heap's fragments (the build before kept all of it) */
    long bound = idle + (held - idle) / 4;
    if (!fx_under_sanitizer())
        cr_expect(fx_wait(rss_back, &bound, 4000, 50),
                  "RSS %ld KiB 4 s after %d HTTP/2 connections closed (%ld idle, %ld with them)",
                  px_rss_kb(px), N, idle, held);
}
