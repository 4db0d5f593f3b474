#include "config/arena.h"

#include <stdalign.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_MIN 4096

struct arena_chunk {
    struct arena_chunk *next;
    size_t size, used;
    alignas(max_align_t) unsigned char data[];
};

static void *xmalloc(size_t size)
{
    void *p = calloc(1, size);
    if (!p) {
        fputs("retryproxy: out of memory\n", stderr);
        abort();
    }
    return p;
}

void *arena_alloc(struct arena *a, size_t size)
{
    const size_t align = alignof(max_align_t);
    size = (size + align - 1) & ~(align - 1);
    struct arena_chunk *c = a->head;
    if (!c || c->size - c->used < size) {
        size_t want = size > CHUNK_MIN ? size : CHUNK_MIN;
        c = xmalloc(sizeof(*c) + want);
        c->size = want;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += size;
    return p;
}

char *arena_strndup(struct arena *a, const char *s, size_t len)
{
    char *p = arena_alloc(a, len + 1);
    memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

char *arena_strdup(struct arena *a, const char *s)
{
    return arena_strndup(a, s, strlen(s));
}

char *arena_printf(struct arena *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    char *p = arena_alloc(a, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

void arena_free(struct arena *a)
{
    if (!a)
        return;
    struct arena_chunk *c = a->head;
    while (c) {
        struct arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
}
