/* courier -- delivers what durable routes stored (docs/delivery.md "The courier").
 *
 * A client side of the request core, as proxy/http1/ and proxy/http2/ are: it implements
 * proxy/core/front.h for a stored request, and drives the store (proxy/store/store.h). One
 * courier runs in worker 0's loop: it claims due deliveries within each route's bounds, makes
 * ONE attempt of each through the core (endpoints, ejection, timeouts as for any attempt), and
 * writes its end: delivered, rescheduled by the route's backoff policy, or dead.
 *
 * Its life, all from serve.c: courier_new() before the worker's thread starts (it arms its
 * timer in that worker's loop), courier_stop() once the worker's thread has ended (its attempts
 * still running end there, their leases given back, due now), courier_free()
 * after the store was closed and the worker's completion queue drained.
 */
#ifndef RETRYPROXY_PROXY_COURIER_H
#define RETRYPROXY_PROXY_COURIER_H

struct courier;
struct worker;

/* A courier in the loop of 'w' (whose px->store is open), or NULL with a message on stderr. */
struct courier *courier_new(struct worker *w);
/* An accept committed (any thread): look for due deliveries now. */
void courier_kick(void *arg);
void courier_stop(struct courier *c);
void courier_free(struct courier *c); /* accepts NULL */

#endif
