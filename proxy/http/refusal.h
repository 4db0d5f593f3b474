/* refusal -- why a client's request head is refused before it becomes a request, whichever
 * client protocol brought it: the HTTP/1.1 framing check (proxy/http1/wire.h) and the HTTP/2 front
 * end (proxy/http2/h2stream.c) give these reasons, the request core answers them
 * (proxy/core/edge.c) with the status and the short text of each (docs/hardening.md), and the
 * bounds both keep.
 */
#ifndef RETRYPROXY_PROXY_REFUSAL_H
#define RETRYPROXY_PROXY_REFUSAL_H

/* Fields a request head (with its trailers) may have; more is a 431. */
#define REQ_FIELDS_MAX 100
/* A request line (HTTP/2: its :path) longer than this is a 414. */
#define REQ_LINE_MAX (8 * 1024)
/* Longest method forwarded; a longer one is a 501. */
#define REQ_METHOD_MAX 32

/* Why a head was refused. */
enum refusal {
    REFUSE_NONE = 0,
    REFUSE_BAD_REQUEST_LINE,
    REFUSE_BAD_METHOD,
    REFUSE_METHOD_TOO_LONG,
    REFUSE_BAD_TARGET,
    REFUSE_BAD_VERSION,
    REFUSE_BARE_CR,
    REFUSE_BAD_FIELD_NAME,
    REFUSE_SPACE_BEFORE_COLON,
    REFUSE_BAD_FIELD_VALUE,
    REFUSE_OBS_FOLD,
    REFUSE_BAD_CONTENT_LENGTH,
    REFUSE_TWO_CONTENT_LENGTHS,
    REFUSE_CL_AND_TE,
    REFUSE_BAD_TRANSFER_ENCODING,
    REFUSE_UNSUPPORTED_CODING,
    REFUSE_TE_IN_HTTP10,
    REFUSE_NO_HOST,
    REFUSE_TWO_HOSTS,
    REFUSE_TARGET_TOO_LONG,
    REFUSE_HEAD_TOO_LARGE,
    REFUSE_HEAD_TIMEOUT,
    REFUSE_BAD_CHUNK, /* mid-body: the connection is closed */
    REFUSE_COUNT,     /* not a reason: how many there are */
};

/* The HTTP status and the short text for a refused head. */
unsigned refusal_status(enum refusal r);
const char *refusal_text(enum refusal r);

#endif
