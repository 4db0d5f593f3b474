/* Upstream TLS besides trust (docs/config.md routes[].tls): the client certificate a route
 * presents (cert_file, key_file) to an upstream that requires one, and the name sent in SNI and
 * verified (server_name), over HTTP/1.1 through libcurl and over h2. The upstream is
 * tests/tools/h2_upstream.py with --client-ca, whose records say what each handshake carried. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/h2u.h"
#include "tests/support/tlsfix.h"

#define T 20000 /* ms: upper bound for any single request in these tests */

static struct h2u *srv;

TestSuite(upstream_tls, .fini = tlsfix_stop, .timeout = 90);

static long get(const char *path, char **body)
{
    struct http_resp r;
    http_do("GET", fx_url(path), NULL, NULL, 0, T, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    long status = r.status;
    if (body)
        *body = r.body ? strndup((char *)r.body, r.body_len) : strdup("");
    http_free(&r);
    return status;
}

/* The upstream's "tls" records with member 'key' equal to 'value' (a string), or, with
 * 'value' NULL, with 'key' true. */
static size_t tls_records(const char *key, const char *value)
{
    json_t *all = h2u_records(srv), *r;
    size_t i, n = 0;
    json_array_foreach(all, i, r)
    {
        const char *e = json_str(r, "event");
        if (!e || strcmp(e, "tls") != 0)
            continue;
        json_t *v = json_object_get(r, key);
        n +=
            value ? json_is_string(v) && strcmp(json_string_value(v), value) == 0 : json_is_true(v);
    }
    json_decref(all);
    return n;
}

static size_t http1_paths(const char *path)
{
    json_t *all = h2u_records(srv), *r;
    size_t i, n = 0;
    json_array_foreach(all, i, r)
    {
        const char *e = json_str(r, "event"), *p = json_str(r, "path");
        n += e && p && strcmp(e, "http1") == 0 && strcmp(p, path) == 0;
    }
    json_decref(all);
    return n;
}

/* Route 'name' for /NAME/ to the upstream over 'http2' ("off": libcurl, "required": h2),
 * trusting 'ca' and with the tls members 'more'. */
static void route(struct cfgb *b, const char *name, const char *http2, const char *ca,
                  const char *more)
{
    cfgb_route(b, name,
               "\"match\": {\"path_prefix\": \"/%s/\"}, \"upstreams\": [\"%s\"], "
               "\"tls\": {\"http2\": \"%s\", \"ca_file\": \"%s\"%s%s}, "
               "\"retry\": {\"max_attempts\": 1}",
               name, h2u_url(srv, ""), http2, ca, *more ? ", " : "", more);
}

/* An upstream that requires a client certificate: a route presenting one gets through over
 * HTTP/1.1 and h2; a route to the same upstream without one gets a 502, though the routes with
 * the certificate left connections open to it (none is shared across client certificates). */
Test(upstream_tls, a_client_certificate_gets_through_and_none_is_refused)
{
    struct tls_pair s = tlsfix_cert("srv", "IP:127.0.0.1"),
                    c = tlsfix_cert("cli", "DNS:client.test");
    const char *srv_pem = s.pem;
    srv = h2u_start_mtls(s.pem, s.key, "h2,http/1.1", c.pem);
    const char *with = tlsfix_present(c.pem, c.key);
    struct cfgb *b = cfgb_new();
    route(b, "h1", "off", srv_pem, with);
    route(b, "h2", "required", srv_pem, with);
    route(b, "h1none", "off", srv_pem, "");
    route(b, "h2none", "required", srv_pem, "");
    fx_start_b(b, "--workers", "1", NULL);
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(get("/h1/a", NULL), 200);
        cr_expect_eq(get("/h2/a", NULL), 200);
    }
    cr_expect_eq(http1_paths("/h1/a"), 2);
    cr_expect_eq(h2u_count(srv, "path", "/h2/a"), 2);
    cr_expect_eq(tls_records("client_cert", NULL), 2, "one connection each, kept");
    char *body = NULL;
    cr_expect_eq(get("/h1none/b", &body), 502);
    cr_expect(strstr(body, "upstream_"), "%s", body);
    free(body);
    cr_expect_eq(get("/h2none/b", &body), 502);
    cr_expect(strstr(body, "upstream_unavailable"), "%s", body);
    free(body);
    cr_expect_eq(http1_paths("/h1none/b"), 0);
    cr_expect_eq(h2u_count(srv, "path", "/h2none/b"), 0);
    cr_expect_eq(tls_records("client_cert", NULL), 2);
    /* TLS 1.3: the server refuses the client after the client's handshake ended, so the
     * attempt is mostly a reset (docs/config.md), not a connect failure; when the refusal is
     * read before the request went out (a loaded machine) it is one: either way, one attempt
     * that failed and nothing sent */
    for (int i = 0; i < 2; i++) {
        char reset[96], connect[96];
        const char *route = i ? "h2none" : "h1none";
        snprintf(reset, sizeof(reset), "retryproxy_attempts_total{route=\"%s\",outcome=\"reset\"}",
                 route);
        snprintf(connect, sizeof(connect),
                 "retryproxy_attempts_total{route=\"%s\",outcome=\"connect_failure\"}", route);
        double nr = fx_metric(reset), nc = fx_metric(connect);
        cr_expect_eq(nr + nc, 1, "%s: %g reset, %g connect_failure", route, nr, nc);
    }
    /* a key in the certificate's own file serves as well (key_file null) */
    const char *both = tlsfix_cat("both.pem", c.pem, c.key);
    fx_stop();
    b = cfgb_new();
    with = tlsfix_present(both, NULL);
    route(b, "h1", "off", srv_pem, with);
    route(b, "h2", "required", srv_pem, with);
    fx_start_b(b, "--workers", "1", NULL);
    cr_expect_eq(get("/h1/c", NULL), 200);
    cr_expect_eq(get("/h2/c", NULL), 200);
}

/* A certificate made out to a name other than the URL's host: server_name sends that name in
 * SNI and verifies it, over HTTP/1.1 and h2, while connections go to the URL's address and
 * Host (:authority) stays the URL's; another name fails verification and nothing is sent. */
Test(upstream_tls, server_name_is_sent_and_verified_instead_of_the_url_host)
{
    struct tls_pair n = tlsfix_cert("named", "DNS:upstream.test");
    const char *pem = n.pem;
    srv = h2u_start_tls(n.pem, n.key, "h2,http/1.1");
    struct cfgb *b = cfgb_new();
    route(b, "h1", "off", pem, "\"server_name\": \"upstream.test\"");
    route(b, "h2", "required", pem, "\"server_name\": \"upstream.test\"");
    route(b, "h1bad", "off", pem, "\"server_name\": \"elsewhere.test\"");
    route(b, "h2bad", "required", pem, "\"server_name\": \"elsewhere.test\"");
    route(b, "h1url", "off", pem, "");
    fx_start_b(b, "--workers", "1", NULL);
    cr_expect_eq(get("/h1/a", NULL), 200);
    cr_expect_eq(get("/h2/a", NULL), 200);
    cr_expect_eq(http1_paths("/h1/a"), 1);
    cr_expect_eq(h2u_count(srv, "path", "/h2/a"), 1);
    cr_expect_eq(tls_records("sni", "upstream.test"), 2);
    char authority[64];
    snprintf(authority, sizeof(authority), "127.0.0.1:%u", h2u_port(srv));
    cr_expect_eq(h2u_count(srv, "authority", authority), 1);
    json_t *h1 = h2u_find(srv, "event", "http1");
    cr_assert_not_null(h1);
    json_t *fields = json_object_get(h1, "headers"), *f;
    size_t i, hosts = 0;
    json_array_foreach(fields, i, f)
    {
        const char *k = json_string_value(json_array_get(f, 0));
        const char *v = json_string_value(json_array_get(f, 1));
        if (k && strcmp(k, "host") == 0) {
            hosts++;
            cr_expect(v && strcmp(v, authority) == 0, "Host %s", v ? v : "(null)");
        }
    }
    cr_expect_eq(hosts, 1);
    json_decref(h1);
    cr_expect_eq(get("/h1bad/b", NULL), 502);
    cr_expect_eq(get("/h2bad/b", NULL), 502);
    cr_expect_eq(get("/h1url/b", NULL), 502, "the URL's host is not on the certificate");
    cr_expect_eq(http1_paths("/h1bad/b") + http1_paths("/h1url/b"), 0);
    cr_expect_eq(h2u_count(srv, "path", "/h2bad/b"), 0);
}

/* The config of routes "h1" (libcurl) and "h2" presenting the certificate 'pem' with the key
 * 'key', trusting 'ca', written to fx_cfg_path. */
static void write_config(const char *ca, const char *pem, const char *key)
{
    struct cfgb *b = cfgb_new();
    const char *with = tlsfix_present(pem, key);
    route(b, "h1", "off", ca, with);
    route(b, "h2", "required", ca, with);
    char *text = cfgb_text(b);
    cfg_write_renamed(fx_cfg_path, text);
    free(text);
}

/* A reload reads the files anew: one naming a key that does not exist is refused and the
 * running config goes on presenting its certificate; one naming a new certificate in other
 * files is taken, and new connections present it. */
Test(upstream_tls, a_reload_takes_new_files_and_refuses_missing_ones)
{
    struct tls_pair s = tlsfix_cert("srv", "IP:127.0.0.1"),
                    c = tlsfix_cert("cli", "DNS:client.test"),
                    c2 = tlsfix_cert("cli2", "DNS:renewed.test");
    const char *trusted = tlsfix_cat("clients.pem", c.pem, c2.pem);
    srv = h2u_start_mtls(s.pem, s.key, "h2,http/1.1", trusted);
    fx_config_dir("uptls");
    write_config(s.pem, c.pem, c.key);
    const char *args[] = { "-c",          fx_cfg_path, "--listen", "127.0.0.1:0", "--admin",
                           "127.0.0.1:0", "--workers", "1",        NULL };
    fx_start_argv(args);
    cr_expect_eq(get("/h1/a", NULL), 200);
    cr_expect_eq(get("/h2/a", NULL), 200);
    cr_expect_eq(tls_records("client_name", "client.test"), 2);
    write_config(s.pem, c.pem, tlsfix_path("missing", "key"));
    cr_assert_eq(fx_wait_metric("retryproxy_config_last_reload_successful", 0, 10000), 0,
                 "a missing key_file was not refused");
    cr_expect_eq(get("/h1/b", NULL), 200, "the running config goes on");
    cr_expect_eq(get("/h2/b", NULL), 200);
    write_config(s.pem, c2.pem, c2.key);
    cr_assert_eq(fx_wait_metric("retryproxy_config_last_reload_successful", 1, 10000), 1);
    cr_expect_eq(get("/h1/c", NULL), 200);
    cr_expect_eq(get("/h2/c", NULL), 200);
    cr_expect_eq(tls_records("client_name", "renewed.test"), 2);
}
