/* wiretab -- which sockets are client connections whose bytes go through the framing check.
 *
 * libmicrohttpd reads its sockets with recv(). retryproxy's binary defines recv()
 * (proxy/http1/recv_hook.c), which the dynamic linker binds libmicrohttpd's calls to ahead of the C
 * library's; it calls wiretab_recv(), which hands the read of a registered socket to
 * wire_recv() (proxy/http1/wire.h) and passes every other socket (libcurl's, the admin listener's)
 * straight to the kernel. A socket is registered from the moment libmicrohttpd accepts it until
 * libmicrohttpd is done with it, before it closes it.
 */
#ifndef RETRYPROXY_PROXY_WIRETAB_H
#define RETRYPROXY_PROXY_WIRETAB_H

#include <stddef.h>
#include <sys/types.h>

#include "proxy/http1/wire.h"

/* Sizes the table for descriptors below 'max_fd' (the process's RLIMIT_NOFILE). 0 or -1. */
int wiretab_init(size_t max_fd);
void wiretab_free(void);

/* Registers client socket 'fd' with its framing state; 0, or -1 if fd is out of range. */
int wiretab_attach(int fd, struct wire *w);
void wiretab_detach(int fd);

/* Whether the framing check of 'fd' (if any) holds no byte and refused none (wire_quiet). */
bool wiretab_quiet(int fd);

/* recv() as the process sees it. */
ssize_t wiretab_recv(int fd, void *buf, size_t len, int flags);

#endif
