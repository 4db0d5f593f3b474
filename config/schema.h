/* schema -- the config schema table and the walker that applies it (internal to config/).
 *
 * One table describes every key: its type, bounds, default, whether it may appear in
 * "defaults", and what it means. Parsing, default filling, validation messages, the effective
 * config dump and the Markdown reference are all driven by it. The table is config/schema.c,
 * the walker config/schema_walk.c, the checks of single values config/schema_values.c.
 */
#ifndef RETRYPROXY_CONFIG_SCHEMA_H
#define RETRYPROXY_CONFIG_SCHEMA_H

#include <stdio.h>

#include <jansson.h>

#include "config/arena.h"
#include "config/cfg.h"
#include "config/errors.h"
#include "config/jsonpos.h"

/* Fills 'c' from the document 'root' (anything jansson loaded), allocating in 'a' and
 * reporting every problem in 'errs', located through 'pos'. 'c' is complete only when no
 * error was added. */
void schema_build(struct cfg *c, struct arena *a, const json_t *root, const struct jpos *pos,
                  struct cfg_errs *errs);

/* The effective config as JSON (new reference). */
json_t *schema_dump(const struct cfg *c);

/* The Markdown reference of every key. */
void schema_write_reference(FILE *out);

#endif
