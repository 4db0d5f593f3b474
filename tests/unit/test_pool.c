/* pool: small blocks kept per size class for reuse, bounded, given back by pool_trim(); larger
 * ones are malloc's (proxy/base/pool.h). Under ASan the pool keeps nothing (use after free
 * stays visible), so the reuse checks only hold in a plain build. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "proxy/base/pool.h"

static struct pool *p;

static void setup(void)
{
    p = pool_new();
    cr_assert_not_null(p);
}

static void teardown(void)
{
    pool_free(p);
}

TestSuite(pool, .init = setup, .fini = teardown);

#if defined(__SANITIZE_ADDRESS__)
#define KEEPS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KEEPS 0
#endif
#endif
#ifndef KEEPS
#define KEEPS 1
#endif

Test(pool, a_freed_block_is_handed_out_again_for_its_size_class)
{
    char *a = pool_malloc(100, p);
    cr_assert_not_null(a);
    memset(a, 'x', 100);
    pool_release(a, p);
    cr_expect_eq(pool_kept(p), KEEPS ? 1u : 0u);
    char *b = pool_malloc(120, p); /* 65 to 128 bytes: one class */
    if (KEEPS)
        cr_expect_eq(b, a);
    cr_expect_eq(pool_kept(p), 0u);
    pool_release(b, p);
    char *c = pool_malloc(129, p); /* the next class: a block of its own */
    if (KEEPS)
        cr_expect_neq(c, a);
    pool_release(c, p);
}

Test(pool, blocks_keep_mallocs_alignment)
{
    for (size_t n = 1; n <= POOL_BLOCK_MAX * 2; n += 37) {
        void *a = pool_malloc(n, p);
        cr_assert_not_null(a);
        cr_expect_eq((uintptr_t)a % _Alignof(max_align_t), 0u, "%zu bytes", n);
        memset(a, 0xab, n);
        pool_release(a, p);
    }
}

Test(pool, calloc_zeroes_a_reused_block)
{
    unsigned char *a = pool_malloc(64, p);
    memset(a, 0xff, 64);
    pool_release(a, p);
    unsigned char *b = pool_calloc(8, 8, p);
    cr_assert_not_null(b);
    for (size_t i = 0; i < 64; i++)
        cr_assert_eq(b[i], 0, "byte %zu", i);
    pool_release(b, p);
    cr_expect_null(pool_calloc(SIZE_MAX / 2, 4, p), "an overflowing size is refused");
}

Test(pool, realloc_keeps_the_bytes_across_classes_and_past_the_pools_sizes)
{
    char *a = pool_malloc(10, p);
    memcpy(a, "0123456789", 10);
    a = pool_realloc(a, 60, p); /* the same block has room */
    cr_assert_not_null(a);
    a = pool_realloc(a, 700, p);
    cr_assert_not_null(a);
    cr_expect_eq(memcmp(a, "0123456789", 10), 0);
    memset(a + 10, 'y', 690);
    a = pool_realloc(a, 5000, p); /* malloc's */
    cr_assert_not_null(a);
    cr_expect_eq(memcmp(a, "0123456789", 10), 0);
    cr_expect_eq(a[699], 'y');
    a = pool_realloc(a, 9000, p);
    cr_assert_not_null(a);
    cr_expect_eq(a[699], 'y');
    a = pool_realloc(a, 20, p); /* back into a class */
    cr_assert_not_null(a);
    cr_expect_eq(memcmp(a, "0123456789", 10), 0);
    pool_release(a, p);
    char *n = pool_realloc(NULL, 30, p);
    cr_assert_not_null(n);
    pool_release(n, p);
    pool_release(NULL, p);
}

Test(pool, it_keeps_at_most_pool_keep_blocks_a_class_and_trim_gives_them_back)
{
    enum { N = POOL_KEEP + 40 };
    void *b[N];
    for (size_t i = 0; i < N; i++)
        b[i] = pool_malloc(200, p);
    void *big = pool_malloc(POOL_BLOCK_MAX + 1, p);
    for (size_t i = 0; i < N; i++)
        pool_release(b[i], p);
    pool_release(big, p);
    cr_expect_eq(pool_kept(p), KEEPS ? (size_t)POOL_KEEP : 0u,
                 "a burst's blocks past the bound go");
    pool_trim(p);
    cr_expect_eq(pool_kept(p), 0u);
}
