/* metrics_fam -- the table of metric families and the fixed values of their labels
 * (proxy/telemetry/metrics_fam.c), shared by the scrape (proxy/telemetry/metrics_text.c) and the
 * reference. Private to proxy/telemetry/.
 */
#ifndef RETRYPROXY_PROXY_METRICS_FAM_H
#define RETRYPROXY_PROXY_METRICS_FAM_H

#include <stdbool.h>
#include <stddef.h>

#include "proxy/telemetry/metrics.h"
#include "proxy/telemetry/metrics_int.h"

extern const char *const hist_le[HIST_BUCKETS];
extern const char *const outcome_names[METRICS_OUT_COUNT];
extern const char *const denied_names[METRICS_DENIED_COUNT];
extern const char *const result_names[];
extern const char *const protocol_names[METRICS_PROTO_COUNT];
extern const char *const upgrade_names[METRICS_UPGRADE_COUNT];
extern const char *const direction_names[2];
extern const char *const grpc_names[METRICS_GRPC_COUNT];
extern const char *const scope_names[];
extern const char *const endpoint_states[];
extern const char *const limit_names[METRICS_LIMIT_COUNT];
extern const char *const dns_result_names[METRICS_DNS_COUNT];
extern const char *const h2up_result_names[METRICS_H2UP_COUNT];
extern const char *const delivery_states[4];

enum family {
    FAM_REQUESTS,
    FAM_PROTOCOL,
    FAM_GRPC,
    FAM_UPGRADES,
    FAM_TUNNEL_BYTES,
    FAM_ATTEMPTS,
    FAM_RETRIES,
    FAM_RETRY_SUCCESS,
    FAM_DENIED,
    FAM_IN_FLIGHT,
    FAM_DELIVERY_ACCEPTS,
    FAM_DELIVERY_ATTEMPTS,
    FAM_DEAD_LETTERS,
    FAM_DISCARDED,
    FAM_DEAD_REFUSED,
    FAM_RETRY_AFTER,
    FAM_THROTTLED,
    FAM_HEDGES,
    FAM_CLIENT_GONE,
    FAM_BACKOFF,
    FAM_ATTEMPT_DURATION,
    FAM_REQUEST_DURATION,
    FAM_RELOADS,
    FAM_GENERATION,
    FAM_LAST_SUCCESS,
    FAM_LAST_OK,
    FAM_BUDGET_RATIO,
    FAM_BUDGET_MIN_RPS,
    FAM_BUDGET_CONCURRENT,
    FAM_UPSTREAM_EJECTIONS,
    FAM_UPSTREAM_EJECTED,
    FAM_UPSTREAM_ENDPOINTS,
    FAM_UPSTREAM_ENDPOINT_FAILURE,
    FAM_DNS_RESOLUTIONS,
    FAM_DNS_STALE,
    FAM_DELIVERIES,
    FAM_DELIVERY_OLDEST,
    FAM_STORE_BYTES,
    FAM_STORE_ROWS,
    FAM_STORE_COMMIT,
    FAM_STORE_UP,
    FAM_STORE_DISCONNECTS,
    FAM_CONNECTIONS,
    FAM_TUNNELS_OPEN,
    FAM_H2UP_OPEN,
    FAM_H2UP_OPENED,
    FAM_DRAINING,
    FAM_UPSTREAM_WAITING,
    FAM_LIMIT_REACHED,
    FAM_BODY_BYTES,
    FAM_LIMIT,
    FAM_BUILD_INFO,
    FAM_PROC_CPU,
    FAM_PROC_RSS,
    FAM_PROC_OPEN_FDS,
    FAM_PROC_MAX_FDS,
    FAM_PROC_START,
    FAM_COUNT
};

/* One row per family: the # HELP and # TYPE lines of a scrape and the table of
 * docs/metrics.md (metrics_write_reference()) both come from here. */
struct family_def {
    const char *name;   /* after the retryproxy_ prefix */
    const char *type;   /* counter, gauge or histogram */
    const char *labels; /* "" for none; the last one may have a fixed set of values: */
    const char *const *values;
    size_t n_values;
    const char *help;
    bool bare; /* a standard name, without the retryproxy_ prefix (process_*) */
};
extern const struct family_def metrics_families[FAM_COUNT];

#endif
