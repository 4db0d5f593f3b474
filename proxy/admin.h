/* admin -- the admin listener (CONTRACT §6), in the control thread's loop.
 *
 *   GET  /healthz   200 while the process runs
 *   GET  /readyz    200 when serving, 503 while draining
 *   GET  /metrics   Prometheus text format 0.0.4
 *   GET  /config    generation, loaded_at, source, last_error, restart_required, the effective
 *                   config with defaults filled in
 *   GET  /schedule?route=NAME&retries=N&seed=S   {"route": ..., "delays_ms": [...], "seed": S}
 *   POST /reload    200 {"generation": N} or 422 {"errors": [...]}
 *
 * Other methods on these paths get 405 with Allow; other paths 404. Answers are JSON except
 * /metrics. Nothing here shows request header values or credentials.
 */
#ifndef RETRYPROXY_PROXY_ADMIN_H
#define RETRYPROXY_PROXY_ADMIN_H

#include "proxy/loop.h"
#include "proxy/proxy.h"
#include "proxy/reload.h"

struct admin;

/* Serves on 'listen_fd' (bound, listening, non-blocking; owned from now on) from loop 'l'.
 * NULL with a message on stderr on failure. */
struct admin *admin_start(struct loop *l, int listen_fd, struct proxy *px, struct reload *rl);
void admin_stop(struct admin *a); /* accepts NULL */

#endif
