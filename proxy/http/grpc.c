#include "proxy/http/grpc.h"

#include <string.h>
#include <strings.h>

#include "proxy/http/hlist.h"

uint32_t grpc_frames_feed(struct grpc_frames *g, const char *p, size_t n)
{
    while (n) {
        if (g->left) {
            size_t take = g->left < n ? (size_t)g->left : n;
            g->left -= take;
            p += take;
            n -= take;
            continue;
        }
        if (g->prefix_len == 0)
            g->messages++;
        if (g->prefix_len >= 1) /* byte 0 is the compressed flag */
            g->size = g->size << 8 | (uint8_t)*p;
        p++;
        n--;
        if (++g->prefix_len == 5) {
            g->left = g->size;
            g->size = 0;
            g->prefix_len = 0;
        }
    }
    return g->messages;
}

bool grpc_is_content_type(const char *v, size_t n)
{
    static const char type[] = "application/grpc";
    size_t tl = sizeof(type) - 1;
    if (n < tl || strncasecmp(v, type, tl) != 0)
        return false;
    return n == tl || v[tl] == '+' || v[tl] == ';';
}

int grpc_status_parse(const char *v, size_t n)
{
    if (n < 1 || n > 3)
        return -1;
    int code = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        code = code * 10 + (v[i] - '0');
    }
    return code;
}

int grpc_status_of(const struct hlist *h)
{
    const char *v[2];
    size_t len[2];
    if (!h || hlist_values(h, "grpc-status", v, len, 2) != 1)
        return -1;
    return grpc_status_parse(v[0], len[0]);
}

int grpc_status_in(const struct hlist *head, const struct hlist *trailers)
{
    int code = grpc_status_of(head);
    return code >= 0 ? code : grpc_status_of(trailers);
}

int grpc_status_seen(int http_status, const struct hlist *head, const struct hlist *trailers)
{
    int code = grpc_status_in(head, trailers);
    if (code >= 0 || http_status < 200 || http_status == 200)
        return code; /* a 200 without one stays without: its client says UNKNOWN or INTERNAL */
    return (int)grpc_code_of_error(NULL, (unsigned)http_status);
}

int grpc_timeout_parse(const char *v, size_t n, uint64_t *ms)
{
    if (n < 2 || n > 9)
        return -1;
    uint64_t value = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        value = value * 10 + (uint64_t)(v[i] - '0');
    }
    /* each unit as a fraction of a millisecond: num / den, rounded up */
    uint64_t num, den = 1;
    switch (v[n - 1]) {
    case 'H':
        num = 3600000;
        break;
    case 'M':
        num = 60000;
        break;
    case 'S':
        num = 1000;
        break;
    case 'm':
        num = 1;
        break;
    case 'u':
        num = 1;
        den = 1000;
        break;
    case 'n':
        num = 1;
        den = 1000000;
        break;
    default:
        return -1;
    }
    /* at most 99999999 hours: fits 64 bits with room */
    *ms = (value * num + den - 1) / den;
    if (*ms == 0)
        *ms = value ? 1 : 0;
    return 0;
}

size_t grpc_timeout_format(uint64_t ms, char *out)
{
    /* 8 digits at most: milliseconds up to 99999999 (27 hours), then whole seconds rounded
     * down, which never promises more time than is left */
    char unit = 'm';
    if (ms > 99999999) {
        ms /= 1000;
        unit = 'S';
        if (ms > 99999999)
            ms = 99999999;
    }
    char digits[12];
    size_t n = 0;
    do {
        digits[n++] = (char)('0' + ms % 10);
        ms /= 10;
    } while (ms);
    size_t len = 0;
    while (n)
        out[len++] = digits[--n];
    out[len++] = unit;
    out[len] = '\0';
    return len;
}

size_t grpc_message_encode(const char *msg, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++) {
        bool plain = *p >= 0x20 && *p <= 0x7e && *p != '%';
        if (n + (plain ? 1 : 3) >= cap)
            break;
        if (plain) {
            out[n++] = (char)*p;
        } else {
            out[n++] = '%';
            out[n++] = hex[*p >> 4];
            out[n++] = hex[*p & 15];
        }
    }
    if (cap)
        out[n] = '\0';
    return n;
}

enum grpc_code grpc_code_of_error(const char *code, unsigned http_status)
{
    static const struct {
        const char *code;
        enum grpc_code grpc;
    } codes[] = {
        { "no_route", GRPC_UNIMPLEMENTED },
        { "method_not_allowed", GRPC_UNIMPLEMENTED },
        { "upstream_unavailable", GRPC_UNAVAILABLE },
        { "upstream_invalid_response", GRPC_UNAVAILABLE },
        { "draining", GRPC_UNAVAILABLE },
        { "throttled", GRPC_UNAVAILABLE },
        { "no_address", GRPC_UNAVAILABLE },
        { "upstream_timeout", GRPC_DEADLINE_EXCEEDED },
        { "request_timeout", GRPC_DEADLINE_EXCEEDED },
        { "body_too_large", GRPC_RESOURCE_EXHAUSTED },
        { "headers_too_large", GRPC_RESOURCE_EXHAUSTED },
        { "bad_request", GRPC_INTERNAL },
        { "internal", GRPC_INTERNAL },
    };
    for (size_t i = 0; code && i < sizeof(codes) / sizeof(codes[0]); i++)
        if (strcmp(code, codes[i].code) == 0)
            return codes[i].grpc;
    /* gRPC's own mapping of HTTP statuses (doc/http-grpc-status-mapping.md) */
    switch (http_status) {
    case 400:
        return GRPC_INTERNAL;
    case 401:
        return GRPC_UNAUTHENTICATED;
    case 403:
        return GRPC_PERMISSION_DENIED;
    case 404:
        return GRPC_UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504:
        return GRPC_UNAVAILABLE;
    default:
        return GRPC_UNKNOWN;
    }
}
