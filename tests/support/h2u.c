#include "tests/support/h2u.h"

#include <criterion/criterion.h>
#include <poll.h>
#include <stdbool.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/proc.h"

#define H2U_MAX 4

struct h2u {
    pid_t pid;
    int in; /* its stdin: it exits when this closes */
    uint16_t port;
    bool tls;
    char ip[16];
    char record[96];
};

static struct h2u running[H2U_MAX];
static size_t n_running;

struct h2u *h2u_start(void)
{
    return h2u_start_tls(NULL, NULL, NULL);
}

struct h2u *h2u_start_tls(const char *cert, const char *key, const char *alpn)
{
    return h2u_start_mtls(cert, key, alpn, NULL);
}

static struct h2u *start(const char *ip, uint16_t port, const char *cert, const char *key,
                         const char *alpn, const char *client_ca)
{
    cr_assert_lt(n_running, H2U_MAX, "too many h2 upstreams");
    struct h2u *u = &running[n_running];
    snprintf(u->record, sizeof(u->record), "/tmp/retryproxy-h2u-%d-%zu.jsonl", (int)getpid(),
             n_running);
    unlink(u->record);
    u->tls = cert != NULL;
    snprintf(u->ip, sizeof(u->ip), "%s", ip ? ip : "127.0.0.1");
    char bind[32];
    snprintf(bind, sizeof(bind), "%s:%u", u->ip, port);
    char *argv[16] = { "/usr/bin/python3", "tests/tools/h2_upstream.py", u->record, "--bind", bind,
                       "--alpn",           (char *)(alpn ? alpn : "h2") };
    size_t n = 7;
    if (cert) {
        argv[n++] = "--tls";
        argv[n++] = (char *)cert;
        argv[n++] = (char *)key;
    }
    if (client_ca) {
        argv[n++] = "--client-ca";
        argv[n++] = (char *)client_ca;
    }
    argv[n] = NULL;
    char buf[32];
    u->pid = proc_helper_start(argv, &u->in, buf, sizeof(buf), 10000);
    cr_assert_gt(u->pid, 0, "cannot start h2_upstream.py");
    n_running++;
    u->port = (uint16_t)atoi(buf);
    cr_assert_gt(u->port, 0, "h2_upstream.py printed no port (python3-h2 missing?)");
    return u;
}

struct h2u *h2u_start_mtls(const char *cert, const char *key, const char *alpn,
                           const char *client_ca)
{
    return start(NULL, 0, cert, key, alpn, client_ca);
}

struct h2u *h2u_start_at(const char *ip, uint16_t port, const char *cert, const char *key,
                         const char *alpn)
{
    return start(ip, port, cert, key, alpn, NULL);
}

uint16_t h2u_port(const struct h2u *u)
{
    return u->port;
}

const char *h2u_url(const struct h2u *u, const char *base)
{
    static char url[128];
    snprintf(url, sizeof(url), "%s://%s:%u%s", u->tls ? "https" : "h2c", u->ip, u->port, base);
    return url;
}

json_t *h2u_records(const struct h2u *u)
{
    return fx_read_jsonl(u->record);
}

static bool matches(const json_t *r, const char *key, const char *value)
{
    const json_t *v = json_object_get(r, key);
    return json_is_string(v) && strcmp(json_string_value(v), value) == 0;
}

size_t h2u_count(const struct h2u *u, const char *key, const char *value)
{
    json_t *all = h2u_records(u), *r;
    size_t i, n = 0;
    json_array_foreach(all, i, r) n += matches(r, key, value);
    json_decref(all);
    return n;
}

json_t *h2u_find(const struct h2u *u, const char *key, const char *value)
{
    json_t *all = h2u_records(u), *r, *found = NULL;
    size_t i;
    json_array_foreach(all, i, r) if (!found && matches(r, key, value)) found = json_incref(r);
    json_decref(all);
    return found;
}

size_t h2u_connections(const struct h2u *u)
{
    return h2u_count(u, "event", "accepted");
}

void h2u_stop_all(void)
{
    for (size_t i = 0; i < n_running; i++) {
        struct h2u *u = &running[i];
        proc_helper_stop(u->pid, u->in);
        unlink(u->record);
    }
    n_running = 0;
}

void h2u_vtool(char *out, size_t cap, const char *tool, const char *fmt, va_list ap)
{
    char *args = NULL, *cmd = NULL;
    cr_assert_geq(vasprintf(&args, fmt, ap), 0);
    cr_assert_geq(asprintf(&cmd, "%s %s", tool, args), 0);
    free(args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    out[0] = '\0';
    if (!fgets(out, (int)cap, p))
        out[0] = '\0';
    int rc = pclose(p);
    cr_assert_eq(rc, 0, "%.200s exited %d (output: %s)", cmd, rc, out);
    free(cmd);
}

void h2u_peer(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    h2u_vtool(out, cap, H2U_PEER, fmt, ap);
    va_end(ap);
}

long h2u_peer_field(const char *line, const char *key)
{
    char k[64];
    snprintf(k, sizeof(k), "%s ", key);
    const char *p = strstr(line, k);
    if (!p)
        return -1;
    char *end;
    long v = strtol(p + strlen(k), &end, 10);
    return end == p + strlen(k) ? -1 : v;
}
