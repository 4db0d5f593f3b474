/* strhash -- the string hash of the project's hash tables (FNV-1a, 64 bits): the config
 * loader's path table and duplicate checks, and proxy/base/strmap.c. */
#ifndef RETRYPROXY_CONFIG_STRHASH_H
#define RETRYPROXY_CONFIG_STRHASH_H

#include <stdint.h>

static inline uint64_t str_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

#endif
