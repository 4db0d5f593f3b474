/* The log suites' shared output file and readers (logtest.h). */
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

/* Every test writes into a fresh unlinked file (a pipe where the test says so). Criterion runs
 * each test in its own process, so the log's process-wide state starts anew each time. */
int lt_fd = -1;

void lt_setup(void)
{
    char path[] = "/tmp/test_log_XXXXXX";
    lt_fd = mkstemp(path);
    cr_assert(lt_fd >= 0, "mkstemp: %s", strerror(errno));
    unlink(path);
    log_set_fd(lt_fd);
    log_configure(CFG_LOG_INFO, CFG_LOG_JSON);
}

void lt_teardown(void)
{
    log_set_fd(1);
    close(lt_fd);
}

/* ---- helpers ---- */

/* Everything written to lt_fd so far, NUL-terminated (lines never hold a NUL). */
char *lt_output(size_t *len)
{
    struct stat st;
    cr_assert(fstat(lt_fd, &st) == 0);
    size_t n = (size_t)st.st_size;
    char *p = malloc(n + 1);
    cr_assert(p);
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(lt_fd, p + got, n - got, (off_t)got);
        cr_assert(r > 0, "pread: %s", strerror(errno));
        got += (size_t)r;
    }
    p[n] = '\0';
    if (len)
        *len = n;
    return p;
}

/* Splits text (taken over) into lines, checking that it ends with a newline. */
struct lines split_lines(char *text, size_t len)
{
    struct lines l = { .all = text };
    cr_assert(len == 0 || text[len - 1] == '\n', "output does not end with a newline");
    for (size_t i = 0; i < len; i++)
        l.n += text[i] == '\n';
    l.v = calloc(l.n + 1, sizeof *l.v);
    cr_assert(l.v);
    char *p = text;
    for (size_t i = 0; i < l.n; i++) {
        char *nl = strchr(p, '\n');
        *nl = '\0';
        l.v[i] = p;
        p = nl + 1;
    }
    return l;
}

struct lines read_lines(void)
{
    size_t len;
    char *text = lt_output(&len);
    return split_lines(text, len);
}

void free_lines(struct lines *l)
{
    free(l->v);
    free(l->all);
}

json_t *lt_parse(const char *line)
{
    json_error_t err;
    json_t *j = json_loads(line, 0, &err);
    cr_assert(j, "not JSON (%s at %d): %.200s", err.text, err.position, line);
    cr_assert(json_is_object(j));
    return j;
}

/* No byte a terminal or a line splitter would act on. */
void expect_no_control(const char *line)
{
    for (const unsigned char *p = (const unsigned char *)line; *p; p++)
        cr_assert(*p >= 0x20 && *p != 0x7F, "control byte 0x%02x in: %.200s", *p, line);
}

static const uint32_t two_delays[] = { 100, 200 };

struct log_request sample_request(void)
{
    return (struct log_request){ .unix_ms = T_MS,
                                 .route = "orders",
                                 .method = "GET",
                                 .path = "/orders/1?x=2",
                                 .status = 200,
                                 .attempts = 3,
                                 .delays = two_delays,
                                 .n_delays = 2,
                                 .duration_ms = 312.5,
                                 .upstream = "http://127.0.0.1:9001",
                                 .upstream_path = "/base/orders/1?x=2",
                                 .stop = NULL,
                                 .request_id = "abc",
                                 .client_addr = "10.1.2.3",
                                 .client_port = 50412,
                                 .user_agent = "curl/8.5.0",
                                 .bytes_from_client = 12,
                                 .bytes_to_client = 3456 };
}

struct log_attempt sample_attempt(void)
{
    return (struct log_attempt){ .unix_ms = T_MS,
                                 .route = "orders",
                                 .request_id = "abc",
                                 .attempt = 2,
                                 .upstream = "http://127.0.0.1:9001",
                                 .outcome = "503",
                                 .duration_ms = 1.2,
                                 .decision = "retry",
                                 .delay_ms = 200 };
}

/* Logs r through a fresh buffer and returns everything written (the caller frees it). */
char *request_output(const struct log_request *r)
{
    size_t before;
    free(lt_output(&before));
    struct log_buf *b = log_buf_new();
    cr_assert(b);
    log_request(b, r);
    log_buf_free(b);
    size_t len;
    char *all = lt_output(&len);
    char *line = strdup(all + before);
    free(all);
    return line;
}

void expect_request(const struct log_request *r, const char *want)
{
    char *got = request_output(r);
    cr_expect_str_eq(got, want);
    free(got);
}

/* Logs r and checks that its line holds 'want'. */
void expect_request_has(const struct log_request *r, const char *want)
{
    char *line = request_output(r);
    cr_expect(strstr(line, want) != NULL, "want %s in %s", want, line);
    free(line);
}

char *lt_fill(char c, size_t n)
{
    char *s = malloc(n + 1);
    cr_assert(s);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

/* Checks an event line: a current time, then exactly 'rest' after it. */
void expect_event_line(const char *line, const char *rest, bool json)
{
    const char *t = json ? line + strlen("{\"time\":\"") : line;
    if (json)
        cr_assert(strncmp(line, "{\"time\":\"", 9) == 0, "%s", line);
    struct tm tm = { 0 };
    char *end = strptime(t, "%Y-%m-%dT%H:%M:%S", &tm);
    cr_assert(end, "no time in %s", line);
    cr_assert(end[0] == '.' && end[1] >= '0' && end[1] <= '9' && end[2] >= '0' && end[2] <= '9' &&
                  end[3] >= '0' && end[3] <= '9' && end[4] == 'Z',
              "%s", line);
    long long diff = (long long)timegm(&tm) - (long long)time(NULL);
    cr_expect(diff >= -5 && diff <= 5, "event time is %lld s off: %s", diff, line);
    cr_expect_str_eq(end + 5, rest);
}
