/* What the delivery store's operators' side reads from outside (docs/delivery.md): the admin
 * API's and the CLI's filters (dq_set()), the key file, and a row's blob of fields. The cases
 * here are what tests/fuzz/fuzz_deliveries_query.c and fuzz_seal.c found (docs/fuzzing.md). */
#include <criterion/criterion.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
