/* The metrics registry (proxy/telemetry/metrics.h) under load: writers and a scraper at once
 * (also under ThreadSanitizer, see METRICS_TEST_MAIN), and tens of thousands of route names
 * registered in linear time. */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "policy/budget.h"
#include "proxy/core/live.h"
#include "proxy/telemetry/metrics.h"
#include "proxy/telemetry/version.h"
#include "tests/support/metricstest.h"

/* The scenario is plain C with no Criterion calls, so that it also runs under ThreadSanitizer:
 * Criterion cannot start there (its BoxFort arena wants address space TSan reserves,
 * Snaipe/Criterion#274), so building with -DMETRICS_TEST_MAIN adds a main() that runs only this
 * (METRICS_TEST_MAIN, below). */

#define WRITERS    4
#define ITERATIONS 1000000
#define TOTAL      ((long long)WRITERS * ITERATIONS)

struct hammer {
    struct metrics *m;
    atomic_bool done;
    /* Written by the scraper, read after it is joined. */
    unsigned renders, failed_renders;
    char problem[256];
};

struct writer_arg {
    struct hammer *h;
    unsigned w;
};

static void *writer(void *p)
{
    struct writer_arg *a = p;
    struct metrics *m = a->h->m;
    /* Looked up here, through the mutex, as a worker would get them from a config snapshot. */
    struct metrics_route *r = metrics_route(m, "hot");
    unsigned gw = metrics_reason(r, "gateway-error");
    struct metrics_target *u = metrics_target(r, "http://hot");
    for (unsigned i = 0; i < ITERATIONS; i++) {
        metrics_request(r, a->w, 200);
        metrics_attempt(u, a->w, METRICS_OUT_2XX, 0.002);
        metrics_retry(r, a->w, gw);
        metrics_observe(r, a->w, METRICS_HIST_REQUEST, 0.002);
        metrics_connections_add(m, a->w, 1);
        metrics_connections_add(m, a->w, -1);
        /* Now and then a config install adds series while scrapes walk the list. */
        if (i % 200000 == 0) {
            char name[32];
            snprintf(name, sizeof(name), "new-%u-%u", a->w, i);
            struct metrics_route *n = metrics_route(m, name);
            metrics_retry(n, a->w, metrics_reason(n, "429"));
        }
    }
    return NULL;
}

static const char *const watched[] = {
    "retryproxy_requests_total{route=\"hot\",code=\"200\"}",
    "retryproxy_attempts_total{route=\"hot\",upstream=\"http://hot\",outcome=\"2xx\"}",
    "retryproxy_retries_total{route=\"hot\",reason=\"gateway-error\"}",
    "retryproxy_request_duration_seconds_bucket{route=\"hot\",le=\"0.0025\"}",
    "retryproxy_request_duration_seconds_count{route=\"hot\"}",
};
#define NWATCHED (sizeof(watched) / sizeof(watched[0]))

static void *scraper(void *p)
{
    struct hammer *h = p;
    long long last[NWATCHED] = { 0 };
    bool stop = false;
    while (!stop && !h->problem[0]) {
        /* One more scrape after the writers finish, so the last one sees every update. */
        stop = atomic_load(&h->done);
        char *t = metrics_render(h->m, NULL);
        if (!t) {
            h->failed_renders++;
            continue;
        }
        h->renders++;
        for (size_t i = 0; i < NWATCHED && !h->problem[0]; i++) {
            const char *at = mt_find_series(t, watched[i]);
            /* Series may be missing until the writers have created or counted them. */
            long long v = at ? strtoll(at + strlen(watched[i]) + 1, NULL, 10) : 0;
            if (v < last[i] || v > TOTAL)
                snprintf(h->problem, sizeof(h->problem), "%s went from %lld to %lld", watched[i],
                         last[i], v);
            last[i] = v;
        }
        free(t);
    }
    return NULL;
}

/* Runs the scenario; NULL when every check held, else what went wrong. */
static const char *hammer_run(struct hammer *h)
{
    memset(h, 0, sizeof(*h));
    atomic_init(&h->done, false);
    h->m = metrics_new(WRITERS);
    if (!h->m)
        return "metrics_new failed";

    pthread_t st, wt[WRITERS];
    struct writer_arg wa[WRITERS];
    if (pthread_create(&st, NULL, scraper, h) != 0)
        return "pthread_create failed";
    for (unsigned w = 0; w < WRITERS; w++) {
        wa[w] = (struct writer_arg){ .h = h, .w = w };
        if (pthread_create(&wt[w], NULL, writer, &wa[w]) != 0)
            abort();
    }
    for (unsigned w = 0; w < WRITERS; w++)
        pthread_join(wt[w], NULL);
    atomic_store(&h->done, true);
    pthread_join(st, NULL);

    if (!h->problem[0] && h->failed_renders)
        snprintf(h->problem, sizeof(h->problem), "%u renders failed", h->failed_renders);
    if (!h->problem[0] && h->renders < 2)
        snprintf(h->problem, sizeof(h->problem), "the scraper ran only %u times", h->renders);

    static const char *const want[] = {
        "retryproxy_requests_total{route=\"hot\",code=\"200\"} 4000000",
        "retryproxy_attempts_total{route=\"hot\",upstream=\"http://hot\",outcome=\"2xx\"} 4000000",
        "retryproxy_retries_total{route=\"hot\",reason=\"gateway-error\"} 4000000",
        "retryproxy_request_duration_seconds_bucket{route=\"hot\",le=\"0.001\"} 0",
        "retryproxy_request_duration_seconds_bucket{route=\"hot\",le=\"0.0025\"} 4000000",
        "retryproxy_request_duration_seconds_sum{route=\"hot\"} 8000.000000",
        "retryproxy_request_duration_seconds_count{route=\"hot\"} 4000000",
        "retryproxy_retries_total{route=\"new-3-800000\",reason=\"429\"} 1",
        "retryproxy_connections_active 0",
    };
    char *t = metrics_render(h->m, NULL);
    for (size_t i = 0; t && !h->problem[0] && i < sizeof(want) / sizeof(want[0]); i++) {
        if (!mt_has_line(t, want[i]))
            snprintf(h->problem, sizeof(h->problem), "final scrape lacks: %s", want[i]);
    }
    if (!t && !h->problem[0])
        snprintf(h->problem, sizeof(h->problem), "final render failed");
    free(t);
    metrics_free(h->m);
    return h->problem[0] ? h->problem : NULL;
}

Test(metrics, concurrent_writers_and_scraper, .timeout = 600)
{
    struct hammer h;
    const char *problem = hammer_run(&h);
    cr_expect_null(problem, "%s", problem);
    cr_log_info("the scraper rendered %u times during the run", h.renders);
}

#ifdef METRICS_TEST_MAIN
/* The concurrency scenario on its own, for ThreadSanitizer, where Criterion cannot run:
 *   gcc -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=thread -DMETRICS_TEST_MAIN -I. \
 *       tests/unit/test_metrics_load.c tests/support/metricstest.c proxy/telemetry/metrics*.c \
 *       proxy/telemetry/procstat.c proxy/core/live.c proxy/base/strmap.c policy/[a-z]*.c \
 *       -lcriterion -lpthread -lm
 * This main() takes the place of Criterion's, so none of the Test()s above run. */
int main(void)
{
    struct hammer h;
    const char *problem = hammer_run(&h);
    printf("metrics concurrency: %u scrapes during the run: %s\n", h.renders,
           problem ? problem : "ok");
    return problem ? 1 : 0;
}
#endif

/* The process's CPU seconds, user and system. */
static void cpu_times(double *user, double *sys)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *user = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6;
    *sys = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* A reload of a config with tens of thousands of routes registers each name with the metrics
 * and the live route state: one hash lookup each, not a scan or a shift of everything before.
 * Names in descending order were the worst case of the sorted insert. CPU time, so a busy
 * machine does not fail it; quadratic costs took tens of seconds here. */
/* CPU seconds, user and system together, to register 'n' route names twice, in a registry and
 * a live table of their own (the system seconds alone in *sys); the last pair is kept in *m
 * and *l when they are not NULL. */
static double register_names(int n, double *sys, struct metrics **keep_m, struct live **keep_l)
{
    struct metrics *m = metrics_new(1);
    struct live *l = live_new();
    char name[32];
    double u0, s0, u1, s1;
    cpu_times(&u0, &s0);
    for (int round = 0; round < 2; round++)
        for (int i = n; i > 0; i--) {
            snprintf(name, sizeof(name), "route-%06d", i);
            cr_assert(metrics_route(m, name) != NULL);
            cr_assert(live_route(l, name, 10000) != NULL);
        }
    cpu_times(&u1, &s1);
    *sys = s1 - s0;
    if (keep_m) {
        *keep_m = m;
        *keep_l = l;
    } else {
        live_free(l);
        metrics_free(m);
    }
    return (u1 - u0) + *sys;
}

/* Linear, not quadratic: four times the names cost about four times the CPU (sixteen times
 * if each registration walked the ones before). A ratio, not a time: it holds on a slow or
 * busy machine and under the sanitizers alike.
 *
 * Both sizes are measured the same way: user and system time together, from the same
 * allocator state. Memory is cleared either by the kernel (fresh pages: system time) or by
 * calloc (freed memory: user time); counting user time alone, the first, small run got fresh
 * pages and the large one freed memory: 0.56-0.76 s against 0.019-0.032 s, 30 times, for a
 * cost that is linear (issue 37). A first run fills the heap, and glibc's malloc is asked to
 * keep it (no trimming, no mmap of large blocks), so that each measured run reuses memory;
 * the sanitizers' allocators ignore mallopt(), and the sum holds without it. */
Test(metrics, many_route_names_register_in_linear_time)
{
    enum { N = 60000 };
    (void)mallopt(M_TRIM_THRESHOLD, 1 << 30); /* best effort: see above */
    (void)mallopt(M_MMAP_THRESHOLD, 32 << 20);
    struct metrics *m;
    struct live *l;
    double sys, quarter_sys, warm_sys;
    double warm = register_names(N, &warm_sys, NULL, NULL);
    /* the lesser of two runs each: a run that shared the cores with others (CI, a build)
     * takes more CPU than it needs, through the caches (seen: 1.22 s against 0.10 s) */
    double quarter = register_names(N / 4, &quarter_sys, NULL, NULL);
    double cpu = register_names(N, &sys, NULL, NULL);
    double q = register_names(N / 4, &quarter_sys, NULL, NULL);
    double c = register_names(N, &sys, &m, &l);
    quarter = q < quarter ? q : quarter;
    cpu = c < cpu ? c : cpu;
    cr_log_info("%d names twice: %.3f s of CPU (%.3f s system), %d: %.3f s (%.3f s); the "
                "first run, onto fresh pages: %.3f s (%.3f s)",
                N, cpu, sys, N / 4, quarter, quarter_sys, warm, warm_sys);
    double floor = quarter > 0.02 ? quarter : 0.02; /* the clock's grain on a fast run */
    cr_expect(cpu < 8 * floor, "registering %d route names took %.2f s of CPU, %d took %.2f s", N,
              cpu, N / 4, quarter);
    /* the same name gives the same series, and a scrape prints them sorted */
    cr_expect_eq(metrics_route(m, "route-000001"), metrics_route(m, "route-000001"));
    size_t len = 0;
    char *text = metrics_render(m, &len);
    cr_assert(text);
    const char *a = strstr(text, "route=\"route-000001\"");
    const char *b = strstr(text, "route=\"route-060000\"");
    cr_expect(a == NULL || b == NULL || a < b, "routes printed in name order");
    free(text);
    live_free(l);
    metrics_free(m);
}
