#include "proxy/http/hlist.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proxy/http/headers.h"

void hlist_clear(struct hlist *h)
{
    h->len = 0;
    h->count = 0;
}

void hlist_free(struct hlist *h)
{
    free(h->buf);
    memset(h, 0, sizeof(*h));
}

/* Room for 'more' bytes after h->len, within HLIST_MAX_BYTES. */
static int hlist_reserve(struct hlist *h, size_t more)
{
    if (h->len + more > HLIST_MAX_BYTES)
        return -1;
    if (h->len + more > h->cap) {
        /* from 512: a typical head, and small enough for malloc's per-thread cache */
        size_t cap = h->cap ? h->cap : 512;
        while (cap < h->len + more)
            cap *= 2;
        char *b = realloc(h->buf, cap);
        if (!b)
            return -1;
        h->buf = b;
        h->cap = cap;
    }
    return 0;
}

int hlist_add(struct hlist *h, const char *name, size_t nl, const char *value, size_t vl)
{
    size_t need = nl + vl + 2;
    if (h->count >= HLIST_MAX_COUNT || hlist_reserve(h, need) < 0)
        return -1;
    memcpy(h->buf + h->len, name, nl);
    h->buf[h->len + nl] = '\0';
    memcpy(h->buf + h->len + nl + 1, value, vl);
    h->buf[h->len + nl + 1 + vl] = '\0';
    h->len += need;
    h->count++;
    return 0;
}

int hlist_extend_last(struct hlist *h, const char *v, size_t vl)
{
    if (!h->count || hlist_reserve(h, vl + 1) < 0)
        return -1;
    /* the last value's NUL becomes the space */
    h->buf[h->len - 1] = ' ';
    memcpy(h->buf + h->len, v, vl);
    h->len += vl;
    h->buf[h->len++] = '\0';
    return 0;
}

bool hlist_next(const struct hlist *h, size_t *pos, const char **name, const char **value)
{
    if (*pos >= h->len)
        return false;
    *name = h->buf + *pos;
    *value = *name + strlen(*name) + 1;
    *pos = (size_t)(*value - h->buf) + strlen(*value) + 1;
    return true;
}

const char *hlist_get(const struct hlist *h, const char *name)
{
    const char *v;
    return hlist_values(h, name, &v, NULL, 1) ? v : NULL;
}

size_t hlist_values(const struct hlist *h, const char *name, const char **vals, size_t *lens,
                    size_t max)
{
    size_t pos = 0, n = 0;
    const char *k, *v;
    while (hlist_next(h, &pos, &k, &v)) {
        if (!hdr_name_eq(k, name))
            continue;
        if (n < max) {
            vals[n] = v;
            if (lens)
                lens[n] = strlen(v);
        }
        n++;
    }
    return n;
}

int64_t hlist_content_length(const struct hlist *h)
{
    const char *cl = hlist_get(h, "Content-Length");
    return cl ? hdr_parse_uint(cl) : -1;
}

bool hlist_length_unambiguous(const struct hlist *h)
{
    size_t pos = 0;
    const char *n, *v;
    int64_t seen = -1;
    while (hlist_next(h, &pos, &n, &v)) {
        if (!hdr_name_eq(n, "Content-Length"))
            continue;
        int64_t cl = hdr_parse_uint(v);
        if (cl < 0 || (seen >= 0 && cl != seen))
            return false;
        seen = cl;
    }
    return true;
}

bool hlist_transfer_coding_ok(const struct hlist *h)
{
    size_t pos = 0, fields = 0, codings = 0;
    const char *n, *v;
    bool chunked = false;
    while (hlist_next(h, &pos, &n, &v)) {
        if (!HDR_NAME_IS(n, strlen(n), "Transfer-Encoding"))
            continue;
        fields++;
        for (const char *p = v; *p;) {
            size_t el = strcspn(p, ",");
            const char *e = hdr_trim(p, &el);
            if (el) {
                codings++;
                chunked = el == 7 && strncasecmp(e, "chunked", 7) == 0;
            }
            p += strcspn(p, ",");
            if (*p)
                p++;
        }
    }
    return fields == 0 || (codings == 1 && chunked);
}

bool hlist_connection_names(const struct hlist *h, const char *name)
{
    size_t pos = 0;
    const char *n, *v;
    while (hlist_next(h, &pos, &n, &v))
        if (HDR_NAME_IS(n, strlen(n), "Connection") && hdr_token_listed(v, name))
            return true;
    return false;
}
