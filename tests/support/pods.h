/* pods -- the pods of one service for the endpoint suites (docs/endpoints.md): test upstreams on
 * 127.0.0.2, .3 and up, all on one port (the kernel's choice for the first), and what GET
 * /upstreams says of each address. For tests/integration/test_endpoints*.c; Criterion asserts.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_PODS_H
#define RETRYPROXY_TESTS_SUPPORT_PODS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/support/tup.h"

#define PODS_MAX 32

/* "127.0.0.<i + 2>" (a static string per i < PODS_MAX). */
const char *pods_ip(size_t i);
/* Test upstreams on the first 'n' addresses (n >= 1), one port: pod[i] on pods_ip(i). Returns
 * the port; asserts that one was found free on every address (a few tries). */
uint16_t pods_start(struct tup **pod, size_t n);
/* Endpoint 'ip':'port' of the first upstream of the first route in GET /upstreams (new
 * reference), NULL when it is not listed. */
json_t *pods_endpoint(const char *ip, uint16_t port);
/* Its state there ("healthy", "ejected", "leaving"), "" when it is not listed; a static buffer
 * the next call reuses. */
const char *pods_state(const char *ip, uint16_t port);

#endif
