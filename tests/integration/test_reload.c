/* Hot reload (docs/reload.md), end to end: the config file rewritten under the real binary in
 * every way editors, operators and kubelet do (in place, by rename, half written, deleted, its
 * directory removed, behind a ConfigMap's symlinks), each seen within a second; observed
 * through the admin API (docs/admin.md) and requests to the test upstream on 127.0.0.1
 * (tests/support/reloadtest.h). What a reload changes: test_reload_applies.c; the files it
 * refuses: test_reload_refuses.c. */
#include "tests/support/reloadtest.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <curl/curl.h>
#include <jansson.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/fixture.h"

TestSuite(reload, .init = rl_setup, .fini = rl_teardown, .timeout = 60);

Test(reload, editor_save_by_rename_applies_within_a_second)
{
    rl_start(3, 20);
    expect_max_attempts("before", 3);
    cr_assert_eq(schedule_delay(), 20);

    char text[2048];
    cfg_simple(text, sizeof(text), 1, 40);
    int64_t t0 = now_ms();
    write_renamed(rl_cfg_path, text);
    int64_t lat = wait_config(t0, 2, 40, VISIBLE_MS);
    cr_log_info("editor save (rename): new generation visible after %lld ms", (long long)lat);
    cr_assert(lat >= 0,
              "generation 2 with base_ms 40 not visible within %d ms (generation %ld, "
              "base_ms %ld)",
              VISIBLE_MS, generation_now(), base_ms_now());
    cr_expect_eq(generation_now(), 2, "one save, one generation");
    expect_trigger(2, "replaced", "editor save");
    cr_expect_eq(schedule_delay(), 40, "/schedule uses the new policy");
    expect_max_attempts("after", 1);
}

Test(reload, in_place_truncating_write_applies)
{
    rl_start(3, 20);
    char text[2048];
    cfg_simple(text, sizeof(text), 1, 40);
    int64_t t0 = now_ms();
    write_in_place(rl_cfg_path, text, strlen(text));
    int64_t lat = wait_config(t0, 2, 40, VISIBLE_MS);
    cr_log_info("in-place write: new generation visible after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "in-place write not applied within %d ms (generation %ld, base_ms %ld)",
              VISIBLE_MS, generation_now(), base_ms_now());
    cr_expect_eq(generation_now(), 2);
    expect_trigger(2, "changed", "in-place write");
    cr_expect_eq(schedule_delay(), 40);
    cr_expect_eq(fx_metric(FAILURES), 0, "a truncating write must not be read half-done");
    expect_max_attempts("after", 1);
}

/* kubelet's atomic writer: DIR/..TIMESTAMP/config.json (real), DIR/..data -> ..TIMESTAMP,
 * DIR/config.json -> ..data/config.json. An update renames a new ..data symlink over the old
 * one; the file the proxy was told about is never itself written, created or renamed. */
static void kube_version(int i, char *name, size_t cap, const char *text)
{
    snprintf(name, cap, "..2026_01_15_10_00_%02d.%09d", i, 123456789 - i);
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", rl_dir, name);
    cr_assert_eq(mkdir(path, 0755), 0, "mkdir %s: %s", path, strerror(errno));
    snprintf(path, sizeof(path), "%s/%s/config.json", rl_dir, name);
    write_in_place(path, text, strlen(text));
    cr_assert_eq(chmod(path, 0644), 0);
}

static void kube_remove(const char *name)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s/config.json", rl_dir, name);
    cr_assert_eq(unlink(path), 0, "unlink %s: %s", path, strerror(errno));
    snprintf(path, sizeof(path), "%s/%s", rl_dir, name);
    cr_assert_eq(rmdir(path), 0, "rmdir %s: %s", path, strerror(errno));
}

Test(reload, kubelet_configmap_symlink_swap_applies_every_version)
{
    char text[2048], cur[64], next[64], path[256], tmp[256];
    cfg_simple(text, sizeof(text), 3, 10);
    kube_version(0, cur, sizeof(cur), text);
    snprintf(path, sizeof(path), "%s/..data", rl_dir);
    cr_assert_eq(symlink(cur, path), 0);
    cr_assert_eq(symlink("..data/config.json", rl_cfg_path), 0);
    rl_launch(true);
    cr_assert_eq(generation_now(), 1);
    cr_assert_eq(base_ms_now(), 10);

    int64_t worst = 0, total = 0;
    for (int i = 1; i <= 10; i++) {
        long base = 10L * (i + 1);
        cfg_simple(text, sizeof(text), 3, (int)base);
        kube_version(i, next, sizeof(next), text);
        snprintf(tmp, sizeof(tmp), "%s/..data_tmp", rl_dir);
        cr_assert_eq(symlink(next, tmp), 0, "symlink: %s", strerror(errno));
        int64_t t0 = now_ms();
        cr_assert_eq(rename(tmp, path), 0, "rename ..data_tmp: %s", strerror(errno));
        kube_remove(cur);
        snprintf(cur, sizeof(cur), "%s", next);

        int64_t lat = wait_config(t0, -1, base, VISIBLE_MS);
        cr_assert(lat >= 0, "swap %d: base_ms %ld not visible within %d ms (base_ms %ld)", i, base,
                  VISIBLE_MS, base_ms_now());
        /* Every version differs, so every swap is exactly one generation: none skipped and
         * none applied twice. */
        cr_assert_eq(generation_now(), 1 + i, "swap %d: generation %ld, want %d", i,
                     generation_now(), 1 + i);
        /* The swap is whole when its event arrives: read at once, not after the debounce. */
        expect_trigger(1 + i, "replaced", "kubelet swap");
        worst = lat > worst ? lat : worst;
        total += lat;
    }
    cr_log_info("kubelet swap x10: mean %lld ms, worst %lld ms", (long long)(total / 10),
                (long long)worst);
    cr_expect_eq(schedule_delay(), 110);
    cr_expect_eq(fx_metric(FAILURES), 0, "no swap may expose a missing or partial file");
    cr_expect_eq(fx_metric(SUCCESSES), 11, "the start and the ten swaps");
}

/* The line and column (1-based) where 'needle' starts in 'text'. */
Test(reload, half_written_file_fails_once_then_the_full_write_applies)
{
    rl_start(3, 20);
    char text[2048], err[4096];
    cfg_simple(text, sizeof(text), 1, 40);
    size_t len = strlen(text);
    int64_t t0 = now_ms();
    write_in_place(rl_cfg_path, text, len / 2);
    /* read after the debounce and refused: waited on, not a fixed 500 ms (SETTLE_MS) that a
     * loaded machine may overrun */
    cr_assert_geq(rl_wait_metric(t0, FAILURES, 1, EVENT_MS), 0,
                  "the half file's failure was not counted within %d ms", EVENT_MS);

    json_t *c = rl_get_config();
    cr_expect_eq(generation_of(c), 1, "half a file must not be published");
    cr_expect_eq(base_ms_of(c), 20);
    cr_expect_not_null(last_error_of(c, err, sizeof(err)), "the half file's failure is reported");
    json_decref(c);
    cr_expect_eq(fx_metric(FAILURES), 1);
    expect_max_attempts("half", 3);

    /* Rewritten whole in place (the writer finishing its job). */
    t0 = now_ms();
    write_in_place(rl_cfg_path, text, len);
    int64_t lat = wait_config(t0, 2, 40, VISIBLE_MS);
    cr_log_info("completed file: applied after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "the completed file was not applied within %d ms (generation %ld)",
              VISIBLE_MS, generation_now());
    c = rl_get_config();
    cr_expect_eq(generation_of(c), 2);
    cr_expect_null(last_error_of(c, err, sizeof(err)), "last_error stays after success: %s", err);
    json_decref(c);
    cr_expect_eq(fx_metric(FAILURES), 1);
    expect_max_attempts("whole", 1);
}

Test(reload, deleted_file_keeps_serving_and_a_recreated_one_applies)
{
    rl_start(3, 20);
    char err[4096];
    cr_assert_eq(unlink(rl_cfg_path), 0);
    int64_t t0 = now_ms();
    const char *e = NULL;
    while (!e && now_ms() - t0 < VISIBLE_MS) {
        json_t *c = rl_get_config();
        e = last_error_of(c, err, sizeof(err));
        json_decref(c);
        if (!e)
            sleep_ms(20);
    }
    cr_log_info("deleted file: reported after %lld ms", (long long)(now_ms() - t0));
    cr_assert_not_null(e, "no last_error within %d ms of deleting the config", VISIBLE_MS);
    cr_expect(strstr(e, "cannot open") != NULL, "last_error does not say so: %s", e);
    cr_expect_eq(generation_now(), 1);
    cr_expect_eq(base_ms_now(), 20);
    cr_expect_eq(fx_metric(FAILURES), 1);
    long status;
    cr_expect_eq(rl_attempts("plain", "", &status), 1);
    cr_expect_eq(status, 200, "the proxy stops serving without its file");
    expect_max_attempts("gone", 3);

    char text[2048];
    cfg_simple(text, sizeof(text), 1, 40);
    t0 = now_ms();
    write_in_place(rl_cfg_path, text, strlen(text));
    int64_t lat = wait_config(t0, 2, 40, VISIBLE_MS);
    cr_log_info("re-created file: applied after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "the re-created file was not applied within %d ms", VISIBLE_MS);
    json_t *c = rl_get_config();
    cr_expect_eq(generation_of(c), 2);
    cr_expect_null(last_error_of(c, err, sizeof(err)), "last_error stays after success: %s", err);
    json_decref(c);
    expect_max_attempts("back", 1);
}

Test(reload, watch_survives_its_directory_being_removed_and_recreated)
{
    rl_start(3, 20);
    char err[4096];
    cr_assert_eq(unlink(rl_cfg_path), 0);
    cr_assert_eq(rmdir(rl_dir), 0, "rmdir %s: %s", rl_dir, strerror(errno));
    sleep_ms(300);
    json_t *c = rl_get_config();
    cr_expect_not_null(last_error_of(c, err, sizeof(err)), "the missing file is reported");
    cr_expect_eq(generation_of(c), 1);
    json_decref(c);
    expect_max_attempts("homeless", 3);

    cr_assert_eq(mkdir(rl_dir, 0700), 0, "mkdir %s: %s", rl_dir, strerror(errno));
    char text[2048];
    cfg_simple(text, sizeof(text), 1, 40);
    int64_t t0 = now_ms();
    write_in_place(rl_cfg_path, text, strlen(text));
    /* The old directory watch died with its directory; the 2 s poll re-adds it. */
    int64_t lat = wait_config(t0, 2, 40, 6000);
    cr_log_info("directory re-created: applied after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "the config in the re-created directory not applied within 6 s");
    cr_expect_eq(generation_now(), 2);

    /* And the watch is live again: the next write is seen at inotify speed, not the poll's. */
    cfg_simple(text, sizeof(text), 1, 60);
    t0 = now_ms();
    write_renamed(rl_cfg_path, text);
    lat = wait_config(t0, 3, 60, VISIBLE_MS);
    cr_log_info("first write after the watch came back: applied after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "write after the directory came back not applied within %d ms", VISIBLE_MS);
    expect_max_attempts("rehomed", 1);
}

Test(reload, unchanged_content_rewritten_is_not_a_new_generation)
{
    rl_start(3, 20);
    char text[2048];
    cfg_simple(text, sizeof(text), 3, 20);
    double ok0 = fx_metric(SUCCESSES);
    cr_assert_eq(ok0, 1, "the start-up load counts as one success");

    /* touch: only the metadata changes. */
    cr_assert_eq(utimensat(AT_FDCWD, rl_cfg_path, NULL, 0), 0);
    sleep_ms(SETTLE_MS);
    cr_expect_eq(generation_now(), 1, "touch made a new generation");
    /* the same bytes, in place */
    write_in_place(rl_cfg_path, text, strlen(text));
    sleep_ms(SETTLE_MS);
    cr_expect_eq(generation_now(), 1, "rewriting the same bytes in place made a new generation");
    /* the same bytes, saved through a rename (a new inode) */
    write_renamed(rl_cfg_path, text);
    /* Long enough for the 2 s content poll to have looked too. */
    sleep_ms(2200);
    json_t *c = rl_get_config();
    char err[4096];
    cr_expect_eq(generation_of(c), 1, "saving the same bytes made a new generation");
    cr_expect_null(last_error_of(c, err, sizeof(err)), "unchanged content reported: %s", err);
    json_decref(c);
    cr_expect_eq(fx_metric(FAILURES), 0);
    cr_expect_eq(fx_metric(SUCCESSES), ok0, "unchanged content counted as a reload");

    /* The watch was alive all along: a real change is applied. */
    cfg_simple(text, sizeof(text), 3, 30);
    int64_t t0 = now_ms();
    write_in_place(rl_cfg_path, text, strlen(text));
    int64_t lat = wait_config(t0, 2, 30, VISIBLE_MS);
    cr_assert(lat >= 0, "a real change after the no-ops was not applied within %d ms", VISIBLE_MS);
    cr_expect_eq(generation_now(), 2);
}

/* The operator's loop this feature exists for: change cap_ms in the file while traffic flows,
 * and see the new delays in /schedule and in the metrics within a second. Exponential base
 * 100 factor 4 without jitter waits 100 then min(400, cap_ms): cap 100 gives 100 100, cap 400
 * gives 100 400, and backoff_seconds observes the delays the requests were given. */
Test(reload, in_place_write_behind_a_configmap_symlink_applies_within_a_second)
{
    char text[2048], cur[64], path[256], real[256];
    cfg_simple(text, sizeof(text), 3, 10);
    kube_version(0, cur, sizeof(cur), text);
    snprintf(path, sizeof(path), "%s/..data", rl_dir);
    cr_assert_eq(symlink(cur, path), 0);
    cr_assert_eq(symlink("..data/config.json", rl_cfg_path), 0);
    snprintf(real, sizeof(real), "%s/%s/config.json", rl_dir, cur);
    rl_launch(true);
    cr_assert_eq(generation_now(), 1);

    int64_t worst = 0, total = 0;
    const int rounds = 5;
    for (int i = 1; i <= rounds; i++) {
        long base = 10L * (i + 1);
        cfg_simple(text, sizeof(text), 3, (int)base);
        int64_t t0 = now_ms();
        write_in_place(real, text, strlen(text));
        int64_t lat = wait_config(t0, 1 + i, base, 3000);
        cr_log_info("in-place write %d behind the symlinks: applied after %lld ms", i,
                    (long long)lat);
        cr_assert(lat >= 0, "write %d: base_ms %ld not applied within 3 s", i, base);
        cr_expect_lt(lat, 1000, "write %d applied after %lld ms: only the poll saw it?", i,
                     (long long)lat);
        worst = lat > worst ? lat : worst;
        total += lat;
        sleep_ms(300 + 170 * i); /* another phase of the 2 s poll for the next write */
    }
    cr_log_info("in-place write behind symlinks x%d: mean %lld ms, worst %lld ms", rounds,
                (long long)(total / rounds), (long long)worst);

    /* After a kubelet swap the watch follows the link to the new directory. */
    char next[64], tmp[256];
    cfg_simple(text, sizeof(text), 3, 500);
    kube_version(9, next, sizeof(next), text);
    snprintf(tmp, sizeof(tmp), "%s/..data_tmp", rl_dir);
    cr_assert_eq(symlink(next, tmp), 0);
    int64_t t0 = now_ms();
    cr_assert_eq(rename(tmp, path), 0);
    kube_remove(cur);
    cr_assert_geq(wait_config(t0, -1, 500, VISIBLE_MS), 0, "the swap was not applied");
    snprintf(real, sizeof(real), "%s/%s/config.json", rl_dir, next);
    cfg_simple(text, sizeof(text), 3, 600);
    t0 = now_ms();
    write_in_place(real, text, strlen(text));
    int64_t lat = wait_config(t0, -1, 600, 3000);
    cr_log_info("in-place write after a swap: applied after %lld ms", (long long)lat);
    cr_assert(lat >= 0, "the write after the swap was not applied within 3 s");
    cr_expect_lt(lat, 1000, "the write after the swap applied after %lld ms", (long long)lat);
    cr_expect_eq(fx_metric(FAILURES), 0, "an in-place write must not be read half-done");
}

/* ---- issue 10: a config that arrives whole is applied at once ---- */

/* The cases around the debounce, each proven by the reload's own log line rather than by
 * the clock: a rename while an in-place write's debounce is pending is read at once (and the
 * debounce, cancelled, publishes nothing more: the same content would be a no-op anyway); a
 * rename followed by in-place writes ends with the written content, read after the debounce;
 * a deletion and a re-creation through a symlink. */
Test(reload, rename_during_a_pending_debounce_applies_at_once_and_writes_after_a_rename_apply)
{
    rl_start(3, 20);
    char text[2048];

    /* An in-place write arms the debounce; the rename that follows at once is read at once
     * (or, on a machine slow enough to let the debounce end between the two, after the
     * write's own generation). */
    cfg_simple(text, sizeof(text), 3, 30);
    write_in_place(rl_cfg_path, text, strlen(text));
    cfg_simple(text, sizeof(text), 3, 40);
    int64_t t0 = now_ms();
    write_renamed(rl_cfg_path, text);
    cr_assert_geq(wait_config(t0, 2, 40, VISIBLE_MS), 0, "the rename was not applied");
    long gen = generation_now();
    cr_assert(gen == 2 || gen == 3, "generation %ld after a write and a rename", gen);
    expect_trigger(gen, "replaced", "rename during a pending debounce");
    sleep_ms(SETTLE_MS); /* past the debounce the write armed */
    cr_expect_eq(generation_now(), gen, "the pending debounce published the same content again");
    cr_expect_eq(fx_metric(SUCCESSES), gen, "one success per generation");
    cr_expect_eq(fx_metric(FAILURES), 0);

    /* A rename, then the new file written further in place: whatever the rename's own read
     * found, the written content is what stays, and it is read after the debounce (or, when
     * the write came before the rename's read, by that read). */
    cfg_simple(text, sizeof(text), 3, 50);
    write_renamed(rl_cfg_path, text);
    cfg_simple(text, sizeof(text), 2, 60);
    t0 = now_ms();
    write_in_place(rl_cfg_path, text, strlen(text));
    cr_assert_geq(wait_config(t0, -1, 60, VISIBLE_MS), 0, "the write after a rename was lost");
    sleep_ms(SETTLE_MS);
    cr_expect_eq(base_ms_now(), 60, "the written content did not stay");
    char err[4096];
    json_t *c = rl_get_config();
    cr_expect_null(last_error_of(c, err, sizeof(err)), "the written content failed: %s", err);
    json_decref(c);
    expect_max_attempts("written", 2);

    /* Deleted: reported after the debounce, as before; the path completed again by a symlink
     * to a whole file is read at once. */
    gen = generation_now();
    double failures = fx_metric(FAILURES);
    cr_assert_eq(unlink(rl_cfg_path), 0);
    t0 = now_ms();
    cr_assert_geq(rl_wait_metric(t0, FAILURES, failures + 1, VISIBLE_MS), 0,
                  "the deletion was not reported");
    char real[160];
    snprintf(real, sizeof(real), "%s/real.json", rl_dir);
    cfg_simple(text, sizeof(text), 1, 70);
    write_in_place(real, text, strlen(text));
    t0 = now_ms();
    cr_assert_eq(symlink("real.json", rl_cfg_path), 0, "symlink: %s", strerror(errno));
    cr_assert_geq(wait_config(t0, gen + 1, 70, VISIBLE_MS), 0, "the symlink was not applied");
    expect_trigger(gen + 1, "replaced", "symlink made at the path");
    expect_max_attempts("linked", 1);
}
