/* schema_int -- the types and calls the three files of the schema share (config/schema.h is
 * their interface to the rest of config/; nothing else includes this one).
 *
 * config/schema.c is the table: every key's row and the rules across keys. What one value
 * may be (string checks, custom values, list elements) is config/schema_values.c. The engine
 * that applies the table (the walker, the effective config, the keys read only at start and
 * the reference) is config/schema_walk.c. The table uses the other two and the values use the
 * engine's messages; the engine reaches the table only through schema_root and the rows'
 * function pointers.
 */
#ifndef RETRYPROXY_CONFIG_SCHEMA_INT_H
#define RETRYPROXY_CONFIG_SCHEMA_INT_H

#include <float.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "config/arena.h"
#include "config/cfg.h"
#include "config/errors.h"
#include "config/jsonpos.h"
#include "config/schema.h"

/* Durations are integer milliseconds up to one day (docs/config.md). */
#define MS_MAX     86400000.0
#define NO_MAX     DBL_MAX
#define MAX_FIELDS 20
#define COUNT(a)   (sizeof(a) / sizeof((a)[0]))

struct walk;
struct ctx;

enum ftype {
    FT_OBJECT, /* a nested object with its own schema */
    FT_BOOL,   /* bool */
    FT_UINT,   /* an integer in [min, max] into a uint32_t, uint64_t or (nullable) int64_t */
    FT_NUMBER, /* any JSON number in [min, max] into a double */
    FT_ENUM,   /* one of 'names', its index into an int-sized enum */
    FT_STRING, /* a string accepted by 'check_str', copied into the snapshot */
    FT_LIST,   /* an array of elements of one 'list' kind (see struct list_kind) */
    FT_CUSTOM, /* parsed by 'parse', dumped by 'dump' */
};

enum {
    F_REQUIRED = 1u << 0,   /* no default: a route must write it */
    F_ROUTE_ONLY = 1u << 1, /* refused in "defaults" (name, match, upstreams) */
    F_NULLABLE = 1u << 2,   /* null is a value (FT_UINT stores -1, FT_STRING NULL, FT_LIST an
                               empty list) */
    F_RESTART = 1u << 3,    /* read only at start: a reload that changes it says a restart is
                               needed (cfg_restart_changes); only outside routes and defaults */
    F_NO_ECHO = 1u << 4,    /* an error never repeats the value (it may hold a secret) */
};

/* Where a value is written in the file, for messages and positions. */
struct at {
    const char *path;
    const struct jpos_entry *pos; /* NULL for a schema default */
};

struct field {
    const char *key;
    enum ftype type;
    unsigned flags;
    size_t offset;
    size_t size; /* FT_UINT: size of the target */
    double min, max;
    const char *def; /* the default as JSON text; NULL when required or an object */
    const struct schema *sub;
    const char *const *names;
    size_t n_names;
    const char *(*check_str)(const char *s, size_t len); /* NULL or a message */
    const struct list_kind *list;                        /* FT_LIST: what the elements are */
    size_t count_offset; /* FT_LIST kept as an array: where its size_t count is */
    const char *empty;   /* FT_LIST: why an empty list is wrong; NULL when it is a value */
    int (*parse)(struct walk *w, const struct at *at, const json_t *v, void *dst);
    json_t *(*dump)(const void *src);
    const char *type_doc;
    const char *doc;
};

struct schema {
    const struct field *fields;
    size_t n;
    void (*check)(struct walk *w, const struct ctx *x, void *dst); /* cross-field rules */
};

struct walk {
    struct arena *a;  /* the snapshot's memory */
    struct arena tmp; /* paths and scratch, freed after the build */
    const struct jpos *pos;
    struct cfg_errs *errs;
    const json_t *defaults; /* the file's "defaults" object, or NULL */
};

/* Where each field's value came from: layer 0 is the object being built as written in the
 * file, layer 1 the "defaults" object it inherits from, -1 the schema default. */
struct origin {
    int layer;
    struct at at;
};

struct ctx {
    const struct schema *s;
    const char *path;             /* this object's path (in its own context) */
    const struct jpos_entry *pos; /* where layer 0 is written, NULL if it is not */
    const json_t *layer[2];
    const char *layer_path[2];
    bool in_defaults;
    struct origin origin[MAX_FIELDS];
};

/* What the elements of a list-valued key (FT_LIST) are. The walker does what every list
 * shares: it reports a value that is not an array ("expected ARRAY_DOC, got ..."), an empty
 * one where the row says why that is wrong, an element of the wrong JSON type at its own path
 * ("$.routes[0].upstreams[2]": "expected ELEM_DOC, got ..."), and every element equal to an
 * earlier one by its key (one hash lookup each, struct seen). The kind parses one element. */
struct list_kind {
    const char *array_doc;    /* the whole value: "an array of URLs" */
    const char *elem_doc;     /* one element: "a URL string" */
    json_type elem_type;      /* JSON_STRING or JSON_OBJECT */
    const struct schema *sub; /* JSON_OBJECT: the elements' schema, for the reference */
    size_t size;              /* bytes of one parsed element */
    /* What an element is told apart by: the string (const char *) at this offset in it; NULL
     * when it has nothing to compare (a route whose name was invalid). */
    size_t key_offset;
    /* Not NULL: each element is one bit of a uint32_t, bit i standing for bit_names[i] (its
     * key, and what the effective config shows), and the list is kept as their union (a set,
     * in this order) instead of as an array and its count. */
    const char *const *bit_names;
    /* Parses 'v', of elem_type, into 'elem'. 0, or -1 after reporting. */
    int (*parse)(struct walk *w, const struct at *at, const json_t *v, void *elem);
    /* Reports element 'at' as equal to element 'first'; NULL: "\"KEY\" is listed twice", at
     * the element. */
    void (*twice)(struct walk *w, const struct at *at, const char *key, size_t first);
    /* One element in the effective config; NULL: its key as a string. Not for bits. */
    json_t *(*dump)(const void *elem);
};

/* ---- the table (schema.c) ---- */

extern const struct schema schema_root;

/* ---- the engine (schema_walk.c) ---- */

/* Adds an error at 'at'. */
void schema_err_at(struct walk *w, const struct at *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* What 'v' is, for messages: "an object", "a string", ... */
const char *schema_kind(const json_t *v);
/* The one of 'names' that 's' may be a typo of, else NULL. */
const char *schema_suggest(const char *s, const char *const *names, size_t n);
/* 'names' as "a, b, c" in 'a'. */
char *schema_join(struct arena *a, const char *const *names, size_t n);
/* Where the key 'key' of the object at 'parent' is written. */
struct at schema_child_at(struct walk *w, const char *parent, const char *key);
/* Whether s[0..len) holds a control character, a space or a byte above 0x7e. */
int schema_has_ctl_or_space(const char *s, size_t len);
/* A nullable string field in the effective config. */
json_t *schema_dump_string_or_null(const void *src);
/* Fills 'dst' from the layers of 'x' by the rows of x->s, then runs its rules. */
void schema_walk_object(struct walk *w, struct ctx *x, void *dst);
/* The object 'src' as JSON (new reference); 'defaults_view' leaves out route-only keys. */
json_t *schema_dump_object(const struct schema *s, const void *src, bool defaults_view);

/* ---- values (schema_values.c) ---- */

/* String checks of FT_STRING rows: NULL, or what is wrong. */
const char *schema_check_listen(const char *s, size_t len);
const char *schema_check_route_name(const char *s, size_t len);
const char *schema_check_field_name(const char *s, size_t len);
const char *schema_check_header_name(const char *s, size_t len);
const char *schema_check_path_prefix(const char *s, size_t len);
const char *schema_check_ca_file(const char *s, size_t len);
const char *schema_check_cert_file(const char *s, size_t len);
const char *schema_check_key_file(const char *s, size_t len);
const char *schema_check_server_name(const char *s, size_t len);

/* match.host: a host name with an optional port, lowered, or null. */
int schema_parse_match_host(struct walk *w, const struct at *at, const json_t *v, void *dst);

/* The kinds of list elements. */
extern const struct list_kind schema_method_list;     /* retry.methods, match.methods: bits */
extern const struct list_kind schema_retry_on_list;   /* retry_on, ejection.on */
extern const struct list_kind schema_upstream_list;   /* a route's upstream URLs */
extern const struct list_kind schema_upgrade_list;    /* a route's upgrade tokens */
extern const struct list_kind schema_dns_server_list; /* resolver.servers */
extern const struct list_kind schema_field_name_list; /* store.sensitive_fields */

/* A file of a 256-bit key: 32 bytes, or 64 hex digits and a newline. */
const char *schema_check_store_key_file(const char *s, size_t len);
/* A file path that is not empty. */
const char *schema_check_path(const char *s, size_t len);
/* store.postgres: a connection string that holds no password, and a namespace's name. */
const char *schema_check_pg_url(const char *s, size_t len);
const char *schema_check_namespace(const char *s, size_t len);
/* routes[].delivery.dead_letter: true, false or null (the mode decides). */
int schema_parse_dead_letter(struct walk *w, const struct at *at, const json_t *v, void *dst);
json_t *schema_dump_dead_letter(const void *src);

#endif
