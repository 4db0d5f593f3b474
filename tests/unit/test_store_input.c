/* What the delivery store's operators' side reads from outside (docs/delivery.md): the admin
 * API's and the CLI's filters (dq_set()), the key file, and a row's blob of fields. The cases
 * here are what tests/fuzz/fuzz_deliveries_query.c and fuzz_seal.c found (docs/fuzzing.md). */
#include <criterion/criterion.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/keyfile.h"
#include "proxy/ops/deliveries.h"
#include "proxy/store/seal.h"
#include "proxy/store/sqlite_int.h"
Test(fields_blob, a_blob_that_is_not_name_value_pairs_is_a_damaged_row)
{
    static const char cut[] = "content-type\0application/json\0x-trace\0abc";
    static const char odd[] = "content-type\0application/json\0x-trace\0";
    static const char good[] = "content-type\0application/json\0x-trace\0\0";
    struct store_delivery d;
    memset(&d, 0, sizeof(d));
    cr_expect_eq(sql_fields_unpack(&d, cut, sizeof(cut) - 1), STORE_EIO, "x-trace's value lost");
    store_delivery_clear(&d);
    cr_expect_eq(sql_fields_unpack(&d, odd, sizeof(odd) - 1), STORE_EIO, "a name without value");
    store_delivery_clear(&d);
    cr_assert_eq(sql_fields_unpack(&d, good, sizeof(good) - 1), 0);
    cr_assert_eq(d.nfields, 2);
    cr_expect_str_eq(d.fields[1].name, "x-trace");
    cr_expect_str_eq(d.fields[1].value, "");
    size_t len;
    char *b = sql_fields_pack(d.fields, d.nfields, &len);
    cr_assert_eq(len, sizeof(good) - 1);
    cr_expect_eq(memcmp(b, good, len), 0);
    free(b);
    store_delivery_clear(&d);
}

/* A file of its own holding 'n' bytes of 'b'; its path in 'path'. */
static void key_file(char *path, size_t cap, const void *b, size_t n)
{
    snprintf(path, cap, "/tmp/test_store_input.XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, b, n), (ssize_t)n);
    close(fd);
}

Test(key_file, a_key_with_anything_after_its_line_ends_is_refused)
{
    static const char hex[] = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
    char text[128], path[64], err[256];
    unsigned char key[SEAL_KEY_BYTES];
    /* 64 digits, 16 line ends: the first 80 bytes were all that was read */
    snprintf(text, sizeof(text), "%s\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\njunk", hex);
    key_file(path, sizeof(path), text, strlen(text));
    cr_expect_eq(seal_key_load(path, key, err, sizeof(err)), -1, "junk after a key taken");
    cr_expect_eq(cfg_key_file_read(path, key), -2);
    unlink(path);

    snprintf(text, sizeof(text), "%s\r\n", hex);
    key_file(path, sizeof(path), text, strlen(text));
    cr_assert_eq(seal_key_load(path, key, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(key[0], 0x00);
    cr_expect_eq(key[31], 0xff);
    unlink(path);
}
