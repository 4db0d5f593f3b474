/* fuzz_retry_after: the Retry-After parser of policy/retry_after.h against a reference.
 *
 * Input: eight bytes of "now" (int64 Unix milliseconds; see pick_now), then the field value.
 * The value is also cut at '\n' into field lines for retry_after_parse_fields().
 *
 * The reference is written differently from the parser: delta-seconds through strtoull, each
 * HTTP-date form read with sscanf and accepted only when printing the fields back in that
 * form's layout gives the input byte for byte, and the instant computed by glibc's timegm().
 * Every input must get the same answer (result code and delay) from both.
 */
#define FUZZ_NAME "fuzz_retry_after"
#include "tests/fuzz/fuzz.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "policy/retry_after.h"

#define SENTINEL UINT64_C(0x5eed5eed5eed5eed)

static const char *const short_days[] = { "Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat" };
static const char *const long_days[] = { "Sunday",   "Monday", "Tuesday", "Wednesday",
                                         "Thursday", "Friday", "Saturday" };
static const char *const months[] = { "Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                      "Jul", "Aug", "Sep", "Oct", "Nov", "Dec" };

static int index_of(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

/* The answer the parser must give: a result code and, for 0, the delay. */
struct answer {
    int rc;
    uint64_t delay;
};

/* Fields of a date as written; year is the full year (already resolved for RFC 850). */
struct fields {
    int64_t year;
    int mon; /* 0..11 */
    int day, hh, mm, ss;
};

static bool is_leap(int64_t y)
{
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

/* The Gregorian year of the instant 'ms' (Unix milliseconds), through glibc: any int64 is
 * within its reach (years up to about 2.9e8). */
static int64_t year_of(int64_t ms)
{
    /* Floor to whole seconds so that negative instants fall in the right second. */
    time_t sec = (time_t)(ms / 1000 - (ms % 1000 < 0 ? 1 : 0));
    struct tm tm;
    if (!gmtime_r(&sec, &tm))
        abort();
    return (int64_t)tm.tm_year + 1900;
}

static struct answer ref_date(const struct fields *f, int64_t now)
{
    static const int mdays[12] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
    struct answer a = { -EINVAL, 0 };
    int dim = mdays[f->mon] + (f->mon == 1 && is_leap(f->year));
    if (f->year < 1 || f->day < 1 || f->day > dim || f->hh > 23 || f->mm > 59 || f->ss > 60)
        return a;
    struct tm tm = { 0 };
    tm.tm_year = (int)(f->year - 1900);
    tm.tm_mon = f->mon;
    tm.tm_mday = f->day;
    tm.tm_hour = f->hh;
    tm.tm_min = f->mm;
    tm.tm_sec = f->ss; /* 60: timegm normalises to the next minute, as RFC 9110 arithmetic does */
    time_t t = timegm(&tm);
    __int128 ms = (__int128)t * 1000;
    if (ms > INT64_MAX) {
        a.rc = -ERANGE;
        return a;
    }
    a.rc = 0;
    if (ms <= now) {
        a.delay = 0;
    } else if (ms - now > INT64_MAX) {
        a.rc = -ERANGE;
    } else {
        a.delay = (uint64_t)(ms - now);
    }
    return a;
}

/* RFC 9110 §5.6.7: a two-digit year more than 50 years ahead is in the past century. Checked
 * by brute force over the candidate years with those last digits. */
static int64_t resolve_yy(int yy, int64_t now_year)
{
    int64_t best = INT64_MIN;
    for (int64_t c = (now_year / 100 - 2) * 100; c <= (now_year / 100 + 2) * 100; c += 100) {
        int64_t y = c + yy;
        if (y <= now_year + 50 && y > best)
            best = y;
    }
    return best;
}

static struct answer reference(const char *v, size_t len, int64_t now)
{
    struct answer a = { -EINVAL, 0 };
    /* OWS around the value: SP and HTAB only. */
    size_t b = 0, e = len;
    while (b < e && (v[b] == ' ' || v[b] == '\t'))
        b++;
    while (e > b && (v[e - 1] == ' ' || v[e - 1] == '\t'))
        e--;
    if (b == e || memchr(v + b, '\0', e - b))
        return a;

    if (v[b] >= '0' && v[b] <= '9') {
        for (size_t i = b; i < e; i++)
            if (v[i] < '0' || v[i] > '9')
                return a;
        /* Leading zeros do not count; past 19 significant digits it is out of range anyway. */
        while (b + 1 < e && v[b] == '0')
            b++;
        char digits[24];
        if (e - b > 19) {
            a.rc = -ERANGE;
            return a;
        }
        memcpy(digits, v + b, e - b);
        digits[e - b] = '\0';
        unsigned long long secs = strtoull(digits, NULL, 10);
        if (secs > (unsigned long long)(INT64_MAX / 1000)) {
            a.rc = -ERANGE;
            return a;
        }
        a.rc = 0;
        a.delay = (uint64_t)secs * 1000;
        return a;
    }

    char s[256];
    if (e - b >= sizeof(s))
        return a; /* longer than any date */
    memcpy(s, v + b, e - b);
    s[e - b] = '\0';

    char dn[16], mn[8], again[256];
    int day, year, hh, mm, ss;
    struct fields f;
    /* IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT". */
    if (sscanf(s, "%3[A-Za-z], %2d %3[A-Za-z] %4d %2d:%2d:%2d GMT", dn, &day, mn, &year, &hh, &mm,
               &ss) == 7 &&
        day >= 0 && year >= 0 && hh >= 0 && mm >= 0 && ss >= 0) {
        snprintf(again, sizeof(again), "%s, %02d %s %04d %02d:%02d:%02d GMT", dn, day, mn, year, hh,
                 mm, ss);
        int mon = index_of(mn, months, 12);
        if (strcmp(again, s) == 0 && index_of(dn, short_days, 7) >= 0 && mon >= 0) {
            f = (struct fields){ year, mon, day, hh, mm, ss };
            return ref_date(&f, now);
        }
    }
    /* RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT". */
    if (sscanf(s, "%9[A-Za-z], %2d-%3[A-Za-z]-%2d %2d:%2d:%2d GMT", dn, &day, mn, &year, &hh, &mm,
               &ss) == 7 &&
        day >= 0 && year >= 0 && hh >= 0 && mm >= 0 && ss >= 0) {
        snprintf(again, sizeof(again), "%s, %02d-%s-%02d %02d:%02d:%02d GMT", dn, day, mn, year, hh,
                 mm, ss);
        int mon = index_of(mn, months, 12);
        if (strcmp(again, s) == 0 && index_of(dn, long_days, 7) >= 0 && mon >= 0) {
            f = (struct fields){ resolve_yy(year, year_of(now)), mon, day, hh, mm, ss };
            return ref_date(&f, now);
        }
    }
    /* asctime: "Sun Nov  6 08:49:37 1994" or "Sun Nov 06 08:49:37 1994". */
    if (sscanf(s, "%3[A-Za-z] %3[A-Za-z] %2d %2d:%2d:%2d %4d", dn, mn, &day, &hh, &mm, &ss,
               &year) == 7 &&
        day >= 0 && year >= 0 && hh >= 0 && mm >= 0 && ss >= 0) {
        char again2[256];
        snprintf(again, sizeof(again), "%s %s %2d %02d:%02d:%02d %04d", dn, mn, day, hh, mm, ss,
                 year);
        snprintf(again2, sizeof(again2), "%s %s %02d %02d:%02d:%02d %04d", dn, mn, day, hh, mm, ss,
                 year);
        int mon = index_of(mn, months, 12);
        if ((strcmp(again, s) == 0 || strcmp(again2, s) == 0) && index_of(dn, short_days, 7) >= 0 &&
            mon >= 0) {
            f = (struct fields){ year, mon, day, hh, mm, ss };
            return ref_date(&f, now);
        }
    }
    return a;
}

/* "now" from the input: mostly near the present (so RFC 850 years resolve as in real life),
 * sometimes far away (up to INT64_MAX), which exercises the century arithmetic and the
 * overflow checks. */
static int64_t pick_now(uint64_t raw)
{
    const int64_t year_2026 = INT64_C(1767225600000);
    switch (raw & 3) {
    case 0:
        return year_2026 + (int64_t)((raw >> 2) % (UINT64_C(200) * 366 * 86400000)) -
               INT64_C(100) * 365 * 86400000;
    case 1:
        return (int64_t)(raw >> 2) - (INT64_C(1) << 61); /* about +-7e7 years */
    case 2:
        return INT64_MAX - (int64_t)((raw >> 2) % 1000000000); /* overflow edges */
    default:
        return (int64_t)((raw >> 2) % (UINT64_C(20000) * 366 * 86400000)) -
               INT64_C(10000) * 365 * 86400000;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = { data, size };
    int64_t now = pick_now(fuzz_u64(&in));
    const char *v = (const char *)in.p;
    size_t len = in.n;

    uint64_t got = SENTINEL;
    int rc = retry_after_parse(v, len, now, &got);
    FUZZ_CHECK(rc == 0 || rc == -EINVAL || rc == -ERANGE, "rc %d", rc);
    if (rc != 0)
        FUZZ_CHECK(got == SENTINEL, "rc %d but *delay_ms changed", rc);
    struct answer want = reference(v, len, now);
    FUZZ_CHECK(rc == want.rc && (rc != 0 || got == want.delay),
               "\"%.*s\" at now=%" PRId64 ": got rc %d delay %" PRIu64
               ", want rc %d delay %" PRIu64,
               (int)len, v, now, rc, got, want.rc, want.delay);
    bool rfc850 = memchr(v, '-', len) != NULL;

    /* OWS around the value changes nothing. */
    char *padded = malloc(len + 4);
    FUZZ_CHECK(padded != NULL, "out of memory");
    memcpy(padded, " \t", 2);
    memcpy(padded + 2, v, len);
    memcpy(padded + 2 + len, "\t ", 2);
    uint64_t got2 = SENTINEL;
    int rc2 = retry_after_parse(padded, len + 4, now, &got2);
    FUZZ_CHECK(rc2 == rc && got2 == got, "padding with OWS changed rc %d -> %d", rc, rc2);
    free(padded);

    /* A date's delay shrinks one for one as "now" advances (same year, so RFC 850 resolves
     * alike), and is 0 once "now" has passed it. */
    size_t first = 0;
    while (first < len && (v[first] == ' ' || v[first] == '\t'))
        first++;
    bool is_date = first < len && !(v[first] >= '0' && v[first] <= '9');
    if (rc == 0 && got > 0 && is_date && now < INT64_MAX - 1000) {
        uint64_t later = SENTINEL;
        int rc3 = retry_after_parse(v, len, now + 1, &later);
        if (!rfc850 || year_of(now) == year_of(now + 1))
            FUZZ_CHECK(rc3 == 0 && later == got - 1, "delay %" PRIu64 " then %" PRIu64, got, later);
    }

    /* retry_after_parse_fields: the lines of the input as field lines. */
    const char *vals[8];
    size_t lens[8];
    size_t nf = 0;
    for (size_t i = 0, start = 0; i <= len && nf < 8; i++) {
        if (i == len || v[i] == '\n') {
            vals[nf] = v + start;
            lens[nf] = i - start;
            nf++;
            start = i + 1;
        }
    }
    if (len == 0)
        nf = 0;
    uint64_t got_f = SENTINEL;
    int rc_f = retry_after_parse_fields(vals, lens, nf, now, &got_f);
    if (nf == 0) {
        FUZZ_CHECK(rc_f == -ENOENT, "no field line: rc %d", rc_f);
    } else if (nf > 1) {
        FUZZ_CHECK(rc_f == -EINVAL && got_f == SENTINEL, "%zu field lines: rc %d", nf, rc_f);
    } else {
        FUZZ_CHECK(rc_f == rc && (rc != 0 || got_f == got), "one field line: rc %d vs %d", rc_f,
                   rc);
    }
    FUZZ_CHECK(retry_after_parse_fields(NULL, NULL, 0, now, &got_f) == -ENOENT, "NULL, 0");
    FUZZ_CHECK(retry_after_parse(v, len, now, NULL) == -EINVAL, "NULL delay_ms");
    return 0;
}
