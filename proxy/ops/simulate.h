/* simulate -- `retryproxy simulate` (docs/cli.md): a route's retry policy, and variants of its
 * backoff, run by the simulation engine (policy/sim.h) against a failing upstream; printed as
 * a table, and drawn as an SVG of upstream calls over time.
 *
 * main.c reads the command line (with the value parsers below) and loads the config; this file
 * validates the --policy variants with the config's own rules, runs the engine, and writes the
 * table and the SVG.
 */
#ifndef RETRYPROXY_PROXY_SIMULATE_H
#define RETRYPROXY_PROXY_SIMULATE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config/cfg.h"
#include "policy/sim.h"

/* Bounds that keep a run to seconds and its memory to megabytes. */
#define SIMULATE_MAX_CLIENTS        10000
#define SIMULATE_MAX_REQUESTS       10000
#define SIMULATE_MAX_TOTAL_REQUESTS 100000 /* clients * requests */
#define SIMULATE_MAX_POLICIES       8      /* --policy options */

struct simulate_opts {
    const char *route;
    uint32_t clients;                            /* all starting at 0 ms */
    uint32_t requests;                           /* per client, one after the other */
    const char *policies[SIMULATE_MAX_POLICIES]; /* --policy SPEC, as given */
    size_t n_policies;
    struct sim_upstream upstream;
    uint64_t seed;
    const char *svg_path; /* NULL: no SVG */
};

/* Parsers of the option values: each returns NULL and fills in its part of 'u', or says what
 * is wrong (a usage error). */
/* --outage START_MS-END_MS: whole milliseconds, START < END */
const char *simulate_parse_outage(const char *s, struct sim_upstream *u);
/* --failure-rate P: a number from 0 to 1 */
const char *simulate_parse_failure_rate(const char *s, struct sim_upstream *u);
/* --capacity N/WINDOW_MS: N >= 1 successful calls per window of 1 ms or more */
const char *simulate_parse_capacity(const char *s, struct sim_upstream *u);

/* Runs the route 'route' of 'c' and every --policy variant, prints the table on 'out' and
 * writes the SVG. Problems go to 'err': a --policy that the config's rules reject (each error
 * as "--policy N: $.path: message"), an SVG file that cannot be written. Returns the exit
 * status: 0, or 1. */
int simulate_run(const struct cfg *c, const struct cfg_route *route, const struct simulate_opts *o,
                 FILE *out, FILE *err);

#endif
