/* floor -- see floor.h. */
#include "bench/floor/floor.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

static int epfd = -1;
static int sigfd = -1;
static char first_marker;
static bool woken;

void floor_parse(int argc, char **argv, const char *usage, struct floor_opts *o)
{
    o->port = 8090;
    o->upstream = NULL;
    o->tuned = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0) {
            fputs(usage, stdout);
            exit(0);
        } else if (strcmp(a, "--tuned") == 0) {
            o->tuned = true;
        } else if (strcmp(a, "--port") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 65535) {
                fprintf(stderr, "%s: bad port '%s'\n", argv[0], argv[i]);
                exit(2);
            }
            o->port = (uint16_t)v;
        } else if (strcmp(a, "--upstream") == 0 && i + 1 < argc) {
            o->upstream = argv[++i];
        } else {
            fprintf(stderr, "%s: bad argument '%s'\n%s", argv[0], a, usage);
            exit(2);
        }
    }
}

struct MHD_Daemon *floor_start(uint16_t port, unsigned extra_flags, size_t mem_limit,
                               MHD_AccessHandlerCallback handler, void *handler_cls,
                               MHD_RequestCompletedCallback completed)
{
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* MHD_OPTION_CONNECTION_MEMORY_LIMIT 0 would be refused: pass libmicrohttpd's default. */
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_EPOLL | MHD_USE_ERROR_LOG | extra_flags, port, NULL, NULL, handler, handler_cls,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_LISTEN_BACKLOG_SIZE, 4096,
        MHD_OPTION_CONNECTION_LIMIT, 16384, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        mem_limit ? mem_limit : (size_t)32 * 1024, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
        MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "cannot listen on 127.0.0.1:%u\n", port);
        exit(3);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_EPOLL_FD);
    epfd = epoll_create1(EPOLL_CLOEXEC);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (!info || epfd < 0 || sigfd < 0) {
        fprintf(stderr, "epoll set-up failed: %s\n", strerror(errno));
        exit(3);
    }
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = d };
    epoll_ctl(epfd, EPOLL_CTL_ADD, info->epoll_fd, &ev);
    ev.data.ptr = &sigfd;
    epoll_ctl(epfd, EPOLL_CTL_ADD, sigfd, &ev);
    fprintf(stderr, "listening on 127.0.0.1:%u\n", port);
    return d;
}

int floor_epoll(void)
{
    return epfd;
}

void floor_watch(int fd, uint32_t events, void *tag)
{
    struct epoll_event ev = { .events = events, .data.ptr = tag };
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
        epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &ev);
}

int floor_loop(struct MHD_Daemon *d, floor_event_fn on_event, floor_tick_fn on_tick)
{
    struct epoll_event evs[64];
    for (;;) {
        MHD_UNSIGNED_LONG_LONG ms;
        int timeout = 1000;
        if (woken)
            timeout = 0;
        else if (MHD_get_timeout(d, &ms) == MHD_YES && ms < 1000)
            timeout = (int)ms;
        int n = epoll_wait(epfd, evs, 64, timeout);
        if (n < 0 && errno != EINTR) {
            perror("epoll_wait");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == &sigfd) {
                MHD_stop_daemon(d);
                return 0;
            }
            if (evs[i].data.ptr != d && on_event)
                on_event(evs[i].data.ptr, evs[i].events);
        }
        woken = false;
        if (on_tick)
            on_tick();
        MHD_run(d);
    }
}

void floor_wake(void)
{
    woken = true;
}

bool floor_first_call(void **req_cls)
{
    if (*req_cls)
        return false;
    *req_cls = &first_marker;
    return true;
}

bool floor_marked(const void *req_cls)
{
    return req_cls == &first_marker;
}
