/* sqlite_seal -- the sensitive fields of a stored request sealed on their way into the file and
 * opened on their way out (seal.h, docs/delivery.md "Secrets at rest"), for sqlite_sql.c's
 * enqueue and reads. Store thread only. */
#include "proxy/store/seal.h"
#include "proxy/store/sqlite_int.h"

#include <stdlib.h>
#include <string.h>

int sql_seal_fields(struct store_impl *s, const char *id, const struct store_field *in, size_t n,
                    struct store_field **out, size_t *nout)
{
    struct store_field *f = calloc(n ? n : 1, sizeof(*f));
    size_t k = 0;
    if (!f)
        return STORE_EIO;
    for (size_t i = 0; i < n; i++) {
        bool secret = seal_sensitive(in[i].name, s->o.sensitive, s->o.n_sensitive);
        if (secret && !s->o.key)
            continue; /* no key: not stored at all (docs/delivery.md) */
        f[k].name = strdup(in[i].name);
        f[k].value = secret ? seal_value(s->o.key, id, in[i].value) : strdup(in[i].value);
        k++;
        if (!f[k - 1].name || !f[k - 1].value) {
            sql_fields_free(in, f, k);
            return STORE_EIO;
        }
    }
    *out = f;
    *nout = k;
    return 0;
}

void sql_fields_free(const struct store_field *in, struct store_field *out, size_t nout)
{
    (void)in;
    for (size_t i = 0; i < nout; i++) {
        free(out[i].name);
        free(out[i].value);
    }
    free(out);
}

void sql_open_fields(struct store_impl *s, struct store_delivery *d)
{
    for (size_t i = 0; s->o.key && i < d->nfields; i++) {
        if (!seal_is_sealed(d->fields[i].value))
            continue;
        char *clear = seal_open(s->o.key, d->id, d->fields[i].value);
        if (clear) {
            free(d->fields[i].value);
            d->fields[i].value = clear;
        }
    }
}
