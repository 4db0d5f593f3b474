/* watch -- notices every way the config file can change (docs/reload.md).
 *
 * The directory holding the file is watched, not the file: editors write a temporary file and
 * rename it over the config (a new inode), and Kubernetes updates a mounted ConfigMap by
 * renaming a "..data" symlink to a new timestamped directory, so a watch on the file itself
 * would follow the old inode and miss the change. Any event on the config's name, on an entry
 * starting with ".." (kubelet's), a queue overflow, or the directory's own watch going away
 * is reported as "maybe changed"; the caller then re-reads and compares contents, so a
 * spurious report costs one read. Event-loop agnostic: the caller polls watch_fd().
 *
 * A path that goes through symlinks (a ConfigMap's config.json -> ..data/config.json, ..data
 * -> ..2026_01_15_10_00_00.123456789) is also watched where it leads: the directory of every
 * symlink met on the way (for that link's name) and the directory of the file finally
 * reached (for its name), so an in-place write to the real file is seen like one to the path
 * itself. The path is resolved again after every relevant event and every repair, so the
 * watches follow a swapped link to its new target and leave the old one.
 *
 * A change is also told apart by whether what the path now reads is whole (see
 * watch_read()): a rename into place puts a complete file (or link, or directory) there in one
 * step, while an in-place write is seen while the writer may still be writing.
 */
#ifndef RETRYPROXY_CONFIG_WATCH_H
#define RETRYPROXY_CONFIG_WATCH_H

#include <stdbool.h>

struct watch;

/* Watches the directory of 'path'. NULL with errno set if inotify itself is unavailable; a
 * directory that does not exist yet is not an error (see watch_repair()). */
struct watch *watch_new(const char *path);
void watch_free(struct watch *w); /* accepts NULL */

/* The inotify descriptor: readable when events are pending. */
int watch_fd(const struct watch *w);

/* What the events read at once say about the config file. */
enum watch_change {
    WATCH_NONE = 0, /* nothing that concerns it */
    /* It may have changed and may still be changing: an in-place write (IN_MODIFY,
     * IN_CLOSE_WRITE, a regular file created at its name), a metadata change (IN_ATTRIB), a
     * deletion or a rename away from a name on the path (something may take its place), the
     * directory going away, kubelet's ".." entries off the path, or a queue overflow (events
     * were lost). Read it once the events stop. */
    WATCH_IN_PROGRESS,
    /* It changed, and the change is whole: a rename onto a name on the path (an editor's
     * save, kubelet's ..data swap, a link anywhere on the chain re-pointed), or a symlink or
     * directory created at one (the path completed). Nothing changing in place followed it in
     * the same read, except on places the path no longer leads through (kubelet removing the
     * old version). Read it now. */
    WATCH_COMPLETE,
};

/* Reads every pending event and says what they mean for the config file; WATCH_NONE is 0,
 * so the result also reads as "may have changed". Events read together are taken in order:
 * a rename makes what came before it moot, and an in-place change after it makes the whole
 * read WATCH_IN_PROGRESS; an overflow always does. After the directory vanished or moved (its
 * watch dropped), returns WATCH_IN_PROGRESS and watch_active() turns false. */
enum watch_change watch_read(struct watch *w);

/* Whether the directory watch is in place. */
bool watch_active(const struct watch *w);

/* Re-adds a dropped directory watch (the directory came back) and re-resolves the path's
 * symlinks. True if the directory watch is now in place. Cheap: a few lstat and inotify
 * calls. */
bool watch_repair(struct watch *w);

#endif
