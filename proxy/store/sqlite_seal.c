/* sqlite_seal -- a stored request's fields on their way into the file and out, for
 * sqlite_sql.c's enqueue and reads: the sensitive ones sealed and opened again (seal.h,
 * docs/delivery.md "Secrets at rest"), and all of them packed into the row's blob and read
 * back from it. Store thread only; no SQLite call, so tests/fuzz/fuzz_seal.c links it. */
#include "proxy/store/seal.h"
#include "proxy/store/backend.h"

#include <stdlib.h>
#include <string.h>

int sql_seal_fields(const struct store_opts *o, const char *id, const struct store_field *in,
                    size_t n, struct store_field **out, size_t *nout)
{
    struct store_field *f = calloc(n ? n : 1, sizeof(*f));
    size_t k = 0;
    if (!f)
        return STORE_EIO;
    for (size_t i = 0; i < n; i++) {
        bool secret = seal_sensitive(in[i].name, o->sensitive, o->n_sensitive);
        if (secret && !o->key)
            continue; /* no key: not stored at all (docs/delivery.md) */
        f[k].name = strdup(in[i].name);
        f[k].value = secret ? seal_value(o->key, id, in[i].value) : strdup(in[i].value);
        k++;
        if (!f[k - 1].name || !f[k - 1].value) {
            store_fields_free(f, k);
            return STORE_EIO;
        }
    }
    *out = f;
    *nout = k;
    return 0;
}

void sql_open_fields(const struct store_opts *o, struct store_delivery *d)
{
    for (size_t i = 0; o->key && i < d->nfields; i++) {
        if (!seal_is_sealed(d->fields[i].value))
            continue;
        char *clear = seal_open(o->key, d->id, d->fields[i].value);
        if (clear) {
            free(d->fields[i].value);
            d->fields[i].value = clear;
        }
    }
}

char *sql_fields_pack(const struct store_field *f, size_t n, size_t *len)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += strlen(f[i].name) + strlen(f[i].value) + 2;
    char *b = malloc(total ? total : 1), *p = b;
    if (!b)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        size_t a = strlen(f[i].name) + 1, v = strlen(f[i].value) + 1;
        memcpy(p, f[i].name, a);
        memcpy(p + a, f[i].value, v);
        p += a + v;
    }
    *len = total;
    return b;
}

int sql_fields_unpack(struct store_delivery *d, const char *b, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += b[i] == '\0';
    /* every string ends in its NUL, and names and values come in pairs */
    if (n % 2 || (len && b[len - 1] != '\0'))
        return STORE_EIO;
    n /= 2;
    d->fields = calloc(n ? n : 1, sizeof(*d->fields));
    if (!d->fields)
        return STORE_EIO;
    const char *p = b;
    for (size_t i = 0; i < n; i++) {
        d->fields[i].name = strdup(p);
        p += strlen(p) + 1;
        d->fields[i].value = strdup(p);
        p += strlen(p) + 1;
        d->nfields = i + 1;
        if (!d->fields[i].name || !d->fields[i].value)
            return STORE_EIO;
    }
    return 0;
}

int sql_new_row(const struct store_opts *o, struct store_call *c, const struct store_new *d,
                uint64_t count, uint64_t bytes, struct sql_row *row)
{
    size_t nkept = 0;
    struct store_field *kept = NULL;
    row->fields = NULL;
    /* The id first: it is the sealed values' additional data (seal.h). */
    if (store_new_id(c->id) == 0 &&
        sql_seal_fields(o, c->id, d->fields, d->nfields, &kept, &nkept) == 0) {
        row->fields = sql_fields_pack(kept, nkept, &row->flen);
        c->left_out = (uint32_t)(d->nfields - nkept);
        store_fields_free(kept, nkept);
    }
    if (!row->fields)
        return STORE_EIO;
    /* A row's size, roughly: what the bound needs until the database tells its own. */
    row->size = d->body_len + row->flen + strlen(d->route) + strlen(d->target) + 256;
    if ((o->max_count && count >= o->max_count) ||
        (o->max_bytes && bytes + row->size > o->max_bytes)) {
        free(row->fields);
        row->fields = NULL;
        c->id[0] = '\0';
        return STORE_EFULL;
    }
    return 0;
}
