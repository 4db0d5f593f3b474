/* store -- where durable deliveries and dead letters are kept (docs/delivery.md).
 *
 * A narrow interface with one backend per file: the embedded SQLite store (sqlite.c) now, the
 * shared PostgreSQL store of issue 40 beside it later. A backend is a table of operations
 * (struct store_ops) and an opaque handle; callers use the store_*() wrappers below and never
 * see which backend runs.
 *
 * Every operation is asynchronous: the caller fills a struct store_call, hands it over, and the
 * result comes back through a completion queue (struct store_cq) whose eventfd the caller's
 * event loop watches (proxy/base/loop.h: readable -> store_cq_drain()). No worker ever runs a
 * database call or waits on fsync: the backend's own thread does, and commits every write that
 * is ready in one transaction (group commit). A completion comes only after its commit: an
 * enqueue whose call finished with 0 is on disk.
 *
 * The rule of libuv: an operation that returns an error (negative) has taken nothing and its
 * call never completes; one that returns 0 completes exactly once, through call->cq, where
 * done(call) runs in the thread that drains the queue.
 *
 * Ownership: the inputs an operation is given (struct store_new, ids, owner, attempts, filters,
 * the strings they point to) are borrowed until the call completes and must not change
 * meanwhile. The results in the call (items, the delivery of get) belong to the call from its
 * completion until store_call_clear().
 */
#ifndef RETRYPROXY_PROXY_STORE_H
#define RETRYPROXY_PROXY_STORE_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The errors every backend returns, negative, besides 0. */
enum {
    /* Full: the store's count or size bound, or the disk (SQLITE_FULL). An accept answers
     * 503 with Retry-After; nothing was kept. */
    STORE_EFULL = -ENOSPC,
    /* The Idempotency-Key of the route was stored with another body (an accept answers 422). */
    STORE_ECONFLICT = -EEXIST,
    STORE_ENOTFOUND = -ENOENT,
    /* The caller no longer holds the delivery's lease (expired and claimed again, replayed,
     * dropped): its outcome is not written. */
    STORE_ESTALE = -ESTALE,
    /* In flight under a live lease: not replayed. */
    STORE_EBUSY = -EBUSY,
    /* The store is closing: the operation was not taken. */
    STORE_ECLOSED = -ESHUTDOWN,
    STORE_EINVAL = -EINVAL,
    /* Any other failure of the database. */
    STORE_EIO = -EIO,
};

/* A delivery's state. scheduled -> in_flight (claimed, under a lease) -> delivered, dead, or
 * scheduled again (rescheduled; or its lease ran out and it is claimed anew). dead or
 * delivered -> scheduled by a replay. */
enum store_state {
    STORE_SCHEDULED = 0,
    STORE_IN_FLIGHT = 1,
    STORE_DELIVERED = 2,
    STORE_DEAD = 3,
};
#define STORE_STATES 4

/* A delivery's id: 128 random bits as 32 lowercase hex digits, and the NUL. */
#define STORE_ID_SIZE 33

struct store_field {
    char *name;
    char *value;
};

/* One attempt of a delivery, as it is recorded. 'outcome' is the attempt's word (what the
 * request log says: "ok", "status", "timeout", "reset"...; the store writes "lease_expired" for
 * an attempt whose process died under it), truncated to fit. */
struct store_attempt {
    uint64_t at_ms;       /* when it started, ms since the epoch */
    uint32_t duration_ms; /* how long it took */
    int status;           /* the HTTP status, 0 for none */
    char outcome[24];
    uint32_t delay_ms; /* reschedule: the wait decided after it (kept as the row's last_delay) */
    /* the upstream it went to, its URL as configured; NULL: none (no attempt went, a lost
     * lease, a row of schema version 2 or before). Borrowed when written; in a record (get),
     * its own copy, freed by store_delivery_clear() */
    const char *upstream;
};

/* A stored delivery, as claim, list and get return it. Every pointer is owned by the record
 * (store_delivery_clear() frees them). list leaves fields, body, the final response and the
 * attempts out (NULL, 0); claim leaves out the final response and the attempts. */
struct store_delivery {
    char id[STORE_ID_SIZE];
    char *route, *method, *target;
    struct store_field *fields;
    size_t nfields;
    char *body;
    size_t body_len;
    char *idem_key;               /* the caller's Idempotency-Key, NULL when none */
    uint64_t body_hash;           /* of the body, compared when an Idempotency-Key comes again */
    uint64_t created_at, next_at; /* ms since the epoch */
    uint32_t attempts;            /* attempts made, lost ones (lease_expired) included */
    uint32_t replays;
    enum store_state state;
    uint64_t claimed_until; /* the lease, when in flight */
    char *claimed_by;
    /* A dead letter's: why ("attempts", "age", "final"...), the final response's head as
     * received, the first bytes of its body (store_opts.dead_body_bytes at most). */
    char *reason;
    char *final_head;
    size_t final_head_len;
    char *final_body;
    size_t final_body_len;
    struct store_attempt *tries; /* get: every attempt, oldest first */
    size_t ntries;
    uint64_t seq;    /* find: its place in the order of accepts (the cursor of paging) */
    int last_status; /* find, get: the last attempt's HTTP status, 0 for none */
    /* claim, get: the wait its last reschedule decided (the previous delay of a decorrelated
     * backoff, docs/backoff.md); 0 before any */
    uint32_t last_delay_ms;
    char *upstream; /* find, get: its last attempt's upstream (store_attempt.upstream); NULL */
};

/* What enqueue stores (borrowed). */
struct store_new {
    const char *route, *method, *target;
    const struct store_field *fields;
    size_t nfields;
    const char *body;
    size_t body_len;
    const char *idem_key; /* NULL: none */
    uint64_t next_at;     /* the first attempt's time; 0: now */
};

/* What bury keeps of the final answer (borrowed). */
struct store_dead {
    const char *reason;
    const char *head;
    size_t head_len;
    const char *body; /* truncated to store_opts.dead_body_bytes */
    size_t body_len;
    /* bury: delete the row and its attempts instead, in the same transaction (its route says
     * delivery.dead_letter false); the lease is checked as for any end */
    bool discard;
};

/* What insert_dead stores (borrowed): a request that was never a delivery, kept as a dead
 * letter at once (a synchronous route's whose retries ran out: routes[].delivery.dead_letter). */
struct store_dead_new {
    struct store_new req; /* its idem_key must be NULL: a dead letter answers for no accept */
    uint32_t attempts;    /* attempts made */
    const struct store_attempt *tries;
    size_t ntries;
    struct store_dead dead;
};

/* list's filter: NULL route and state -1 match all; 'limit' rows from 'offset', by the order
 * they were accepted in. */
struct store_filter {
    const char *route;
    int state;
    uint64_t offset;
    uint32_t limit;
};

/* find's, replay_match's and drop_match's filter (docs/delivery.md, "Admin API"). */
struct store_match {
    const char *route;     /* NULL: any */
    int state;             /* an enum store_state, -1: any */
    uint64_t since, until; /* accepted at in [since, until), ms since the epoch; 0: open */
    int status;            /* the last attempt's HTTP status; 0: any */
    const char *upstream;  /* the last attempt's upstream, its URL as configured; NULL: any */
    uint64_t cursor;       /* find: rows after this one (a store_delivery.seq); 0: from the start */
    bool newest_first;     /* find: the order (the cursor then goes back in time) */
    uint32_t limit;        /* find: rows at most, 1 to STORE_FIND_MAX; 0: 100 */
};
#define STORE_FIND_MAX 1000

/* A bulk replay or drop (store_bulk()) works through the matching rows in transactions of at most
 * this many, each its own call, so that accepts and claims run between them. */
#define STORE_BULK_BATCH 200

/* A bulk replay or drop: one batch of the rows matching 'm' after 'cursor' (oldest first).
 * A replay takes dead and delivered rows only (a state filter of another state matches
 * nothing) and makes the i-th one due at first_at + i * 1000 / rate ms, i counted from 'done'
 * (the rows of the batches before): the courier sends them at 'rate' per second at most.
 * 'dry_run' changes nothing and counts every match at once (c->total). */
struct store_bulk {
    struct store_match m;
    bool replay;
    bool dry_run;
    uint32_t rate;     /* replay: per second, >= 1 */
    uint64_t first_at; /* replay: the first one's due time; 0: now */
    uint64_t done;     /* rows replayed or dropped by the batches before */
};

/* counts: deliveries by route and state, and the oldest pending (scheduled or in flight) of
 * each route, by when it was accepted. */
struct store_count {
    char *route;
    uint64_t n[STORE_STATES];
    uint64_t oldest_pending; /* ms since the epoch; 0: none pending */
};

/* What a reload may change of an open store (store_opts has the same). */
struct store_tuning {
    const char *const *sensitive;
    size_t n_sensitive;
    size_t dead_body_bytes;
    uint64_t delivered_keep_ms, dead_keep_ms;
};

struct store_cq;
struct store_call;
typedef void (*store_done_fn)(struct store_call *c);

struct store_call {
    /* Set by the caller. */
    struct store_cq *cq;
    store_done_fn done; /* may be NULL (store_call_wait) */
    void *arg;
    /* Results, from the completion on. */
    int result;             /* 0 or a STORE_E* */
    bool finished;          /* set by store_cq_drain() before done() */
    bool dup;               /* enqueue: 'id' is an earlier accept's (same key and body) */
    uint32_t left_out;      /* enqueue: sensitive fields not stored (no key: docs/delivery.md) */
    char id[STORE_ID_SIZE]; /* enqueue: the delivery's id */
    struct store_delivery *items; /* claim, list; get: one */
    size_t n;
    uint64_t total;  /* list, find: rows matching the filter; bulk dry run: the count */
    uint64_t cursor; /* find, bulk: the last row's seq (find's next page, bulk's next batch) */
    bool more;       /* find, bulk: rows are left after this page or batch */
    struct store_count *counts; /* counts: one per route */
    size_t ncounts;
    /* The backend's. */
    int op;
    const void *in;
    const char *key, *owner;
    const struct store_attempt *attempt;
    uint64_t when;
    size_t max;
    struct store_call *next;
};

struct store_stats {
    uint64_t commits;   /* transactions committed */
    uint64_t enqueued;  /* new deliveries committed */
    uint64_t refused;   /* enqueues refused STORE_EFULL */
    uint64_t count;     /* deliveries kept, but the delivered */
    uint64_t bytes;     /* the store's size */
    uint64_t commit_us; /* the last commit's time */
    uint64_t recovered; /* in flight at an exclusive open: made due at once (lease_expired) */
    uint64_t swept;     /* rows retention deleted */
    /* A shared store's (PostgreSQL): 1 while its database cannot be reached (every call then
     * fails at once with STORE_EIO), and how many times the connection was lost. */
    uint64_t down;
    uint64_t disconnects;
    /* The lease a claim takes (store_opts.lease_ms): its claimer renews what it still holds
     * well before it runs out (renew). */
    uint64_t lease_ms;
};

struct store_impl;

struct store_ops {
    const char *name;
    int (*enqueue)(struct store_impl *s, struct store_call *c, const struct store_new *d);
    /* Up to 'max' deliveries due now (scheduled with next_at passed, or in flight with their
     * lease run out: those get a "lease_expired" attempt), leased to 'owner'. */
    int (*claim_due)(struct store_impl *s, struct store_call *c, const char *owner, size_t max);
    /* The same, of route 'route' only: a claimer that bounds each route's deliveries in flight
     * (routes[].delivery.max_in_flight) takes no more of a route than it has room for. */
    int (*claim_route)(struct store_impl *s, struct store_call *c, const char *owner,
                       const char *route, size_t max);
    /* The same, of the routes NOT among the 'n' names of 'routes': what no claimer asks for by
     * its route (a route gone from the config since the accept). */
    int (*claim_except)(struct store_impl *s, struct store_call *c, const char *owner,
                        const char *const *routes, size_t n, size_t max);
    /* The three ends of an attempt, by the lease's owner only (STORE_ESTALE otherwise). 'a' is
     * recorded and counted; bury's 'a' may be NULL (the age ran out between attempts), and
     * so may reschedule's: a release (no attempt was made: its upstream was at its bound),
     * back to scheduled at next_at, the lease dropped, the count and history unchanged. */
    int (*complete)(struct store_impl *s, struct store_call *c, const char *id, const char *owner,
                    const struct store_attempt *a);
    int (*reschedule)(struct store_impl *s, struct store_call *c, const char *id, const char *owner,
                      const struct store_attempt *a, uint64_t next_at);
    int (*bury)(struct store_impl *s, struct store_call *c, const char *id, const char *owner,
                const struct store_attempt *a, const struct store_dead *dead);
    /* The leases of the 'n' deliveries of 'ids' that 'owner' still holds, extended to now +
     * store_opts.lease_ms, in one transaction: an attempt that runs long keeps its delivery
     * (docs/delivery.md "Leases"). Rows no longer the owner's are left alone; c->total says how
     * many were renewed. */
    int (*renew)(struct store_impl *s, struct store_call *c, const char *owner,
                 const char *const *ids, size_t n);
    /* A new row in state dead, with its attempts and final answer; STORE_EFULL at a bound, as
     * enqueue. */
    int (*insert_dead)(struct store_impl *s, struct store_call *c, const struct store_dead_new *d);
    int (*list)(struct store_impl *s, struct store_call *c, const struct store_filter *f);
    int (*get)(struct store_impl *s, struct store_call *c, const char *id);
    /* Back to scheduled, due now, same id and history (a dead or delivered one, or a
     * scheduled one: nothing changes); STORE_EBUSY while a lease holds. */
    int (*replay)(struct store_impl *s, struct store_call *c, const char *id);
    int (*drop)(struct store_impl *s, struct store_call *c, const char *id);
    /* The operators' (docs/delivery.md): a page of deliveries matching a filter, every row's
     * count (c->total) and the cursor of the next page; one batch of a replay or drop by
     * filter (struct store_bulk: the ids done in c->items, id and route only); the counts by
     * route and state. */
    int (*find)(struct store_impl *s, struct store_call *c, const struct store_match *m);
    int (*bulk)(struct store_impl *s, struct store_call *c, const struct store_bulk *b);
    int (*counts)(struct store_impl *s, struct store_call *c);
    /* The settings a reload may change (struct store_tuning), copied; the store's thread
     * takes them before its next transaction. Synchronous, from any thread; 0 or
     * STORE_EIO (out of memory: the old ones stay). */
    int (*tune)(struct store_impl *s, const struct store_tuning *t);
    /* Synchronous, from any thread. */
    void (*stats)(struct store_impl *s, struct store_stats *out);
    /* Finishes what was handed over (every call completes), then frees the store. */
    void (*close)(struct store_impl *s);
};

/* A store: its backend's table and handle. */
struct store {
    const struct store_ops *ops;
    struct store_impl *impl;
};

/* The wall clock of delivery times (ms since the epoch); a test passes its own. */
typedef uint64_t (*store_clock_fn)(void *arg);

struct store_opts {
    const char *path; /* the SQLite file */
    /* The PostgreSQL store (store_pg_open): a libpq connection URI or "key=value" string that
     * holds no password; the password (NULL: libpq's own, PGPASSFILE or ~/.pgpass); the
     * namespace every row and query is scoped to (NULL: "default"). docs/delivery.md. */
    const char *pg_url;
    const char *pg_password;
    const char *pg_namespace;
    uint64_t max_bytes;      /* enqueues refused beyond this size; 0: no bound */
    uint64_t max_count;      /* ... or this many kept, delivered aside; 0: no bound */
    uint64_t max_file_bytes; /* a hard cap on the file, met as a full disk; 0: none */
    uint64_t lease_ms;       /* a claim's lease; longer than an attempt can last */
    size_t dead_body_bytes;  /* of a dead letter's final body; 0: 4096 */
    size_t max_batch;        /* calls per transaction; 0: all that are ready (1: the floor) */
    store_clock_fn clock;    /* NULL: CLOCK_REALTIME */
    void *clock_arg;
    /* The process's own file: an flock on PATH.lock, held until close, keeps a second process
     * out (its open fails naming the file); and since no one else can hold a lease on it, every
     * delivery left in flight by a process before is due at once, its lost attempt recorded as
     * "lease_expired", instead of waiting out its lease (docs/delivery.md). */
    bool exclusive;
    /* Secrets at rest (proxy/store/seal.h): the key that seals the sensitive fields (NULL:
     * they are not stored), the names sensitive besides the three credential fields. */
    const unsigned char *key;
    const char *const *sensitive;
    size_t n_sensitive;
    /* Retention: when set, the store thread deletes delivered rows delivered_keep_ms after
     * their last attempt (0: at once), and dead letters dead_keep_ms after (0: never), in
     * batches, at most once a second (the process sets it; the CLI does not). */
    bool retention;
    uint64_t delivered_keep_ms, dead_keep_ms;
    /* Each commit's time, from the store thread (the commit latency histogram); NULL: none. */
    void (*on_commit)(void *arg, double seconds);
    void *on_commit_arg;
};

/* Why an open failed. */
struct store_err {
    char msg[256];
};

/* Opens (creating, or migrating by its user_version) the SQLite store and starts its thread.
 * 0 and *out, or a STORE_E* with err->msg. */
int store_sqlite_open(const struct store_opts *o, struct store **out, struct store_err *err);

/* Opens the shared PostgreSQL store of o->pg_url (creating or migrating its schema, as
 * store_pg_migrate() does) and starts its thread. Never exclusive: a row in flight is claimed
 * again only once its lease ran out. 0 and *out, or a STORE_E* with err->msg (a database of a
 * newer schema than this program's: STORE_EINVAL). */
int store_pg_open(const struct store_opts *o, struct store **out, struct store_err *err);
/* Creates or migrates the schema of the database of o->pg_url under an advisory lock (several
 * proxies starting at once migrate it once), without opening a store: the version found in
 * *from, the one it has now in *to. 0, or a STORE_E* with err->msg. */
int store_pg_migrate(const struct store_opts *o, int *from, int *to, struct store_err *err);

/* Finishes every call handed over, stops the backend and frees the store. Accepts NULL. */
void store_close(struct store *s);

static inline int store_enqueue(struct store *s, struct store_call *c, const struct store_new *d)
{
    return s->ops->enqueue(s->impl, c, d);
}
static inline int store_claim_due(struct store *s, struct store_call *c, const char *owner,
                                  size_t max)
{
    return s->ops->claim_due(s->impl, c, owner, max);
}
static inline int store_claim_route(struct store *s, struct store_call *c, const char *owner,
                                    const char *route, size_t max)
{
    return s->ops->claim_route(s->impl, c, owner, route, max);
}
static inline int store_claim_except(struct store *s, struct store_call *c, const char *owner,
                                     const char *const *routes, size_t n, size_t max)
{
    return s->ops->claim_except(s->impl, c, owner, routes, n, max);
}
static inline int store_complete(struct store *s, struct store_call *c, const char *id,
                                 const char *owner, const struct store_attempt *a)
{
    return s->ops->complete(s->impl, c, id, owner, a);
}
static inline int store_reschedule(struct store *s, struct store_call *c, const char *id,
                                   const char *owner, const struct store_attempt *a,
                                   uint64_t next_at)
{
    return s->ops->reschedule(s->impl, c, id, owner, a, next_at);
}
static inline int store_bury(struct store *s, struct store_call *c, const char *id,
                             const char *owner, const struct store_attempt *a,
                             const struct store_dead *dead)
{
    return s->ops->bury(s->impl, c, id, owner, a, dead);
}
static inline int store_renew(struct store *s, struct store_call *c, const char *owner,
                              const char *const *ids, size_t n)
{
    return s->ops->renew(s->impl, c, owner, ids, n);
}
static inline int store_insert_dead(struct store *s, struct store_call *c,
                                    const struct store_dead_new *d)
{
    return s->ops->insert_dead(s->impl, c, d);
}
static inline int store_list(struct store *s, struct store_call *c, const struct store_filter *f)
{
    return s->ops->list(s->impl, c, f);
}
static inline int store_get(struct store *s, struct store_call *c, const char *id)
{
    return s->ops->get(s->impl, c, id);
}
static inline int store_replay(struct store *s, struct store_call *c, const char *id)
{
    return s->ops->replay(s->impl, c, id);
}
static inline int store_drop(struct store *s, struct store_call *c, const char *id)
{
    return s->ops->drop(s->impl, c, id);
}
static inline int store_find(struct store *s, struct store_call *c, const struct store_match *m)
{
    return s->ops->find(s->impl, c, m);
}
static inline int store_bulk(struct store *s, struct store_call *c, const struct store_bulk *b)
{
    return s->ops->bulk(s->impl, c, b);
}
static inline int store_counts(struct store *s, struct store_call *c)
{
    return s->ops->counts(s->impl, c);
}
static inline int store_tune(struct store *s, const struct store_tuning *t)
{
    return s->ops->tune(s->impl, t);
}
static inline void store_stats(struct store *s, struct store_stats *out)
{
    s->ops->stats(s->impl, out);
}

/* Whether the directory of 'path' is on tmpfs: a store there is lost at every reboot, and in
 * Kubernetes an emptyDir of medium Memory dies with its pod (docs/delivery.md). */
bool store_on_tmpfs(const char *path);

/* The state's name ("scheduled"...), and back (-1 for an unknown name). */
const char *store_state_name(enum store_state st);
int store_state_parse(const char *name);

/* A completion queue: one per thread that calls the store. Its fd (an eventfd) is readable
 * when calls have completed; store_cq_drain() then runs their done() in this thread. */
struct store_cq *store_cq_new(void);
void store_cq_free(struct store_cq *q); /* accepts NULL; no call may be pending on it */
int store_cq_fd(const struct store_cq *q);
/* Runs done() of every completed call, in completion order; how many. */
size_t store_cq_drain(struct store_cq *q);
/* Waits up to timeout_ms (-1: no bound) for 'c' to complete, draining its queue (other calls'
 * done() run too). For the CLI, the admin thread and tests. 0, or -ETIMEDOUT. */
int store_call_wait(struct store_call *c, int timeout_ms);

/* Frees what the call's results hold and clears them (the call may be used again). */
void store_call_clear(struct store_call *c);
/* Frees what a delivery record holds. */
void store_delivery_clear(struct store_delivery *d);
/* Frees 'n' fields whose names and values were allocated one by one, and their array. */
void store_fields_free(struct store_field *f, size_t n);

/* For backends: hands a finished call to its queue (any thread). */
void store_call_finish(struct store_call *c, int result);
/* For backends: a new random id. 0 or -errno. */
int store_new_id(char id[STORE_ID_SIZE]);
/* For backends: the hash kept beside an Idempotency-Key (64-bit FNV-1a). */
uint64_t store_body_hash(const char *body, size_t len);

#endif
