#include "proxy/base/pool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define STEP    64
#define CLASSES (POOL_BLOCK_MAX / STEP)
#define BIG     UINT32_MAX /* the class of a block malloc's alone */

/* Under AddressSanitizer every block goes back to malloc at once, so that a use after free
 * inside a session is still caught. */
#if defined(__SANITIZE_ADDRESS__)
#define KEEP 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KEEP 0
#endif
#endif
#ifndef KEEP
#define KEEP POOL_KEEP
#endif

/* Before each block: its class. 16 bytes, so that the block keeps malloc's alignment. */
struct head {
    uint32_t class;
    uint32_t pad[3];
};

/* A free block kept: the link lives in its first bytes. */
struct spare {
    struct spare *next;
};

struct pool {
    struct spare *free[CLASSES];
    unsigned n[CLASSES];
};

struct pool *pool_new(void)
{
    return calloc(1, sizeof(struct pool));
}

void pool_trim(struct pool *p)
{
    for (size_t c = 0; c < CLASSES; c++) {
        while (p->free[c]) {
            struct spare *s = p->free[c];
            p->free[c] = s->next;
            free((struct head *)(void *)s - 1);
        }
        p->n[c] = 0;
    }
}

void pool_free(struct pool *p)
{
    if (!p)
        return;
    pool_trim(p);
    free(p);
}

size_t pool_kept(const struct pool *p)
{
    size_t k = 0;
    for (size_t c = 0; c < CLASSES; c++)
        k += p->n[c];
    return k;
}

void *pool_malloc(size_t n, void *arg)
{
    struct pool *p = arg;
    if (n > POOL_BLOCK_MAX) {
        if (n > SIZE_MAX - sizeof(struct head))
            return NULL;
        struct head *h = malloc(sizeof(*h) + n);
        if (!h)
            return NULL;
        h->class = BIG;
        return h + 1;
    }
    uint32_t c = n ? (uint32_t)((n - 1) / STEP) : 0;
    if (p->free[c]) {
        struct spare *s = p->free[c];
        p->free[c] = s->next;
        p->n[c]--;
        return s;
    }
    struct head *h = malloc(sizeof(*h) + (size_t)(c + 1) * STEP);
    if (!h)
        return NULL;
    h->class = c;
    return h + 1;
}

void pool_release(void *ptr, void *arg)
{
    struct pool *p = arg;
    if (!ptr)
        return;
    struct head *h = (struct head *)ptr - 1;
    uint32_t c = h->class;
    if (c == BIG || p->n[c] + 1 > KEEP) { /* (not ">= KEEP": KEEP may be 0) */
        free(h);
        return;
    }
    struct spare *s = ptr;
    s->next = p->free[c];
    p->free[c] = s;
    p->n[c]++;
}

void *pool_calloc(size_t count, size_t size, void *arg)
{
    if (size && count > SIZE_MAX / size)
        return NULL;
    void *ptr = pool_malloc(count * size, arg);
    if (ptr)
        memset(ptr, 0, count * size);
    return ptr;
}

void *pool_realloc(void *ptr, size_t n, void *arg)
{
    if (!ptr)
        return pool_malloc(n, arg);
    struct head *h = (struct head *)ptr - 1;
    if (h->class != BIG && n && n <= (size_t)(h->class + 1) * STEP)
        return ptr; /* its block has room */
    if (h->class == BIG && n > POOL_BLOCK_MAX) {
        struct head *g = realloc(h, sizeof(*h) + n);
        return g ? g + 1 : NULL;
    }
    void *q = pool_malloc(n, arg);
    if (!q)
        return NULL;
    size_t had = h->class == BIG ? n : (size_t)(h->class + 1) * STEP;
    memcpy(q, ptr, had < n ? had : n);
    pool_release(ptr, arg);
    return q;
}
