/* pool -- small blocks kept for reuse by one thread: the allocator of a worker's HTTP/2
 * sessions (nghttp2_mem takes these functions as they are: the pool comes last).
 *
 * A call through HTTP/2 makes a dozen small allocations inside libnghttp2 (streams, frames,
 * field copies) and frees them a moment later, many calls in one loop turn. glibc keeps seven
 * free blocks of a size per thread; a turn that ends twenty calls frees more than that, and
 * the rest take malloc's slow paths both ways (bench/README.md, issue 30: 14 % of a call's CPU).
 * The pool keeps up to POOL_KEEP free blocks of each size class (64 bytes apart, up to
 * POOL_BLOCK_MAX), and hands them out again; larger blocks go to malloc. pool_trim() gives
 * what it keeps back, after a burst. Not thread-safe: one thread's pool. */
#ifndef RETRYPROXY_PROXY_POOL_H
#define RETRYPROXY_PROXY_POOL_H

#include <stddef.h>

#define POOL_BLOCK_MAX 1024 /* larger blocks are malloc's */
#define POOL_KEEP      64   /* free blocks kept per size class */

struct pool;

struct pool *pool_new(void);
/* Frees the pool and the blocks it keeps; blocks still out must have been given back. */
void pool_free(struct pool *p);
/* Gives the blocks it keeps back to malloc. */
void pool_trim(struct pool *p);
/* Free blocks kept, all classes together. */
size_t pool_kept(const struct pool *p);

/* malloc, free, calloc and realloc through pool 'arg' (a struct pool *). */
void *pool_malloc(size_t n, void *arg);
void pool_release(void *ptr, void *arg);
void *pool_calloc(size_t count, size_t size, void *arg);
void *pool_realloc(void *ptr, size_t n, void *arg);

#endif
