/* floor_suspend -- floor_mhd plus one suspend/resume per request: the access handler suspends
 * the connection and puts it on a list; the loop resumes every connection on the list on its
 * next iteration (which does not wait in epoll_wait: floor_wake), and the handler then answers
 * 200 "ok\n" from one persistent response.
 *
 *   floor_suspend [--port N]
 */
#include "bench/floor/floor.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static struct MHD_Response *ok;
static char suspended_marker;
/* Connections suspended since the last iteration (a growing array). */
static struct MHD_Connection **pending;
static size_t n_pending, cap_pending;

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *data_size, void **req_cls)
{
    (void)cls, (void)url, (void)method, (void)version, (void)data, (void)data_size;
    if (floor_first_call(req_cls))
        return MHD_YES;
    if (*req_cls == &suspended_marker)
        return MHD_queue_response(c, MHD_HTTP_OK, ok);
    if (n_pending == cap_pending) {
        cap_pending = cap_pending ? 2 * cap_pending : 256;
        pending = realloc(pending, cap_pending * sizeof(*pending));
        if (!pending)
            abort();
    }
    pending[n_pending++] = c;
    *req_cls = &suspended_marker;
    MHD_suspend_connection(c);
    floor_wake();
    return MHD_YES;
}

static void resume_pending(void)
{
    for (size_t i = 0; i < n_pending; i++)
        MHD_resume_connection(pending[i]);
    n_pending = 0;
}

int main(int argc, char **argv)
{
    struct floor_opts o;
    floor_parse(argc, argv, "usage: floor_suspend [--port N]\n", &o);
    ok = MHD_create_response_from_buffer(3, "ok\n", MHD_RESPMEM_PERSISTENT);
    struct MHD_Daemon *d = floor_start(o.port, MHD_ALLOW_SUSPEND_RESUME, 0, on_request, NULL, NULL);
    int rc = floor_loop(d, NULL, resume_pending);
    MHD_destroy_response(ok);
    free(pending);
    return rc;
}
