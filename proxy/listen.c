/* listen -- one listening socket per worker on one address, and only this process on it.
 *
 * The workers' sockets share their port through SO_REUSEPORT. The kernel lets any socket of
 * the same user that also sets SO_REUSEPORT join such a group, so a second retryproxy started
 * on the same address (a stale process, a mistaken restart) would bind without an error and
 * the kernel would split the clients between the two. listen_open() keeps the group ours:
 *
 *   1. probe: a socket without SO_REUSEPORT binds the address and is closed again. It fails
 *      with EADDRINUSE while anything listens on the port at an overlapping address (the same
 *      one, or a wildcard on either side), SO_REUSEPORT or not. It sets SO_REUSEADDR, so the
 *      TIME_WAIT connections a previous instance left behind do not stop a restart.
 *   2. group: the 'n' worker sockets bind with SO_REUSEPORT. Port 0 skips the probe: the first
 *      worker's socket takes a port the kernel picks free (Linux >= 4.6 never hands out a port
 *      of an existing SO_REUSEPORT group for port 0), and the others join it.
 *   3. check: /proc/net/tcp (tcp6 for IPv6) must show no listener on the port at an
 *      overlapping address other than the group's own sockets (matched by inode).
 *
 * When the probe fails, /proc/self/fd tells whether the listener in its way is one of this
 * process's own (listen and admin given one address), so that the message says which.
 *
 * Step 3 closes the race step 1 leaves open: two instances starting at the same moment can
 * both pass their probe before either binds, but each checks only after its own group is
 * bound, so whichever checks second sees the other. Both may see each other and both fail;
 * never do both keep serving. What remains: a program that is not retryproxy, runs as the same
 * user and joins the group with SO_REUSEPORT after step 3 is not seen (we have started by
 * then, and it does not check); an IPv6 wildcard that also takes IPv4 ("[::]" without
 * IPV6_V6ONLY) is in tcp6 only, so step 3 does not compare it with an IPv4 address (step 1
 * does); and without /proc (never the case on Linux in practice) step 3 is skipped.
 */
#include "proxy/listen.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define BACKLOG 4096
#define IN_USE  "address already in use by another process"
/* listen and admin on one address: the probe cannot tell it from another process */
#define IN_USE_HERE "address already in use by this process's other listener"

/* Whether the socket with this inode counts (listen_shared: it is not one of the group's). */
typedef bool inode_pred(uintmax_t inode, const void *arg);

/* A group of worker sockets, for not_in_group(). */
struct group {
    const int *fds;
    size_t n;
};

static int split(const char *addr, char *host, size_t hcap, char *port, size_t pcap);
static int probe(const struct sockaddr *sa, socklen_t len);
static int bind_one(const struct sockaddr *sa, socklen_t len);
static int find_listener(const struct sockaddr_storage *ss, inode_pred *pred, const void *arg);
static inode_pred not_in_group, held_here;

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
    freeaddrinfo(ai);

    /* sin_port and sin6_port sit at the same offset */
    if (((struct sockaddr_in *)&ss)->sin_port != 0 && probe((struct sockaddr *)&ss, len) < 0) {
        int err = errno;
        const char *what = err != EADDRINUSE                         ? strerror(err)
                           : find_listener(&ss, held_here, NULL) > 0 ? IN_USE_HERE
                                                                     : IN_USE;
        snprintf(why, why_cap, "cannot listen on %s: %s", addr, what);
        return -1;
    }
    for (; opened < n; opened++) {
        fds[opened] = bind_one((struct sockaddr *)&ss, len);
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
    if (listen_shared(fds, n) > 0) {
        snprintf(why, why_cap, "cannot listen on %s: %s", addr, IN_USE);
        goto fail;
    }
    char h[NI_MAXHOST], p[NI_MAXSERV];
    getnameinfo((struct sockaddr *)&ss, len, h, sizeof(h), p, sizeof(p),
                NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(bound, bound_cap, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", h, p);
    return 0;
fail:
    while (opened > 0)
        close(fds[--opened]);
    return -1;
}

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

/* Step 1: 0 when a socket without SO_REUSEPORT can bind 'sa', else -1 with errno set. */
static int probe(const struct sockaddr *sa, socklen_t len)
{
    int one = 1, rc = -1;
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 && bind(fd, sa, len) == 0)
        rc = 0;
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* Step 2: one worker's socket, bound and listening, or -1 with errno set. */
static int bind_one(const struct sockaddr *sa, socklen_t len)
{
    int one = 1;
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
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

/* One 32-bit word of an address as /proc/net/tcp prints it: the word's bytes as they are in
 * memory, read as a host-order integer, in hex. Parsing the text back into a host-order
 * integer therefore gives back the bytes. */
static bool hex_words(const char *s, size_t words, unsigned char *out)
{
    for (size_t i = 0; i < words; i++) {
        uint32_t w = 0;
        for (size_t k = 0; k < 8; k++, s++) {
            unsigned d;
            if (*s >= '0' && *s <= '9')
                d = (unsigned)(*s - '0');
            else if (*s >= 'A' && *s <= 'F')
                d = (unsigned)(*s - 'A' + 10);
            else
                return false;
            w = w << 4 | d;
        }
        memcpy(out + 4 * i, &w, 4);
    }
    return *s == '\0';
}

/* Step 3. */
int listen_shared(const int *fds, size_t n)
{
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof(ss);
    if (n == 0 || getsockname(fds[0], (struct sockaddr *)&ss, &sslen) < 0)
        return -1;
    struct group g = { fds, n };
    return find_listener(&ss, not_in_group, &g);
}

static bool not_in_group(uintmax_t inode, const void *arg)
{
    const struct group *g = arg;
    for (size_t i = 0; i < g->n; i++) {
        struct stat st;
        if (fstat(g->fds[i], &st) == 0 && (uintmax_t)st.st_ino == inode)
            return false;
    }
    return true;
}

/* Whether one of this process's descriptors is the socket with this inode. */
static bool held_here(uintmax_t inode, const void *arg)
{
    (void)arg;
    char want[48], path[300], link[64];
    snprintf(want, sizeof(want), "socket:[%ju]", inode);
    DIR *d = opendir("/proc/self/fd");
    bool found = false;
    for (struct dirent *de; d && !found && (de = readdir(d)) != NULL;) {
        snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
        ssize_t k = readlink(path, link, sizeof(link) - 1);
        if (k > 0) {
            link[k] = '\0';
            found = strcmp(link, want) == 0;
        }
    }
    if (d)
        closedir(d);
    return found;
}

/* 1 when a listening socket for which pred(inode, arg) holds has the port of 'ss' and an
 * address that overlaps it (the same, or a wildcard on either side); 0 when none does; -1
 * when that cannot be read. */
static int find_listener(const struct sockaddr_storage *ss, inode_pred *pred, const void *arg)
{
    if (ss->ss_family != AF_INET && ss->ss_family != AF_INET6)
        return -1;
    const bool v6 = ss->ss_family == AF_INET6;
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
    const size_t alen = v6 ? 16 : 4;
    const unsigned char *ours = v6 ? s6->sin6_addr.s6_addr : (const unsigned char *)&s4->sin_addr;
    const unsigned port = ntohs(v6 ? s6->sin6_port : s4->sin_port);
    static const unsigned char any[16];
    int found = 0;

    FILE *f = fopen(v6 ? "/proc/net/tcp6" : "/proc/net/tcp", "re");
    if (!f)
        return -1;
    char line[512];
    if (!fgets(line, sizeof(line), f)) /* the column titles */
        found = -1;
    while (found == 0 && fgets(line, sizeof(line), f)) {
        /* "  sl  local_address rem_address   st tx_queue:rx_queue tr:tm->when retrnsmt   uid
         *  timeout inode ..." */
        char local[40];
        unsigned lport, state;
        uintmax_t inode;
        unsigned char a[16];
        if (sscanf(line, " %*s %39[0-9A-F]:%x %*s %x %*s %*s %*s %*s %*s %ju", local, &lport,
                   &state, &inode) != 4 ||
            state != 0x0A /* TCP_LISTEN */ || lport != port || !hex_words(local, alen / 4, a))
            continue;
        if (memcmp(a, ours, alen) != 0 && memcmp(a, any, alen) != 0 && memcmp(ours, any, alen) != 0)
            continue;
        if (pred(inode, arg))
            found = 1;
    }
    fclose(f);
    return found;
}
