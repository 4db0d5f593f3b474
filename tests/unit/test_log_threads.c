/* The log (proxy/telemetry/log.c, docs/logs.md): buffering, many threads writing at once,
 * configuration changed while they do, full and closed pipes (tests/support/logtest.h). */
#include "tests/support/logtest.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "proxy/telemetry/log.h"

TestSuite(log, .init = lt_setup, .fini = lt_teardown);

/* ---- buffering ---- */

Test(log, nothing_written_before_flush)
{
    struct log_request r = sample_request();
    struct log_buf *b = log_buf_new();
    cr_assert(b);
    for (int i = 0; i < 3; i++)
        log_request(b, &r);
    size_t len;
    free(lt_output(&len));
    cr_expect_eq(len, 0, "written before log_flush");

    log_flush(b);
    struct lines l = read_lines();
    cr_expect_eq(l.n, 3);
    free_lines(&l);

    /* An empty flush writes nothing more; log_buf_free writes what is left. */
    log_flush(b);
    log_request(b, &r);
    l = read_lines();
    cr_expect_eq(l.n, 3);
    free_lines(&l);
    log_buf_free(b);
    l = read_lines();
    cr_expect_eq(l.n, 4);
    free_lines(&l);
    log_buf_free(NULL);
    log_flush(NULL);
}

Test(log, full_buffer_writes_whole_lines)
{
    char *path = lt_fill('q', 1000);
    struct log_request r = sample_request();
    r.path = path;
    struct log_buf *b = log_buf_new();
    size_t line_len = 0;
    for (int i = 0; i < 200; i++) {
        size_t before;
        free(lt_output(&before));
        log_request(b, &r);
        size_t after;
        char *out = lt_output(&after);
        if (after != before) {
            /* Each write is whole lines that fitted in one buffer. */
            cr_expect(out[after - 1] == '\n');
            cr_expect_leq(after - before, BUF_SIZE);
        }
        free(out);
        if (i == 0) {
            log_flush(b);
            free(lt_output(&line_len));
        }
    }
    log_buf_free(b);
    size_t len;
    char *out = lt_output(&len);
    cr_expect_eq(len, 200 * line_len);
    struct lines l = split_lines(out, len);
    cr_expect_eq(l.n, 200);
    for (size_t i = 0; i < l.n; i++)
        json_decref(lt_parse(l.v[i]));
    free_lines(&l);
    free(path);
}

Test(log, without_a_buffer_lines_are_written_at_once)
{
    struct log_request r = sample_request();
    log_request(NULL, &r);
    struct lines l = read_lines();
    cr_expect_eq(l.n, 1);
    free_lines(&l);
}

/* ---- threads ----
 *
 * The scenarios are plain C with no Criterion calls, so that they also run under
 * ThreadSanitizer, where Criterion cannot start (its BoxFort arena wants address space TSan
 * reserves, Snaipe/Criterion#274): building with -DLOG_TEST_MAIN adds a main() that runs only
 * them (see the end of the file). */

#define THREADS    4
#define PER_THREAD 10000

struct reader {
    int fd;
    char *data;
    size_t len, cap;
};

static void *read_pipe(void *arg)
{
    struct reader *rd = arg;
    for (;;) {
        if (rd->cap - rd->len < 65536) {
            rd->cap = rd->cap ? rd->cap * 2 : 1 << 20;
            rd->data = realloc(rd->data, rd->cap + 1);
            if (!rd->data)
                abort();
        }
        ssize_t n = read(rd->fd, rd->data + rd->len, rd->cap - rd->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        rd->len += (size_t)n;
    }
    rd->data[rd->len] = '\0';
    return NULL;
}

struct worker_arg {
    int id;
};

static void *log_worker(void *arg)
{
    const struct worker_arg *w = arg;
    struct log_buf *b = log_buf_new();
    if (!b)
        abort();
    char path[600];
    char id[32];
    for (int i = 0; i < PER_THREAD; i++) {
        /* Lines of different lengths, so that buffers also fill up and flush by themselves. */
        int plen = snprintf(path, sizeof path, "/t%d/%d/", w->id, i);
        memset(path + plen, 'a' + i % 26, (size_t)(i % 500));
        path[plen + i % 500] = '\0';
        snprintf(id, sizeof id, "%d-%d", w->id, i);
        struct log_request r = sample_request();
        r.path = path;
        r.request_id = id;
        log_request(b, &r);
        if (i % 37 == 0)
            log_flush(b);
    }
    log_buf_free(b);
    return NULL;
}

static atomic_bool flipping_done;

/* A reload storm: level and format change all the time while workers log. */
static void *flipper(void *arg)
{
    (void)arg;
    unsigned i = 0;
    while (!atomic_load(&flipping_done)) {
        log_configure(i % 3 == 2 ? CFG_LOG_DEBUG : CFG_LOG_INFO,
                      i % 2 ? CFG_LOG_TEXT : CFG_LOG_JSON);
        i++;
    }
    return NULL;
}

struct scenario {
    size_t json_lines, text_lines;
    char problem[512];
};

/* Checks one line written by log_worker (JSON, or text when formats flip) and says which
 * thread and which of its lines it is. */
static bool check_worker_line(struct scenario *sc, char *line, bool text_ok, int *tid, int *seq)
{
    char want[32];
    if (line[0] == '{') {
        json_t *j = json_loads(line, 0, NULL);
        const char *id = json_string_value(json_object_get(j, "request_id"));
        const char *path = json_string_value(json_object_get(j, "path"));
        bool ok = id && path && sscanf(id, "%d-%d", tid, seq) == 2 && *tid >= 0 && *tid < THREADS &&
                  *seq >= 0 && *seq < PER_THREAD;
        if (ok) {
            snprintf(want, sizeof want, "/t%d/%d/", *tid, *seq);
            ok = strncmp(path, want, strlen(want)) == 0 &&
                 strlen(path) == strlen(want) + (size_t)(*seq % 500);
        }
        json_decref(j);
        sc->json_lines++;
        return ok;
    }
    if (!text_ok)
        return false;
    /* 2026-...Z INFO  request route=orders GET /t0/1/a -> 200 ... id=0-1 */
    char *path = strstr(line, " INFO  request route=orders GET ");
    char *arrow = strstr(line, " -> 200 attempts=3 ");
    char *id = strstr(line, " id=");
    if (path != line + 24 || !arrow || !id || sscanf(id, " id=%d-%d", tid, seq) != 2 || *tid < 0 ||
        *tid >= THREADS || *seq < 0 || *seq >= PER_THREAD)
        return false;
    path += strlen(" INFO  request route=orders GET ");
    snprintf(want, sizeof want, "/t%d/%d/", *tid, *seq);
    sc->text_lines++;
    return strncmp(path, want, strlen(want)) == 0 &&
           (size_t)(arrow - path) == strlen(want) + (size_t)(*seq % 500);
}

/* Runs 'workers' log_worker threads (and the flipper if 'flip') writing into one pipe, then
 * checks that every line is whole, each once, in its thread's order. NULL when all held. */
static const char *run_scenario(struct scenario *sc, int workers, bool flip)
{
    memset(sc, 0, sizeof *sc);
    int p[2];
    if (pipe(p) != 0)
        return "pipe failed";
    struct reader rd = { .fd = p[0] };
    pthread_t reader, f, t[THREADS];
    struct worker_arg args[THREADS];
    if (pthread_create(&reader, NULL, read_pipe, &rd) != 0)
        return "pthread_create failed";
    uint64_t dropped = log_dropped_lines();
    log_set_fd(p[1]);
    atomic_store(&flipping_done, false);
    if (flip && pthread_create(&f, NULL, flipper, NULL) != 0)
        abort();
    for (int i = 0; i < workers; i++) {
        args[i].id = i;
        if (pthread_create(&t[i], NULL, log_worker, &args[i]) != 0)
            abort();
    }
    for (int i = 0; i < workers; i++)
        pthread_join(t[i], NULL);
    if (flip) {
        atomic_store(&flipping_done, true);
        pthread_join(f, NULL);
    }
    log_set_fd(1);
    close(p[1]);
    pthread_join(reader, NULL);
    close(p[0]);

    int next[THREADS] = { 0 };
    size_t lines = 0;
    char *line = rd.data;
    char *nl;
    while (!sc->problem[0] && (nl = strchr(line, '\n')) != NULL) {
        *nl = '\0';
        int tid = -1, seq = -1;
        if (!check_worker_line(sc, line, flip, &tid, &seq))
            snprintf(sc->problem, sizeof sc->problem, "line %zu is broken: %.300s", lines, line);
        else if (seq != next[tid])
            snprintf(sc->problem, sizeof sc->problem, "thread %d: line %d after %d", tid, seq,
                     next[tid] - 1);
        else
            next[tid]++;
        lines++;
        line = nl + 1;
    }
    if (!sc->problem[0] && *line != '\0')
        snprintf(sc->problem, sizeof sc->problem, "the output ends inside a line");
    for (int i = 0; i < workers && !sc->problem[0]; i++) {
        if (next[i] != PER_THREAD)
            snprintf(sc->problem, sizeof sc->problem, "thread %d: %d lines, want %d", i, next[i],
                     PER_THREAD);
    }
    if (!sc->problem[0] && log_dropped_lines() != dropped)
        snprintf(sc->problem, sizeof sc->problem, "%llu lines dropped",
                 (unsigned long long)(log_dropped_lines() - dropped));
    free(rd.data);
    return sc->problem[0] ? sc->problem : NULL;
}

Test(log, concurrent_flushes_never_interleave, .timeout = 120)
{
    struct scenario sc;
    const char *problem = run_scenario(&sc, THREADS, false);
    cr_expect(problem == NULL, "%s", problem);
    cr_expect_eq(sc.json_lines, (size_t)THREADS * PER_THREAD);
}

/* Requests are at info, which every setting of the flipper lets through: none is lost, and each
 * line is whole in one format or the other. */
Test(log, configure_while_logging, .timeout = 120)
{
    struct scenario sc;
    const char *problem = run_scenario(&sc, 2, true);
    cr_expect(problem == NULL, "%s", problem);
    cr_expect_eq(sc.json_lines + sc.text_lines, (size_t)2 * PER_THREAD);
}

Test(log, full_nonblocking_pipe_drops_and_counts)
{
    int p[2];
    cr_assert(pipe2(p, O_NONBLOCK) == 0);
    char chunk[4096];
    memset(chunk, 'x', sizeof chunk);
    size_t filled = 0;
    for (;;) {
        ssize_t n = write(p[1], chunk, sizeof chunk);
        if (n <= 0)
            break;
        filled += (size_t)n;
    }
    while (write(p[1], chunk, 1) == 1)
        filled++;
    log_set_fd(p[1]);

    struct log_request r = sample_request();
    struct log_buf *b = log_buf_new();
    for (int i = 0; i < 5; i++)
        log_request(b, &r);
    errno = 12345;
    log_flush(b);
    cr_expect_eq(errno, 12345, "errno changed by log_flush");
    cr_expect_eq(log_dropped_lines(), 5);

    /* Once the reader catches up, logging goes on with whole lines. */
    char sink[65536];
    size_t drained = 0;
    for (;;) {
        ssize_t n = read(p[0], sink, sizeof sink);
        if (n <= 0)
            break;
        drained += (size_t)n;
    }
    cr_expect_eq(drained, filled);
    r.request_id = "after";
    log_request(b, &r);
    log_flush(b);
    ssize_t n = read(p[0], sink, sizeof sink - 1);
    cr_assert_gt(n, 0);
    sink[n] = '\0';
    cr_assert_eq(sink[n - 1], '\n');
    sink[n - 1] = '\0';
    json_t *j = lt_parse(sink);
    cr_expect_str_eq(json_string_value(json_object_get(j, "request_id")), "after");
    json_decref(j);
    cr_expect_eq(log_dropped_lines(), 5);
    log_buf_free(b);
    log_set_fd(lt_fd);
    close(p[0]);
    close(p[1]);
}

/* A write that stops within a line (here at the file size limit) leaves a fragment: the next
 * write starts on a new line, so the lines after it are intact. */
Test(log, partial_write_fragment_is_fenced_off)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old;
    cr_assert(getrlimit(RLIMIT_FSIZE, &old) == 0);
    struct rlimit lim = { .rlim_cur = 1000, .rlim_max = old.rlim_max };
    cr_assert(setrlimit(RLIMIT_FSIZE, &lim) == 0);

    struct log_request r = sample_request();
    struct log_buf *b = log_buf_new();
    log_request(b, &r);
    size_t one = 0;
    log_flush(b);
    free(lt_output(&one));
    cr_assert_lt(one, 500);
    cr_assert_neq(1000 % one, 0, "the limit must fall inside a line");
    size_t lines = 20;
    for (size_t i = 0; i < lines; i++)
        log_request(b, &r);
    log_flush(b);
    cr_expect_eq(log_dropped_lines(), lines - (1000 / one - 1));
    lim.rlim_cur = old.rlim_cur;
    cr_assert(setrlimit(RLIMIT_FSIZE, &lim) == 0);

    r.request_id = "after";
    log_request(b, &r);
    log_buf_free(b);
    size_t len;
    char *out = lt_output(&len);
    struct lines l = split_lines(out, len);
    /* The whole lines, the fragment, then the next line. */
    size_t whole = 1000 / one;
    cr_assert_eq(l.n, whole + 2);
    for (size_t i = 0; i < whole; i++)
        json_decref(lt_parse(l.v[i]));
    cr_expect_eq(strlen(l.v[whole]), 1000 - whole * one);
    json_t *j = lt_parse(l.v[whole + 1]);
    cr_expect_str_eq(json_string_value(json_object_get(j, "request_id")), "after");
    json_decref(j);
    free_lines(&l);
}

Test(log, closed_pipe_and_bad_fd_drop_lines)
{
    signal(SIGPIPE, SIG_IGN);
    int p[2];
    cr_assert(pipe(p) == 0);
    close(p[0]);
    log_set_fd(p[1]);
    struct log_request r = sample_request();
    struct log_buf *b = log_buf_new();
    log_request(b, &r);
    log_request(b, &r);
    log_flush(b);
    cr_expect_eq(log_dropped_lines(), 2);
    log_event(CFG_LOG_ERROR, "lost", NULL);
    cr_expect_eq(log_dropped_lines(), 3);
    close(p[1]);

    log_set_fd(-1);
    log_request(b, &r);
    log_flush(b);
    cr_expect_eq(log_dropped_lines(), 4);

    log_set_fd(lt_fd);
    log_request(b, &r);
    log_buf_free(b);
    struct lines l = read_lines();
    cr_expect_eq(l.n, 1);
    free_lines(&l);
}

#ifdef LOG_TEST_MAIN
/* The thread scenarios on their own, for ThreadSanitizer, where Criterion cannot run:
 *   gcc -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=thread -DLOG_TEST_MAIN -I. \
 *       tests/unit/test_log_threads.c tests/support/logtest.c proxy/telemetry/log.c \
 *       config/utf8.c -lcriterion -ljansson -lpthread
 * This main() takes the place of Criterion's, so none of the Test()s above run. */
int main(void)
{
    struct scenario sc;
    const char *problem = run_scenario(&sc, THREADS, false);
    printf("log: %d threads x %d lines, one pipe: %s\n", THREADS, PER_THREAD,
           problem ? problem : "ok");
    bool failed = problem != NULL;
    problem = run_scenario(&sc, 2, true);
    printf("log: logging while level and format change (%zu JSON, %zu text lines): %s\n",
           sc.json_lines, sc.text_lines, problem ? problem : "ok");
    return failed || problem ? 1 : 0;
}
#endif
