/* jsonpos -- where each value of a JSON document is, by JSON path.
 *
 * jansson parses the config but keeps no source positions, stops at the first duplicate key
 * when asked to reject them, and fails the whole document on a number it cannot represent
 * (1e309, 2^64). This strict RFC 8259 scanner runs first: it records the line and column of
 * every value and member key under its JSON path, reports every duplicate key and every
 * out-of-range number, and overwrites such numbers with `null` (padded with spaces, so
 * positions do not move) so that jansson can still load the rest and every other problem is
 * reported too. It accepts exactly what jansson accepts otherwise (UTF-8 only, no NUL in
 * strings, no trailing text).
 *
 * Paths: "$" is the root, ".key" a member whose key is an identifier ([A-Za-z_][A-Za-z0-9_]*),
 * ["key"] any other member (JSON-escaped), "[i]" an array element.
 */
#ifndef RETRYPROXY_CONFIG_JSONPOS_H
#define RETRYPROXY_CONFIG_JSONPOS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/arena.h"
#include "config/errors.h"

/* Deeper documents are refused (a config needs about 6 levels). */
#define JPOS_MAX_DEPTH 64

struct jpos_entry {
    const char *path;
    uint32_t line, col;         /* first character of the value */
    uint32_t key_line, key_col; /* opening quote of the member's key; 0 for array elements */
    bool bad;                   /* an out-of-range number, already reported and nulled */
};

struct jpos {
    struct arena arena; /* paths */
    struct jpos_entry *v;
    size_t n, cap;
    size_t *slots; /* open-addressing table of entry index + 1, keyed by path */
    size_t nslots;
};

/* Scans 'len' bytes of 'text', filling 'p' (zero-initialised by the caller) and rewriting
 * out-of-range numbers in 'text' as described above. Returns 0 when jansson can now load the
 * text (duplicate keys and nulled numbers are in 'errs' nonetheless), -1 on a syntax error
 * (one error in 'errs'; 'p' holds what was scanned before it). */
int jpos_scan(struct jpos *p, char *text, size_t len, struct cfg_errs *errs);

/* The entry recorded for 'path' (for a duplicated key, the last one: jansson keeps the last
 * value too), or NULL. Borrowed from 'p'. */
const struct jpos_entry *jpos_find(const struct jpos *p, const char *path);

/* Frees everything 'p' holds; it is zeroed and reusable. Accepts NULL. */
void jpos_free(struct jpos *p);

/* Paths, allocated in 'a'. 'key' need not be NUL-terminated and may hold any byte. */
char *jpos_path_key(struct arena *a, const char *parent, const char *key, size_t len);
char *jpos_path_index(struct arena *a, const char *parent, size_t index);

#endif
