/* config/watch: which directory events count as "the config may have changed" (CONTRACT §5),
 * read from a real inotify instance on a temporary directory. The reload integration tests
 * cover the same paths end to end; here the cases are exact, including a queue overflow.
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

Test(watch, other_files_are_ignored_and_the_config_is_seen)
{
    struct watch *w = watch_new(cfg);
    cr_assert_not_null(w);
    cr_assert(watch_active(w));
    cr_expect_not(watch_read(w), "no event yet");
    touch_other();
    cr_expect_not(watch_read(w), "events about another file count");
    write_file("config.json", "{}");
    cr_expect(watch_read(w), "writing the config was missed");
    cr_expect_not(watch_read(w), "events are reported once");
    watch_free(w);
}

Test(watch, kubelet_entries_count)
{
    struct watch *w = watch_new(cfg);
    cr_assert_not_null(w);
    char path[192];
    snprintf(path, sizeof(path), "%s/..data_tmp", dir);
    cr_assert_eq(symlink("nowhere", path), 0);
    cr_expect(watch_read(w), "a new ..data_tmp entry was missed");
    cr_assert_eq(unlink(path), 0);
    watch_free(w);
}

/* More events than the kernel queues for one inotify instance: the kernel drops the rest and
 * queues IN_Q_OVERFLOW. Every dropped event might have been the config's, so an overflow
 * counts as a change even though each event that fitted was about another file; the watch
 * stays in place and keeps reporting. */
Test(watch, queue_overflow_counts_as_a_change_and_the_watch_keeps_working)
{
    long max = 16384;
    FILE *f = fopen("/proc/sys/fs/inotify/max_queued_events", "r");
    if (f) {
        cr_assert_eq(fscanf(f, "%ld", &max), 1);
        fclose(f);
    }
    cr_assert_leq(max, 1L << 20, "max_queued_events %ld: too many events to provoke here", max);
    struct watch *w = watch_new(cfg);
    cr_assert_not_null(w);

    /* Below the limit, the same kind of events is not a change... */
    for (int i = 0; i < 100; i++)
        touch_other();
    cr_expect_not(watch_read(w), "events about another file count");

    /* ...above it, the overflow is. */
    for (long i = 0; i < max / 3 + 100; i++)
        touch_other();
    cr_expect(watch_read(w), "a queue overflow was not reported as a change");
    cr_expect(watch_active(w), "the directory watch was dropped after an overflow");

    cr_expect_not(watch_read(w), "the overflow is reported once");
    write_file("config.json", "{}");
    cr_expect(watch_read(w), "a write after the overflow was missed");
    watch_free(w);
}

Test(watch, removed_directory_drops_the_watch_until_repaired)
{
    struct watch *w = watch_new(cfg);
    cr_assert_not_null(w);
    cr_assert_eq(rmdir(dir), 0);
    cr_expect(watch_read(w), "the directory going away was missed");
    cr_expect_not(watch_active(w));
    cr_expect_not(watch_repair(w), "repaired a directory that does not exist");
    cr_assert_eq(mkdir(dir, 0700), 0);
    cr_expect(watch_repair(w));
    cr_expect(watch_active(w));
    write_file("config.json", "{}");
    cr_expect(watch_read(w), "a write in the re-created directory was missed");
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
    struct watch *w = watch_new(cfg);
    cr_assert_not_null(w);
    cr_expect_not(watch_read(w), "no event yet");
    write_file("..v1/config.json", "{\"a\": 1}");
    cr_expect(watch_read(w), "an in-place write to ..v1/config.json was missed");
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
    struct watch *w = watch_new(cfg);
    cr_assert_not_null(w);
    mkdir_in("..v2");
    write_file("..v2/config.json", "{\"v\": 2}");
    link_as("..data", "..v2");
    cr_expect(watch_read(w), "the ..data swap was missed");

    write_file("..v1/config.json", "{\"old\": 1}");
    cr_expect_not(watch_read(w), "a write to the old target still counts after the swap");
    write_file("..v2/config.json", "{\"v\": 3}");
    cr_expect(watch_read(w), "an in-place write to the new target was missed");

    char path[192];
    snprintf(path, sizeof(path), "%s/..v1/config.json", dir);
    cr_assert_eq(unlink(path), 0);
    snprintf(path, sizeof(path), "%s/..v1", dir);
    cr_assert_eq(rmdir(path), 0);
    watch_read(w); /* kubelet's clean-up: may or may not count, must not break anything */
    cr_expect(watch_active(w));
    write_file("..v2/config.json", "{\"v\": 4}");
    cr_expect(watch_read(w), "a write after the old target was removed was missed");
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
    cr_expect(watch_read(w), "an in-place write at the end of the chain was missed");
    link_as("srv/current", "v2");
    cr_expect(watch_read(w), "re-pointing a directory link in the chain was missed");
    write_file("srv/v1/real.json", "{\"a\": 2}");
    cr_expect_not(watch_read(w), "the old end of the chain still counts");
    write_file("srv/v2/real.json", "{\"a\": 3}");
    cr_expect(watch_read(w), "an in-place write at the new end of the chain was missed");
    watch_free(w);
}

/* A link to a file that does not exist yet: its creation is seen where it will appear. */
Test(watch, dangling_link_target_appearing_is_seen)
{
    mkdir_in("srv");
    link_as("config.json", "srv/later/real.json");
    struct watch *w = watch_new(cfg);
    cr_assert_not_null(w);
    mkdir_in("srv/later");
    cr_expect(watch_read(w), "the missing directory appearing was missed");
    write_file("srv/later/real.json", "{}");
    cr_expect(watch_read(w), "the target file appearing was missed");
    watch_free(w);
}
