/* soak -- mixed load against the real retryproxy for a bounded time, watching its RSS and fds.
 *
 *   soak --bin build-soak/retryproxy [--seconds 600] [--workers 2] [--concurrency 64]
 *        [--interval 10] [--rate 0] [--reload 10] [--no-rss-check]
 *
 * Starts an upstream of its own (one epoll thread on 127.0.0.1, constant memory per connection:
 * unlike tests/support/tup it keeps no record of what it served, so it can run for hours), the
 * proxy (--workers N, config in a temporary directory, request log to /dev/null), then sends
 * requests from at most --concurrency libcurl transfers at once, all to 127.0.0.1:
 *
 *   10 %  answered 503 by the upstream on the first attempt: retried, 200
 *    1 %  reset by the upstream (RST, nothing sent) on the first attempt: retried, 200
 *    2 %  the upstream answers after 600 ms; the client gives up after 150 ms (closes first)
 *    2 %  503, then a backoff wait of 300 ms or more; the client gives up after 150 ms (closes
 *         during the wait)
 *    5 %  POST of 4 KiB with an Idempotency-Key, 200
 *   80 %  GET, 200 with a body of 0 to 32 KiB (its length checked)
 *
 * Every --reload seconds the config file is rewritten through rename() with other base_ms and
 * cap_ms values; every --interval seconds it prints a sample of the proxy: time, RSS (KiB),
 * open descriptors, requests done, and scrapes /metrics. At the end it waits for the proxy to
 * go idle and checks:
 *
 *   - RSS: the last sample under load is at most 10 % above the first sample taken after the
 *     warm-up (min(60 s, seconds / 5));
 *   - descriptors: at idle after the load (the upstream closes its idle connections, the
 *     clients are gone), within a grace period of 10 s, every descriptor but the proxy's
 *     sockets to this upstream comes back to the count measured at idle before the load; those
 *     sockets are libcurl's cached connections, which it closes only when a transfer on the
 *     same multi handle looks at them, so they are allowed up to the cache's bound
 *     (CURLM_MAX_CONNECTIONS per worker) and up to the connections the upstream still had
 *     open when the load ended (a socket the upstream had closed before is a leak);
 *   - outcomes: at most 0.1 % of requests ended otherwise than described above;
 *   - config reloads took effect (config_generation) and the proxy exits 0 on SIGTERM;
 *   - the proxy did not end during the run (checked every 500 ms; a crash stops the load).
 *
 * Exit status 0 when every check passed, 1 when one failed, 2 on a usage error, 3 when the
 * run could not be set up or was interrupted (SIGINT, SIGTERM). A watchdog kills the proxy and
 * exits 3 if the run overstays its time by two minutes.
 *
 * The upstream is tests/tools/soak/upstream.c, the proxy's process and admin API
 * tests/tools/soak/proxy.c; this file has the clients and the run.
 */
#include <curl/curl.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proxy/upstream/curlm.h"
#include "tests/support/proc.h"
#include "tests/tools/soak/proxy.h"
#include "tests/tools/soak/upstream.h"

extern char **environ;

/* xorshift64*: the request mix, seeded per run. */
static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dULL) >> 32) % n;
}

/* ---- the clients ---- */

#define POST_BYTES 4096

struct slot {
    CURL *e;
    struct curl_slist *h;
    enum kind kind;
    size_t want, got;
    bool busy;
};

static char post_body[POST_BYTES];
static uint64_t done_n, unexpected_n, by_kind[K_COUNT];

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    (void)p;
    struct slot *s = ud;
    s->got += size * n;
    return size * n;
}

static void slot_start(CURLM *m, struct slot *s, uint64_t seq)
{
    uint32_t r = rnd(10000);
    enum kind k = r < 1000   ? K_503
                  : r < 1100 ? K_RESET
                  : r < 1300 ? K_SLOW
                  : r < 1500 ? K_BACKOFF
                  : r < 2000 ? K_POST
                             : K_OK;
    s->kind = k;
    s->want = k == K_OK || k == K_POST ? rnd(32769) : 3;
    s->got = 0;
    char url[128], hk[64], hs[64], hi[96];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/%s/%llu?k=%s", proxy_port,
             k == K_BACKOFF ? "slow" : "fast", (unsigned long long)seq, kind_name[k]);
    snprintf(hk, sizeof(hk), "X-Soak: %s", kind_name[k]);
    snprintf(hs, sizeof(hs), "X-Soak-Size: %zu", s->want);
    snprintf(hi, sizeof(hi), "Idempotency-Key: soak-%llu", (unsigned long long)seq);
    curl_slist_free_all(s->h);
    s->h = curl_slist_append(NULL, hk);
    s->h = curl_slist_append(s->h, hs);
    s->h = curl_slist_append(s->h, "Expect:");
    if (k == K_POST)
        s->h = curl_slist_append(s->h, hi);
    curl_easy_reset(s->e);
    curl_easy_setopt(s->e, CURLOPT_URL, url);
    curl_easy_setopt(s->e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s->e, CURLOPT_HTTPHEADER, s->h);
    curl_easy_setopt(s->e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(s->e, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(s->e, CURLOPT_PRIVATE, s);
    /* The two disconnect kinds give up long before their answer can come. */
    curl_easy_setopt(s->e, CURLOPT_TIMEOUT_MS, k == K_SLOW || k == K_BACKOFF ? 150L : 15000L);
    if (k == K_POST) {
        curl_easy_setopt(s->e, CURLOPT_POSTFIELDSIZE, (long)POST_BYTES);
        curl_easy_setopt(s->e, CURLOPT_POSTFIELDS, post_body);
    }
    s->busy = true;
    curl_multi_add_handle(m, s->e);
}

static void slot_done(CURLM *m, struct slot *s, CURLcode rc)
{
    long status = 0;
    curl_easy_getinfo(s->e, CURLINFO_RESPONSE_CODE, &status);
    curl_multi_remove_handle(m, s->e);
    s->busy = false;
    done_n++;
    by_kind[s->kind]++;
    double took = 0;
    curl_easy_getinfo(s->e, CURLINFO_TOTAL_TIME, &took);
    bool ok;
    if (s->kind == K_SLOW || s->kind == K_BACKOFF)
        /* Given up after 150 ms; or the answer came in while this loop was busy elsewhere (a
         * slow /metrics scrape) and libcurl read it before looking at the clock. */
        ok = rc == CURLE_OPERATION_TIMEDOUT || (rc == CURLE_OK && status == 200 && took >= 0.3);
    else
        ok = rc == CURLE_OK && status == 200 && s->got == s->want;
    if (!ok && ++unexpected_n <= 10)
        fprintf(stderr,
                "soak: unexpected outcome for a '%s' request: curl %d (%s), status %ld, "
                "%zu of %zu body bytes, %.3f s\n",
                kind_name[s->kind], rc, curl_easy_strerror(rc), status, s->got, s->want, took);
}

/* ---- the run ---- */

struct sample {
    int t; /* seconds since the load started */
    long rss_kb;
    int fds;
    uint64_t done;
};

static void usage(FILE *f)
{
    fputs("usage: soak --bin PATH [--seconds N] [--workers N] [--concurrency N] [--interval S]\n"
          "            [--rate N] [--reload S] [--no-rss-check]\n"
          "Mixed load against retryproxy (PATH) and a built-in upstream, all on 127.0.0.1;\n"
          "fails if the proxy's RSS grows more than 10 % after the warm-up or its descriptors\n"
          "do not come back to their idle count. See the top of tests/tools/soak.c.\n",
          f);
}

int main(int argc, char **argv)
{
    const char *bin = NULL, *workers = "2";
    long seconds = 600, conc = 64, interval = 10, rate = 0, reload_s = 10;
    bool rss_check = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long *num = NULL;
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--no-rss-check") == 0) {
            rss_check = false;
            continue;
        } else if (i + 1 >= argc) {
            usage(stderr);
            return 2;
        } else if (strcmp(a, "--bin") == 0) {
            bin = argv[++i];
            continue;
        } else if (strcmp(a, "--workers") == 0) {
            workers = argv[++i];
            continue;
        } else if (strcmp(a, "--seconds") == 0) {
            num = &seconds;
        } else if (strcmp(a, "--concurrency") == 0) {
            num = &conc;
        } else if (strcmp(a, "--interval") == 0) {
            num = &interval;
        } else if (strcmp(a, "--rate") == 0) {
            num = &rate;
        } else if (strcmp(a, "--reload") == 0) {
            num = &reload_s;
        } else {
            fprintf(stderr, "soak: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
        char *end;
        *num = strtol(argv[++i], &end, 10);
        if (*end || *num < 0) {
            fprintf(stderr, "soak: bad value for %s: '%s'\n", a, argv[i]);
            return 2;
        }
    }
    if (!bin || seconds < 10 || conc < 1 || conc > 1024 || interval < 1 || reload_s < 1) {
        fprintf(stderr, "soak: need --bin, --seconds >= 10, --concurrency 1..1024, "
                        "--interval >= 1, --reload >= 1\n");
        usage(stderr);
        return 2;
    }

    signal(SIGPIPE, SIG_IGN);
    signal(SIGALRM, watchdog);
    signal(SIGINT, on_interrupt);
    signal(SIGTERM, on_interrupt);
    alarm((unsigned)seconds + 120);
    rng_state ^= (uint64_t)now_ms() * 0x9e3779b97f4a7c15u;
    memset(post_body, 'p', sizeof(post_body));
    curl_global_init(CURL_GLOBAL_DEFAULT);

    snprintf(dir, sizeof(dir), "/tmp/retryproxy-soak-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("soak: mkdtemp");
        return 3;
    }
    snprintf(cfg_path, sizeof(cfg_path), "%s/config.json", dir);
    snprintf(err_path, sizeof(err_path), "%s/stderr", dir);

    struct upstream up = { .lfd = -1, .ep = -1 };
    unsigned gen = 0;
    if (up_start(&up) < 0 || write_config(up.port, gen) < 0) {
        fprintf(stderr, "soak: cannot set up the upstream or the config: %s\n", strerror(errno));
        return 3;
    }
    if (start_proxy(bin, workers) < 0) {
        up_stop(&up);
        return 3;
    }

    /* Idle before the load: the descriptor baseline (no upstream connection yet). */
    sleep_ms(1000);
    int up_idle = 0;
    int fds_idle = proc_fds_to_port(proxy_pid, up.port, &up_idle);
    int others_idle = fds_idle - up_idle;
    long rss_idle = proc_status_kb(proxy_pid, "VmRSS");
    printf("soak: %s, %s workers, %ld s, %ld connections at most%s; upstream 127.0.0.1:%u, "
           "proxy 127.0.0.1:%u\n",
           bin, workers, seconds, conc, rate ? "" : ", no rate limit", up.port, proxy_port);
    printf("soak: idle before the load: RSS %ld KiB, %d fds\n", rss_idle, fds_idle);
    printf("soak: %6s %10s %6s %10s\n", "time", "RSS KiB", "fds", "requests");
    fflush(stdout);

    CURLM *m = curl_multi_init();
    curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, conc);
    struct slot *slots = calloc((size_t)conc, sizeof(*slots));
    for (long i = 0; i < conc; i++)
        slots[i].e = curl_easy_init();

    size_t n_samples = (size_t)(seconds / interval) + 2, ns = 0;
    struct sample *samples = calloc(n_samples, sizeof(*samples));
    uint64_t seq = 0, reloads = 0;
    int64_t t0 = now_ms(), t_end = t0 + seconds * 1000;
    int64_t next_sample = t0 + interval * 1000, next_reload = t0 + reload_s * 1000;
    int64_t next_check = t0 + 500;
    double generation = -1;
    for (;;) {
        int64_t now = now_ms();
        bool loading = now < t_end && !interrupted;
        int busy = 0;
        for (long i = 0; i < conc; i++) {
            if (!slots[i].busy && loading && (rate == 0 || (int64_t)seq < rate * (now - t0) / 1000))
                slot_start(m, &slots[i], seq++);
            busy += slots[i].busy;
        }
        if (!loading && busy == 0)
            break;
        int running;
        curl_multi_perform(m, &running);
        void *s;
        CURLcode rc;
        while (proc_multi_next_done(m, &s, &rc))
            slot_done(m, s, rc);
        if (loading && now >= next_reload) {
            next_reload += reload_s * 1000;
            if (write_config(up.port, ++gen) == 0)
                reloads++;
            else
                fprintf(stderr, "soak: cannot rewrite the config: %s\n", strerror(errno));
        }
        if (loading && now >= next_check) {
            next_check = now + 500;
            if (!proxy_alive())
                t_end = now; /* what is in flight fails fast; nothing more to measure */
        }
        if (now >= next_sample && ns < n_samples && proxy_pid > 0) {
            next_sample += interval * 1000;
            struct sample *sm = &samples[ns++];
            sm->t = (int)((now - t0 + 500) / 1000);
            sm->rss_kb = proc_status_kb(proxy_pid, "VmRSS");
            sm->fds = proc_entries(proxy_pid, "fd");
            sm->done = done_n;
            char *text = admin_get("/metrics");
            if (text)
                generation = metric(text, "retryproxy_config_generation");
            else
                fprintf(stderr, "soak: GET /metrics failed\n");
            free(text);
            printf("soak: %5ds %10ld %6d %10llu\n", sm->t, sm->rss_kb, sm->fds,
                   (unsigned long long)sm->done);
            fflush(stdout);
        }
        curl_multi_poll(m, NULL, 0, 10, NULL);
    }
    double load_s = (double)(now_ms() - t0) / 1000.0;
    for (long i = 0; i < conc; i++) {
        curl_easy_cleanup(slots[i].e);
        curl_slist_free_all(slots[i].h);
    }
    curl_multi_cleanup(m); /* closes the client connections */
    free(slots);
    if (interrupted) {
        stop_proxy(5000);
        up_stop(&up);
        rm_tree(dir);
        printf("soak: interrupted after %llu requests\n", (unsigned long long)done_n);
        return 3;
    }

    /* Idle after the load: the upstream closes its idle connections, then every descriptor
     * of the proxy but its sockets to the upstream must come back to the baseline within the
     * grace period. Those sockets are libcurl's connection caches: it notices that an upstream
     * closed an idle kept-alive connection only when a transfer on the same multi handle
     * starts (it then prunes every dead one, at most once a second), and a worker uses its
     * later multi handles only under load (proxy/upstream/curlm.c), so some stay until the next
     * load. They may not outnumber the cache's bound, nor the connections the upstream still
     * had open when the load ended: the proxy holds no socket the upstream closed before
     * (a reset). While waiting, one request goes through every 250 ms, on a connection of its
     * own and answered with Connection: close: it prunes what it can and leaves nothing
     * behind, and a leaked descriptor stays counted. */
    long up_bound = atol(workers) * CURLM_MAX_CONNECTIONS;
    if ((long)atomic_load(&up.open) < up_bound)
        up_bound = (long)atomic_load(&up.open);
    atomic_store(&up.drain, true);
    sleep_ms(250);
    int fds_after = -1, up_after = -1, others_after = -1, nudges = 0;
    int64_t t_idle = now_ms();
    while (now_ms() - t_idle < 10000 && proxy_alive()) {
        fds_after = proc_fds_to_port(proxy_pid, up.port, &up_after);
        others_after = fds_after - up_after;
        if (fds_after >= 0 && others_after <= others_idle && up_after <= up_bound)
            break;
        nudge();
        nudges++;
        sleep_ms(250);
    }
    long rss_after = proc_status_kb(proxy_pid, "VmRSS");
    char *text = admin_get("/metrics");
    if (text)
        generation = metric(text, "retryproxy_config_generation");
    free(text);

    printf("soak: %llu requests in %.1f s (%.0f/s): ", (unsigned long long)done_n, load_s,
           (double)done_n / load_s);
    for (int k = 0; k < K_COUNT; k++)
        printf("%s%s %llu", k ? ", " : "", kind_name[k], (unsigned long long)by_kind[k]);
    printf("; %llu unexpected; upstream: %lu answers, %lu resets\n",
           (unsigned long long)unexpected_n, atomic_load(&up.answered), atomic_load(&up.resets));
    printf("soak: idle after the load: RSS %ld KiB, %d fds: %d upstream connections (%ld at "
           "most), %d others (%d before; %.1f s, %d single requests to settle)\n",
           rss_after, fds_after, up_after, up_bound, others_after, others_idle,
           (double)(now_ms() - t_idle) / 1000.0, nudges);
    printf("soak: %llu config rewrites, config_generation %.0f\n", (unsigned long long)reloads,
           generation);

    int failed = 0;
    long warm = seconds / 5 < 60 ? seconds / 5 : 60;
    struct sample *ref = NULL, *last = ns ? &samples[ns - 1] : NULL;
    for (size_t i = 0; i < ns && !ref; i++)
        if (samples[i].t >= warm)
            ref = &samples[i];
    if (!ref || ref == last) {
        printf("soak: %s: too few samples after the %ld s warm-up to compare RSS\n",
               rss_check ? "FAILED" : "ignored (--no-rss-check)", warm);
        failed |= rss_check;
    } else {
        double growth = 100.0 * (double)(last->rss_kb - ref->rss_kb) / (double)ref->rss_kb;
        printf("soak: RSS %ld KiB at %d s (after the %ld s warm-up) -> %ld KiB at %d s: %+.1f %%\n",
               ref->rss_kb, ref->t, warm, last->rss_kb, last->t, growth);
        if (growth > 10.0) {
            printf("soak: %s: RSS grew more than 10 %% after the warm-up\n",
                   rss_check ? "FAILED" : "ignored (--no-rss-check)");
            failed |= rss_check;
        }
    }
    if (died < 0 && (fds_after < 0 || others_after > others_idle)) {
        printf("soak: FAILED: %d descriptors besides upstream connections open at idle after "
               "the load, %d before it\n",
               others_after, others_idle);
        failed = 1;
    }
    if (died < 0 && up_after > up_bound) {
        printf("soak: FAILED: %d upstream connections open at idle after the load, more than "
               "the %ld the upstream had open or the connection caches keep\n",
               up_after, up_bound);
        failed = 1;
    }
    if (done_n == 0 || (double)unexpected_n > (double)done_n * 0.001) {
        printf("soak: FAILED: %llu of %llu requests ended unexpectedly (more than 0.1 %%)\n",
               (unsigned long long)unexpected_n, (unsigned long long)done_n);
        failed = 1;
    }
    if (reloads > 0 && generation < (double)reloads / 2) {
        printf("soak: FAILED: %llu config rewrites but config_generation is %.0f\n",
               (unsigned long long)reloads, generation);
        failed = 1;
    }
    if (died >= 0) {
        printf("soak: FAILED: the proxy ended during the run, status %d\n", died);
        failed = 1;
    }
    int st = stop_proxy(15000);
    if (died < 0 && st != 0) {
        printf("soak: FAILED: the proxy exited with status %d on SIGTERM\n", st);
        failed = 1;
    }
    up_stop(&up);
    if (failed) {
        char *err = proc_read_file(err_path);
        size_t len = strlen(err);
        printf("soak: the proxy's stderr (last 4 KiB):\n%s", len > 4096 ? err + len - 4096 : err);
        free(err);
    }
    rm_tree(dir);
    free(samples);
    curl_global_cleanup();
    printf("soak: %s\n", failed ? "FAILED" : "passed");
    return failed;
}
