/* hlist -- a response's header fields as they arrived, in one buffer, bounded in bytes and
 * count like a client's request head. Each field is its name's and its value's lengths
 * (HLIST_FIELD_BYTES), then "name\0value\0": a walk reads the lengths, and never has to count
 * them again, and each name and value is a C string too. */
#ifndef RETRYPROXY_PROXY_HLIST_H
#define RETRYPROXY_PROXY_HLIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HLIST_MAX_BYTES (64 * 1024)
#define HLIST_MAX_COUNT 200
/* The bytes a field takes besides its name's and its value's (their lengths; not the NULs). */
#define HLIST_FIELD_BYTES 8

struct hlist {
    char *buf;
    size_t len, cap, count;
    size_t last; /* where the last field starts */
};

/* One field by reference, neither part NUL-terminated: an attempt's own fields, sent beside a
 * list (proxy/http/head.h). */
struct hfield {
    const char *name, *value;
    size_t name_len, value_len;
    bool per_request; /* a value of this request's own, as hdr_per_request() names them */
};

void hlist_clear(struct hlist *h); /* keeps the buffer */
void hlist_free(struct hlist *h);
/* Adds a field. 0, or -1 past the bounds or out of memory. */
int hlist_add(struct hlist *h, const char *name, size_t nl, const char *value, size_t vl);
/* Adds a field within the buffer's room (h->cap), whatever the bounds: a list sized for what it
 * will hold (proxy/http/head.c). 0, or -1 without room. */
int hlist_put(struct hlist *h, const char *name, size_t nl, const char *value, size_t vl);
/* Lowercases the last field's name (as HTTP/2 spells names). */
void hlist_lower_last(struct hlist *h);
/* Appends " " and v[0..vl) to the value of the last field (an unfolded continuation line).
 * 0, or -1 without a last field, past the bounds or out of memory. */
int hlist_extend_last(struct hlist *h, const char *v, size_t vl);
/* Iterates: *pos starts at 0; false at the end. */
bool hlist_next(const struct hlist *h, size_t *pos, const char **name, const char **value);
/* The same, with the lengths: 'f' gets the next field. */
bool hlist_next_n(const struct hlist *h, size_t *pos, struct hfield *f);
/* A response head as text, "HTTP/1.1 STATUS\r\n" then "Name: value\r\n" per field of 'h'
 * (NULL: none), as a dead letter keeps it (docs/delivery.md): malloc'd, its length in *len;
 * NULL out of memory. */
char *hlist_head_text(int status, const struct hlist *h, size_t *len);
/* The first value of 'name' (any case), or NULL. */
const char *hlist_get(const struct hlist *h, const char *name);
/* How many fields 'name' has; the first 'max' of their values go to vals/lens. */
size_t hlist_values(const struct hlist *h, const char *name, const char **vals, size_t *lens,
                    size_t max);
/* Content-Length as a number; -1 when absent or invalid. */
int64_t hlist_content_length(const struct hlist *h);
/* Whether every Content-Length field holds the same decimal number (or there is none):
 * RFC 9112 6.3, differing values make the framing unknowable. */
bool hlist_length_unambiguous(const struct hlist *h);
/* Whether the Transfer-Encoding fields, all of them together, are absent or name exactly one
 * transfer coding, "chunked" (any case; empty list elements ignored, but a field naming none
 * is no framing). RFC 9112 6.1/6.3: any
 * other list leaves a body the proxy cannot frame and pass on whole: "chunked, gzip" is
 * delimited by the close and not chunked, "gzip, chunked" would have to be decoded twice,
 * "chunkedchunked" or a coding with parameters is no coding libcurl decodes. */
bool hlist_transfer_coding_ok(const struct hlist *h);
/* Whether 'name' is listed in a Connection field. */
bool hlist_connection_names(const struct hlist *h, const char *name);

#endif
