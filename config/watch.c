#include "config/watch.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

/* Writes (in place or through a rename), creation, deletion, Kubernetes' symlink swap, and
 * the directory itself being removed or moved. */
#define DIR_EVENTS                                                                                 \
    (IN_CLOSE_WRITE | IN_MODIFY | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE |            \
     IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF)

struct watch {
    int fd;
    int wd; /* -1 while the directory is not watched */
    char dir[PATH_MAX];
    char name[NAME_MAX + 1];
};

struct watch *watch_new(const char *path)
{
    struct watch *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    const char *slash = strrchr(path, '/');
    if (!slash) {
        strcpy(w->dir, ".");
        snprintf(w->name, sizeof(w->name), "%s", path);
    } else {
        size_t dl = slash == path ? 1 : (size_t)(slash - path);
        if (dl >= sizeof(w->dir)) {
            free(w);
            errno = ENAMETOOLONG;
            return NULL;
        }
        memcpy(w->dir, path, dl);
        w->dir[dl] = '\0';
        snprintf(w->name, sizeof(w->name), "%s", slash + 1);
    }
    w->wd = -1;
    w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->fd < 0) {
        int e = errno;
        free(w);
        errno = e;
        return NULL;
    }
    watch_repair(w);
    return w;
}

void watch_free(struct watch *w)
{
    if (!w)
        return;
    close(w->fd);
    free(w);
}

int watch_fd(const struct watch *w)
{
    return w->fd;
}

bool watch_active(const struct watch *w)
{
    return w->wd >= 0;
}

bool watch_repair(struct watch *w)
{
    if (w->wd >= 0)
        return true;
    w->wd = inotify_add_watch(w->fd, w->dir, DIR_EVENTS | IN_ONLYDIR);
    return w->wd >= 0;
}

static bool concerns_config(const struct watch *w, const struct inotify_event *ev)
{
    if (ev->mask & (IN_Q_OVERFLOW | IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF))
        return true;
    if (!ev->len)
        return false;
    /* kubelet's entries: "..data", "..data_tmp", "..2026_11_21_10_00_00.123456789" */
    return strcmp(ev->name, w->name) == 0 || strncmp(ev->name, "..", 2) == 0;
}

bool watch_read(struct watch *w)
{
    bool relevant = false;
    char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t n = read(w->fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* EAGAIN: drained */
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)(void *)p;
            if (concerns_config(w, ev))
                relevant = true;
            /* The kernel dropped the watch (the directory went away or moved): it must be added
             * again once the directory exists. */
            if ((ev->mask & IN_IGNORED) && ev->wd == w->wd)
                w->wd = -1;
            if ((ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) && ev->wd == w->wd) {
                inotify_rm_watch(w->fd, w->wd);
                w->wd = -1;
            }
            p += sizeof(*ev) + ev->len;
        }
    }
    return relevant;
}
