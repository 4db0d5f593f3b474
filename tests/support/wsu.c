#include "tests/support/wsu.h"

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/proc.h"

#define WSU_MAX 3

struct wsu {
    pid_t pid;
    int in; /* its stdin: it exits when this closes */
    uint16_t port;
    bool tls;
    char ip[16];
    char record[96];
};

static struct wsu running[WSU_MAX];
static size_t n_running;

static struct wsu *start_at(const char *ip, uint16_t port, int refuse, const char *cert,
                            const char *key, const char *client_ca)
{
    cr_assert_lt(n_running, WSU_MAX, "too many WebSocket upstreams");
    struct wsu *u = &running[n_running];
    snprintf(u->record, sizeof(u->record), "/tmp/retryproxy-wsu-%d-%zu.jsonl", (int)getpid(),
             n_running);
    unlink(u->record);
    char status[16];
    snprintf(status, sizeof(status), "%d", refuse);
    u->tls = cert != NULL;
    snprintf(u->ip, sizeof(u->ip), "%s", ip ? ip : "127.0.0.1");
    char bind[32];
    snprintf(bind, sizeof(bind), "%s:%u", u->ip, port);
    char *argv[12] = { "/usr/bin/python3", "tests/tools/ws_peer.py",
                       "server",           u->record,
                       "--bind",           bind };
    if (refuse) {
        argv[6] = "--refuse";
        argv[7] = status;
    } else if (cert) {
        argv[6] = "--tls";
        argv[7] = (char *)cert;
        argv[8] = (char *)key;
        if (client_ca) {
            argv[9] = "--client-ca";
            argv[10] = (char *)client_ca;
        }
    }
    char buf[32];
    u->pid = proc_helper_start(argv, &u->in, buf, sizeof(buf), 10000);
    cr_assert_gt(u->pid, 0, "cannot start ws_peer.py");
    n_running++;
    u->port = (uint16_t)atoi(buf);
    cr_assert_gt(u->port, 0, "ws_peer.py printed no port (python3-websockets missing?)");
    return u;
}

static struct wsu *start(int refuse, const char *cert, const char *key, const char *client_ca)
{
    return start_at(NULL, 0, refuse, cert, key, client_ca);
}

struct wsu *wsu_start_at(const char *ip, uint16_t port)
{
    return start_at(ip, port, 0, NULL, NULL, NULL);
}

struct wsu *wsu_start(int refuse)
{
    return start(refuse, NULL, NULL, NULL);
}

struct wsu *wsu_start_tls(const char *cert, const char *key)
{
    return start(0, cert, key, NULL);
}

struct wsu *wsu_start_mtls(const char *cert, const char *key, const char *client_ca)
{
    return start(0, cert, key, client_ca);
}

uint16_t wsu_port(const struct wsu *u)
{
    return u->port;
}

const char *wsu_url(const struct wsu *u)
{
    static char url[64];
    snprintf(url, sizeof(url), "%s://%s:%u", u->tls ? "https" : "http", u->ip, u->port);
    return url;
}

json_t *wsu_records(const struct wsu *u)
{
    return fx_read_jsonl(u->record);
}

size_t wsu_count(const struct wsu *u, const char *event, const char *path)
{
    json_t *all = wsu_records(u), *r;
    size_t i, n = 0;
    json_array_foreach(all, i, r)
    {
        const char *e = json_str(r, "event"), *p = json_str(r, "path");
        n += e && strcmp(e, event) == 0 && (!path || (p && strcmp(p, path) == 0));
    }
    json_decref(all);
    return n;
}

json_t *wsu_client(const char *url, const char *scenario)
{
    char *argv[] = { "/usr/bin/python3", "tests/tools/ws_peer.py", "client",
                     (char *)url,        (char *)scenario,         NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 30000, &r), 0, "cannot run ws_peer.py client");
    json_t *res = json_loads(r.out, 0, NULL);
    cr_assert_not_null(res, "ws_peer.py client %s: no result (exit %d): %s %s", scenario, r.status,
                       r.out, r.err);
    proc_result_free(&r);
    return res;
}

void wsu_stop_all(void)
{
    for (size_t i = 0; i < n_running; i++) {
        struct wsu *u = &running[i];
        proc_helper_stop(u->pid, u->in);
        unlink(u->record);
    }
    n_running = 0;
}
