/* deliveries_cli -- `retryproxy deliveries list|show|replay|drop` (docs/cli.md,
 * docs/delivery.md "CLI"): the config's store file opened by this process (SQLite lets the
 * running proxy keep it open; a lock held by it is waited for), the admin API's filters, a
 * table or --json. What it replays the running proxy's courier finds at its next poll. */
#ifndef RETRYPROXY_PROXY_OPS_DELIVERIES_CLI_H
#define RETRYPROXY_PROXY_OPS_DELIVERIES_CLI_H

#include <stdbool.h>
#include <stdio.h>

#include "config/cfg.h"
#include "proxy/ops/deliveries.h"

enum dcli_action { DCLI_LIST, DCLI_SHOW, DCLI_REPLAY, DCLI_DROP };

/* Runs 'action' on delivery 'id' (NULL: by the filter 'q'; list and show ignore the other).
 * Output to 'out', errors to 'err', the log lines of replays and drops to stderr. The exit
 * status: 0, or 1 (no store, no such delivery, in flight, the store failed). */
int dcli_run(const struct cfg *cfg, enum dcli_action action, const char *id, const struct dq *q,
             bool json, FILE *out, FILE *err);

#endif
