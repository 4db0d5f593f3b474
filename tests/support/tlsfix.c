/* The TLS fixtures of the suites that speak TLS to an upstream (tlsfix.h). */
#include "tests/support/tlsfix.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>

#include "tests/support/fixture.h"
#include "tests/support/h2u.h"

static char dir[64];

/* One of four buffers in turn, for results a test holds a few of at once. */
static char *ring(void)
{
    static char buf[4][512];
    static unsigned k;
    return buf[k++ % 4];
}

struct tls_pair tlsfix_cert(const char *name, const char *san)
{
    if (!dir[0]) {
        snprintf(dir, sizeof(dir), "/tmp/retryproxy-tls-XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
    }
    fx_make_cert(dir, name, san);
    struct tls_pair p;
    snprintf(p.pem, sizeof(p.pem), "%s/%s.pem", dir, name);
    snprintf(p.key, sizeof(p.key), "%s/%s.key", dir, name);
    return p;
}

const char *tlsfix_path(const char *name, const char *ext)
{
    char *p = ring();
    snprintf(p, 512, "%s/%s.%s", dir, name, ext);
    return p;
}

const char *tlsfix_cat(const char *name, const char *a, const char *b)
{
    char *p = ring(), cmd[1024];
    snprintf(p, 512, "%s/%s", dir, name);
    snprintf(cmd, sizeof(cmd), "cat %s %s > %s", a, b, p);
    cr_assert_eq(fx_sh(cmd), 0, "%s", cmd);
    return p;
}

const char *tlsfix_trust(const char *pem)
{
    char *m = ring();
    snprintf(m, 512, "\"ca_file\": \"%s\"", pem);
    return m;
}

const char *tlsfix_present(const char *pem, const char *key)
{
    char *m = ring();
    if (key)
        snprintf(m, 512, "\"cert_file\": \"%s\", \"key_file\": \"%s\"", pem, key);
    else
        snprintf(m, 512, "\"cert_file\": \"%s\"", pem);
    return m;
}

void tlsfix_stop(void)
{
    h2u_stop_all();
    fx_stop();
    if (dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        fx_sh(cmd);
        dir[0] = '\0';
    }
}
