/* strmap -- a string-keyed hash map of pointers (open addressing), for the few registries that
 * are looked up by name at every reload: route metrics and live route state. Keys are borrowed
 * and must outlive their entry; entries are never removed. Not thread-safe: callers lock. */
#ifndef RETRYPROXY_PROXY_STRMAP_H
#define RETRYPROXY_PROXY_STRMAP_H

#include <stddef.h>

struct strmap {
    struct strmap_slot {
        const char *key;
        void *val;
    } * slots;
    size_t cap, n; /* cap is 0 or a power of two, at most half full */
};

/* The value for 'key', or NULL. */
void *strmap_get(const struct strmap *m, const char *key);
/* Adds 'key' (not present) with 'val'; 0, or -1 out of memory. */
int strmap_put(struct strmap *m, const char *key, void *val);
void strmap_free(struct strmap *m);

#endif
