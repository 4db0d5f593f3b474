/* watch -- notices every way the config file can change (CONTRACT §5).
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

/* Reads every pending event. True when one may concern the config file. After the directory
 * vanished or moved (its watch dropped), returns true and watch_active() turns false. */
bool watch_read(struct watch *w);

/* Whether the directory watch is in place. */
bool watch_active(const struct watch *w);

/* Re-adds a dropped directory watch (the directory came back) and re-resolves the path's
 * symlinks. True if the directory watch is now in place. Cheap: a few lstat and inotify
 * calls. */
bool watch_repair(struct watch *w);

#endif
