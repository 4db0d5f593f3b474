/* proxy/admin: who may ask for what on the admin listener. admin_allows() reads only the
 * peer's address and the path, so every kind of address is tried here, including those an
 * integration test on one host cannot produce; tests/integration/test_admin.c checks the
 * same rule over HTTP from a loopback and a non-loopback address.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "proxy/ops/admin.h"

TestSuite(admin_access);

static const char *const public_paths[] = { "/healthz", "/readyz", "/metrics" };
/* Every other endpoint, and paths that only look like a public one. */
static const char *const local_paths[] = { "/config",    "/schedule", "/reload",   "/",
                                           "/nope",      "",          "/healthz/", "/metricsx",
                                           "//healthz",  "/Healthz",  "/metrics/", "/readyz/x",
                                           "/./healthz", "healthz" };

#define N(a) (sizeof(a) / sizeof((a)[0]))

static struct sockaddr_storage v4(const char *ip)
{
    struct sockaddr_storage ss = { 0 };
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    a->sin_family = AF_INET;
    a->sin_port = htons(40000);
    cr_assert_eq(inet_pton(AF_INET, ip, &a->sin_addr), 1, "%s", ip);
    return ss;
}

static struct sockaddr_storage v6(const char *ip)
{
    struct sockaddr_storage ss = { 0 };
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(40000);
    cr_assert_eq(inet_pton(AF_INET6, ip, &a->sin6_addr), 1, "%s", ip);
    return ss;
}

/* A peer that gets every path. */
static void expect_local(const struct sockaddr_storage *ss, const char *what)
{
    for (size_t i = 0; i < N(public_paths); i++)
        cr_expect(admin_allows((const struct sockaddr *)ss, public_paths[i]), "%s %s", what,
                  public_paths[i]);
    for (size_t i = 0; i < N(local_paths); i++)
        cr_expect(admin_allows((const struct sockaddr *)ss, local_paths[i]),
                  "%s is loopback: \"%s\" must be allowed", what, local_paths[i]);
}

/* A peer that gets the public paths only. */
static void expect_remote(const struct sockaddr_storage *ss, const char *what)
{
    for (size_t i = 0; i < N(public_paths); i++)
        cr_expect(admin_allows((const struct sockaddr *)ss, public_paths[i]),
                  "%s must still reach %s", what, public_paths[i]);
    for (size_t i = 0; i < N(local_paths); i++)
        cr_expect(!admin_allows((const struct sockaddr *)ss, local_paths[i]),
                  "%s is not loopback: \"%s\" must be refused", what, local_paths[i]);
}

Test(admin_access, ipv4_loopback_is_all_of_127_0_0_0_slash_8)
{
    static const char *const local[] = { "127.0.0.1", "127.0.0.2", "127.0.0.6", "127.1.2.3",
                                         "127.255.255.255" };
    for (size_t i = 0; i < N(local); i++) {
        struct sockaddr_storage ss = v4(local[i]);
        expect_local(&ss, local[i]);
    }
}

Test(admin_access, ipv4_other_addresses_get_probes_and_metrics_only)
{
    static const char *const remote[] = { "10.244.1.7",     "192.168.0.1", "126.255.255.255",
                                          "128.0.0.1",      "0.0.0.0",     "255.255.255.255",
                                          "169.254.169.254" };
    for (size_t i = 0; i < N(remote); i++) {
        struct sockaddr_storage ss = v4(remote[i]);
        expect_remote(&ss, remote[i]);
    }
}

Test(admin_access, ipv6_loopback_is_only_colon_colon_1)
{
    struct sockaddr_storage ss = v6("::1");
    expect_local(&ss, "::1");
    static const char *const remote[] = { "::",          "::2",       "fe80::1", "fd00::1",
                                          "2001:db8::1", "::1:0:0:1", "1::1",    "ff02::1" };
    for (size_t i = 0; i < N(remote); i++) {
        ss = v6(remote[i]);
        expect_remote(&ss, remote[i]);
    }
}

/* How a dual-stack ("[::]:15000") listener sees IPv4 clients. */
Test(admin_access, ipv4_mapped_ipv6_follows_the_ipv4_rule)
{
    static const char *const local[] = { "::ffff:127.0.0.1", "::ffff:127.9.9.9" };
    for (size_t i = 0; i < N(local); i++) {
        struct sockaddr_storage ss = v6(local[i]);
        expect_local(&ss, local[i]);
    }
    /* ::127.0.0.1 is the deprecated IPv4-compatible form, not a mapped one; 64:ff9b:: is
     * NAT64, a translated remote host */
    static const char *const remote[] = { "::ffff:10.0.0.1", "::ffff:128.0.0.1", "::127.0.0.1",
                                          "64:ff9b::7f00:1", "::ffff:0.0.0.0" };
    for (size_t i = 0; i < N(remote); i++) {
        struct sockaddr_storage ss = v6(remote[i]);
        expect_remote(&ss, remote[i]);
    }
}

Test(admin_access, unknown_peer_or_family_gets_probes_and_metrics_only)
{
    for (size_t i = 0; i < N(public_paths); i++)
        cr_expect(admin_allows(NULL, public_paths[i]));
    for (size_t i = 0; i < N(local_paths); i++)
        cr_expect(!admin_allows(NULL, local_paths[i]), "NULL peer: %s", local_paths[i]);

    struct sockaddr_storage ss = { 0 };
    struct sockaddr_un *u = (struct sockaddr_un *)&ss;
    u->sun_family = AF_UNIX;
    strcpy(u->sun_path, "/run/retryproxy.sock");
    expect_remote(&ss, "AF_UNIX");
    ss.ss_family = AF_UNSPEC;
    expect_remote(&ss, "AF_UNSPEC");
}
