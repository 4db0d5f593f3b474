/* upstreams -- the admin /upstreams view (docs/admin.md): every route of the running config,
 * its upstreams, each upstream's name as last resolved and each of its endpoints with its state,
 * requests in flight, connections and health. */
#ifndef RETRYPROXY_PROXY_OPS_UPSTREAMS_H
#define RETRYPROXY_PROXY_OPS_UPSTREAMS_H

#include <stdint.h>

#include <jansson.h>

struct rt;

/* The view of 'rt' at loop time 'now' (the workers' clock) and wall time 'wall_ms'. A new
 * reference. */
json_t *upstreams_json(const struct rt *rt, uint64_t now, int64_t wall_ms);

/* "2026-11-27T03:18:00.000Z" for 'unix_ms'. */
void upstreams_rfc3339(int64_t unix_ms, char *out, size_t cap);

#endif
