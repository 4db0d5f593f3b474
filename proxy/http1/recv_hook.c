/* recv() for the retryproxy binary only: libmicrohttpd's reads of client sockets go through
 * the framing check (proxy/http1/wiretab.h explains why and how). Not linked into test programs. */
#include <sys/socket.h>

#include "proxy/http1/wiretab.h"

ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    return wiretab_recv(fd, buf, len, flags);
}
