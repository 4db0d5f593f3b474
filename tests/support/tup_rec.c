/* The test upstream's records (tup.h): every complete request kept for the test to read, the
 * waits on them, the counters, and the log of one line per request. */
#include "tests/support/tup.h"
#include "tests/support/tup_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

void tup_rec_free(struct rec *r)
{
    if (!r)
        return;
    free(r->pub.headers);
    for (size_t i = 0; i < r->pub.n_trailers; i++) {
        free(r->pub.trailers[i].name);
        free(r->pub.trailers[i].value);
    }
    free(r->pub.trailers);
    free(r->pub.body);
    free(r->strings);
    free(r);
}

void tup_publish(struct tup *t, struct rec *r)
{
    pthread_mutex_lock(&t->mu);
    if (t->n_recs == t->cap_recs) {
        t->cap_recs = t->cap_recs ? t->cap_recs * 2 : 64;
        t->recs = tup_xrealloc(t->recs, t->cap_recs * sizeof *t->recs);
    }
    r->pub.seq = t->n_recs;
    t->recs[t->n_recs++] = r;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

size_t tup_count(struct tup *t)
{
    pthread_mutex_lock(&t->mu);
    size_t n = t->n_recs;
    pthread_mutex_unlock(&t->mu);
    return n;
}

const struct tup_req *tup_get(struct tup *t, size_t i)
{
    const struct tup_req *r = NULL;
    pthread_mutex_lock(&t->mu);
    if (i < t->n_recs)
        r = &t->recs[i]->pub;
    pthread_mutex_unlock(&t->mu);
    return r;
}

static void deadline_after(struct timespec *ts, int timeout_ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

int tup_wait_count(struct tup *t, size_t n, int timeout_ms)
{
    struct timespec ts;
    int rc = 0;
    deadline_after(&ts, timeout_ms < 0 ? 0 : timeout_ms);
    pthread_mutex_lock(&t->mu);
    while (t->n_recs < n) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&t->cv, &t->mu);
        } else if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT) {
            rc = t->n_recs >= n ? 0 : -1;
            break;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int tup_wait_open_at_most(struct tup *t, size_t n, int timeout_ms)
{
    struct timespec ts;
    int rc = 0;
    deadline_after(&ts, timeout_ms < 0 ? 0 : timeout_ms);
    pthread_mutex_lock(&t->mu);
    while (t->open > n) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&t->cv, &t->mu);
        } else if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT) {
            rc = t->open <= n ? 0 : -1;
            break;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

size_t tup_count_id(struct tup *t, const char *request_id)
{
    size_t n = 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->n_recs; i++)
        if (strcmp(t->recs[i]->pub.request_id, request_id) == 0)
            n++;
    pthread_mutex_unlock(&t->mu);
    return n;
}

const char *tup_req_header(const struct tup_req *r, const char *name)
{
    for (size_t i = 0; i < r->n_headers; i++)
        if (strcasecmp(r->headers[i].name, name) == 0)
            return r->headers[i].value;
    return NULL;
}

const char *tup_req_trailer(const struct tup_req *r, const char *name)
{
    for (size_t i = 0; i < r->n_trailers; i++)
        if (strcasecmp(r->trailers[i].name, name) == 0)
            return r->trailers[i].value;
    return NULL;
}

/* Keeps the trailer line 'line' ('len' bytes, no terminator) with the request. */
void tup_keep_trailer(struct rec *r, const char *line, size_t len)
{
    const char *colon = memchr(line, ':', len);
    if (!colon)
        return;
    const char *v = colon + 1, *ve = line + len;
    while (v < ve && tup_is_ows(*v))
        v++;
    while (ve > v && tup_is_ows(ve[-1]))
        ve--;
    struct tup_req *q = &r->pub;
    q->trailers = tup_xrealloc(q->trailers, (q->n_trailers + 1) * sizeof(*q->trailers));
    q->trailers[q->n_trailers].name = strndup(line, (size_t)(colon - line));
    q->trailers[q->n_trailers].value = strndup(v, (size_t)(ve - v));
    q->n_trailers++;
}

size_t tup_req_header_count(const struct tup_req *r, const char *name)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n_headers; i++)
        if (strcasecmp(r->headers[i].name, name) == 0)
            n++;
    return n;
}

uint64_t tup_connections(struct tup *t)
{
    pthread_mutex_lock(&t->mu);
    uint64_t n = t->accepted;
    pthread_mutex_unlock(&t->mu);
    return n;
}

uint64_t tup_bytes_in(struct tup *t)
{
    pthread_mutex_lock(&t->mu);
    uint64_t n = t->bytes_in;
    pthread_mutex_unlock(&t->mu);
    return n;
}

size_t tup_open_connections(struct tup *t)
{
    pthread_mutex_lock(&t->mu);
    size_t n = t->open;
    pthread_mutex_unlock(&t->mu);
    return n;
}

uint16_t tup_port(const struct tup *t)
{
    return t->port;
}

void tup_set_default_plan(struct tup *t, const char *plan)
{
    char *copy = tup_xstrdup(plan ? plan : "");
    pthread_mutex_lock(&t->mu);
    free(t->default_plan);
    t->default_plan = copy;
    pthread_mutex_unlock(&t->mu);
}

void tup_set_log(struct tup *t, FILE *f)
{
    pthread_mutex_lock(&t->mu);
    t->log = f;
    pthread_mutex_unlock(&t->mu);
}

void tup_tlog(struct tup *t, const char *fmt, ...)
{
    pthread_mutex_lock(&t->mu);
    FILE *f = t->log;
    pthread_mutex_unlock(&t->mu);
    if (!f)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One fprintf per line so concurrent writers do not interleave within it; the address
     * tells apart two upstreams logging into one terminal (make demo-upstream). */
    fprintf(f, "%s %s\n", t->where, line);
    fflush(f);
}
