/* backend -- what the store's backends (sqlite*.c, pg*.c) share in front of their thread.
 *
 * Both work the same way (store.h): an operation checks its inputs, queues its call under a
 * mutex and wakes the backend's thread, which takes every call waiting (store_opts.max_batch at
 * most), runs them in one transaction, commits, and only then finishes them. What differs is
 * the database: each backend's state starts with a struct store_q, so that the operations'
 * front (backend.c) serves both tables of operations (BACKEND_OPS).
 */
#ifndef RETRYPROXY_PROXY_STORE_BACKEND_H
#define RETRYPROXY_PROXY_STORE_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>

#include "proxy/store/store.h"

/* A call's operation (store_call.op). */
enum store_op {
    OP_ENQUEUE,
    OP_CLAIM,
    OP_CLAIM_EXCEPT,
    OP_COMPLETE,
    OP_RESCHEDULE,
    OP_BURY,
    OP_INSERT_DEAD,
    OP_LIST,
    OP_GET,
    OP_REPLAY,
    OP_DROP,
    OP_FIND,
    OP_BULK,
    OP_COUNTS,
    OP_RENEW,
};

/* The first member of every backend's struct store_impl. 'o', 'key' and what 'o' points to are
 * the store's own copies; the store thread alone reads 'o' once the thread runs. */
struct store_q {
    struct store pub;
    struct store_opts o;
    unsigned char key[32]; /* o.key points here when set; o.sensitive is a copy */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct store_call *head, *tail; /* calls handed over, under mu */
    bool closing;
    struct store_opts *tuned; /* a reload's settings, under mu until the thread takes them */
    /* For stats() from any thread (store_q_stats()); the backend's thread writes them. */
    struct {
        _Atomic uint64_t commits, enqueued, refused, count, bytes, commit_us, recovered, swept;
        _Atomic uint64_t down, disconnects;
    } st;
};

/* Copies 'o' (its key, its names, its strings) into q and makes q->pub; 0, or STORE_EIO
 * (out of memory: store_q_fini() frees what was made). */
int store_q_init(struct store_q *q, const struct store_opts *o, const struct store_ops *ops);
void store_q_fini(struct store_q *q);
/* For the thread: waits for calls (waking every 'wake_ms' ms when it is not 0, to return
 * NULL with *stop false: a turn without calls), then takes up to 'max' (0: all). NULL with
 * *stop true: closing, and every call handed over was taken. A reload's settings are taken
 * into q->o first. */
struct store_call *store_q_take(struct store_q *q, size_t max, int wake_ms, bool *stop);
/* Tells the thread to finish what was handed over and stop, and joins it. */
void store_q_stop(struct store_q *q);

/* Whether an operation changes rows (it runs under its own savepoint). */
bool store_op_writes(int op);

/* What a backend does for each operation inside its open transaction: 0 or a STORE_E*. */
struct store_runner {
    int (*enqueue)(struct store_impl *s, struct store_call *c);
    int (*claim)(struct store_impl *s, struct store_call *c); /* claim_* */
    int (*end)(struct store_impl *s, struct store_call *c);   /* complete, reschedule, bury */
    int (*insert_dead)(struct store_impl *s, struct store_call *c);
    int (*list)(struct store_impl *s, struct store_call *c);
    int (*get)(struct store_impl *s, const char *id, struct store_delivery *d); /* whole */
    int (*change)(struct store_impl *s, struct store_call *c);                  /* replay, drop */
    int (*find)(struct store_impl *s, struct store_call *c);
    int (*bulk)(struct store_impl *s, struct store_call *c);
    int (*counts)(struct store_impl *s, struct store_call *c);
    int (*renew)(struct store_impl *s, struct store_call *c);
};
/* A backend's table of the functions PREFIX_enqueue ... PREFIX_counts. */
#define STORE_RUNNER(p)                                                                            \
    {                                                                                              \
        .enqueue = p##_enqueue, .claim = p##_claim, .end = p##_end,                                \
        .insert_dead = p##_insert_dead, .list = p##_list, .get = p##_get, .change = p##_change,    \
        .find = p##_find, .bulk = p##_bulk, .counts = p##_counts, .renew = p##_renew               \
    }
/* Runs call 'c' by its operation with r's function. */
int store_q_run(const struct store_runner *r, struct store_impl *s, struct store_call *c);

/* The end of a batch whose transaction began at t0 (store_mono_us()): when 'lost' (a STORE_E*:
 * it did not commit), every write fails with it, and so does every call from 'stop' on (not
 * run); else the commit is counted and timed (on_commit). Then the store's count and bytes are
 * published, and each call is counted (accepts refused, new ones) and finished. */
void store_q_end_batch(struct store_q *q, struct store_call *batch, const struct store_call *stop,
                       int lost, uint64_t t0, uint64_t count, uint64_t bytes);
void store_q_stats(struct store_impl *s, struct store_stats *out);
/* counts: the row of 'route' in c->counts, added (zeroed, its name copied) when the last one is
 * another route's (the rows come grouped by route); *cap is the array's room. NULL when out of
 * memory. */
struct store_count *store_count_row(struct store_call *c, size_t *cap, const char *route);

/* Retention (docs/delivery.md): a sweep deletes at most STORE_SWEEP_BATCH rows of a state, at
 * most once every STORE_SWEEP_EVERY_MS. store_q_sweep_due() says whether one is due now (*last:
 * the time of the last, updated), with the cut of delivered rows and of dead ones (0: dead
 * letters are kept); store_q_swept() counts what it deleted and, when it met a full batch,
 * makes the next turn sweep again. */
#define STORE_SWEEP_BATCH    200
#define STORE_SWEEP_EVERY_MS 1000
bool store_q_sweep_due(struct store_q *q, uint64_t *last, uint64_t *delivered_cut,
                       uint64_t *dead_cut);
void store_q_swept(struct store_q *q, uint64_t *last, int delivered, int dead);

/* The operations' front, the same for every backend. */
int store_q_enqueue(struct store_impl *s, struct store_call *c, const struct store_new *d);
int store_q_claim_due(struct store_impl *s, struct store_call *c, const char *owner, size_t max);
int store_q_claim_route(struct store_impl *s, struct store_call *c, const char *owner,
                        const char *route, size_t max);
int store_q_claim_except(struct store_impl *s, struct store_call *c, const char *owner,
                         const char *const *routes, size_t n, size_t max);
int store_q_complete(struct store_impl *s, struct store_call *c, const char *id, const char *owner,
                     const struct store_attempt *a);
int store_q_reschedule(struct store_impl *s, struct store_call *c, const char *id,
                       const char *owner, const struct store_attempt *a, uint64_t next_at);
int store_q_bury(struct store_impl *s, struct store_call *c, const char *id, const char *owner,
                 const struct store_attempt *a, const struct store_dead *dead);
int store_q_renew(struct store_impl *s, struct store_call *c, const char *owner,
                  const char *const *ids, size_t n);
int store_q_insert_dead(struct store_impl *s, struct store_call *c, const struct store_dead_new *d);
int store_q_list(struct store_impl *s, struct store_call *c, const struct store_filter *f);
int store_q_get(struct store_impl *s, struct store_call *c, const char *id);
int store_q_replay(struct store_impl *s, struct store_call *c, const char *id);
int store_q_drop(struct store_impl *s, struct store_call *c, const char *id);
int store_q_find(struct store_impl *s, struct store_call *c, const struct store_match *m);
int store_q_bulk(struct store_impl *s, struct store_call *c, const struct store_bulk *b);
int store_q_counts(struct store_impl *s, struct store_call *c);
int store_q_tune(struct store_impl *s, const struct store_tuning *t);

/* A table of operations' shared entries: a backend adds its name and close. */
#define BACKEND_OPS                                                                                \
    .enqueue = store_q_enqueue, .claim_due = store_q_claim_due,                                    \
    .claim_route = store_q_claim_route, .claim_except = store_q_claim_except,                      \
    .complete = store_q_complete, .reschedule = store_q_reschedule, .bury = store_q_bury,          \
    .renew = store_q_renew, .insert_dead = store_q_insert_dead, .list = store_q_list,              \
    .get = store_q_get, .replay = store_q_replay, .drop = store_q_drop, .find = store_q_find,      \
    .bulk = store_q_bulk, .counts = store_q_counts, .tune = store_q_tune, .stats = store_q_stats

/* The store's wall clock, ms since the epoch (store_opts.clock, else CLOCK_REALTIME). */
uint64_t store_q_now(const struct store_opts *o);
/* When the i-th row of a replay batch is due, by struct store_bulk's rule: its first_at ('now'
 * when 0), then one row every 1000 / rate ms, i counted on from 'done'. */
uint64_t store_bulk_due_at(const struct store_bulk *b, uint64_t now, size_t i);
/* CLOCK_MONOTONIC in µs (commit latencies). */
uint64_t store_mono_us(void);

/* sqlite_seal.c: the sensitive fields of delivery 'id' sealed (or left out without a key) into a
 * new array *out of *nout, every string its own copy (free with store_fields_free()). 0 or
 * STORE_EIO. And a read delivery's sealed values opened (left sealed without a key or when one
 * does not open: never shown, see seal.h). */
int sql_seal_fields(const struct store_opts *o, const char *id, const struct store_field *in,
                    size_t n, struct store_field **out, size_t *nout);
void sql_open_fields(const struct store_opts *o, struct store_delivery *d);
/* The head's fields as both backends keep them: one blob of "name\0value\0" pairs, 'n' fields
 * of no NUL each packed into a malloc'd blob of *len bytes (NULL when out of memory), and a
 * blob read back into d->fields and d->nfields. A blob that is not such pairs (a NUL missing at
 * its end, a name without its value) is a damaged row: STORE_EIO, not fields lost quietly.
 * d->fields is d's to free either way. */
char *sql_fields_pack(const struct store_field *f, size_t n, size_t *len);
/* An accept's row before it is written: a new id in c->id, its fields sealed (those left out
 * counted in c->left_out) and packed into row->fields (malloc'd, row->flen bytes), its size as
 * the bounds count it in row->size; then the bounds, against 'count' rows and 'bytes' kept
 * now. 0; STORE_EFULL (nothing made, c->id empty); STORE_EIO. */
struct sql_row {
    char *fields;
    size_t flen;
    uint64_t size;
};
int sql_new_row(const struct store_opts *o, struct store_call *c, const struct store_new *d,
                uint64_t count, uint64_t bytes, struct sql_row *row);
int sql_fields_unpack(struct store_delivery *d, const char *b, size_t len);

#endif
