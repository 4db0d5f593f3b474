/* arena -- bump allocator for data that lives and dies together (one config snapshot).
 *
 * Allocation failure aborts the process: configs are small and bounded by the file size cap,
 * and a half-built snapshot is worse than a clear crash at load time.
 */
#ifndef RETRYPROXY_CONFIG_ARENA_H
#define RETRYPROXY_CONFIG_ARENA_H

#include <stddef.h>

struct arena_chunk;

struct arena {
    struct arena_chunk *head;
};

/* Zeroed memory of 'size' bytes, aligned for any type, owned by the arena. */
void *arena_alloc(struct arena *a, size_t size);
/* A NUL-terminated copy of the 'len' bytes at 's'. */
char *arena_strndup(struct arena *a, const char *s, size_t len);
char *arena_strdup(struct arena *a, const char *s);
/* printf into arena memory. */
char *arena_printf(struct arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Frees every allocation; the arena is empty and reusable afterwards. Accepts NULL. */
void arena_free(struct arena *a);

#endif
