/* tup_int -- what the parts of the test upstream share (tests/support/tup*.c): its limits, the
 * plan a request follows, a connection's state, the server's, and the functions one part calls
 * in another. Not for the suites: they use tup.h.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_TUP_INT_H
#define RETRYPROXY_TESTS_SUPPORT_TUP_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "tests/support/tup.h"

#define IN_INIT         4096
#define PIECE           16384        /* body bytes generated per refill of the out buffer */
#define WRITE_BUDGET    (256 * 1024) /* bytes per connection per wakeup, for fairness */
#define LINE_LIMIT      4096         /* chunk-size and trailer lines */
#define MAX_EVENTS      256
#define LINGER_NS       INT64_C(2000000000)
#define RSTWAIT_MAX_NS  INT64_C(2000000000)
#define RSTWAIT_POLL_NS INT64_C(1000000)
#define PAUSE_NS        INT64_C(100000000)
#define KEY_BUCKETS     1024
#define RESET_MID_BODY  65536
#define MAX_BODY_PARAM  (UINT64_C(1) << 40)
#define MAX_DELAY_MS    600000

enum action { ACT_STATUS, ACT_HANG, ACT_RESET, ACT_CLOSE, ACT_RESET_MID, ACT_STALL_MID };

struct plan {
    uint64_t fail;
    enum action action;
    unsigned status;
    unsigned ok;
    char *retry_after; /* owned, NULL if none */
    char *header;      /* "Name: value" of header=NAME:VALUE, owned, NULL if none */
    uint64_t body;
    bool body_set;
    bool chunked;
    bool echo;
    bool close_after;
    bool stale;
    unsigned delay_ms;
};

/* The public record plus what backs its strings. */
struct rec {
    struct tup_req pub;
    char *strings;
};

enum state {
    ST_HEAD,    /* reading a request head */
    ST_BODY,    /* reading a request body */
    ST_DELAY,   /* waiting for the timer before 'pending' */
    ST_WRITE,   /* sending a response */
    ST_HANG,    /* never answering; draining input until the peer goes */
    ST_LINGER,  /* our FIN is sent; draining input until the peer's FIN or the timer */
    ST_RSTWAIT, /* reset-mid: waiting for the peer to ack what was sent, then RST */
};

enum body_mode { BM_NONE, BM_CL, BM_CHUNK_SIZE, BM_CHUNK_DATA, BM_CHUNK_CRLF, BM_TRAILER };

enum pending { PEND_WRITE, PEND_RESET, PEND_CLOSE };

enum after { AFTER_KEEP, AFTER_CLOSE, AFTER_RST, AFTER_HANG };

enum src { SRC_NONE, SRC_BUF, SRC_PATTERN };

/* The request being read on a connection. */
struct cur {
    struct rec *rec;
    struct plan plan;
    bool plan_ok;
    char plan_err[256];
    enum body_mode mode;
    uint64_t left; /* Content-Length or chunk bytes still to come */
    bool keep_alive;
    bool http10;
    bool head_method;
    uint64_t body_len;
    uint64_t hash;
    size_t kept_cap;
    unsigned char *echo;
    size_t echo_len;
    size_t echo_cap;
    bool echo_overflow;
};

struct conn {
    int fd;
    uint64_t id;
    char local[48]; /* the address the client connected to */
    unsigned n_reqs;
    enum state state;
    uint32_t events;
    struct conn *prev;
    struct conn *next;
    size_t heap_idx; /* SIZE_MAX when no timer is armed */
    int64_t deadline;
    int64_t rst_give_up;
    enum pending pending;

    char *in;
    size_t in_len;
    size_t in_cap;
    size_t scan; /* where the search for the end of the head resumes */
    bool eof;
    int64_t last_read_ns; /* when the newest buffered bytes arrived */

    struct cur cur;

    char *out;
    size_t out_len;
    size_t out_off;
    size_t out_cap;
    enum src src;
    unsigned char *src_buf;
    uint64_t src_len;  /* declared body length */
    uint64_t src_stop; /* bytes of it actually sent */
    uint64_t src_off;
    bool src_chunked;
    bool src_final;
    enum after after;
};

struct key {
    struct key *next;
    unsigned count;
    char id[];
};

struct tup {
    int listen_fd;
    int epfd;
    int wake_fd;
    uint16_t port;
    pthread_t thread;
    bool thread_started;

    /* Server thread only. */
    struct conn *conns;
    struct conn **heap;
    size_t heap_n;
    size_t heap_cap;
    struct key *keys[KEY_BUCKETS];
    uint64_t next_conn_id;
    int64_t listen_paused_until; /* 0 when listening */

    /* Shared: guarded by mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct rec **recs;
    size_t n_recs;
    size_t cap_recs;
    uint64_t accepted;
    uint64_t bytes_in; /* every byte read from any connection */
    size_t open;
    char *default_plan;
    FILE *log;
    char where[32]; /* "127.0.0.1:PORT": each log line starts with it */
};

/* An answer to write (answer_begin()). */
struct answer {
    unsigned status;
    unsigned attempt;
    uint64_t seq;
    const char *retry_after;
    const char *header; /* one more "Name: value" field, or NULL */
    bool close;
    bool chunked;
    enum src src;
    const char *text;   /* SRC_BUF from a string */
    unsigned char *buf; /* SRC_BUF taking ownership (echo) */
    uint64_t len;       /* declared body length */
    uint64_t stop;      /* bytes of it to send */
    enum after after;
};

/* tup.c */
void tup_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void *tup_xmalloc(size_t n);
void *tup_xcalloc(size_t n, size_t size);
void *tup_xrealloc(void *p, size_t n);
char *tup_xstrdup(const char *s);
int64_t tup_mono_ns(void);
unsigned tup_key_bump(struct tup *t, const char *id);
void tup_timer_cancel(struct tup *t, struct conn *c);
void tup_timer_arm(struct tup *t, struct conn *c, int64_t deadline);

/* tup_plan.c */
void tup_plan_init(struct plan *p);
void tup_plan_free(struct plan *p);
bool tup_is_ows(char ch);
void tup_trim(const char **s, const char **e);
bool tup_parse_u64(const char *s, const char *e, uint64_t max, uint64_t *out);
int tup_plan_parse(const char *text, struct plan *p, char *err, size_t errlen);

/* tup_rec.c */
void tup_rec_free(struct rec *r);
void tup_publish(struct tup *t, struct rec *r);
void tup_keep_trailer(struct rec *r, const char *line, size_t len);
void tup_tlog(struct tup *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* tup_conn.c */
void tup_set_interest(struct tup *t, struct conn *c, uint32_t events);
void tup_cur_reset(struct conn *c);
void tup_resp_reset(struct conn *c);
void tup_conn_free_fd(struct tup *t, struct conn *c, bool rst);
void tup_conn_close(struct tup *t, struct conn *c, bool rst);
void tup_start_linger(struct tup *t, struct conn *c);
void tup_start_rstwait(struct tup *t, struct conn *c);
void tup_out_append(struct conn *c, const void *p, size_t n);
int tup_conn_write(struct conn *c, bool fill);
void tup_answer_begin(struct conn *c, const struct answer *a);
void tup_answer_error(struct tup *t, struct conn *c, unsigned status, const char *why);

/* tup_parse.c */
void tup_conn_drive(struct tup *t, struct conn *c);
void tup_count_in(struct tup *t, ssize_t n);

#endif
