/* reply -- the admin listener's answers (reply.h). */
#include "proxy/ops/reply.h"

#include <stdlib.h>
#include <string.h>

enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status, const char *type, char *body,
                           size_t len, enum MHD_ResponseMemoryMode mode, const char *allow)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (allow)
        MHD_add_response_header(r, "Allow", allow);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* Sends 'j' (a new reference, consumed) as JSON. */
enum MHD_Result reply_json(struct MHD_Connection *c, unsigned status, json_t *j, const char *allow)
{
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(15)) : NULL;
    json_decref(j);
    if (!text)
        return MHD_NO;
    size_t len = strlen(text);
    /* a trailing newline for humans with curl */
    char *withnl = realloc(text, len + 2);
    if (!withnl) {
        free(text);
        return MHD_NO;
    }
    withnl[len] = '\n';
    withnl[len + 1] = '\0';
    return reply_text(c, status, "application/json", withnl, len + 1, MHD_RESPMEM_MUST_FREE, allow);
}

enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *error,
                            const char *message, const char *allow)
{
    return reply_json(c, status, json_pack("{s:s, s:s}", "error", error, "message", message),
                      allow);
}
