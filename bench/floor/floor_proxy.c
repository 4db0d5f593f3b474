/* floor_proxy -- libmicrohttpd and libcurl's multi-socket API, nothing else: every request is
 * suspended, fetched from one fixed upstream URL with a pooled easy handle (curl_easy_reset
 * between uses), its body collected into a buffer, then the connection is resumed and answered
 * with the upstream's status and body (502 if the transfer failed). One thread, one epoll loop:
 * the daemon's epoll descriptor, libcurl's sockets (CURLMOPT_SOCKETFUNCTION) and a timerfd for
 * libcurl's timer (CURLMOPT_TIMERFUNCTION). A timeout of 0 ("as soon as possible", asked for
 * every new transfer) is run on the loop's next iteration without arming the timerfd, and the
 * timerfd is re-armed only for a deadline earlier than the one it holds: programming a timer is
 * among the most expensive system calls here (a VM exit on a virtual machine), and a timerfd
 * that fires early only costs one curl_multi_socket_action. The request's path, method and
 * headers are not forwarded: the upstream URL is all there is.
 *
 *   floor_proxy --upstream URL [--port N] [--tuned]
 *
 * --tuned: the URL is parsed once and passed as CURLOPT_CURLU, CURLOPT_NOSIGNAL is set,
 * MHD_USE_TURBO, and an 8 KiB MHD_OPTION_CONNECTION_MEMORY_LIMIT.
 */
#include "bench/floor/floor.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_FD 65536

struct req {
    CURL *easy;
    struct MHD_Connection *conn;
    char *buf;
    size_t len, cap;
    long status;
    CURLcode rc;
    struct req *next_free;
};

static struct floor_opts opts;
static CURLM *multi;
static CURLU *parsed_url;
static int tfd;
static int64_t armed_ms;  /* CLOCK_MONOTONIC deadline the timerfd holds, 0 if none */
static int64_t wanted_ms; /* libcurl's last deadline, 0 if none */
static bool timeout_due;  /* libcurl asked for a timeout of 0 */
static struct req *free_reqs;
/* Tags of libcurl's sockets in the loop's epoll set: sock_tag[fd] == fd. */
static int sock_tag[MAX_FD];

static size_t on_body(char *data, size_t size, size_t n, void *cls)
{
    struct req *r = cls;
    size_t add = size * n;
    if (r->len + add > r->cap) {
        size_t cap = r->cap ? r->cap : 1024;
        while (cap < r->len + add)
            cap *= 2;
        char *b = realloc(r->buf, cap);
        if (!b)
            return 0;
        r->buf = b;
        r->cap = cap;
    }
    memcpy(r->buf + r->len, data, add);
    r->len += add;
    return add;
}

static int on_close(void *cls, curl_socket_t s);

static struct req *req_get(void)
{
    struct req *r = free_reqs;
    if (r) {
        free_reqs = r->next_free;
        curl_easy_reset(r->easy);
    } else {
        r = calloc(1, sizeof(*r));
        if (!r || !(r->easy = curl_easy_init()))
            abort();
    }
    r->len = 0;
    r->status = 0;
    r->rc = CURLE_OK;
    return r;
}

static void req_put(struct req *r)
{
    r->conn = NULL;
    r->next_free = free_reqs;
    free_reqs = r;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *data_size, void **req_cls)
{
    (void)cls, (void)url, (void)method, (void)version, (void)data, (void)data_size;
    if (floor_first_call(req_cls))
        return MHD_YES;
    struct req *r = *req_cls;
    if (!floor_marked(r)) { /* resumed: the transfer is over */
        long status = r->rc == CURLE_OK ? r->status : MHD_HTTP_BAD_GATEWAY;
        struct MHD_Response *resp =
            MHD_create_response_from_buffer(r->len, r->buf, MHD_RESPMEM_PERSISTENT);
        enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    r = req_get();
    r->conn = c;
    if (opts.tuned) {
        curl_easy_setopt(r->easy, CURLOPT_CURLU, parsed_url);
        curl_easy_setopt(r->easy, CURLOPT_NOSIGNAL, 1L);
    } else {
        curl_easy_setopt(r->easy, CURLOPT_URL, opts.upstream);
    }
    curl_easy_setopt(r->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(r->easy, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(r->easy, CURLOPT_PRIVATE, r);
    curl_easy_setopt(r->easy, CURLOPT_CLOSESOCKETFUNCTION, on_close);
    *req_cls = r;
    MHD_suspend_connection(c);
    curl_multi_add_handle(multi, r->easy);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)c, (void)toe;
    if (*req_cls && !floor_marked(*req_cls))
        req_put(*req_cls);
    *req_cls = NULL;
}

/* Resume the connection of every finished transfer. */
static void finish_done(void)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(multi, &left)) != NULL) {
        if (m->msg != CURLMSG_DONE)
            continue;
        struct req *r;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
        r->rc = m->data.result;
        curl_easy_getinfo(m->easy_handle, CURLINFO_RESPONSE_CODE, &r->status);
        curl_multi_remove_handle(multi, m->easy_handle);
        MHD_resume_connection(r->conn);
    }
}

/* Events each curl socket is registered for in epoll (0: not registered), and whether curl
 * has stopped watching it. A kept-alive connection stays registered between transfers, as in
 * retryproxy (proxy/upstream/curlm.c), so that reusing it costs no epoll_ctl; its events are
 * ignored while parked, and a parked socket that turns readable (the upstream closed it) is dropped
 * from epoll until curl wants it again. */
static uint32_t sock_events[MAX_FD];
static bool sock_parked[MAX_FD];

static void sock_set(int s, uint32_t ev)
{
    if (sock_events[s] == ev)
        return;
    struct epoll_event e = { .events = ev, .data.ptr = &sock_tag[s] };
    epoll_ctl(floor_epoll(), sock_events[s] ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, s, &e);
    sock_events[s] = ev;
}

static int on_socket(CURL *e, curl_socket_t s, int what, void *cls, void *sock_cls)
{
    (void)e, (void)cls, (void)sock_cls;
    if (s < 0 || s >= MAX_FD)
        abort();
    sock_tag[s] = s;
    if (what == CURL_POLL_REMOVE) {
        sock_parked[s] = true;
        if (sock_events[s])
            sock_set(s, EPOLLIN);
        return 0;
    }
    sock_parked[s] = false;
    sock_set(s, (what & CURL_POLL_IN ? EPOLLIN : 0) | (what & CURL_POLL_OUT ? EPOLLOUT : 0));
    return 0;
}

/* curl closes a socket: forget it first (its number may come back for another). */
static int on_close(void *cls, curl_socket_t s)
{
    (void)cls;
    if (s >= 0 && s < MAX_FD) {
        sock_events[s] = 0;
        sock_parked[s] = false;
    }
    return close(s);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void arm(int64_t deadline)
{
    struct itimerspec its = { 0 };
    its.it_value.tv_sec = deadline / 1000;
    its.it_value.tv_nsec = deadline % 1000 * 1000000L;
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
    armed_ms = deadline;
}

static int on_timer(CURLM *m, long ms, void *cls)
{
    (void)m, (void)cls;
    wanted_ms = 0;
    if (ms == 0) {
        timeout_due = true;
        floor_wake();
    } else if (ms > 0) { /* ms < 0: none; a timer still armed fires once for nothing */
        wanted_ms = now_ms() + ms + 1; /* rounded up: never before libcurl's deadline */
        if (!armed_ms || armed_ms > wanted_ms)
            arm(wanted_ms);
    }
    return 0;
}

static void run_due_timeout(void)
{
    if (!timeout_due)
        return;
    timeout_due = false;
    int running;
    curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running);
    finish_done();
}

static void on_event(void *tag, uint32_t events)
{
    int running;
    if (tag == &tfd) {
        uint64_t n;
        if (read(tfd, &n, sizeof(n)) < 0)
            return;
        armed_ms = 0;
        curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running);
        /* Fired early: libcurl's deadline is unchanged, so it will not tell it again. */
        if (wanted_ms && !armed_ms)
            arm(wanted_ms);
    } else if (sock_parked[*(int *)tag]) {
        int s = *(int *)tag;
        epoll_ctl(floor_epoll(), EPOLL_CTL_DEL, s, NULL);
        sock_events[s] = 0;
        return;
    } else {
        int flags = (events & EPOLLIN ? CURL_CSELECT_IN : 0) |
                    (events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                    (events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
        curl_multi_socket_action(multi, *(int *)tag, flags, &running);
    }
    finish_done();
}

int main(int argc, char **argv)
{
    floor_parse(argc, argv, "usage: floor_proxy --upstream URL [--port N] [--tuned]\n", &opts);
    if (!opts.upstream) {
        fputs("floor_proxy: --upstream URL is required\n", stderr);
        return 2;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (opts.tuned) {
        parsed_url = curl_url();
        if (!parsed_url || curl_url_set(parsed_url, CURLUPART_URL, opts.upstream, 0)) {
            fprintf(stderr, "floor_proxy: bad URL '%s'\n", opts.upstream);
            return 2;
        }
    }
    multi = curl_multi_init();
    curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, on_timer);
    /* A fixed connection cache: the default follows the number of transfers in progress and
     * would close kept-alive upstream connections as the load moves. */
    curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, 1024L);
    unsigned flags = MHD_ALLOW_SUSPEND_RESUME | (opts.tuned ? MHD_USE_TURBO : 0);
    struct MHD_Daemon *d =
        floor_start(opts.port, flags, opts.tuned ? 8 * 1024 : 0, on_request, NULL, on_completed);
    tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    floor_watch(tfd, EPOLLIN, &tfd);
    int rc = floor_loop(d, on_event, run_due_timeout);
    curl_multi_cleanup(multi);
    while (free_reqs) {
        struct req *r = free_reqs;
        free_reqs = r->next_free;
        curl_easy_cleanup(r->easy);
        free(r->buf);
        free(r);
    }
    curl_url_cleanup(parsed_url);
    curl_global_cleanup();
    return rc;
}
