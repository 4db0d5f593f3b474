#include "proxy/http/answer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/http/grpc.h"
#include "proxy/http/headers.h"

/* Calls add() with field 'name' (a literal) and the C string 'value'. */
#define ADD(name, value, value_len)                                                                \
    add(arg, &(struct hfield){ name, value, sizeof(name) - 1, value_len, false })

void answer_tag_fields(const struct answer_tag *tag, void (*add)(void *arg, const struct hfield *f),
                       void *arg)
{
    char n[24];
    ADD("X-Retry-Attempts", n, (size_t)(hdr_utoa(tag->attempts, n) - n));
    if (tag->request_id)
        ADD("X-Request-Id", tag->request_id, strlen(tag->request_id));
    if (tag->stop)
        ADD("X-Retry-Stop", tag->stop, strlen(tag->stop));
    if (tag->allow)
        ADD("Allow", tag->allow, strlen(tag->allow));
    if (tag->throttled >= 0) {
        char p[16];
        snprintf(p, sizeof(p), "%.2f", tag->throttled);
        ADD("X-Retry-Throttled", p, strlen(p));
    }
}
#undef ADD

char *answer_error_body(const char *code, const char *route, unsigned attempts, const char *message,
                        size_t *len)
{
    char rname[160] = "null";
    if (route)
        snprintf(rname, sizeof(rname), "\"%s\"", route); /* names need no escaping */
    /* sized to the message, whatever its length */
    char *body = NULL;
    int n = asprintf(&body,
                     "{\"error\": \"%s\", \"route\": %s, \"attempts\": %u, \"message\": \"%s\"}\n",
                     code, rname, attempts, message);
    if (n < 0)
        return NULL;
    *len = (size_t)n;
    return body;
}

bool answer_status_has_body(int status)
{
    return status != 204 && status != 304 && !(status >= 100 && status < 200);
}

void answer_grpc_error(const char *code, unsigned http_status, const char *message,
                       struct answer_grpc *out)
{
    hdr_utoa(grpc_code_of_error(code, http_status), out->status);
    grpc_message_encode(message, out->message, sizeof(out->message));
}
