/* fuzz_deliveries_query: the filters of the admin API's /deliveries and of `retryproxy
 * deliveries` (dq_set(), proxy/ops/deliveries.h; docs/delivery.md "Admin API"), whose values
 * are anyone's who reaches the admin port, against references written here another way.
 *
 * Input: a byte choosing the key (one of dq_keys, or one it does not know), a byte giving the
 * error buffer's size, a byte giving an offset for the RFC 3339 round trip, then the value
 * (cut at the first NUL, as a query string's value or an option's argument is).
 *
 * - a key dq_set does not know answers 1 and changes nothing;
 * - state: taken exactly when store_state_parse() takes it, as that state;
 * - since, until: taken exactly when the value is a whole number of ms from 1 to INT64_MAX
 *   (strtoull), or an RFC 3339 date-time (section 5.6: each field its digits, a date that is
 *   in the calendar by timegm() and gmtime_r() there and back, hours 0-23, minutes 0-59,
 *   seconds 0-60, a fraction, Z or an offset up to 23:59) after 1970, as the ms the reference
 *   computes; the ms written back as RFC 3339, with Z and with an offset, read again give the
 *   same ms;
 * - status 100..599, limit 1..1000, cursor up to INT64_MAX, rate 1..1000 as strtoull reads
 *   them (digits only), order and dry_run their words;
 * - q.filtered is set exactly by a filter taken (route, state, since, until, status);
 * - a refusal leaves a message in the buffer (exactly that large: a write past it is an ASan
 *   report) that is valid UTF-8 with no control character, and that ends with the quoted
 *   value when the buffer is large enough for any message (200 bytes, the admin API's).
 */
/* fuzz-link: proxy/ops/deliveries_query.c proxy/store/store.c */
#define FUZZ_NAME "fuzz_deliveries_query"
#include "tests/fuzz/fuzz.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "proxy/ops/deliveries.h"

/* Digits only, at least one, whose value fits 64 bits and is at most 'max'. */
static bool ref_whole(const char *s, uint64_t max, uint64_t *v)
{
    if (!*s || strspn(s, "0123456789") != strlen(s))
        return false;
    errno = 0;
    unsigned long long x = strtoull(s, NULL, 10);
    if (errno == ERANGE || x > max)
        return false;
    *v = x;
    return true;
}

/* Whether 's' has the shape of 'tmpl' over its length: 'd' a digit, 'T' T or t, others
 * themselves. */
static bool shaped(const char *s, const char *tmpl)
{
    for (size_t i = 0; tmpl[i]; i++) {
        char c = s[i];
        if (c == '\0')
            return false;
        if (tmpl[i] == 'd'   ? !(c >= '0' && c <= '9')
            : tmpl[i] == 'T' ? c != 'T' && c != 't'
                             : c != tmpl[i])
            return false;
    }
    return true;
}

static bool ref_rfc3339(const char *s, int64_t *ms)
{
    if (!shaped(s, "dddd-dd-ddTdd:dd:dd"))
        return false;
    int y, mo, d, h, mi, sec;
    if (sscanf(s, "%4d-%2d-%2d%*c%2d:%2d:%2d", &y, &mo, &d, &h, &mi, &sec) != 6)
        abort();
    /* the date is in the calendar when timegm() does not move it */
    struct tm tm = { .tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d };
    time_t day = timegm(&tm);
    struct tm back;
    if (mo < 1 || mo > 12 || d < 1 || !gmtime_r(&day, &back) || back.tm_year != y - 1900 ||
        back.tm_mon != mo - 1 || back.tm_mday != d || h > 23 || mi > 59 || sec > 60)
        return false;
    const char *p = s + 19;
    int64_t frac = 0;
    if (*p == '.') {
        size_t n = strspn(p + 1, "0123456789");
        if (n == 0)
            return false;
        char three[4] = "000";
        memcpy(three, p + 1, n < 3 ? n : 3);
        frac = strtol(three, NULL, 10);
        p += 1 + n;
    }
    int64_t off = 0;
    if (strcmp(p, "Z") == 0 || strcmp(p, "z") == 0) {
        off = 0;
    } else if (strlen(p) == 6 && (p[0] == '+' || p[0] == '-') && shaped(p + 1, "dd:dd")) {
        int oh = (p[1] - '0') * 10 + (p[2] - '0'), om = (p[4] - '0') * 10 + (p[5] - '0');
        if (oh > 23 || om > 59)
            return false;
        off = (p[0] == '+' ? 1 : -1) * ((int64_t)oh * 3600 + om * 60);
    } else {
        return false;
    }
    *ms = ((int64_t)day + h * 3600 + mi * 60 + sec - off) * 1000 + frac;
    return true;
}

static bool ref_time(const char *s, uint64_t *v)
{
    int64_t ms;
    if (ref_whole(s, INT64_MAX, v))
        return *v > 0;
    if (!ref_rfc3339(s, &ms) || ms <= 0)
        return false;
    *v = (uint64_t)ms;
    return true;
}

/* 'ms' as RFC 3339 at offset 'off_min' minutes east (a time of year 1 to 9999 there), into
 * 't'; false when it is outside those years. */
static bool write_rfc3339(uint64_t ms, int off_min, char *t, size_t cap)
{
    time_t s = (time_t)(ms / 1000) + (time_t)off_min * 60;
    struct tm tm;
    if (!gmtime_r(&s, &tm) || tm.tm_year + 1900 < 1 || tm.tm_year + 1900 > 9999)
        return false;
    int a = off_min < 0 ? -off_min : off_min;
    if (off_min == 0)
        snprintf(t, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000));
    else
        snprintf(t, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03d%c%02d:%02d", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000),
                 off_min < 0 ? '-' : '+', a / 60, a % 60);
    return true;
}

static void check_time_again(const char *key, uint64_t v, int off_min)
{
    char t[64], err[200];
    for (int i = 0; i < 2; i++) {
        int off = i ? off_min : 0;
        if (!write_rfc3339(v, off, t, sizeof(t)))
            continue;
        struct dq q;
        dq_init(&q);
        int r = dq_set(&q, key, t, err, sizeof(err));
        uint64_t again = key[0] == 's' ? q.m.since : q.m.until;
        FUZZ_CHECK(r == 0 && again == v, "%" PRIu64 " written %s read %d, %" PRIu64, v, t, r,
                   again);
    }
}

static void check_message(const char *err, size_t cap, const char *key)
{
    size_t n = strlen(err);
    FUZZ_CHECK(n < cap, "the message overran its buffer");
    FUZZ_CHECK(fuzz_utf8_ok(err, n), "message not UTF-8: %s", err);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK((unsigned char)err[i] >= 0x20 && err[i] != 0x7f, "control byte in: %s", err);
    if (cap >= 200) {
        FUZZ_CHECK(strncmp(err, key, strlen(key)) == 0, "message does not name %s: %s", key, err);
        FUZZ_CHECK(n > 0 && err[n - 1] == '\'', "message cut: %s", err);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = { data, size };
    size_t nkeys = 0;
    while (dq_keys[nkeys])
        nkeys++;
    uint8_t k = fuzz_byte(&in);
    const char *key = k % (nkeys + 1) < nkeys ? dq_keys[k % (nkeys + 1)] : "route_";
    size_t cap = 1 + fuzz_byte(&in) % 240;
    int off_min = ((int)fuzz_byte(&in) - 128) * 11; /* up to 23:28 either way */
    char *value = fuzz_piece(&in, 0, NULL);
    if (!value)
        value = strdup("");
    char *err = malloc(cap);
    if (!value || !err)
        abort();
    err[0] = '\0';

    struct dq q, fresh;
    dq_init(&q);
    dq_init(&fresh);
    int r = dq_set(&q, key, value, err, cap);
    FUZZ_CHECK(r >= -1 && r <= 1, "dq_set returned %d", r);
    if (r == 1) {
        FUZZ_CHECK(k % (nkeys + 1) == nkeys, "known key %s answered 1", key);
        FUZZ_CHECK(memcmp(&q, &fresh, sizeof(q)) == 0, "an unknown key changed the query");
        goto out;
    }
    FUZZ_CHECK(k % (nkeys + 1) < nkeys, "unknown key %s answered %d", key, r);
    if (r < 0)
        check_message(err, cap, key);

    uint64_t v = 0;
    bool ok;
    if (strcmp(key, "route") == 0) {
        ok = true;
        FUZZ_CHECK(q.m.route == value, "route not kept");
    } else if (strcmp(key, "upstream") == 0) {
        ok = true; /* any text: compared with the URLs as the config writes them */
        FUZZ_CHECK(q.m.upstream == value, "upstream not kept");
    } else if (strcmp(key, "state") == 0) {
        int st = store_state_parse(value);
        ok = st >= 0;
        FUZZ_CHECK(!ok || q.m.state == st, "state %d, store_state_parse %d", q.m.state, st);
    } else if (strcmp(key, "since") == 0 || strcmp(key, "until") == 0) {
        ok = ref_time(value, &v);
        uint64_t got = key[0] == 's' ? q.m.since : q.m.until;
        FUZZ_CHECK(!ok || r != 0 || got == v, "%s read as %" PRIu64 ", reference %" PRIu64, value,
                   got, v);
        if (ok && r == 0)
            check_time_again(key, v, off_min);
    } else if (strcmp(key, "status") == 0) {
        ok = ref_whole(value, 599, &v) && v >= 100;
        FUZZ_CHECK(!ok || r != 0 || q.m.status == (int)v, "status %d", q.m.status);
    } else if (strcmp(key, "limit") == 0) {
        ok = ref_whole(value, STORE_FIND_MAX, &v) && v >= 1;
        FUZZ_CHECK(!ok || r != 0 || q.m.limit == v, "limit %" PRIu32, q.m.limit);
    } else if (strcmp(key, "cursor") == 0) {
        ok = ref_whole(value, INT64_MAX, &v);
        FUZZ_CHECK(!ok || r != 0 || q.m.cursor == v, "cursor %" PRIu64, q.m.cursor);
    } else if (strcmp(key, "order") == 0) {
        ok = strcmp(value, "newest") == 0 || strcmp(value, "oldest") == 0;
        FUZZ_CHECK(!ok || r != 0 || q.m.newest_first == (value[0] == 'n'), "order");
    } else if (strcmp(key, "rate") == 0) {
        ok = ref_whole(value, DELIVERIES_RATE_MAX, &v) && v >= 1;
        FUZZ_CHECK(!ok || r != 0 || q.rate == v, "rate %" PRIu32, q.rate);
    } else {
        bool yes = strcmp(value, "1") == 0 || strcmp(value, "true") == 0;
        ok = yes || strcmp(value, "0") == 0 || strcmp(value, "false") == 0;
        FUZZ_CHECK(!ok || r != 0 || q.dry_run == yes, "dry_run");
    }
    FUZZ_CHECK((r == 0) == ok, "%s=%s: dq_set %d, reference %s", key, value, r,
               ok ? "takes it" : "refuses it");
    bool filter = strcmp(key, "route") == 0 || strcmp(key, "state") == 0 ||
                  strcmp(key, "since") == 0 || strcmp(key, "until") == 0 ||
                  strcmp(key, "status") == 0 || strcmp(key, "upstream") == 0;
    FUZZ_CHECK(q.filtered == (r == 0 && filter), "filtered %d after %s", q.filtered, key);
out:
    free(err);
    free(value);
    return 0;
}
