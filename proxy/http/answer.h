/* answer -- what every front end's answers share (docs/forwarding.md, "What the client gets"):
 * the fields that tag an answer (X-Retry-Attempts, X-Request-Id, ...) and the JSON body of
 * retryproxy's own errors (which upstream fields are not relayed is proxy/http/fields.h's).
 * Protocol-free: each front end (proxy/http1/relay.c, proxy/http2/h2front.c) writes them its own
 * way.
 */
#ifndef RETRYPROXY_PROXY_ANSWER_H
#define RETRYPROXY_PROXY_ANSWER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/http/hlist.h"

/* What every answer carries besides its own fields (docs/forwarding.md): the request core fills
 * it in (proxy/core/edge.c), each front end puts it on its answer through answer_tag_fields(). */
struct answer_tag {
    uint32_t attempts;      /* X-Retry-Attempts */
    bool close;             /* no more requests on this connection (draining, bad framing) */
    const char *request_id; /* X-Request-Id, in place of the upstream's; NULL: none */
    const char *stop;       /* X-Retry-Stop, NULL: none */
    double throttled;       /* X-Retry-Throttled: the rejection probability; < 0: none */
    const char *allow;      /* Allow, on a 405; NULL: none */
};

/* Calls add(arg, field) for each field 'tag' puts on an answer (NUL-terminated too), names as
 * HTTP/1.1 spells them ("X-Retry-Attempts"); Connection: close is the caller's. */
void answer_tag_fields(const struct answer_tag *tag, void (*add)(void *arg, const struct hfield *f),
                       void *arg);

/* Whether a response of 'status' may have a body: 1xx, 204 and 304 never do (RFC 9110 6.4.1). */
bool answer_status_has_body(int status);

/* The JSON body of an error of retryproxy's own: a new string (free()), its length in *len;
 * NULL out of memory. 'route' NULL: none. */
char *answer_error_body(const char *code, const char *route, unsigned attempts, const char *message,
                        size_t *len);

/* An error of retryproxy's own on a gRPC call (docs/grpc.md "Errors of retryproxy's own"):
 * the values of its grpc-status and grpc-message fields, sent as a Trailers-Only response. */
struct answer_grpc {
    char status[8];
    char message[512]; /* percent-encoded, cut to fit */
};
void answer_grpc_error(const char *code, unsigned http_status, const char *message,
                       struct answer_grpc *out);

#endif
