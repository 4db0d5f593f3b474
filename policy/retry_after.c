/* retry_after -- Retry-After parsing (RFC 9110 §10.2.3, HTTP-date grammar from §5.6.7).
 *
 * The parser is deliberately strict: a retry delay we misread could hammer an upstream that
 * asked us to back off, so anything outside the grammar is rejected rather than guessed at.
 * Everything is ASCII-only and locale-free (no <ctype.h>, no libc time functions), and every
 * product or sum is range-checked before it is formed so that no input can make it wrap.
 */
#include "policy/retry_after.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#define MS_PER_SECOND   1000
#define SECONDS_PER_DAY 86400

/* Days from 0001-01-01 to 1970-01-01 in the proleptic Gregorian calendar; lets us count from
 * year 1, where every division below is on non-negative numbers. */
#define DAYS_YEAR1_TO_EPOCH 719162

/* Length of one full Gregorian cycle (400 years), used to fold arbitrary day counts. */
#define DAYS_PER_400_YEARS 146097
#define DAYS_PER_100_YEARS 36524
#define DAYS_PER_4_YEARS   1461
#define DAYS_PER_YEAR      365

static const char *const short_day_names[] = { "Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat" };
static const char *const long_day_names[] = { "Sunday",   "Monday", "Tuesday", "Wednesday",
                                              "Thursday", "Friday", "Saturday" };
static const char *const month_names[] = { "Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                           "Jul", "Aug", "Sep", "Oct", "Nov", "Dec" };

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

/* A broken-down UTC time as written in the field, before any range validation. */
struct civil_time {
    int64_t year;
    int month; /* 1..12 */
    int day;
    int hour;
    int minute;
    int second;
};

/* A read position in the (trimmed) field value; 'end' is one past the last byte we may read,
 * which is how the caller's 'len' is honoured without ever looking for a terminator. */
struct cursor {
    const char *p;
    const char *end;
};

/* True for the ASCII decimal digits only; isdigit() may accept more under some locales. */
static bool is_ascii_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* True for OWS bytes (RFC 9110 §5.6.3: SP and HTAB). */
static bool is_ows(char c)
{
    return c == ' ' || c == '\t';
}

/* Consumes byte 'c' if it is next; the cursor moves only on a match. */
static bool take_char(struct cursor *cur, char c)
{
    if (cur->p == cur->end || *cur->p != c)
        return false;
    cur->p++;
    return true;
}

/* Consumes exactly 'count' ASCII digits into *value. Fixed-width fields in the date grammar
 * are at most 4 digits, so the result cannot overflow. */
static bool take_digits(struct cursor *cur, int count, int *value)
{
    if (cur->end - cur->p < count)
        return false;
    int v = 0;
    for (int i = 0; i < count; i++) {
        char c = cur->p[i];
        if (!is_ascii_digit(c))
            return false;
        v = v * 10 + (c - '0');
    }
    cur->p += count;
    *value = v;
    return true;
}

/* Consumes one of 'names' (matched byte for byte, so case-sensitively as RFC 9110 requires)
 * and stores its index. No name in any table is a prefix of another, so the first match is the
 * only possible one. */
static bool take_name(struct cursor *cur, const char *const *names, size_t count, int *index)
{
    size_t avail = (size_t)(cur->end - cur->p);
    for (size_t i = 0; i < count; i++) {
        size_t n = strlen(names[i]);
        if (n <= avail && memcmp(cur->p, names[i], n) == 0) {
            cur->p += n;
            *index = (int)i;
            return true;
        }
    }
    return false;
}

/* Consumes the literal 'lit' exactly. */
static bool take_literal(struct cursor *cur, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(cur->end - cur->p) < n || memcmp(cur->p, lit, n) != 0)
        return false;
    cur->p += n;
    return true;
}

/* time-of-day = hour ":" minute ":" second, each 2DIGIT. Ranges are checked later, with the
 * date, so that every impossible value takes the same path. */
static bool take_time_of_day(struct cursor *cur, struct civil_time *t)
{
    return take_digits(cur, 2, &t->hour) && take_char(cur, ':') &&
           take_digits(cur, 2, &t->minute) && take_char(cur, ':') &&
           take_digits(cur, 2, &t->second);
}

/* Consumes a month name and stores it 1-based. */
static bool take_month(struct cursor *cur, struct civil_time *t)
{
    int index;
    if (!take_name(cur, month_names, COUNT_OF(month_names), &index))
        return false;
    t->month = index + 1;
    return true;
}

/* The two forms that end in "GMT" share one shape: day-name "," SP day SEP month SEP year SP
 * time-of-day SP "GMT", with their own day names, separator and year width. The weekday is
 * parsed only for its form; RFC 9110 does not require it to agree with the date. */
struct gmt_date_form {
    const char *const *day_names;
    size_t n_day_names;
    char sep;        /* between day, month and year */
    int year_digits; /* stored as written in t->year */
};

/* IMF-fixdate = day-name "," SP day SP month SP year SP time-of-day SP "GMT", e.g.
 * "Sun, 06 Nov 1994 08:49:37 GMT". */
static const struct gmt_date_form imf_fixdate = { .day_names = short_day_names,
                                                  .n_day_names = COUNT_OF(short_day_names),
                                                  .sep = ' ',
                                                  .year_digits = 4 };

/* rfc850-date = day-name-l "," SP day "-" month "-" 2DIGIT SP time-of-day SP "GMT", e.g.
 * "Sunday, 06-Nov-94 08:49:37 GMT". The caller resolves the two-digit year's century, which
 * needs "now". */
static const struct gmt_date_form rfc850_date = { .day_names = long_day_names,
                                                  .n_day_names = COUNT_OF(long_day_names),
                                                  .sep = '-',
                                                  .year_digits = 2 };

/* One of the forms above; the whole of 'cur' must be consumed. */
static bool parse_gmt_date(struct cursor cur, const struct gmt_date_form *form,
                           struct civil_time *t)
{
    int weekday;
    int year;
    if (!(take_name(&cur, form->day_names, form->n_day_names, &weekday) && take_char(&cur, ',') &&
          take_char(&cur, ' ') && take_digits(&cur, 2, &t->day) && take_char(&cur, form->sep) &&
          take_month(&cur, t) && take_char(&cur, form->sep) &&
          take_digits(&cur, form->year_digits, &year) && take_char(&cur, ' ') &&
          take_time_of_day(&cur, t) && take_literal(&cur, " GMT")))
        return false;
    t->year = year;
    return cur.p == cur.end;
}

/* asctime-date = day-name SP month SP ( 2DIGIT / ( SP DIGIT ) ) SP time-of-day SP year, e.g.
 * "Sun Nov  6 08:49:37 1994". The day is always two bytes wide: either two digits or a space
 * and one digit. */
static bool parse_asctime_date(struct cursor cur, struct civil_time *t)
{
    int weekday;
    int year;
    if (!(take_name(&cur, short_day_names, COUNT_OF(short_day_names), &weekday) &&
          take_char(&cur, ' ') && take_month(&cur, t) && take_char(&cur, ' ')))
        return false;
    if (take_char(&cur, ' ')) {
        if (!take_digits(&cur, 1, &t->day))
            return false;
    } else if (!take_digits(&cur, 2, &t->day)) {
        return false;
    }
    if (!(take_char(&cur, ' ') && take_time_of_day(&cur, t) && take_char(&cur, ' ') &&
          take_digits(&cur, 4, &year)))
        return false;
    t->year = year;
    return cur.p == cur.end;
}

/* True when 'year' (>= 1) is a Gregorian leap year. */
static bool is_leap_year(int64_t year)
{
    return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
}

/* Days in 'month' (1..12) of 'year'. */
static int days_in_month(int64_t year, int month)
{
    static const int lengths[12] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
    if (month == 2 && is_leap_year(year))
        return 29;
    return lengths[month - 1];
}

/* True when 't' names a real instant. Second 60 is allowed because a leap second is a legal
 * HTTP-date; it is then converted arithmetically, i.e. as the first second of the next minute. */
static bool civil_time_is_valid(const struct civil_time *t)
{
    return t->year >= 1 && t->month >= 1 && t->month <= 12 && t->day >= 1 &&
           t->day <= days_in_month(t->year, t->month) && t->hour <= 23 && t->minute <= 59 &&
           t->second <= 60;
}

/* Days from 1970-01-01 to year-month-day (proleptic Gregorian; year >= 1, date valid). Counts
 * whole years since 0001-01-01 with the 4/100/400 rule, then whole months of the year. Years
 * reach at most ~2.9e8 (an RFC 850 year near the int64 millisecond limit), so neither this nor
 * the caller's conversion to seconds comes near int64 overflow. */
static int64_t days_from_civil(int64_t year, int month, int day)
{
    /* Days before each month in a common year. */
    static const int before_month[12] = { 0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334 };
    int64_t y = year - 1;
    int64_t days = y * DAYS_PER_YEAR + y / 4 - y / 100 + y / 400;
    days += before_month[month - 1];
    if (month > 2 && is_leap_year(year))
        days += 1;
    days += day - 1;
    return days - DAYS_YEAR1_TO_EPOCH;
}

/* Floor division for a positive divisor; C's '/' truncates toward zero, which would put
 * instants before 1970 in the wrong day. */
static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if (a % b != 0 && a < 0)
        q -= 1;
    return q;
}

/* Gregorian year containing the instant 'unix_ms' (any int64, so the year may be <= 0). Folds
 * the day count into 400-year cycles, then peels off centuries, 4-year groups and years; the
 * last unit of each group is one day longer, which is why each step is clamped at its top. */
static int64_t year_of_unix_ms(int64_t unix_ms)
{
    int64_t days = floor_div(unix_ms, (int64_t)SECONDS_PER_DAY * MS_PER_SECOND);
    int64_t from_year1 = days + DAYS_YEAR1_TO_EPOCH;
    int64_t cycles = floor_div(from_year1, DAYS_PER_400_YEARS);
    int64_t rem = from_year1 - cycles * DAYS_PER_400_YEARS; /* 0..146096 */
    int64_t centuries = rem / DAYS_PER_100_YEARS;
    if (centuries > 3)
        centuries = 3;
    rem -= centuries * DAYS_PER_100_YEARS;
    int64_t quads = rem / DAYS_PER_4_YEARS;
    rem -= quads * DAYS_PER_4_YEARS;
    int64_t years = rem / DAYS_PER_YEAR;
    if (years > 3)
        years = 3;
    return 1 + cycles * 400 + centuries * 100 + quads * 4 + years;
}

/* Resolves an RFC 850 two-digit year against the current year. RFC 9110 §5.6.7 says a year
 * that appears more than 50 years in the future is the most recent past year with the same
 * last two digits. We read that as a 100-year sliding window [now - 49, now + 50]: the year
 * with those digits inside it is the only one neither too far ahead nor a century stale. */
static int64_t resolve_two_digit_year(int two_digits, int64_t now_year)
{
    int64_t year = floor_div(now_year, 100) * 100 + two_digits;
    if (year > now_year + 50)
        year -= 100;
    else if (year < now_year - 49)
        year += 100;
    return year;
}

/* Turns a validated date into a delay relative to 'now_unix_ms'. Returns -ERANGE when the
 * date in milliseconds, or its distance from now, does not fit in int64. */
static int delay_until(const struct civil_time *t, int64_t now_unix_ms, uint64_t *delay_ms)
{
    int64_t seconds = days_from_civil(t->year, t->month, t->day) * SECONDS_PER_DAY +
                      (int64_t)t->hour * 3600 + t->minute * 60 + t->second;
    /* Years are >= 1, so only the upper end can overflow. */
    if (seconds > INT64_MAX / MS_PER_SECOND)
        return -ERANGE;
    int64_t date_ms = seconds * MS_PER_SECOND;
    if (date_ms <= now_unix_ms) {
        *delay_ms = 0;
        return 0;
    }
    /* date_ms > now here, so the difference can only exceed INT64_MAX when now is negative;
     * INT64_MAX + now cannot overflow in that case. */
    if (now_unix_ms < 0 && date_ms > INT64_MAX + now_unix_ms)
        return -ERANGE;
    *delay_ms = (uint64_t)(date_ms - now_unix_ms);
    return 0;
}

/* delta-seconds = 1*DIGIT. The whole of 'cur' must be digits (checked first, so a malformed
 * value is -EINVAL even when it is also huge); -ERANGE when seconds * 1000 exceeds INT64_MAX.
 * Leading zeros never count toward the limit. */
static int parse_delta_seconds(struct cursor cur, uint64_t *delay_ms)
{
    for (const char *p = cur.p; p < cur.end; p++) {
        if (!is_ascii_digit(*p))
            return -EINVAL;
    }
    const int64_t limit = INT64_MAX / MS_PER_SECOND;
    int64_t seconds = 0;
    for (const char *p = cur.p; p < cur.end; p++) {
        int digit = *p - '0';
        /* seconds * 10 + digit > limit, rearranged so nothing is computed out of range. */
        if (seconds > (limit - digit) / 10)
            return -ERANGE;
        seconds = seconds * 10 + digit;
    }
    *delay_ms = (uint64_t)(seconds * MS_PER_SECOND);
    return 0;
}

int retry_after_parse(const char *value, size_t len, int64_t now_unix_ms, uint64_t *delay_ms)
{
    /* A NULL value is either a caller bug or an empty field; neither is a valid delay. */
    if (delay_ms == NULL || value == NULL)
        return -EINVAL;

    struct cursor cur = { value, value + len };
    while (cur.p < cur.end && is_ows(*cur.p))
        cur.p++;
    while (cur.end > cur.p && is_ows(cur.end[-1]))
        cur.end--;
    if (cur.p == cur.end)
        return -EINVAL;

    /* Every HTTP-date starts with a day name, so a leading digit can only be delta-seconds. */
    if (is_ascii_digit(*cur.p))
        return parse_delta_seconds(cur, delay_ms);

    struct civil_time t;
    if (!parse_gmt_date(cur, &imf_fixdate, &t) && !parse_asctime_date(cur, &t)) {
        if (!parse_gmt_date(cur, &rfc850_date, &t))
            return -EINVAL;
        t.year = resolve_two_digit_year((int)t.year, year_of_unix_ms(now_unix_ms));
    }
    if (!civil_time_is_valid(&t))
        return -EINVAL;
    return delay_until(&t, now_unix_ms, delay_ms);
}

int retry_after_parse_fields(const char *const *values, const size_t *lens, size_t n,
                             int64_t now_unix_ms, uint64_t *delay_ms)
{
    if (n == 0)
        return -ENOENT;
    /* Two field lines are ambiguous even when equal: a proxy merging them would have produced
     * the invalid list "a, a", and we refuse to pick one on the sender's behalf. */
    if (n > 1 || values == NULL || lens == NULL)
        return -EINVAL;
    return retry_after_parse(values[0], lens[0], now_unix_ms, delay_ms);
}
