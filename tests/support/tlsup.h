/* tlsup -- a scripted TLS upstream for the record layouts no real server makes on demand: on
 * 127.0.0.1, on a port the kernel picks, each connection (one at a time) is TLS with the
 * certificate and key given; its request head is read, 'resp' sent in one record, then
 * 'n_records' records of 'record' bytes each (byte i of them all is 'a' + i % 26) queued
 * together, and the connection held (what else comes read and dropped) until the peer closes or
 * the upstream stops.
 *
 *   struct tlsup *s = tlsup_start(pem, key, "HTTP/1.1 101 ...\r\n\r\n", 33, 16000);
 *   ... "https://127.0.0.1:%u", s->port ... s->served ...
 *   tlsup_stop(s);
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_TLSUP_H
#define RETRYPROXY_TESTS_SUPPORT_TLSUP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct tlsup {
    int lfd;
    uint16_t port;
    pthread_t th;
    void *ctx; /* its SSL_CTX */
    const char *resp;
    size_t n_records, record;
    volatile int stop;
    _Atomic int served; /* connections whose records were all written */
};

/* Starts it (asserts that the certificate and key load). */
struct tlsup *tlsup_start(const char *pem, const char *key, const char *resp, size_t n_records,
                          size_t record);
/* The byte at 'i' of what follows 'resp'. */
char tlsup_byte(size_t i);
void tlsup_stop(struct tlsup *s);

#endif
