#include "tests/support/dnsmasq.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <grp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ares.h>

#include "tests/support/proc.h"

#define MAX_RUNNING 8

/* Every dnsmasq started and not stopped: killed at exit. */
static struct dnsm *running[MAX_RUNNING];

static void kill_all(void)
{
    for (size_t i = 0; i < MAX_RUNNING; i++)
        if (running[i] && running[i]->pid > 0) {
            kill(running[i]->pid, SIGKILL);
            waitpid(running[i]->pid, NULL, 0);
            running[i]->pid = 0;
        }
}

static void track(struct dnsm *d, bool on)
{
    static bool registered;
    if (!registered) {
        atexit(kill_all);
        registered = true;
    }
    for (size_t i = 0; on && i < MAX_RUNNING; i++)
        if (running[i] == d)
            return; /* tracked already: a start that tried another port */
    for (size_t i = 0; i < MAX_RUNNING; i++)
        if (on ? !running[i] : running[i] == d) {
            running[i] = on ? d : NULL;
            return;
        }
}

/* A UDP port free on 127.0.0.1 now (it may be taken again before dnsmasq binds it). */
static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    uint16_t port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static int write_hosts(const struct dnsm *d)
{
    char tmp[128];
    snprintf(tmp, sizeof(tmp), "%s.tmp", d->hosts);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    for (size_t i = 0; i < d->nnames; i++)
        for (size_t k = 0; k < d->names[i].n; k++)
            fprintf(f, "%s %s\n", d->names[i].addrs[k], d->names[i].name);
    if (fclose(f) != 0)
        return -1;
    return rename(tmp, d->hosts);
}

static pid_t spawn(struct dnsm *d)
{
    char port[32], hosts[128], user[80], group[80], log[128];
    struct passwd *pw = getpwuid(getuid());
    struct group *gr = getgrgid(getgid());
    snprintf(port, sizeof(port), "--port=%u", d->port);
    snprintf(hosts, sizeof(hosts), "--addn-hosts=%s", d->hosts);
    /* As root it would switch to nobody, who cannot read the private directory. */
    snprintf(user, sizeof(user), "--user=%s", pw ? pw->pw_name : "root");
    snprintf(group, sizeof(group), "--group=%s", gr ? gr->gr_name : "root");
    snprintf(log, sizeof(log), "%s/log", d->dir);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        char *argv[] = { "dnsmasq",
                         "--keep-in-foreground",
                         "--no-resolv",
                         "--no-hosts",
                         hosts,
                         "--local-ttl=1",
                         "--local=/test/",
                         "--listen-address=127.0.0.1",
                         "--bind-interfaces",
                         port,
                         "--conf-file=/dev/null",
                         "--pid-file",
                         user,
                         group,
                         "--log-facility=-",
                         NULL };
        execvp("/usr/sbin/dnsmasq", argv);
        _exit(127);
    }
    return pid;
}

struct dnsm *dnsm_start(void)
{
    if (access("/usr/sbin/dnsmasq", X_OK) != 0) {
        fputs("dnsmasq: /usr/sbin/dnsmasq missing (apt-get install dnsmasq-base)\n", stderr);
        return NULL;
    }
    struct dnsm *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    snprintf(d->dir, sizeof(d->dir), "/tmp/retryproxy-dns-XXXXXX");
    if (!mkdtemp(d->dir)) {
        free(d);
        return NULL;
    }
    snprintf(d->hosts, sizeof(d->hosts), "%s/hosts", d->dir);
    if (write_hosts(d) < 0) {
        dnsm_stop(d);
        return NULL;
    }
    for (int tries = 0; tries < 5; tries++) {
        d->port = free_port();
        snprintf(d->server, sizeof(d->server), "127.0.0.1:%u", d->port);
        d->pid = spawn(d);
        if (d->pid < 0)
            break;
        track(d, true);
        /* Up when it answers (NXDOMAIN for a name it does not hold). */
        char out[64];
        for (int64_t until = now_ms() + 5000; now_ms() < until;) {
            int st = dnsm_query(d->server, "up.test", out, sizeof(out));
            if (st == ARES_ENOTFOUND || st == ARES_SUCCESS || st == ARES_ENODATA)
                return d;
            if (waitpid(d->pid, NULL, WNOHANG) == d->pid) { /* the port was taken */
                d->pid = 0;
                break;
            }
            sleep_ms(20);
        }
        if (d->pid > 0) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, NULL, 0);
            d->pid = 0;
        }
    }
    char log[128];
    snprintf(log, sizeof(log), "%s/log", d->dir);
    char *text = proc_read_file(log);
    fprintf(stderr, "dnsmasq did not start:\n%s\n", text);
    free(text);
    dnsm_stop(d);
    return NULL;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted text of 'k' addresses p[0..k), distinct, joined by ',' into out[cap]. */
static void joined(char **p, size_t k, char *out, size_t cap)
{
    qsort(p, k, sizeof(p[0]), cmp_str);
    size_t len = 0;
    out[0] = '\0';
    for (size_t i = 0; i < k && len < cap; i++)
        if (i == 0 || strcmp(p[i], p[i - 1]) != 0)
            len += (size_t)snprintf(out + len, cap - len, "%s%s", len ? "," : "", p[i]);
}

/* addrs as dnsm_query() gives them: each made canonical, sorted, joined by ','. */
static void canonical(const char *const *addrs, size_t n, char *out, size_t cap)
{
    char(*text)[48] = calloc(n ? n : 1, sizeof(*text));
    char **p = calloc(n ? n : 1, sizeof(*p));
    size_t k = 0;
    for (size_t i = 0; text && p && i < n; i++) {
        unsigned char b[16];
        int fam = strchr(addrs[i], ':') ? AF_INET6 : AF_INET;
        if (inet_pton(fam, addrs[i], b) == 1 && inet_ntop(fam, b, text[k], sizeof(text[k])))
            p[k] = text[k], k++;
    }
    joined(p, k, out, cap);
    free(p);
    free(text);
}

int dnsm_set(struct dnsm *d, const char *name, const char *const *addrs, size_t n)
{
    size_t i = 0;
    while (i < d->nnames && strcmp(d->names[i].name, name) != 0)
        i++;
    if (i == d->nnames) {
        if (i == sizeof(d->names) / sizeof(d->names[0]))
            return -1;
        snprintf(d->names[i].name, sizeof(d->names[i].name), "%s", name);
        d->nnames++;
    }
    free(d->names[i].addrs);
    d->names[i].addrs = calloc(n ? n : 1, sizeof(*d->names[i].addrs));
    d->names[i].n = 0;
    for (size_t k = 0; d->names[i].addrs && k < n; k++)
        snprintf(d->names[i].addrs[d->names[i].n++], 48, "%s", addrs[k]);
    if (write_hosts(d) < 0 || d->pid <= 0 || kill(d->pid, SIGHUP) < 0)
        return -1;
    size_t cap = 64 + n * 48;
    char *want = malloc(cap), *got = malloc(cap);
    int rc = -1;
    if (want && got) {
        canonical(addrs, n, want, cap);
        /* a loaded machine may take seconds; the hosts file is read again at each SIGHUP, and
         * one that came while the last read was under way may be folded into it: ask again
         * every second until the answer is the new one */
        int64_t start = now_ms(), hup = start;
        for (int64_t until = start + 20000; rc < 0 && now_ms() < until; sleep_ms(20)) {
            int st = dnsm_query(d->server, name, got, cap);
            if ((st == ARES_SUCCESS || st == ARES_ENOTFOUND || st == ARES_ENODATA) &&
                strcmp(got, want) == 0)
                rc = 0;
            else if (now_ms() - hup >= 1000 && kill(d->pid, SIGHUP) == 0)
                hup = now_ms();
        }
    }
    free(want);
    free(got);
    return rc;
}

void dnsm_kill(struct dnsm *d)
{
    if (d && d->pid > 0) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
        d->pid = 0;
    }
}

void dnsm_freeze(struct dnsm *d)
{
    if (d && d->pid > 0)
        kill(d->pid, SIGSTOP);
}

void dnsm_thaw(struct dnsm *d)
{
    if (d && d->pid > 0)
        kill(d->pid, SIGCONT);
}

void dnsm_stop(struct dnsm *d)
{
    if (!d)
        return;
    if (d->pid > 0)
        kill(d->pid, SIGCONT); /* a frozen one still dies of SIGKILL, but reap it promptly */
    dnsm_kill(d);
    track(d, false);
    rm_tree(d->dir);
    for (size_t i = 0; i < d->nnames; i++)
        free(d->names[i].addrs);
    free(d);
}

/* ---- a client of its own, through c-ares ---- */

struct answer {
    bool done;
    int status;
    char *out;
    size_t cap;
};

static void on_answer(void *arg, int status, int timeouts, struct ares_addrinfo *res)
{
    (void)timeouts;
    struct answer *a = arg;
    a->done = true;
    a->status = status;
    size_t max = 0;
    for (struct ares_addrinfo_node *n = res ? res->nodes : NULL; n; n = n->ai_next)
        max++;
    char(*text)[48] = calloc(max ? max : 1, sizeof(*text));
    char **p = calloc(max ? max : 1, sizeof(*p));
    size_t k = 0;
    for (struct ares_addrinfo_node *n = res ? res->nodes : NULL; text && p && n; n = n->ai_next) {
        const void *src =
            n->ai_family == AF_INET
                ? (const void *)&((struct sockaddr_in *)(void *)n->ai_addr)->sin_addr
                : (const void *)&((struct sockaddr_in6 *)(void *)n->ai_addr)->sin6_addr;
        if (inet_ntop(n->ai_family, src, text[k], sizeof(text[k])))
            p[k] = text[k], k++;
    }
    joined(p, k, a->out, a->cap);
    free(p);
    free(text);
    ares_freeaddrinfo(res);
}

int dnsm_query(const char *server, const char *name, char *out, size_t cap)
{
    ares_library_init(ARES_LIB_INIT_ALL);
    ares_channel ch;
    struct ares_options o = { .timeout = 300, .tries = 1 };
    out[0] = '\0';
    if (ares_init_options(&ch, &o, ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES) != ARES_SUCCESS)
        return ARES_ENOMEM;
    /* Only the server asked: no hosts file, no search domains. */
    ares_set_servers_ports_csv(ch, server);
    struct answer a = { .out = out, .cap = cap };
    struct ares_addrinfo_hints h = { .ai_family = AF_UNSPEC, .ai_flags = ARES_AI_NOSORT };
    char fq[300];
    snprintf(fq, sizeof(fq), "%s.", name);
    ares_getaddrinfo(ch, fq, NULL, &h, on_answer, &a);
    for (int64_t until = now_ms() + 2000; !a.done && now_ms() < until;) {
        ares_socket_t fds[ARES_GETSOCK_MAXNUM];
        int bits = ares_getsock(ch, fds, ARES_GETSOCK_MAXNUM);
        struct pollfd p[ARES_GETSOCK_MAXNUM];
        nfds_t np = 0;
        /* writable too: an answer past 512 bytes comes again over TCP, whose connect and
         * question wait for it (bits read unsigned: c-ares' macro shifts 1 into the sign bit) */
        for (int i = 0; i < ARES_GETSOCK_MAXNUM; i++) {
            bool rd = ((unsigned)bits >> i) & 1,
                 wr = ((unsigned)bits >> (i + ARES_GETSOCK_MAXNUM)) & 1;
            if (rd || wr)
                p[np++] =
                    (struct pollfd){ .fd = fds[i],
                                     .events = (short)((rd ? POLLIN : 0) | (wr ? POLLOUT : 0)) };
        }
        int rc = poll(p, np, 50);
        for (nfds_t i = 0; rc > 0 && i < np; i++)
            if (p[i].revents)
                ares_process_fd(
                    ch, p[i].revents & (POLLIN | POLLERR | POLLHUP) ? p[i].fd : ARES_SOCKET_BAD,
                    p[i].revents & POLLOUT ? p[i].fd : ARES_SOCKET_BAD);
        ares_process_fd(ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
    }
    ares_destroy(ch); /* an unfinished query ends here (a.done) */
    ares_library_cleanup();
    return a.done ? a.status : ARES_ETIMEOUT;
}
