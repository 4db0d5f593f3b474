/* config/watch: which directory events count as "the config may have changed" (docs/reload.md),
 * and which of those are complete (a rename into place: reloaded at once) or in progress (an
 * in-place write: reloaded after the debounce), read from a real inotify instance on a
 * temporary directory. The reload integration tests cover the same paths end to end; here the
 * cases are exact, including a queue overflow.
 */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/watch.h"
#include "tests/support/harness.h"

static char dir[64];
static char cfg[128];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/rp-watch-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
}

static void teardown(void)
{
    rm_tree(dir);
}

TestSuite(watch, .init = setup, .fini = teardown, .timeout = 30);

/* Creates (or truncates) dir/name with 'text' and closes it. */
static void write_file(const char *name, const char *text)
{
    char path[192];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

/* One create, close-write and delete of dir/other: three events about another file. */
static void touch_other(void)
{
    char path[192];
    snprintf(path, sizeof(path), "%s/other", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(unlink(path), 0);
}

/* A watch on the test's config path (asserted). */
static struct watch *watch_open(void)
{
    struct watch *w = watch_new(cfg);
    cr_assert_not_null(w);
    return w;
}

/* The kernel's inotify queue length (16384 if it cannot be read), asserted small enough to
 * overflow from a test. */
static long max_queued_events(void)
{
    long max = 16384;
    FILE *f = fopen("/proc/sys/fs/inotify/max_queued_events", "r");
    if (f) {
        cr_assert_eq(fscanf(f, "%ld", &max), 1);
        fclose(f);
    }
    cr_assert_leq(max, 1L << 20, "max_queued_events %ld: too many events to provoke here", max);
    return max;
}

Test(watch, other_files_are_ignored_and_the_config_is_seen)
{
    struct watch *w = watch_open();
    cr_assert(watch_active(w));
    cr_expect_not(watch_read(w), "no event yet");
    touch_other();
    cr_expect_not(watch_read(w), "events about another file count");
    write_file("config.json", "{}");
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS, "writing the config was missed");
    cr_expect_not(watch_read(w), "events are reported once");
    watch_free(w);
}

Test(watch, kubelet_entries_count)
{
    struct watch *w = watch_open();
    char path[192];
    snprintf(path, sizeof(path), "%s/..data_tmp", dir);
    cr_assert_eq(symlink("nowhere", path), 0);
    /* Off the path: worth a read, but it completes nothing. */
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS, "a new ..data_tmp entry was missed");
    cr_assert_eq(unlink(path), 0);
    watch_free(w);
}

/* More events than the kernel queues for one inotify instance: the kernel drops the rest and
 * queues IN_Q_OVERFLOW. Every dropped event might have been the config's, so an overflow
 * counts as a change even though each event that fitted was about another file; the watch
 * stays in place and keeps reporting. */
Test(watch, queue_overflow_counts_as_a_change_and_the_watch_keeps_working)
{
    long max = max_queued_events();
    struct watch *w = watch_open();

    /* Below the limit, the same kind of events is not a change... */
    for (int i = 0; i < 100; i++)
        touch_other();
    cr_expect_not(watch_read(w), "events about another file count");

    /* ...above it, the overflow is. */
    for (long i = 0; i < max / 3 + 100; i++)
        touch_other();
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS,
                 "a queue overflow was not reported as a change in progress");
    cr_expect(watch_active(w), "the directory watch was dropped after an overflow");

    cr_expect_not(watch_read(w), "the overflow is reported once");
    write_file("config.json", "{}");
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS, "a write after the overflow was missed");
    watch_free(w);
}

Test(watch, removed_directory_drops_the_watch_until_repaired)
{
    struct watch *w = watch_open();
    cr_assert_eq(rmdir(dir), 0);
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS, "the directory going away was missed");
    cr_expect_not(watch_active(w));
    cr_expect_not(watch_repair(w), "repaired a directory that does not exist");
    cr_assert_eq(mkdir(dir, 0700), 0);
    cr_expect(watch_repair(w));
    cr_expect(watch_active(w));
    write_file("config.json", "{}");
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS,
                 "a write in the re-created directory was missed");
    watch_free(w);
}

/* ---- a path through symlinks ---- */

static void mkdir_in(const char *name)
{
    char path[192];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    cr_assert_eq(mkdir(path, 0755), 0, "mkdir %s", path);
}

/* dir/name -> target, made under a temporary name and renamed into place (kubelet's way). */
static void link_as(const char *name, const char *target)
{
    char path[192], tmp[192];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(tmp, sizeof(tmp), "%s/%s.tmp", dir, name);
    cr_assert_eq(symlink(target, tmp), 0, "symlink %s", tmp);
    cr_assert_eq(rename(tmp, path), 0, "rename %s", tmp);
}

/* kubelet's layout: config.json -> ..data/config.json, ..data -> ..v1, ..v1/config.json. */
static void configmap(void)
{
    mkdir_in("..v1");
    write_file("..v1/config.json", "{}");
    link_as("..data", "..v1");
    link_as("config.json", "..data/config.json");
}

/* An in-place write to the file the links lead to happens in a directory other than the
 * config path's: it is seen through the watch on where the path leads. Without it only the
 * 2 s content poll noticed (0.4 to 2 s later). */
Test(watch, in_place_write_through_a_configmap_symlink_chain_is_seen)
{
    configmap();
    struct watch *w = watch_open();
    cr_expect_not(watch_read(w), "no event yet");
    write_file("..v1/config.json", "{\"a\": 1}");
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS,
                 "an in-place write to ..v1/config.json was missed");
    cr_expect_not(watch_read(w), "events are reported once");
    write_file("..v1/other", "x");
    cr_expect_not(watch_read(w), "another file in the target's directory counts");
    watch_free(w);
}

/* After kubelet's swap (..data renamed to point at ..v2, ..v1 removed) the path leads to
 * ..v2/config.json: writes there are seen, and the old target is no longer watched. */
Test(watch, configmap_swap_moves_the_watch_to_the_new_target)
{
    configmap();
    struct watch *w = watch_open();
    mkdir_in("..v2");
    write_file("..v2/config.json", "{\"v\": 2}");
    link_as("..data", "..v2");
    cr_expect_eq(watch_read(w), WATCH_COMPLETE, "the ..data swap was not seen complete");

    write_file("..v1/config.json", "{\"old\": 1}");
    cr_expect_not(watch_read(w), "a write to the old target still counts after the swap");
    write_file("..v2/config.json", "{\"v\": 3}");
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS,
                 "an in-place write to the new target was missed");

    char path[192];
    snprintf(path, sizeof(path), "%s/..v1/config.json", dir);
    cr_assert_eq(unlink(path), 0);
    snprintf(path, sizeof(path), "%s/..v1", dir);
    cr_assert_eq(rmdir(path), 0);
    watch_read(w); /* kubelet's clean-up: may or may not count, must not break anything */
    cr_expect(watch_active(w));
    write_file("..v2/config.json", "{\"v\": 4}");
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS,
                 "a write after the old target was removed was missed");
    watch_free(w);
}

/* Links in other directories, absolute and relative, one of them a directory link in the
 * middle of the path: each link's directory is watched for that link, and the file at the
 * end for itself. Re-pointing any link moves the watch. */
Test(watch, chain_of_links_across_directories_is_followed)
{
    mkdir_in("etc");
    mkdir_in("srv");
    mkdir_in("srv/v1");
    mkdir_in("srv/v2");
    write_file("srv/v1/real.json", "{}");
    write_file("srv/v2/real.json", "{}");
    link_as("srv/current", "v1");
    char target[192];
    snprintf(target, sizeof(target), "%s/srv/current/real.json", dir);
    link_as("etc/config.json", target);
    char path[192];
    snprintf(path, sizeof(path), "%s/etc/config.json", dir);
    struct watch *w = watch_new(path);
    cr_assert_not_null(w);

    write_file("srv/v1/real.json", "{\"a\": 1}");
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS,
                 "an in-place write at the end of the chain was missed");
    link_as("srv/current", "v2");
    cr_expect_eq(watch_read(w), WATCH_COMPLETE,
                 "re-pointing a directory link in the chain was not seen complete");
    write_file("srv/v1/real.json", "{\"a\": 2}");
    cr_expect_not(watch_read(w), "the old end of the chain still counts");
    write_file("srv/v2/real.json", "{\"a\": 3}");
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS,
                 "an in-place write at the new end of the chain was missed");
    watch_free(w);
}

/* A link to a file that does not exist yet: its creation is seen where it will appear. */
Test(watch, dangling_link_target_appearing_is_seen)
{
    mkdir_in("srv");
    link_as("config.json", "srv/later/real.json");
    struct watch *w = watch_open();
    mkdir_in("srv/later");
    cr_expect_eq(watch_read(w), WATCH_COMPLETE,
                 "the missing directory appearing was not seen complete");
    write_file("srv/later/real.json", "{}");
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS, "the target file appearing was missed");
    watch_free(w);
}

/* ---- complete or in progress ---- */

/* dir/name replaced through rename(2) from dir/name.new, written whole first (an editor's
 * save). */
static void save_as(const char *name, const char *text)
{
    char tmp[192], path[192];
    snprintf(tmp, sizeof(tmp), "%s.new", name);
    write_file(tmp, text);
    snprintf(tmp, sizeof(tmp), "%s/%s.new", dir, name);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    cr_assert_eq(rename(tmp, path), 0, "rename %s: %m", tmp);
}

/* The issue-10 distinction: a rename into place is whole when its event arrives (reloaded at
 * once); an in-place write may be half done (reloaded after the debounce). A save whose
 * temporary file is written in another read still comes out complete: the temporary file is
 * not the config. */
Test(watch, rename_into_place_is_complete_and_an_in_place_write_in_progress)
{
    write_file("config.json", "{}");
    struct watch *w = watch_open();
    save_as("config.json", "{\"a\": 1}");
    cr_expect_eq(watch_read(w), WATCH_COMPLETE, "a rename into place was not seen complete");
    cr_expect_eq(watch_read(w), WATCH_NONE, "events are reported once");
    write_file("config.json", "{\"a\": 2}");
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS, "an in-place write was seen complete");
    write_file("config.json.new", "{\"a\": 3}");
    cr_expect_eq(watch_read(w), WATCH_NONE, "the temporary file counts");
    char tmp[192];
    snprintf(tmp, sizeof(tmp), "%s/config.json.new", dir);
    cr_assert_eq(rename(tmp, cfg), 0);
    cr_expect_eq(watch_read(w), WATCH_COMPLETE, "a rename after its file was written apart");
    watch_free(w);
}

/* Events read together are taken in order: a rename makes earlier in-place writes moot, and
 * an in-place write after a rename (the new file written further) leaves it unfinished. */
Test(watch, events_read_together_are_taken_in_order)
{
    write_file("config.json", "{}");
    struct watch *w = watch_open();
    write_file("config.json", "{\"a\": 1}");
    cr_assert_eq(chmod(cfg, 0600), 0);
    save_as("config.json", "{\"a\": 2}");
    cr_expect_eq(watch_read(w), WATCH_COMPLETE, "in-place changes before a rename count");

    save_as("config.json", "{\"a\": 3}");
    write_file("config.json", "{\"a\": 4}");
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS, "a write after the rename was ignored");

    save_as("config.json", "{\"a\": 5}");
    cr_assert_eq(utimensat(AT_FDCWD, cfg, NULL, 0), 0);
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS, "a touch after the rename was ignored");
    watch_free(w);
}

/* The path made whole by a symlink is complete; a regular file created at the path is about
 * to be written, and a deletion or a rename away leaves the name open for what comes next:
 * both in progress (the debounce keeps a delete-then-recreate from being read in between). */
Test(watch, creation_deletion_and_renaming_away)
{
    struct watch *w = watch_open();
    write_file("real.json", "{}");
    cr_expect_eq(watch_read(w), WATCH_NONE, "another file counts");
    cr_assert_eq(symlink("real.json", cfg), 0);
    cr_expect_eq(watch_read(w), WATCH_COMPLETE, "a symlink made at the path is not complete");
    cr_assert_eq(unlink(cfg), 0);
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS, "a deletion was seen complete or missed");
    int fd = open(cfg, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0);
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS, "a file created empty was seen complete");
    cr_assert_eq(write(fd, "{}", 2), 2);
    close(fd);
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS, "its write was seen complete");
    char away[192];
    snprintf(away, sizeof(away), "%s/config.json~", dir);
    cr_assert_eq(rename(cfg, away), 0);
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS, "a rename away was seen complete or missed");
    watch_free(w);
}

/* kubelet's whole update, read at once: the new version's directory and ..data_tmp (off the
 * path), the swap, and the old version removed. The removal concerns the file the path used
 * to lead to, not the one it leads to now: the read is complete. */
Test(watch, kubelet_update_with_its_clean_up_is_complete)
{
    configmap();
    struct watch *w = watch_open();
    mkdir_in("..v2");
    write_file("..v2/config.json", "{\"v\": 2}");
    link_as("..data", "..v2");
    char path[192];
    snprintf(path, sizeof(path), "%s/..v1/config.json", dir);
    cr_assert_eq(unlink(path), 0);
    snprintf(path, sizeof(path), "%s/..v1", dir);
    cr_assert_eq(rmdir(path), 0);
    cr_expect_eq(watch_read(w), WATCH_COMPLETE, "kubelet's update was not seen complete");
    cr_expect(watch_active(w));
    write_file("..v2/config.json", "{\"v\": 3}");
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS, "an in-place write to the new target");
    watch_free(w);
}

/* Events were lost: whatever came with the overflow, even a rename, cannot be trusted to be
 * the last word. */
Test(watch, overflow_with_a_rename_is_in_progress)
{
    long max = max_queued_events();
    write_file("config.json", "{}");
    struct watch *w = watch_open();
    for (long i = 0; i < max / 3 + 100; i++)
        touch_other();
    save_as("config.json", "{\"a\": 1}");
    cr_expect_eq(watch_read(w), WATCH_IN_PROGRESS, "an overflow was trusted");
    save_as("config.json", "{\"a\": 2}");
    cr_expect_eq(watch_read(w), WATCH_COMPLETE, "a rename after the overflow was read");
    watch_free(w);
}
