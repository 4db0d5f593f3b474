/* loop_watch: a watch that was never added is never taken off the epoll set (proxy/base/loop.h),
 * and an upgrade's connector that fails before it has a socket leaves the other watches of its
 * loop alone (proxy/upstream/tunnel_up.c, issue 26 item 17). fd 0 matters: with stdin closed it is
 * the first descriptor a worker gets, a live socket's. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

#include "proxy/base/loop.h"
#include "proxy/upstream/connect.h"
#include "proxy/upstream/origin.h"
#include "proxy/upstream/tunnel_up.h"

static void on_event(struct loop_watch *w, uint32_t events)
{
    (void)w;
    (void)events;
}

/* A pipe's read end as fd 0, watched on 'l' through 'w'. */
static void watch_fd0(struct loop *l, struct loop_watch *w)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    cr_assert_eq(dup2(p[0], 0), 0);
    close(p[0]);
    cr_assert_eq(loop_watch_add(l, w, 0, EPOLLIN, on_event, NULL), 0);
}

/* Whether the epoll set still has 'w''s fd: a change of its events finds it. */
static bool still_watched(struct loop *l, struct loop_watch *w)
{
    return loop_watch_mod(l, w, w->events == EPOLLIN ? EPOLLIN | EPOLLRDHUP : EPOLLIN) == 0;
}

static void unused_done(void *arg, enum tunnel_up_end end)
{
    (void)arg;
    (void)end;
    cr_assert_fail("done is never called for an attempt that did not start");
}

static const struct tunnel_up_ops no_ops = { .done = unused_done };

static struct tunnel_up *start_to(struct loop *l, const struct origin *o)
{
    static struct connect_side cs; /* outlives the attempt, as a worker's does */
    cs.loop = l;
    struct tunnel_up_req req = {
        .o = o, .method = "GET", .target = "/ws", .upgrade = "websocket", .connect_timeout_ms = 1000
    };
    return tunnel_up_start(&cs, &req, &no_ops, NULL);
}

Test(loop_watch, a_failed_add_leaves_the_watch_unset_and_its_delete_touches_nothing)
{
    struct loop *l = loop_new();
    cr_assert_not_null(l);
    struct loop_watch a, b;
    watch_fd0(l, &a);
    /* the same fd twice: EEXIST, and the second watch was never added */
    cr_expect_lt(loop_watch_add(l, &b, 0, EPOLLIN, on_event, NULL), 0);
    cr_expect_eq(b.fd, -1);
    loop_watch_del(l, &b);
    cr_expect(still_watched(l, &a), "deleting a watch never added removed another's fd");
    loop_watch_del(l, &a);
    loop_free(l);
}

/* No socket (EMFILE): the connector's release must not delete its zeroed watch, fd 0. */
Test(loop_watch, an_upgrade_without_a_socket_leaves_fd_0_watched)
{
    struct loop *l = loop_new();
    cr_assert_not_null(l);
    struct loop_watch w;
    watch_fd0(l, &w);
    struct origin *o = origin_new("127.0.0.1:9", NULL);
    cr_assert_not_null(o);
    struct rlimit was, none = { 0, 0 };
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &was), 0);
    none.rlim_max = was.rlim_max;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &none), 0);
    struct tunnel_up *u = start_to(l, o);
    int err = errno;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &was), 0);
    cr_expect_null(u, "a socket was made under RLIMIT_NOFILE 0");
    cr_expect_eq(err, EMFILE, "errno %d", err);
    cr_expect(still_watched(l, &w), "fd 0 was taken off the worker's epoll set");
    tunnel_up_free(u);
    origin_free(o);
    loop_watch_del(l, &w);
    loop_free(l);
}
