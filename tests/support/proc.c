#include "tests/support/proc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

const char *proc_bin(void)
{
    const char *b = getenv("RETRYPROXY_BIN");
    return b && *b ? b : "build/retryproxy";
}

int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void rm_tree(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int proc_entries(pid_t pid, const char *what)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, what);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Adds to 'set' (grown as needed) the inodes of the sockets in /proc/PID/net/'table' whose
 * remote port is 'port'. -1 if the table cannot be read or memory runs out. */
/* /proc/PID/net/'table' ("tcp", "tcp6") for reading, or NULL. */
static FILE *net_table(pid_t pid, const char *table)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/net/%s", (int)pid, table);
    return fopen(path, "r");
}

/* One socket's line of such a table: its ports, the bytes queued to send, its inode. */
struct tcp_row {
    unsigned lport, rport;
    unsigned long tx, inode;
};

/* sl local_address rem_address st tx_queue:rx_queue tr:when retrnsmt uid timeout inode; false
 * for the header line. */
static bool tcp_row_read(FILE *f, char *line, size_t cap, struct tcp_row *r)
{
    while (fgets(line, (int)cap, f))
        if (sscanf(line,
                   " %*u: %*[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%x %*x %lx:%*x %*x:%*x %*x %*u %*u %lu",
                   &r->lport, &r->rport, &r->tx, &r->inode) == 4)
            return true;
    return false;
}

static int port_inodes(pid_t pid, const char *table, uint16_t port, unsigned long **set, size_t *n,
                       size_t *cap)
{
    char line[512];
    FILE *f = net_table(pid, table);
    if (!f)
        return -1;
    int rc = 0;
    for (struct tcp_row row; tcp_row_read(f, line, sizeof(line), &row);) {
        if (row.rport != port)
            continue; /* another connection */
        if (*n == *cap) {
            size_t c = *cap ? *cap * 2 : 64;
            unsigned long *t = realloc(*set, c * sizeof(*t));
            if (!t) {
                rc = -1;
                break;
            }
            *set = t;
            *cap = c;
        }
        (*set)[(*n)++] = row.inode;
    }
    fclose(f);
    return rc;
}

int proc_fds_to_port(pid_t pid, uint16_t port, int *to_port)
{
    unsigned long *set = NULL;
    size_t n = 0, cap = 0;
    int total = -1;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = NULL;
    if (port_inodes(pid, "tcp", port, &set, &n, &cap) < 0 ||
        port_inodes(pid, "tcp6", port, &set, &n, &cap) < 0 || (d = opendir(path)) == NULL)
        goto out;
    total = 0;
    *to_port = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        total++;
        char link[64];
        ssize_t len = readlinkat(dirfd(d), e->d_name, link, sizeof(link) - 1);
        unsigned long inode;
        if (len <= 0)
            continue;
        link[len] = '\0';
        if (sscanf(link, "socket:[%lu]", &inode) != 1)
            continue;
        for (size_t i = 0; i < n; i++)
            if (set[i] == inode) {
                (*to_port)++;
                break;
            }
    }
out:
    if (d)
        closedir(d);
    free(set);
    return total;
}

long proc_tcp_send_queue_max(pid_t pid, uint16_t port)
{
    char line[512];
    FILE *f = net_table(pid, "tcp");
    if (!f)
        return -1;
    long most = 0;
    for (struct tcp_row row; tcp_row_read(f, line, sizeof(line), &row);)
        if (row.lport == port && (long)row.tx > most)
            most = (long)row.tx;
    fclose(f);
    return most;
}

long proc_status_kb(pid_t pid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    if (!f)
        return -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, field, n) == 0 && line[n] == ':' &&
            sscanf(line + n + 1, " %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

static size_t drop(char *p, size_t size, size_t n, void *ud)
{
    (void)p;
    (void)ud;
    return size * n;
}

CURL *proc_multi_get(CURLM *m, const char *url, struct curl_slist *headers, long timeout_ms,
                     void *priv)
{
    CURL *e = curl_easy_init();
    if (!e)
        return NULL;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, drop);
    curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)priv);
    curl_multi_add_handle(m, e);
    return e;
}

CURL *proc_multi_next_done(CURLM *m, void **priv, CURLcode *rc)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left)) != NULL) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        char *p = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &p);
        *priv = p;
        *rc = msg->data.result;
        return msg->easy_handle;
    }
    return NULL;
}

static void append(char **buf, size_t *len, const char *data, size_t n)
{
    char *p = realloc(*buf, *len + n + 1);
    if (!p)
        abort();
    memcpy(p + *len, data, n);
    *len += n;
    p[*len] = '\0';
    *buf = p;
}

static char **merged_env(char *const extra[])
{
    size_t n = 0, k = 0;
    while (environ[n])
        n++;
    while (extra && extra[k])
        k++;
    char **env = calloc(n + k + 1, sizeof(*env));
    if (!env)
        abort();
    size_t m = 0;
    for (size_t i = 0; i < k; i++)
        env[m++] = extra[i];
    for (size_t i = 0; i < n; i++) {
        /* an extra NAME=... replaces the inherited one */
        const char *eq = strchr(environ[i], '=');
        size_t nl = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
        int dup = 0;
        for (size_t j = 0; j < k; j++)
            if (strncmp(extra[j], environ[i], nl) == 0 && extra[j][nl] == '=')
                dup = 1;
        if (!dup)
            env[m++] = environ[i];
    }
    return env;
}

int proc_run(char *const argv[], char *const env_extra[], int timeout_ms, struct proc_result *r)
{
    int out[2] = { -1, -1 }, err[2] = { -1, -1 }, rc = -1;
    posix_spawn_file_actions_t fa;
    char **env = merged_env(env_extra);
    pid_t pid;

    memset(r, 0, sizeof(*r));
    append(&r->out, &r->out_len, "", 0);
    append(&r->err, &r->err_len, "", 0);
    if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0)
        goto out;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    int e = posix_spawn(&pid, argv[0], &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    if (e != 0)
        goto out;
    close(out[1]);
    close(err[1]);
    out[1] = err[1] = -1;

    long long deadline = now_ms() + timeout_ms;
    int open_fds = 2;
    while (open_fds > 0) {
        struct pollfd p[2] = { { out[0], POLLIN, 0 }, { err[0], POLLIN, 0 } };
        long long left = deadline - now_ms();
        if (left <= 0)
            break;
        if (poll(p, 2, (int)left) < 0 && errno != EINTR)
            break;
        for (int i = 0; i < 2; i++) {
            if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char buf[8192];
            ssize_t n = read(p[i].fd, buf, sizeof(buf));
            if (n > 0) {
                if (i == 0)
                    append(&r->out, &r->out_len, buf, (size_t)n);
                else
                    append(&r->err, &r->err_len, buf, (size_t)n);
            } else if (n == 0 || errno != EINTR) {
                close(i == 0 ? out[0] : err[0]);
                if (i == 0)
                    out[0] = -1;
                else
                    err[0] = -1;
                open_fds--;
            }
        }
    }
    int st;
    if (open_fds > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        r->status = -1;
    } else {
        waitpid(pid, &st, 0);
        r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    rc = 0;
out:
    for (int i = 0; i < 2; i++) {
        if (out[i] >= 0)
            close(out[i]);
        if (err[i] >= 0)
            close(err[i]);
    }
    free(env);
    return rc;
}

size_t proc_args(char **argv, size_t cap, size_t n, const char *a0, va_list ap)
{
    for (const char *a = a0; a && n + 1 < cap; a = va_arg(ap, const char *))
        argv[n++] = (char *)a;
    argv[n] = NULL;
    return n;
}

void proc_result_free(struct proc_result *r)
{
    free(r->out);
    free(r->err);
    memset(r, 0, sizeof(*r));
}

char *proc_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return strdup("");
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        fwrite(chunk, 1, n, m);
    fclose(m);
    fclose(f);
    return buf;
}

pid_t proc_helper_start(char *const argv[], int *in_fd, char *line, size_t cap, int timeout_ms)
{
    int in[2], out[2];
    line[0] = '\0';
    if (pipe(in) < 0)
        return -1;
    if (pipe(out) < 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    if (pid < 0) {
        close(in[1]);
        close(out[0]);
        return -1;
    }
    *in_fd = in[1];
    size_t len = 0;
    for (int64_t until = now_ms() + timeout_ms;
         len < cap - 1 && !memchr(line, '\n', len) && now_ms() < until;) {
        struct pollfd p = { .fd = out[0], .events = POLLIN };
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t n = read(out[0], line + len, cap - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        line[len] = '\0';
    }
    close(out[0]);
    return pid;
}

void proc_helper_stop(pid_t pid, int in_fd)
{
    if (pid <= 0)
        return;
    close(in_fd);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}
