#include "proxy/http/headers.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

bool hdr_name_eq(const char *a, const char *b)
{
    return strcasecmp(a, b) == 0;
}

bool hdr_token_listed(const char *list, const char *name)
{
    size_t nl = strlen(name);
    const char *p = list;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *start = p;
        while (*p && *p != ',')
            p++;
        const char *end = p;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        if ((size_t)(end - start) == nl && strncasecmp(start, name, nl) == 0)
            return true;
    }
    return false;
}

bool hdr_name_valid(const char *name)
{
    return hdr_name_valid_n(name, strlen(name));
}

/* RFC 9110 5.6.2 tchar: the bytes a field name is made of. */
static const bool tchar[256] = {
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1, ['*'] = 1, ['+'] = 1,
    ['-'] = 1, ['.'] = 1, ['^'] = 1, ['_'] = 1, ['`'] = 1, ['|'] = 1,  ['~'] = 1, ['0'] = 1,
    ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1,  ['7'] = 1, ['8'] = 1,
    ['9'] = 1, ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1,  ['F'] = 1, ['G'] = 1,
    ['H'] = 1, ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1,  ['N'] = 1, ['O'] = 1,
    ['P'] = 1, ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1, ['U'] = 1,  ['V'] = 1, ['W'] = 1,
    ['X'] = 1, ['Y'] = 1, ['Z'] = 1, ['a'] = 1, ['b'] = 1, ['c'] = 1,  ['d'] = 1, ['e'] = 1,
    ['f'] = 1, ['g'] = 1, ['h'] = 1, ['i'] = 1, ['j'] = 1, ['k'] = 1,  ['l'] = 1, ['m'] = 1,
    ['n'] = 1, ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1, ['s'] = 1,  ['t'] = 1, ['u'] = 1,
    ['v'] = 1, ['w'] = 1, ['x'] = 1, ['y'] = 1, ['z'] = 1,
};

bool hdr_name_valid_n(const char *name, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!tchar[(unsigned char)name[i]])
            return false;
    return true;
}

bool hdr_value_valid(const char *value)
{
    return hdr_value_valid_n(value, strlen(value));
}

bool hdr_value_valid_n(const char *value, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)value[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return false;
    }
    return true;
}

const char *hdr_trim(const char *v, size_t *n)
{
    const char *e = v + *n;
    while (v < e && (*v == ' ' || *v == '\t'))
        v++;
    while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
    *n = (size_t)(e - v);
    return v;
}

/* The number the 'n' bytes at 's' spell: 1 to 18 digits, else -1. */
static int64_t parse_digits(const char *s, size_t n)
{
    int64_t v = 0;
    if (n == 0 || n > 18)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

int64_t hdr_parse_uint(const char *s)
{
    return parse_digits(s, strlen(s));
}

int64_t hdr_value_uint(const char *s, size_t n)
{
    s = hdr_trim(s, &n);
    return parse_digits(s, n);
}

void hdr_uuid(struct rng *r, char out[37])
{
    uint64_t hi = rng_next(r), lo = rng_next(r);
    hi = (hi & 0xffffffffffff0fffULL) | 0x0000000000004000ULL; /* version 4 */
    lo = (lo & 0x3fffffffffffffffULL) | 0x8000000000000000ULL; /* variant 10 */
    /* 8-4-4-4-12 lowercase hex digits: hi's 16, then lo's 16 */
    static const char hex[] = "0123456789abcdef";
    char *o = out;
    for (int i = 60; i >= 0; i -= 4) {
        *o++ = hex[(hi >> i) & 0xf];
        if (i == 32 || i == 16)
            *o++ = '-';
    }
    *o++ = '-';
    for (int i = 60; i >= 0; i -= 4) {
        *o++ = hex[(lo >> i) & 0xf];
        if (i == 48)
            *o++ = '-';
    }
    *o = '\0';
}

char *hdr_utoa(uint64_t v, char *out)
{
    char tmp[20];
    size_t n = 0;
    do
        tmp[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n)
        *out++ = tmp[--n];
    *out = '\0';
    return out;
}

/* RFC 3986 2.3 unreserved, and 2.2 sub-delims: the bytes of a reg-name besides %XX. */
static bool is_reg_name_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("-._~!$&'()*+,;=", c));
}

static bool is_hex(unsigned char c)
{
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
}

/* The inside of an IP-literal's brackets: IPv6address or IPvFuture (RFC 3986 3.2.2). */
static bool ip_literal_valid(const char *v, size_t n)
{
    if (n >= 2 && (v[0] | 0x20) == 'v') {
        /* "v" 1*HEXDIG "." 1*( unreserved / sub-delims / ":" ) */
        size_t i = 1;
        while (i < n && is_hex((unsigned char)v[i]))
            i++;
        if (i == 1 || i >= n || v[i] != '.' || i + 1 == n)
            return false;
        for (i++; i < n; i++)
            if (v[i] != ':' && !is_reg_name_byte((unsigned char)v[i]))
                return false;
        return true;
    }
    char a[INET6_ADDRSTRLEN];
    struct in6_addr addr;
    if (n == 0 || n >= sizeof(a))
        return false;
    memcpy(a, v, n);
    a[n] = '\0';
    return inet_pton(AF_INET6, a, &addr) == 1;
}

bool hdr_host_valid(const char *v, size_t n)
{
    size_t i = 0;
    if (n && v[0] == '[') {
        const char *close = memchr(v, ']', n);
        if (!close || !ip_literal_valid(v + 1, (size_t)(close - v) - 1))
            return false;
        i = (size_t)(close - v) + 1;
    } else {
        while (i < n && v[i] != ':') {
            unsigned char c = (unsigned char)v[i];
            if (c == '%') {
                if (i + 2 >= n || !is_hex((unsigned char)v[i + 1]) ||
                    !is_hex((unsigned char)v[i + 2]))
                    return false;
                i += 3;
                continue;
            }
            if (!is_reg_name_byte(c))
                return false;
            i++;
        }
    }
    if (i == n)
        return true;
    if (v[i] != ':')
        return false;
    for (i++; i < n; i++)
        if (v[i] < '0' || v[i] > '9')
            return false;
    return true;
}

int hdr_match_host(const char *host, size_t n, bool keep_port, char *out, size_t cap)
{
    if (!keep_port) {
        /* "[v6]:port" keeps its brackets; "name:port" loses ":port". */
        const char *end = host + n;
        if (n && host[0] == '[') {
            const char *close = memchr(host, ']', n);
            if (close)
                end = close + 1;
        } else {
            const char *colon = memrchr(host, ':', n);
            if (colon)
                end = colon;
        }
        n = (size_t)(end - host);
    }
    if (n + 1 > cap)
        return -1;
    for (size_t i = 0; i < n; i++)
        out[i] = (host[i] >= 'A' && host[i] <= 'Z') ? (char)(host[i] - 'A' + 'a') : host[i];
    out[n] = '\0';
    return 0;
}

void hdr_lower(char *dst, const char *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = (char)(src[i] >= 'A' && src[i] <= 'Z' ? src[i] + 32 : src[i]);
}

/* Whether the 'n' bytes at 'name' are 'lit' in any case, its last byte compared first. */
static bool is_lit(const char *name, size_t n, const char *lit)
{
    return (name[n - 1] | 0x20) == lit[n - 1] && strncasecmp(name, lit, n) == 0;
}

bool hdr_per_request(const char *name, size_t n)
{
    /* by length: most names are ruled out without a comparison */
    switch (n) {
    case 2:
        return is_lit(name, n, "b3");
    case 11:
        return is_lit(name, n, "traceparent") || is_lit(name, n, "x-b3-spanid");
    case 12:
        return is_lit(name, n, "x-request-id") || is_lit(name, n, "grpc-timeout") ||
               is_lit(name, n, "x-b3-traceid");
    case 13:
        return is_lit(name, n, "uber-trace-id");
    case 14:
        return is_lit(name, n, "grpc-trace-bin");
    case 15:
        return is_lit(name, n, "x-amzn-trace-id");
    case 17:
        return is_lit(name, n, "x-b3-parentspanid");
    case 21:
        return is_lit(name, n, "x-cloud-trace-context");
    case 30:
        return is_lit(name, n, "x-envoy-expected-rq-timeout-ms");
    default:
        return false;
    }
}
