/* origin: an HTTP/2 upstream's host and port, resolved once (proxy/origin.h). */
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
    struct origin *o = origin_new("127.0.0.1:50051", NULL);
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
    struct origin *o = origin_new("127.0.0.1", NULL);
    cr_assert_not_null(o);
    cr_expect_eq(port_of(o), 80);
    cr_expect_str_eq(o->key, "127.0.0.1:80@127.0.0.1");
    origin_free(o);
}

Test(origin, an_ipv6_literal_in_brackets)
{
    struct origin *o = origin_new("[::1]:8080", NULL);
    cr_assert_not_null(o);
    cr_expect_str_eq(o->key, "::1:8080@::1");
    cr_expect_eq(o->addr.ss_family, AF_INET6);
    cr_expect_eq(port_of(o), 8080);
    origin_free(o);
}

/* .invalid never resolves (RFC 6761): the origin exists, without an address */
Test(origin, a_name_that_does_not_resolve_has_no_address)
{
    struct origin *o = origin_new("nowhere.invalid:80", NULL);
    cr_assert_not_null(o);
    cr_expect_eq(o->addr_len, 0);
    cr_expect_str_eq(o->key, "nowhere.invalid:80@");
    origin_free(o);
}

Test(origin, free_accepts_null)
{
    origin_free(NULL);
}

/* An https origin: port 443 by default, its host kept for TLS (no brackets), and how it is
 * reached in its key, so that connections trusting other certificates are not shared. */
Test(origin, an_https_origin_defaults_to_443_and_keys_its_trust)
{
    struct origin_tls system = { NULL, true }, own = { "/etc/ca.pem", false };
    struct origin *a = origin_new("[::1]", &system), *b = origin_new("[::1]", &own);
    cr_assert(a && b);
    cr_expect_eq(port_of(a), 443);
    cr_expect_str_eq(a->host, "::1");
    cr_expect(a->tls && a->h1_too && !a->ca_file);
    cr_expect(b->tls && !b->h1_too);
    cr_expect_str_eq(b->ca_file, "/etc/ca.pem");
    cr_expect_str_neq(a->key, b->key);
    struct origin *c = origin_new("[::1]:443", NULL);
    cr_assert_not_null(c);
    cr_expect_not(c->tls);
    cr_expect_str_neq(a->key, c->key, "cleartext and TLS share no connection");
    origin_free(a);
    origin_free(b);
    origin_free(c);
}
