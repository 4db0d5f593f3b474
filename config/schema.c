#include "config/schema.h"

#include <arpa/inet.h>
#include <float.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/pem.h"
#include "config/strhash.h"

/* Durations are integer milliseconds up to one day (docs/config.md). */
#define MS_MAX     86400000.0
#define NO_MAX     DBL_MAX
#define MAX_FIELDS 16
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

/* ---- small helpers ---- */

static const struct jpos_entry *find_pos(struct walk *w, const char *path)
{
    return jpos_find(w->pos, path);
}

static void err_at(struct walk *w, const struct at *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void err_at(struct walk *w, const struct at *at, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    uint32_t line = at->pos ? at->pos->line : 0, col = at->pos ? at->pos->col : 0;
    cfg_errs_add(w->errs, at->path, line, col, "%s", msg);
}

static const char *kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
        return "true";
    case JSON_FALSE:
        return "false";
    case JSON_NULL:
        return "null";
    }
    return "a value";
}

static char lower(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

/* Edit distance counting a swap of neighbours as one edit (optimal string alignment), case
 * ignored: "bsae_ms", "GTE" and "5XX" are one edit from what was meant. Large for long
 * strings, which get no hints. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 31 || lb > 31)
        return 99;
    size_t d[32][32];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            size_t cost = lower(a[i - 1]) != lower(b[j - 1]);
            size_t best = d[i - 1][j - 1] + cost;
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) &&
                lower(a[i - 2]) == lower(b[j - 1]) && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    }
    return d[la][lb];
}

/* The closest of 'names' to 's' when it is close enough to be a typo (at most one edit per
 * three characters, and at least one allowed), else NULL. */
static const char *suggest(const char *s, const char *const *names, size_t n)
{
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(s, names[i]);
        size_t allowed = strlen(names[i]) / 3 > 1 ? strlen(names[i]) / 3 : 1;
        if (d <= allowed && d < best_d) {
            best = names[i];
            best_d = d;
        }
    }
    return best;
}

static char *join(struct arena *a, const char *const *names, size_t n)
{
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(names[i]) + 2;
    char *s = arena_alloc(a, len), *p = s;
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%s%s", i ? ", " : "", names[i]);
    return s;
}

static struct at child_at(struct walk *w, const char *parent, const char *key)
{
    struct at at;
    at.path = jpos_path_key(&w->tmp, parent, key, strlen(key));
    at.pos = find_pos(w, at.path);
    return at;
}

static struct at elem_at(struct walk *w, const char *parent, size_t i)
{
    struct at at;
    at.path = jpos_path_index(&w->tmp, parent, i);
    at.pos = find_pos(w, at.path);
    return at;
}

/* ---- duplicates in a list ---- */

/* The strings of one list seen so far, each with the index where it first appeared, so that a
 * list's duplicate check costs one lookup per element: a file repeating one entry 20,000
 * times must not take n^2 comparisons. Open addressing, at most half full; memory from
 * w->tmp. */
struct seen {
    const char **key;
    size_t *first;
    size_t mask;
};

static void seen_init(struct walk *w, struct seen *s, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    s->key = arena_alloc(&w->tmp, cap * sizeof(*s->key));
    s->first = arena_alloc(&w->tmp, cap * sizeof(*s->first));
    s->mask = cap - 1;
}

/* Records 'key' (borrowed: it must outlive the set) as seen at index 'i'. Returns the index
 * of an earlier equal string, or SIZE_MAX when this is the first. */
static size_t seen_add(struct seen *s, const char *key, size_t i)
{
    for (size_t k = (size_t)str_hash(key) & s->mask;; k = (k + 1) & s->mask) {
        if (!s->key[k]) {
            s->key[k] = key;
            s->first[k] = i;
            return SIZE_MAX;
        }
        if (strcmp(s->key[k], key) == 0)
            return s->first[k];
    }
}

/* ---- string checks ---- */

static int has_ctl_or_space(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c >= 0x7f)
            return 1;
    }
    return 0;
}

static int is_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* A port: 1 to 5 digits, at most 65535 ('allow_zero' for listeners: 0 picks a free port). */
static int valid_port(const char *s, size_t len, int allow_zero)
{
    if (len == 0 || len > 5)
        return 0;
    unsigned v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    return v <= 65535 && (v > 0 || allow_zero);
}

/* A DNS name or IPv4 literal: letters, digits, '-', '.', '_'. */
static int valid_hostname(const char *s, size_t len)
{
    if (len == 0 || len > 253)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!is_alnum(s[i]) && s[i] != '-' && s[i] != '.' && s[i] != '_')
            return 0;
    return 1;
}

static int valid_ipv6_literal(const char *s, size_t len)
{
    char buf[64];
    struct in6_addr a6;
    if (len < 3 || len - 2 >= sizeof(buf) || s[0] != '[' || s[len - 1] != ']')
        return 0;
    memcpy(buf, s + 1, len - 2);
    buf[len - 2] = '\0';
    return inet_pton(AF_INET6, buf, &a6) == 1;
}

/* "host[:port]" as a Host header or URL authority may hold it. */
static int valid_authority(const char *s, size_t len, int need_port, int allow_zero_port)
{
    const char *colon = NULL;
    if (len > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close)
            return 0;
        size_t hl = (size_t)(close - s) + 1;
        if (!valid_ipv6_literal(s, hl))
            return 0;
        if (hl == len)
            return !need_port;
        if (s[hl] != ':')
            return 0;
        return valid_port(s + hl + 1, len - hl - 1, allow_zero_port);
    }
    for (size_t i = 0; i < len; i++)
        if (s[i] == ':')
            colon = s + i;
    size_t hl = colon ? (size_t)(colon - s) : len;
    if (!valid_hostname(s, hl))
        return 0;
    if (!colon)
        return !need_port;
    return valid_port(colon + 1, len - hl - 1, allow_zero_port);
}

static const char *check_listen(const char *s, size_t len)
{
    if (!valid_authority(s, len, 1, 1))
        return "expected HOST:PORT such as \"127.0.0.1:15001\", \"0.0.0.0:15001\" or "
               "\"[::1]:15001\"";
    return NULL;
}

const char *cfg_address_problem(const char *s)
{
    return check_listen(s, strlen(s));
}

/* A name of 1 to 'max' characters, each a letter, a digit or one of 'punct': NULL, or the
 * problem ('too_long' or 'bad_char'). */
static const char *check_name(const char *s, size_t len, size_t max, const char *punct,
                              const char *too_long, const char *bad_char)
{
    if (len == 0 || len > max)
        return too_long;
    for (size_t i = 0; i < len; i++)
        if (!is_alnum(s[i]) && (!s[i] || !strchr(punct, s[i])))
            return bad_char;
    return NULL;
}

static const char *check_route_name(const char *s, size_t len)
{
    return check_name(s, len, 100, "._-:/", "must be 1 to 100 characters long",
                      "may hold only letters, digits and . _ - : /");
}

/* A header name: a token (RFC 9110 5.1) of at most 64 characters. */
static const char *check_field_name(const char *s, size_t len)
{
    return check_name(s, len, 64, "!#$%&'*+-.^_`|~", "must be 1 to 64 characters long",
                      "must be a header name (letters, digits and !#$%&'*+-.^_`|~)");
}

/* A header name the proxy may set on each attempt: not one of the fields the proxy already
 * sets or frames the request with. */
static const char *check_header_name(const char *s, size_t len)
{
    static const char *const owned[] = {
        "Host",         "Content-Length",  "Transfer-Encoding", "Connection",
        "X-Request-Id", "X-Retry-Attempt", "X-Forwarded-For",   "X-Forwarded-Proto"
    };
    const char *why = check_field_name(s, len);
    if (why)
        return why;
    for (size_t i = 0; i < COUNT(owned); i++)
        if (strlen(owned[i]) == len && strncasecmp(s, owned[i], len) == 0)
            return "names a header the proxy sets itself";
    return NULL;
}

static const char *check_path_prefix(const char *s, size_t len)
{
    if (len == 0 || s[0] != '/')
        return "must start with '/'";
    if (has_ctl_or_space(s, len))
        return "must be printable ASCII without spaces (percent-encode other bytes)";
    if (memchr(s, '?', len) || memchr(s, '#', len))
        return "must not hold a query ('?') or fragment ('#')";
    return NULL;
}

static const char *check_ca_file(const char *s, size_t len)
{
    if (len == 0 || memchr(s, '\0', len))
        return "must name a file of PEM certificates";
    if (access(s, R_OK) != 0)
        return "cannot be read (no such file, or no permission)";
    return NULL;
}

static const char *check_cert_file(const char *s, size_t len)
{
    if (len == 0 || memchr(s, '\0', len))
        return "must name a file holding a PEM certificate";
    return pem_check_certs(s);
}

static const char *check_key_file(const char *s, size_t len)
{
    if (len == 0 || memchr(s, '\0', len))
        return "must name a file holding a PEM private key";
    return pem_check_key(s);
}

/* A DNS name: SNI carries no address (an address URL is verified against the certificate's
 * IP entries already). */
static const char *check_server_name(const char *s, size_t len)
{
    unsigned char ip[16];
    if (len == 0 || len > 253 || memchr(s, '\0', len))
        return "must be a host name of 1 to 253 characters";
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '-' || s[i] == '.' || s[i] == '_'))
            return "must be a host name (letters, digits, '-', '_' and '.'; no port)";
    if (inet_pton(AF_INET, s, ip) == 1)
        return "must be a host name, not an address: SNI carries names only";
    return NULL;
}

/* ---- custom fields ---- */

static int parse_match_host(struct walk *w, const struct at *at, const json_t *v, void *dst)
{
    const char **out = dst;
    if (json_is_null(v)) {
        *out = NULL;
        return 0;
    }
    if (!json_is_string(v)) {
        err_at(w, at, "expected a string or null, got %s", kind(v));
        return -1;
    }
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    if (has_ctl_or_space(s, len) || !valid_authority(s, len, 0, 0)) {
        err_at(w, at,
               "expected a host name, optionally with a port (\"api.internal\", "
               "\"api.internal:8080\")");
        return -1;
    }
    char *low = arena_strndup(w->a, s, len);
    for (char *p = low; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
    *out = low;
    return 0;
}

static json_t *dump_string_or_null(const void *src)
{
    const char *const *s = src;
    return *s ? json_string(*s) : json_null();
}

/* ---- lists ---- */

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

static const char *elem_key(const struct list_kind *k, const void *elem)
{
    if (!k->bit_names)
        return *(const char *const *)((const char *)elem + k->key_offset);
    uint32_t bit = *(const uint32_t *)elem;
    unsigned i = 0;
    while (bit > 1u << i)
        i++;
    return k->bit_names[i];
}

/* An FT_LIST value 'v' into the object 'obj': an array in the snapshot's memory and its count,
 * or for a kind of bits their union. Nothing is stored unless every element is valid. */
static int parse_list(struct walk *w, const struct field *f, const struct at *at, const json_t *v,
                      void *obj)
{
    const struct list_kind *k = f->list;
    size_t n = 0;
    char *elems = NULL;
    int rc = 0;
    if (!(json_is_null(v) && (f->flags & F_NULLABLE))) {
        if (!json_is_array(v)) {
            err_at(w, at, "expected %s, got %s", k->array_doc, kind(v));
            return -1;
        }
        n = json_array_size(v);
        if (n == 0 && f->empty) {
            err_at(w, at, "%s", f->empty);
            return -1;
        }
        elems = arena_alloc(k->bit_names ? &w->tmp : w->a, (n ? n : 1) * k->size);
    }
    struct seen seen;
    seen_init(w, &seen, n);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        void *elem = elems + i * k->size;
        struct at e_at = elem_at(w, at->path, i);
        if (json_typeof(e) != k->elem_type) {
            err_at(w, &e_at, "expected %s, got %s", k->elem_doc, kind(e));
            rc = -1;
            continue;
        }
        if (k->parse(w, &e_at, e, elem) < 0) {
            rc = -1;
            continue;
        }
        const char *key = elem_key(k, elem);
        size_t first = key ? seen_add(&seen, key, i) : SIZE_MAX;
        if (first == SIZE_MAX)
            continue;
        if (k->twice)
            k->twice(w, &e_at, key, first);
        else
            err_at(w, &e_at, "\"%s\" is listed twice", key);
        rc = -1;
    }
    if (rc < 0)
        return rc;
    void *p = (char *)obj + f->offset;
    if (k->bit_names) {
        uint32_t set = 0;
        for (size_t i = 0; i < n; i++)
            set |= ((const uint32_t *)elems)[i];
        *(uint32_t *)p = set;
    } else {
        *(void **)p = elems;
        *(size_t *)((char *)obj + f->count_offset) = n;
    }
    return 0;
}

/* A kind of strings, each parsed into a T by 'parse_fn' and told apart by its 'key' member. */
#define STRING_LIST(array, elem, T, key, parse_fn)                                                 \
    {                                                                                              \
        .array_doc = array, .elem_doc = elem, .elem_type = JSON_STRING, .size = sizeof(T),         \
        .key_offset = offsetof(T, key), .parse = parse_fn                                          \
    }

/* An FT_LIST of the object 'obj' as a JSON array (null when empty and the row allows null). */
static json_t *dump_list(const struct field *f, const void *obj)
{
    const struct list_kind *k = f->list;
    const void *p = (const char *)obj + f->offset;
    if (k->bit_names) {
        uint32_t set = *(const uint32_t *)p;
        if (!set && (f->flags & F_NULLABLE))
            return json_null();
        json_t *a = json_array();
        for (unsigned i = 0; i < 32; i++)
            if (set & (1u << i))
                json_array_append_new(a, json_string(k->bit_names[i]));
        return a;
    }
    const char *elems = *(const char *const *)p;
    size_t n = *(const size_t *)((const char *)obj + f->count_offset);
    if (!n && (f->flags & F_NULLABLE))
        return json_null();
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
        const void *e = elems + i * k->size;
        json_array_append_new(a, k->dump ? k->dump(e) : json_string(elem_key(k, e)));
    }
    return a;
}

/* Indexed by the bit positions of enum cfg_method. */
static const char *const method_names[] = { "GET",   "HEAD", "OPTIONS", "PUT",    "DELETE",
                                            "TRACE", "POST", "PATCH",   "CONNECT" };

uint32_t cfg_method_bit(const char *name, size_t len)
{
    for (size_t i = 0; i < COUNT(method_names); i++)
        if (strlen(method_names[i]) == len && memcmp(method_names[i], name, len) == 0)
            return 1u << i;
    return 0;
}

const char *cfg_method_name(uint32_t bit)
{
    for (size_t i = 0; i < COUNT(method_names); i++)
        if (bit == 1u << i)
            return method_names[i];
    return NULL;
}

/* A method token into its bit (enum cfg_method). */
static int parse_method(struct walk *w, const struct at *at, const json_t *v, void *elem)
{
    const char *s = json_string_value(v);
    uint32_t bit = cfg_method_bit(s, json_string_length(v));
    if (bit) {
        *(uint32_t *)elem = bit;
        return 0;
    }
    const char *near = suggest(s, method_names, COUNT(method_names));
    if (near)
        err_at(w, at, "unknown method \"%s\"; did you mean \"%s\"? (methods are case-sensitive)", s,
               near);
    else
        err_at(w, at, "unknown method \"%s\" (known: %s)", s,
               join(&w->tmp, method_names, COUNT(method_names)));
    return -1;
}

static const struct list_kind method_list = {
    .array_doc = "an array of method names",
    .elem_doc = "a method name",
    .elem_type = JSON_STRING,
    .size = sizeof(uint32_t),
    .bit_names = method_names,
    .parse = parse_method,
};

static const char *const retry_on_names[] = {
    "connect-failure",    "reset",      "timeout",           "5xx",
    "gateway-error",      "cancelled",  "deadline-exceeded", "internal",
    "resource-exhausted", "unavailable"
};

/* 1 to 3 digits -> their value; -1 otherwise. */
static long grpc_number(const char *s, size_t len)
{
    if (len < 1 || len > 3)
        return -1;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* "grpc:N" or "grpc:N-M": gRPC statuses by number (1 to 999: 0 is OK, never retried). */
static int parse_grpc_cond(struct walk *w, const struct at *at, const char *s, size_t len,
                           struct cfg_retry_cond *c)
{
    const char *n = s + 5;
    size_t nl = len - 5;
    const char *dash = memchr(n, '-', nl);
    long lo = grpc_number(n, dash ? (size_t)(dash - n) : nl);
    long hi = dash ? grpc_number(dash + 1, nl - (size_t)(dash - n) - 1) : lo;
    if (lo < 1 || hi < 1) {
        err_at(w, at,
               "retry_on \"%s\": expected a gRPC status 1 to 999 (\"grpc:14\") or a range "
               "(\"grpc:1-4\"); 0 is OK and never retried",
               s);
        return -1;
    }
    if (lo > hi) {
        err_at(w, at, "range \"%s\" runs backwards; write \"grpc:%ld-%ld\"", s, hi, lo);
        return -1;
    }
    c->kind = CFG_RETRY_GRPC;
    c->lo = (uint16_t)lo;
    c->hi = (uint16_t)hi;
    return 0;
}

/* "header:NAME" or "header:NAME=VALUE" (Envoy's retriable_headers): a response that carries
 * the field (with exactly that value) is retried whatever its status. */
static int parse_header_cond(struct walk *w, const struct at *at, const char *s, size_t len,
                             struct cfg_retry_cond *c)
{
    const char *name = s + 7, *eq = memchr(name, '=', len - 7);
    size_t nl = eq ? (size_t)(eq - name) : len - 7;
    const char *why = check_field_name(name, nl);
    if (why) {
        err_at(w, at, "retry_on \"%s\": \"%.*s\" %s", s, (int)nl, name, why);
        return -1;
    }
    if (eq) {
        for (const char *p = eq + 1; p < s + len; p++) {
            if ((unsigned char)*p < 0x20 || *p == 0x7f) {
                err_at(w, at, "retry_on \"%s\": the header value holds a control character", s);
                return -1;
            }
        }
        c->value = arena_strndup(w->a, eq + 1, len - nl - 8);
    }
    c->kind = CFG_RETRY_HEADER;
    c->name = arena_strndup(w->a, name, nl);
    return 0;
}

/* "NNN" -> code; -1 if not three digits. */
static int status_code(const char *s, size_t len)
{
    if (len != 3)
        return -1;
    int v = 0;
    for (size_t i = 0; i < 3; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* A retry_on token: a named condition, a status or a range of statuses. */
static int parse_retry_cond(struct walk *w, const struct at *at, const json_t *v, void *elem)
{
    static const struct {
        const char *name;
        enum cfg_retry_kind kind;
        uint16_t lo, hi;
    } named[] = {
        { "connect-failure", CFG_RETRY_CONNECT_FAILURE, 0, 0 },
        { "reset", CFG_RETRY_RESET, 0, 0 },
        { "timeout", CFG_RETRY_TIMEOUT, 0, 0 },
        { "5xx", CFG_RETRY_STATUS, 500, 599 },
        { "gateway-error", CFG_RETRY_STATUS, 502, 504 },
        /* gRPC statuses by Envoy's names (x-envoy-retry-grpc-on) */
        { "cancelled", CFG_RETRY_GRPC, 1, 1 },
        { "deadline-exceeded", CFG_RETRY_GRPC, 4, 4 },
        { "resource-exhausted", CFG_RETRY_GRPC, 8, 8 },
        { "internal", CFG_RETRY_GRPC, 13, 13 },
        { "unavailable", CFG_RETRY_GRPC, 14, 14 },
    };
    struct cfg_retry_cond *c = elem;
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    c->token = arena_strdup(w->a, s);
    if (len >= 7 && strncmp(s, "header:", 7) == 0)
        return parse_header_cond(w, at, s, len, c);
    if (len >= 5 && strncmp(s, "grpc:", 5) == 0)
        return parse_grpc_cond(w, at, s, len, c);
    for (size_t i = 0; i < COUNT(named); i++) {
        if (strcmp(s, named[i].name) == 0) {
            c->kind = named[i].kind;
            c->lo = named[i].lo;
            c->hi = named[i].hi;
            return 0;
        }
    }
    const char *dash = memchr(s, '-', len);
    int lo = status_code(s, dash ? (size_t)(dash - s) : len);
    int hi = dash ? status_code(dash + 1, len - (size_t)(dash - s) - 1) : lo;
    if (lo < 0 || hi < 0) {
        const char *near = suggest(s, retry_on_names, COUNT(retry_on_names));
        if (near)
            err_at(w, at, "unknown retry_on condition \"%s\"; did you mean \"%s\"?", s, near);
        else
            err_at(w, at,
                   "unknown retry_on condition \"%s\" (expected %s, a status such as \"429\", "
                   "a range such as \"500-599\", \"header:NAME\" or \"grpc:N\")",
                   s, join(&w->tmp, retry_on_names, COUNT(retry_on_names)));
        return -1;
    }
    if (lo < 100 || lo > 599 || hi < 100 || hi > 599) {
        err_at(w, at, "status %d is out of range: status codes are 100 to 599",
               lo < 100 || lo > 599 ? lo : hi);
        return -1;
    }
    if (lo > hi) {
        err_at(w, at, "range \"%s\" runs backwards; write \"%d-%d\"", s, hi, lo);
        return -1;
    }
    c->kind = CFG_RETRY_STATUS;
    c->lo = (uint16_t)lo;
    c->hi = (uint16_t)hi;
    return 0;
}

static const struct list_kind retry_on_list =
    STRING_LIST("an array of conditions", "a condition as a string (\"429\", not 429)",
                struct cfg_retry_cond, token, parse_retry_cond);

/* An upstream base URL: http(s)://authority[/path], no credentials, query or fragment. */
static int parse_upstream(struct walk *w, const struct at *at, const json_t *v, void *elem)
{
    struct cfg_upstream *u = elem;
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c == 0x7f) {
            err_at(w, at, "must not hold whitespace or control characters (at byte %zu)", i + 1);
            return -1;
        }
        if (c >= 0x80) {
            err_at(w, at, "must be ASCII (percent-encode other characters; at byte %zu)", i + 1);
            return -1;
        }
    }
    static const char *const schemes[] = {
        [CFG_PROTO_HTTP] = "http", [CFG_PROTO_HTTPS] = "https", [CFG_PROTO_H2C] = "h2c"
    };
    size_t skip = 0;
    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]) && !skip; i++) {
        size_t sl = strlen(schemes[i]);
        if (len >= sl + 3 && strncasecmp(s, schemes[i], sl) == 0 && memcmp(s + sl, "://", 3) == 0) {
            u->proto = (enum cfg_upstream_proto)i;
            skip = sl + 3;
        }
    }
    if (!skip) {
        err_at(w, at, "must start with http://, https:// or h2c:// (HTTP/2 over cleartext)");
        return -1;
    }
    u->https = u->proto == CFG_PROTO_HTTPS;
    const char *auth = s + skip;
    size_t rest = len - skip;
    const char *slash = memchr(auth, '/', rest);
    size_t alen = slash ? (size_t)(slash - auth) : rest;
    if (memchr(s, '?', len) || memchr(s, '#', len)) {
        err_at(w, at, "must not hold a query ('?') or fragment ('#'): it is a base URL");
        return -1;
    }
    if (memchr(auth, '@', alen)) {
        err_at(w, at, "must not hold credentials (user@host)");
        return -1;
    }
    const char *port = alen && auth[0] != '[' ? memchr(auth, ':', alen) : NULL;
    if (port && !valid_port(port + 1, alen - (size_t)(port + 1 - auth), 0)) {
        err_at(w, at, "has an invalid port \"%.*s\" (1 to 65535)",
               (int)(alen - (size_t)(port + 1 - auth)), port + 1);
        return -1;
    }
    if (alen == 0 || !valid_authority(auth, alen, 0, 0)) {
        err_at(w, at, "has no valid host[:port] after the scheme");
        return -1;
    }
    size_t plen = slash ? rest - alen : 0;
    while (plen > 0 && slash[plen - 1] == '/')
        plen--;
    u->url = arena_strndup(w->a, s, len);
    u->authority = arena_strndup(w->a, auth, alen);
    u->origin = arena_printf(w->a, "%s://%.*s/", schemes[u->proto], (int)alen, auth);
    u->base_path = arena_strndup(w->a, slash ? slash : "", plen);
    return 0;
}

static const struct list_kind upstream_list =
    STRING_LIST("an array of URLs", "a URL string", struct cfg_upstream, url, parse_upstream);

/* An upgrade token a route tunnels (docs/upgrades.md): an RFC 9110 token, without a version;
 * compared without regard to case. "h2c" is refused: HTTP/2 arrives by prior knowledge, never
 * by an Upgrade (RFC 9113 3.1). */
static int parse_upgrade(struct walk *w, const struct at *at, const json_t *v, void *elem)
{
    struct cfg_upgrade *u = elem;
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    const char *why = check_name(s, len, 64, "!#$%&'*+-.^_`|~", "must be 1 to 64 characters long",
                                 "must be an upgrade token (letters, digits and !#$%&'*+-.^_`|~, "
                                 "no version)");
    if (!why && len == 3 && strncasecmp(s, "h2c", 3) == 0)
        why = "is not tunnelled: HTTP/2 comes by prior knowledge (docs/upgrades.md)";
    if (why) {
        err_at(w, at, "\"%s\" %s", s, why);
        return -1;
    }
    u->token = arena_strndup(w->a, s, len);
    return 0;
}

static const struct list_kind upgrade_list =
    STRING_LIST("an array of upgrade tokens", "an upgrade token (\"websocket\")",
                struct cfg_upgrade, token, parse_upgrade);

/* ---- cross-field rules ---- */

static const struct origin *origin_of(const struct ctx *x, const char *key)
{
    for (size_t i = 0; i < x->s->n; i++)
        if (strcmp(x->s->fields[i].key, key) == 0)
            return &x->origin[i];
    abort(); /* a rule naming a key its schema lacks is a bug */
}

/* Describes where an inherited value comes from, for messages: "" when written here. */
static const char *provenance(struct walk *w, const struct origin *o)
{
    if (o->layer == 0)
        return "";
    if (o->layer < 0)
        return ", the default";
    return arena_printf(&w->tmp, ", from %s", o->at.path);
}

/* Reports a rule broken by 'blame' together with 'other' (may be NULL) at 'blame's path in
 * this object. When neither value is written in this object itself, both come from
 * "defaults", where the same rule has already been reported. */
static void rule_error(struct walk *w, const struct ctx *x, const char *blame, const char *other,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void rule_error(struct walk *w, const struct ctx *x, const char *blame, const char *other,
                       const char *fmt, ...)
{
    const struct origin *b = origin_of(x, blame), *o = other ? origin_of(x, other) : NULL;
    /* An invalid value (layer -2) was reported already; a rule on it would mislead. */
    if (b->layer == -2 || (o && o->layer == -2))
        return;
    if (b->layer != 0 && (!o || o->layer != 0))
        return;
    const struct jpos_entry *pos = b->layer == 0 ? b->at.pos : o->at.pos;
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    struct at at = { jpos_path_key(&w->tmp, x->path, blame, strlen(blame)), pos };
    err_at(w, &at, "%s", msg);
}

static void check_backoff(struct walk *w, const struct ctx *x, void *dst)
{
    const struct backoff_spec *b = dst;
    const char *pname = backoff_policy_names[b->policy];
    if (b->base_ms == 0 && b->policy != BACKOFF_RANDOM)
        rule_error(w, x, "base_ms", "policy",
                   "must be at least 1 with policy \"%s\" (only \"random\" allows 0), got 0",
                   pname);
    if (b->cap_ms < b->base_ms)
        rule_error(w, x, "cap_ms", "base_ms", "cap_ms (%u%s) must be at least base_ms (%u%s)",
                   b->cap_ms, provenance(w, origin_of(x, "cap_ms")), b->base_ms,
                   provenance(w, origin_of(x, "base_ms")));
    if (b->policy == BACKOFF_DECORRELATED && b->jitter != JITTER_NONE)
        rule_error(w, x, "jitter", "policy",
                   "must be \"none\" with policy \"decorrelated\" (its delays are already "
                   "random), got \"%s\"%s",
                   backoff_jitter_names[b->jitter],
                   origin_of(x, "jitter")->layer < 0 ? " (the default)" : "");
}

static void check_throttle(struct walk *w, const struct ctx *x, void *dst)
{
    const struct throttle_limits *t = dst;
    if (t->k > 0 && t->k < 1)
        rule_error(w, x, "k", "k",
                   "must be 0 (no throttling) or at least 1: below 1 a healthy upstream is "
                   "throttled too, got %g",
                   t->k);
}

/* Hedging starts the next attempt the way a "timeout" retry would: without that token in
 * retry_on it could never start one. */
static void check_retry(struct walk *w, const struct ctx *x, void *dst)
{
    const struct cfg_retry *r = dst;
    bool on_timeout = false;
    for (size_t i = 0; i < r->n_on; i++)
        on_timeout |= r->on[i].kind == CFG_RETRY_TIMEOUT;
    if (r->hedge && !on_timeout)
        rule_error(w, x, "hedge_on_per_try_timeout", "retry_on",
                   "needs \"timeout\" in retry_on: a hedge is the retry of an attempt that "
                   "passed per_try_timeout_ms");
}

/* A client certificate needs its key: in key_file, or in cert_file itself. */
static void check_tls(struct walk *w, const struct ctx *x, void *dst)
{
    const struct cfg_tls *t = dst;
    if (t->key_file && !t->cert_file)
        rule_error(w, x, "key_file", "cert_file",
                   "needs cert_file: the key is of a client certificate");
    else if (t->cert_file && !t->key_file && !pem_has_key(t->cert_file))
        rule_error(w, x, "cert_file", "key_file",
                   "holds no private key: name the key's file in key_file");
}

static void check_route(struct walk *w, const struct ctx *x, void *dst)
{
    const struct cfg_route *r = dst;
    if (r->retry.hedge && r->per_try_timeout_ms == 0)
        rule_error(w, x, "per_try_timeout_ms", "retry",
                   "must be above 0 with retry.hedge_on_per_try_timeout: hedging starts the next "
                   "attempt when an attempt passes it");
    if (r->per_try_timeout_ms > r->timeout_ms)
        rule_error(w, x, "per_try_timeout_ms", "timeout_ms",
                   "per_try_timeout_ms (%u%s) must not exceed timeout_ms (%u%s)",
                   r->per_try_timeout_ms, provenance(w, origin_of(x, "per_try_timeout_ms")),
                   r->timeout_ms, provenance(w, origin_of(x, "timeout_ms")));
}

/* ---- the table ---- */

#define UINT_FIELD_F(k, T, member, fl, lo, hi, d, text)                                            \
    {                                                                                              \
        .key = k, .type = FT_UINT, .flags = fl, .offset = offsetof(T, member),                     \
        .size = sizeof(((T *)0)->member), .min = lo, .max = hi, .def = d, .doc = text              \
    }
#define UINT_FIELD(k, T, member, lo, hi, d, text) UINT_FIELD_F(k, T, member, 0, lo, hi, d, text)
#define NUM_FIELD(k, T, member, lo, hi, d, text)                                                   \
    {                                                                                              \
        .key = k, .type = FT_NUMBER, .offset = offsetof(T, member), .min = lo, .max = hi,          \
        .def = d, .doc = text                                                                      \
    }
#define STRING_FIELD(k, T, member, fl, check, d, text)                                             \
    {                                                                                              \
        .key = k, .type = FT_STRING, .flags = fl, .offset = offsetof(T, member),                   \
        .check_str = check, .def = d, .doc = text                                                  \
    }
#define BOOL_FIELD(k, T, member, d, text)                                                          \
    {                                                                                              \
        .key = k, .type = FT_BOOL, .offset = offsetof(T, member), .def = d, .doc = text            \
    }
#define ENUM_FIELD(k, T, member, table, d, text)                                                   \
    {                                                                                              \
        .key = k, .type = FT_ENUM, .offset = offsetof(T, member), .names = table,                  \
        .n_names = COUNT(table), .def = d, .doc = text                                             \
    }
#define OBJ_FIELD(k, T, member, sch, fl, text)                                                     \
    {                                                                                              \
        .key = k, .type = FT_OBJECT, .flags = fl, .offset = offsetof(T, member), .sub = &sch,      \
        .doc = text                                                                                \
    }

/* A list kept as an array and its count, members 'member' and 'count' of T. */
#define LIST_FIELD(k, T, member, count, kind_, fl, why_empty, d, text)                             \
    {                                                                                              \
        .key = k, .type = FT_LIST, .flags = fl, .offset = offsetof(T, member),                     \
        .count_offset = offsetof(T, count), .list = &kind_, .empty = why_empty, .def = d,          \
        .doc = text                                                                                \
    }
/* A list of a kind of bits, kept as their union in the uint32_t 'member' of T. */
#define SET_FIELD(k, T, member, kind_, fl, why_empty, d, text)                                     \
    {                                                                                              \
        .key = k, .type = FT_LIST, .flags = fl, .offset = offsetof(T, member), .list = &kind_,     \
        .empty = why_empty, .def = d, .doc = text                                                  \
    }

/* An object's keys: the rows of 'fields' and the rule 'check' (NULL: none) across them. */
#define SCHEMA(fields, check)                                                                      \
    {                                                                                              \
        fields, COUNT(fields), check                                                               \
    }

/* An object whose keys are stored in the enclosing struct itself (its fields' offsets are
 * relative to that struct). */
#define INLINE_OBJ(k, sch, text)                                                                   \
    {                                                                                              \
        .key = k, .type = FT_OBJECT, .offset = 0, .sub = &sch, .doc = text                         \
    }

static const char *const log_level_names[] = { "debug", "info", "warn", "error" };
static const char *const log_format_names[] = { "json", "text" };
static const char *const underscores_names[] = { "drop", "reject", "allow" };
static const char *const http2_names[] = {
    [CFG_HTTP2_AUTO] = "auto", [CFG_HTTP2_OFF] = "off", [CFG_HTTP2_REQUIRED] = "required"
};

const char *cfg_log_level_name(enum cfg_log_level level)
{
    return (size_t)level < COUNT(log_level_names) ? log_level_names[level] : "";
}

const char *cfg_log_format_name(enum cfg_log_format format)
{
    return (size_t)format < COUNT(log_format_names) ? log_format_names[format] : "";
}

/* A backoff policy's keys, with the defaults of where it is used: retry.backoff (the delay
 * before each retry) and ejection.backoff (how long each ejection lasts). */
#define BACKOFF_FIELDS(base_default, cap_default, jitter_default)                                  \
    ENUM_FIELD("policy", struct backoff_spec, policy, backoff_policy_names, "\"exponential\"",     \
               "how the delay grows: fixed, random, fibonacci, exponential or decorrelated"),      \
        UINT_FIELD("base_ms", struct backoff_spec, base_ms, 0, MS_MAX, base_default,               \
                   "the first delay (at least 1, except for the random policy)"),                  \
        UINT_FIELD("cap_ms", struct backoff_spec, cap_ms, 0, MS_MAX, cap_default,                  \
                   "hard limit on every delay, jitter included; at least base_ms"),                \
        NUM_FIELD("factor", struct backoff_spec, factor, 1.0, 100.0, "2.0",                        \
                  "growth factor of the exponential policy"),                                      \
        UINT_FIELD("steps", struct backoff_spec, steps, 0, 1000, "0",                              \
                   "0: keep growing; N: stop growing after N retries (Kubernetes Steps)"),         \
        ENUM_FIELD("jitter", struct backoff_spec, jitter, backoff_jitter_names, jitter_default,    \
                   "none, full, equal, proportional, additive, bounded or constant; decorrelated " \
                   "needs none"),                                                                  \
        NUM_FIELD("jitter_ratio", struct backoff_spec, jitter_ratio, 0.0, 1.0, "0.2",              \
                  "spread of the proportional and additive jitter"),                               \
        UINT_FIELD("jitter_ms", struct backoff_spec, jitter_ms, 0, MS_MAX, "0",                    \
                   "spread of the constant jitter")

static const struct field backoff_fields[] = {
    BACKOFF_FIELDS("100", "10000", "\"full\""),
    ENUM_FIELD("scope", struct backoff_spec, scope, backoff_scope_names, "\"request\"",
               "request: a sequence per request; route: one sequence shared by the route, moved by "
               "each retry taken"),
    UINT_FIELD("reset_after_ms", struct backoff_spec, reset_after_ms, 0, MS_MAX, "0",
               "scope route: restart the sequence after this long without a retry (0: never)"),
};
static const struct schema backoff_schema = SCHEMA(backoff_fields, check_backoff);

/* ejection.backoff: the same policy without scope (every upstream has its own sequence) and
 * reset_after_ms (ejection's own); the n-th ejection lasts the n-th delay. */
static const struct field ejection_backoff_fields[] = {
    BACKOFF_FIELDS("1000", "30000", "\"none\""),
};
static const struct schema ejection_backoff_schema = SCHEMA(ejection_backoff_fields, check_backoff);

/* ejection's keys land in struct cfg_ejection, the policy's spec in its 'health'. */
static const struct field ejection_fields[] = {
    UINT_FIELD("consecutive_failures", struct cfg_ejection, health.consecutive_failures, 0, 1000,
               "0",
               "failures in a row that eject an upstream from the route's rotation (0: never, "
               "every upstream stays in turn)"),
    LIST_FIELD("on", struct cfg_ejection, on, n_on, retry_on_list, 0,
               "must name at least one condition (set consecutive_failures to 0 to turn "
               "ejection off)",
               "[\"connect-failure\", \"reset\", \"timeout\", \"5xx\"]",
               "what counts as a failure, as retry_on tokens; any other outcome is a success"),
    OBJ_FIELD("backoff", struct cfg_ejection, health.backoff, ejection_backoff_schema, 0,
              "how long each ejection lasts: the n-th ejection in a row lasts the n-th delay of "
              "this policy (docs/backoff.md)"),
    UINT_FIELD("reset_after_ms", struct cfg_ejection, health.reset_after_ms, 0, MS_MAX, "60000",
               "after this long healthy (no failure, not ejected) the next ejection is the first "
               "again (0: never)"),
};
static const struct schema ejection_schema = SCHEMA(ejection_fields, NULL);

static const struct field retry_after_fields[] = {
    BOOL_FIELD("honor", struct cfg_retry, retry_after_honor, "true",
               "a Retry-After on a retryable response replaces the computed delay"),
    UINT_FIELD("max_ms", struct cfg_retry, retry_after_max_ms, 0, MS_MAX, "30000",
               "a longer Retry-After ends retrying and returns the response"),
};
/* retry_after's two keys land directly in struct cfg_retry. */
static const struct schema retry_after_schema = SCHEMA(retry_after_fields, NULL);

static const struct field retry_fields[] = {
    UINT_FIELD("max_attempts", struct cfg_retry, max_attempts, 1, 100, "3",
               "attempts in total, the first included (1 disables retries)"),
    LIST_FIELD("retry_on", struct cfg_retry, on, n_on, retry_on_list, 0, NULL,
               "[\"connect-failure\", \"reset\", \"timeout\", \"gateway-error\", \"429\"]",
               "connect-failure, reset, timeout, 5xx, gateway-error, a status (\"429\"), a "
               "range (\"500-599\"), a response header (\"header:NAME\", "
               "\"header:NAME=VALUE\"), or on gRPC calls a gRPC status: cancelled, "
               "deadline-exceeded, resource-exhausted, internal, unavailable, \"grpc:N\", "
               "\"grpc:N-M\" (docs/grpc.md)"),
    SET_FIELD("methods", struct cfg_retry, methods, method_list, 0, NULL,
              "[\"GET\", \"HEAD\", \"OPTIONS\", \"PUT\", \"DELETE\", \"TRACE\"]",
              "methods retried once bytes reached the upstream (connect-failure retries every "
              "method)"),
    BOOL_FIELD("idempotency_key", struct cfg_retry, idempotency_key, "true",
               "a request with an Idempotency-Key header is retryable whatever its method"),
    UINT_FIELD("max_retry_body_bytes", struct cfg_retry, max_retry_body_bytes, 0, 1073741824.0,
               "1048576",
               "larger request bodies are streamed once and never retried (held in memory "
               "up to this size)"),
    INLINE_OBJ("retry_after", retry_after_schema, "how Retry-After is honoured"),
    STRING_FIELD("pushback_header", struct cfg_retry, pushback_header, F_NULLABLE, check_field_name,
                 "null",
                 "a response header that steers the retry (gRPC's grpc-retry-pushback-ms): a "
                 "whole number of milliseconds is the next wait, anything else stops retrying "
                 "(null: none)"),
    BOOL_FIELD("hedge_on_per_try_timeout", struct cfg_retry, hedge, "false",
               "an attempt that passes per_try_timeout_ms is not cancelled: the next attempt "
               "starts beside it and the first response retry_on does not name wins (Envoy's "
               "hedging)"),
    UINT_FIELD("grpc_hold_ms", struct cfg_retry, grpc_hold_ms, 0, MS_MAX, "500",
               "on a gRPC call whose retry_on names a gRPC status, how long the first message of a "
               "response is held back for the status in its trailers: then it goes to the client "
               "and the call is never retried (0: never held; docs/grpc.md)"),
    OBJ_FIELD("backoff", struct cfg_retry, backoff, backoff_schema, 0,
              "the delay before each retry (docs/backoff.md)"),
};
static const struct schema retry_schema = SCHEMA(retry_fields, check_retry);

/* The process-wide and per-route budgets differ only in the default concurrency cap. */
#define BUDGET_FIELDS(max_concurrent_default)                                                      \
    { .key = "max_concurrent_retries",                                                             \
      .type = FT_UINT,                                                                             \
      .flags = F_NULLABLE,                                                                         \
      .offset = offsetof(struct budget_limits, max_concurrent_retries),                            \
      .size = sizeof(int64_t),                                                                     \
      .min = 0,                                                                                    \
      .max = 1000000000.0,                                                                         \
      .def = max_concurrent_default,                                                               \
      .doc = "retries in flight at once, backoff waits included (null: no cap)" },                 \
        NUM_FIELD("retry_ratio", struct budget_limits, retry_ratio, 0.0, NO_MAX, "0.2",            \
                  "retries allowed per first attempt over the window"),                            \
        NUM_FIELD("min_retries_per_second", struct budget_limits, min_retries_per_second, 0.0,     \
                  NO_MAX, "10", "retries always allowed per second of window"),                    \
        UINT_FIELD("window_ms", struct budget_limits, window_ms, 1, MS_MAX, "10000",               \
                   "the sliding window of the ratio budget")

static const struct field top_budget_fields[] = { BUDGET_FIELDS("100") };
static const struct schema top_budget_schema = SCHEMA(top_budget_fields, NULL);
static const struct field route_budget_fields[] = { BUDGET_FIELDS("null") };
static const struct schema route_budget_schema = SCHEMA(route_budget_fields, NULL);

static const struct field throttle_fields[] = {
    NUM_FIELD("k", struct throttle_limits, k, 0, 100, "0",
              "throttle when attempts exceed k times those the upstream accepts: reject locally "
              "with probability (requests - k * accepts) / (requests + 1) (0: never; the SRE "
              "book uses 2)"),
    UINT_FIELD("window_ms", struct throttle_limits, window_ms, 1, MS_MAX, "120000",
               "the sliding window the requests and accepts are counted over"),
};
static const struct schema throttle_schema = SCHEMA(throttle_fields, check_throttle);

static const struct field tls_fields[] = {
    STRING_FIELD("ca_file", struct cfg_tls, ca_file, F_NULLABLE, check_ca_file, "null",
                 "a file of PEM certificates that https upstreams' certificates are verified "
                 "against, instead of the system's store (null: the system's store)"),
    STRING_FIELD("cert_file", struct cfg_tls, cert_file, F_NULLABLE, check_cert_file, "null",
                 "a PEM file of the client certificate (and its chain) the proxy presents to "
                 "https upstreams that ask for one, mutual TLS (null: none)"),
    STRING_FIELD("key_file", struct cfg_tls, key_file, F_NULLABLE, check_key_file, "null",
                 "a PEM file of cert_file's private key, unencrypted (null: cert_file holds it)"),
    STRING_FIELD("server_name", struct cfg_tls, server_name, F_NULLABLE, check_server_name, "null",
                 "the name sent in SNI and verified against the upstream's certificate, "
                 "instead of the URL's host; connections still go to the URL's host, and Host "
                 "is unchanged (null: the URL's host)"),
    ENUM_FIELD("http2", struct cfg_tls, http2, http2_names, "\"auto\"",
               "auto: offer h2 and http/1.1 by ALPN and speak what the upstream chooses; off: "
               "HTTP/1.1 only; required: h2 only, an upstream that does not choose it is a "
               "connect failure (docs/http2.md)"),
};
static const struct schema tls_schema = SCHEMA(tls_fields, check_tls);

/* match's keys land directly in struct cfg_route. */
static const struct field match_fields[] = {
    STRING_FIELD("path_prefix", struct cfg_route, match_path_prefix, 0, check_path_prefix, "\"/\"",
                 "requests whose path starts with this"),
    { .key = "host",
      .type = FT_CUSTOM,
      .flags = F_NULLABLE,
      .offset = offsetof(struct cfg_route, match_host),
      .def = "null",
      .parse = parse_match_host,
      .dump = dump_string_or_null,
      .type_doc = "string or null",
      .doc = "the Host header, compared without its port unless this holds one (null: any)" },
    SET_FIELD("methods", struct cfg_route, match_methods, method_list, F_NULLABLE,
              "must not be empty (leave the key out to match every method)", "null",
              "request methods (null: any)"),
};
static const struct schema match_schema = SCHEMA(match_fields, NULL);

static const struct field route_fields[] = {
    STRING_FIELD("name", struct cfg_route, name, F_REQUIRED | F_ROUTE_ONLY, check_route_name, NULL,
                 "unique name, used in metrics, logs and /schedule"),
    { .key = "match",
      .type = FT_OBJECT,
      .flags = F_ROUTE_ONLY,
      .offset = 0, /* inline: match's keys live in struct cfg_route */
      .sub = &match_schema,
      .doc = "which requests the route takes (first match in file order wins)" },
    LIST_FIELD("upstreams", struct cfg_route, upstreams, n_upstreams, upstream_list,
               F_REQUIRED | F_ROUTE_ONLY, "must hold at least one upstream URL", NULL,
               "http://, https:// or h2c:// (HTTP/2 over cleartext, docs/http2.md) base URLs, "
               "tried round-robin"),
    OBJ_FIELD("ejection", struct cfg_route, ejection, ejection_schema, 0,
              "upstream health: an upstream that keeps failing leaves the rotation for a while "
              "(docs/forwarding.md)"),
    BOOL_FIELD("preserve_host", struct cfg_route, preserve_host, "false",
               "send the client's Host instead of the upstream's authority"),
    UINT_FIELD("timeout_ms", struct cfg_route, timeout_ms, 1, MS_MAX, "15000",
               "the whole request: every attempt and backoff wait"),
    UINT_FIELD("per_try_timeout_ms", struct cfg_route, per_try_timeout_ms, 0, MS_MAX, "0",
               "one attempt until its response headers (0: only timeout_ms)"),
    UINT_FIELD("connect_timeout_ms", struct cfg_route, connect_timeout_ms, 0, MS_MAX, "1000",
               "establishing one upstream connection (0: no separate limit)"),
    STRING_FIELD("deadline_header", struct cfg_route, deadline_header, F_NULLABLE,
                 check_header_name, "null",
                 "a header sent with each attempt: the milliseconds the proxy will still wait "
                 "for its answer (null: none)"),
    OBJ_FIELD("retry", struct cfg_route, retry, retry_schema, 0, "when and how to retry"),
    OBJ_FIELD("budget", struct cfg_route, budget, route_budget_schema, 0,
              "this route's retry budget, checked as well as the process-wide one"),
    OBJ_FIELD("throttle", struct cfg_route, throttle, throttle_schema, 0,
              "client-side throttling: fewer attempts to an upstream that keeps failing"),
    OBJ_FIELD("tls", struct cfg_route, tls, tls_schema, 0,
              "how https upstreams are reached: the certificates trusted, the client "
              "certificate, the name verified, and HTTP/2 by ALPN"),
    LIST_FIELD("upgrades", struct cfg_route, upgrades, n_upgrades, upgrade_list, 0, NULL,
               "[\"websocket\"]",
               "HTTP/1.1 upgrade tokens tunnelled to the upstream once it answers 101 (any case; "
               "[]: none); a request for another is answered 501 (docs/upgrades.md)"),
};
static const struct schema route_schema = SCHEMA(route_fields, check_route);

static const struct field log_fields[] = {
    ENUM_FIELD("level", struct cfg, log_level, log_level_names, "\"info\"",
               "debug, info, warn or error"),
    ENUM_FIELD("format", struct cfg, log_format, log_format_names, "\"json\"",
               "json (one object per line) or text"),
};
static const struct schema log_schema = SCHEMA(log_fields, NULL);

static const struct field limits_fields[] = {
    UINT_FIELD_F("max_connections", struct cfg, max_connections, F_RESTART, 1, 1000000, "10000",
                 "client connections open at once"),
    UINT_FIELD("connection_timeout_ms", struct cfg, connection_timeout_ms, 0, MS_MAX, "30000",
               "an idle or slow client connection is closed after this, counted in whole "
               "seconds rounded up (0: never)"),
    UINT_FIELD("send_buffer_bytes", struct cfg, send_buffer_bytes, 0, 16777216, "262144",
               "the kernel's send buffer of each new client connection (SO_SNDBUF, at most "
               "net.core.wmem_max), so that a client reading slowly cannot queue megabytes of "
               "responses in the kernel (0: the kernel's own sizing, up to 4 MiB a connection)"),
    UINT_FIELD("max_body_bytes", struct cfg, max_body_bytes, 0, 1099511627776.0, "67108864",
               "larger request bodies are answered 413"),
    UINT_FIELD("max_buffered_body_bytes", struct cfg, max_buffered_body_bytes, 0, 1099511627776.0,
               "134217728",
               "request-body bytes held for replay by the whole process; a body that does not "
               "fit streams to the upstream once and is not retried"),
    UINT_FIELD_F("max_header_bytes", struct cfg, max_header_bytes, F_RESTART, 1024, 65536, "8192",
                 "a request line and headers above this many bytes are answered 431; a client "
                 "connection holds up to twice this in memory"),
    UINT_FIELD("max_upstream_requests", struct cfg, max_upstream_requests, 1, 1000000, "1024",
               "upstream attempts in flight at once, shared evenly by the workers; more wait "
               "their turn in order, the wait counting against the route's timeout_ms. A "
               "transfer going at its client's pace holds none: a response streaming to the "
               "client, a body streamed once (docs/hardening.md)"),
    UINT_FIELD("upstream_share_percent", struct cfg, upstream_share_percent, 1, 100, "75",
               "the most of a worker's max_upstream_requests the attempts to one upstream "
               "origin hold at once; more wait their turn while attempts to other upstreams go "
               "on, so that a slow upstream cannot take every slot (100: no such bound)"),
    UINT_FIELD("connection_share_percent", struct cfg, connection_share_percent, 1, 100, "25",
               "the most of a worker's max_upstream_requests the attempts of one client "
               "connection (its HTTP/2 streams) hold at once; more wait their turn (100: no "
               "such bound)"),
    UINT_FIELD("header_timeout_ms", struct cfg, header_timeout_ms, 0, MS_MAX, "10000",
               "a request line and headers not complete this long after their first byte are "
               "answered 408 and the connection closed (0: no limit beyond "
               "connection_timeout_ms)"),
    ENUM_FIELD("headers_with_underscores", struct cfg, headers_with_underscores, underscores_names,
               "\"drop\"",
               "a request header whose name has an underscore (X_Forwarded_Proto), which CGI and "
               "WSGI upstreams merge with the dashed name the proxy sets: drop (not forwarded), "
               "reject (a 400 naming it) or allow (forwarded)"),
    UINT_FIELD("tunnel_idle_timeout_ms", struct cfg, tunnel_idle_timeout_ms, 0, MS_MAX, "300000",
               "an upgraded connection (a WebSocket) with no byte either way this long is closed "
               "(0: never; docs/upgrades.md)"),
    UINT_FIELD("max_tunnels", struct cfg, max_tunnels, 0, 1000000, "10000",
               "upgraded connections open at once in the process; an upgrade past it is answered "
               "503 (docs/upgrades.md)"),
};
static const struct schema limits_schema = SCHEMA(limits_fields, NULL);

static int parse_route(struct walk *w, const struct at *at, const json_t *v, void *elem);
static json_t *dump_route(const void *elem);

static void route_twice(struct walk *w, const struct at *at, const char *name, size_t first)
{
    struct at name_at = child_at(w, at->path, "name");
    err_at(w, &name_at, "duplicate route name \"%s\" (also $.routes[%zu].name)", name, first);
}

/* Each route is walked over "defaults"; its problems are its own, so two routes are compared
 * by name whatever else is wrong with them. */
static const struct list_kind route_list = {
    .array_doc = "an array of routes",
    .elem_doc = "a route object",
    .elem_type = JSON_OBJECT,
    .sub = &route_schema,
    .size = sizeof(struct cfg_route),
    .key_offset = offsetof(struct cfg_route, name),
    .parse = parse_route,
    .twice = route_twice,
    .dump = dump_route,
};

static int parse_defaults(struct walk *w, const struct at *at, const json_t *v, void *dst);
static json_t *dump_defaults(const void *src);

static const struct field root_fields[] = {
    STRING_FIELD("listen", struct cfg, listen, F_RESTART, check_listen, "\"127.0.0.1:15001\"",
                 "address of the proxy listener"),
    STRING_FIELD("admin", struct cfg, admin, F_RESTART, check_listen, "\"127.0.0.1:15000\"",
                 "address of the admin listener"),
    INLINE_OBJ("log", log_schema, "request and reload logs"),
    UINT_FIELD("drain_timeout_ms", struct cfg, drain_timeout_ms, 0, MS_MAX, "10000",
               "how long requests in flight may finish after SIGTERM"),
    INLINE_OBJ("limits", limits_schema, "client-side limits"),
    OBJ_FIELD("budget", struct cfg, budget, top_budget_schema, 0, "the process-wide retry budget"),
    { .key = "defaults",
      .type = FT_CUSTOM,
      .offset = 0,
      .parse = parse_defaults,
      .dump = dump_defaults,
      .type_doc = "object",
      .doc = "values every route inherits: any route key except name, match and upstreams" },
    LIST_FIELD("routes", struct cfg, routes, n_routes, route_list, F_REQUIRED,
               "must hold at least one route", NULL, "at least one route"),
};
static const struct schema root_schema = SCHEMA(root_fields, NULL);

/* ---- the walker ---- */

static const struct field *find_field(const struct schema *s, const char *key)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->fields[i].key, key) == 0)
            return &s->fields[i];
    return NULL;
}

static const char *type_name(const struct field *f)
{
    switch (f->type) {
    case FT_OBJECT:
        return "an object";
    case FT_BOOL:
        return "true or false";
    case FT_UINT:
        return f->flags & F_NULLABLE ? "an integer or null" : "an integer";
    case FT_NUMBER:
        return "a number";
    case FT_ENUM:
    case FT_STRING:
        return f->flags & F_NULLABLE ? "a string or null" : "a string";
    case FT_LIST:
        return f->list->array_doc;
    case FT_CUSTOM:
        return f->type_doc;
    }
    return "a value";
}

static void range_error(struct walk *w, const struct at *at, const struct field *f, const char *got)
{
    if (f->max >= NO_MAX)
        err_at(w, at, "must be at least %g, got %s", f->min, got);
    else
        err_at(w, at, "must be %s %.15g to %.15g, got %s",
               f->type == FT_UINT ? "an integer from" : "from", f->min, f->max, got);
}

/* Converts one written (or default) value and stores it in the object 'obj'. 0, or -1 after
 * reporting. */
static int set_value(struct walk *w, const struct field *f, const struct at *at, const json_t *v,
                     void *obj)
{
    void *p = (char *)obj + f->offset;
    char got[64];
    switch (f->type) {
    case FT_BOOL:
        if (!json_is_boolean(v))
            break;
        *(bool *)p = json_is_true(v);
        return 0;
    case FT_UINT: {
        if (json_is_null(v) && (f->flags & F_NULLABLE)) {
            *(int64_t *)p = -1;
            return 0;
        }
        if (!json_is_integer(v))
            break;
        json_int_t n = json_integer_value(v);
        if ((double)n < f->min || (double)n > f->max) {
            snprintf(got, sizeof(got), "%" JSON_INTEGER_FORMAT, n);
            range_error(w, at, f, got);
            return -1;
        }
        if (f->size == sizeof(uint32_t))
            *(uint32_t *)p = (uint32_t)n;
        else
            *(uint64_t *)p = (uint64_t)n;
        return 0;
    }
    case FT_NUMBER: {
        if (!json_is_number(v))
            break;
        double d = json_number_value(v);
        if (d < f->min || d > f->max) {
            snprintf(got, sizeof(got), "%.15g", d);
            range_error(w, at, f, got);
            return -1;
        }
        *(double *)p = d;
        return 0;
    }
    case FT_ENUM: {
        if (!json_is_string(v))
            break;
        const char *s = json_string_value(v);
        for (size_t i = 0; i < f->n_names; i++) {
            if (strcmp(s, f->names[i]) == 0) {
                *(int *)p = (int)i;
                return 0;
            }
        }
        const char *near = suggest(s, f->names, f->n_names);
        if (near)
            err_at(w, at, "unknown %s \"%s\"; did you mean \"%s\"?", f->key, s, near);
        else
            err_at(w, at, "unknown %s \"%s\" (expected one of: %s)", f->key, s,
                   join(&w->tmp, f->names, f->n_names));
        return -1;
    }
    case FT_STRING: {
        if (json_is_null(v) && (f->flags & F_NULLABLE)) {
            *(const char **)p = NULL;
            return 0;
        }
        if (!json_is_string(v))
            break;
        const char *s = json_string_value(v);
        size_t len = json_string_length(v);
        const char *why = f->check_str ? f->check_str(s, len) : NULL;
        if (why) {
            if (len <= 60 && !has_ctl_or_space(s, len))
                err_at(w, at, "%s, got \"%s\"", why, s);
            else
                err_at(w, at, "%s", why);
            return -1;
        }
        *(const char **)p = arena_strndup(w->a, s, len);
        return 0;
    }
    case FT_LIST:
        return parse_list(w, f, at, v, obj);
    case FT_CUSTOM:
        return f->parse(w, at, v, p);
    case FT_OBJECT:
        break;
    }
    err_at(w, at, "expected %s, got %s", type_name(f), kind(v));
    return -1;
}

/* A default from the table goes through set_value like a written one. The defaults are
 * valid (every test that loads a config applies them), so a default that fails here means
 * jansson ran out of memory reading it: an error for this load, not a crash. */
static void set_default(struct walk *w, const struct field *f, const struct at *at, void *obj)
{
    json_error_t jerr;
    json_t *v = json_loads(f->def, JSON_DECODE_ANY, &jerr);
    size_t before = w->errs->n;
    if (!v || set_value(w, f, at, v, obj) < 0 || w->errs->n != before)
        err_at(w, at, "could not apply the default %s (out of memory?)", f->def);
    json_decref(v);
}

static void walk_object(struct walk *w, struct ctx *x, void *dst);

static void check_keys(struct walk *w, const struct ctx *x)
{
    for (int l = 0; l < 2; l++) {
        if (!x->layer[l])
            continue;
        bool in_defaults = x->in_defaults || l == 1;
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)x->layer[l], key, val)
        {
            const struct field *f = find_field(x->s, key);
            if (f && !(in_defaults && (f->flags & F_ROUTE_ONLY)))
                continue;
            const char *path = jpos_path_key(&w->tmp, x->layer_path[l], key, strlen(key));
            const struct jpos_entry *e = find_pos(w, path);
            uint32_t line = e ? e->key_line : 0, col = e ? e->key_col : 0;
            if (f) {
                cfg_errs_add(w->errs, path, line, col,
                             "\"%s\" is not allowed in defaults: set it in each route", key);
                continue;
            }
            const char *names[MAX_FIELDS];
            for (size_t i = 0; i < x->s->n; i++)
                names[i] = x->s->fields[i].key;
            const char *near = suggest(key, names, x->s->n);
            if (near)
                cfg_errs_add(w->errs, path, line, col, "unknown key \"%s\"; did you mean \"%s\"?",
                             key, near);
            else
                cfg_errs_add(w->errs, path, line, col, "unknown key \"%s\" (expected one of: %s)",
                             key, join(&w->tmp, names, x->s->n));
        }
    }
}

/* The value of 'f' in layer 'l' of 'x', or NULL: not written there, or a route-only key where
 * it is not taken ("defaults" and what it holds). */
static const json_t *layer_value(const struct ctx *x, const struct field *f, int l)
{
    if (!x->layer[l] || ((f->flags & F_ROUTE_ONLY) && (l == 1 || x->in_defaults)))
        return NULL;
    return json_object_get(x->layer[l], f->key);
}

static void walk_field(struct walk *w, struct ctx *x, size_t i, void *dst)
{
    const struct field *f = &x->s->fields[i];
    void *p = (char *)dst + f->offset;
    struct origin *o = &x->origin[i];

    o->layer = -1;
    o->at.path = jpos_path_key(&w->tmp, x->path, f->key, strlen(f->key));
    o->at.pos = NULL;

    if (f->type == FT_OBJECT) {
        struct ctx sub = { .s = f->sub, .path = o->at.path, .in_defaults = x->in_defaults };
        for (int l = 0; l < 2; l++) {
            const json_t *v = layer_value(x, f, l);
            if (!v)
                continue;
            struct at at = child_at(w, x->layer_path[l], f->key);
            if (!json_is_object(v)) {
                err_at(w, &at, "expected an object, got %s", kind(v));
                continue;
            }
            sub.layer[l] = v;
            sub.layer_path[l] = at.path;
            if (o->layer < 0) {
                o->layer = l;
                o->at = at;
            }
            if (l == 0)
                sub.pos = at.pos;
        }
        walk_object(w, &sub, p);
        return;
    }

    for (int l = 0; l < 2; l++) {
        const json_t *v = layer_value(x, f, l);
        if (!v)
            continue;
        o->layer = l;
        o->at = child_at(w, x->layer_path[l], f->key);
        if (o->at.pos && o->at.pos->bad) {
            o->layer = -2; /* an unrepresentable number, reported by the scanner */
            return;
        }
        if (set_value(w, f, &o->at, v, dst) < 0)
            o->layer = -2;
        return;
    }

    if (f->flags & F_REQUIRED) {
        if (x->in_defaults)
            return; /* route-only: not part of the defaults */
        struct at at = { o->at.path, x->pos };
        err_at(w, &at, "required key \"%s\" is missing", f->key);
        o->layer = -2;
    } else if (f->def) {
        set_default(w, f, &o->at, dst);
    } else if (f->type == FT_CUSTOM) {
        f->parse(w, &o->at, NULL, p);
    }
}

static void walk_object(struct walk *w, struct ctx *x, void *dst)
{
    if (x->s->n > MAX_FIELDS)
        abort();
    check_keys(w, x);
    for (size_t i = 0; i < x->s->n; i++)
        walk_field(w, x, i, dst);
    if (x->s->check)
        x->s->check(w, x, dst);
}

/* Walks the route object 'v' written at 'at' (NULL: not written) into 'dst': a route, over
 * "defaults", or with 'in_defaults' the "defaults" object itself. */
static void walk_route(struct walk *w, const struct at *at, const json_t *v, bool in_defaults,
                       struct cfg_route *dst)
{
    struct ctx x = { .s = &route_schema, .path = at->path, .in_defaults = in_defaults };
    if (v) {
        x.layer[0] = v;
        x.layer_path[0] = at->path;
        x.pos = at->pos;
    }
    if (!in_defaults) {
        x.layer[1] = w->defaults;
        x.layer_path[1] = "$.defaults";
    }
    walk_object(w, &x, dst);
}

static int parse_defaults(struct walk *w, const struct at *at, const json_t *v, void *dst)
{
    if (v && !json_is_object(v)) {
        err_at(w, at, "expected an object, got %s", kind(v));
        v = NULL;
    }
    walk_route(w, at, v, true, &((struct cfg *)dst)->defaults);
    return 0;
}

/* Always 0: a route's problems are reported, and its name still counts for duplicates. */
static int parse_route(struct walk *w, const struct at *at, const json_t *v, void *elem)
{
    walk_route(w, at, v, false, elem);
    return 0;
}

void schema_build(struct cfg *c, struct arena *a, const json_t *root, const struct jpos *pos,
                  struct cfg_errs *errs)
{
    struct walk w = { .a = a, .pos = pos, .errs = errs };
    const struct jpos_entry *at_root = jpos_find(pos, "$");

    if (!json_is_object(root)) {
        cfg_errs_add(errs, "$", at_root ? at_root->line : 1, at_root ? at_root->col : 1,
                     "expected a JSON object, got %s", kind(root));
        return;
    }
    const json_t *d = json_object_get(root, "defaults");
    w.defaults = json_is_object(d) ? d : NULL;

    struct ctx x = { .s = &root_schema, .path = "$", .pos = at_root };
    x.layer[0] = root;
    x.layer_path[0] = "$";
    walk_object(&w, &x, c);
    arena_free(&w.tmp);
}

/* ---- the effective config ---- */

static json_t *dump_object(const struct schema *s, const void *src, bool defaults_view);

/* The value of field 'f' of the object 'obj' (new reference). */
static json_t *dump_value(const struct field *f, const void *obj, bool defaults_view)
{
    const void *p = (const char *)obj + f->offset;
    switch (f->type) {
    case FT_OBJECT:
        return dump_object(f->sub, p, defaults_view);
    case FT_BOOL:
        return json_boolean(*(const bool *)p);
    case FT_UINT:
        if (f->size == sizeof(uint32_t))
            return json_integer(*(const uint32_t *)p);
        if ((f->flags & F_NULLABLE) && *(const int64_t *)p < 0)
            return json_null();
        return json_integer((json_int_t) * (const uint64_t *)p);
    case FT_NUMBER:
        return json_real(*(const double *)p);
    case FT_ENUM:
        return json_string(f->names[*(const int *)p]);
    case FT_STRING:
        return dump_string_or_null(p);
    case FT_LIST:
        return dump_list(f, obj);
    case FT_CUSTOM:
        return f->dump(p);
    }
    return NULL;
}

static json_t *dump_object(const struct schema *s, const void *src, bool defaults_view)
{
    json_t *o = json_object();
    for (size_t i = 0; i < s->n; i++) {
        const struct field *f = &s->fields[i];
        if (!(defaults_view && (f->flags & F_ROUTE_ONLY)))
            json_object_set_new(o, f->key, dump_value(f, src, defaults_view));
    }
    return o;
}

static json_t *dump_defaults(const void *src)
{
    return dump_object(&route_schema, &((const struct cfg *)src)->defaults, true);
}

static json_t *dump_route(const void *elem)
{
    return dump_object(&route_schema, elem, false);
}

json_t *schema_dump(const struct cfg *c)
{
    return dump_object(&root_schema, c, false);
}

/* ---- keys read only at start ---- */

/* Calls 'fn' with the path (under 'prefix') of each F_RESTART key of 's' whose value differs
 * between the objects 'was' and 'now'. Returns how many. */
static size_t restart_changes(const struct schema *s, const char *prefix, const void *was,
                              const void *now, void (*fn)(const char *path, void *arg), void *arg)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++) {
        const struct field *f = &s->fields[i];
        char path[160];
        snprintf(path, sizeof(path), "%s%s", prefix, f->key);
        if (f->flags & F_RESTART) {
            /* Compared as they are dumped, so that every type compares alike. A value that
             * cannot be dumped (out of memory) counts as changed: a needless note, not a
             * missed one. */
            json_t *a = dump_value(f, was, false), *b = dump_value(f, now, false);
            if (!a || !b || !json_equal(a, b)) {
                fn(path, arg);
                n++;
            }
            json_decref(a);
            json_decref(b);
        } else if (f->type == FT_OBJECT) {
            char sub[170];
            snprintf(sub, sizeof(sub), "%s.", path);
            n += restart_changes(f->sub, sub, (const char *)was + f->offset,
                                 (const char *)now + f->offset, fn, arg);
        }
    }
    return n;
}

size_t cfg_restart_changes(const struct cfg *was, const struct cfg *now,
                           void (*fn)(const char *path, void *arg), void *arg)
{
    return restart_changes(&root_schema, "", was, now, fn, arg);
}

/* ---- the reference ---- */

static void write_rows(FILE *out, const struct schema *s, const char *prefix)
{
    for (size_t i = 0; i < s->n; i++) {
        const struct field *f = &s->fields[i];
        char path[160], type[160];
        snprintf(path, sizeof(path), "%s%s", prefix, f->key);
        switch (f->type) {
        case FT_UINT:
            if (f->flags & F_NULLABLE)
                snprintf(type, sizeof(type), "integer %.15g to %.15g, or null", f->min, f->max);
            else
                snprintf(type, sizeof(type), "integer %.15g to %.15g", f->min, f->max);
            break;
        case FT_NUMBER:
            if (f->max >= NO_MAX)
                snprintf(type, sizeof(type), "number >= %g", f->min);
            else
                snprintf(type, sizeof(type), "number %g to %g", f->min, f->max);
            break;
        case FT_ENUM: {
            size_t k = (size_t)snprintf(type, sizeof(type), "one of");
            for (size_t j = 0; j < f->n_names && k < sizeof(type); j++)
                k += (size_t)snprintf(type + k, sizeof(type) - k, "%s `%s`", j ? "," : "",
                                      f->names[j]);
            break;
        }
        case FT_BOOL:
            snprintf(type, sizeof(type), "boolean");
            break;
        case FT_STRING:
            snprintf(type, sizeof(type), f->flags & F_NULLABLE ? "string or null" : "string");
            break;
        case FT_OBJECT:
            snprintf(type, sizeof(type), "object");
            break;
        case FT_LIST:
            snprintf(type, sizeof(type), "array of %s%s",
                     f->list->elem_type == JSON_OBJECT ? "objects" : "strings",
                     f->flags & F_NULLABLE ? " or null" : "");
            break;
        case FT_CUSTOM:
            snprintf(type, sizeof(type), "%s", f->type_doc);
            break;
        }
        const char *def = f->flags & F_REQUIRED ? "required" : f->def ? f->def : "";
        /* An object's keys say for themselves when a change to them takes effect. */
        const struct schema *sub = f->type == FT_OBJECT ? f->sub
                                   : f->type == FT_LIST ? f->list->sub
                                                        : NULL;
        const char *when = f->flags & F_RESTART ? "at restart" : sub ? "" : "on reload";
        fprintf(out, "| `%s` | %s | %s%s%s | %s | %s |\n", path, type, *def && f->def ? "`" : "",
                def, *def && f->def ? "`" : "", when, f->doc);
        if (sub) {
            char sub_prefix[170];
            snprintf(sub_prefix, sizeof(sub_prefix), "%s%s", path,
                     f->type == FT_LIST ? "[]." : ".");
            write_rows(out, sub, sub_prefix);
        }
    }
}

void schema_write_reference(FILE *out)
{
    fputs("| key | type | default | takes effect | meaning |\n|---|---|---|---|---|\n", out);
    write_rows(out, &root_schema, "");
}
