/* Shared by the libFuzzer targets tests/fuzz/fuzz_*.c (see docs/fuzzing.md). */
#ifndef RETRYPROXY_TESTS_FUZZ_H
#define RETRYPROXY_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* libFuzzer calls this once per input; it must return 0. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An invariant: when it does not hold, say which one and abort, which libFuzzer reports as a
 * crash and saves the input. */
#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s: invariant failed at line %d: %s\n", FUZZ_NAME, __LINE__, #cond);  \
            fprintf(stderr, "  " __VA_ARGS__);                                                     \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* A reader over the input: fixed-size values first, then the rest in pieces. */
struct fuzz_in {
    const uint8_t *p;
    size_t n;
};

/* The next byte, 0 once the input is used up. */
static inline uint8_t fuzz_byte(struct fuzz_in *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

/* The next 8 bytes as a little-endian integer (missing bytes read as 0). */
static inline uint64_t fuzz_u64(struct fuzz_in *in)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)fuzz_byte(in) << (8 * i);
    return v;
}

/* The next piece: bytes up to 'sep' (which is consumed) or the end, as a malloc'd copy with a
 * NUL after it (it may hold NULs itself when 'sep' is not 0). NULL once the input is used up. */
static inline char *fuzz_piece(struct fuzz_in *in, uint8_t sep, size_t *len)
{
    if (in->n == 0)
        return NULL;
    size_t k = 0;
    while (k < in->n && in->p[k] != sep)
        k++;
    char *s = malloc(k + 1);
    if (!s)
        abort();
    for (size_t i = 0; i < k; i++)
        s[i] = (char)in->p[i];
    s[k] = '\0';
    if (len)
        *len = k;
    in->p += k < in->n ? k + 1 : k;
    in->n -= k < in->n ? k + 1 : k;
    return s;
}

/* True when the 'len' bytes at 's' are well-formed UTF-8 (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF). Written here, not taken from the code under test. */
static inline int fuzz_utf8_ok(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    while (p < end) {
        unsigned c = *p;
        size_t need;
        unsigned cp;
        if (c < 0x80) {
            p++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            need = 1;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            need = 2;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if ((size_t)(end - p) < need + 1)
            return 0;
        for (size_t i = 1; i <= need; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (p[i] & 0x3f);
        }
        if ((need == 2 && cp < 0x800) || (need == 3 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        p += need + 1;
    }
    return 1;
}

#endif
