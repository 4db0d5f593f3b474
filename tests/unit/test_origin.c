/* origin: an h2c upstream's host and port, resolved once (proxy/origin.h). */
#include <criterion/criterion.h>
#include <netinet/in.h>

#include "proxy/origin.h"

static uint16_t port_of(const struct origin *o)
{
    if (o->addr.ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)&o->addr)->sin6_port);
    return ntohs(((const struct sockaddr_in *)&o->addr)->sin_port);
}

Test(origin, host_and_port_resolve_into_the_key)
{
    struct origin *o = origin_new("127.0.0.1:50051");
    cr_assert_not_null(o);
    cr_expect_str_eq(o->authority, "127.0.0.1:50051");
    cr_expect_str_eq(o->key, "127.0.0.1:50051@127.0.0.1");
    cr_expect_gt(o->addr_len, 0);
    cr_expect_eq(o->addr.ss_family, AF_INET);
    cr_expect_eq(port_of(o), 50051);
    origin_free(o);
}

Test(origin, the_port_defaults_to_80)
{
    struct origin *o = origin_new("127.0.0.1");
    cr_assert_not_null(o);
    cr_expect_eq(port_of(o), 80);
    cr_expect_str_eq(o->key, "127.0.0.1:80@127.0.0.1");
    origin_free(o);
}

Test(origin, an_ipv6_literal_in_brackets)
{
    struct origin *o = origin_new("[::1]:8080");
    cr_assert_not_null(o);
    cr_expect_str_eq(o->key, "::1:8080@::1");
    cr_expect_eq(o->addr.ss_family, AF_INET6);
    cr_expect_eq(port_of(o), 8080);
    origin_free(o);
}

/* .invalid never resolves (RFC 6761): the origin exists, without an address */
Test(origin, a_name_that_does_not_resolve_has_no_address)
{
    struct origin *o = origin_new("nowhere.invalid:80");
    cr_assert_not_null(o);
    cr_expect_eq(o->addr_len, 0);
    cr_expect_str_eq(o->key, "nowhere.invalid:80@");
    origin_free(o);
}

Test(origin, free_accepts_null)
{
    origin_free(NULL);
}
