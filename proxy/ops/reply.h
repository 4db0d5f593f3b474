/* reply -- how the admin listener answers: text, or JSON (docs/admin.md), never cached. Shared
 * by admin.c and deliveries_admin.c. */
#ifndef RETRYPROXY_PROXY_OPS_REPLY_H
#define RETRYPROXY_PROXY_OPS_REPLY_H

#include <stddef.h>

#include <jansson.h>
#include <microhttpd.h>

/* 'body' of 'len' bytes as 'type'; 'allow' (NULL: none) the Allow header of a 405. */
enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status, const char *type, char *body,
                           size_t len, enum MHD_ResponseMemoryMode mode, const char *allow);
/* 'j' (a new reference, consumed) as JSON and a newline. */
enum MHD_Result reply_json(struct MHD_Connection *c, unsigned status, json_t *j, const char *allow);
/* {"error": error, "message": message} */
enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *error,
                            const char *message, const char *allow);

#endif
