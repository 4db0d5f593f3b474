#include "proxy/base/strmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/strhash.h"

/* FNV-1a's low bits mix poorly for names that differ in their last characters ("route-000001",
 * "route-000002"): the table's index comes from a finaliser that spreads every bit (the one of
 * MurmurHash3), or linear probing runs along long clusters (seen: 60,000 such names took seven
 * times the CPU of 30,000). */
static size_t hash(const char *s)
{
    uint64_t h = str_hash(s);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return (size_t)h;
}

void *strmap_get(const struct strmap *m, const char *key)
{
    if (!m->cap)
        return NULL;
    for (size_t i = hash(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->slots[i].key)
            return NULL;
        if (strcmp(m->slots[i].key, key) == 0)
            return m->slots[i].val;
    }
}

static void place(struct strmap_slot *slots, size_t cap, const char *key, void *val)
{
    size_t i = hash(key) & (cap - 1);
    while (slots[i].key)
        i = (i + 1) & (cap - 1);
    slots[i].key = key;
    slots[i].val = val;
}

int strmap_put(struct strmap *m, const char *key, void *val)
{
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 16;
        struct strmap_slot *s = calloc(cap, sizeof(*s));
        if (!s)
            return -1;
        for (size_t i = 0; i < m->cap; i++)
            if (m->slots[i].key)
                place(s, cap, m->slots[i].key, m->slots[i].val);
        free(m->slots);
        m->slots = s;
        m->cap = cap;
    }
    place(m->slots, m->cap, key, val);
    m->n++;
    return 0;
}

void strmap_free(struct strmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}
