/* soak -- mixed load against the real retryproxy for a bounded time, watching its RSS and fds.
 *
 *   soak --bin build-soak/retryproxy [--seconds 600] [--workers 2] [--concurrency 64]
 *        [--interval 10] [--rate 0] [--reload 10] [--no-rss-check]
 *
 * Starts an upstream of its own (one epoll thread on 127.0.0.1, constant memory per connection:
 * unlike tests/support/tup it keeps no record of what it served, so it can run for hours), the
 * proxy (--workers N, config in a temporary directory, request log to /dev/null), then sends
 * requests from at most --concurrency libcurl transfers at once, all to 127.0.0.1:
 *
 *   10 %  answered 503 by the upstream on the first attempt: retried, 200
 *    1 %  reset by the upstream (RST, nothing sent) on the first attempt: retried, 200
 *    2 %  the upstream answers after 600 ms; the client gives up after 150 ms (closes first)
 *    2 %  503, then a backoff wait of 300 ms or more; the client gives up after 150 ms (closes
 *         during the wait)
 *    5 %  POST of 4 KiB with an Idempotency-Key, 200
 *   80 %  GET, 200 with a body of 0 to 32 KiB (its length checked)
 *
 * Every --reload seconds the config file is rewritten through rename() with other base_ms and
 * cap_ms values; every --interval seconds it prints a sample of the proxy: time, RSS (KiB),
 * open descriptors, requests done, and scrapes /metrics. At the end it waits for the proxy to
 * go idle and checks:
 *
 *   - RSS: the last sample under load is at most 10 % above the first sample taken after the
 *     warm-up (min(60 s, seconds / 5));
 *   - descriptors: at idle after the load (the upstream closes its idle connections, the
 *     clients are gone), within a grace period of 10 s, every descriptor but the proxy's
 *     sockets to this upstream comes back to the count measured at idle before the load; those
 *     sockets are libcurl's cached connections, which it closes only when a transfer on the
 *     same multi handle looks at them, so they are allowed up to the cache's bound
 *     (CURLM_MAX_CONNECTIONS per worker) and up to the connections the upstream still had
 *     open when the load ended (a socket the upstream had closed before is a leak);
 *   - outcomes: at most 0.1 % of requests ended otherwise than described above;
 *   - config reloads took effect (config_generation) and the proxy exits 0 on SIGTERM;
 *   - the proxy did not end during the run (checked every 500 ms; a crash stops the load).
 *
 * Exit status 0 when every check passed, 1 when one failed, 2 on a usage error, 3 when the
 * run could not be set up or was interrupted (SIGINT, SIGTERM). A watchdog kills the proxy and
 * exits 3 if the run overstays its time by two minutes.
 */
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

#include "proxy/upstream/curlm.h"
#include "tests/support/proc.h"

extern char **environ;

/* xorshift64*: the request mix, seeded per run. */
static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dULL) >> 32) % n;
}

/* ---- the upstream ---- */

#define UP_IN_MAX   16384 /* a request head from the proxy is far smaller */
#define UP_BODY_MAX 65536 /* largest answer body */
#define SLOW_MS     600   /* the "slow" answer's delay */

enum kind { K_OK, K_POST, K_503, K_RESET, K_SLOW, K_BACKOFF, K_COUNT };
static const char *const kind_name[K_COUNT] = { "ok", "post", "503", "reset", "slow", "backoff" };

enum ustate { U_READ, U_DELAY, U_WRITE };

struct uconn {
    int fd;
    enum ustate st;
    char in[UP_IN_MAX];
    size_t in_len;
    bool have_head;
    uint64_t body_left;
    /* the request being answered */
    int soak; /* enum kind, or -1: plain */
    int attempt;
    size_t size;
    bool close_after;
    int64_t due_ms;
    char *out;
    size_t out_len, out_off;
    struct uconn *prev, *next;
};

struct upstream {
    int lfd, ep;
    uint16_t port;
    pthread_t th;
    atomic_bool stop;
    atomic_bool drain; /* close every idle connection (after the load) */
    struct uconn *conns;
    /* written by the upstream thread only, read at the end */
    atomic_ulong answered, resets, open;
};

static unsigned char pattern[UP_BODY_MAX];

/* After the load: idle connections are closed, every answer closes its connection. */
static bool up_draining(const struct upstream *u)
{
    return atomic_load(&u->drain);
}

static void up_close(struct upstream *u, struct uconn *c, bool rst)
{
    if (rst) {
        struct linger lg = { 1, 0 };
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    }
    close(c->fd); /* also leaves the epoll set */
    if (c->prev)
        c->prev->next = c->next;
    else
        u->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c->out);
    free(c);
    atomic_fetch_sub(&u->open, 1);
}

static void up_interest(struct upstream *u, struct uconn *c, uint32_t ev)
{
    struct epoll_event e = { .events = ev, .data.ptr = c };
    epoll_ctl(u->ep, EPOLL_CTL_MOD, c->fd, &e);
}

/* Value of header 'name' in the head [h, end), or NULL; *len set. */
static const char *head_value(const char *h, const char *end, const char *name, size_t *len)
{
    size_t nl = strlen(name);
    for (const char *line = h; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol)
            eol = end;
        if ((size_t)(eol - line) > nl && strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (v < eol && (*v == ' ' || *v == '\t'))
                v++;
            const char *ve = eol;
            while (ve > v && (ve[-1] == '\r' || ve[-1] == ' '))
                ve--;
            *len = (size_t)(ve - v);
            return v;
        }
        line = eol + 1;
    }
    return NULL;
}

static long head_num(const char *h, const char *end, const char *name, long def)
{
    size_t len;
    const char *v = head_value(h, end, name, &len);
    if (!v || len == 0 || len > 18)
        return def;
    char buf[24];
    memcpy(buf, v, len);
    buf[len] = '\0';
    return strtol(buf, NULL, 10);
}

/* Parses the head in c->in[0, head_len); false if the connection is to be dropped. */
static bool up_parse_head(struct uconn *c, size_t head_len)
{
    const char *h = c->in, *end = c->in + head_len;
    size_t len;
    if (head_value(h, end, "Transfer-Encoding", &len))
        return false; /* the proxy sends buffered bodies with Content-Length */
    long cl = head_num(h, end, "Content-Length", 0);
    if (cl < 0)
        return false;
    c->body_left = (uint64_t)cl;
    c->soak = -1;
    const char *k = head_value(h, end, "X-Soak", &len);
    for (int i = 0; k && i < K_COUNT; i++)
        if (strlen(kind_name[i]) == len && memcmp(k, kind_name[i], len) == 0)
            c->soak = i;
    c->attempt = (int)head_num(h, end, "X-Retry-Attempt", 1);
    long size = head_num(h, end, "X-Soak-Size", 3);
    c->size = size < 0 ? 0 : size > UP_BODY_MAX ? UP_BODY_MAX : (size_t)size;
    const char *conn = head_value(h, end, "Connection", &len);
    c->close_after = conn && len == 5 && strncasecmp(conn, "close", 5) == 0;
    return true;
}

/* Queues an answer; false if the connection had to be dropped instead. */
static bool up_respond(struct upstream *u, struct uconn *c, int status, size_t body)
{
    if (up_draining(u))
        c->close_after = true;
    char head[256];
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n%s\r\n",
                     status, status == 200 ? "OK" : "Service Unavailable", body,
                     c->close_after ? "Connection: close\r\n" : "");
    c->out = malloc((size_t)n + body);
    if (!c->out) {
        up_close(u, c, false);
        return false;
    }
    memcpy(c->out, head, (size_t)n);
    memcpy(c->out + n, pattern, body);
    c->out_len = (size_t)n + body;
    c->out_off = 0;
    c->st = U_WRITE;
    up_interest(u, c, EPOLLOUT);
    atomic_fetch_add(&u->answered, 1);
    return true;
}

/* A complete request: answer it, delay it or reset the connection. Returns false if 'c' is
 * gone. */
static bool up_act(struct upstream *u, struct uconn *c)
{
    bool first = c->attempt <= 1;
    if (c->soak == K_RESET && first) {
        atomic_fetch_add(&u->resets, 1);
        up_close(u, c, true);
        return false;
    }
    if (c->soak == K_SLOW) {
        c->st = U_DELAY;
        c->due_ms = now_ms() + SLOW_MS;
        up_interest(u, c, 0);
        return true;
    }
    if ((c->soak == K_503 || c->soak == K_BACKOFF) && first)
        return up_respond(u, c, 503, 6);
    return up_respond(u, c, 200, c->size);
}

/* Consumes what c->in holds: heads, bodies. False if 'c' is gone. */
static bool up_consume(struct upstream *u, struct uconn *c)
{
    while (c->st == U_READ && c->in_len > 0) {
        if (!c->have_head) {
            char *e = memmem(c->in, c->in_len, "\r\n\r\n", 4);
            if (!e) {
                if (c->in_len == sizeof(c->in)) {
                    up_close(u, c, false);
                    return false;
                }
                return true;
            }
            size_t hl = (size_t)(e + 4 - c->in);
            if (!up_parse_head(c, hl)) {
                up_close(u, c, false);
                return false;
            }
            memmove(c->in, c->in + hl, c->in_len - hl);
            c->in_len -= hl;
            c->have_head = true;
        }
        size_t take = c->body_left < c->in_len ? (size_t)c->body_left : c->in_len;
        memmove(c->in, c->in + take, c->in_len - take);
        c->in_len -= take;
        c->body_left -= take;
        if (c->body_left > 0)
            return true;
        c->have_head = false;
        if (!up_act(u, c))
            return false;
    }
    return true;
}

static void up_write(struct upstream *u, struct uconn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) {
            up_close(u, c, false);
            return;
        }
        c->out_off += (size_t)n;
    }
    free(c->out);
    c->out = NULL;
    if (c->close_after) {
        up_close(u, c, false);
        return;
    }
    c->st = U_READ;
    up_interest(u, c, EPOLLIN);
    up_consume(u, c); /* a request that came in behind the answer */
}

static void up_read(struct upstream *u, struct uconn *c)
{
    for (;;) {
        if (c->in_len == sizeof(c->in)) {
            up_close(u, c, false);
            return;
        }
        ssize_t n = recv(c->fd, c->in + c->in_len, sizeof(c->in) - c->in_len, 0);
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) {
            up_close(u, c, false);
            return;
        }
        c->in_len += (size_t)n;
        if (!up_consume(u, c) || c->st != U_READ)
            return;
    }
}

static void up_accept(struct upstream *u)
{
    for (;;) {
        int fd = accept4(u->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        struct uconn *c = calloc(1, sizeof(*c));
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->st = U_READ;
        struct epoll_event e = { .events = EPOLLIN, .data.ptr = c };
        if (epoll_ctl(u->ep, EPOLL_CTL_ADD, fd, &e) < 0) {
            close(fd);
            free(c);
            continue;
        }
        c->next = u->conns;
        if (u->conns)
            u->conns->prev = c;
        u->conns = c;
        atomic_fetch_add(&u->open, 1);
    }
}

static void *up_main(void *arg)
{
    struct upstream *u = arg;
    struct epoll_event evs[64];
    while (!atomic_load(&u->stop)) {
        int n = epoll_wait(u->ep, evs, 64, 20);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == NULL) {
                up_accept(u);
                continue;
            }
            struct uconn *c = evs[i].data.ptr;
            if (c->st == U_DELAY) {
                if (evs[i].events & (EPOLLERR | EPOLLHUP))
                    up_close(u, c, false);
            } else if (c->st == U_WRITE) {
                up_write(u, c);
            } else {
                up_read(u, c);
            }
        }
        /* Delayed answers that are due; idle connections once draining. Both are rare enough
         * for a walk over every connection (a few hundred at most). */
        int64_t now = now_ms();
        bool drain = atomic_load(&u->drain);
        for (struct uconn *c = u->conns, *next; c; c = next) {
            next = c->next;
            if (c->st == U_DELAY && now >= c->due_ms)
                up_respond(u, c, 200, c->size);
            else if (drain && c->st == U_READ && c->in_len == 0 && !c->have_head)
                up_close(u, c, false);
        }
    }
    while (u->conns)
        up_close(u, u->conns, false);
    return NULL;
}

static int up_start(struct upstream *u)
{
    for (size_t i = 0; i < sizeof(pattern); i++)
        pattern[i] = (i % 64 == 63) ? '\n' : (unsigned char)('a' + i % 26);
    u->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof(a);
    if (u->lfd < 0 || bind(u->lfd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
        listen(u->lfd, 1024) < 0 || getsockname(u->lfd, (struct sockaddr *)&a, &al) < 0)
        return -1;
    u->port = ntohs(a.sin_port);
    u->ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event e = { .events = EPOLLIN, .data.ptr = NULL };
    if (u->ep < 0 || epoll_ctl(u->ep, EPOLL_CTL_ADD, u->lfd, &e) < 0)
        return -1;
    return pthread_create(&u->th, NULL, up_main, u) == 0 ? 0 : -1;
}

static void up_stop(struct upstream *u)
{
    atomic_store(&u->stop, true);
    pthread_join(u->th, NULL);
    close(u->ep);
    close(u->lfd);
}

/* ---- the proxy ---- */

static char dir[64], cfg_path[128], err_path[128];
static pid_t proxy_pid = -1;
static uint16_t proxy_port, admin_port;

/* SIGINT or SIGTERM: stop the load, stop the proxy, clean up, exit 3 without judging. */
static volatile sig_atomic_t interrupted;
static void on_interrupt(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void watchdog(int sig)
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
static int write_config(uint16_t up_port, unsigned g)
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

static int start_proxy(const char *bin, const char *workers)
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
static int died = -1;

/* False, and 'died' set, once the proxy has ended on its own. */
static bool proxy_alive(void)
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
static int stop_proxy(int timeout_ms)
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
static char *admin_get(const char *path)
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
static void nudge(void)
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
static double metric(const char *text, const char *name)
{
    size_t nl = strlen(name);
    for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
        if (strncmp(l, name, nl) == 0 && (l[nl] == ' ' || l[nl] == '{')) {
            const char *v = strchr(l, ' ');
            return v ? strtod(v + 1, NULL) : -1;
        }
    return -1;
}

/* ---- the clients ---- */

#define POST_BYTES 4096

struct slot {
    CURL *e;
    struct curl_slist *h;
    enum kind kind;
    size_t want, got;
    bool busy;
};

static char post_body[POST_BYTES];
static uint64_t done_n, unexpected_n, by_kind[K_COUNT];

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    (void)p;
    struct slot *s = ud;
    s->got += size * n;
    return size * n;
}

static void slot_start(CURLM *m, struct slot *s, uint64_t seq)
{
    uint32_t r = rnd(10000);
    enum kind k = r < 1000   ? K_503
                  : r < 1100 ? K_RESET
                  : r < 1300 ? K_SLOW
                  : r < 1500 ? K_BACKOFF
                  : r < 2000 ? K_POST
                             : K_OK;
    s->kind = k;
    s->want = k == K_OK || k == K_POST ? rnd(32769) : 3;
    s->got = 0;
    char url[128], hk[64], hs[64], hi[96];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/%s/%llu?k=%s", proxy_port,
             k == K_BACKOFF ? "slow" : "fast", (unsigned long long)seq, kind_name[k]);
    snprintf(hk, sizeof(hk), "X-Soak: %s", kind_name[k]);
    snprintf(hs, sizeof(hs), "X-Soak-Size: %zu", s->want);
    snprintf(hi, sizeof(hi), "Idempotency-Key: soak-%llu", (unsigned long long)seq);
    curl_slist_free_all(s->h);
    s->h = curl_slist_append(NULL, hk);
    s->h = curl_slist_append(s->h, hs);
    s->h = curl_slist_append(s->h, "Expect:");
    if (k == K_POST)
        s->h = curl_slist_append(s->h, hi);
    curl_easy_reset(s->e);
    curl_easy_setopt(s->e, CURLOPT_URL, url);
    curl_easy_setopt(s->e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s->e, CURLOPT_HTTPHEADER, s->h);
    curl_easy_setopt(s->e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(s->e, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(s->e, CURLOPT_PRIVATE, s);
    /* The two disconnect kinds give up long before their answer can come. */
    curl_easy_setopt(s->e, CURLOPT_TIMEOUT_MS, k == K_SLOW || k == K_BACKOFF ? 150L : 15000L);
    if (k == K_POST) {
        curl_easy_setopt(s->e, CURLOPT_POSTFIELDSIZE, (long)POST_BYTES);
        curl_easy_setopt(s->e, CURLOPT_POSTFIELDS, post_body);
    }
    s->busy = true;
    curl_multi_add_handle(m, s->e);
}

static void slot_done(CURLM *m, struct slot *s, CURLcode rc)
{
    long status = 0;
    curl_easy_getinfo(s->e, CURLINFO_RESPONSE_CODE, &status);
    curl_multi_remove_handle(m, s->e);
    s->busy = false;
    done_n++;
    by_kind[s->kind]++;
    double took = 0;
    curl_easy_getinfo(s->e, CURLINFO_TOTAL_TIME, &took);
    bool ok;
    if (s->kind == K_SLOW || s->kind == K_BACKOFF)
        /* Given up after 150 ms; or the answer came in while this loop was busy elsewhere (a
         * slow /metrics scrape) and libcurl read it before looking at the clock. */
        ok = rc == CURLE_OPERATION_TIMEDOUT || (rc == CURLE_OK && status == 200 && took >= 0.3);
    else
        ok = rc == CURLE_OK && status == 200 && s->got == s->want;
    if (!ok && ++unexpected_n <= 10)
        fprintf(stderr,
                "soak: unexpected outcome for a '%s' request: curl %d (%s), status %ld, "
                "%zu of %zu body bytes, %.3f s\n",
                kind_name[s->kind], rc, curl_easy_strerror(rc), status, s->got, s->want, took);
}

/* ---- the run ---- */

struct sample {
    int t; /* seconds since the load started */
    long rss_kb;
    int fds;
    uint64_t done;
};

static void usage(FILE *f)
{
    fputs("usage: soak --bin PATH [--seconds N] [--workers N] [--concurrency N] [--interval S]\n"
          "            [--rate N] [--reload S] [--no-rss-check]\n"
          "Mixed load against retryproxy (PATH) and a built-in upstream, all on 127.0.0.1;\n"
          "fails if the proxy's RSS grows more than 10 % after the warm-up or its descriptors\n"
          "do not come back to their idle count. See the top of tests/tools/soak.c.\n",
          f);
}

int main(int argc, char **argv)
{
    const char *bin = NULL, *workers = "2";
    long seconds = 600, conc = 64, interval = 10, rate = 0, reload_s = 10;
    bool rss_check = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long *num = NULL;
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--no-rss-check") == 0) {
            rss_check = false;
            continue;
        } else if (i + 1 >= argc) {
            usage(stderr);
            return 2;
        } else if (strcmp(a, "--bin") == 0) {
            bin = argv[++i];
            continue;
        } else if (strcmp(a, "--workers") == 0) {
            workers = argv[++i];
            continue;
        } else if (strcmp(a, "--seconds") == 0) {
            num = &seconds;
        } else if (strcmp(a, "--concurrency") == 0) {
            num = &conc;
        } else if (strcmp(a, "--interval") == 0) {
            num = &interval;
        } else if (strcmp(a, "--rate") == 0) {
            num = &rate;
        } else if (strcmp(a, "--reload") == 0) {
            num = &reload_s;
        } else {
            fprintf(stderr, "soak: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
        char *end;
        *num = strtol(argv[++i], &end, 10);
        if (*end || *num < 0) {
            fprintf(stderr, "soak: bad value for %s: '%s'\n", a, argv[i]);
            return 2;
        }
    }
    if (!bin || seconds < 10 || conc < 1 || conc > 1024 || interval < 1 || reload_s < 1) {
        fprintf(stderr, "soak: need --bin, --seconds >= 10, --concurrency 1..1024, "
                        "--interval >= 1, --reload >= 1\n");
        usage(stderr);
        return 2;
    }

    signal(SIGPIPE, SIG_IGN);
    signal(SIGALRM, watchdog);
    signal(SIGINT, on_interrupt);
    signal(SIGTERM, on_interrupt);
    alarm((unsigned)seconds + 120);
    rng_state ^= (uint64_t)now_ms() * 0x9e3779b97f4a7c15u;
    memset(post_body, 'p', sizeof(post_body));
    curl_global_init(CURL_GLOBAL_DEFAULT);

    snprintf(dir, sizeof(dir), "/tmp/retryproxy-soak-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("soak: mkdtemp");
        return 3;
    }
    snprintf(cfg_path, sizeof(cfg_path), "%s/config.json", dir);
    snprintf(err_path, sizeof(err_path), "%s/stderr", dir);

    struct upstream up = { .lfd = -1, .ep = -1 };
    unsigned gen = 0;
    if (up_start(&up) < 0 || write_config(up.port, gen) < 0) {
        fprintf(stderr, "soak: cannot set up the upstream or the config: %s\n", strerror(errno));
        return 3;
    }
    if (start_proxy(bin, workers) < 0) {
        up_stop(&up);
        return 3;
    }

    /* Idle before the load: the descriptor baseline (no upstream connection yet). */
    sleep_ms(1000);
    int up_idle = 0;
    int fds_idle = proc_fds_to_port(proxy_pid, up.port, &up_idle);
    int others_idle = fds_idle - up_idle;
    long rss_idle = proc_status_kb(proxy_pid, "VmRSS");
    printf("soak: %s, %s workers, %ld s, %ld connections at most%s; upstream 127.0.0.1:%u, "
           "proxy 127.0.0.1:%u\n",
           bin, workers, seconds, conc, rate ? "" : ", no rate limit", up.port, proxy_port);
    printf("soak: idle before the load: RSS %ld KiB, %d fds\n", rss_idle, fds_idle);
    printf("soak: %6s %10s %6s %10s\n", "time", "RSS KiB", "fds", "requests");
    fflush(stdout);

    CURLM *m = curl_multi_init();
    curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, conc);
    struct slot *slots = calloc((size_t)conc, sizeof(*slots));
    for (long i = 0; i < conc; i++)
        slots[i].e = curl_easy_init();

    size_t n_samples = (size_t)(seconds / interval) + 2, ns = 0;
    struct sample *samples = calloc(n_samples, sizeof(*samples));
    uint64_t seq = 0, reloads = 0;
    int64_t t0 = now_ms(), t_end = t0 + seconds * 1000;
    int64_t next_sample = t0 + interval * 1000, next_reload = t0 + reload_s * 1000;
    int64_t next_check = t0 + 500;
    double generation = -1;
    for (;;) {
        int64_t now = now_ms();
        bool loading = now < t_end && !interrupted;
        int busy = 0;
        for (long i = 0; i < conc; i++) {
            if (!slots[i].busy && loading && (rate == 0 || (int64_t)seq < rate * (now - t0) / 1000))
                slot_start(m, &slots[i], seq++);
            busy += slots[i].busy;
        }
        if (!loading && busy == 0)
            break;
        int running;
        curl_multi_perform(m, &running);
        void *s;
        CURLcode rc;
        while (proc_multi_next_done(m, &s, &rc))
            slot_done(m, s, rc);
        if (loading && now >= next_reload) {
            next_reload += reload_s * 1000;
            if (write_config(up.port, ++gen) == 0)
                reloads++;
            else
                fprintf(stderr, "soak: cannot rewrite the config: %s\n", strerror(errno));
        }
        if (loading && now >= next_check) {
            next_check = now + 500;
            if (!proxy_alive())
                t_end = now; /* what is in flight fails fast; nothing more to measure */
        }
        if (now >= next_sample && ns < n_samples && proxy_pid > 0) {
            next_sample += interval * 1000;
            struct sample *sm = &samples[ns++];
            sm->t = (int)((now - t0 + 500) / 1000);
            sm->rss_kb = proc_status_kb(proxy_pid, "VmRSS");
            sm->fds = proc_entries(proxy_pid, "fd");
            sm->done = done_n;
            char *text = admin_get("/metrics");
            if (text)
                generation = metric(text, "retryproxy_config_generation");
            else
                fprintf(stderr, "soak: GET /metrics failed\n");
            free(text);
            printf("soak: %5ds %10ld %6d %10llu\n", sm->t, sm->rss_kb, sm->fds,
                   (unsigned long long)sm->done);
            fflush(stdout);
        }
        curl_multi_poll(m, NULL, 0, 10, NULL);
    }
    double load_s = (double)(now_ms() - t0) / 1000.0;
    for (long i = 0; i < conc; i++) {
        curl_easy_cleanup(slots[i].e);
        curl_slist_free_all(slots[i].h);
    }
    curl_multi_cleanup(m); /* closes the client connections */
    free(slots);
    if (interrupted) {
        stop_proxy(5000);
        up_stop(&up);
        rm_tree(dir);
        printf("soak: interrupted after %llu requests\n", (unsigned long long)done_n);
        return 3;
    }

    /* Idle after the load: the upstream closes its idle connections, then every descriptor
     * of the proxy but its sockets to the upstream must come back to the baseline within the
     * grace period. Those sockets are libcurl's connection caches: it notices that an upstream
     * closed an idle kept-alive connection only when a transfer on the same multi handle
     * starts (it then prunes every dead one, at most once a second), and a worker uses its
     * later multi handles only under load (proxy/upstream/curlm.c), so some stay until the next
     * load. They may not outnumber the cache's bound, nor the connections the upstream still
     * had open when the load ended: the proxy holds no socket the upstream closed before
     * (a reset). While waiting, one request goes through every 250 ms, on a connection of its
     * own and answered with Connection: close: it prunes what it can and leaves nothing
     * behind, and a leaked descriptor stays counted. */
    long up_bound = atol(workers) * CURLM_MAX_CONNECTIONS;
    if ((long)atomic_load(&up.open) < up_bound)
        up_bound = (long)atomic_load(&up.open);
    atomic_store(&up.drain, true);
    sleep_ms(250);
    int fds_after = -1, up_after = -1, others_after = -1, nudges = 0;
    int64_t t_idle = now_ms();
    while (now_ms() - t_idle < 10000 && proxy_alive()) {
        fds_after = proc_fds_to_port(proxy_pid, up.port, &up_after);
        others_after = fds_after - up_after;
        if (fds_after >= 0 && others_after <= others_idle && up_after <= up_bound)
            break;
        nudge();
        nudges++;
        sleep_ms(250);
    }
    long rss_after = proc_status_kb(proxy_pid, "VmRSS");
    char *text = admin_get("/metrics");
    if (text)
        generation = metric(text, "retryproxy_config_generation");
    free(text);

    printf("soak: %llu requests in %.1f s (%.0f/s): ", (unsigned long long)done_n, load_s,
           (double)done_n / load_s);
    for (int k = 0; k < K_COUNT; k++)
        printf("%s%s %llu", k ? ", " : "", kind_name[k], (unsigned long long)by_kind[k]);
    printf("; %llu unexpected; upstream: %lu answers, %lu resets\n",
           (unsigned long long)unexpected_n, atomic_load(&up.answered), atomic_load(&up.resets));
    printf("soak: idle after the load: RSS %ld KiB, %d fds: %d upstream connections (%ld at "
           "most), %d others (%d before; %.1f s, %d single requests to settle)\n",
           rss_after, fds_after, up_after, up_bound, others_after, others_idle,
           (double)(now_ms() - t_idle) / 1000.0, nudges);
    printf("soak: %llu config rewrites, config_generation %.0f\n", (unsigned long long)reloads,
           generation);

    int failed = 0;
    long warm = seconds / 5 < 60 ? seconds / 5 : 60;
    struct sample *ref = NULL, *last = ns ? &samples[ns - 1] : NULL;
    for (size_t i = 0; i < ns && !ref; i++)
        if (samples[i].t >= warm)
            ref = &samples[i];
    if (!ref || ref == last) {
        printf("soak: %s: too few samples after the %ld s warm-up to compare RSS\n",
               rss_check ? "FAILED" : "ignored (--no-rss-check)", warm);
        failed |= rss_check;
    } else {
        double growth = 100.0 * (double)(last->rss_kb - ref->rss_kb) / (double)ref->rss_kb;
        printf("soak: RSS %ld KiB at %d s (after the %ld s warm-up) -> %ld KiB at %d s: %+.1f %%\n",
               ref->rss_kb, ref->t, warm, last->rss_kb, last->t, growth);
        if (growth > 10.0) {
            printf("soak: %s: RSS grew more than 10 %% after the warm-up\n",
                   rss_check ? "FAILED" : "ignored (--no-rss-check)");
            failed |= rss_check;
        }
    }
    if (died < 0 && (fds_after < 0 || others_after > others_idle)) {
        printf("soak: FAILED: %d descriptors besides upstream connections open at idle after "
               "the load, %d before it\n",
               others_after, others_idle);
        failed = 1;
    }
    if (died < 0 && up_after > up_bound) {
        printf("soak: FAILED: %d upstream connections open at idle after the load, more than "
               "the %ld the upstream had open or the connection caches keep\n",
               up_after, up_bound);
        failed = 1;
    }
    if (done_n == 0 || (double)unexpected_n > (double)done_n * 0.001) {
        printf("soak: FAILED: %llu of %llu requests ended unexpectedly (more than 0.1 %%)\n",
               (unsigned long long)unexpected_n, (unsigned long long)done_n);
        failed = 1;
    }
    if (reloads > 0 && generation < (double)reloads / 2) {
        printf("soak: FAILED: %llu config rewrites but config_generation is %.0f\n",
               (unsigned long long)reloads, generation);
        failed = 1;
    }
    if (died >= 0) {
        printf("soak: FAILED: the proxy ended during the run, status %d\n", died);
        failed = 1;
    }
    int st = stop_proxy(15000);
    if (died < 0 && st != 0) {
        printf("soak: FAILED: the proxy exited with status %d on SIGTERM\n", st);
        failed = 1;
    }
    up_stop(&up);
    if (failed) {
        char *err = proc_read_file(err_path);
        size_t len = strlen(err);
        printf("soak: the proxy's stderr (last 4 KiB):\n%s", len > 4096 ? err + len - 4096 : err);
        free(err);
    }
    rm_tree(dir);
    free(samples);
    curl_global_cleanup();
    printf("soak: %s\n", failed ? "FAILED" : "passed");
    return failed;
}
