/* headers -- HTTP header rules of the forwarding path (docs/forwarding.md). Pure functions. */
#ifndef RETRYPROXY_PROXY_HEADERS_H
#define RETRYPROXY_PROXY_HEADERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <strings.h>

#include "policy/rng.h"

/* Header names compare case-insensitively (ASCII). */
bool hdr_name_eq(const char *a, const char *b);

/* Whether the name 'k' of length 'kl' is the string literal 'lit', in any case: the length
 * decides most comparisons. */
#define HDR_NAME_IS(k, kl, lit)                                                                    \
    ((kl) == sizeof(lit) - 1 && strncasecmp((k), (lit), sizeof(lit) - 1) == 0)

/* Whether 'name' is one of the comma-separated tokens of a Connection header value
 * ("close, X-Foo" lists X-Foo), case-insensitively. */
bool hdr_token_listed(const char *list, const char *name);

/* A field name is an RFC 9110 token; a value going upstream holds no CR, LF or other control
 * byte but HTAB. Either check failing makes the request a 400. */
bool hdr_name_valid(const char *name);
/* The same for the n bytes at 'name' (no NUL needed). */
bool hdr_name_valid_n(const char *name, size_t n);
bool hdr_value_valid(const char *value);
/* The same for the n bytes at 'value' (a NUL among them is a forbidden byte). */
bool hdr_value_valid_n(const char *value, size_t n);

/* The 'n' bytes of a field value at 'v' without the whitespace (SP, HTAB) around them, which is
 * not part of the value (RFC 9110 5.5): returns where the value starts and sets *n to its
 * length. Every value the proxy reads goes through it, request fields and response fields. */
const char *hdr_trim(const char *v, size_t *n);

/* The whole decimal number in 's' if it is 1 to 18 digits, else -1. */
int64_t hdr_parse_uint(const char *s);
/* The same for the 'n' bytes at 's', read as a field value: the whitespace around the digits
 * is not part of it (hdr_trim). */
int64_t hdr_value_uint(const char *s, size_t n);

/* A random (version 4) UUID in lowercase hex, 36 characters and a NUL. */
void hdr_uuid(struct rng *r, char out[37]);
/* Writes 'v' in decimal and a NUL at 'out' (room for 21 bytes); returns the NUL's address. */
char *hdr_utoa(uint64_t v, char *out);
/* Copies 'n' bytes of the field name 'src' to 'dst' in lowercase (ASCII), as HTTP/2 spells
 * field names. */
void hdr_lower(char *dst, const char *src, size_t n);

/* Whether field 'name' ('n' bytes, any case) carries a value of its own on every request: a
 * request id, a trace or span id, a deadline. HPACK would only churn its dynamic table with
 * them (each a new entry that evicts a useful one), so HTTP/2 sends them as literals never
 * indexed (RFC 7541 6.2.3; docs/http2.md "Header compression"). */
bool hdr_per_request(const char *name, size_t n);

/* Whether the 'n' bytes at 'v' are a valid Host value, uri-host [ ":" port ] (RFC 9110 7.2,
 * RFC 3986 3.2.2): an IP-literal in brackets (IPv6 or IPvFuture), or a reg-name of unreserved
 * bytes, sub-delims and %XX escapes (an IPv4 address is one), then optionally a colon and
 * digits. Empty is valid (RFC 9112 3.2: a target without an authority). Anything else, a space
 * or a slash or a second colon, makes the request a 400. */
bool hdr_host_valid(const char *v, size_t n);

/* The host part of a Host header value (its 'n' bytes at 'host') for matching: lowercased, its
 * port removed unless 'keep_port'. Writes at most 'cap' bytes including the NUL; returns 0,
 * or -1 if too long. */
int hdr_match_host(const char *host, size_t n, bool keep_port, char *out, size_t cap);

#endif
