/* pgserver -- a private PostgreSQL server for tests (pgserver.h). */
#include "tests/support/pgserver.h"

#include <dirent.h>
#include <libpq-fe.h>
#include <errno.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/support/fixture.h"
#include "tests/support/proc.h"

#define PG_BIN "/usr/lib/postgresql/15/bin"
#define PREFIX "rp-pg."

/* The user the server runs as when the tests run as root (NULL: as we are). */
static const struct passwd *server_user(void)
{
    if (geteuid() != 0)
        return NULL;
    const struct passwd *pw = getpwnam("postgres");
    return pw ? pw : getpwnam("nobody");
}

/* Runs PG_BIN/prog with its arguments (NULL-ended) as the server's user; 0 or -1, its output
 * on stderr when it failed. */
static int run_pg(const char *prog, ...)
{
    char *argv[32], path[128], uid[32], gid[32];
    size_t n = 0;
    const struct passwd *pw = server_user();
    if (pw) {
        snprintf(uid, sizeof(uid), "--reuid=%u", (unsigned)pw->pw_uid);
        snprintf(gid, sizeof(gid), "--regid=%u", (unsigned)pw->pw_gid);
        argv[n++] = "/usr/bin/setpriv";
        argv[n++] = uid;
        argv[n++] = gid;
        argv[n++] = "--clear-groups";
        argv[n++] = "--";
    }
    snprintf(path, sizeof(path), PG_BIN "/%s", prog);
    argv[n++] = path;
    va_list ap;
    va_start(ap, prog);
    n = proc_args(argv, 32, n, va_arg(ap, const char *), ap);
    va_end(ap);
    struct proc_result r;
    if (proc_run(argv, NULL, 60000, &r) < 0)
        return -1;
    int ok = r.status == 0 ? 0 : -1;
    if (ok < 0)
        fprintf(stderr, "pgserver: %s failed (%d): %s%s\n", prog, r.status, r.out, r.err);
    proc_result_free(&r);
    return ok;
}

/* Servers of runners that died (a crash, a SIGKILL): stopped, their directories removed. */
static void clean_orphans(void)
{
    DIR *d = opendir("/tmp");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        long pid = strncmp(e->d_name, PREFIX, strlen(PREFIX)) == 0
                       ? strtol(e->d_name + strlen(PREFIX), NULL, 10)
                       : 0;
        if (pid <= 0 || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char dir[300];
        snprintf(dir, sizeof(dir), "/tmp/%s", e->d_name);
        char data[320];
        snprintf(data, sizeof(data), "%s/data", dir);
        run_pg("pg_ctl", "-D", data, "-m", "immediate", "-w", "stop", NULL);
        rm_tree(dir);
    }
    if (d)
        closedir(d);
}

int pgserver_restart(struct pgserver *p)
{
    char opts[256], log[160];
    snprintf(opts, sizeof(opts),
             "-p %u -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s -c fsync=off"
             " -c max_connections=50",
             p->port, p->dir);
    snprintf(log, sizeof(log), "%s/log", p->dir);
    return run_pg("pg_ctl", "-D", p->dir, "-l", log, "-o", opts, "-w", "-t", "60", "start", NULL);
}

int pgserver_start(struct pgserver *p)
{
    memset(p, 0, sizeof(*p));
    clean_orphans();
    snprintf(p->dir, sizeof(p->dir), "/tmp/" PREFIX "%ld.XXXXXX", (long)getpid());
    if (!mkdtemp(p->dir))
        return -1;
    const struct passwd *pw = server_user();
    char pwfile[160];
    snprintf(pwfile, sizeof(pwfile), "%s/pw", p->dir);
    snprintf(p->password_file, sizeof(p->password_file), "%s/client-pw", p->dir);
    FILE *f = fopen(pwfile, "w"), *g = fopen(p->password_file, "w");
    if (f)
        fputs(PGSERVER_PASSWORD "\n", f);
    if (g)
        fputs(PGSERVER_PASSWORD "\n", g);
    if (f)
        fclose(f);
    if (g)
        fclose(g);
    if (!f || !g ||
        (pw &&
         (chown(p->dir, pw->pw_uid, pw->pw_gid) < 0 || chown(pwfile, pw->pw_uid, pw->pw_gid) < 0)))
        return -1;
    /* the data directory below ours: initdb wants it empty */
    char data[128];
    snprintf(data, sizeof(data), "%s/data", p->dir);
    if (run_pg("initdb", "-D", data, "-U", "postgres", "-A", "scram-sha-256", "--pwfile", pwfile,
               "-E", "UTF8", "--no-sync", NULL) < 0)
        return -1;
    snprintf(p->dir + strlen(p->dir), sizeof(p->dir) - strlen(p->dir), "/data");
    p->port = fx_free_port();
    snprintf(p->url, sizeof(p->url), "postgresql://postgres@127.0.0.1:%u/postgres", p->port);
    return pgserver_restart(p);
}

int pgserver_halt(struct pgserver *p)
{
    return run_pg("pg_ctl", "-D", p->dir, "-m", "fast", "-w", "stop", NULL);
}

void pgserver_stop(struct pgserver *p)
{
    if (!p->dir[0])
        return;
    run_pg("pg_ctl", "-D", p->dir, "-m", "immediate", "-w", "stop", NULL);
    char *slash = strrchr(p->dir, '/'); /* the directory above data/ */
    if (slash)
        *slash = '\0';
    rm_tree(p->dir);
    p->dir[0] = '\0';
}

void pgserver_export(const struct pgserver *p)
{
    char port[16];
    snprintf(port, sizeof(port), "%u", p->port);
    setenv("RP_PG_PORT", port, 1);
    setenv("RP_PG_DIR", p->dir, 1);
    setenv("RP_PG_URL", p->url, 1);
    setenv("RP_PG_PASSWORD_FILE", p->password_file, 1);
}

int pgserver_env(struct pgserver *p)
{
    const char *port = getenv("RP_PG_PORT"), *dir = getenv("RP_PG_DIR"), *url = getenv("RP_PG_URL"),
               *pwf = getenv("RP_PG_PASSWORD_FILE");
    memset(p, 0, sizeof(*p));
    if (!port || !dir || !url || !pwf)
        return -1;
    p->port = (uint16_t)atoi(port);
    snprintf(p->dir, sizeof(p->dir), "%s", dir);
    snprintf(p->url, sizeof(p->url), "%s", url);
    snprintf(p->password_file, sizeof(p->password_file), "%s", pwf);
    return 0;
}

char *pgserver_query(const struct pgserver *p, const char *sql, const char *a1, const char *a2)
{
    char info[256];
    snprintf(info, sizeof(info), "%s?password=%s", p->url, PGSERVER_PASSWORD);
    PGconn *c = PQconnectdb(info);
    char *v = NULL;
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "pgserver: %s", PQerrorMessage(c));
        PQfinish(c);
        return NULL;
    }
    const char *params[2] = { a1, a2 };
    PGresult *res = PQexecParams(c, sql, a2 ? 2 : a1 ? 1 : 0, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK)
        fprintf(stderr, "pgserver: %s", PQerrorMessage(c));
    else if (PQntuples(res) > 0 && !PQgetisnull(res, 0, 0))
        v = strdup(PQgetvalue(res, 0, 0));
    PQclear(res);
    PQfinish(c);
    return v;
}

static struct pgserver of_the_run;

void pgserver_run_start(void)
{
    if (pgserver_start(&of_the_run) == 0)
        pgserver_export(&of_the_run);
}

void pgserver_run_stop(void)
{
    pgserver_stop(&of_the_run);
}
