/* fuzz_headers: the header rules of proxy/http/headers.h against simple reference models.
 *
 * hdr_name_valid(_n), hdr_value_valid, fields_hop_by_hop, hdr_name_eq, hdr_token_listed and
 * hdr_parse_uint each agree with a plain model written here; hdr_match_host's output is the
 * input's case-folded prefix, lowercase, never longer, cut where the port starts, and fits the
 * given capacity exactly when it says so (the buffer is exactly that large); hdr_uuid's output
 * is a version 4 UUID in lowercase hex; hdr_value_uint is hdr_parse_uint of the trimmed value;
 * a value hdr_host_valid accepts holds no byte a host, an address or a port cannot have;
 * hlist_transfer_coding_ok (a response's Transfer-Encoding) accepts only one "chunked".
 *
 * Input: one flag byte (bit 0: keep_port for hdr_match_host), one byte for the output capacity
 * of hdr_match_host, eight bytes of RNG seed for hdr_uuid, then NUL-separated strings: a
 * header name (or host), a header value (or Connection list) and a second name. Missing
 * pieces are empty strings.
 */
#define FUZZ_NAME "fuzz_headers"
#include "tests/fuzz/fuzz.h"

#include <stdbool.h>
#include <string.h>

#include "proxy/http/fields.h"
#include "proxy/http/headers.h"
#include "proxy/http/hlist.h"

/* fuzz-link: proxy/http/hlist.c proxy/http/fields.c */

static char lc(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c + ('a' - 'A')) : c;
}

/* ASCII case-insensitive equality of 'n' bytes. */
static bool ieq(const char *a, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (lc(a[i]) != lc(b[i]))
            return false;
    return true;
}

static bool ref_name_eq(const char *a, const char *b)
{
    size_t n = strlen(a);
    return strlen(b) == n && ieq(a, b, n);
}

/* RFC 9110 §5.6.2: tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" /
 * "_" / "`" / "|" / "~" / DIGIT / ALPHA. */
static bool ref_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return true;
    switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
        return true;
    default:
        return false;
    }
}

static bool ref_name_valid(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if (!ref_tchar((unsigned char)*s))
            return false;
    return true;
}

/* Any byte but CTLs (0x00-0x1f, 0x7f), HTAB excepted: obs-text (0x80-0xff) passes. */
static bool ref_value_valid(const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return false;
    }
    return true;
}

static bool ref_hop_by_hop(const char *s)
{
    static const char *const hop[] = { "connection", "keep-alive",        "proxy-connection", "te",
                                       "trailer",    "transfer-encoding", "upgrade" };
    for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
        if (ref_name_eq(s, hop[i]))
            return true;
    return false;
}

/* The list split at every comma, each element stripped of SP and HTAB at both ends; whether
 * one element equals 'name' (non-empty) ignoring ASCII case. */
static bool ref_token_listed(const char *list, const char *name)
{
    size_t nl = strlen(name);
    const char *p = list;
    for (;;) {
        const char *comma = strchr(p, ',');
        const char *end = comma ? comma : p + strlen(p);
        const char *s = p, *e = end;
        while (s < e && (*s == ' ' || *s == '\t'))
            s++;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        if ((size_t)(e - s) == nl && ieq(s, name, nl))
            return true;
        if (!comma)
            return false;
        p = comma + 1;
    }
}

/* 1 to 18 ASCII digits (what the unit tests pin down), else -1. */
static int64_t ref_parse_uint(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 18)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return -1;
    return (int64_t)strtoull(s, NULL, 10);
}

/* hdr_value_uint: the reference number of the value without its SP/HTAB around it. */
static void check_value_uint(const char *v)
{
    size_t n = strlen(v), s = 0, e = n;
    while (s < e && (v[s] == ' ' || v[s] == '\t'))
        s++;
    while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
        e--;
    char *core = malloc(e - s + 1);
    FUZZ_CHECK(core != NULL, "out of memory");
    memcpy(core, v + s, e - s);
    core[e - s] = '\0';
    FUZZ_CHECK(hdr_value_uint(v, n) == ref_parse_uint(core), "hdr_value_uint(\"%s\")", v);
    free(core);
}

/* hdr_host_valid: a value with a byte no host, address or port can hold is never valid; one
 * that is valid is matched (hdr_match_host) without complaint. Read over exactly n bytes. */
static void check_host_valid(const char *v)
{
    size_t n = strlen(v);
    char *exact = malloc(n ? n : 1);
    FUZZ_CHECK(exact != NULL, "out of memory");
    memcpy(exact, v, n);
    bool ok = hdr_host_valid(exact, n);
    if (ok) {
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(!strchr(" \t/?#@\"<>\\^`{|}", v[i]) && (unsigned char)v[i] > 0x20 &&
                           (unsigned char)v[i] < 0x7f,
                       "hdr_host_valid(\"%s\") with byte %zu", v, i);
        char out[512];
        if (n < sizeof(out))
            FUZZ_CHECK(hdr_match_host(exact, n, false, out, sizeof(out)) == 0,
                       "hdr_match_host(\"%s\")", v);
    }
    free(exact);
}

/* hlist_transfer_coding_ok over one or two Transfer-Encoding fields: accepted only when the
 * values, commas, spaces and tabs removed, spell "chunked" in any case; refused only when they
 * do not, or spell it in more than one word ("chun ked", "chunked, chunked"). */
static void check_transfer_coding(const char *v1, const char *v2)
{
    struct hlist h = { 0 };
    if (hlist_add(&h, "Transfer-Encoding", 17, v1, strlen(v1)) < 0 ||
        (*v2 && hlist_add(&h, "transfer-encoding", 17, v2, strlen(v2)) < 0)) {
        hlist_free(&h);
        return;
    }
    char squeezed[16];
    size_t n = 0, words = 0;
    const char *vals[2] = { v1, v2 };
    for (int k = 0; k < 2; k++) {
        bool in_word = false;
        for (const char *p = vals[k]; *p; p++) {
            if (*p == ',' || *p == ' ' || *p == '\t') {
                in_word = false;
                continue;
            }
            if (!in_word)
                words++;
            in_word = true;
            if (n < sizeof(squeezed) - 1)
                squeezed[n++] = lc(*p);
            else
                words = 99;
        }
    }
    squeezed[n] = '\0';
    bool ok = hlist_transfer_coding_ok(&h);
    if (ok)
        FUZZ_CHECK(strcmp(squeezed, "chunked") == 0, "Transfer-Encoding \"%s\" / \"%s\" accepted",
                   v1, v2);
    else
        FUZZ_CHECK(strcmp(squeezed, "chunked") != 0 || words != 1,
                   "Transfer-Encoding \"%s\" / \"%s\" refused", v1, v2);
    hlist_free(&h);
}

static void check_match_host(const char *host, bool keep_port, size_t cap)
{
    size_t in_len = strlen(host);
    /* Exactly 'cap' bytes, so AddressSanitizer sees any write past them. */
    char *out = malloc(cap ? cap : 1);
    FUZZ_CHECK(out != NULL, "out of memory");
    int rc = hdr_match_host(host, in_len, keep_port, out, cap);
    FUZZ_CHECK(rc == 0 || rc == -1, "rc %d", rc);

    /* The same host with room to spare gives the full answer to compare with. */
    char *full = malloc(in_len + 1);
    FUZZ_CHECK(full != NULL, "out of memory");
    FUZZ_CHECK(hdr_match_host(host, in_len, keep_port, full, in_len + 1) == 0,
               "a buffer as long as the input plus its NUL must always do (\"%s\")", host);
    size_t n = strlen(full);
    FUZZ_CHECK(n <= in_len, "output longer than the input: \"%s\" -> \"%s\"", host, full);
    FUZZ_CHECK(ieq(full, host, n), "output is not a case-folded prefix of \"%s\": \"%s\"", host,
               full);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(!(full[i] >= 'A' && full[i] <= 'Z'), "uppercase in output \"%s\"", full);
    if (keep_port) {
        FUZZ_CHECK(n == in_len, "keep_port cut \"%s\" to \"%s\"", host, full);
    } else {
        /* Without the port: a bracketed IPv6 literal keeps its brackets and loses what
         * follows (an unclosed '[' is left alone: no configured host can match it), otherwise
         * nothing from the last ':' on survives. */
        if (host[0] == '[' && strchr(host, ']')) {
            FUZZ_CHECK(n > 0 && full[n - 1] == ']' && memchr(full, ']', n) == full + n - 1,
                       "\"%s\" -> \"%s\": the literal up to its first ']' expected", host, full);
        } else if (host[0] == '[') {
            FUZZ_CHECK(n == in_len, "\"%s\" with an unclosed '[' was cut to \"%s\"", host, full);
        } else if (strchr(host, ':')) {
            FUZZ_CHECK(host[n] == ':' && strchr(host + n + 1, ':') == NULL,
                       "\"%s\" -> \"%s\": cut at the last ':' expected", host, full);
        } else {
            FUZZ_CHECK(n == in_len, "\"%s\" without a port was cut to \"%s\"", host, full);
        }
    }
    if (rc == 0) {
        FUZZ_CHECK(n + 1 <= cap, "rc 0 though \"%s\" does not fit in %zu bytes", full, cap);
        FUZZ_CHECK(strcmp(out, full) == 0, "\"%s\" vs \"%s\"", out, full);
    } else {
        FUZZ_CHECK(n + 1 > cap, "rc -1 though \"%s\" fits in %zu bytes", full, cap);
    }
    free(full);
    free(out);
}

static void check_uuid(uint64_t seed)
{
    struct rng r;
    rng_seed(&r, seed);
    char u[37 + 8];
    memset(u, 'Z', sizeof(u));
    hdr_uuid(&r, u);
    FUZZ_CHECK(u[36] == '\0' && u[37] == 'Z', "uuid not 36 characters and a NUL");
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23)
            FUZZ_CHECK(u[i] == '-', "uuid %s", u);
        else
            FUZZ_CHECK((u[i] >= '0' && u[i] <= '9') || (u[i] >= 'a' && u[i] <= 'f'), "uuid %s", u);
    }
    FUZZ_CHECK(u[14] == '4' && strchr("89ab", u[19]) != NULL, "uuid %s: not version 4", u);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = { data, size };
    uint8_t flags = fuzz_byte(&in);
    size_t cap = fuzz_byte(&in);
    uint64_t seed = fuzz_u64(&in);
    char *a = fuzz_piece(&in, 0, NULL);
    char *b = fuzz_piece(&in, 0, NULL);
    char *c = fuzz_piece(&in, 0, NULL);
    char empty[1] = "";
    const char *name = a ? a : empty, *value = b ? b : empty, *name2 = c ? c : empty;

    FUZZ_CHECK(hdr_name_valid(name) == ref_name_valid(name), "hdr_name_valid(\"%s\")", name);
    FUZZ_CHECK(hdr_value_valid(value) == ref_value_valid(value), "hdr_value_valid(\"%s\")", value);
    FUZZ_CHECK(hdr_value_valid(name) == ref_value_valid(name), "hdr_value_valid(\"%s\")", name);
    FUZZ_CHECK(fields_hop_by_hop(name, strlen(name)) == ref_hop_by_hop(name),
               "fields_hop_by_hop(\"%s\")", name);
    FUZZ_CHECK(hdr_name_eq(name, name2) == ref_name_eq(name, name2), "hdr_name_eq(\"%s\", \"%s\")",
               name, name2);
    FUZZ_CHECK(hdr_name_eq(name, name), "hdr_name_eq(\"%s\") with itself", name);
    /* An empty name is never a header name; the callers look up names that came as fields. */
    if (*name) {
        FUZZ_CHECK(hdr_token_listed(value, name) == ref_token_listed(value, name),
                   "hdr_token_listed(\"%s\", \"%s\")", value, name);
        if (!ref_token_listed(value, name) && !strchr(name, ',') && name[0] != ' ' &&
            name[0] != '\t') {
            /* Appending the name to the list makes it listed. */
            size_t lv = strlen(value), ln = strlen(name);
            char *l = malloc(lv + ln + 2);
            FUZZ_CHECK(l != NULL, "out of memory");
            memcpy(l, value, lv);
            l[lv] = ',';
            memcpy(l + lv + 1, name, ln + 1);
            size_t e = strlen(l);
            bool trailing_ows = e > 0 && (l[e - 1] == ' ' || l[e - 1] == '\t');
            if (!trailing_ows)
                FUZZ_CHECK(hdr_token_listed(l, name), "\"%s\" not found in \"%s\"", name, l);
            free(l);
        }
    }
    FUZZ_CHECK(hdr_parse_uint(name) == ref_parse_uint(name),
               "hdr_parse_uint(\"%s\") = %lld, not %lld", name, (long long)hdr_parse_uint(name),
               (long long)ref_parse_uint(name));
    FUZZ_CHECK(hdr_parse_uint(value) == ref_parse_uint(value), "hdr_parse_uint(\"%s\")", value);

    /* hdr_name_valid_n over the raw pieces (NUL separators included) in a buffer of exactly
     * that many bytes, with no NUL after it: a read past 'n' is an AddressSanitizer report. */
    size_t raw_n = size > 10 ? size - 10 : 0;
    char *raw = malloc(raw_n ? raw_n : 1);
    FUZZ_CHECK(raw != NULL, "out of memory");
    if (raw_n)
        memcpy(raw, data + 10, raw_n);
    bool want_n = raw_n > 0;
    for (size_t i = 0; i < raw_n; i++)
        want_n &= ref_tchar((unsigned char)raw[i]);
    FUZZ_CHECK(hdr_name_valid_n(raw, raw_n) == want_n, "hdr_name_valid_n over %zu bytes", raw_n);
    size_t ln = strlen(name);
    FUZZ_CHECK(hdr_name_valid_n(name, ln) == ref_name_valid(name), "hdr_name_valid_n(\"%s\")",
               name);
    free(raw);

    check_value_uint(value);
    check_transfer_coding(value, name2);
    check_host_valid(name);
    check_host_valid(value);
    check_match_host(name, flags & 1, cap);
    check_match_host(value, !(flags & 1), cap);
    check_uuid(seed);

    free(a);
    free(b);
    free(c);
    return 0;
}
