/* Durable routes end to end (docs/delivery.md) across restarts: an attempt in flight when the
 * proxy is killed, an upstream down at the accept, a store on tmpfs, and the crash test (every
 * 202 arrives, duplicates bounded). The real binary, a real SQLite file, the test upstream. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/durabletest.h"

TestSuite(durable, .init = dur_setup, .fini = fx_stop);

/* An attempt in flight when the process is killed: at the next start it is made again at once
 * (the lease's 30 s and more are not waited out), the lost one recorded. */
Test(durable, killed_during_an_attempt_then_resumed_at_start)
{
    char *json = dur_cfg("", "", "", ", \"timeout_ms\": 60000");
    fx_start(json, "--workers", "2", NULL);
    const char *plan[] = { "X-Test-Plan: fail=1; action=hang", NULL };
    char id[33];
    dur_post_accepted("crash-1", "x", plan, id);
    fx_wait_upstream("crash-1", 1); /* the first attempt hangs */
    kill(px->pid, SIGKILL);
    px_stop(px, 5000);
    px = NULL;
    cr_assert_eq(dur_state_of(id), 1, "in flight when killed");
    fx_start(json, "--workers", "2", NULL);
    free(json);
    dur_wait_state(id, 2, 10000);
    cr_assert_eq(tup_count_id(up, "crash-1"), 2);
    cr_assert_eq(dur_db_int("SELECT count(*) FROM attempts WHERE delivery = ?1 AND "
                            "outcome = 'lease_expired'",
                            id),
                 1);
}

/* The upstream down at the accept and when the proxy is killed; up when it starts again. */
Test(durable, accepted_while_the_upstream_is_down_delivered_after_a_restart)
{
    uint16_t port = fx_free_port();
    char route[96];
    snprintf(route, sizeof(route), ", \"upstreams\": [\"http://127.0.0.1:%u\"]", (unsigned)port);
    char *json = dur_cfg("", "", "", route);
    fx_start(json, "--workers", "2", NULL);
    char id[33];
    dur_post_accepted("down-1", "payload", NULL, id);
    usleep(500 * 1000); /* an attempt or two refused */
    kill(px->pid, SIGKILL);
    px_stop(px, 5000);
    px = NULL;
    struct tup *later = tup_start_port(port);
    fx_start(json, "--workers", "2", NULL);
    free(json);
    dur_wait_state(id, 2, 10000);
    cr_assert_eq(tup_count_id(later, "down-1"), 1);
    cr_assert_str_eq(tup_req_header(tup_get(later, 0), "webhook-id"), id);
    tup_stop(later);
}

/* A store on tmpfs is lost at every reboot: `check` and the start say so. */
Test(durable, a_store_on_tmpfs_is_warned_of_by_check_and_at_start)
{
    char shm[64];
    snprintf(shm, sizeof(shm), "/dev/shm/retryproxy-durable-XXXXXX");
    cr_assert_not_null(mkdtemp(shm));
    snprintf(dur_store_path, sizeof(dur_store_path), "%s/store.db", shm);
    char *json = dur_cfg("", "", "", "");
    char cfg[192], cmd[600];
    snprintf(cfg, sizeof(cfg), "%s/config.json", shm);
    FILE *f = fopen(cfg, "w");
    cr_assert_not_null(f);
    fputs(json, f);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "%s check -c %s 2>%s/err >/dev/null && grep -q 'is on tmpfs' %s/err",
             getenv("RETRYPROXY_BIN"), cfg, shm, shm);
    cr_expect_eq(fx_sh(cmd), 0, "check warns of tmpfs");
    fx_start(json, "--workers", "1", NULL);
    free(json);
    json_t *line = fx_logged("delivery store on tmpfs: lost at reboot, or with its pod", "path",
                             dur_store_path);
    cr_expect_not_null(line, "the start warns of tmpfs");
    json_decref(line);
    px_stop(px, 10000);
    px = NULL;
    snprintf(cmd, sizeof(cmd), "rm -rf %s", shm);
    fx_sh(cmd);
    /* and a store on a disk is not warned of */
    snprintf(dur_store_path, sizeof(dur_store_path), "%s",
             dur_disk_store); /* fx_stop removes its dir */
    json = dur_cfg("", "", "", "");
    snprintf(cfg, sizeof(cfg), "%s.json", dur_store_path);
    f = fopen(cfg, "w");
    fputs(json, f);
    fclose(f);
    free(json);
    snprintf(cmd, sizeof(cmd), "%s check -c %s 2>&1 | grep -q tmpfs", getenv("RETRYPROXY_BIN"),
             cfg);
    cr_expect_neq(fx_sh(cmd), 0, "no warning for a disk");
}

/* ---- the crash test (issue 39, "How it is checked") ---- */

#define CRASHES   25    /* SIGKILLs, each followed by a start on the same file */
#define CRASH_MAX 20000 /* requests the sender may send at most */

/* The sender: durable requests one after another to whichever proxy runs now, each with an
 * X-Request-Id of its own; those answered 202 are the ones that must arrive. */
static struct {
    pthread_mutex_t mu;
    uint16_t port; /* 0 while the proxy is down */
    atomic_bool stop;
    size_t n, acked;
    char acked_ids[CRASH_MAX][16];
    char delivery[CRASH_MAX][33];
} snd = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void *sender(void *arg)
{
    (void)arg;
    while (!atomic_load(&snd.stop) && snd.n < CRASH_MAX) {
        pthread_mutex_lock(&snd.mu);
        uint16_t port = snd.port;
        pthread_mutex_unlock(&snd.mu);
        if (!port) {
            usleep(5000);
            continue;
        }
        char url[64], idh[48], rid[16];
        snprintf(url, sizeof(url), "http://127.0.0.1:%u/hook", (unsigned)port);
        snprintf(rid, sizeof(rid), "c-%zu", snd.n++);
        snprintf(idh, sizeof(idh), "X-Request-Id: %s", rid);
        const char *h[] = { idh, NULL };
        struct http_resp r;
        http_do("POST", url, h, rid, strlen(rid), 5000, &r);
        const char *dh = r.rc == 0 && r.status == 202 ? http_hdr(&r, "X-Delivery-Id") : NULL;
        if (dh) {
            snprintf(snd.acked_ids[snd.acked], sizeof(snd.acked_ids[0]), "%s", rid);
            snprintf(snd.delivery[snd.acked], sizeof(snd.delivery[0]), "%s", dh);
            snd.acked++;
        } else if (r.rc != 0) {
            usleep(2000); /* the proxy is going or coming */
        }
        http_free(&r);
    }
    return NULL;
}

static bool all_delivered(void *arg)
{
    (void)arg;
    return dur_db_int("SELECT count(*) FROM deliveries WHERE state <> 2", NULL) == 0;
}

/* Requests keep coming while the proxy is killed at random moments and started again: every
 * one that got a 202 reaches the upstream at least once, and none more often than once plus
 * the crashes that came during its attempts (each recorded as a lease_expired attempt). The
 * upstream answers at once: with two workers and a request every few ms, a few attempts are in
 * flight at most kills (4 to 10 of 25 in runs here). */
Test(durable, crash_test_every_202_arrives_and_duplicates_are_bounded, .timeout = 180)
{
    fx_init_curl();
    char *json = dur_cfg("", "", ", \"max_per_second\": 100000, \"max_in_flight\": 256", "");
    unsigned seed = (unsigned)time(NULL);
    srand(seed);
    cr_log_info("crash test seed %u", seed);
    pthread_t th;
    fx_start(json, "--workers", "2", NULL);
    snd.port = px->port;
    pthread_create(&th, NULL, sender, NULL);
    for (int k = 0; k < CRASHES; k++) {
        usleep((useconds_t)(100 + rand() % 400) * 1000);
        pthread_mutex_lock(&snd.mu);
        snd.port = 0;
        pthread_mutex_unlock(&snd.mu);
        kill(px->pid, SIGKILL);
        px_stop(px, 5000);
        px = NULL;
        fx_start(json, "--workers", "2", NULL);
        pthread_mutex_lock(&snd.mu);
        snd.port = px->port;
        pthread_mutex_unlock(&snd.mu);
    }
    atomic_store(&snd.stop, true);
    pthread_join(th, NULL);
    free(json);
    cr_assert_gt(snd.acked, CRASHES, "only %zu accepts in the run", snd.acked);
    cr_assert(fx_wait(all_delivered, NULL, 60000, 100), "%lld deliveries still pending",
              dur_db_int("SELECT count(*) FROM deliveries WHERE state <> 2", NULL));
    size_t dups = 0, lost_attempts = 0;
    for (size_t i = 0; i < snd.acked; i++) {
        size_t got = tup_count_id(up, snd.acked_ids[i]);
        long long crashed = dur_db_int("SELECT count(*) FROM attempts WHERE delivery = ?1 AND "
                                       "outcome = 'lease_expired'",
                                       snd.delivery[i]);
        cr_assert_geq(got, 1, "%s (delivery %s) was accepted and never arrived", snd.acked_ids[i],
                      snd.delivery[i]);
        cr_assert_leq((long long)got, 1 + crashed,
                      "%s arrived %zu times with %lld crashes during its attempts",
                      snd.acked_ids[i], got, crashed);
        dups += got - 1;
        lost_attempts += (size_t)crashed;
    }
    cr_log_info("crash test: %zu sent, %zu accepted, %d crashes, %zu attempts cut by a crash, "
                "%zu duplicates at the upstream",
                snd.n, snd.acked, CRASHES, lost_attempts, dups);
}

/* ---- reloads ---- */
