#include "proxy/http/hlist.h"

#include <stdint.h>
#include <stdio.h>
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

/* The lengths at the head of the field at 'p' (unaligned). */
static void lengths_get(const char *p, size_t *nl, size_t *vl)
{
    uint32_t l[2];
    memcpy(l, p, sizeof(l));
    *nl = l[0];
    *vl = l[1];
}

static void lengths_set(char *p, size_t nl, size_t vl)
{
    uint32_t l[2] = { (uint32_t)nl, (uint32_t)vl };
    memcpy(p, l, sizeof(l));
}

/* Writes the field at h->len, which has room for it. */
static void put(struct hlist *h, const char *name, size_t nl, const char *value, size_t vl)
{
    char *o = h->buf + h->len;
    lengths_set(o, nl, vl);
    o += HLIST_FIELD_BYTES;
    memcpy(o, name, nl);
    o[nl] = '\0';
    memcpy(o + nl + 1, value, vl);
    o[nl + 1 + vl] = '\0';
    h->last = h->len;
    h->len += HLIST_FIELD_BYTES + nl + vl + 2;
    h->count++;
}

int hlist_add(struct hlist *h, const char *name, size_t nl, const char *value, size_t vl)
{
    if (h->count >= HLIST_MAX_COUNT || hlist_reserve(h, HLIST_FIELD_BYTES + nl + vl + 2) < 0)
        return -1;
    put(h, name, nl, value, vl);
    return 0;
}

int hlist_put(struct hlist *h, const char *name, size_t nl, const char *value, size_t vl)
{
    if (h->len + HLIST_FIELD_BYTES + nl + vl + 2 > h->cap)
        return -1;
    put(h, name, nl, value, vl);
    return 0;
}

void hlist_lower_last(struct hlist *h)
{
    if (!h->count)
        return;
    char *p = h->buf + h->last;
    size_t nl, vl;
    lengths_get(p, &nl, &vl);
    hdr_lower(p + HLIST_FIELD_BYTES, p + HLIST_FIELD_BYTES, nl);
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
    size_t nl, was;
    lengths_get(h->buf + h->last, &nl, &was);
    lengths_set(h->buf + h->last, nl, was + 1 + vl);
    return 0;
}

char *hlist_head_text(int status, const struct hlist *h, size_t *len)
{
    size_t cap = 32, pos = 0;
    struct hfield f;
    while (h && hlist_next_n(h, &pos, &f))
        cap += f.name_len + f.value_len + 4;
    char *t = malloc(cap);
    if (!t)
        return NULL;
    size_t n = (size_t)snprintf(t, cap, "HTTP/1.1 %d\r\n", status);
    pos = 0;
    while (h && hlist_next_n(h, &pos, &f) && n < cap)
        n += (size_t)snprintf(t + n, cap - n, "%.*s: %.*s\r\n", (int)f.name_len, f.name,
                              (int)f.value_len, f.value);
    *len = n < cap ? n : cap - 1;
    return t;
}

bool hlist_next_n(const struct hlist *h, size_t *pos, struct hfield *f)
{
    if (*pos >= h->len)
        return false;
    const char *p = h->buf + *pos;
    lengths_get(p, &f->name_len, &f->value_len);
    f->name = p + HLIST_FIELD_BYTES;
    f->value = f->name + f->name_len + 1;
    f->per_request = false;
    *pos += HLIST_FIELD_BYTES + f->name_len + f->value_len + 2;
    return true;
}

bool hlist_next(const struct hlist *h, size_t *pos, const char **name, const char **value)
{
    struct hfield f;
    if (!hlist_next_n(h, pos, &f))
        return false;
    *name = f.name;
    *value = f.value;
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
    size_t pos = 0, n = 0, nl = strlen(name);
    struct hfield f;
    while (hlist_next_n(h, &pos, &f)) {
        if (f.name_len != nl || strncasecmp(f.name, name, nl) != 0)
            continue;
        if (n < max) {
            vals[n] = f.value;
            if (lens)
                lens[n] = f.value_len;
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
    int64_t seen = -1;
    struct hfield f;
    while (hlist_next_n(h, &pos, &f)) {
        if (!HDR_NAME_IS(f.name, f.name_len, "Content-Length"))
            continue;
        int64_t cl = hdr_parse_uint(f.value);
        if (cl < 0 || (seen >= 0 && cl != seen))
            return false;
        seen = cl;
    }
    return true;
}

bool hlist_transfer_coding_ok(const struct hlist *h)
{
    size_t pos = 0, fields = 0, codings = 0;
    bool chunked = false;
    struct hfield f;
    while (hlist_next_n(h, &pos, &f)) {
        if (!HDR_NAME_IS(f.name, f.name_len, "Transfer-Encoding"))
            continue;
        const char *v = f.value;
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
    struct hfield f;
    while (hlist_next_n(h, &pos, &f))
        if (HDR_NAME_IS(f.name, f.name_len, "Connection") && hdr_token_listed(f.value, name))
            return true;
    return false;
}
