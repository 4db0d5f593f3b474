/* metrics_fam -- the families of the metrics (proxy/telemetry/metrics.h), one row each, with the
 * fixed values of their labels: proxy/telemetry/metrics_text.c prints a scrape from them, and
 * metrics_write_reference() the table of docs/metrics.md.
 */
#include "proxy/telemetry/metrics_fam.h"

#include <stdio.h>
#include <string.h>

/* The same bounds as printed in le="..." (fixed text, so every scrape prints them alike). */
const char *const hist_le[HIST_BUCKETS] = { "0.0001", "0.00025", "0.0005", "0.001", "0.0025",
                                            "0.005",  "0.01",    "0.025",  "0.05",  "0.1",
                                            "0.25",   "0.5",     "1",      "2.5",   "5",
                                            "10",     "30",      "60",     "+Inf" };

const char *const delivery_states[4] = { "scheduled", "in_flight", "delivered", "dead" };

const char *const outcome_names[METRICS_OUT_COUNT] = { "1xx",   "2xx",     "3xx",
                                                       "4xx",   "5xx",     "connect_failure",
                                                       "reset", "timeout", "cancelled" };
const char *metrics_outcome_name(enum metrics_outcome o)
{
    return o < METRICS_OUT_COUNT ? outcome_names[o] : "";
}

const char *const denied_names[METRICS_DENIED_COUNT] = {
    "max-attempts",  "budget",         "concurrency", "deadline", "retry-after",
    "not-retryable", "body-too-large", "draining",    "pushback", "throttled"
};

const char *const accept_names[METRICS_ACCEPT_COUNT] = { "accepted", "duplicate", "conflict",
                                                         "full",     "too_large", "error" };
const char *const delivery_names[METRICS_DELIVERY_COUNT] = { "delivered", "rescheduled", "dead",
                                                             "interrupted" };
const char *const dead_names[METRICS_DEAD_COUNT] = { "attempts", "age", "final", "route_gone",
                                                     "refused" };
const char *const result_names[] = { "success", "failure" };
const char *const protocol_names[METRICS_PROTO_COUNT] = { "http1", "http2" };
const char *const upgrade_names[METRICS_UPGRADE_COUNT] = { "tunnelled", "refused" };
const char *const direction_names[2] = { "from_client", "from_upstream" };
const char *const grpc_names[METRICS_GRPC_COUNT] = { "0",  "1",  "2",  "3",     "4",   "5",  "6",
                                                     "7",  "8",  "9",  "10",    "11",  "12", "13",
                                                     "14", "15", "16", "other", "none" };
/* budget_*{scope}: the top-level budget, or a route's (then with its route label). */
const char *const scope_names[] = { "process", "route" };
const char *const endpoint_states[] = { "healthy", "ejected", "leaving" };
const char *const limit_names[METRICS_LIMIT_COUNT] = {
    [METRICS_LIMIT_CONNECTIONS] = "max_connections",
    [METRICS_LIMIT_UPSTREAM_REQUESTS] = "max_upstream_requests",
    [METRICS_LIMIT_BUFFERED_BODY_BYTES] = "max_buffered_body_bytes"
};
const char *const dns_result_names[METRICS_DNS_COUNT] = { "ok", "nxdomain", "failure" };
const char *const h2up_result_names[METRICS_H2UP_COUNT] = {
    [METRICS_H2UP_H2] = "h2", [METRICS_H2UP_HTTP1] = "http1", [METRICS_H2UP_FAILED] = "failed"
};

/* Every family, in the order a scrape prints them. */
const struct family_def metrics_families[FAM_COUNT] = {
    [FAM_REQUESTS] = { "requests_total", "counter", "route, code", NULL, 0,
                       "Requests answered, by route and final status code sent to the client." },
    [FAM_PROTOCOL] = { "requests_by_protocol_total", "counter", "route, protocol", protocol_names,
                       METRICS_PROTO_COUNT,
                       "Requests answered, by route and the protocol the client spoke." },
    [FAM_UPGRADES] = { "upgrades_total", "counter", "route, outcome", upgrade_names,
                       METRICS_UPGRADE_COUNT,
                       "Upgrades (WebSocket...) the route tunnels, by outcome: tunnelled (the "
                       "upstream's 101 reached the client), refused (anything else answered "
                       "them)." },
    [FAM_TUNNEL_BYTES] = { "tunnel_bytes_total", "counter", "route, direction", direction_names, 2,
                           "Bytes carried by upgraded connections, from the client to the "
                           "upstream and from the upstream to the client." },
    [FAM_GRPC] = { "grpc_responses_total", "counter", "route, grpc_status", grpc_names,
                   METRICS_GRPC_COUNT,
                   "gRPC calls answered, by route and the grpc-status they ended with (0 to 16, "
                   "other, or none when the call ended without one; a response without one "
                   "whose HTTP status is not 200 counts as gRPC maps it, a 503 as 14); only "
                   "statuses seen are printed." },
    [FAM_ATTEMPTS] = { "attempts_total", "counter", "route, upstream, outcome", outcome_names,
                       METRICS_OUT_COUNT,
                       "Upstream attempts, by route, upstream URL as written and outcome." },
    [FAM_RETRIES] = { "retries_total", "counter", "route, reason", NULL, 0,
                      "Retries started, by route and the retry_on token that fired." },
    [FAM_RETRY_SUCCESS] = { "retry_success_total", "counter", "route", NULL, 0,
                            "Requests a retry answered with success (an attempt after the "
                            "first)." },
    [FAM_DENIED] = { "retries_denied_total", "counter", "route, reason", denied_names,
                     METRICS_DENIED_COUNT,
                     "Retries not made, by route and the reason (as X-Retry-Stop)." },
    [FAM_IN_FLIGHT] = { "retries_in_flight", "gauge", "", NULL, 0,
                        "Retries decided and not yet finished, backoff waits included." },
    [FAM_DELIVERY_ACCEPTS] = { "delivery_accepts_total", "counter", "route, result", accept_names,
                               METRICS_ACCEPT_COUNT,
                               "Requests to durable routes, by what they were answered: accepted "
                               "(202), duplicate (202, an Idempotency-Key and body accepted "
                               "before), conflict (422), full (503, the store at a bound), "
                               "too_large (413), error (503, the store failed); "
                               "docs/delivery.md." },
    [FAM_DELIVERY_ATTEMPTS] = { "delivery_attempts_total", "counter", "route, outcome",
                                delivery_names, METRICS_DELIVERY_COUNT,
                                "Attempts of durable deliveries, by what they made of the "
                                "delivery: delivered, rescheduled (a retry later), dead, "
                                "interrupted (cut by the drain's deadline: given back, due "
                                "now)." },
    [FAM_DISCARDED] = { "deliveries_discarded_total", "counter", "route, reason", dead_names,
                        METRICS_DEAD_COUNT,
                        "Durable deliveries deleted where they would have been dead letters, "
                        "their route saying delivery.dead_letter false, by route and why (as "
                        "dead_letters_total); each is logged (delivery discarded)." },
    [FAM_DEAD_REFUSED] = { "dead_letters_refused_total", "counter", "route", NULL, 0,
                           "Dead letters not kept, by route: the store refused them (full at "
                           "store.max_count, store.max_bytes or its disk, or failing); each is "
                           "logged (dead letter not kept), and nothing kept before was "
                           "evicted." },
    [FAM_DEAD_LETTERS] = { "dead_letters_total", "counter", "route, reason", dead_names,
                           METRICS_DEAD_COUNT,
                           "Dead letters kept, by route and why: attempts (retry.max_attempts "
                           "spent; a synchronous route's too), age (delivery.max_age_ms), final "
                           "(an answer not to retry), route_gone (no route of its name after a "
                           "restart), refused (a synchronous route's request whose retry a "
                           "budget, the deadline, Retry-After, pushback or throttling refused)." },
    [FAM_RETRY_AFTER] = { "retry_after_honored_total", "counter", "route", NULL, 0,
                          "Retries whose wait followed an upstream Retry-After." },
    [FAM_THROTTLED] = { "throttled_total", "counter", "route", NULL, 0,
                        "Attempts client-side throttling rejected, by route: first attempts "
                        "answered 503, retries not made." },
    [FAM_HEDGES] = { "hedges_total", "counter", "route", NULL, 0,
                     "Attempts started while an earlier attempt of the same request ran on "
                     "past per_try_timeout_ms (retry.hedge_on_per_try_timeout)." },
    [FAM_CLIENT_GONE] = { "client_gone_total", "counter", "route", NULL, 0,
                          "Requests whose client went away (its connection closed or reset, "
                          "its stream reset) before their answer started, logged with status "
                          "0 (499 during a backoff wait), or while their response's body was "
                          "still coming from the upstream, logged with the status sent and "
                          "stop client-closed." },
    [FAM_BACKOFF] = { "backoff_seconds", "histogram", "route", NULL, 0,
                      "Backoff waits before retries, in seconds." },
    [FAM_ATTEMPT_DURATION] = { "attempt_duration_seconds", "histogram", "route, upstream", NULL, 0,
                               "Duration of single upstream attempts, by route and upstream URL "
                               "as written, in seconds." },
    [FAM_REQUEST_DURATION] = { "request_duration_seconds", "histogram", "route", NULL, 0,
                               "Duration of whole client requests, retries included, in seconds." },
    [FAM_RELOADS] = { "config_reloads_total", "counter", "result", result_names, 2,
                      "Configuration loads, by result; the initial load counts as a success." },
    [FAM_GENERATION] = { "config_generation", "gauge", "", NULL, 0,
                         "Generation of the configuration in effect." },
    [FAM_LAST_SUCCESS] = { "config_last_reload_success_timestamp_seconds", "gauge", "", NULL, 0,
                           "Unix time of the last successful configuration load." },
    [FAM_LAST_OK] = { "config_last_reload_successful", "gauge", "", NULL, 0,
                      "1 if the last configuration load succeeded, 0 if the file was refused." },
    [FAM_BUDGET_RATIO] = { "budget_retry_ratio", "gauge", "route, scope", scope_names, 2,
                           "The retry budget's retry_ratio in effect, process-wide or by route." },
    [FAM_BUDGET_MIN_RPS] = { "budget_min_retries_per_second", "gauge", "route, scope", scope_names,
                             2,
                             "The retry budget's min_retries_per_second in effect, process-wide "
                             "or by route." },
    [FAM_BUDGET_CONCURRENT] = { "budget_max_concurrent_retries", "gauge", "route, scope",
                                scope_names, 2,
                                "The retry budget's max_concurrent_retries in effect, process-wide "
                                "or by route; +Inf for no cap." },
    [FAM_UPSTREAM_EJECTIONS] = { "upstream_ejections_total", "counter", "route, upstream", NULL, 0,
                                 "Times an endpoint of an upstream was ejected from its route's "
                                 "rotation (routes[].ejection), by route and upstream URL as "
                                 "written." },
    [FAM_UPSTREAM_EJECTED] = { "upstream_ejected", "gauge", "route, upstream", NULL, 0,
                               "The upstream's endpoints ejected from its route's rotation now "
                               "(0 or 1 for an upstream of one address)." },
    [FAM_UPSTREAM_ENDPOINTS] = { "upstream_endpoints", "gauge", "route, upstream, state",
                                 endpoint_states, 3,
                                 "The upstream's endpoints (the addresses its name resolves to) "
                                 "by state: healthy, ejected, or leaving (gone from the record, "
                                 "still used)." },
    [FAM_UPSTREAM_ENDPOINT_FAILURE] = { "upstream_endpoint_failure_ratio", "gauge",
                                        "route, upstream, endpoint", NULL, 0,
                                        "The failure ratio of the upstream's worst endpoints "
                                        "lately "
                                        "(0 to 1, attempts retry_on names): at most 3 per "
                                        "upstream, those at 0.1 or more, by address." },
    [FAM_DNS_RESOLUTIONS] = { "dns_resolutions_total", "counter", "name, result", dns_result_names,
                              METRICS_DNS_COUNT,
                              "Lookups of the upstreams' host names (resolver), by name as "
                              "configured and result: ok, nxdomain (no such name, or no address), "
                              "failure (timeout, SERVFAIL, refused...); IP literals have none." },
    [FAM_DNS_STALE] = { "dns_stale", "gauge", "name", NULL, 0,
                        "1 while the name runs on the addresses kept after its last lookup "
                        "failed, else 0." },
    [FAM_DELIVERIES] = { "deliveries", "gauge", "route, state", delivery_states, 4,
                         "Durable deliveries and dead letters in the store now, by route and "
                         "state (docs/delivery.md); read from the store at most once a second." },
    [FAM_DELIVERY_OLDEST] = { "delivery_oldest_seconds", "gauge", "route", NULL, 0,
                              "Age of the route's oldest pending delivery (scheduled or in "
                              "flight), from its accept; 0 when none is pending." },
    [FAM_STORE_BYTES] = { "store_bytes", "gauge", "", NULL, 0,
                          "The delivery store's size in use (its file's pages but the free "
                          "ones), against store.max_bytes." },
    [FAM_STORE_ROWS] = { "store_rows", "gauge", "", NULL, 0,
                         "Deliveries kept in the store, delivered ones included." },
    [FAM_STORE_COMMIT] = { "store_commit_seconds", "histogram", "", NULL, 0,
                           "Time of each of the store's transactions (a group commit: every "
                           "accept ready at once, fsync included)." },
    [FAM_STORE_UP] = { "store_up", "gauge", "", NULL, 0,
                       "1 while the delivery store can be reached, 0 while the shared store's "
                       "database is lost (durable accepts then answer 503; docs/delivery.md)." },
    [FAM_STORE_DISCONNECTS] = { "store_disconnects_total", "counter", "", NULL, 0,
                                "Times the shared store's connection to its database was lost "
                                "(0 for the file store)." },
    [FAM_CONNECTIONS] = { "connections_active", "gauge", "", NULL, 0,
                          "Client connections currently open." },
    [FAM_TUNNELS_OPEN] = { "tunnels_open", "gauge", "", NULL, 0,
                           "Upgraded connections (tunnels) open now." },
    [FAM_H2UP_OPEN] = { "upstream_h2_connections", "gauge", "", NULL, 0,
                        "HTTP/2 connections to upstreams open now (h2c, and https ones where the "
                        "server chose h2), connecting ones included." },
    [FAM_H2UP_OPENED] = { "upstream_h2_connections_total", "counter", "result", h2up_result_names,
                          METRICS_H2UP_COUNT,
                          "HTTP/2 upstream connections tried, by result: h2 (it carried HTTP/2), "
                          "http1 (an https server chose http/1.1 by ALPN: its requests went "
                          "through libcurl), failed (TCP, TLS or certificate failure, timeout, "
                          "or tls.http2 required and no h2)." },
    [FAM_DRAINING] = { "draining", "gauge", "", NULL, 0,
                       "1 from the moment the proxy starts draining (SIGTERM, SIGINT) until it "
                       "exits, else 0." },
    [FAM_UPSTREAM_WAITING] = { "upstream_requests_waiting", "gauge", "", NULL, 0,
                               "Upstream attempts waiting for a transfer slot now "
                               "(limits.max_upstream_requests, or an endpoint's or a connection's "
                               "share of it)." },
    [FAM_LIMIT_REACHED] = { "connections_limit_reached_total", "counter", "", NULL, 0,
                            "Times a worker stopped accepting because its share of "
                            "limits.max_connections was open: new clients wait in the listen "
                            "backlog until a connection closes (the kernel refuses them once it "
                            "is full)." },
    [FAM_BODY_BYTES] = { "buffered_body_bytes", "gauge", "", NULL, 0,
                         "Request-body bytes held for replay now, against "
                         "limits.max_buffered_body_bytes." },
    [FAM_LIMIT] = { "limit", "gauge", "limit", limit_names, METRICS_LIMIT_COUNT,
                    "The limits.* settings in effect (max_connections as read at start)." },
    [FAM_BUILD_INFO] = { "build_info", "gauge", "version", NULL, 0,
                         "Always 1; version is what retryproxy --version prints." },
    [FAM_PROC_CPU] = { "process_cpu_seconds_total", "counter", "", NULL, 0,
                       "Total user and system CPU time spent in seconds.", true },
    [FAM_PROC_RSS] = { "process_resident_memory_bytes", "gauge", "", NULL, 0,
                       "Resident memory size in bytes.", true },
    [FAM_PROC_OPEN_FDS] = { "process_open_fds", "gauge", "", NULL, 0,
                            "Number of open file descriptors.", true },
    [FAM_PROC_MAX_FDS] = { "process_max_fds", "gauge", "", NULL, 0,
                           "Maximum number of open file descriptors (the soft RLIMIT_NOFILE).",
                           true },
    [FAM_PROC_START] = { "process_start_time_seconds", "gauge", "", NULL, 0,
                         "Start time of the process since unix epoch in seconds.", true },
};

/* ---- the reference ---- */

/* "route, outcome" as "`route`, `outcome`", the values of the last label after it. */
static void put_doc_labels(FILE *f, const struct family_def *d)
{
    const char *p = d->labels;
    while (*p) {
        size_t n = strcspn(p, ",");
        fprintf(f, "`%.*s`", (int)n, p);
        p += n;
        if (*p) {
            fputs(", ", f);
            p += strspn(p, ", ");
        }
    }
    for (size_t i = 0; i < d->n_values; i++)
        fprintf(f, "%s`%s`", i ? ", " : " (", d->values[i]);
    if (d->n_values)
        fputc(')', f);
}

void metrics_write_reference(FILE *out)
{
    fputs("| metric | type | labels | meaning |\n|---|---|---|---|\n", out);
    for (size_t i = 0; i < FAM_COUNT; i++) {
        const struct family_def *d = &metrics_families[i];
        fprintf(out, "| `%s%s` | %s | ", d->bare ? "" : "retryproxy_", d->name, d->type);
        put_doc_labels(out, d);
        fprintf(out, " | %s |\n", d->help);
    }
    fputs("\nHistogram buckets (`le`, upper bounds in seconds):", out);
    for (size_t b = 0; b < HIST_BUCKETS; b++)
        fprintf(out, "%s `%s`", b ? "," : "", hist_le[b]);
    fputs(".\n", out);
}
