/* proxy/listen: the workers of one process share a port, nothing else does. Real sockets on
 * 127.0.0.1 (and ::1 where the host has IPv6); the "other process" is a child of the test
 * holding a socket, or for listen_shared() a socket of this test that is not one of the
 * group's, which is all that /proc/net/tcp can tell apart.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proxy/listen.h"

#define IN_USE      "address already in use by another process"
#define IN_USE_HERE "address already in use by this process's other listener"

TestSuite(listen, .timeout = 30);

/* A TCP socket of 'family' bound to 'host':'port' (port 0: any), listening unless 'bound_only',
 * with SO_REUSEPORT if 'reuseport'; its port goes to *out_port. */
static int sock_at(int family, const char *host, unsigned port, bool reuseport, bool bound_only,
                   unsigned *out_port)
{
    struct sockaddr_storage ss = { 0 };
    socklen_t len;
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        cr_assert_eq(inet_pton(AF_INET6, host, &a->sin6_addr), 1);
        len = sizeof(*a);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        cr_assert_eq(inet_pton(AF_INET, host, &a->sin_addr), 1);
        len = sizeof(*a);
    }
    int one = 1, fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (reuseport)
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    cr_assert_eq(bind(fd, (struct sockaddr *)&ss, len), 0, "bind %s:%u: %s", host, port,
                 strerror(errno));
    if (!bound_only)
        cr_assert_eq(listen(fd, 16), 0);
    len = sizeof(ss);
    getsockname(fd, (struct sockaddr *)&ss, &len);
    if (out_port)
        *out_port = ntohs(((struct sockaddr_in *)&ss)->sin_port); /* same offset in v6 */
    return fd;
}

static unsigned port_of(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static bool have_ipv6_loopback(void)
{
    struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

static void close_all(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
}

/* Hands socket 'fd' to a child process that holds it until elsewhere_end(); this process no
 * longer has it. */
static pid_t elsewhere(int fd)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        for (;;)
            pause();
    }
    close(fd);
    return pid;
}

static void elsewhere_end(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* listen_open on 'addr' that must fail because something holds it: 'msg' says what. */
static void expect_refused(const char *addr, const char *msg)
{
    int fds[2] = { -1, -1 };
    char bound[64], why[256], want[160];
    cr_expect_eq(listen_open(addr, 2, fds, bound, sizeof(bound), why, sizeof(why)), -1,
                 "%s was bound beside another socket", addr);
    snprintf(want, sizeof(want), "cannot listen on %s: %s", addr, msg);
    cr_expect_str_eq(why, want);
    cr_expect_eq(fds[0], -1);
}

static void expect_in_use(const char *addr)
{
    expect_refused(addr, IN_USE);
}

/* A socket on 'host' (any port, SO_REUSEPORT if 'reuseport') held by another process: listening
 * on 'listen_host' at that port is refused as in use by another process. */
static void expect_in_use_elsewhere(int family, const char *host, bool reuseport,
                                    const char *listen_host)
{
    unsigned port;
    pid_t other = elsewhere(sock_at(family, host, 0, reuseport, false, &port));
    char addr[80];
    snprintf(addr, sizeof(addr), "%s:%u", listen_host, port);
    expect_in_use(addr);
    elsewhere_end(other);
}

/* listen_open() of 'n' sockets on 'addr', which must succeed; the address they are bound to goes
 * to 'bound' (64 bytes). Returns their port. */
static unsigned open_group(const char *addr, int *fds, size_t n, char *bound)
{
    char why[256];
    cr_assert_eq(listen_open(addr, n, fds, bound, 64, why, sizeof(why)), 0, "%s: %s", addr, why);
    return port_of(fds[0]);
}

Test(listen, workers_share_the_port_the_kernel_picked_for_port_0)
{
    int fds[3];
    char bound[64], want[64];
    unsigned port = open_group("127.0.0.1:0", fds, 3, bound);
    cr_expect_neq(port, 0);
    cr_expect_eq(port_of(fds[1]), port);
    cr_expect_eq(port_of(fds[2]), port);
    snprintf(want, sizeof(want), "127.0.0.1:%u", port);
    cr_expect_str_eq(bound, want);
    cr_expect_eq(listen_shared(fds, 3), 0, "the group's own sockets count as another process");
    close_all(fds, 3);
}

Test(listen, a_port_another_socket_listens_on_is_refused)
{
    expect_in_use_elsewhere(AF_INET, "127.0.0.1", false, "127.0.0.1");
}

/* The case SO_REUSEPORT alone lets through: the other socket set it too, as a second
 * retryproxy's workers do. */
Test(listen, a_port_another_reuseport_group_listens_on_is_refused)
{
    expect_in_use_elsewhere(AF_INET, "127.0.0.1", true, "127.0.0.1");
}

/* listen and admin given one address: the other listener is this process's own. */
Test(listen, a_port_this_process_already_listens_on_is_named_as_such)
{
    int fds[2];
    char bound[64];
    open_group("127.0.0.1:0", fds, 2, bound);
    expect_refused(bound, IN_USE_HERE);
    close_all(fds, 2);
}

Test(listen, a_wildcard_listener_on_the_port_is_refused_and_so_is_the_reverse)
{
    expect_in_use_elsewhere(AF_INET, "0.0.0.0", true, "127.0.0.1");
    expect_in_use_elsewhere(AF_INET, "127.0.0.1", true, "0.0.0.0");
}

Test(listen, ipv6_port_another_reuseport_group_listens_on_is_refused)
{
    if (!have_ipv6_loopback())
        cr_skip_test("no IPv6 loopback on this host");
    expect_in_use_elsewhere(AF_INET6, "::1", true, "[::1]");
}

/* A restart: the previous instance's connections in TIME_WAIT do not hold the port. */
Test(listen, time_wait_connections_of_a_previous_listener_do_not_block_a_restart)
{
    int fds[2], c;
    char bound[64];
    unsigned port = open_group("127.0.0.1:0", fds, 2, bound);
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(connect(c, (struct sockaddr *)&a, sizeof(a)), 0);
    int s = -1;
    for (int i = 0; i < 200 && s < 0; i++, usleep(5000))
        for (size_t k = 0; k < 2 && s < 0; k++)
            s = accept(fds[k], NULL, NULL);
    cr_assert(s >= 0, "accept: %s", strerror(errno));
    close(s); /* the server side closes first: its end goes to TIME_WAIT */
    usleep(20000);
    close(c);
    close_all(fds, 2);

    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
    open_group(addr, fds, 2, bound);
    close_all(fds, 2);
}

/* Step 3 on its own (steps 1 and 2 cannot be raced from one thread): a socket that joined the
 * group's port is seen, one on another address of the same port is not. */
Test(listen, shared_sees_a_socket_that_joined_the_group)
{
    int fds[2];
    char bound[64];
    unsigned port = open_group("127.0.0.1:0", fds, 2, bound);
    cr_expect_eq(listen_shared(fds, 2), 0);
    cr_expect_eq(listen_shared(fds, 1), 1, "fds[1] is not in the set: it is another process's");

    int elsewhere = sock_at(AF_INET, "127.0.0.2", port, true, false, NULL);
    cr_expect_eq(listen_shared(fds, 2), 0, "127.0.0.2 does not overlap 127.0.0.1");
    int joined = sock_at(AF_INET, "127.0.0.1", port, true, false, NULL);
    cr_expect_eq(listen_shared(fds, 2), 1);
    close(joined);
    cr_expect_eq(listen_shared(fds, 2), 0);
    int wildcard = sock_at(AF_INET, "0.0.0.0", port, true, false, NULL);
    cr_expect_eq(listen_shared(fds, 2), 1, "0.0.0.0 overlaps 127.0.0.1");
    close(wildcard);
    int not_listening = sock_at(AF_INET, "127.0.0.1", port, true, true, NULL);
    cr_expect_eq(listen_shared(fds, 2), 0, "a socket that only bound takes no clients");
    close(not_listening);
    close(elsewhere);
    close_all(fds, 2);
}

Test(listen, shared_sees_an_ipv6_socket_that_joined_the_group)
{
    if (!have_ipv6_loopback())
        cr_skip_test("no IPv6 loopback on this host");
    int fds[2];
    char bound[64], want[64];
    unsigned port = open_group("[::1]:0", fds, 2, bound);
    snprintf(want, sizeof(want), "[::1]:%u", port);
    cr_expect_str_eq(bound, want);
    cr_expect_eq(listen_shared(fds, 2), 0);
    int joined = sock_at(AF_INET6, "::1", port, true, false, NULL);
    cr_expect_eq(listen_shared(fds, 2), 1);
    close(joined);
    close_all(fds, 2);
}
