/* schema_walk -- the engine that applies the schema table (config/schema.c): the walker that
 * fills a struct cfg from a JSON document (types, bounds, defaults inherited through
 * "defaults", lists, messages with hints), the effective config, the keys read only at start
 * and the Markdown reference. It knows no key by name.
 */
#include "config/schema_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/strhash.h"

/* ---- small helpers ---- */

static const struct jpos_entry *find_pos(struct walk *w, const char *path)
{
    return jpos_find(w->pos, path);
}

void schema_err_at(struct walk *w, const struct at *at, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    uint32_t line = at->pos ? at->pos->line : 0, col = at->pos ? at->pos->col : 0;
    cfg_errs_add(w->errs, at->path, line, col, "%s", msg);
}

const char *schema_kind(const json_t *v)
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
const char *schema_suggest(const char *s, const char *const *names, size_t n)
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

char *schema_join(struct arena *a, const char *const *names, size_t n)
{
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(names[i]) + 2;
    char *s = arena_alloc(a, len), *p = s;
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%s%s", i ? ", " : "", names[i]);
    return s;
}

struct at schema_child_at(struct walk *w, const char *parent, const char *key)
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

int schema_has_ctl_or_space(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c >= 0x7f)
            return 1;
    }
    return 0;
}

json_t *schema_dump_string_or_null(const void *src)
{
    const char *const *s = src;
    return *s ? json_string(*s) : json_null();
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

/* ---- lists (struct list_kind) ---- */

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
            schema_err_at(w, at, "expected %s, got %s", k->array_doc, schema_kind(v));
            return -1;
        }
        n = json_array_size(v);
        if (n == 0 && f->empty) {
            schema_err_at(w, at, "%s", f->empty);
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
            schema_err_at(w, &e_at, "expected %s, got %s", k->elem_doc, schema_kind(e));
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
            schema_err_at(w, &e_at, "\"%s\" is listed twice", key);
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
        schema_err_at(w, at, "must be at least %g, got %s", f->min, got);
    else
        schema_err_at(w, at, "must be %s %.15g to %.15g, got %s",
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
        const char *near = schema_suggest(s, f->names, f->n_names);
        if (near)
            schema_err_at(w, at, "unknown %s \"%s\"; did you mean \"%s\"?", f->key, s, near);
        else
            schema_err_at(w, at, "unknown %s \"%s\" (expected one of: %s)", f->key, s,
                          schema_join(&w->tmp, f->names, f->n_names));
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
            if (len <= 60 && !schema_has_ctl_or_space(s, len) && !(f->flags & F_NO_ECHO))
                schema_err_at(w, at, "%s, got \"%s\"", why, s);
            else
                schema_err_at(w, at, "%s", why);
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
    schema_err_at(w, at, "expected %s, got %s", type_name(f), schema_kind(v));
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
        schema_err_at(w, at, "could not apply the default %s (out of memory?)", f->def);
    json_decref(v);
}

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
            const char *near = schema_suggest(key, names, x->s->n);
            if (near)
                cfg_errs_add(w->errs, path, line, col, "unknown key \"%s\"; did you mean \"%s\"?",
                             key, near);
            else
                cfg_errs_add(w->errs, path, line, col, "unknown key \"%s\" (expected one of: %s)",
                             key, schema_join(&w->tmp, names, x->s->n));
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
            struct at at = schema_child_at(w, x->layer_path[l], f->key);
            if (!json_is_object(v)) {
                schema_err_at(w, &at, "expected an object, got %s", schema_kind(v));
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
        schema_walk_object(w, &sub, p);
        return;
    }

    for (int l = 0; l < 2; l++) {
        const json_t *v = layer_value(x, f, l);
        if (!v)
            continue;
        o->layer = l;
        o->at = schema_child_at(w, x->layer_path[l], f->key);
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
        schema_err_at(w, &at, "required key \"%s\" is missing", f->key);
        o->layer = -2;
    } else if (f->def) {
        set_default(w, f, &o->at, dst);
    } else if (f->type == FT_CUSTOM) {
        f->parse(w, &o->at, NULL, p);
    }
}

void schema_walk_object(struct walk *w, struct ctx *x, void *dst)
{
    if (x->s->n > MAX_FIELDS)
        abort();
    check_keys(w, x);
    for (size_t i = 0; i < x->s->n; i++)
        walk_field(w, x, i, dst);
    if (x->s->check)
        x->s->check(w, x, dst);
}

void schema_build(struct cfg *c, struct arena *a, const json_t *root, const struct jpos *pos,
                  struct cfg_errs *errs)
{
    struct walk w = { .a = a, .pos = pos, .errs = errs };
    const struct jpos_entry *at_root = jpos_find(pos, "$");

    if (!json_is_object(root)) {
        cfg_errs_add(errs, "$", at_root ? at_root->line : 1, at_root ? at_root->col : 1,
                     "expected a JSON object, got %s", schema_kind(root));
        return;
    }
    const json_t *d = json_object_get(root, "defaults");
    w.defaults = json_is_object(d) ? d : NULL;

    struct ctx x = { .s = &schema_root, .path = "$", .pos = at_root };
    x.layer[0] = root;
    x.layer_path[0] = "$";
    schema_walk_object(&w, &x, c);
    arena_free(&w.tmp);
}

/* ---- the effective config ---- */

/* The value of field 'f' of the object 'obj' (new reference). */
static json_t *dump_value(const struct field *f, const void *obj, bool defaults_view)
{
    const void *p = (const char *)obj + f->offset;
    switch (f->type) {
    case FT_OBJECT:
        return schema_dump_object(f->sub, p, defaults_view);
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
        return schema_dump_string_or_null(p);
    case FT_LIST:
        return dump_list(f, obj);
    case FT_CUSTOM:
        return f->dump(p);
    }
    return NULL;
}

json_t *schema_dump_object(const struct schema *s, const void *src, bool defaults_view)
{
    json_t *o = json_object();
    for (size_t i = 0; i < s->n; i++) {
        const struct field *f = &s->fields[i];
        if (!(defaults_view && (f->flags & F_ROUTE_ONLY)))
            json_object_set_new(o, f->key, dump_value(f, src, defaults_view));
    }
    return o;
}

json_t *schema_dump(const struct cfg *c)
{
    return schema_dump_object(&schema_root, c, false);
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
    return restart_changes(&schema_root, "", was, now, fn, arg);
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
    write_rows(out, &schema_root, "");
}
