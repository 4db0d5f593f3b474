/* floor_mhd -- libmicrohttpd alone: every request is answered 200 "ok\n" from one persistent
 * response, in external epoll mode (our epoll loop, MHD_get_timeout, MHD_run).
 *
 *   floor_mhd [--port N]
 */
#include "bench/floor/floor.h"

#include <stdio.h>

static struct MHD_Response *ok;

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *data_size, void **req_cls)
{
    (void)cls, (void)url, (void)method, (void)version, (void)data, (void)data_size;
    if (floor_first_call(req_cls))
        return MHD_YES;
    return MHD_queue_response(c, MHD_HTTP_OK, ok);
}

int main(int argc, char **argv)
{
    struct floor_opts o;
    floor_parse(argc, argv, "usage: floor_mhd [--port N]\n", &o);
    ok = MHD_create_response_from_buffer(3, "ok\n", MHD_RESPMEM_PERSISTENT);
    struct MHD_Daemon *d = floor_start(o.port, 0, 0, on_request, NULL, NULL);
    int rc = floor_loop(d, NULL, NULL);
    MHD_destroy_response(ok);
    return rc;
}
