/* routes[].tls's client certificate and server name (docs/config.md): the files are read when
 * the config is loaded, and a missing, unreadable or wrong file, a certificate without its key,
 * a key without its certificate and an address as server_name are errors naming their path
 * and line. Run from the repository root (make test does). */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/cfg.h"
#include "tests/support/cfgtext.h"

TestSuite(config_tls, .timeout = 60);

static char dir[64];

/* dir/NAME holding 'text'; its path (static, one of four). */
static const char *file(const char *name, const char *text)
{
    static char p[4][128];
    static int k;
    if (!dir[0]) {
        snprintf(dir, sizeof(dir), "/tmp/retryproxy-cfgtls-XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
    }
    k = (k + 1) % 4;
    snprintf(p[k], sizeof(p[k]), "%s/%s", dir, name);
    FILE *f = fopen(p[k], "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    return p[k];
}

#define CERT "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
#define KEY  "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
#define EKEY "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIE\n-----END ENCRYPTED PRIVATE KEY-----\n"

/* The config whose route's tls object is 'tls' (on line 3); NULL and its errors in *errors
 * when refused. */
static struct cfg *load(const char *tls, char **errors)
{
    char text[1024];
    snprintf(text, sizeof(text),
             "{\"routes\": [{\"name\": \"a\",\n"
             " \"upstreams\": [\"https://10.0.0.1:8443\"],\n"
             " \"tls\": %s}]}",
             tls);
    return cfgt_load(text, errors);
}

static void expect_error(const char *tls, const char *want)
{
    char *e = NULL;
    struct cfg *c = load(tls, &e);
    cr_expect_null(c, "accepted: %s", tls);
    cr_expect(strstr(e, want), "%s\nwanted: %s", e, want);
    free(e);
    cfg_unref(c);
}

static void cleanup(void)
{
    if (dir[0]) {
        char cmd[96];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        cr_expect_eq(system(cmd), 0);
    }
}

Test(config_tls, client_certificate_and_server_name_are_read, .fini = cleanup)
{
    char tls[512], *e = NULL;
    const char *cert = file("c.pem", CERT), *key = file("k.pem", KEY);
    snprintf(tls, sizeof(tls),
             "{\"cert_file\": \"%s\", \"key_file\": \"%s\", \"server_name\": \"svc.test\"}", cert,
             key);
    struct cfg *c = load(tls, &e);
    cr_assert_not_null(c, "%s", e);
    free(e);
    cr_expect_str_eq(c->routes[0].tls.cert_file, cert);
    cr_expect_str_eq(c->routes[0].tls.key_file, key);
    cr_expect_str_eq(c->routes[0].tls.server_name, "svc.test");
    cfg_unref(c);
    /* a certificate file that holds its key too needs no key_file */
    snprintf(tls, sizeof(tls), "{\"cert_file\": \"%s\"}", file("both.pem", CERT KEY));
    c = load(tls, &e);
    cr_expect_not_null(c, "%s", e);
    free(e);
    cfg_unref(c);
    /* unset: none, and the URL's host */
    c = load("{}", &e);
    cr_assert_not_null(c, "%s", e);
    free(e);
    cr_expect_null(c->routes[0].tls.cert_file);
    cr_expect_null(c->routes[0].tls.key_file);
    cr_expect_null(c->routes[0].tls.server_name);
    cfg_unref(c);
}

Test(config_tls, bad_files_and_names_are_errors_at_their_path_and_line, .fini = cleanup)
{
    char tls[512];
    const char *cert = file("c.pem", CERT), *key = file("k.pem", KEY);
    snprintf(tls, sizeof(tls), "{\"cert_file\": \"%s/none.pem\", \"key_file\": \"%s\"}", dir, key);
    expect_error(tls, "3:23: $.routes[0].tls.cert_file: cannot be read");
    snprintf(tls, sizeof(tls), "{\"cert_file\": \"%s\", \"key_file\": \"%s/none.key\"}", cert, dir);
    expect_error(tls, "$.routes[0].tls.key_file: cannot be read");
    snprintf(tls, sizeof(tls), "{\"cert_file\": \"%s\", \"key_file\": \"%s\"}", key, key);
    expect_error(tls, "$.routes[0].tls.cert_file: holds no PEM certificate");
    snprintf(tls, sizeof(tls), "{\"cert_file\": \"%s\", \"key_file\": \"%s\"}", cert, cert);
    expect_error(tls, "$.routes[0].tls.key_file: holds no PEM private key");
    snprintf(tls, sizeof(tls), "{\"cert_file\": \"%s\", \"key_file\": \"%s\"}", cert,
             file("e.pem", EKEY));
    expect_error(tls, "$.routes[0].tls.key_file: holds an encrypted private key");
    snprintf(tls, sizeof(tls), "{\"cert_file\": \"%s\"}", cert);
    expect_error(tls, "$.routes[0].tls.cert_file: holds no private key: name the key's file in "
                      "key_file");
    snprintf(tls, sizeof(tls), "{\"key_file\": \"%s\"}", key);
    expect_error(tls, "$.routes[0].tls.key_file: needs cert_file");
    snprintf(tls, sizeof(tls), "{\"cert_file\": \"%s\", \"key_file\": \"%s\"}", dir, key);
    expect_error(tls, "$.routes[0].tls.cert_file: is not a regular file");
    /* a FIFO would hold the load up for ever */
    char fifo[96];
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    snprintf(tls, sizeof(tls), "{\"cert_file\": \"%s\", \"key_file\": \"%s\"}", cert, fifo);
    expect_error(tls, "$.routes[0].tls.key_file: is not a regular file");
    expect_error("{\"server_name\": \"10.0.0.1\"}",
                 "$.routes[0].tls.server_name: must be a host name, not an address");
    expect_error("{\"server_name\": \"svc.test:443\"}", "$.routes[0].tls.server_name: must be a "
                                                        "host name (letters");
    expect_error("{\"server_name\": \"\"}", "$.routes[0].tls.server_name:");
}
