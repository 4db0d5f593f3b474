/* deliveries_admin -- the admin listener's /deliveries endpoints (docs/admin.md,
 * docs/delivery.md "Admin API") and the store's gauges at /metrics.
 *
 * The control loop never waits on the store: a request that needs it is suspended
 * (libmicrohttpd's suspend/resume), its call handed to the store thread, and the completion
 * queue's eventfd, watched by the control loop, brings the answer back; the connection is then
 * resumed and answered. A replay or drop by filter goes batch by batch (STORE_BULK_BATCH rows a
 * transaction), each batch's call issued when the one before completes.
 */
#ifndef RETRYPROXY_PROXY_OPS_DELIVERIES_ADMIN_H
#define RETRYPROXY_PROXY_OPS_DELIVERIES_ADMIN_H

#include <stdbool.h>

#include <microhttpd.h>

#include "proxy/base/loop.h"
#include "proxy/core/proxy.h"
#include "proxy/store/store.h"

struct dadmin;

/* For the admin on loop 'l'; 'store' NULL: every /deliveries answers 404 "no_store". kick(arg)
 * is called after completions resumed connections (the admin runs libmicrohttpd then). NULL
 * if out of memory. With a store, /metrics shows its gauges from now on. */
struct dadmin *dadmin_new(struct loop *l, struct store *store, struct proxy *px,
                          void (*kick)(void *arg), void *arg);
/* Waits for the calls still with the store (bounded), resumes their connections, frees.
 * Before the daemon stops; accepts NULL. */
void dadmin_free(struct dadmin *d);

/* Whether 'url' is /deliveries or under it. */
bool dadmin_owns(const char *url);

/* Answers a /deliveries request whose body is read: at once, or by suspending the connection
 * (*con_cls then becomes the request's own state, never the admin's). */
enum MHD_Result dadmin_answer(struct dadmin *d, struct MHD_Connection *c, const char *url,
                              const char *method, void **con_cls);
/* /metrics: true when the gauges are older than a second and the connection was suspended
 * to read them (return MHD_YES); false: render now. */
bool dadmin_metrics(struct dadmin *d, struct MHD_Connection *c, void **con_cls);
/* A suspended request back (con_cls is one of dadmin's): its answer. */
enum MHD_Result dadmin_resumed(struct MHD_Connection *c, void *con_cls);
/* libmicrohttpd's request-completed notice for a con_cls of dadmin's: frees it. */
void dadmin_conn_free(void *con_cls);

#endif
