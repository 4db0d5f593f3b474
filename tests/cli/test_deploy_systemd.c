/* The systemd example, deploy/systemd/retryproxy.service (docs/deploy.md#systemd): its
 * properties from the unit file, and `systemd-analyze verify` where installed. Run from the
 * repository root (make test does). */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "tests/support/deploytest.h"
#include "tests/support/proc.h"

#define UNIT_FILE "deploy/systemd/retryproxy.service"

/* A unit file's assignments in order: "Section\0Key\0Value" triples. */
struct unit {
    char *sec[256], *key[256], *val[256];
    size_t n;
};

static void unit_load(struct unit *u, const char *path)
{
    char *text = proc_read_file(path), *save = NULL, *section = strdup("");
    cr_assert(*text, "%s: missing or empty", path);
    u->n = 0;
    /* Continuation lines (a trailing backslash) join the next line. */
    for (char *s = text; (s = strstr(s, "\\\n")) != NULL;)
        s[0] = s[1] = ' ';
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        line += strspn(line, " \t");
        if (!*line || *line == '#' || *line == ';')
            continue;
        if (*line == '[') {
            free(section);
            section = strndup(line + 1, strcspn(line + 1, "]"));
            continue;
        }
        char *eq = strchr(line, '=');
        cr_assert_not_null(eq, "%s: not an assignment: %s", path, line);
        cr_assert_lt(u->n, 256);
        char *k = strndup(line, (size_t)(eq - line)), *v = eq + 1;
        for (char *e = k + strlen(k); e > k && (e[-1] == ' ' || e[-1] == '\t');)
            *--e = '\0';
        v += strspn(v, " \t");
        u->sec[u->n] = strdup(section);
        u->key[u->n] = k;
        u->val[u->n] = strdup(v);
        u->n++;
    }
    free(section);
    free(text);
}

static void unit_free(struct unit *u)
{
    for (size_t i = 0; i < u->n; i++) {
        free(u->sec[i]);
        free(u->key[i]);
        free(u->val[i]);
    }
}

/* The last value given to Section/Key, or NULL. */
static const char *unit_get(struct unit *u, const char *sec, const char *key)
{
    const char *v = NULL;
    for (size_t i = 0; i < u->n; i++)
        if (strcmp(u->sec[i], sec) == 0 && strcmp(u->key[i], key) == 0)
            v = u->val[i];
    return v;
}

static bool unit_yes(struct unit *u, const char *key)
{
    const char *v = unit_get(u, "Service", key);
    return v && (strcmp(v, "yes") == 0 || strcmp(v, "true") == 0 || strcmp(v, "on") == 0 ||
                 strcmp(v, "1") == 0);
}

/* A list setting as systemd builds it: words accumulate over assignments, an empty one clears
 * the list; a leading "~" makes it a deny list (*inverted). Returns a malloc'd " a b c " with
 * spaces around every word. */
static char *unit_list(struct unit *u, const char *key, bool *inverted)
{
    char *list = strdup(" ");
    *inverted = false;
    for (size_t i = 0; i < u->n; i++) {
        if (strcmp(u->sec[i], "Service") != 0 || strcmp(u->key[i], key) != 0)
            continue;
        const char *v = u->val[i];
        if (!*v) {
            free(list);
            list = strdup(" ");
            *inverted = false;
            continue;
        }
        if (*v == '~') {
            *inverted = true;
            v++;
        }
        char *save = NULL, *words = strdup(v);
        for (char *w = strtok_r(words, " \t", &save); w; w = strtok_r(NULL, " \t", &save)) {
            char *more;
            cr_assert(asprintf(&more, "%s%s ", list, w) > 0);
            free(list);
            list = more;
        }
        free(words);
    }
    return list;
}

/* A systemd time span ("20", "20s", "1min 30s", "500ms") in milliseconds; -1 for infinity. */
static long long timespan_ms(const char *s)
{
    static const struct {
        const char *unit;
        long long ms;
    } units[] = { { "ms", 1 },    { "msec", 1 },    { "s", 1000 },    { "sec", 1000 },
                  { "m", 60000 }, { "min", 60000 }, { "h", 3600000 }, { "hr", 3600000 },
                  { "us", 0 },    { "usec", 0 } };
    if (strcmp(s, "infinity") == 0)
        return -1;
    long long total = 0;
    const char *p = s;
    while (*p) {
        p += strspn(p, " ");
        char *end;
        double n = strtod(p, &end);
        cr_assert(end != p, "time span \"%s\" is not understood", s);
        p = end + strspn(end, " ");
        size_t ul = strspn(p, "abcdefghijklmnopqrstuvwxyz");
        long long per = ul ? -2 : 1000;
        for (size_t i = 0; ul && i < sizeof(units) / sizeof(units[0]); i++)
            if (strlen(units[i].unit) == ul && strncmp(p, units[i].unit, ul) == 0)
                per = units[i].ms;
        cr_assert_neq(per, -2, "time span \"%s\": unknown unit", s);
        total += (long long)(n * (double)per);
        p += ul;
    }
    return total;
}

Test(deploy, systemd_unit_runs_unprivileged_and_confined)
{
    struct unit u;
    unit_load(&u, UNIT_FILE);
    const char *user = unit_get(&u, "Service", "User");
    cr_expect(unit_yes(&u, "DynamicUser") ||
                  (user && strcmp(user, "root") != 0 && strcmp(user, "0") != 0),
              UNIT_FILE ": neither DynamicUser=yes nor a User= other than root");
    const char *ps = unit_get(&u, "Service", "ProtectSystem");
    cr_expect(ps && strcmp(ps, "strict") == 0, UNIT_FILE ": ProtectSystem is not strict");
    const char *yes[] = { "NoNewPrivileges",       "PrivateTmp",
                          "ProtectHome",           "PrivateDevices",
                          "ProtectKernelTunables", "ProtectKernelModules",
                          "ProtectControlGroups",  "RestrictNamespaces",
                          "RestrictSUIDSGID",      "LockPersonality" };
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        cr_expect(unit_yes(&u, yes[i]), UNIT_FILE ": %s is not yes", yes[i]);

    bool inv;
    char *caps = unit_list(&u, "CapabilityBoundingSet", &inv);
    cr_expect(unit_get(&u, "Service", "CapabilityBoundingSet") && strcmp(caps, " ") == 0 && !inv,
              UNIT_FILE ": CapabilityBoundingSet is not empty (\"%s\")", caps);
    free(caps);
    char *ambient = unit_list(&u, "AmbientCapabilities", &inv);
    cr_expect_str_eq(ambient, " ", UNIT_FILE ": AmbientCapabilities grants \"%s\"", ambient);
    free(ambient);

    char *af = unit_list(&u, "RestrictAddressFamilies", &inv);
    cr_expect(!inv, UNIT_FILE ": RestrictAddressFamilies is a deny list");
    const char *want[] = { "AF_INET", "AF_INET6", "AF_UNIX" };
    size_t words = 0;
    for (char *s = af; *s; s++)
        words += s[0] == ' ' && s[1];
    for (size_t i = 0; i < 3; i++) {
        char w[16];
        snprintf(w, sizeof(w), " %s ", want[i]);
        cr_expect_not_null(strstr(af, w), UNIT_FILE ": RestrictAddressFamilies lacks %s", want[i]);
    }
    cr_expect_eq(words, 3,
                 UNIT_FILE ": RestrictAddressFamilies is not AF_INET AF_INET6 AF_UNIX "
                           "(\"%s\")",
                 af);
    free(af);
    unit_free(&u);
}

/* The config file ExecStart names (-c FILE, else the default), which must be under
 * /etc/retryproxy and not writable by the service. */
static const char *unit_config(struct unit *u, char *buf, size_t cap)
{
    const char *exec = unit_get(u, "Service", "ExecStart");
    cr_assert_not_null(exec, UNIT_FILE ": no ExecStart");
    const char *c = strstr(exec, " -c ");
    if (c) {
        c += 4;
        snprintf(buf, cap, "%.*s", (int)strcspn(c, " "), c);
    } else {
        snprintf(buf, cap, "%s", DEFAULT_CONFIG);
    }
    return buf;
}

Test(deploy, systemd_unit_reads_its_config_from_etc_read_only)
{
    struct unit u;
    char cfg[PATH_MAX];
    unit_load(&u, UNIT_FILE);
    unit_config(&u, cfg, sizeof(cfg));
    cr_expect_eq(strncmp(cfg, "/etc/retryproxy/", 16), 0,
                 UNIT_FILE ": the config %s is not in /etc/retryproxy", cfg);
    bool inv;
    char *rw = unit_list(&u, "ReadWritePaths", &inv), *save = NULL;
    for (char *w = strtok_r(rw, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
        w += strspn(w, "-+");
        cr_expect(strncmp(cfg, w, strlen(w)) != 0,
                  UNIT_FILE ": ReadWritePaths %s makes %s writable", w, cfg);
    }
    free(rw);
    unit_free(&u);
}

Test(deploy, systemd_unit_reloads_on_hup_and_outwaits_the_drain)
{
    struct unit u;
    unit_load(&u, UNIT_FILE);
    const char *reload = unit_get(&u, "Service", "ExecReload");
    cr_expect(reload && strcmp(reload, "/bin/kill -HUP $MAINPID") == 0,
              UNIT_FILE ": ExecReload is not /bin/kill -HUP $MAINPID (SIGHUP reloads)");
    const char *sig = unit_get(&u, "Service", "KillSignal");
    cr_expect(sig && strcmp(sig, "SIGTERM") == 0, UNIT_FILE ": KillSignal is not SIGTERM");
    const char *mode = unit_get(&u, "Service", "KillMode");
    cr_expect(!mode || strcmp(mode, "none") != 0, UNIT_FILE ": KillMode=none");

    /* The file installed at the unit's config path is deploy/config.json (docs/deploy.md). */
    char *text = proc_read_file("deploy/config.json");
    json_t *cfg = dep_parse_config(text, "deploy/config.json");
    long long drain = dep_cfg_integer(cfg, "drain_timeout_ms");
    const char *stop = unit_get(&u, "Service", "TimeoutStopSec");
    cr_assert_not_null(stop, UNIT_FILE ": no TimeoutStopSec (the default, 90 s, is not checked)");
    long long stop_ms = timespan_ms(stop);
    cr_expect(stop_ms < 0 || stop_ms > drain + STREAM_GRACE_MS,
              UNIT_FILE ": TimeoutStopSec=%s is not above drain_timeout_ms (%lld) + 1 s", stop,
              drain);
    json_decref(cfg);
    free(text);
    unit_free(&u);
}

/* `systemd-analyze verify` on a copy of the unit whose ExecStart runs the binary under test
 * (verify needs the program to exist). Where it is not installed, this says so and passes. */
Test(deploy, systemd_analyze_verifies_the_unit)
{
    const char *sa = dep_which("systemd-analyze");
    if (!sa) {
        cr_log_warn("systemd-analyze is not installed: the unit was not verified");
        return;
    }
    char *analyze = strdup(sa), dir[] = "/tmp/retryproxy-unit-XXXXXX", path[PATH_MAX];
    char bin[PATH_MAX];
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_not_null(realpath(proc_bin(), bin), "%s: not found", proc_bin());
    char *text = proc_read_file(UNIT_FILE), *at = strstr(text, "ExecStart=");
    cr_assert_not_null(at);
    at += strlen("ExecStart=");
    size_t prog = strcspn(at, " \n");
    snprintf(path, sizeof(path), "%s/retryproxy.service", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "%.*s%s%s", (int)(at - text), text, bin, at + prog);
    fclose(f);

    char *argv[] = { analyze, "verify", path, NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 60000, &r), 0);
    cr_expect_eq(r.status, 0, "systemd-analyze verify " UNIT_FILE ":\n%s%s", r.out, r.err);
    cr_expect_str_empty(r.err, "systemd-analyze verify " UNIT_FILE ":\n%s", r.err);
    proc_result_free(&r);
    rm_tree(dir);
    free(text);
    free(analyze);
}
