/* deliveries_query -- the filters of an admin request or a CLI command read from their text
 * (dq_set(), deliveries.h; docs/delivery.md "Admin API"). The text is anyone's who reaches the
 * admin port: tests/fuzz/fuzz_deliveries_query.c feeds it any bytes, and this file calls
 * nothing but store_state_parse() and the config's message tidier, so that target links it
 * alone. */
#include "proxy/ops/deliveries.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "config/errors.h"

const char *const dq_keys[] = { "route", "state",  "since", "until", "status",  "upstream",
                                "limit", "cursor", "order", "rate",  "dry_run", NULL };

void dq_init(struct dq *q)
{
    memset(q, 0, sizeof(*q));
    q->m.state = -1;
    q->rate = DELIVERIES_RATE_DEFAULT;
}

static int whole(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (!s || !*s)
        return -1;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9' || v > (max - (uint64_t)(*p - '0')) / 10)
            return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return 0;
}

/* The 'n' digits at 's' as a number, or -1 when one of them is not a digit (a NUL is not, so
 * nothing past the end of 's' is read). */
static int digits(const char *s, int n)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static int days_in_month(int y, int m)
{
    static const int days[] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
    bool leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    return m == 2 && leap ? 29 : days[m - 1];
}

/* ms since the epoch, or an RFC 3339 date-time (section 5.6: "2026-11-28T20:00:00Z", a
 * fraction and an offset optional, T and Z in either case), as written: every field its
 * number of digits and within its range (a 31st only in a month that has one; second 60, a
 * leap second, is the next minute's first, as POSIX time counts). strptime() took a space
 * before a number, one digit for two and any day up to 31, and timegm() moved 02-31 to
 * March. */
static int parse_time(const char *s, uint64_t *out)
{
    if (whole(s, UINT64_MAX / 2, out) == 0)
        return 0;
    int y, mo, d, h, mi, sec, oh = 0, om = 0;
    if ((y = digits(s, 4)) < 0 || s[4] != '-' || (mo = digits(s + 5, 2)) < 1 || mo > 12 ||
        s[7] != '-' || (d = digits(s + 8, 2)) < 1 || d > days_in_month(y, mo) ||
        (s[10] != 'T' && s[10] != 't') || (h = digits(s + 11, 2)) < 0 || h > 23 || s[13] != ':' ||
        (mi = digits(s + 14, 2)) < 0 || mi > 59 || s[16] != ':' || (sec = digits(s + 17, 2)) < 0 ||
        sec > 60)
        return -1;
    const char *p = s + 19;
    int64_t frac = 0;
    if (*p == '.') {
        if (p[1] < '0' || p[1] > '9')
            return -1;
        int64_t scale = 100; /* what a digit is worth in ms: the fourth and later add nothing */
        for (p++; *p >= '0' && *p <= '9'; p++, scale /= 10)
            frac += (*p - '0') * scale;
    }
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        if ((oh = digits(p + 1, 2)) < 0 || oh > 23 || p[3] != ':' || (om = digits(p + 4, 2)) < 0 ||
            om > 59)
            return -1;
        if (*p == '-') {
            oh = -oh;
            om = -om;
        }
        p += 6;
    } else {
        return -1;
    }
    if (*p)
        return -1;
    struct tm tm = { .tm_year = y - 1900,
                     .tm_mon = mo - 1,
                     .tm_mday = d,
                     .tm_hour = h,
                     .tm_min = mi,
                     .tm_sec = sec };
    int64_t ms = ((int64_t)timegm(&tm) - ((int64_t)oh * 60 + om) * 60) * 1000 + frac;
    if (ms < 0)
        return -1;
    *out = (uint64_t)ms;
    return 0;
}

int dq_set(struct dq *q, const char *key, const char *value, char *err, size_t cap)
{
    uint64_t v;
    bool filter = true;
    if (strcmp(key, "route") == 0) {
        q->m.route = value;
    } else if (strcmp(key, "upstream") == 0) {
        q->m.upstream = value; /* compared as it is written in the config */
    } else if (strcmp(key, "state") == 0) {
        if ((q->m.state = store_state_parse(value)) < 0)
            goto bad;
    } else if (strcmp(key, "since") == 0 || strcmp(key, "until") == 0) {
        if (parse_time(value, &v) < 0 || v == 0)
            goto bad;
        *(key[0] == 's' ? &q->m.since : &q->m.until) = v;
    } else if (strcmp(key, "status") == 0) {
        if (whole(value, 599, &v) < 0 || v < 100)
            goto bad;
        q->m.status = (int)v;
    } else if (strcmp(key, "limit") == 0) {
        if (whole(value, STORE_FIND_MAX, &v) < 0 || v == 0)
            goto bad;
        q->m.limit = (uint32_t)v;
        filter = false;
    } else if (strcmp(key, "cursor") == 0) {
        if (whole(value, INT64_MAX, &v) < 0)
            goto bad;
        q->m.cursor = v;
        filter = false;
    } else if (strcmp(key, "order") == 0) {
        if (strcmp(value, "newest") != 0 && strcmp(value, "oldest") != 0)
            goto bad;
        q->m.newest_first = value[0] == 'n';
        filter = false;
    } else if (strcmp(key, "rate") == 0) {
        if (whole(value, DELIVERIES_RATE_MAX, &v) < 0 || v == 0)
            goto bad;
        q->rate = (uint32_t)v;
        filter = false;
    } else if (strcmp(key, "dry_run") == 0) {
        if (strcmp(value, "1") != 0 && strcmp(value, "0") != 0 && strcmp(value, "true") != 0 &&
            strcmp(value, "false") != 0)
            goto bad;
        q->dry_run = value[0] == '1' || value[0] == 't';
        filter = false;
    } else {
        return 1;
    }
    q->filtered |= filter;
    return 0;
bad:;
    static const char *const want[][2] = {
        { "state", "scheduled, in_flight, delivered or dead" },
        { "since", "ms since the epoch or an RFC 3339 time (2026-11-28T20:00:00Z)" },
        { "until", "ms since the epoch or an RFC 3339 time (2026-11-28T20:00:00Z)" },
        { "status", "an HTTP status from 100 to 599" },
        { "limit", "a whole number from 1 to 1000" },
        { "cursor", "the next_cursor of the page before" },
        { "order", "newest or oldest" },
        { "rate", "a whole number from 1 to 1000 (per second)" },
        { "dry_run", "1 or 0" },
    };
    /* The value is quoted tidied (cfg_errs_tidy): it may hold any byte, and the message goes
     * into a JSON answer (jansson refuses invalid UTF-8: the admin API answered nothing) and
     * onto one line of the CLI's stderr. Fewer of its bytes are shown until the whole
     * message fits 'err', so that it never ends inside a character. */
    const char *what = "";
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (strcmp(key, want[i][0]) == 0)
            what = want[i][1];
    size_t len = strlen(value);
    for (int k = 48;; k /= 2) {
        char shown[49], quoted[6 * sizeof(shown) + 4];
        snprintf(shown, sizeof(shown), "%.*s", k, value);
        cfg_errs_tidy(quoted, shown, len > (size_t)k);
        int n = snprintf(err, cap, "%s must be %s, got '%s'", key, what, quoted);
        if ((n >= 0 && (size_t)n < cap) || k == 0)
            return -1;
    }
}
