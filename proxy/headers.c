#include "proxy/headers.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

bool hdr_name_eq(const char *a, const char *b)
{
    return strcasecmp(a, b) == 0;
}

bool hdr_is_hop_by_hop(const char *name)
{
    static const char *const hop[] = { "Connection", "Keep-Alive",        "Proxy-Connection", "TE",
                                       "Trailer",    "Transfer-Encoding", "Upgrade" };
    for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
        if (strcasecmp(name, hop[i]) == 0)
            return true;
    return false;
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

bool hdr_name_valid_n(const char *name, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  (c && strchr("!#$%&'*+-.^_`|~", c));
        if (!ok)
            return false;
    }
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

int64_t hdr_parse_uint(const char *s)
{
    int64_t v = 0;
    size_t n = 0;
    for (; s[n]; n++) {
        if (s[n] < '0' || s[n] > '9' || n >= 18)
            return -1;
        v = v * 10 + (s[n] - '0');
    }
    return n ? v : -1;
}

void hdr_uuid(struct rng *r, char out[37])
{
    uint64_t hi = rng_next(r), lo = rng_next(r);
    hi = (hi & 0xffffffffffff0fffULL) | 0x0000000000004000ULL; /* version 4 */
    lo = (lo & 0x3fffffffffffffffULL) | 0x8000000000000000ULL; /* variant 10 */
    snprintf(out, 37, "%08x-%04x-%04x-%04x-%012llx", (unsigned)(hi >> 32),
             (unsigned)(hi >> 16) & 0xffff, (unsigned)hi & 0xffff, (unsigned)(lo >> 48),
             (unsigned long long)(lo & 0xffffffffffffULL));
}

int hdr_match_host(const char *host, bool keep_port, char *out, size_t cap)
{
    size_t n = strlen(host);
    if (!keep_port) {
        /* "[v6]:port" keeps its brackets; "name:port" loses ":port". */
        const char *end = host + n;
        if (host[0] == '[') {
            const char *close = strchr(host, ']');
            if (close)
                end = close + 1;
        } else {
            const char *colon = strrchr(host, ':');
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
