/* waiters -- N clients at once against a proxy whose requests all wait in backoff, with the
 * proxy's memory and threads sampled throughout (bench.sh's memory test, bench/README.md).
 *
 *   waiters --port P --pid PID [--n 10000] [--path /wait] [--after 10] [--interval 50]
 *           [--timeout 120]
 *
 * Opens N connections to 127.0.0.1:P (at most 512 connecting at a time), sends one GET on
 * each with its own X-Request-Id, reads each answer's status, head and Content-Length body,
 * then closes. VmRSS and Threads of process PID (/proc/PID/status) are sampled every
 * --interval ms: before the first connection (idle), between the last request sent and the
 * first answer (waiting: peak, and the last sample as "steady"), between the first and the last
 * answer (answering: peak), and for --after seconds after the last answer. Prints one line of
 * key=value results on stdout and a readable summary on stderr. Exit 0 once every connection
 * ended (whatever its status), 1 on a setup error or after --timeout seconds.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNECTING 512
#define HEAD_MAX       4096
#define UNDER_KB       (64L * 1024)

enum state { IDLE, CONNECTING, READING, DONE };

struct client {
    int fd;
    enum state st;
    int status;
    size_t len;
    char buf[HEAD_MAX];
};

struct sample {
    long rss_kb;
    int threads;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct sample sample_of(int pid)
{
    struct sample s = { -1, -1 };
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return s;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "VmRSS:", 6) == 0)
            s.rss_kb = strtol(line + 6, NULL, 10);
        else if (strncmp(line, "Threads:", 8) == 0)
            s.threads = (int)strtol(line + 8, NULL, 10);
    }
    fclose(f);
    return s;
}

static long arg_long(const char *name, const char *v, long lo, long hi)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < lo || n > hi) {
        fprintf(stderr, "waiters: bad %s '%s'\n", name, v);
        exit(2);
    }
    return n;
}

/* The answer is complete once its head and Content-Length bytes of body are in. */
static bool answer_complete(struct client *c)
{
    c->buf[c->len] = '\0';
    char *end = strstr(c->buf, "\r\n\r\n");
    if (!end)
        return c->len >= HEAD_MAX - 1;
    if (c->status == 0 && sscanf(c->buf, "HTTP/1.%*d %d", &c->status) != 1)
        c->status = -1;
    long cl = 0;
    for (char *p = c->buf; p && p < end; p = strstr(p, "\r\n")) {
        p += (p[0] == '\r') ? 2 : 0;
        if (strncasecmp(p, "Content-Length:", 15) == 0)
            cl = strtol(p + 15, NULL, 10);
    }
    size_t head = (size_t)(end + 4 - c->buf);
    if (head + (size_t)cl > HEAD_MAX - 1)
        return true; /* a larger body than expected: the status is all that is needed */
    return c->len >= head + (size_t)cl;
}

int main(int argc, char **argv)
{
    int port = 0, pid = 0, n = 10000, after_s = 10, interval = 50, timeout_s = 120;
    const char *path = "/wait";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "waiters: bad argument '%s' (see the top of bench/waiters.c)\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--port") == 0)
            port = (int)arg_long(a, v, 1, 65535);
        else if (strcmp(a, "--pid") == 0)
            pid = (int)arg_long(a, v, 1, 1L << 30);
        else if (strcmp(a, "--n") == 0)
            n = (int)arg_long(a, v, 1, 1000000);
        else if (strcmp(a, "--after") == 0)
            after_s = (int)arg_long(a, v, 0, 3600);
        else if (strcmp(a, "--interval") == 0)
            interval = (int)arg_long(a, v, 1, 10000);
        else if (strcmp(a, "--timeout") == 0)
            timeout_s = (int)arg_long(a, v, 1, 3600);
        else if (strcmp(a, "--path") == 0)
            path = v;
        else {
            fprintf(stderr, "waiters: bad argument '%s'\n", a);
            return 2;
        }
    }
    if (!port || !pid) {
        fputs("usage: waiters --port P --pid PID [--n N] [--path P] [--after S] "
              "[--interval MS] [--timeout S]\n",
              stderr);
        return 2;
    }

    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < (rlim_t)n + 64) {
        fprintf(stderr, "waiters: RLIMIT_NOFILE %llu is too low for %d connections\n",
                (unsigned long long)rl.rlim_cur, n);
        return 1;
    }
    struct client *cl = calloc((size_t)n, sizeof(*cl));
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (!cl || ep < 0) {
        perror("waiters");
        return 1;
    }
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

    struct sample idle = sample_of(pid), s;
    if (idle.rss_kb < 0) {
        fprintf(stderr, "waiters: no process %d\n", pid);
        return 1;
    }
    struct sample wait_peak = { -1, -1 }, wait_last = { -1, -1 }, answer_peak = { -1, -1 };
    long after_rss = -1, under_ms = -1;
    int next = 0, connecting = 0, ended = 0, ok = 0, other = 0, errors = 0;
    int64_t t0 = now_ms(), t_sent = -1, t_first = -1, t_last = -1, t_sample = 0;
    int sent = 0;

    while (now_ms() - t0 < timeout_s * 1000L) {
        while (next < n && connecting < MAX_CONNECTING) {
            struct client *c = &cl[next];
            c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (c->fd < 0 ||
                (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS)) {
                fprintf(stderr, "waiters: connection %d: %s\n", next, strerror(errno));
                return 1;
            }
            int one = 1;
            setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            struct epoll_event ev = { .events = EPOLLOUT, .data.u32 = (uint32_t)next };
            epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
            c->st = CONNECTING;
            connecting++;
            next++;
        }
        struct epoll_event evs[256];
        int k = epoll_wait(ep, evs, 256, interval);
        for (int i = 0; i < k; i++) {
            struct client *c = &cl[evs[i].data.u32];
            if (c->st == CONNECTING) {
                int err = 0;
                socklen_t len = sizeof(err);
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
                char req[256];
                int rn = snprintf(req, sizeof(req),
                                  "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                                  "X-Request-Id: waiter-%u\r\n\r\n",
                                  path, port, evs[i].data.u32);
                connecting--;
                if (err || write(c->fd, req, (size_t)rn) != rn) {
                    errors++, ended++, c->st = DONE;
                    close(c->fd);
                    continue;
                }
                c->st = READING;
                if (++sent == n)
                    t_sent = now_ms();
                struct epoll_event ev = { .events = EPOLLIN, .data.u32 = evs[i].data.u32 };
                epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
            } else if (c->st == READING) {
                ssize_t r = read(c->fd, c->buf + c->len, HEAD_MAX - 1 - c->len);
                if (r < 0 && errno == EAGAIN)
                    continue;
                if (r > 0)
                    c->len += (size_t)r;
                bool complete = r > 0 && answer_complete(c);
                if (!complete && r > 0)
                    continue;
                if (complete && c->status == 200)
                    ok++;
                else if (complete)
                    other++;
                else
                    errors++;
                if (t_first < 0)
                    t_first = now_ms();
                ended++;
                c->st = DONE;
                close(c->fd);
                if (ended == n)
                    t_last = now_ms();
            }
        }
        int64_t t = now_ms();
        if (t - t_sample < interval)
            continue;
        t_sample = t;
        s = sample_of(pid);
        if (s.rss_kb < 0) {
            fprintf(stderr, "waiters: process %d is gone\n", pid);
            break;
        }
        if (t_sent >= 0 && t_first < 0) {
            wait_last = s;
            wait_peak.rss_kb = s.rss_kb > wait_peak.rss_kb ? s.rss_kb : wait_peak.rss_kb;
            wait_peak.threads = s.threads > wait_peak.threads ? s.threads : wait_peak.threads;
        }
        if (t_first >= 0 && t_last < 0) {
            answer_peak.rss_kb = s.rss_kb > answer_peak.rss_kb ? s.rss_kb : answer_peak.rss_kb;
            answer_peak.threads = s.threads > answer_peak.threads ? s.threads : answer_peak.threads;
        }
        if (t_last >= 0) {
            if (under_ms < 0 && s.rss_kb < UNDER_KB)
                under_ms = t - t_last;
            if (t - t_last >= after_s * 1000L) {
                after_rss = s.rss_kb;
                break;
            }
        }
    }
    bool finished = t_last >= 0;
    printf("n=%d ok=%d other=%d errors=%d unanswered=%d idle_rss_kb=%ld idle_threads=%d "
           "wait_peak_rss_kb=%ld wait_steady_rss_kb=%ld wait_threads_max=%d "
           "answer_peak_rss_kb=%ld answer_threads_max=%d after_rss_kb=%ld after_s=%d "
           "under64_ms=%ld sent_ms=%lld first_answer_ms=%lld last_answer_ms=%lld\n",
           n, ok, other, errors, n - ended, idle.rss_kb, idle.threads, wait_peak.rss_kb,
           wait_last.rss_kb, wait_peak.threads, answer_peak.rss_kb, answer_peak.threads, after_rss,
           after_s, under_ms, (long long)(t_sent >= 0 ? t_sent - t0 : -1),
           (long long)(t_first >= 0 ? t_first - t0 : -1),
           (long long)(t_last >= 0 ? t_last - t0 : -1));
    fprintf(stderr,
            "waiters: %d requests, %d answered 200, %d other, %d errors; RSS idle %ld KiB, "
            "waiting %ld KiB (peak %ld, %d threads), answering peak %ld KiB, %d s after %ld "
            "KiB\n",
            n, ok, other, errors, idle.rss_kb, wait_last.rss_kb, wait_peak.rss_kb,
            wait_peak.threads, answer_peak.rss_kb, after_s, after_rss);
    for (int i = 0; i < n; i++)
        if (cl[i].st != DONE && cl[i].st != IDLE)
            close(cl[i].fd);
    free(cl);
    close(ep);
    return finished ? 0 : 1;
}
