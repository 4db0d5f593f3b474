#include "proxy/http/refusal.h"

#include <stddef.h>

unsigned refusal_status(enum refusal r)
{
    switch (r) {
    case REFUSE_METHOD_TOO_LONG:
    case REFUSE_UNSUPPORTED_CODING:
        return 501;
    case REFUSE_BAD_VERSION:
        return 505;
    case REFUSE_TARGET_TOO_LONG:
        return 414;
    case REFUSE_HEAD_TOO_LARGE:
        return 431;
    case REFUSE_HEAD_TIMEOUT:
        return 408;
    default:
        return 400;
    }
}

/* The short text for each refusal, as the 4xx/5xx answer body gives it. */
static const char *const reason_text[] = {
    [REFUSE_NONE] = "",
    [REFUSE_BAD_REQUEST_LINE] = "a malformed request line",
    [REFUSE_BAD_METHOD] = "a method that is not a token",
    [REFUSE_METHOD_TOO_LONG] = "a method longer than 32 bytes",
    [REFUSE_BAD_TARGET] = "a control character or space in the request target",
    [REFUSE_BAD_VERSION] = "an HTTP version other than 1.0 and 1.1",
    [REFUSE_BARE_CR] = "a CR not followed by LF",
    [REFUSE_BAD_FIELD_NAME] = "a header name that is not a token",
    [REFUSE_SPACE_BEFORE_COLON] = "whitespace between a header name and its colon",
    [REFUSE_BAD_FIELD_VALUE] = "a header with a forbidden character",
    [REFUSE_OBS_FOLD] = "an obsolete folded header line",
    [REFUSE_BAD_CONTENT_LENGTH] = "an invalid Content-Length",
    [REFUSE_TWO_CONTENT_LENGTHS] = "two Content-Length headers",
    [REFUSE_CL_AND_TE] = "both Content-Length and Transfer-Encoding",
    [REFUSE_BAD_TRANSFER_ENCODING] = "a Transfer-Encoding other than one final chunked",
    [REFUSE_UNSUPPORTED_CODING] = "a transfer coding other than chunked",
    [REFUSE_TE_IN_HTTP10] = "Transfer-Encoding in an HTTP/1.0 request",
    [REFUSE_NO_HOST] = "an HTTP/1.1 request without Host",
    [REFUSE_TWO_HOSTS] = "two Host headers",
    [REFUSE_TARGET_TOO_LONG] = "a request line longer than 8 KiB",
    [REFUSE_HEAD_TOO_LARGE] = "request headers larger than limits.max_header_bytes or 100 fields",
    [REFUSE_HEAD_TIMEOUT] = "the request headers did not arrive within limits.header_timeout_ms",
    [REFUSE_BAD_CHUNK] = "malformed chunked framing",
};
_Static_assert(sizeof reason_text / sizeof reason_text[0] == REFUSE_COUNT,
               "a text for every enum refusal value");

const char *refusal_text(enum refusal r)
{
    const char *text = (unsigned)r < REFUSE_COUNT ? reason_text[r] : NULL;
    return text ? text : "";
}
