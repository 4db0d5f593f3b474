/* Mutual TLS to upstreams and the name they are verified under (routes[].tls.cert_file,
 * key_file and server_name; docs/config.md): an HTTP/1.1 client, the real binary, and the
 * scripted upstream of tests/tools/h2_upstream.py asking for a client certificate, whose
 * records say which certificate and SNI name each connection came with and what reached it.
 * HTTP/2 goes through the proxy's own TLS (proxy/tls.c), HTTP/1.1 through libcurl. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/h2u.h"

#define T 20000 /* ms: upper bound for any single request in these tests */

static struct h2u *srv;
static char dir[64];

static void stop(void)
{
    h2u_stop_all();
    fx_stop();
    if (dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        fx_sh(cmd);
    }
}

TestSuite(upstream_mtls, .fini = stop, .timeout = 90);

static const char *path_of(const char *name, const char *ext)
{
    static char p[4][128];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof(p[k]), "%s/%s.%s", dir, name, ext);
    return p[k];
}

/* The server's certificate "server" for 'san', and the client's, "client" (self-signed: the
 * server trusts it as it is). */
static void make_certs(const char *san)
{
    snprintf(dir, sizeof(dir), "/tmp/retryproxy-mtls-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    fx_make_cert(dir, "server", san);
    fx_make_cert(dir, "client", "DNS:client.test");
}

/* An upstream choosing 'alpn' that asks for the client certificate, and a proxy whose route
 * "r" goes to it with 'tls' (members of the route's tls object). */
static void start(const char *alpn, const char *tls)
{
    srv = h2u_start_mtls(path_of("server", "pem"), path_of("server", "key"), alpn,
                         path_of("client", "pem"));
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "r",
               "\"upstreams\": [\"%s\"], \"tls\": {\"ca_file\": \"%s\"%s%s}, "
               "\"retry\": {" CFG_FAST ", \"max_attempts\": 1}",
               h2u_url(srv, "/base"), path_of("server", "pem"), *tls ? ", " : "", tls);
    fx_start_b(b, "--workers", "1", NULL);
}

static const char *client_cert(void)
{
    static char m[300];
    snprintf(m, sizeof(m), "\"cert_file\": \"%s\", \"key_file\": \"%s\"", path_of("client", "pem"),
             path_of("client", "key"));
    return m;
}

static int get(const char *path)
{
    struct http_resp r;
    http_do("GET", fx_url(path), NULL, NULL, 0, T, &r);
    cr_assert_eq(r.rc, 0, "curl error %d", r.rc);
    int status = r.status;
    http_free(&r);
    return status;
}

/* The upstream's records whose "event" is 'ev' and member 'key' is 'value'. */
static size_t count_events(const char *ev, const char *key, const char *value)
{
    json_t *all = h2u_records(srv), *r;
    size_t i, n = 0;
    json_array_foreach(all, i, r)
    {
        const char *e = json_str(r, "event"), *v = json_str(r, key);
        n += e && strcmp(e, ev) == 0 && v && strcmp(v, value) == 0;
    }
    json_decref(all);
    return n;
}

/* The Host field of the first HTTP/1.1 request the upstream recorded (NULL: none); its
 * "headers" are [name, value] pairs. */
static char *h1_host(void)
{
    json_t *all = h2u_records(srv), *r;
    size_t i;
    char *host = NULL;
    json_array_foreach(all, i, r)
    {
        const char *e = json_str(r, "event");
        json_t *h = json_object_get(r, "headers");
        size_t j;
        json_t *kv;
        if (e && strcmp(e, "http1") == 0 && json_is_array(h))
            json_array_foreach(h, j, kv)
            {
                const char *k = json_string_value(json_array_get(kv, 0));
                const char *v = json_string_value(json_array_get(kv, 1));
                if (!host && k && v && strcmp(k, "host") == 0)
                    host = strdup(v);
            }
    }
    json_decref(all);
    return host;
}

/* The client certificate over HTTP/2 (the proxy's TLS) and HTTP/1.1 (libcurl's). */
Test(upstream_mtls, a_client_certificate_gets_through_to_an_upstream_requiring_one)
{
    make_certs("IP:127.0.0.1");
    start("h2", client_cert());
    cr_expect_eq(get("/two"), 200);
    cr_expect_eq(h2u_count(srv, "path", "/base/two"), 1);
    cr_expect_eq(count_events("tls", "client", "test"), 1);
    fx_stop();
    h2u_stop_all();

    char tls[400];
    snprintf(tls, sizeof(tls), "\"http2\": \"off\", %s", client_cert());
    start("h2,http/1.1", tls);
    cr_expect_eq(get("/one"), 200);
    cr_expect_eq(count_events("http1", "path", "/base/one"), 1);
    cr_expect_eq(count_events("tls", "client", "test"), 1);
}

/* Without tls.cert_file the upstream ends the handshake: a connect failure, nothing sent. */
Test(upstream_mtls, without_a_client_certificate_the_upstream_refuses)
{
    make_certs("IP:127.0.0.1");
    start("h2", "");
    cr_expect_eq(get("/two"), 502);
    cr_expect_eq(h2u_count(srv, "path", "/base/two"), 0);
    fx_stop();
    h2u_stop_all();

    start("h2,http/1.1", "\"http2\": \"off\"");
    cr_expect_eq(get("/one"), 502);
    cr_expect_eq(count_events("http1", "path", "/base/one"), 0);
}

/* tls.server_name: an upstream reached by address whose certificate names it otherwise is
 * verified under that name, which goes in SNI; Host stays the authority configured. */
Test(upstream_mtls, server_name_is_sent_in_sni_and_verified_in_place_of_the_host)
{
    make_certs("DNS:upstream.test");
    char tls[500];
    snprintf(tls, sizeof(tls), "\"server_name\": \"upstream.test\", %s", client_cert());
    start("h2", tls);
    cr_expect_eq(get("/two"), 200);
    cr_expect_eq(h2u_count(srv, "path", "/base/two"), 1);
    cr_expect_eq(count_events("tls", "sni", "upstream.test"), 1);
    fx_stop();
    h2u_stop_all();

    snprintf(tls, sizeof(tls), "\"http2\": \"off\", \"server_name\": \"upstream.test\", %s",
             client_cert());
    start("h2,http/1.1", tls);
    cr_expect_eq(get("/one"), 200);
    cr_expect_eq(count_events("http1", "path", "/base/one"), 1);
    cr_expect_eq(count_events("tls", "sni", "upstream.test"), 1);
    char *host = h1_host(), want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%u", (unsigned)h2u_port(srv));
    cr_expect(host && strcmp(host, want) == 0, "Host %s, not %s", host ? host : "(none)", want);
    free(host);
}

/* Another name than the certificate's fails verification, on both sides; without
 * server_name the address is verified, which the certificate does not name either. */
Test(upstream_mtls, a_server_name_the_certificate_does_not_hold_fails_verification)
{
    make_certs("DNS:upstream.test");
    char tls[500];
    snprintf(tls, sizeof(tls), "\"server_name\": \"other.test\", %s", client_cert());
    start("h2", tls);
    cr_expect_eq(get("/two"), 502);
    cr_expect_eq(h2u_count(srv, "path", "/base/two"), 0);
    fx_stop();
    h2u_stop_all();

    snprintf(tls, sizeof(tls), "\"http2\": \"off\", \"server_name\": \"other.test\", %s",
             client_cert());
    start("h2,http/1.1", tls);
    cr_expect_eq(get("/one"), 502);
    cr_expect_eq(count_events("http1", "path", "/base/one"), 0);
    fx_stop();
    h2u_stop_all();

    start("h2,http/1.1", client_cert());
    cr_expect_eq(get("/one"), 502);
    cr_expect_eq(count_events("http1", "path", "/base/one"), 0);
}

/* `check` on a config with 'tls' as the route's tls object: its output and exit status. */
static int check(const char *tls, char *out, size_t cap)
{
    char cfg[160], cmd[400];
    snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
    FILE *f = fopen(cfg, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "{\n  \"routes\": [\n    {\n      \"name\": \"r\",\n"
            "      \"upstreams\": [\"https://127.0.0.1:1\"],\n      \"tls\": %s\n    }\n  ]\n}\n",
            tls);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "%s check -c %s 2>&1", getenv("RETRYPROXY_BIN"), cfg);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Config errors name the key and its line: a certificate without its key, files that are not
 * what they should be, a name that is not a host name. */
Test(upstream_mtls, bad_tls_files_and_names_are_config_errors)
{
    make_certs("IP:127.0.0.1");
    char tls[500], out[2048];
    snprintf(tls, sizeof(tls), "{\"cert_file\": \"%s\"}", path_of("client", "pem"));
    cr_expect_eq(check(tls, out, sizeof(out)), 1);
    cr_expect(strstr(out, ":6:") && strstr(out, "$.routes[0].tls.key_file") &&
                  strstr(out, "go together"),
              "%s", out);

    snprintf(tls, sizeof(tls), "{\"cert_file\": \"%s\", \"key_file\": \"%s\"}",
             path_of("client", "key"), path_of("client", "pem"));
    cr_expect_eq(check(tls, out, sizeof(out)), 1);
    cr_expect(strstr(out, "tls.cert_file") && strstr(out, "tls.key_file"), "%s", out);

    snprintf(tls, sizeof(tls), "{\"cert_file\": \"%s/nothing.pem\", \"key_file\": \"%s\"}", dir,
             path_of("client", "key"));
    cr_expect_eq(check(tls, out, sizeof(out)), 1);
    cr_expect(strstr(out, "tls.cert_file") && strstr(out, "cannot be read"), "%s", out);

    cr_expect_eq(check("{\"server_name\": \"a b\"}", out, sizeof(out)), 1);
    cr_expect(strstr(out, "tls.server_name"), "%s", out);

    snprintf(tls, sizeof(tls), "{\"server_name\": \"upstream.test\", %s}", client_cert());
    cr_expect_eq(check(tls, out, sizeof(out)), 0, "%s", out);
}
