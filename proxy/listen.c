#include "proxy/listen.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define BACKLOG 4096

/* Splits "host:port" / "[v6]:port" (validated by the config loader) into its parts. */
static int split(const char *addr, char *host, size_t hcap, char *port, size_t pcap)
{
    const char *colon = strrchr(addr, ':');
    if (!colon)
        return -1;
    const char *h = addr, *hend = colon;
    if (*h == '[' && hend > h && hend[-1] == ']') {
        h++;
        hend--;
    }
    if ((size_t)(hend - h) >= hcap || strlen(colon + 1) >= pcap)
        return -1;
    memcpy(host, h, (size_t)(hend - h));
    host[hend - h] = '\0';
    snprintf(port, pcap, "%s", colon + 1);
    return 0;
}

static int bind_one(const struct addrinfo *ai, const struct sockaddr *sa, socklen_t len)
{
    int one = 1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) < 0 || bind(fd, sa, len) < 0 ||
        listen(fd, BACKLOG) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

int listen_open(const char *addr, size_t n, int *fds, char *bound, size_t bound_cap, char *why,
                size_t why_cap)
{
    char host[256], port[16];
    struct addrinfo hints = { .ai_flags = AI_PASSIVE | AI_NUMERICSERV, .ai_socktype = SOCK_STREAM },
                    *ai = NULL;
    size_t opened = 0;

    if (split(addr, host, sizeof(host), port, sizeof(port)) < 0) {
        snprintf(why, why_cap, "%s: not a HOST:PORT address", addr);
        return -1;
    }
    int e = getaddrinfo(*host ? host : NULL, port, &hints, &ai);
    if (e) {
        snprintf(why, why_cap, "%s: %s", addr, gai_strerror(e));
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t len = (socklen_t)ai->ai_addrlen;
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    for (; opened < n; opened++) {
        fds[opened] = bind_one(ai, (struct sockaddr *)&ss, len);
        if (fds[opened] < 0) {
            snprintf(why, why_cap, "cannot listen on %s: %s", addr, strerror(errno));
            goto fail;
        }
        if (opened == 0) {
            /* port 0: the kernel's choice, shared by every worker's socket */
            len = sizeof(ss);
            getsockname(fds[0], (struct sockaddr *)&ss, &len);
        }
    }
    char h[NI_MAXHOST], p[NI_MAXSERV];
    getnameinfo((struct sockaddr *)&ss, len, h, sizeof(h), p, sizeof(p),
                NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(bound, bound_cap, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", h, p);
    freeaddrinfo(ai);
    return 0;
fail:
    while (opened > 0)
        close(fds[--opened]);
    freeaddrinfo(ai);
    return -1;
}
