/* Unit tests for policy/retry_after.c (RFC 9110 §10.2.3 Retry-After).
 *
 * Every expected delay is worked out by hand in the comment next to it, never by calling the
 * code under test. Day counts use days_before(Y) = 365*(Y-1) + (Y-1)/4 - (Y-1)/100 + (Y-1)/400
 * (days from 0001-01-01 to Y-01-01), with 1970-01-01 = day 719162 of that count, and the
 * common-year days before each month: Jan 0, Feb 31, Mar 59, Apr 90, May 120, Jun 151, Jul 181,
 * Aug 212, Sep 243, Oct 273, Nov 304, Dec 334.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "policy/retry_after.h"

/* Sun, 06 Nov 1994 08:49:37 GMT:
 * days_before(1994) = 365*1993 + 498 - 19 + 4 = 727928; 727928 - 719162 = 8766 days to
 * 1994-01-01 (24*365 + 6 leap days 1972..1992 = 8766, agrees). + 304 (Nov) + 5 = 9075 days.
 * 9075*86400 = 784080000 s; + 8*3600 + 49*60 + 37 = 31777 s -> 784111777 s. */
#define NOW_1994 INT64_C(784111777000)

/* Wed, 28 Feb 2024 00:00:00 GMT: days_before(2024) = 365*2023 + 505 - 20 + 5 = 738885;
 * - 719162 = 19723 (= 2024-01-01); + 31 (Jan) + 27 = 19781 days; *86400 = 1709078400 s. */
#define NOW_2024_02_28 INT64_C(1709078400000)

/* Thu, 01 Jan 2026 00:00:00 GMT: days_before(2026) = 365*2025 + 506 - 20 + 5 = 739616;
 * - 719162 = 20454 days (56*365 + 14 leap days 1972..2024 = 20454, agrees); *86400 =
 * 1767225600 s. */
#define NOW_2026 INT64_C(1767225600000)

/* Mon, 01 Jan 2080 00:00:00 GMT: days_before(2080) = 365*2079 + 519 - 20 + 5 = 759339;
 * - 719162 = 40177 days; *86400 = 3471292800 s. */
#define NOW_2080 INT64_C(3471292800000)

/* A value no successful parse here produces, to prove errors leave *delay_ms alone. */
#define SENTINEL UINT64_C(0xDEADBEEFCAFEF00D)

/* Parses exactly 'len' bytes of 'buf' and checks the result is 'expected' milliseconds. */
#define EXPECT_DELAY_N(buf, len, now, expected)                                                    \
    do {                                                                                           \
        uint64_t got_ = SENTINEL;                                                                  \
        int rc_ = retry_after_parse((buf), (len), (now), &got_);                                   \
        cr_expect_eq(rc_, 0, "\"%.*s\": rc %d, expected 0", (int)(len), (buf), rc_);               \
        cr_expect_eq(got_, (uint64_t)(expected),                                                   \
                     "\"%.*s\": got %" PRIu64 " ms, expected %" PRIu64, (int)(len), (buf), got_,   \
                     (uint64_t)(expected));                                                        \
    } while (0)

/* Parses exactly 'len' bytes of 'buf' and checks it fails with 'err' without touching the
 * output. */
#define EXPECT_ERROR_N(buf, len, now, err)                                                         \
    do {                                                                                           \
        uint64_t got_ = SENTINEL;                                                                  \
        int rc_ = retry_after_parse((buf), (len), (now), &got_);                                   \
        cr_expect_eq(rc_, (err), "\"%.*s\": rc %d, expected %d", (int)(len), (buf), rc_, (err));   \
        cr_expect_eq(got_, SENTINEL, "\"%.*s\": *delay_ms was modified on error", (int)(len),      \
                     (buf));                                                                       \
    } while (0)

#define EXPECT_DELAY(str, now, expected) EXPECT_DELAY_N((str), strlen(str), (now), (expected))
#define EXPECT_ERROR(str, now, err)      EXPECT_ERROR_N((str), strlen(str), (now), (err))
/* For literals containing NUL bytes, where strlen() would stop early. */
#define LIT_LEN(lit) (sizeof(lit) - 1)
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* One row of a test's table: 'value' parsed at 'now' gives 'ms'. */
struct delay_case {
    const char *value;
    int64_t now;
    uint64_t ms;
};

static void expect_delays(const struct delay_case *c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        EXPECT_DELAY(c[i].value, c[i].now, c[i].ms);
}

/* Each of 'values' parsed at 'now' is -EINVAL. */
static void expect_einval(int64_t now, const char *const *values, size_t n)
{
    for (size_t i = 0; i < n; i++)
        EXPECT_ERROR(values[i], now, -EINVAL);
}

/* ---- delta-seconds ---- */

Test(retry_after, delta_seconds_zero_means_retry_now)
{
    EXPECT_DELAY("0", NOW_1994, 0);
}

Test(retry_after, delta_seconds_are_converted_to_milliseconds)
{
    static const struct delay_case cases[] = {
        { "1", NOW_1994, 1000 },         /* 1 * 1000 */
        { "120", NOW_1994, 120000 },     /* 120 * 1000 */
        { "86400", NOW_1994, 86400000 }, /* one day: 86400 * 1000 */
    };
    expect_delays(cases, ARRAY_LEN(cases));
}

Test(retry_after, delta_seconds_accept_leading_zeros_without_counting_them_toward_overflow)
{
    static const struct delay_case cases[] = {
        { "000120", NOW_1994, 120000 },
        { "0000000000000000000000000001", NOW_1994, 1000 }, /* 28 digits, value 1 */
        { "000000000000000000000000000000", NOW_1994, 0 },  /* 30 zeros */
    };
    expect_delays(cases, ARRAY_LEN(cases));
}

Test(retry_after, delta_seconds_do_not_depend_on_now)
{
    EXPECT_DELAY("120", INT64_MIN, 120000);
    EXPECT_DELAY("120", INT64_MAX, 120000);
}

Test(retry_after, largest_delta_whose_milliseconds_fit_in_int64_is_accepted)
{
    /* INT64_MAX = 9223372036854775807; / 1000 = 9223372036854775 (remainder 807). */
    EXPECT_DELAY("9223372036854775", NOW_1994, UINT64_C(9223372036854775000));
}

Test(retry_after, smallest_delta_whose_milliseconds_overflow_int64_is_erange)
{
    /* 9223372036854776 * 1000 = 9223372036854776000 > INT64_MAX (...775807). */
    EXPECT_ERROR("9223372036854776", NOW_1994, -ERANGE);
}

Test(retry_after, delta_seconds_beyond_int64_or_uint64_are_erange)
{
    EXPECT_ERROR("9223372036854775807", NOW_1994, -ERANGE);  /* INT64_MAX seconds */
    EXPECT_ERROR("99999999999999999999", NOW_1994, -ERANGE); /* 20 digits, > UINT64_MAX */
    EXPECT_ERROR("18446744073709551616", NOW_1994, -ERANGE); /* 2^64: wraps to 0 if unchecked */
    EXPECT_ERROR("123456789012345678901234567890", NOW_1994, -ERANGE); /* 30 digits */
}

Test(retry_after, malformed_huge_delta_is_einval_rather_than_erange)
{
    EXPECT_ERROR("99999999999999999999x", NOW_1994, -EINVAL);
    EXPECT_ERROR("99999999999999999999.5", NOW_1994, -EINVAL);
}

/* ---- the three HTTP-date forms ---- */

Test(retry_after, imf_fixdate_in_the_future_gives_the_difference)
{
    /* 08:51:37 - 08:49:37 = 120 s. */
    static const struct delay_case cases[] = {
        { "Sun, 06 Nov 1994 08:51:37 GMT", NOW_1994, 120000 },
        /* Same time the next day: 86400 s. */
        { "Mon, 07 Nov 1994 08:49:37 GMT", NOW_1994, 86400000 },
        /* 2026-01-01 = 1767225600 s (see NOW_2026);
         * 1767225600000 - 784111777000 = 983113823000. */
        { "Thu, 01 Jan 2026 00:00:00 GMT", NOW_1994, INT64_C(983113823000) },
    };
    expect_delays(cases, ARRAY_LEN(cases));
}

Test(retry_after, imf_fixdate_difference_keeps_the_milliseconds_of_now)
{
    /* now = 08:49:37.250, date = 08:49:38.000 -> 750 ms. */
    static const struct delay_case cases[] = {
        { "Sun, 06 Nov 1994 08:49:38 GMT", NOW_1994 + 250, 750 },
        /* now = 08:49:37.999 -> 1 ms; now = 08:49:38.000 -> equal -> 0. */
        { "Sun, 06 Nov 1994 08:49:38 GMT", NOW_1994 + 999, 1 },
        { "Sun, 06 Nov 1994 08:49:38 GMT", NOW_1994 + 1000, 0 },
    };
    expect_delays(cases, ARRAY_LEN(cases));
}

Test(retry_after, rfc850_date_in_the_future_gives_the_difference)
{
    /* now is in 1994, so "94" is 1994 (within 50 years). 08:49:38 - 08:49:37 = 1 s. */
    EXPECT_DELAY("Sunday, 06-Nov-94 08:49:38 GMT", NOW_1994, 1000);
    /* One day later: 86400 s. */
    EXPECT_DELAY("Monday, 07-Nov-94 08:49:37 GMT", NOW_1994, 86400000);
}

Test(retry_after, asctime_date_in_the_future_gives_the_difference)
{
    /* 08:50:37 - 08:49:37 = 60 s. */
    EXPECT_DELAY("Sun Nov  6 08:50:37 1994", NOW_1994, 60000);
    /* Two-digit day: 10 Nov - 6 Nov = 4 days = 4 * 86400 = 345600 s. */
    EXPECT_DELAY("Thu Nov 10 08:49:37 1994", NOW_1994, 345600000);
}

Test(retry_after, date_in_the_past_gives_zero)
{
    static const struct delay_case cases[] = {
        { "Sat, 05 Nov 1994 08:49:37 GMT", NOW_1994, 0 },
        { "Sun, 06 Nov 1994 08:49:36 GMT", NOW_1994, 0 },
        { "Saturday, 05-Nov-94 08:49:37 GMT", NOW_1994, 0 },
        { "Thu Jan  1 00:00:00 1970", NOW_1994, 0 },
        { "Mon, 01 Jan 0001 00:00:00 GMT", NOW_1994, 0 }, /* year 1 is the earliest */
    };
    expect_delays(cases, ARRAY_LEN(cases));
}

Test(retry_after, date_equal_to_now_gives_zero)
{
    static const struct delay_case cases[] = {
        { "Sun, 06 Nov 1994 08:49:37 GMT", NOW_1994, 0 },
        { "Sunday, 06-Nov-94 08:49:37 GMT", NOW_1994, 0 },
        { "Sun Nov  6 08:49:37 1994", NOW_1994, 0 },
    };
    expect_delays(cases, ARRAY_LEN(cases));
}

Test(retry_after, latest_four_digit_year_is_accepted)
{
    /* days_before(10000) = 365*9999 + 2499 - 99 + 24 = 3652059; - 719162 = 2932897 days to
     * 10000-01-01; 9999-12-31 23:59:59 = 2932897*86400 - 1 = 253402300799 s.
     * 253402300799000 - 784111777000 = 252618189022000 ms. */
    EXPECT_DELAY("Fri, 31 Dec 9999 23:59:59 GMT", NOW_1994, INT64_C(252618189022000));
}

Test(retry_after, year_zero_is_invalid)
{
    EXPECT_ERROR("Sat, 01 Jan 0000 00:00:00 GMT", NOW_1994, -EINVAL);
    EXPECT_ERROR("Sat Jan  1 00:00:00 0000", NOW_1994, -EINVAL);
}

/* ---- calendar validation ---- */

Test(retry_after, feb_29_is_valid_in_a_leap_year)
{
    /* now = 2024-02-28 00:00; Feb 29 is one day later, Mar 1 two days (so Feb had 29 days). */
    static const struct delay_case cases[] = {
        { "Thu, 29 Feb 2024 00:00:00 GMT", NOW_2024_02_28, 86400000 },
        { "Fri, 01 Mar 2024 00:00:00 GMT", NOW_2024_02_28, 172800000 },
        { "Thu Feb 29 00:00:00 2024", NOW_2024_02_28, 86400000 },
        /* 2000 is a leap year by the 400 rule; the date is in the past, so 0, not an error. */
        { "Tue, 29 Feb 2000 00:00:00 GMT", NOW_2024_02_28, 0 },
    };
    expect_delays(cases, ARRAY_LEN(cases));
}

Test(retry_after, feb_29_is_invalid_in_a_common_year)
{
    EXPECT_ERROR("Wed, 29 Feb 2023 00:00:00 GMT", NOW_2024_02_28, -EINVAL);
    EXPECT_ERROR("Thu, 29 Feb 1900 00:00:00 GMT", NOW_2024_02_28, -EINVAL); /* 100 rule */
    EXPECT_ERROR("Wednesday, 29-Feb-23 00:00:00 GMT", NOW_2026, -EINVAL);   /* 23 -> 2023 */
    EXPECT_ERROR("Fri, 30 Feb 2024 00:00:00 GMT", NOW_2024_02_28,
                 -EINVAL); /* even in a leap year */
}

Test(retry_after, day_beyond_the_month_is_invalid)
{
    EXPECT_ERROR("Fri, 31 Apr 2026 00:00:00 GMT", NOW_2026, -EINVAL);
    EXPECT_ERROR("Wed, 31 Jun 2026 00:00:00 GMT", NOW_2026, -EINVAL);
    EXPECT_ERROR("Sun, 32 Jan 2026 00:00:00 GMT", NOW_2026, -EINVAL);
    EXPECT_ERROR("Sun, 00 Nov 1994 08:49:37 GMT", NOW_1994, -EINVAL);
    EXPECT_ERROR("Sun Nov  0 08:49:37 1994", NOW_1994, -EINVAL);
}

Test(retry_after, hour_24_is_invalid)
{
    EXPECT_ERROR("Sun, 06 Nov 1994 24:00:00 GMT", NOW_1994, -EINVAL);
    EXPECT_ERROR("Sun Nov  6 24:00:00 1994", NOW_1994, -EINVAL);
}

Test(retry_after, minute_60_is_invalid)
{
    EXPECT_ERROR("Sun, 06 Nov 1994 08:60:00 GMT", NOW_1994, -EINVAL);
    EXPECT_ERROR("Sunday, 06-Nov-94 08:60:00 GMT", NOW_1994, -EINVAL);
}

Test(retry_after, second_60_is_a_leap_second_counted_as_the_next_second)
{
    /* 08:49:60 = 08:50:00; 08:50:00 - 08:49:37 = 23 s. */
    EXPECT_DELAY("Sun, 06 Nov 1994 08:49:60 GMT", NOW_1994, 23000);
    /* 08:59:60 = 09:00:00; 09:00:00 - 08:49:37 = 10 min 23 s = 623 s. */
    EXPECT_DELAY("Sun, 06 Nov 1994 08:59:60 GMT", NOW_1994, 623000);
    EXPECT_ERROR("Sun, 06 Nov 1994 08:49:61 GMT", NOW_1994, -EINVAL);
}

/* ---- names, zone and spacing ---- */

Test(retry_after, day_name_must_be_valid_for_the_date_form)
{
    static const char *const values[] = {
        "Sunday, 06 Nov 1994 08:49:37 GMT", /* long in IMF */
        "Sun, 06-Nov-94 08:49:37 GMT",      /* short in RFC 850 */
        "Sunday Nov  6 08:49:37 1994",      /* long in asctime */
        "sun, 06 Nov 1994 08:49:37 GMT",    /* case-sensitive */
        "SUN, 06 Nov 1994 08:49:37 GMT",    "sunday, 06-Nov-94 08:49:37 GMT",
        "Xyz, 06 Nov 1994 08:49:37 GMT",    "Sundy, 06-Nov-94 08:49:37 GMT",
        "Tues, 08 Nov 1994 08:49:37 GMT",   "06 Nov 1994 08:49:37 GMT", /* no day name at all */
    };
    expect_einval(NOW_1994, values, ARRAY_LEN(values));
}

Test(retry_after, weekday_need_not_match_the_date)
{
    /* 6 Nov 1994 was a Sunday; RFC 9110 does not ask recipients to check. */
    static const struct delay_case cases[] = {
        { "Mon, 06 Nov 1994 08:51:37 GMT", NOW_1994, 120000 },
        { "Friday, 06-Nov-94 08:51:37 GMT", NOW_1994, 120000 },
        { "Wed Nov  6 08:51:37 1994", NOW_1994, 120000 },
    };
    expect_delays(cases, ARRAY_LEN(cases));
}

Test(retry_after, month_names_are_exact_and_case_sensitive)
{
    static const char *const values[] = {
        "Sun, 06 nov 1994 08:49:37 GMT",  "Sun, 06 NOV 1994 08:49:37 GMT",
        "Sun, 06 Foo 1994 08:49:37 GMT",  "Sun, 06 November 1994 08:49:37 GMT",
        "Sunday, 06-nov-94 08:49:37 GMT", "Sun nov  6 08:49:37 1994",
        "Sun, 06 11 1994 08:49:37 GMT",
    };
    expect_einval(NOW_1994, values, ARRAY_LEN(values));
}

Test(retry_after, imf_fixdate_and_rfc850_require_gmt)
{
    static const char *const values[] = {
        "Sun, 06 Nov 1994 08:49:37",       "Sun, 06 Nov 1994 08:49:37 UTC",
        "Sun, 06 Nov 1994 08:49:37 gmt",   "Sun, 06 Nov 1994 08:49:37 +0000",
        "Sun, 06 Nov 1994 08:49:37 GMT+1", "Sunday, 06-Nov-94 08:49:37",
        "Sunday, 06-Nov-94 08:49:37 UTC",
    };
    expect_einval(NOW_1994, values, ARRAY_LEN(values));
}

Test(retry_after, asctime_takes_no_timezone)
{
    EXPECT_ERROR("Sun Nov  6 08:49:37 1994 GMT", NOW_1994, -EINVAL);
}

Test(retry_after, separators_must_be_exactly_as_in_the_grammar)
{
    static const char *const values[] = {
        "Sun,  06 Nov 1994 08:49:37 GMT", "Sun, 06  Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov  1994 08:49:37 GMT", "Sun, 06 Nov 1994  08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37  GMT", "Sun, 06 Nov 1994\t08:49:37 GMT", /* HTAB is not SP */
        "Sun 06 Nov 1994 08:49:37 GMT",                                     /* missing comma */
        "Sun,06 Nov 1994 08:49:37 GMT",   "Sun, 06-Nov-1994 08:49:37 GMT",
        "Sunday, 06 Nov 94 08:49:37 GMT", "Sunday,  06-Nov-94 08:49:37 GMT",
        "Sun, 06 Nov 1994 8:49:37 GMT",   "Sun, 06 Nov 1994 08.49.37 GMT",
        "Sun Nov  6  08:49:37 1994",      "Sun  Nov  6 08:49:37 1994",
    };
    expect_einval(NOW_1994, values, ARRAY_LEN(values));
}

Test(retry_after, imf_fixdate_day_is_always_two_digits)
{
    static const char *const values[] = {
        "Sun, 6 Nov 1994 08:49:37 GMT", "Sun,  6 Nov 1994 08:49:37 GMT",
        "Sun, 006 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 94 08:49:37 GMT", /* year is 4DIGIT */
    };
    expect_einval(NOW_1994, values, ARRAY_LEN(values));
}

Test(retry_after, asctime_day_is_space_and_digit_or_two_digits)
{
    /* date3 = month SP ( 2DIGIT / ( SP DIGIT ) ): "Nov  6" and "Nov 06" both match; 60 s. */
    EXPECT_DELAY("Sun Nov  6 08:50:37 1994", NOW_1994, 60000);
    EXPECT_DELAY("Sun Nov 06 08:50:37 1994", NOW_1994, 60000);
    static const char *const values[] = {
        "Sun Nov 6 08:50:37 1994",   /* one SP only */
        "Sun Nov   6 08:50:37 1994", /* three SP */
        "Sun Nov  06 08:50:37 1994", /* SP then 2DIGIT */
        "Sun Nov  6 08:50:37 94",    /* year is 4DIGIT */
    };
    expect_einval(NOW_1994, values, ARRAY_LEN(values));
}

/* ---- RFC 850 two-digit years ---- */

Test(retry_after, rfc850_year_up_to_50_years_ahead_is_in_the_future)
{
    /* now = 2026: "30" -> 2030. days_before(2030) = 365*2029 + 507 - 20 + 5 = 741077; - 719162
     * = 21915; + 304 (Nov) + 5 = 22224 days. 22224 - 20454 (2026-01-01) = 1770 days;
     * 1770*86400 = 152928000 s; + 31777 s (08:49:37) = 152959777 s. */
    EXPECT_DELAY("Wednesday, 06-Nov-30 08:49:37 GMT", NOW_2026, INT64_C(152959777000));
    /* "76" -> 2076, exactly 50 years ahead, which is not *more* than 50. days_before(2076) =
     * 365*2075 + 518 - 20 + 5 = 757878; - 719162 = 38716; 38716 - 20454 = 18262 days;
     * *86400 = 1577836800 s. */
    EXPECT_DELAY("Wednesday, 01-Jan-76 00:00:00 GMT", NOW_2026, INT64_C(1577836800000));
}

Test(retry_after, rfc850_year_more_than_50_years_ahead_is_the_previous_century)
{
    /* now = 2026: "94" would be 2094 (68 years ahead) -> 1994, in the past -> 0. Read as 2094
     * it would give a delay of decades. */
    EXPECT_DELAY("Sunday, 06-Nov-94 08:49:37 GMT", NOW_2026, 0);
    /* "77" would be 2077, 51 years ahead -> 1977 -> 0. */
    EXPECT_DELAY("Saturday, 01-Jan-77 00:00:00 GMT", NOW_2026, 0);
}

Test(retry_after, rfc850_year_more_than_49_years_behind_is_the_next_century)
{
    /* now = 2080: the window is 2031..2130, so "20" is 2120, not 2020. 2080-01-01 to
     * 2120-01-01 is 40 years with 9 leap days (2080, 2084, ..., 2116 is 10 years divisible by
     * 4, but 2100 is not a leap year): 40*365 + 9 = 14609 days; *86400 = 1262217600 s. */
    EXPECT_DELAY("Monday, 01-Jan-20 00:00:00 GMT", NOW_2080, INT64_C(1262217600000));
    /* "31": 2131 would be 51 years ahead -> 2031, in the past -> 0. */
    EXPECT_DELAY("Wednesday, 01-Jan-31 00:00:00 GMT", NOW_2080, 0);
}

Test(retry_after, rfc850_year_is_resolved_against_the_calendar_year_of_now)
{
    /* now = 0 is 1970-01-01 (window 1921..2020): "20" -> 2020. days_before(2020) = 365*2019 +
     * 504 - 20 + 5 = 737424; - 719162 = 18262 days; *86400 = 1577836800 s. */
    EXPECT_DELAY("Wednesday, 01-Jan-20 00:00:00 GMT", 0, INT64_C(1577836800000));
    /* now = -1 ms is 1969-12-31 23:59:59.999 (window 1920..2019): "20" -> 1920, in the past. */
    EXPECT_DELAY("Wednesday, 01-Jan-20 00:00:00 GMT", -1, 0);
}

/* ---- range of the date difference ---- */

Test(retry_after, date_whose_distance_from_now_overflows_int64_is_erange)
{
    /* date - now <= INT64_MAX  <=>  now >= 784111777000 - 9223372036854775807
     *                                     = -9223371252742998807. */
    EXPECT_DELAY("Sun, 06 Nov 1994 08:49:37 GMT", INT64_C(-9223371252742998807),
                 UINT64_C(9223372036854775807));
    EXPECT_ERROR("Sun, 06 Nov 1994 08:49:37 GMT", INT64_C(-9223371252742998808), -ERANGE);
    EXPECT_ERROR("Sun, 06 Nov 1994 08:49:37 GMT", INT64_MIN, -ERANGE);
}

Test(retry_after, rfc850_date_beyond_int64_milliseconds_is_erange)
{
    /* INT64_MAX ms is 292278994-08-17 07:12:55.807 UTC, so with that "now" a "94" year is
     * 292278994. 6 Nov of that year is past the int64 millisecond range; 6 Jan is before now. */
    EXPECT_ERROR("Sunday, 06-Nov-94 08:49:37 GMT", INT64_MAX, -ERANGE);
    EXPECT_DELAY("Sunday, 06-Jan-94 08:49:37 GMT", INT64_MAX, 0);
}

/* ---- surrounding whitespace and garbage ---- */

Test(retry_after, surrounding_ows_is_ignored)
{
    static const struct delay_case cases[] = {
        { " 120", NOW_1994, 120000 },
        { "120 ", NOW_1994, 120000 },
        { "\t \t120 \t ", NOW_1994, 120000 },
        { "  Sun, 06 Nov 1994 08:51:37 GMT\t", NOW_1994, 120000 },
        { "\tSunday, 06-Nov-94 08:51:37 GMT ", NOW_1994, 120000 },
        { " Sun Nov  6 08:51:37 1994  ", NOW_1994, 120000 },
    };
    expect_delays(cases, ARRAY_LEN(cases));
}

Test(retry_after, garbage_is_einval)
{
    static const char *const garbage[] = {
        "120, 120",
        "1.5",
        "+5",
        "-5",
        " 5 s",
        "5s",
        "0x10",
        "1e3",
        "12 3",
        "",
        "   ",
        "\t",
        " \t ",
        "abc",
        "\r\n5", /* CR and LF are not OWS */
        "5\n",
        "\v5",
        "\xef\xbc\x95", /* U+FF15 FULLWIDTH DIGIT FIVE */
        "Sun, 06 Nov 1994 08:49:37 GMT, Sun, 06 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 GMTx",
        "Sun, 06 Nov 1994 08:49:37 GMT x",
        "Sun, 06 Nov 1994 08:49:37 GMT;",
        "Sun Nov  6 08:49:37 19945",
        "Sun, 06 Nov 1994 08:49:37 GMT 120",
        "120 Sun, 06 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994",
        "Sun",
    };
    for (size_t i = 0; i < sizeof(garbage) / sizeof(garbage[0]); i++)
        EXPECT_ERROR(garbage[i], NOW_1994, -EINVAL);
}

Test(retry_after, embedded_nul_is_einval)
{
    EXPECT_ERROR_N("12\0"
                   "3",
                   LIT_LEN("12\0"
                           "3"),
                   NOW_1994, -EINVAL);
    EXPECT_ERROR_N("120\0", LIT_LEN("120\0"), NOW_1994, -EINVAL);
    EXPECT_ERROR_N("\0", LIT_LEN("\0"), NOW_1994, -EINVAL);
    EXPECT_ERROR_N(" \0 ", LIT_LEN(" \0 "), NOW_1994, -EINVAL);
    EXPECT_ERROR_N("Sun, 06 Nov 1994 08:49:37 GMT\0", LIT_LEN("Sun, 06 Nov 1994 08:49:37 GMT\0"),
                   NOW_1994, -EINVAL);
    EXPECT_ERROR_N("Sun, 06 Nov\0"
                   "1994 08:49:37 GMT",
                   LIT_LEN("Sun, 06 Nov\0"
                           "1994 08:49:37 GMT"),
                   NOW_1994, -EINVAL);
}

/* ---- the length argument ---- */

Test(retry_after, only_len_bytes_are_read)
{
    /* Exactly sized, unterminated arrays: AddressSanitizer flags any read past the end. */
    const char delta[3] = { '1', '2', '0' };
    EXPECT_DELAY_N(delta, sizeof(delta), NOW_1994, 120000);
    char date[29];
    memcpy(date, "Sun, 06 Nov 1994 08:51:37 GMT", sizeof(date));
    EXPECT_DELAY_N(date, sizeof(date), NOW_1994, 120000);

    /* Bytes after 'len' that would change the value or make it invalid are ignored. */
    EXPECT_DELAY_N("1205", 3, NOW_1994, 120000);
    EXPECT_DELAY_N("120, 5", 3, NOW_1994, 120000);
    EXPECT_DELAY_N("120 x", 4, NOW_1994, 120000); /* trailing SP within len is OWS */
    EXPECT_DELAY_N("Sun, 06 Nov 1994 08:51:37 GMTjunk", 29, NOW_1994, 120000);

    /* And a len that cuts a valid value short makes it what it then is. */
    EXPECT_DELAY_N("120", 2, NOW_1994, 12000);
    EXPECT_ERROR_N("120", 0, NOW_1994, -EINVAL);
    EXPECT_ERROR_N("Sun, 06 Nov 1994 08:51:37 GMT", 28, NOW_1994, -EINVAL);
}

Test(retry_after, null_arguments_are_einval)
{
    uint64_t got = SENTINEL;
    cr_expect_eq(retry_after_parse(NULL, 0, NOW_1994, &got), -EINVAL);
    cr_expect_eq(retry_after_parse(NULL, 5, NOW_1994, &got), -EINVAL);
    cr_expect_eq(got, SENTINEL);
    cr_expect_eq(retry_after_parse("120", 3, NOW_1994, NULL), -EINVAL);
}

/* ---- retry_after_parse_fields ---- */

Test(retry_after, fields_none_is_enoent)
{
    uint64_t got = SENTINEL;
    cr_expect_eq(retry_after_parse_fields(NULL, NULL, 0, NOW_1994, &got), -ENOENT);
    cr_expect_eq(got, SENTINEL);

    const char *const values[] = { "120" };
    const size_t lens[] = { 3 };
    cr_expect_eq(retry_after_parse_fields(values, lens, 0, NOW_1994, &got), -ENOENT);
    cr_expect_eq(got, SENTINEL);
}

Test(retry_after, fields_single_line_is_parsed)
{
    const char *const values[] = { "120" };
    const size_t lens[] = { 3 };
    uint64_t got = SENTINEL;
    cr_expect_eq(retry_after_parse_fields(values, lens, 1, NOW_1994, &got), 0);
    cr_expect_eq(got, 120000);

    /* The length is honoured here too: only "Sun, 06 Nov 1994 08:51:37 GMT" (29 bytes). */
    const char *const dates[] = { "Sun, 06 Nov 1994 08:51:37 GMT, garbage" };
    const size_t date_lens[] = { 29 };
    got = SENTINEL;
    cr_expect_eq(retry_after_parse_fields(dates, date_lens, 1, NOW_1994, &got), 0);
    cr_expect_eq(got, 120000);
}

Test(retry_after, fields_single_invalid_line_is_einval)
{
    const char *const values[] = { "soon" };
    const size_t lens[] = { 4 };
    uint64_t got = SENTINEL;
    cr_expect_eq(retry_after_parse_fields(values, lens, 1, NOW_1994, &got), -EINVAL);
    cr_expect_eq(got, SENTINEL);
}

Test(retry_after, fields_two_equal_lines_are_einval)
{
    const char *const values[] = { "120", "120" };
    const size_t lens[] = { 3, 3 };
    uint64_t got = SENTINEL;
    cr_expect_eq(retry_after_parse_fields(values, lens, 2, NOW_1994, &got), -EINVAL);
    cr_expect_eq(got, SENTINEL);
}

Test(retry_after, fields_two_different_lines_are_einval)
{
    const char *const values[] = { "120", "Sun, 06 Nov 1994 08:51:37 GMT" };
    const size_t lens[] = { 3, 29 };
    uint64_t got = SENTINEL;
    cr_expect_eq(retry_after_parse_fields(values, lens, 2, NOW_1994, &got), -EINVAL);
    cr_expect_eq(got, SENTINEL);
}
