/* store_bench -- durable accepts per second of the SQLite store (proxy/store/), with group
 * commit against the floor of one transaction per accept, in the same run (make bench-store).
 *
 *   store_bench [--dir DIR] [--producers N] [--seconds S] [--body BYTES] [--reps R]
 *
 * N producer threads (64) each enqueue a BYTES (1024) body and wait for its completion, then
 * the next, for S seconds (5): N accepts outstanding at any time, as N callers of a durable
 * route would have. The store runs as the proxy runs it: WAL, synchronous=FULL (an fsync per
 * commit), its own thread. "floor" is the same store with store_opts.max_batch = 1: every
 * accept its own transaction and fsync. Each rep runs floor then group on fresh files in DIR
 * (a directory on the disk to measure: not a tmpfs). Prints one line per run: accepts per
 * second, the accept's latency (submit to completion) p50/p99/max in ms, commits and accepts
 * per commit.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "proxy/store/store.h"

#define MAX_LAT 200000 /* accepts timed per producer */

struct producer {
    struct store *s;
    const struct store_new *d;
    uint64_t until_us;
    uint32_t *lat_us; /* one per accept */
    size_t n, errors;
};

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static void *produce(void *arg)
{
    struct producer *p = arg;
    struct store_cq *q = store_cq_new();
    struct store_call c;
    uint64_t t;
    while (q && (t = now_us()) < p->until_us && p->n < MAX_LAT) {
        c = (struct store_call){ .cq = q };
        if (store_enqueue(p->s, &c, p->d) != 0 || store_call_wait(&c, -1) != 0 || c.result) {
            p->errors++;
            continue;
        }
        p->lat_us[p->n++] = (uint32_t)(now_us() - t);
    }
    store_cq_free(q);
    return NULL;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The store's file and its WAL companions, from an earlier run or this one. */
static void remove_files(const char *path)
{
    static const char *const ext[] = { "", "-wal", "-shm" };
    for (int i = 0; i < 3; i++) {
        char f[600];
        snprintf(f, sizeof(f), "%s%s", path, ext[i]);
        unlink(f);
    }
}

static int run(const char *dir, const char *mode, int producers, int seconds, size_t body)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/bench-%s.db", dir, mode);
    remove_files(path);
    struct store_opts o = { .path = path, .lease_ms = 30000 };
    o.max_batch = strcmp(mode, "floor") == 0 ? 1 : 0;
    struct store *s;
    struct store_err err;
    if (store_sqlite_open(&o, &s, &err) != 0) {
        fprintf(stderr, "store_bench: %s\n", err.msg);
        return 1;
    }
    char *b = malloc(body);
    memset(b, 'x', body);
    struct store_field f[] = { { "content-type", "application/json" },
                               { "user-agent", "store_bench" } };
    struct store_new d = { .route = "bench",
                           .method = "POST",
                           .target = "/webhook",
                           .fields = f,
                           .nfields = 2,
                           .body = b,
                           .body_len = body };
    struct producer *p = calloc((size_t)producers, sizeof(*p));
    pthread_t *t = calloc((size_t)producers, sizeof(*t));
    uint64_t t0 = now_us();
    for (int i = 0; i < producers; i++) {
        p[i] = (struct producer){ .s = s, .d = &d, .until_us = t0 + (uint64_t)seconds * 1000000 };
        p[i].lat_us = malloc(MAX_LAT * sizeof(uint32_t));
        pthread_create(&t[i], NULL, produce, &p[i]);
    }
    size_t n = 0, errors = 0;
    for (int i = 0; i < producers; i++) {
        pthread_join(t[i], NULL);
        n += p[i].n;
        errors += p[i].errors;
    }
    double secs = (double)(now_us() - t0) / 1e6;
    uint32_t *all = malloc((n ? n : 1) * sizeof(*all));
    size_t k = 0;
    for (int i = 0; i < producers; i++) {
        memcpy(all + k, p[i].lat_us, p[i].n * sizeof(*all));
        k += p[i].n;
        free(p[i].lat_us);
    }
    qsort(all, n, sizeof(*all), cmp_u32);
    struct store_stats st;
    store_stats(s, &st);
    store_close(s);
    remove_files(path);
    printf("%-6s %3d producers %5zu B: %8.0f accepts/s  p50 %6.2f ms  p99 %6.2f ms  max %7.2f "
           "ms  %7llu commits  %6.1f per commit  %zu errors\n",
           mode, producers, body, (double)n / secs, n ? all[n / 2] / 1000.0 : 0,
           n ? all[n * 99 / 100] / 1000.0 : 0, n ? all[n - 1] / 1000.0 : 0,
           (unsigned long long)st.commits, st.commits ? (double)n / (double)st.commits : 0, errors);
    fflush(stdout);
    free(all);
    free(p);
    free(t);
    free(b);
    return 0;
}

int main(int argc, char **argv)
{
    const char *dir = ".";
    int producers = 64, seconds = 5, reps = 1;
    size_t body = 1024;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--dir") == 0)
            dir = argv[i + 1];
        else if (strcmp(argv[i], "--producers") == 0)
            producers = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--seconds") == 0)
            seconds = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--body") == 0)
            body = (size_t)atol(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "store_bench: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (producers < 1 || seconds < 1 || reps < 1 || body < 1) {
        fprintf(stderr, "store_bench: producers, seconds, reps and body must be positive\n");
        return 2;
    }
    for (int r = 0; r < reps; r++)
        if (run(dir, "floor", producers, seconds, body) ||
            run(dir, "group", producers, seconds, body))
            return 1;
    return 0;
}
