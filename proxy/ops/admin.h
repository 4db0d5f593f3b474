/* admin -- the admin listener (docs/admin.md), in the control thread's loop.
 *
 *   GET  /healthz   200 while the process runs
 *   GET  /readyz    200 when serving, 503 while draining
 *   GET  /metrics   Prometheus text format 0.0.4
 *   GET  /config    generation, loaded_at, source, last_error, restart_required, the effective
 *                   config with defaults filled in
 *   GET  /schedule?route=NAME&retries=N&seed=S   {"route": ..., "delays_ms": [...], "seed": S}
 *   POST /reload    200 {"generation": N} or 422 {"errors": [...]}
 *   /deliveries...  the delivery store (proxy/ops/deliveries_admin.h, docs/delivery.md)
 *
 * Other methods on these paths get 405 with Allow; other paths 404. Answers are JSON except
 * /metrics. Nothing here shows request header values or credentials.
 *
 * Who may ask: kubelet probes and Prometheus come from outside the pod, so in Kubernetes the
 * admin listener is on the pod's address, where every pod in the cluster can reach it. Clients
 * on a loopback address get every endpoint; any other client only /healthz, /readyz and
 * /metrics, and 403 {"error": "forbidden", ...} for anything else (known path or not, any
 * method), answered before a request body is read.
 */
#ifndef RETRYPROXY_PROXY_ADMIN_H
#define RETRYPROXY_PROXY_ADMIN_H

#include <stdbool.h>
#include <sys/socket.h>

#include "proxy/base/loop.h"
#include "proxy/core/proxy.h"
#include "proxy/ops/reload.h"
#include "proxy/store/store.h"

struct admin;

/* Serves on 'listen_fd' (bound, listening, non-blocking; owned from now on) from loop 'l';
 * 'store' (NULL: none) answers /deliveries (proxy/ops/deliveries_admin.h) and outlives it.
 * NULL with a message on stderr on failure. */
struct admin *admin_start(struct loop *l, int listen_fd, struct proxy *px, struct reload *rl,
                          struct store *store);
void admin_stop(struct admin *a); /* accepts NULL */

/* Whether a client at 'peer' may ask for 'path' (the request path, without its query): true
 * for /healthz, /readyz and /metrics whoever asks, and for anything else when 'peer' is a
 * loopback address: IPv4 127.0.0.0/8, IPv6 ::1, or 127.0.0.0/8 mapped into IPv6
 * (::ffff:127.0.0.1, how a dual-stack listener sees an IPv4 client). A NULL 'peer' or another
 * family is not loopback. Reads nothing but its arguments. */
bool admin_allows(const struct sockaddr *peer, const char *path);

#endif
