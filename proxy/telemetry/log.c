#include "proxy/telemetry/log.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/utf8.h"

/* A worker's buffer, and so the longest line and the largest single write(2). */
#define LOG_BUF_SIZE (64 * 1024)

/* Used only to render again a line that would not fit in an empty buffer: the most bytes of
 * escaped output per string ("..." mark included) and the most delays listed. With the fixed
 * parts of any line (a few hundred bytes) they add up to under LOG_BUF_SIZE, so the second
 * rendering always fits: request 2 x 20 KiB (path, upstream_path) + 8 x 2 KiB + 256 x 11 B;
 * attempt 5 x 2 KiB. */
#define TRUNC_PATH   (20 * 1024)
#define TRUNC_STR    (2 * 1024)
#define TRUNC_DELAYS 256
/* Room an event line keeps for its truncation mark and closing brace. */
#define EVENT_RESERVE 64

/* The last millisecond with a four-digit year (9999-12-31T23:59:59.999Z): times are clamped to
 * [0, this] so that the time field always has the same width. */
#define MAX_UNIX_MS INT64_C(253402300799999)

/* Level and format are read once per line with relaxed loads: a reload may change them at any
 * time, and a line rendered with the old settings just before it is harmless. */
static atomic_int g_level = CFG_LOG_INFO;
static atomic_int g_format = CFG_LOG_JSON;
static atomic_uint_fast64_t g_dropped;

/* One writer at a time, so that lines from different threads never interleave. It also guards
 * the fields below. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_fd = 1;
/* A write stopped in the middle of a line: the next write starts with a newline so that the
 * fragment stays on a line of its own and does not spoil the next good line. */
static bool g_torn;
/* Lines written at once (events, lines without a worker buffer) are rendered here. */
static char g_now_buf[LOG_BUF_SIZE];

struct log_buf {
    size_t len;
    char data[LOG_BUF_SIZE];
};

/* ---- a bounded output ---- */

struct sink {
    char *p;
    size_t cap;
    size_t len;
    bool overflow; /* something did not fit: the line is unusable as it is */
};

static void put(struct sink *s, const char *data, size_t n)
{
    if (s->overflow || n > s->cap - s->len) {
        s->overflow = true;
        return;
    }
    memcpy(s->p + s->len, data, n);
    s->len += n;
}

static void put_lit(struct sink *s, const char *lit)
{
    put(s, lit, strlen(lit));
}

static void put_u64(struct sink *s, uint64_t v)
{
    char tmp[24];
    size_t i = sizeof tmp;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    put(s, tmp + i, sizeof tmp - i);
}

static void put_i64(struct sink *s, int64_t v)
{
    if (v < 0) {
        put(s, "-", 1);
        put_u64(s, (uint64_t)0 - (uint64_t)v);
        return;
    }
    put_u64(s, (uint64_t)v);
}

/* Milliseconds with one decimal, without printf: LC_NUMERIC could turn the point into a comma. */
static void put_duration(struct sink *s, double ms, const char *if_not_finite)
{
    if (!isfinite(ms)) {
        put_lit(s, if_not_finite);
        return;
    }
    /* Keeps the tenths inside int64_t; 1e15 ms is some 30,000 years. */
    if (ms > 1e15)
        ms = 1e15;
    if (ms < -1e15)
        ms = -1e15;
    double scaled = ms * 10.0;
    int64_t tenths = (int64_t)(scaled < 0 ? scaled - 0.5 : scaled + 0.5);
    if (tenths < 0) {
        put(s, "-", 1);
        tenths = -tenths;
    }
    put_i64(s, tenths / 10);
    char frac[2] = { '.', (char)('0' + tenths % 10) };
    put(s, frac, 2);
}

static void put_digits(char *p, unsigned v, int width)
{
    for (int i = width - 1; i >= 0; i--) {
        p[i] = (char)('0' + v % 10);
        v /= 10;
    }
}

/* RFC 3339 in UTC with milliseconds, always 24 bytes: 2026-11-21T10:15:30.123Z */
static void put_time(struct sink *s, int64_t unix_ms)
{
    if (unix_ms < 0)
        unix_ms = 0;
    if (unix_ms > MAX_UNIX_MS)
        unix_ms = MAX_UNIX_MS;
    time_t secs = (time_t)(unix_ms / 1000);
    struct tm tm;
    if (!gmtime_r(&secs, &tm))
        memset(&tm, 0, sizeof tm);
    char t[24] = "0000-00-00T00:00:00.000Z";
    put_digits(t, (unsigned)(tm.tm_year + 1900), 4);
    put_digits(t + 5, (unsigned)(tm.tm_mon + 1), 2);
    put_digits(t + 8, (unsigned)tm.tm_mday, 2);
    put_digits(t + 11, (unsigned)tm.tm_hour, 2);
    put_digits(t + 14, (unsigned)tm.tm_min, 2);
    put_digits(t + 17, (unsigned)tm.tm_sec, 2);
    put_digits(t + 20, (unsigned)(unix_ms % 1000), 3);
    put(s, t, sizeof t);
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return 0;
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- escaping ---- */

enum esc_mode {
    ESC_JSON, /* inside a JSON string */
    ESC_TEXT, /* inside a quoted text value */
    ESC_BARE, /* unquoted text (messages, keys, plain values): only what could break the line */
};

/* Escapes one unit at p (a character, or one byte that starts no well-formed character) into
 * out (8 bytes); returns the input bytes it took, and its escaped length in *out_len. Invalid
 * bytes become \u00XX in JSON (the contract's choice: the line stays valid UTF-8) and \xNN in
 * text. DEL is escaped too: it is a control character a terminal may act on. */
static size_t esc_unit(const unsigned char *p, size_t n, enum esc_mode mode, char *out,
                       size_t *out_len)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char c = p[0];
    size_t seq = utf8_len(p, n);
    if (seq > 1) {
        memcpy(out, p, seq);
        *out_len = seq;
        return seq;
    }
    if (seq == 1 && c >= 0x20 && c != 0x7F && c != '\\' && (c != '"' || mode == ESC_BARE)) {
        out[0] = (char)c;
        *out_len = 1;
        return 1;
    }
    char short_esc = 0;
    switch (c) {
    case '"':
        short_esc = '"';
        break;
    case '\\':
        short_esc = '\\';
        break;
    case '\n':
        short_esc = 'n';
        break;
    case '\r':
        short_esc = 'r';
        break;
    case '\t':
        short_esc = 't';
        break;
    default:
        break;
    }
    if (short_esc) {
        out[0] = '\\';
        out[1] = short_esc;
        *out_len = 2;
    } else if (mode == ESC_JSON) {
        memcpy(out, "\\u00", 4);
        out[4] = hex[c >> 4];
        out[5] = hex[c & 0xF];
        *out_len = 6;
    } else {
        memcpy(out, "\\x", 2);
        out[2] = hex[c >> 4];
        out[3] = hex[c & 0xF];
        *out_len = 4;
    }
    return 1;
}

static size_t escaped_len(const unsigned char *p, size_t n, enum esc_mode mode)
{
    size_t total = 0;
    char unit[8];
    while (n > 0) {
        size_t ulen;
        size_t k = esc_unit(p, n, mode, unit, &ulen);
        total += ulen;
        p += k;
        n -= k;
    }
    return total;
}

/* Writes str escaped, in at most 'limit' bytes (>= 3). When it does not fit, it is cut at a
 * character boundary (never inside an escape or a UTF-8 sequence) and "..." marks the cut. */
static void put_escaped(struct sink *s, const char *str, size_t limit, enum esc_mode mode)
{
    const unsigned char *p = (const unsigned char *)str;
    size_t n = strlen(str);
    size_t used = 0;
    char unit[8];
    while (n > 0) {
        /* A run of printable ASCII that needs no escape goes in one copy, as far as it stays
         * clear of the limit (exactly what the unit by unit path below would write). */
        size_t run = 0, room = used + 3 <= limit ? limit - 3 - used : 0;
        while (run < n && run < room && p[run] >= 0x20 && p[run] < 0x7F && p[run] != '\\' &&
               (p[run] != '"' || mode == ESC_BARE))
            run++;
        if (run) {
            put(s, (const char *)p, run);
            used += run;
            p += run;
            n -= run;
            continue;
        }
        size_t ulen;
        size_t k = esc_unit(p, n, mode, unit, &ulen);
        /* Near the limit, the rest is measured once: whole if it fits, else the mark. */
        if (used + ulen > limit - 3 && escaped_len(p, n, mode) > limit - used) {
            put(s, "...", 3);
            return;
        }
        put(s, unit, ulen);
        used += ulen;
        p += k;
        n -= k;
    }
}

static void put_json_str(struct sink *s, const char *str, size_t limit)
{
    if (!str) {
        put(s, "null", 4);
        return;
    }
    put(s, "\"", 1);
    put_escaped(s, str, limit, ESC_JSON);
    put(s, "\"", 1);
}

/* A text value goes bare when it cannot be mistaken: not empty, not "-" (which stands for
 * NULL), and nothing that would need escaping or split it into two fields. */
static bool text_bare(const char *str)
{
    const unsigned char *p = (const unsigned char *)str;
    size_t n = strlen(str);
    if (n == 0 || strcmp(str, "-") == 0)
        return false;
    while (n > 0) {
        size_t k = utf8_len(p, n);
        if (k == 0 || (k == 1 && (p[0] <= 0x20 || p[0] == 0x7F || p[0] == '"' || p[0] == '\\')))
            return false;
        p += k;
        n -= k;
    }
    return true;
}

static void put_text_value(struct sink *s, const char *str, size_t limit)
{
    if (!str) {
        put(s, "-", 1);
    } else if (text_bare(str)) {
        put_escaped(s, str, limit, ESC_BARE);
    } else {
        put(s, "\"", 1);
        put_escaped(s, str, limit, ESC_TEXT);
        put(s, "\"", 1);
    }
}

/* ---- lines ---- */

enum line_kind { LINE_REQUEST, LINE_ATTEMPT, LINE_EVENT };

struct line {
    enum line_kind kind;
    enum cfg_log_format format;
    const struct log_request *req;
    const struct log_attempt *att;
    /* events */
    enum cfg_log_level level;
    int64_t unix_ms;
    const char *msg;
    va_list *pairs; /* copied for each rendering, which may happen twice */
};

/* Each level's name in JSON, and in text padded to one width so that text lines align. */
static const struct {
    const char *json, *text;
} level_names[] = {
    [CFG_LOG_DEBUG] = { "debug", "DEBUG" },
    [CFG_LOG_INFO] = { "info", "INFO " },
    [CFG_LOG_WARN] = { "warn", "WARN " },
    [CFG_LOG_ERROR] = { "error", "ERROR" },
};
_Static_assert(sizeof level_names / sizeof level_names[0] == CFG_LOG_ERROR + 1,
               "a name for every enum cfg_log_level value");

/* What every line starts with: time, level and message. The fields follow. */
static void put_head(struct sink *s, bool json, int64_t unix_ms, enum cfg_log_level level,
                     const char *msg, size_t lim)
{
    if ((unsigned)level > CFG_LOG_ERROR)
        level = CFG_LOG_INFO;
    if (json) {
        put_lit(s, "{\"time\":\"");
        put_time(s, unix_ms);
        put_lit(s, "\",\"level\":\"");
        put_lit(s, level_names[level].json);
        put_lit(s, "\",\"msg\":");
        put_json_str(s, msg, lim);
    } else {
        put_time(s, unix_ms);
        put(s, " ", 1);
        put_lit(s, level_names[level].text);
        put(s, " ", 1);
        put_escaped(s, msg, lim, ESC_BARE);
    }
}

/* The key of a request or attempt field: ,"name": in JSON; in text, text_key, which carries
 * its own separator (" route=", " -> ", or a bare " " for a positional field). */
static void field_key(struct sink *s, bool json, const char *name, const char *text_key)
{
    if (json) {
        put(s, ",\"", 2);
        put_lit(s, name);
        put(s, "\":", 2);
    } else {
        put_lit(s, text_key);
    }
}

/* A string field; NULL is null in JSON and - in text. */
static void field_str(struct sink *s, bool json, const char *name, const char *text_key,
                      const char *v, size_t lim)
{
    field_key(s, json, name, text_key);
    if (json)
        put_json_str(s, v, lim);
    else
        put_text_value(s, v, lim);
}

static void field_u64(struct sink *s, bool json, const char *name, const char *text_key, uint64_t v)
{
    field_key(s, json, name, text_key);
    put_u64(s, v);
}

/* A duration; text gives it its unit ("12.5ms"), JSON its name ("duration_ms"). */
static void field_duration(struct sink *s, bool json, const char *name, const char *text_key,
                           double ms)
{
    field_key(s, json, name, text_key);
    put_duration(s, ms, json ? "null" : "-");
    if (!json)
        put(s, "ms", 2);
}

/* A request or attempt line is the same fields in the same order in both formats; only the
 * keys and the quoting differ (docs/logs.md). */
static void render_request(struct sink *s, const struct log_request *r, bool json, bool trunc)
{
    size_t lim = trunc ? TRUNC_STR : SIZE_MAX;
    size_t lim_path = trunc ? TRUNC_PATH : SIZE_MAX;
    size_t n_delays = r->delays ? r->n_delays : 0;
    if (trunc && n_delays > TRUNC_DELAYS)
        n_delays = TRUNC_DELAYS;

    put_head(s, json, r->unix_ms, CFG_LOG_INFO, "request", lim);
    field_str(s, json, "route", " route=", r->route, lim);
    field_str(s, json, "method", " ", r->method, lim);
    field_str(s, json, "path", " ", r->path, lim_path);
    field_key(s, json, "status", " -> ");
    put_i64(s, r->status);
    field_u64(s, json, "attempts", " attempts=", r->attempts);
    field_key(s, json, "delays_ms", " delays=");
    put_lit(s, json ? "[" : n_delays == 0 ? "-" : "");
    for (size_t i = 0; i < n_delays; i++) {
        if (i > 0)
            put(s, ",", 1);
        put_u64(s, r->delays[i]);
    }
    if (json)
        put(s, "]", 1);
    field_duration(s, json, "duration_ms", " ", r->duration_ms);
    field_str(s, json, "upstream", " upstream=", r->upstream, lim);
    field_str(s, json, "upstream_path", " upstream_path=", r->upstream_path, lim_path);
    field_str(s, json, "stop", " stop=", r->stop, lim);
    field_str(s, json, "request_id", " id=", r->request_id, lim);
    if (r->protocol)
        field_str(s, json, "protocol", " proto=", r->protocol, lim);
    field_str(s, json, "client_addr", " client=", r->client_addr, lim);
    if (r->client_port)
        field_u64(s, json, "client_port", " client_port=", r->client_port);
    else
        field_str(s, json, "client_port", " client_port=", NULL, lim);
    field_str(s, json, "user_agent", " ua=", r->user_agent, lim);
    field_u64(s, json, "bytes_from_client", " bytes_in=", r->bytes_from_client);
    field_u64(s, json, "bytes_to_client", " bytes_out=", r->bytes_to_client);
    if (r->grpc && r->grpc_status >= 0)
        field_u64(s, json, "grpc_status", " grpc=", (uint64_t)r->grpc_status);
    else if (r->grpc)
        field_str(s, json, "grpc_status", " grpc=", NULL, lim);
    put_lit(s, json ? "}\n" : "\n");
}

static void render_attempt(struct sink *s, const struct log_attempt *a, bool json, bool trunc)
{
    size_t lim = trunc ? TRUNC_STR : SIZE_MAX;

    put_head(s, json, a->unix_ms, CFG_LOG_DEBUG, "attempt", lim);
    field_str(s, json, "route", " route=", a->route, lim);
    field_str(s, json, "request_id", " id=", a->request_id, lim);
    field_u64(s, json, "attempt", " attempt=", a->attempt);
    field_str(s, json, "upstream", " upstream=", a->upstream, lim);
    field_str(s, json, "outcome", " outcome=", a->outcome, lim);
    field_duration(s, json, "duration_ms", " ", a->duration_ms);
    field_str(s, json, "decision", " decision=", a->decision, lim);
    field_u64(s, json, "delay_ms", " delay=", a->delay_ms);
    put_lit(s, json ? "}\n" : "ms\n"); /* text: the delay's unit, then the end */
}

const char log_num_mark[] = "";

static void render_event(struct sink *s, const struct line *l, bool trunc)
{
    bool json = l->format == CFG_LOG_JSON;
    size_t lim = trunc ? TRUNC_STR : SIZE_MAX;
    put_head(s, json, l->unix_ms, l->level, l->msg ? l->msg : "", lim);

    va_list ap;
    va_copy(ap, *l->pairs);
    const char *key;
    while ((key = va_arg(ap, const char *)) != NULL) {
        bool is_num = key == log_num_mark;
        const char *value = NULL;
        int64_t num = 0;
        if (is_num) {
            key = va_arg(ap, const char *);
            num = va_arg(ap, int64_t);
        } else {
            value = va_arg(ap, const char *);
        }
        /* Pairs are unbounded in number: a truncated line keeps those that surely fit. */
        if (trunc && s->cap - s->len < 2 * (TRUNC_STR + 2) + 4 + EVENT_RESERVE) {
            put_lit(s, json ? ",\"truncated\":true" : " truncated=true");
            break;
        }
        if (json) {
            put(s, ",", 1);
            put_json_str(s, key, lim);
            put(s, ":", 1);
        } else {
            put(s, " ", 1);
            put_escaped(s, key, lim, ESC_BARE);
            put(s, "=", 1);
        }
        if (is_num)
            put_i64(s, num);
        else if (json)
            put_json_str(s, value, lim);
        else
            put_text_value(s, value, lim);
    }
    va_end(ap);
    put_lit(s, json ? "}\n" : "\n");
}

/* Renders l into p (cap bytes); returns its length, or 0 when it does not fit. */
static size_t render(char *p, size_t cap, const struct line *l, bool trunc)
{
    struct sink s = { .p = p, .cap = cap };
    bool json = l->format == CFG_LOG_JSON;
    switch (l->kind) {
    case LINE_REQUEST:
        render_request(&s, l->req, json, trunc);
        break;
    case LINE_ATTEMPT:
        render_attempt(&s, l->att, json, trunc);
        break;
    case LINE_EVENT:
        render_event(&s, l, trunc);
        break;
    }
    return s.overflow ? 0 : s.len;
}

/* Whole if it fits in cap, else truncated; 0 only if even that does not fit (not expected). */
static size_t render_fitted(char *p, size_t cap, const struct line *l)
{
    size_t n = render(p, cap, l, false);
    return n ? n : render(p, cap, l, true);
}

/* ---- writing ---- */

/* Loops on partial writes and EINTR. Any other failure (EAGAIN included) gives up on the rest
 * rather than wait: a stalled log reader must not stall the workers queued on the lock. */
static size_t write_all(int fd, const char *p, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, p + done, n - done);
        if (w > 0)
            done += (size_t)w;
        else if (w < 0 && errno == EINTR)
            continue;
        else
            break;
    }
    return done;
}

static void count_dropped(const char *p, size_t n)
{
    uint64_t lines = 0;
    for (const char *q = p; (q = memchr(q, '\n', n - (size_t)(q - p))) != NULL; q++)
        lines++;
    atomic_fetch_add_explicit(&g_dropped, lines, memory_order_relaxed);
}

/* Writes whole lines; called with g_lock held. errno is kept for the caller. */
static void write_lines(const char *p, size_t n)
{
    int saved_errno = errno;
    if (g_torn) {
        if (write_all(g_fd, "\n", 1) != 1) {
            count_dropped(p, n);
            errno = saved_errno;
            return;
        }
        g_torn = false;
    }
    size_t done = write_all(g_fd, p, n);
    if (done < n) {
        /* A line counts as dropped unless its newline went out. */
        count_dropped(p + done, n - done);
        g_torn = done > 0 && p[done - 1] != '\n';
    }
    errno = saved_errno;
}

/* Renders into the shared buffer and writes at once (events, lines without a worker buffer). */
static void write_now(const struct line *l)
{
    pthread_mutex_lock(&g_lock);
    size_t n = render_fitted(g_now_buf, sizeof g_now_buf, l);
    if (n)
        write_lines(g_now_buf, n);
    else
        atomic_fetch_add_explicit(&g_dropped, 1, memory_order_relaxed);
    pthread_mutex_unlock(&g_lock);
}

static void buf_add(struct log_buf *b, const struct line *l)
{
    if (!b) {
        write_now(l);
        return;
    }
    size_t n = render(b->data + b->len, LOG_BUF_SIZE - b->len, l, false);
    if (n == 0) {
        log_flush(b);
        n = render_fitted(b->data, LOG_BUF_SIZE, l);
    }
    if (n == 0) {
        atomic_fetch_add_explicit(&g_dropped, 1, memory_order_relaxed);
        return;
    }
    b->len += n;
}

/* ---- the interface ---- */

void log_configure(enum cfg_log_level level, enum cfg_log_format format)
{
    atomic_store_explicit(&g_level, (int)level, memory_order_relaxed);
    atomic_store_explicit(&g_format, (int)format, memory_order_relaxed);
}

bool log_enabled(enum cfg_log_level level)
{
    return (int)level >= atomic_load_explicit(&g_level, memory_order_relaxed);
}

void log_set_fd(int fd)
{
    pthread_mutex_lock(&g_lock);
    g_fd = fd;
    g_torn = false; /* a fragment on the old fd says nothing about the new one */
    pthread_mutex_unlock(&g_lock);
}

/* The format a line is rendered in: read once per line. */
static enum cfg_log_format format_now(void)
{
    return (enum cfg_log_format)atomic_load_explicit(&g_format, memory_order_relaxed);
}

uint64_t log_dropped_lines(void)
{
    return atomic_load_explicit(&g_dropped, memory_order_relaxed);
}

struct log_buf *log_buf_new(void)
{
    struct log_buf *b = malloc(sizeof *b);
    if (b)
        b->len = 0;
    return b;
}

void log_buf_free(struct log_buf *b)
{
    if (!b)
        return;
    log_flush(b);
    free(b);
}

void log_flush(struct log_buf *b)
{
    if (!b || b->len == 0)
        return;
    pthread_mutex_lock(&g_lock);
    write_lines(b->data, b->len);
    pthread_mutex_unlock(&g_lock);
    b->len = 0;
}

void log_request(struct log_buf *b, const struct log_request *r)
{
    if (r && log_enabled(CFG_LOG_INFO))
        buf_add(b, &(struct line){ .kind = LINE_REQUEST, .format = format_now(), .req = r });
}

void log_attempt(struct log_buf *b, const struct log_attempt *a)
{
    if (a && log_enabled(CFG_LOG_DEBUG))
        buf_add(b, &(struct line){ .kind = LINE_ATTEMPT, .format = format_now(), .att = a });
}

void log_event(enum cfg_log_level level, const char *msg, ...)
{
    if (!log_enabled(level))
        return;
    va_list ap;
    va_start(ap, msg);
    struct line l = {
        .kind = LINE_EVENT,
        .format = format_now(),
        .level = level,
        .unix_ms = wall_ms(),
        .msg = msg,
        .pairs = &ap,
    };
    write_now(&l);
    va_end(ap);
}
