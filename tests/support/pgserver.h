/* pgserver -- a private PostgreSQL server for the shared store's tests (Debian 12's postgresql
 * 15): initdb into a directory of its own under /tmp, then pg_ctl start on a free port of
 * 127.0.0.1, password authentication (scram-sha-256) for every TCP connection. The server
 * refuses to run as root: when the tests do, every PostgreSQL program runs as the 'postgres'
 * user (else 'nobody') through setpriv, in a directory that user owns.
 *
 * One server per suite: the suite's runner starts it before the tests (a Criterion
 * ReportHook(PRE_ALL)) and stops it after them (POST_ALL); it passes it on to the tests, each
 * in a process of its own, through the environment (pgserver_env()). A runner that crashed
 * leaves its directory, named after its pid: the next pgserver_start() stops such a server and
 * removes its directory. No Criterion here.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_PGSERVER_H
#define RETRYPROXY_TESTS_SUPPORT_PGSERVER_H

#include <stdint.h>

#define PGSERVER_PASSWORD "rp-test-secret"

struct pgserver {
    uint16_t port;
    char dir[96];            /* the data directory (postmaster.pid, the log in DIR/log) */
    char url[160];           /* postgresql://postgres@127.0.0.1:PORT/postgres, no password */
    char password_file[128]; /* PGSERVER_PASSWORD and a newline, readable by the tests */
};

/* Starts a new server; 0, or -1 with why on stderr. */
int pgserver_start(struct pgserver *p);
/* Stops it (fast shutdown), keeping its directory: pgserver_restart() starts it again on the
 * same port. 0 or -1. */
int pgserver_halt(struct pgserver *p);
int pgserver_restart(struct pgserver *p);
/* Stops it if it runs and removes its directory. */
void pgserver_stop(struct pgserver *p);

/* The first value of the first row 'sql' gives, with up to two text parameters $1 and $2 (NULL:
 * not passed), run on the server's database as its user: malloc'd, NULL when the statement
 * failed (said on stderr), found no row, or the value is NULL. */
char *pgserver_query(const struct pgserver *p, const char *sql, const char *a1, const char *a2);

/* The run's one server, for a suite's hooks: started and exported by the runner before the
 * tests (ReportHook(PRE_ALL) calls pgserver_run_start()), stopped after them (POST_ALL). */
void pgserver_run_start(void);
void pgserver_run_stop(void);

/* The runner's server to its tests: pgserver_export() puts it in the environment, and
 * pgserver_env() reads it back (0, or -1 when the runner started none). */
void pgserver_export(const struct pgserver *p);
int pgserver_env(struct pgserver *p);

#endif
