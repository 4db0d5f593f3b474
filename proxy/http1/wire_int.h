/* wire_int -- the framing check's parser (proxy/http1/wire.c) as its socket side (wire_recv.c)
 * calls it. Nothing else includes it.
 */
#ifndef RETRYPROXY_PROXY_WIRE_INT_H
#define RETRYPROXY_PROXY_WIRE_INT_H

#include <stddef.h>

#include "proxy/http1/wire.h"

/* What the parser found in a run of bytes. */
struct wire_scan {
    size_t safe;         /* bytes before the head still open (or refused) */
    enum refusal reason; /* REFUSE_NONE, a refusal, or REFUSE_BAD_CHUNK (close) */
};

/* Runs the parser over p[0..n). */
struct wire_scan wire_parse(struct wire *w, const char *p, size_t n);

#endif
