/* evup -- an HTTP/1.1 upstream that sends its response in parts over time, as a Server-Sent
 * Events feed, a streamed answer or a progress report does: on 127.0.0.1, on a port the kernel
 * picks, each connection's request head is read, 'head' sent as it is (status line and fields
 * with the blank line; it must say Transfer-Encoding: chunked), then 'parts' chunks, one every
 * 'every_ms' (the first at once), part I being "data: I\n\n", then the last chunk, and the
 * connection is closed. When each part went (CLOCK_MONOTONIC, as evup_now_us) is recorded, and
 * when the peer closed the connection, noticed between parts at once. One connection at a
 * time; 'head' and the counts may be changed between connections.
 *
 *   struct evup *e = evup_start("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
 *                               "Transfer-Encoding: chunked\r\n\r\n", 5, 300);
 *   ... "http://127.0.0.1:%u", e->port ... e->sent_us[0] ... e->closed_us ...
 *   evup_stop(e);
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_EVUP_H
#define RETRYPROXY_TESTS_SUPPORT_EVUP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define EVUP_PARTS 64 /* the most parts a response has */

struct evup {
    int lfd;
    uint16_t port;
    pthread_t th;
    const char *head;
    int parts, every_ms;
    volatile int stop;
    /* of the last connection: parts sent, when each went, and when its peer closed it (0:
     * not before the response ended) */
    _Atomic int sent;
    _Atomic int64_t sent_us[EVUP_PARTS];
    _Atomic int64_t closed_us;
    _Atomic int served; /* requests whose head was read */
};

/* Starts it ('parts' at most EVUP_PARTS). */
struct evup *evup_start(const char *head, int parts, int every_ms);
void evup_stop(struct evup *e);
/* The clock the send times are read from, in microseconds. */
int64_t evup_now_us(void);

#endif
