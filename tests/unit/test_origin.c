/* origin: an HTTP/2 upstream's host and port, resolved once (proxy/upstream/origin.h). */
#include <criterion/criterion.h>
#include <netinet/in.h>

#include "proxy/upstream/origin.h"

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
    struct origin_tls system = { .h1_too = true }, own = { .ca_file = "/etc/ca.pem" };
    struct origin *a = origin_new("[::1]", &system), *b = origin_new("[::1]", &own);
    cr_assert(a && b);
    cr_expect_eq(port_of(a), 443);
    cr_expect_str_eq(a->host, "::1");
    cr_expect(a->tls && a->h1_too && !a->tls_conf.ca_file);
    cr_expect(b->tls && !b->h1_too);
    cr_expect_str_eq(b->tls_conf.ca_file, "/etc/ca.pem");
    cr_expect_str_neq(a->key, b->key);
    struct origin *c = origin_new("[::1]:443", NULL);
    cr_assert_not_null(c);
    cr_expect_not(c->tls);
    cr_expect_str_neq(a->key, c->key, "cleartext and TLS share no connection");
    origin_free(a);
    origin_free(b);
    origin_free(c);
}

/* A client certificate, its key or another verified name makes another origin: an h2
 * connection presenting one certificate (or expecting one name) is never given another's
 * streams. The name verified is server_name when set, else the host. */
Test(origin, client_certificates_and_server_names_key_their_origin)
{
    struct origin_tls none = { .h1_too = true }, cert = { .cert_file = "/c.pem", .h1_too = true },
                      key = { .cert_file = "/c.pem", .key_file = "/k.pem", .h1_too = true },
                      named = { .server_name = "svc.test", .h1_too = true };
    struct origin *o[4] = { origin_new("127.0.0.1:8443", &none),
                            origin_new("127.0.0.1:8443", &cert), origin_new("127.0.0.1:8443", &key),
                            origin_new("127.0.0.1:8443", &named) };
    for (int i = 0; i < 4; i++)
        cr_assert_not_null(o[i]);
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            cr_expect_str_neq(o[i]->key, o[j]->key, "%d and %d", i, j);
    cr_expect_str_eq(o[0]->tls_conf.name, "127.0.0.1");
    cr_expect_str_eq(o[3]->tls_conf.name, "svc.test");
    cr_expect_str_eq(o[3]->host, "127.0.0.1", "connections still go to the URL's host");
    cr_expect_str_eq(o[2]->tls_conf.key_file, "/k.pem");
    for (int i = 0; i < 4; i++)
        origin_free(o[i]);
}
