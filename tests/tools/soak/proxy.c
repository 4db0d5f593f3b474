/* The soak load's proxy and its admin API (proxy.h). */
#include "tests/tools/soak/proxy.h"

#include <curl/curl.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/proc.h"

/* ---- the proxy ---- */
char dir[64], cfg_path[128], err_path[128];

pid_t proxy_pid = -1;

uint16_t proxy_port, admin_port;

/* SIGINT or SIGTERM: stop the load, stop the proxy, clean up, exit 3 without judging. */
volatile sig_atomic_t interrupted;

void on_interrupt(int sig)
{
    (void)sig;
    interrupted = 1;
}

void watchdog(int sig)
{
    (void)sig;
    static const char msg[] = "soak: FAILED: overstayed its time, killing the proxy\n";
    if (proxy_pid > 0)
        kill(proxy_pid, SIGKILL);
    if (write(2, msg, sizeof(msg) - 1) < 0) {
        /* nothing more to do */
    }
    _exit(3);
}

/* The config, generation 'g' of the run: base_ms and cap_ms change with every reload. */
int write_config(uint16_t up_port, unsigned g)
{
    unsigned fast_base = 5 + (g % 4) * 5, fast_cap = 100 + (g % 3) * 50;
    unsigned slow_base = 300 + (g % 3) * 50, slow_cap = 1000 + (g % 2) * 500;
    char tmp[160];
    snprintf(tmp, sizeof(tmp), "%s/.config.json.tmp", dir);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    /* Budgets wide open: the 11 % of retries must not be denied, or the outcome check would
     * see 503s that only say the budget worked. Caps are set all the same, and the slow route
     * shares one backoff sequence (scope "route"), so that the workers contend on that state. */
    fprintf(
        f,
        "{\n"
        "  \"log\": {\"level\": \"info\"},\n"
        "  \"budget\": {\"max_concurrent_retries\": 1000000, \"retry_ratio\": 10,\n"
        "             \"min_retries_per_second\": 100000},\n"
        "  \"defaults\": {\n"
        "    \"timeout_ms\": 10000,\n"
        "    \"budget\": {\"max_concurrent_retries\": 1000000, \"retry_ratio\": 10,\n"
        "               \"min_retries_per_second\": 100000},\n"
        "    \"retry\": {\"max_attempts\": 3,\n"
        "              \"retry_on\": [\"connect-failure\", \"reset\", \"timeout\", \"503\"]}\n"
        "  },\n"
        "  \"routes\": [\n"
        "    {\"name\": \"slow\", \"match\": {\"path_prefix\": \"/slow\"},\n"
        "     \"upstreams\": [\"http://127.0.0.1:%u\"],\n"
        "     \"retry\": {\"backoff\": {\"policy\": \"fixed\", \"base_ms\": %u, \"cap_ms\": %u,\n"
        "                            \"jitter\": \"none\", \"scope\": \"route\"}}},\n"
        "    {\"name\": \"fast\", \"upstreams\": [\"http://127.0.0.1:%u\"],\n"
        "     \"retry\": {\"backoff\": {\"policy\": \"exponential\", \"base_ms\": %u,\n"
        "                            \"cap_ms\": %u, \"jitter\": \"full\"}}}\n"
        "  ]\n"
        "}\n",
        up_port, slow_base, slow_cap, up_port, fast_base, fast_cap);
    if (fclose(f) != 0)
        return -1;
    return rename(tmp, cfg_path);
}

int start_proxy(const char *bin, const char *workers)
{
    char *argv[] = { (char *)bin, "-c",          cfg_path,    "--listen",      "127.0.0.1:0",
                     "--admin",   "127.0.0.1:0", "--workers", (char *)workers, NULL };
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = posix_spawn(&proxy_pid, bin, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e) {
        fprintf(stderr, "soak: cannot start %s: %s\n", bin, strerror(e));
        return -1;
    }
    for (int64_t deadline = now_ms() + 20000; now_ms() < deadline; sleep_ms(20)) {
        char *err = proc_read_file(err_path);
        const char *at = strstr(err, "listening on 127.0.0.1:");
        const char *adm = strstr(err, "admin on 127.0.0.1:");
        if (at && adm) {
            proxy_port = (uint16_t)atoi(at + strlen("listening on 127.0.0.1:"));
            admin_port = (uint16_t)atoi(adm + strlen("admin on 127.0.0.1:"));
            free(err);
            return 0;
        }
        int st;
        if (waitpid(proxy_pid, &st, WNOHANG) == proxy_pid) {
            fprintf(stderr, "soak: the proxy exited at start-up:\n%s", err);
            proxy_pid = -1;
            free(err);
            return -1;
        }
        free(err);
    }
    fprintf(stderr, "soak: the proxy did not report listening within 20 s\n");
    return -1;
}

static int exit_status(int st)
{
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Set when the proxy ended on its own during the run (a crash): its exit status. */
int died = -1;

/* False, and 'died' set, once the proxy has ended on its own. */
bool proxy_alive(void)
{
    int st;
    if (proxy_pid > 0 && waitpid(proxy_pid, &st, WNOHANG) == proxy_pid) {
        died = exit_status(st);
        proxy_pid = -1;
        printf("soak: the proxy ended during the run, status %d%s\n", died,
               died > 128 ? " (killed by a signal)" : "");
        fflush(stdout);
    }
    return proxy_pid > 0;
}

/* Exit status after SIGTERM (128 + signal if killed by one; -1 if it had to be killed). */
int stop_proxy(int timeout_ms)
{
    int st;
    if (!proxy_alive())
        return died;
    kill(proxy_pid, SIGTERM);
    for (int64_t deadline = now_ms() + timeout_ms; now_ms() < deadline; sleep_ms(10))
        if (waitpid(proxy_pid, &st, WNOHANG) == proxy_pid) {
            proxy_pid = -1;
            return exit_status(st);
        }
    kill(proxy_pid, SIGKILL);
    waitpid(proxy_pid, &st, 0);
    proxy_pid = -1;
    return -1;
}

/* ---- the admin API ---- */
static size_t to_memstream(char *p, size_t size, size_t n, void *ud)
{
    return fwrite(p, size, n, ud);
}

/* GET admin 'path' on a connection of its own; the body (malloc'd) or NULL. */
char *admin_get(const char *path)
{
    char url[128], *buf = NULL;
    size_t len = 0;
    snprintf(url, sizeof(url), "http://127.0.0.1:%u%s", admin_port, path);
    FILE *m = open_memstream(&buf, &len);
    CURL *e = curl_easy_init();
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, to_memstream);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, m);
    long status = 0;
    CURLcode rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    fclose(m);
    if (rc != CURLE_OK || status != 200) {
        free(buf);
        return NULL;
    }
    return buf;
}

static size_t discard(char *p, size_t size, size_t n, void *ud)
{
    (void)p;
    (void)ud;
    return size * n;
}

/* One GET through the proxy on a connection of its own (see the idle check in main). */
void nudge(void)
{
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/fast/idle", proxy_port);
    CURL *e = curl_easy_init();
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 2000L);
    curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_perform(e);
    curl_easy_cleanup(e);
}

/* A metric's value (first series with that name) in a /metrics text, or -1. */
double metric(const char *text, const char *name)
{
    size_t nl = strlen(name);
    for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
        if (strncmp(l, name, nl) == 0 && (l[nl] == ' ' || l[nl] == '{')) {
            const char *v = strchr(l, ' ');
            return v ? strtod(v + 1, NULL) : -1;
        }
    return -1;
}
