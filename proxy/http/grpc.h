/* grpc -- what retryproxy reads and writes of gRPC on HTTP/2 (grpc/grpc doc/PROTOCOL-HTTP2.md,
 * docs/grpc.md): the content type that makes a request a gRPC call, the grpc-status and
 * grpc-timeout fields, and the gRPC status that stands for each error of retryproxy's own.
 * Pure: no library, no I/O.
 */
#ifndef RETRYPROXY_PROXY_GRPC_H
#define RETRYPROXY_PROXY_GRPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct hlist;

/* gRPC status codes (the ones retryproxy names). */
enum grpc_code {
    GRPC_OK = 0,
    GRPC_CANCELLED = 1,
    GRPC_UNKNOWN = 2,
    GRPC_INVALID_ARGUMENT = 3,
    GRPC_DEADLINE_EXCEEDED = 4,
    GRPC_NOT_FOUND = 5,
    GRPC_PERMISSION_DENIED = 7,
    GRPC_RESOURCE_EXHAUSTED = 8,
    GRPC_UNIMPLEMENTED = 12,
    GRPC_INTERNAL = 13,
    GRPC_UNAVAILABLE = 14,
    GRPC_UNAUTHENTICATED = 16, /* the last the protocol defines */
};

/* Where a gRPC message stream is: each message is a 5-byte prefix (a compressed flag and a
 * 32-bit big-endian length) and that many bytes. */
struct grpc_frames {
    uint8_t prefix_len; /* prefix bytes of the current message seen (0 to 5) */
    uint32_t size;      /* its length, being read from the prefix */
    uint64_t left;      /* its bytes still to come once the prefix is complete */
    uint32_t messages;  /* messages begun */
};

/* Feeds 'n' bytes of the stream; returns how many messages it has begun, this one included. */
uint32_t grpc_frames_feed(struct grpc_frames *g, const char *p, size_t n);

/* Whether a Content-Type value makes the request a gRPC call: "application/grpc", alone or
 * followed by "+" (a message format) or ";" (parameters); the type is case-insensitive. */
bool grpc_is_content_type(const char *v, size_t n);

/* A grpc-status value: 1 to 3 ASCII digits, 0 to 999 (codes past GRPC_UNAUTHENTICATED are
 * kept: a server may send its own); -1 if anything else. */
int grpc_status_parse(const char *v, size_t n);

/* The grpc-status of a field list: -1 if it has none, or more than one, or an invalid one. */
int grpc_status_of(const struct hlist *h);

/* A response's status: its head's (Trailers-Only), else its trailers' (NULL: none); -1 if
 * neither has one. */
int grpc_status_in(const struct hlist *head, const struct hlist *trailers);

/* A call's status as its client sees it: grpc_status_in(); with none, an HTTP status other than
 * 200 as gRPC maps it (a 503 from a proxy that speaks no gRPC is UNAVAILABLE, gRPC's
 * PROTOCOL-HTTP2.md: clients synthesize one); -1 otherwise (no status, or no response). */
int grpc_status_seen(int http_status, const struct hlist *head, const struct hlist *trailers);

/* A grpc-timeout value ("TimeoutValue TimeoutUnit": 1 to 8 digits, then H, M, S, m, u or n)
 * in milliseconds, rounded up (a timeout below a millisecond is 1 ms). 0 on success, -1 if
 * it is malformed. */
int grpc_timeout_parse(const char *v, size_t n, uint64_t *ms);

/* Writes 'ms' as a grpc-timeout value ("250m", "99999999m" at most; then in seconds) into
 * 'out' (at least GRPC_TIMEOUT_MAX bytes); returns its length. */
#define GRPC_TIMEOUT_MAX 16
size_t grpc_timeout_format(uint64_t ms, char *out);

/* A grpc-message value: 'msg' percent-encoded (bytes outside printable ASCII, and '%'), cut
 * to fit 'cap' bytes with its NUL; returns its length. */
size_t grpc_message_encode(const char *msg, char *out, size_t cap);

/* The gRPC status that stands for an error of retryproxy's own, by its code ("no_route") and
 * HTTP status (docs/grpc.md "Errors"). */
enum grpc_code grpc_code_of_error(const char *code, unsigned http_status);

#endif
