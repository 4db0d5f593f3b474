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
    char path[192];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/other", dir);
    unlink(path);
    rmdir(dir);
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
