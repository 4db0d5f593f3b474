/* The store of durable deliveries (proxy/store/store.h) on SQLite, against a real file in a
 * directory of the test's own, with a clock of the test's. The cases both backends share are
 * store_cases_ops.c (the operations and their states, idempotency, leases, bounds, group
 * commit) and store_cases_admin.c (the operators' side); test_store_pg.c runs them again on the
 * PostgreSQL store. Here, what only the SQLite file has: a full disk, its schema's versions, what
 * a SIGKILL leaves behind, and the exclusive open. */
#include "tests/unit/store_suite.h"

#include "tests/unit/store_cases_ops.c"
#include "tests/unit/store_cases_admin.c"
Test(store, a_full_disk_refuses_like_a_full_store_and_keeps_what_it_had)
{
    /* max_file_bytes stands in for the disk: SQLite meets it as SQLITE_FULL. */
    struct store_opts o = opts();
    o.max_file_bytes = 256 * 1024;
    struct store *s = open_with(&o);
    char *big = malloc(32 * 1024 + 1);
    memset(big, 'd', 32 * 1024);
    big[32 * 1024] = '\0';
    char first[STORE_ID_SIZE];
    int r = 0, n = 0;
    while (n < 20 && (r = enqueue(s, "big", NULL, big, 0, n == 0 ? first : NULL)) == 0)
        n++;
    cr_expect_eq(r, STORE_EFULL, "after %d", n);
    cr_expect_gt(n, 0);
    struct store_delivery d;
    cr_expect_eq(get(s, first, &d), 0, "what was stored is still there");
    store_delivery_clear(&d);
    struct store_stats st;
    store_stats(s, &st);
    cr_expect_eq(st.enqueued, (uint64_t)n);
    cr_expect_eq(st.refused, 1);
    store_close(s);
    free(big);
}

Test(store, a_newer_schema_is_refused)
{
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    struct store_opts o = opts();
    struct store *s = NULL;
    struct store_err err;
    cr_assert_eq(store_sqlite_open(&o, &s, &err), STORE_EINVAL);
    cr_expect(strstr(err.msg, "version 99") != NULL, "%s", err.msg);
}

/* A file written by the first schema (version 1, as that program made it) opens: it is
 * migrated, and what it kept is read as it was, its rows' last delay 0. */
Test(store, a_file_of_schema_version_1_is_migrated_and_keeps_its_rows)
{
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    const char *v1 =
        "CREATE TABLE deliveries(seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE,"
        " route TEXT NOT NULL, method TEXT NOT NULL, target TEXT NOT NULL,"
        " fields BLOB NOT NULL, body BLOB NOT NULL, idem_key TEXT, body_hash INTEGER NOT NULL,"
        " created_at INTEGER NOT NULL, next_at INTEGER NOT NULL,"
        " attempts INTEGER NOT NULL DEFAULT 0, replays INTEGER NOT NULL DEFAULT 0,"
        " state INTEGER NOT NULL, claimed_until INTEGER, claimed_by TEXT,"
        " reason TEXT, final_head BLOB, final_body BLOB);"
        "CREATE TABLE attempts(delivery TEXT NOT NULL, at INTEGER NOT NULL,"
        " duration_ms INTEGER NOT NULL, status INTEGER NOT NULL, outcome TEXT NOT NULL);"
        "INSERT INTO deliveries(id, route, method, target, fields, body, body_hash, created_at,"
        " next_at, attempts, state) VALUES('0123456789abcdef0123456789abcdef', 'hooks', 'POST',"
        " '/x', x'', 'old body', 0, 1, 1, 1, 0);"
        "INSERT INTO attempts VALUES('0123456789abcdef0123456789abcdef', 1, 5, 503, 'status');"
        "PRAGMA user_version = 1;";
    cr_assert_eq(sqlite3_exec(db, v1, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
    sqlite3_close(db);
    struct store *s = open_default();
    struct store_delivery d;
    cr_assert_eq(get(s, "0123456789abcdef0123456789abcdef", &d), 0);
    cr_expect_str_eq(d.body, "old body");
    cr_expect_eq(d.attempts, 1);
    cr_expect_eq(d.last_delay_ms, 0);
    cr_expect_null(d.upstream, "no upstream was recorded then");
    cr_assert_eq(d.ntries, 1);
    cr_expect_null(d.tries[0].upstream);
    cr_expect_eq(d.tries[0].status, 503);
    store_delivery_clear(&d);
    cr_expect_eq(claim(s, "w1", 1, NULL), 1, "it is due, as it was");
    store_close(s);
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_expect_geq(sqlite3_column_int(st, 0), 3);
    sqlite3_finalize(st);
    sqlite3_close(db);
}

/* The child of the crash test: enqueues with a few calls outstanding, and writes each id the
 * store acknowledged to 'fd' as it completes, until it is killed. */
static void crash_child(int fd)
{
    struct store_opts o = opts();
    o.clock = NULL;
    struct store *s = NULL;
    struct store_err err;
    if (store_sqlite_open(&o, &s, &err) != 0)
        _exit(2);
    /* open, its schema made: the kills land among the accepts, not before the table exists */
    if (write(fd, "open\n", 5) != 5)
        _exit(5);
    struct store_cq *q = store_cq_new();
    static struct store_new d = {
        .route = "crash", .method = "POST", .target = "/", .body = "crash test body", .body_len = 15
    };
    struct store_call calls[8];
    for (;;) {
        for (int i = 0; i < 8; i++) {
            calls[i] = (struct store_call){ .cq = q };
            if (store_enqueue(s, &calls[i], &d) != 0)
                _exit(3);
        }
        for (int i = 0; i < 8; i++) {
            if (store_call_wait(&calls[i], -1) != 0 || calls[i].result != 0)
                _exit(4);
            char line[STORE_ID_SIZE + 1];
            memcpy(line, calls[i].id, 32);
            line[32] = '\n';
            if (write(fd, line, 33) != 33)
                _exit(5);
        }
    }
}

Test(store, every_acknowledged_id_survives_sigkill, .timeout = 300)
{
    unsigned seed = 20261128;
    size_t acked = 0;
    sqlite3 *db;
    for (int round = 0; round < 30; round++) {
        int fds[2];
        cr_assert_eq(pipe(fds), 0);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            close(fds[0]);
            crash_child(fds[1]);
        }
        close(fds[1]);
        char open_line[5];
        cr_assert_eq(read(fds[0], open_line, 5), 5, "round %d: the child did not open the store",
                     round);
        struct timespec nap = { 0, (long)(20 + rand_r(&seed) % 200) * 1000000L };
        nanosleep(&nap, NULL);
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        cr_assert(WIFSIGNALED(status), "the child ended by itself: %d", status);
        /* What it acknowledged before it died. */
        FILE *in = fdopen(fds[0], "r");
        cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
        sqlite3_stmt *st;
        cr_assert_eq(sqlite3_prepare_v2(db, "SELECT 1 FROM deliveries WHERE id = ?", -1, &st, NULL),
                     SQLITE_OK);
        char line[64];
        size_t n = 0;
        while (fgets(line, sizeof(line), in)) {
            if (strlen(line) != 33)
                continue; /* a line cut by the kill: never a whole acknowledgement */
            line[32] = '\0';
            sqlite3_bind_text(st, 1, line, -1, SQLITE_TRANSIENT);
            cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "round %d: acknowledged %s is lost", round,
                         line);
            sqlite3_reset(st);
            n++;
        }
        fclose(in);
        sqlite3_finalize(st);
        cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
        cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
        cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "ok", "round %d", round);
        sqlite3_finalize(st);
        sqlite3_close(db);
        acked += n;
    }
    cr_log_info("%zu acknowledged ids over 30 kills, all on disk", acked);
    cr_expect_gt(acked, 0, "the children acknowledged nothing: the test tested nothing");
}

/* ---- the process's own file (store_opts.exclusive) ---- */

Test(store, exclusive_open_keeps_a_second_out_naming_the_lock)
{
    struct store_opts o = opts();
    o.exclusive = true;
    struct store *s = open_with(&o);
    struct store *second = NULL;
    struct store_err err;
    cr_assert_eq(store_sqlite_open(&o, &second, &err), STORE_EBUSY);
    cr_assert_null(second);
    cr_assert_not_null(strstr(err.msg, "deliveries.db.lock"), "%s", err.msg);
    store_close(s);
    /* closed: the lock went with it */
    s = open_with(&o);
    store_close(s);
}

/* A delivery in flight when its process went away is due at once at an exclusive open, its
 * lost attempt recorded; a shared open leaves it to its lease. */
Test(store, exclusive_open_makes_what_was_in_flight_due_at_once)
{
    struct store *s = open_default();
    char id[STORE_ID_SIZE], got[1][STORE_ID_SIZE];
    cr_assert_eq(enqueue(s, "r", NULL, "b", 0, id), 0);
    cr_assert_eq(claim(s, "dead-process", 1, got), 1);
    store_close(s);
    s = open_default(); /* not exclusive: the lease (1 s) holds */
    cr_assert_eq(claim(s, "next", 1, NULL), 0);
    store_close(s);
    struct store_opts o = opts();
    o.exclusive = true;
    s = open_with(&o);
    struct store_stats st;
    store_stats(s, &st);
    cr_assert_eq(st.recovered, 1);
    cr_assert_eq(claim(s, "next", 1, got), 1, "due at once, the lease not waited out");
    cr_assert_str_eq(got[0], id);
    struct store_delivery d;
    cr_assert_eq(get(s, id, &d), 0);
    cr_assert_eq(d.ntries, 1);
    cr_assert_str_eq(d.tries[0].outcome, "lease_expired");
    cr_assert_eq(d.attempts, 1);
    store_delivery_clear(&d);
    store_close(s);
}
