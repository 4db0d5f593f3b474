/* The config file's position scanner (config/jsonpos.h): the line and column of each value and
 * key by path, duplicates, numbers jansson cannot hold, and exactly what jansson accepts. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <criterion/parameterized.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config/cfg.h"
#include "config/jsonpos.h"
#include "policy/budget.h"
#include "tests/support/cfgtext.h"

/* ---- the position scanner ---- */

static struct jpos scan_ok(char *text, struct cfg_errs *errs)
{
    struct jpos p = { 0 };
    cr_assert_eq(jpos_scan(&p, text, strlen(text), errs), 0);
    return p;
}

Test(jsonpos, records_value_and_key_positions_by_path)
{
    char text[] = "{\n  \"a\": [1, {\"b c\": true}],\n  \"d\":\t\"x\"\n}";
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct jpos p = scan_ok(text, &errs);
    const struct jpos_entry *e = jpos_find(&p, "$.a");
    cr_assert_not_null(e);
    cr_expect(e->line == 2 && e->col == 8 && e->key_line == 2 && e->key_col == 3);
    e = jpos_find(&p, "$.a[1][\"b c\"]");
    cr_assert_not_null(e);
    cr_expect(e->line == 2 && e->col == 20, "%u:%u", e->line, e->col);
    e = jpos_find(&p, "$.d");
    cr_assert_not_null(e);
    cr_expect(e->line == 3 && e->col == 8, "%u:%u", e->line, e->col); /* a tab is one column */
    cr_expect_null(jpos_find(&p, "$.zz"));
    cr_expect_eq(errs.n, 0);
    jpos_free(&p);
}

Test(jsonpos, columns_count_characters_not_bytes)
{
    char text[] = "{\"\xc3\xa9t\xc3\xa9\": \"\xe2\x82\xac\", \"n\": 1}";
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct jpos p = scan_ok(text, &errs);
    const struct jpos_entry *e = jpos_find(&p, "$.n");
    cr_assert_not_null(e);
    /* {"été": "€", "n": 1}  -> the 1 is the 19th character (the 26th byte) */
    cr_expect_eq(e->col, 19);
    jpos_free(&p);
}

Test(jsonpos, duplicate_only_within_the_same_object)
{
    char text[] = "{\"r\": {\"a\": 1}, \"r\": {\"a\": 2}, \"s\": {\"a\": 1, \"a\": 2}}";
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct jpos p = scan_ok(text, &errs);
    cr_assert_eq(errs.n, 2);
    cr_expect_str_eq(errs.v[0].path, "$.r");
    cr_expect_str_eq(errs.v[1].path, "$.s.a");
    /* the last duplicate wins, as in jansson */
    cr_expect_eq(jpos_find(&p, "$.r.a")->col, 28);
    cfg_errs_clear(&errs);
    jpos_free(&p);
}

Test(jsonpos, unrepresentable_numbers_are_reported_and_nulled_in_place)
{
    char text[] = "{\"a\": 1e309, \"b\": -99999999999999999999, \"c\": 1e-400, \"d\": 5}";
    size_t len = strlen(text);
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct jpos p = scan_ok(text, &errs);
    cr_assert_eq(errs.n, 2);
    cr_expect_str_eq(errs.v[0].path, "$.a");
    cr_expect_str_eq(errs.v[1].path, "$.b");
    cr_expect(jpos_find(&p, "$.a")->bad);
    cr_expect_not(jpos_find(&p, "$.c")->bad); /* underflow to 0 is what jansson accepts */
    cr_expect_eq(strlen(text), len);
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    cr_assert_not_null(j, "%s", jerr.text);
    cr_expect(json_is_null(json_object_get(j, "a")));
    cr_expect_eq(json_integer_value(json_object_get(j, "d")), 5);
    json_decref(j);
    cfg_errs_clear(&errs);
    jpos_free(&p);
}

Test(jsonpos, accepts_exactly_what_jansson_accepts)
{
    static const char *const docs[] = {
        "{}",
        "{\"a\":\"\\u00e9\\ud83d\\ude00\\n\\\"\"}",
        "[0, -0, 1.5e+3, -2E-2, true, false, null]",
        "{\"a\":1,}",
        "[1,]",
        "{\"a\" 1}",
        "{'a': 1}",
        "[01]",
        "[1.]",
        "[.5]",
        "[+1]",
        "[tru]",
        "[truex]",
        "{\"a\": \"\\x\"}",
        "{\"a\": \"\\ud800\"}",
        "{\"a\": \"\\u0000\"}",
        "{\"a\": \"\xff\"}",
        "{\"a\": \"\xc0\xaf\"}",
        "{\"a\": \"\xed\xa0\x80\"}",
        "{\"a\": 1} x",
        "{\"a\": \"tab\there\"}",
        "",
        "   ",
    };
    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
        char *copy = strdup(docs[i]);
        struct jpos p = { 0 };
        struct cfg_errs errs;
        cfg_errs_init(&errs);
        int ours = jpos_scan(&p, copy, strlen(copy), &errs) == 0;
        json_error_t jerr;
        json_t *j = json_loadb(docs[i], strlen(docs[i]), 0, &jerr);
        cr_expect_eq(ours, j != NULL, "doc %zu '%s': scanner %s, jansson %s", i, docs[i],
                     ours ? "accepts" : "rejects", j ? "accepts" : "rejects");
        json_decref(j);
        cfg_errs_clear(&errs);
        jpos_free(&p);
        free(copy);
    }
}

Test(jsonpos, paths_quote_keys_that_are_not_identifiers)
{
    struct arena a = { 0 };
    cr_expect_str_eq(jpos_path_key(&a, "$", "base_ms", 7), "$.base_ms");
    cr_expect_str_eq(jpos_path_key(&a, "$", "a.b", 3), "$[\"a.b\"]");
    cr_expect_str_eq(jpos_path_key(&a, "$", "q\"\n", 3), "$[\"q\\\"\\u000a\"]");
    cr_expect_str_eq(jpos_path_key(&a, "$", "9x", 2), "$[\"9x\"]");
    cr_expect_str_eq(jpos_path_index(&a, "$.r", 12), "$.r[12]");
    arena_free(&a);
}
