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
/* dq_set(key, value): its result, the since/until it set in *ms. */
static int set_time(const char *key, const char *value, uint64_t *ms)
{
    struct dq q;
    char err[200];
    dq_init(&q);
    int r = dq_set(&q, key, value, err, sizeof(err));
    *ms = key[0] == 's' ? q.m.since : q.m.until;
    return r;
}

Test(deliveries_query, rfc3339_times_are_taken_as_written)
{
    uint64_t ms;
    cr_assert_eq(set_time("since", "2026-11-28T20:00:00Z", &ms), 0);
    cr_expect_eq(ms, 1795896000000ULL);
    cr_assert_eq(set_time("until", "2026-11-28T21:30:00.25+01:30", &ms), 0);
    cr_expect_eq(ms, 1795896000250ULL);
    cr_assert_eq(set_time("since", "2026-11-28t20:00:00.0001z", &ms), 0, "T and Z in lower case");
    cr_expect_eq(ms, 1795896000000ULL);
    cr_assert_eq(set_time("since", "2028-02-29T00:00:00Z", &ms), 0, "a leap day");
    cr_assert_eq(set_time("since", "2016-12-31T23:59:60Z", &ms), 0, "a leap second");
    cr_expect_eq(ms, 1483228800000ULL, "the next minute's first second");
}

Test(deliveries_query, rfc3339_times_not_in_the_calendar_or_not_as_written_are_refused)
{
    static const char *const bad[] = {
        "2026-02-31T00:00:00Z",      /* was taken as March 3 */
        "2026-02-29T00:00:00Z",      /* not a leap year */
        "2026-04-31T00:00:00Z",      /* April has 30 days */
        " 2026-11-28T20:00:00Z",     /* a space before a number */
        "2026-11-28T20: 0:00Z",      /* a space for a digit */
        "2026-1-28T20:00:00Z",       /* one digit for two */
        "2026-11-28T20:00:61Z",      /* a 61st second */
        "2026-11-28T20:00:00+0a:00", /* an offset of letters */
        "2026-11-28T20:00:00+24:00", /* an offset beyond 23:59 */
        "2026-11-28T20:00:00.Z",     /* a fraction without digits */
        "2026-11-28T20:00:00",       /* no offset */
        "1969-12-31T23:59:59Z",      /* before 1970 */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t ms;
        cr_expect_eq(set_time("since", bad[i], &ms), -1, "%s taken as %llu", bad[i],
                     (unsigned long long)ms);
    }
}

Test(deliveries_query, a_refused_value_is_quoted_as_one_line_of_utf8)
{
    struct dq q;
    char err[200];
    dq_init(&q);
    cr_assert_eq(dq_set(&q, "state", "dead\xff\n\x1b[31m", err, sizeof(err)), -1);
    cr_expect_str_eq(err, "state must be scheduled, in_flight, delivered or dead, got "
                          "'dead\\xff\\n\\u001b[31m'");
    /* what the admin API answers: jansson refused the raw byte, and nothing was answered */
    json_t *j = json_string(err);
    cr_expect_not_null(j);
    json_decref(j);

    char big[400];
    memset(big, 0x01, sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    cr_assert_eq(dq_set(&q, "order", big, err, sizeof(err)), -1);
    cr_expect(strlen(err) < sizeof(err) - 1, "the message fits, shortened: %s", err);
    cr_expect(strstr(err, "...'") != NULL, "a shortened value ends in ...: %s", err);
}
