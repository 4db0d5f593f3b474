/* rawup -- a scripted upstream for answers no real server gives: on 127.0.0.1, on a port the
 * kernel picks, each connection's request head is read, 'resp' sent as it is, the write side
 * shut, what else comes read for 'linger_ms' (kept in 'got' after the head), and the connection
 * closed. 'resp' and 'resp_len' may be changed between connections.
 *
 *   struct rawup *s = rawup_start("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 20);
 *   ... "http://127.0.0.1:%u", s->port ... s->served ... s->got ...
 *   rawup_stop(s);
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_RAWUP_H
#define RETRYPROXY_TESTS_SUPPORT_RAWUP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct rawup {
    int lfd;
    uint16_t port;
    pthread_t th;
    const char *resp;
    size_t resp_len;
    int linger_ms;
    volatile int stop;
    _Atomic int served; /* responses sent (counted before they go, so a client that has the
                         * proxy's answer never sees an attempt uncounted) */
    char got[8192];     /* the last connection's bytes: its head, then what came after */
};

/* Starts it ('resp' NUL-terminated, or set resp_len after). */
struct rawup *rawup_start(const char *resp, int linger_ms);
void rawup_stop(struct rawup *s);

#endif
