#include "config/watch.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

/* Writes (in place or through a rename), creation, deletion, Kubernetes' symlink swap, and
 * the directory itself being removed or moved. */
#define DIR_EVENTS                                                                                 \
    (IN_CLOSE_WRITE | IN_MODIFY | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE |            \
     IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF)

/* The watch itself went away or its directory moved: what the path names may have changed. */
#define GONE_EVENTS (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF)

/* Places watched along the path's symlinks (a ConfigMap needs three: the config's link, the
 * ..data link, the real file). Longer chains are followed but watched only this far; the
 * content poll covers the rest. */
#define MAX_POINTS 16
/* Symlinks followed while resolving, as the kernel's own limit (ELOOP past it). */
#define MAX_LINKS 40

/* One entry of a directory whose change would change what the config path reads: a symlink
 * on the way, the file it finally names, or the first component that does not exist yet. */
struct point {
    int wd; /* -1 when the directory could not be watched */
    char name[NAME_MAX + 1];
    char dir[PATH_MAX]; /* absolute, free of symlinks */
};

struct watch {
    int fd;
    int wd; /* the directory as named in the path; -1 while not watched */
    char dir[PATH_MAX];
    char name[NAME_MAX + 1];
    char abs[PATH_MAX]; /* the path, made absolute at watch_new() */
    struct point pts[MAX_POINTS];
    size_t n_pts;
    struct point next[MAX_POINTS]; /* scratch for follow_links() */
};

/* ---- resolving the path ---- */

static size_t add_point(struct point *v, size_t n, const char *dir, const char *name)
{
    const char *d = *dir ? dir : "/";
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].dir, d) == 0 && strcmp(v[i].name, name) == 0)
            return n;
    if (n == MAX_POINTS)
        return n;
    v[n].wd = -1;
    snprintf(v[n].dir, sizeof(v[n].dir), "%s", d);
    snprintf(v[n].name, sizeof(v[n].name), "%s", name);
    return n + 1;
}

/* Walks the absolute 'path' one component at a time, as the kernel resolves it, and records
 * in 'v' every place where a change alters what the path reads: the directory and name of
 * each symlink met (in a directory component or at the end), of the file finally reached, or
 * of the first component that does not exist. Returns how many were recorded. Only lstat and
 * readlink: nothing is opened. */
static size_t resolve(const char *path, struct point *v)
{
    char done[PATH_MAX] = ""; /* the part resolved so far, without symlinks; "" is the root */
    char ahead[PATH_MAX], rest[PATH_MAX], target[PATH_MAX], cand[PATH_MAX + NAME_MAX + 2];
    char comp[NAME_MAX + 1];
    size_t n = 0;
    int links = 0;

    if (snprintf(ahead, sizeof(ahead), "%s", path) >= (int)sizeof(ahead))
        return 0;
    for (const char *p = ahead;;) {
        while (*p == '/')
            p++;
        if (!*p)
            break;
        size_t len = strcspn(p, "/");
        if (len > NAME_MAX)
            break;
        memcpy(comp, p, len);
        comp[len] = '\0';
        p += len;
        while (*p == '/')
            p++;
        bool last = *p == '\0';
        if (strcmp(comp, ".") == 0)
            continue;
        if (strcmp(comp, "..") == 0) {
            char *slash = strrchr(done, '/');
            if (slash)
                *slash = '\0';
            continue;
        }
        snprintf(cand, sizeof(cand), "%s/%s", done, comp);
        struct stat st;
        if (lstat(cand, &st) < 0) {
            n = add_point(v, n, done, comp); /* where it would appear */
            break;
        }
        if (S_ISLNK(st.st_mode)) {
            n = add_point(v, n, done, comp);
            if (++links > MAX_LINKS)
                break;
            ssize_t tl = readlink(cand, target, sizeof(target) - 1);
            if (tl < 0)
                break;
            target[tl] = '\0';
            snprintf(rest, sizeof(rest), "%s", p);
            if (snprintf(ahead, sizeof(ahead), "%s/%s", target, rest) >= (int)sizeof(ahead))
                break;
            if (target[0] == '/')
                done[0] = '\0';
            p = ahead;
            continue;
        }
        if (last) {
            n = add_point(v, n, done, comp);
            break;
        }
        if (strlen(cand) >= sizeof(done))
            break;
        memcpy(done, cand, strlen(cand) + 1);
    }
    return n;
}

static bool wd_in_use(const struct watch *w, const struct point *v, size_t n, int wd)
{
    if (wd == w->wd)
        return true;
    for (size_t i = 0; i < n; i++)
        if (v[i].wd == wd)
            return true;
    return false;
}

/* Resolves the path again and moves the watches to where it now leads: the directories of
 * the new points are watched, those no longer needed are released. Cheap (a few lstat and
 * inotify calls), so it runs after every relevant event. Returns which of the previous points
 * (bit i for pts[i]) the path still leads through. */
static uint32_t follow_links(struct watch *w)
{
    size_t n = resolve(w->abs, w->next);
    uint32_t kept = 0;
    for (size_t i = 0; i < w->n_pts; i++)
        for (size_t j = 0; j < n; j++)
            if (strcmp(w->pts[i].dir, w->next[j].dir) == 0 &&
                strcmp(w->pts[i].name, w->next[j].name) == 0) {
                kept |= 1u << i;
                break;
            }
    for (size_t i = 0; i < n; i++)
        w->next[i].wd = inotify_add_watch(w->fd, w->next[i].dir, DIR_EVENTS | IN_ONLYDIR);
    for (size_t i = 0; i < w->n_pts; i++) {
        int wd = w->pts[i].wd;
        if (wd >= 0 && !wd_in_use(w, w->next, n, wd) && !wd_in_use(w, w->pts, i, wd))
            inotify_rm_watch(w->fd, wd);
    }
    memcpy(w->pts, w->next, n * sizeof(*w->pts));
    w->n_pts = n;
    return kept;
}

/* ---- the public interface ---- */

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
    char cwd[PATH_MAX];
    if (path[0] == '/' || !getcwd(cwd, sizeof(cwd)))
        snprintf(w->abs, sizeof(w->abs), "%s", path);
    else if (snprintf(w->abs, sizeof(w->abs), "%s/%s", cwd, path) >= (int)sizeof(w->abs))
        snprintf(w->abs, sizeof(w->abs), "%s", path); /* too long: no links followed */
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
    if (w->wd < 0)
        w->wd = inotify_add_watch(w->fd, w->dir, DIR_EVENTS | IN_ONLYDIR);
    if (w->abs[0] == '/')
        follow_links(w);
    return w->wd >= 0;
}

/* What one event says about what it touches: an entry of a directory on the way, named
 * 'name' in 'dir'. */
static enum watch_change entry_change(const struct inotify_event *ev, const char *dir,
                                      const char *name)
{
    if (ev->mask & IN_MOVED_TO)
        return WATCH_COMPLETE; /* a whole file, link or directory renamed into place */
    if (ev->mask & IN_CREATE) {
        if (ev->mask & IN_ISDIR)
            return WATCH_COMPLETE; /* a directory on the way appeared */
        /* symlink(2) makes a link whole, with its target; a regular file created here is
         * about to be written. */
        char p[PATH_MAX + NAME_MAX + 2];
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s", dir, name);
        if (lstat(p, &st) == 0 && S_ISLNK(st.st_mode))
            return WATCH_COMPLETE;
    }
    /* Written, closed after writing, chmod/touch, deleted or renamed away. */
    return WATCH_IN_PROGRESS;
}

/* What the events of one watch_read() add up to, taken in order. */
struct tally {
    bool relevant;  /* something concerned the config */
    bool complete;  /* a complete change was seen */
    bool overflow;  /* events were lost: never complete */
    bool unsettled; /* an in-place change after the last complete one, on the config's own name
                       or its directory */
    uint32_t unsettled_pts; /* the same on points (bit i for w->pts[i]), which count only if the
                               path still leads through them once the read is over */
};

static void tally_complete(struct tally *t)
{
    t->complete = true; /* what came before it is replaced */
    t->unsettled = false;
    t->unsettled_pts = 0;
}

/* Adds one event to 't'. */
static void tally_event(const struct watch *w, const struct inotify_event *ev, struct tally *t)
{
    if (ev->mask & IN_Q_OVERFLOW) {
        t->relevant = t->overflow = true;
        return;
    }
    bool named = false; /* the event named one of the points (handled below) */
    for (size_t i = 0; i < w->n_pts; i++) {
        const struct point *pt = &w->pts[i];
        if (pt->wd != ev->wd)
            continue;
        if (ev->mask & GONE_EVENTS) {
            t->relevant = true;
            t->unsettled_pts |= 1u << i;
        } else if (ev->len && strcmp(ev->name, pt->name) == 0) {
            named = true;
            t->relevant = true;
            if (entry_change(ev, pt->dir, pt->name) == WATCH_COMPLETE)
                tally_complete(t);
            else
                t->unsettled_pts |= 1u << i;
        }
    }
    if (ev->wd != w->wd)
        return;
    if (ev->mask & GONE_EVENTS) {
        t->relevant = t->unsettled = true;
    } else if (ev->len && strcmp(ev->name, w->name) == 0) {
        /* The name as given: always on the path, also when its points are not known (a
         * relative path too long to make absolute). */
        t->relevant = true;
        if (entry_change(ev, w->dir, w->name) == WATCH_COMPLETE)
            tally_complete(t);
        else
            t->unsettled = true;
    } else if (!named && ev->len && strncmp(ev->name, "..", 2) == 0) {
        /* kubelet's entries off the path ("..data_tmp", a new or an old
         * "..2026_11_21_10_00_00.123456789"): worth a look, but they neither complete a
         * change nor leave one half done. */
        t->relevant = true;
    }
}

/* The kernel dropped watch 'wd' (its directory went away): every place watched through it
 * needs watching again. */
static void forget_wd(struct watch *w, int wd)
{
    if (wd == w->wd)
        w->wd = -1;
    for (size_t i = 0; i < w->n_pts; i++)
        if (w->pts[i].wd == wd)
            w->pts[i].wd = -1;
}

enum watch_change watch_read(struct watch *w)
{
    struct tally t = { 0 };
    char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t n = read(w->fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* EAGAIN: drained */
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)(void *)p;
            tally_event(w, ev, &t);
            /* The kernel dropped the watch (the directory went away or moved): it must be added
             * again once the directory exists. */
            if ((ev->mask & IN_IGNORED) && ev->wd >= 0)
                forget_wd(w, ev->wd);
            if ((ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) && ev->wd == w->wd && w->wd >= 0) {
                inotify_rm_watch(w->fd, w->wd);
                forget_wd(w, ev->wd);
            }
            p += sizeof(*ev) + ev->len;
        }
    }
    if (!t.relevant)
        return WATCH_NONE;
    /* A symlink on the way may point elsewhere now (kubelet's ..data swap): watch where the
     * path leads after this change. In-place changes to places it no longer leads through
     * (kubelet removing the previous version) do not make the change unfinished. */
    if (w->abs[0] == '/')
        t.unsettled_pts &= follow_links(w);
    if (t.complete && !t.overflow && !t.unsettled && !t.unsettled_pts)
        return WATCH_COMPLETE;
    return WATCH_IN_PROGRESS;
}
