/* fuzz_seal: what the delivery store reads back from its file and its key file
 * (docs/delivery.md "Secrets at rest"): a sealed field value (seal_open(), proxy/store/seal.h),
 * the key file (cfg_key_file_read(), config/keyfile.h, and seal_key_load()), and a row's blob
 * of fields (sql_fields_unpack(), proxy/store/sqlite_int.h). A file anyone could have written
 * to or damaged.
 *
 * Input: a byte choosing what is fed (its value modulo 4), then:
 *
 * 0. an id, a NUL, then text given to seal_open() under a fixed key (with the seal's mark put
 *    before it when the text does not start with it and the choosing byte is below 128): only
 *    a value sealed under that key and id opens (the corpus holds a few), and what opens
 *    seals again and opens to itself; the same text under another key or id never opens;
 * 1. an id, a NUL, a value (cut at the next NUL), then two bytes of a place and one of a byte:
 *    seal_value() then seal_open() gives the value back; under another id or key nothing; the
 *    sealed text with the byte at that place changed, or cut there, opens to nothing or to the
 *    very same value, never to another;
 * 2. the bytes as a whole key file (in a memfd): read exactly when the reference says (32
 *    bytes; or 64 hex digits then nothing but CR and LF, 80 bytes at most), as the key the
 *    reference reads; seal_key_load() agrees and says why when it refuses;
 * 3. the bytes as a fields blob, in a buffer exactly that large (a read past it is an ASan
 *    report): taken exactly when it is "name\0value\0" pairs (an even number of NULs, the last
 *    byte one), as those pairs; packed again they give the blob byte for byte.
 */
/* fuzz-link: proxy/store/seal.c proxy/store/sqlite_seal.c proxy/store/store.c */
#define FUZZ_NAME "fuzz_seal"
#include "tests/fuzz/fuzz.h"

#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config/keyfile.h"
#include "proxy/store/seal.h"
#include "proxy/store/sqlite_int.h"

/* The key the corpus's sealed values were sealed under, and another. */
static const unsigned char key_a[SEAL_KEY_BYTES] = "retryproxy-fuzz-seal-key-0123456";
static const unsigned char key_b[SEAL_KEY_BYTES] = "retryproxy-fuzz-seal-key-6543210";

static void open_text(struct fuzz_in *in, bool mark)
{
    char *id = fuzz_piece(in, 0, NULL);
    char *text = fuzz_piece(in, 0, NULL);
    if (!id || !text)
        goto out;
    if (mark && text[0] != SEAL_MARK) {
        size_t n = strlen(text);
        char *t = malloc(n + 2);
        if (!t)
            abort();
        t[0] = SEAL_MARK;
        memcpy(t + 1, text, n + 1);
        free(text);
        text = t;
    }
    char *v = seal_open(key_a, id, text);
    FUZZ_CHECK(!v || seal_is_sealed(text), "an unsealed text opened");
    char *w = seal_open(key_b, id, text);
    FUZZ_CHECK(!v || !w, "one text opened under two keys");
    free(w);
    if (v) {
        char *other = malloc(strlen(id) + 2);
        if (!other)
            abort();
        snprintf(other, strlen(id) + 2, "%sx", id);
        w = seal_open(key_a, other, text);
        FUZZ_CHECK(!w, "a text opened under another id");
        free(other);
        char *again = seal_value(key_a, id, v);
        FUZZ_CHECK(again, "seal_value failed");
        w = seal_open(key_a, id, again);
        FUZZ_CHECK(w && strcmp(w, v) == 0, "sealed again, did not open to itself");
        free(w);
        free(again);
    }
    free(v);
out:
    free(id);
    free(text);
}

static void round_trip(struct fuzz_in *in)
{
    char *id = fuzz_piece(in, 0, NULL);
    char *value = fuzz_piece(in, 0, NULL);
    if (!id)
        id = strdup("");
    if (!value)
        value = strdup("");
    if (!id || !value)
        abort();
    size_t at = fuzz_byte(in);
    at |= (size_t)fuzz_byte(in) << 8;
    uint8_t b = fuzz_byte(in);

    char *s = seal_value(key_a, id, value);
    FUZZ_CHECK(s && seal_is_sealed(s), "seal_value failed");
    FUZZ_CHECK(strchr(s + 1, SEAL_MARK) == NULL, "the mark inside a sealed value");
    char *v = seal_open(key_a, id, s);
    FUZZ_CHECK(v && strcmp(v, value) == 0, "did not open to the value");
    free(v);
    v = seal_open(key_b, id, s);
    FUZZ_CHECK(!v, "opened under another key");
    size_t n = strlen(s);
    char *other = malloc(strlen(id) + 2);
    if (!other)
        abort();
    snprintf(other, strlen(id) + 2, "%s%c", id, id[0] == 'x' ? 'y' : 'x');
    v = seal_open(key_a, other, s);
    FUZZ_CHECK(!v, "opened under another id");
    free(other);

    at %= n;
    if (b == 0 || b == (uint8_t)s[at])
        b ^= 0x55;
    char old = s[at];
    s[at] = (char)b;
    v = seal_open(key_a, id, s);
    FUZZ_CHECK(!v || strcmp(v, value) == 0, "byte %zu changed to %#x: opened to another value", at,
               b);
    free(v);
    s[at] = old;
    s[at] = '\0';
    v = seal_open(key_a, id, s);
    FUZZ_CHECK(!v || strcmp(v, value) == 0, "cut at %zu: opened to another value", at);
    free(v);
    free(s);
    free(id);
    free(value);
}

static int hexval(uint8_t c)
{
    const char *lower = "0123456789abcdef", *upper = "0123456789ABCDEF", *p;
    if (c == 0)
        return -1;
    if ((p = strchr(lower, c)))
        return (int)(p - lower);
    return (p = strchr(upper, c)) ? (int)(p - upper) : -1;
}

static int ref_key(const uint8_t *d, size_t n, unsigned char key[SEAL_KEY_BYTES])
{
    if (n == 32) {
        memcpy(key, d, 32);
        return 0;
    }
    if (n > 80)
        return -2;
    size_t k = n;
    while (k > 0 && (d[k - 1] == '\r' || d[k - 1] == '\n'))
        k--;
    if (k != 64)
        return -2;
    for (size_t i = 0; i < 64; i += 2) {
        int hi = hexval(d[i]), lo = hexval(d[i + 1]);
        if (hi < 0 || lo < 0)
            return -2;
        key[i / 2] = (unsigned char)(hi * 16 + lo);
    }
    return 0;
}

static void key_file(const uint8_t *d, size_t n)
{
    int fd = memfd_create("fuzz_seal_key", 0);
    FUZZ_CHECK(fd >= 0, "memfd_create");
    for (size_t w = 0; w < n;) {
        ssize_t k = write(fd, d + w, n - w);
        FUZZ_CHECK(k > 0, "write");
        w += (size_t)k;
    }
    char path[64], err[300];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    unsigned char want[SEAL_KEY_BYTES], got[SEAL_KEY_BYTES], loaded[SEAL_KEY_BYTES];
    int ref = ref_key(d, n, want);
    int r = cfg_key_file_read(path, got);
    FUZZ_CHECK(r == ref, "%zu bytes: read %d, reference %d", n, r, ref);
    FUZZ_CHECK(r < 0 || memcmp(got, want, sizeof(got)) == 0, "another key read");
    err[0] = '\0';
    int l = seal_key_load(path, loaded, err, sizeof(err));
    FUZZ_CHECK(l == (ref == 0 ? 0 : -1), "seal_key_load %d, reference %d", l, ref);
    FUZZ_CHECK(l == 0 ? memcmp(loaded, want, sizeof(loaded)) == 0 : err[0] != '\0',
               "seal_key_load: %s", err);
    close(fd);
}

static void blob(const uint8_t *d, size_t n)
{
    char *b = malloc(n ? n : 1);
    if (!b)
        abort();
    memcpy(b, d, n);
    size_t nuls = 0;
    for (size_t i = 0; i < n; i++)
        nuls += d[i] == 0;
    bool ok = nuls % 2 == 0 && (n == 0 || d[n - 1] == 0);
    struct store_delivery dl;
    memset(&dl, 0, sizeof(dl));
    int r = sql_fields_unpack(&dl, b, n);
    FUZZ_CHECK((r == 0) == ok, "%zu bytes, %zu NULs: unpack %d", n, nuls, r);
    if (ok) {
        FUZZ_CHECK(dl.nfields == nuls / 2, "%zu fields of %zu NULs", dl.nfields, nuls);
        const char *p = (const char *)d;
        for (size_t i = 0; i < dl.nfields; i++) {
            FUZZ_CHECK(strcmp(dl.fields[i].name, p) == 0, "field %zu's name", i);
            p += strlen(p) + 1;
            FUZZ_CHECK(strcmp(dl.fields[i].value, p) == 0, "field %zu's value", i);
            p += strlen(p) + 1;
        }
        size_t len = 0;
        char *again = sql_fields_pack(dl.fields, dl.nfields, &len);
        FUZZ_CHECK(again && len == n && memcmp(again, d, n) == 0, "packed again: %zu bytes", len);
        free(again);
    }
    store_delivery_clear(&dl);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = { data, size };
    uint8_t op = fuzz_byte(&in);
    switch (op % 4) {
    case 0:
        open_text(&in, op < 128);
        break;
    case 1:
        round_trip(&in);
        break;
    case 2:
        key_file(in.p, in.n);
        break;
    default:
        blob(in.p, in.n);
        break;
    }
    return 0;
}
