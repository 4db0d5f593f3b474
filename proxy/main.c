/* main -- the command line (docs/cli.md): run, check, schedule, simulate, deliveries, reference,
 * --version, --help.
 *
 * Exit codes: 0 success, 1 invalid config (or unknown route), 2 usage error, 3 cannot bind.
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "config/cfg.h"
#include "policy/backoff.h"
#include "policy/rng.h"
#include "proxy/base/cpus.h"
#include "proxy/telemetry/metrics.h"
#include "proxy/serve.h"
#include "proxy/store/store.h"
#include "proxy/ops/deliveries_cli.h"
#include "proxy/ops/simulate.h"
#include "proxy/telemetry/version.h"

#define VERSION        RETRYPROXY_VERSION
#define DEFAULT_CONFIG "/etc/retryproxy/config.json"
#define EXIT_CONFIG    1
#define EXIT_USAGE     2

/* Bounds on `schedule` output: enough for any policy study, small enough to never flood. */
#define SCHEDULE_MAX_RETRIES 10000
#define SCHEDULE_MAX_RUNS    100000

static const char usage_text[] =
    "usage: retryproxy [-c FILE] [--listen ADDR] [--admin ADDR] [--log-level LEVEL]\n"
    "                  [--log-format json|text] [--workers N]\n"
    "       retryproxy check -c FILE [--print]\n"
    "       retryproxy schedule -c FILE --route NAME [--retries N] [--runs K] [--seed S]\n"
    "       retryproxy simulate -c FILE --route NAME [--clients N] [--requests R]\n"
    "                  [--policy SPEC]... [--outage A-B] [--failure-rate P]\n"
    "                  [--capacity N/W] [--latency MS] [--retry-after MS] [--seed S]\n"
    "                  [--svg FILE]\n"
    "       retryproxy deliveries list|show|replay|drop [ID] -c FILE [--route R]\n"
    "                  [--state S] [--since T] [--until T] [--status N] [--upstream URL]\n"
    "                  [--limit N] [--cursor C] [--order newest|oldest] [--rate N] [--dry-run]\n"
    "                  [--json] [--dead]\n"
    "       retryproxy store migrate -c FILE\n"
    "       retryproxy reference [--metrics]\n"
    "       retryproxy --version | --help\n"
    "\n"
    "A sidecar HTTP retry proxy: requests sent to the listener are forwarded to the matching\n"
    "route's upstreams and retried with backoff as the route's policy says.\n"
    "\n"
    "commands:\n"
    "  (none)     run the proxy until SIGTERM or SIGINT\n"
    "  check      validate a config; print every error as FILE:LINE:COL: $.path: message\n"
    "             (--print: print the effective config, defaults filled in, when valid)\n"
    "  schedule   print the delays (ms) a route's policy would use: K lines of N delays\n"
    "             (N defaults to max_attempts-1, K to 1; --seed makes jitter repeatable)\n"
    "  simulate   run N clients (100) of R requests (1) against a failing upstream with\n"
    "             the route's policy and each --policy SPEC (backoff keys as JSON over the\n"
    "             route's): calls, success, completion times, retries denied; --svg FILE\n"
    "             draws the calls over time\n"
    "  deliveries the store's durable deliveries and dead letters (docs/delivery.md): list\n"
    "             them (the filters; a page of --limit, 100), show ID, replay or drop ID,\n"
    "             or every one the filters match (replay: --rate per second, 10; --dry-run\n"
    "             counts them; --dead is --state dead); a table, or --json\n"
    "  store      migrate: create or migrate the shared store's schema (store.postgres)\n"
    "             under an advisory lock; the proxy does the same at start\n"
    "  reference  print every config key with its type, range, default and meaning\n"
    "             (--metrics: every metric with its type, labels and meaning)\n"
    "\n"
    "options:\n"
    "  -c, --config FILE   config file [$RETRYPROXY_CONFIG, then " DEFAULT_CONFIG "]\n"
    "  --listen ADDR       proxy listener, overrides the file (HOST:PORT)\n"
    "  --admin ADDR        admin listener, overrides the file (HOST:PORT)\n"
    "  --log-level LEVEL   debug, info, warn or error, overrides the file\n"
    "  --log-format FMT    json or text, overrides the file\n"
    "  --workers N         event-loop threads [one per CPU the process may use, its\n"
    "                      cgroup's CPU quota included]\n"
    "\n"
    "exit status: 0 ok, 1 invalid config, 2 usage error, 3 cannot bind a listener\n";

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("retryproxy: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\nTry 'retryproxy --help'.\n", stderr);
    va_end(ap);
    return EXIT_USAGE;
}

/* Parses a whole decimal number in [0, max]; -1 if 's' is anything else. */
static int parse_count(const char *s, unsigned long long max, unsigned long long *out)
{
    if (!s || !*s)
        return -1;
    unsigned long long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        unsigned d = (unsigned)(*p - '0');
        if (v > (max - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* The value of a count option ('name' as the message calls it), a whole number from min to
 * max; 0, or the usage error's exit status. */
static int count_opt(const char *name, const char *arg, unsigned long long min,
                     unsigned long long max, unsigned long long *out)
{
    if (parse_count(arg, max, out) == 0 && *out >= min)
        return 0;
    char top[24] = "2^64-1";
    if (max != UINT64_MAX)
        snprintf(top, sizeof top, "%llu", max);
    return usage_error("%s must be a whole number from %llu to %s, got '%s'", name, min, top, arg);
}

static const char *default_config(void)
{
    const char *env = getenv("RETRYPROXY_CONFIG");
    return env && *env ? env : DEFAULT_CONFIG;
}

/* Loads *path, or the default config when it is NULL (and *path then says which); on failure
 * prints every error to 'out' and returns NULL. */
static struct cfg *load_or_report(const char **path_io, FILE *out)
{
    bool given = *path_io != NULL;
    if (!given)
        *path_io = default_config();
    const char *path = *path_io;
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct cfg *c = cfg_load_file(path, &errs);
    if (!c) {
        cfg_errs_print(out, path, &errs);
        fflush(out);
        fprintf(stderr, "retryproxy: %s: %zu error%s\n", path, errs.n + errs.dropped,
                errs.n + errs.dropped == 1 ? "" : "s");
        /* a first run without -c: say how to name the file rather than only that it is not
         * at the default place */
        if (!given && access(path, F_OK) != 0) {
            const char *env = getenv("RETRYPROXY_CONFIG");
            fprintf(stderr,
                    "retryproxy: no config file at %s (%s): name one with -c FILE or "
                    "RETRYPROXY_CONFIG=FILE\n",
                    path, env && *env ? "from $RETRYPROXY_CONFIG" : "the default");
        }
    }
    cfg_errs_clear(&errs);
    return c;
}

/* A command's command line, as next_opt() reads it. */
struct cmdline {
    int argc;
    char **argv;
    const char *name; /* in messages ("check: unknown option ..."); NULL for the proxy */
    const char *optstring;
    const struct option *opts;
    const char *path; /* -c FILE; NULL when not given */
    int status;       /* the exit status when next_opt() returns -1 */
};

/* The usage error of the option getopt_long() stopped at: 'o' is ':' for a missing value, '?'
 * for an unknown, ambiguous or valueless option given a value. getopt_long()'s own message is
 * off (opterr), so that a usage error is one line and the hint, as every other (docs/cli.md). */
static int option_error(const struct cmdline *cl, int o)
{
    char cmd[32] = "";
    if (cl->name)
        snprintf(cmd, sizeof cmd, "%s: ", cl->name);
    const char *word = cl->argv[optind - 1];
    char opt[64];
    size_t len = strcspn(word, "=");
    /* a short option: the character; one of a cluster ("-pc") is not the word's first */
    if (optopt && strncmp(word, "--", 2) != 0)
        snprintf(opt, sizeof opt, "-%c", optopt);
    else
        snprintf(opt, sizeof opt, "%.*s", (int)len, word);
    if (o == ':')
        return usage_error("%soption '%s' needs a value", cmd, opt);
    size_t matches = 0;
    bool exact_flag = false;
    for (const struct option *r = cl->opts; r->name; r++) {
        if (strncmp(word, "--", 2) || strncmp(r->name, word + 2, len - 2))
            continue;
        matches++;
        exact_flag |= strlen(r->name) == len - 2 && r->has_arg == no_argument;
    }
    if (exact_flag)
        return usage_error("%soption '%s' takes no value", cmd, opt);
    if (matches > 1)
        return usage_error("%soption '%s' is ambiguous", cmd, opt);
    return usage_error("%sunknown option '%s'", cmd, opt);
}

/* Reads the options of a command and does what they all share: -c FILE, --help, and the usage
 * errors for an unknown option, a missing value or an argument left over. Returns the next
 * option that is the command's own, 0 when all are read, or -1 when the command is to exit
 * with cl->status. */
static int next_opt(struct cmdline *cl)
{
    int o;
    opterr = 0;
    while ((o = getopt_long(cl->argc, cl->argv, cl->optstring, cl->opts, NULL)) == 'c')
        cl->path = optarg;
    if (o == 'h') {
        fputs(usage_text, stdout);
        cl->status = 0;
        return -1;
    }
    if (o == '?' || o == ':') {
        cl->status = option_error(cl, o);
        return -1;
    }
    if (o != -1)
        return o;
    if (optind < cl->argc) {
        if (cl->name)
            cl->status = usage_error("%s: unexpected argument '%s'", cl->name, cl->argv[optind]);
        else
            cl->status = usage_error("unknown command '%s'", cl->argv[optind]);
        return -1;
    }
    return 0;
}

/* The rows of a command's getopt_long table: an option taking an argument, a flag, the end. */
/* clang-format off */
#define ARG(name, c)  { name, required_argument, NULL, c }
#define FLAG(name, c) { name, no_argument, NULL, c }
#define OPT_END       { NULL, 0, NULL, 0 }
/* clang-format on */

/* The hidden option --cgroup-root-for-tests DIR of `check` and of the proxy: where the CPU quota is
 * read (proxy/base/cpus.h), for tests that give the process a quota of their own (docs/testing.md).
 * Not in --help: in production the kernel's /sys/fs/cgroup is the only one that means anything.
 * Its long name says what it is for, and no abbreviation of another option can be it. */
#define CGROUP_ROOT_OPT ARG("cgroup-root-for-tests", 'G')

static int cmd_check(int argc, char **argv)
{
    static const struct option opts[] = { ARG("config", 'c'), FLAG("print", 'p'), FLAG("help", 'h'),
                                          CGROUP_ROOT_OPT, OPT_END };
    struct cmdline cl = { argc, argv, "check", "+:c:h", opts, NULL, 0 };
    int print = 0, o;
    const char *cgroup_root = NULL;
    while ((o = next_opt(&cl)) > 0) {
        if (o == 'G')
            cgroup_root = optarg;
        else
            print = 1; /* --print */
    }
    if (o < 0)
        return cl.status;

    struct cfg *c = load_or_report(&cl.path, stdout);
    if (!c)
        return EXIT_CONFIG;
    if (print) {
        json_t *j = cfg_to_json(c);
        json_dumpf(j, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
        fputc('\n', stdout);
        json_decref(j);
        /* what the proxy would start without --workers; stdout stays the config alone */
        struct cpus cpus;
        cpus_detect(cgroup_root, &cpus);
        fprintf(stderr, "retryproxy: workers: %u (%s)\n", cpus.n, cpus.source);
    } else {
        printf("%s: OK (%zu route%s)\n", cl.path, c->n_routes, c->n_routes == 1 ? "" : "s");
    }
    /* valid, but what it keeps would not outlive a reboot (docs/delivery.md) */
    if (c->store.path && store_on_tmpfs(c->store.path))
        fprintf(stderr,
                "retryproxy: warning: store.path %s is on tmpfs: its deliveries are lost at "
                "reboot, and in Kubernetes with the pod (docs/delivery.md)\n",
                c->store.path);
    cfg_unref(c);
    return 0;
}

/* The route named 'name' of 'c' (loaded from 'path'), or NULL after saying which routes
 * there are. */
static const struct cfg_route *route_or_report(const struct cfg *c, const char *path,
                                               const char *name)
{
    const struct cfg_route *r = cfg_route_by_name(c, name);
    if (!r) {
        fprintf(stderr, "retryproxy: %s: no route named \"%s\" (routes:", path, name);
        for (size_t i = 0; i < c->n_routes; i++)
            fprintf(stderr, " %s", c->routes[i].name);
        fputs(")\n", stderr);
    }
    return r;
}

static int cmd_schedule(int argc, char **argv)
{
    static const struct option opts[] = { ARG("config", 'c'),
                                          ARG("route", 'r'),
                                          ARG("retries", 'n'),
                                          ARG("runs", 'k'),
                                          ARG("seed", 's'),
                                          FLAG("help", 'h'),
                                          OPT_END };
    struct cmdline cl = { argc, argv, "schedule", "+:c:h", opts, NULL, 0 };
    const char *route = NULL;
    unsigned long long retries = 0, runs = 1, seed = 0;
    int have_retries = 0, have_seed = 0, o, rc = 0;
    while ((o = next_opt(&cl)) > 0) {
        switch (o) {
        case 'r':
            route = optarg;
            break;
        case 'n':
            rc = count_opt("schedule: --retries", optarg, 0, SCHEDULE_MAX_RETRIES, &retries);
            have_retries = 1;
            break;
        case 'k':
            rc = count_opt("schedule: --runs", optarg, 1, SCHEDULE_MAX_RUNS, &runs);
            break;
        case 's':
            rc = count_opt("schedule: --seed", optarg, 0, UINT64_MAX, &seed);
            have_seed = 1;
            break;
        }
        if (rc)
            return rc; /* a malformed count */
    }
    if (o < 0)
        return cl.status;
    if (!route)
        return usage_error("%s", "schedule: --route NAME is required");

    struct cfg *c = load_or_report(&cl.path, stderr);
    if (!c)
        return EXIT_CONFIG;
    uint32_t *delays = NULL;
    const struct cfg_route *r = route_or_report(c, cl.path, route);
    if (!r) {
        rc = EXIT_CONFIG;
        goto out;
    }
    if (!have_retries)
        retries = r->retry.max_attempts - 1;
    if (!have_seed && getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
        seed = (unsigned long long)time(NULL);

    struct rng rng;
    rng_seed(&rng, seed);
    delays = calloc(retries ? retries : 1, sizeof(*delays));
    if (!delays) {
        fputs("retryproxy: out of memory\n", stderr);
        rc = EXIT_CONFIG;
        goto out;
    }
    for (unsigned long long k = 0; k < runs; k++) {
        backoff_schedule(&r->retry.backoff, (uint32_t)retries, &rng, delays);
        for (unsigned long long i = 0; i < retries; i++)
            printf(i ? " %u" : "%u", delays[i]);
        putchar('\n');
    }
out:
    free(delays);
    cfg_unref(c);
    return rc;
}

static int cmd_simulate(int argc, char **argv)
{
    static const struct option opts[] = { ARG("config", 'c'),       ARG("route", 'r'),
                                          ARG("clients", 'n'),      ARG("requests", 'q'),
                                          ARG("policy", 'p'),       ARG("outage", 'o'),
                                          ARG("failure-rate", 'f'), ARG("capacity", 'C'),
                                          ARG("latency", 'l'),      ARG("retry-after", 'R'),
                                          ARG("seed", 's'),         ARG("svg", 'g'),
                                          FLAG("help", 'h'),        OPT_END };
    struct cmdline cl = { argc, argv, "simulate", "+:c:h", opts, NULL, 0 };
    struct simulate_opts so = { .clients = 100, .requests = 1 };
    unsigned long long clients = so.clients, requests = so.requests, ms, seed;
    int have_seed = 0, o, rc = 0;
    const char *why = NULL, *opt = NULL;
    while ((o = next_opt(&cl)) > 0) {
        switch (o) {
        case 'r':
            so.route = optarg;
            break;
        case 'n':
            rc = count_opt("simulate: --clients", optarg, 1, SIMULATE_MAX_CLIENTS, &clients);
            break;
        case 'q':
            rc = count_opt("simulate: --requests", optarg, 1, SIMULATE_MAX_REQUESTS, &requests);
            break;
        case 'p':
            if (so.n_policies == SIMULATE_MAX_POLICIES)
                return usage_error("simulate: at most %d --policy options", SIMULATE_MAX_POLICIES);
            so.policies[so.n_policies++] = optarg;
            break;
        case 'o':
            why = simulate_parse_outage(optarg, &so.upstream), opt = "--outage";
            break;
        case 'f':
            why = simulate_parse_failure_rate(optarg, &so.upstream), opt = "--failure-rate";
            break;
        case 'C':
            why = simulate_parse_capacity(optarg, &so.upstream), opt = "--capacity";
            break;
        case 'l':
            rc = count_opt("simulate: --latency", optarg, 0, 86400000, &ms);
            so.upstream.latency_ms = (uint32_t)ms;
            break;
        case 'R':
            rc = count_opt("simulate: --retry-after", optarg, 0, 86400000, &ms);
            so.upstream.retry_after = true;
            so.upstream.retry_after_ms = (uint32_t)ms;
            break;
        case 's':
            rc = count_opt("simulate: --seed", optarg, 0, UINT64_MAX, &seed);
            so.seed = seed;
            have_seed = 1;
            break;
        case 'g':
            so.svg_path = optarg;
            break;
        }
        if (why)
            return usage_error("simulate: %s %s, got '%s'", opt, why, optarg);
        if (rc)
            return rc; /* a malformed count */
    }
    if (o < 0)
        return cl.status;
    if (!so.route)
        return usage_error("%s", "simulate: --route NAME is required");
    if (clients * requests > SIMULATE_MAX_TOTAL_REQUESTS)
        return usage_error("simulate: --clients times --requests must be at most %d, got %llu",
                           SIMULATE_MAX_TOTAL_REQUESTS, clients * requests);
    so.clients = (uint32_t)clients;
    so.requests = (uint32_t)requests;
    if (!have_seed && getrandom(&so.seed, sizeof(so.seed), 0) != (ssize_t)sizeof(so.seed))
        so.seed = (uint64_t)time(NULL);

    struct cfg *c = load_or_report(&cl.path, stderr);
    if (!c)
        return EXIT_CONFIG;
    const struct cfg_route *r = route_or_report(c, cl.path, so.route);
    rc = r ? simulate_run(c, r, &so, stdout, stderr) : EXIT_CONFIG;
    cfg_unref(c);
    return rc;
}

/* deliveries ACTION [ID] -c FILE [filters]: ID right after the action, the options after. */
static int cmd_deliveries(int argc, char **argv)
{
    static const char *const actions[] = { "list", "show", "replay", "drop" };
    static const struct option opts[] = {
        ARG("config", 'c'), ARG("route", 'r'),  ARG("state", 's'),    ARG("since", 'S'),
        ARG("until", 'U'),  ARG("status", 'x'), ARG("upstream", 'u'), ARG("limit", 'n'),
        ARG("cursor", 'C'), ARG("order", 'o'),  ARG("rate", 'R'),     FLAG("dry-run", 'd'),
        FLAG("json", 'j'),  FLAG("help", 'h'),  FLAG("dead", 'D'),    OPT_END
    };
    if (argc < 2 || argv[1][0] == '-')
        return usage_error("%s", "deliveries: name an action: list, show, replay or drop");
    int action = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(argv[1], actions[i]) == 0)
            action = i;
    if (action < 0)
        return usage_error("deliveries: unknown action '%s' (list, show, replay or drop)", argv[1]);
    const char *id = NULL;
    int skip = 1;
    if (action != DCLI_LIST && argc >= 3 && argv[2][0] != '-') {
        id = argv[2];
        skip = 2;
        if (strlen(id) != STORE_ID_SIZE - 1 || strspn(id, "0123456789abcdef") != strlen(id))
            return usage_error("deliveries: '%s' is no delivery id (32 lowercase hex digits)", id);
    }
    struct cmdline cl = { argc - skip, argv + skip, "deliveries", "+:c:h", opts, NULL, 0 };
    struct dq q;
    dq_init(&q);
    bool json = false;
    int o;
    char why[200];
    static const struct {
        int opt;
        const char *key;
    } keys[] = { { 'r', "route" },  { 's', "state" },    { 'S', "since" }, { 'U', "until" },
                 { 'x', "status" }, { 'u', "upstream" }, { 'n', "limit" }, { 'C', "cursor" },
                 { 'o', "order" },  { 'R', "rate" } };
    while ((o = next_opt(&cl)) > 0) {
        if (o == 'j') {
            json = true;
            continue;
        }
        if (o == 'd') {
            q.dry_run = true;
            continue;
        }
        if (o == 'D' && dq_set(&q, "state", "dead", why, sizeof(why)) < 0)
            return usage_error("deliveries: --%s", why); /* --dead is --state dead */
        for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
            if (keys[i].opt == o && dq_set(&q, keys[i].key, optarg, why, sizeof(why)) < 0)
                return usage_error("deliveries: --%s", why);
    }
    if (o < 0)
        return cl.status;
    if (action == DCLI_SHOW && !id)
        return usage_error("%s", "deliveries: show needs an ID");
    if ((action == DCLI_REPLAY || action == DCLI_DROP) && !id && !q.filtered)
        return usage_error("deliveries: %s needs an ID or a filter (--route, --state, --since, "
                           "--until, --status, --upstream)",
                           actions[action]);
    struct cfg *c = load_or_report(&cl.path, stderr);
    if (!c)
        return EXIT_CONFIG;
    int rc = dcli_run(c, (enum dcli_action)action, id, &q, json, stdout, stderr);
    cfg_unref(c);
    return rc;
}

/* store migrate -c FILE: the shared store's schema (docs/cli.md). */
static int cmd_store(int argc, char **argv)
{
    static const struct option opts[] = { ARG("config", 'c'), FLAG("help", 'h'), OPT_END };
    if (argc < 2 || strcmp(argv[1], "migrate") != 0)
        return usage_error("%s", "store: name an action: migrate");
    struct cmdline cl = { argc - 1, argv + 1, "store", "+:c:h", opts, NULL, 0 };
    int o;
    while ((o = next_opt(&cl)) > 0) {
    }
    if (o < 0)
        return cl.status;
    struct cfg *c = load_or_report(&cl.path, stderr);
    if (!c)
        return EXIT_CONFIG;
    char why[512];
    int from, to;
    int rc = deliveries_migrate(c, &from, &to, why, sizeof(why));
    if (rc < 0)
        fprintf(stderr, "retryproxy: store migrate: %s\n", why);
    else if (from == to)
        printf("schema version %d: up to date\n", to);
    else
        printf("schema version %d -> %d\n", from, to);
    cfg_unref(c);
    return rc < 0 ? EXIT_FAILURE : 0;
}

static int cmd_run(int argc, char **argv)
{
    static const struct option opts[] = { ARG("config", 'c'),     ARG("listen", 'l'),
                                          ARG("admin", 'a'),      ARG("log-level", 'L'),
                                          ARG("log-format", 'F'), ARG("workers", 'w'),
                                          FLAG("help", 'h'),      FLAG("version", 'V'),
                                          CGROUP_ROOT_OPT,        OPT_END };
    struct cmdline cl = { argc, argv, NULL, ":c:h", opts, NULL, 0 };
    const char *why;
    unsigned long long workers = 0;
    struct serve_opts so = { .log_level = -1, .log_format = -1 };
    int o, rc;
    while ((o = next_opt(&cl)) > 0) {
        switch (o) {
        case 'l':
        case 'a':
            if ((why = cfg_address_problem(optarg)) != NULL)
                return usage_error("--%s '%s': %s", o == 'l' ? "listen" : "admin", optarg, why);
            if (o == 'l')
                so.listen = optarg;
            else
                so.admin = optarg;
            break;
        case 'L': {
            static const char *const levels[] = { "debug", "info", "warn", "error" };
            so.log_level = -1;
            for (int i = 0; i < 4; i++)
                if (strcmp(optarg, levels[i]) == 0)
                    so.log_level = i; /* enum cfg_log_level order */
            if (so.log_level < 0)
                return usage_error("--log-level must be debug, info, warn or error, got '%s'",
                                   optarg);
            break;
        }
        case 'F':
            if (strcmp(optarg, "json") == 0)
                so.log_format = CFG_LOG_JSON;
            else if (strcmp(optarg, "text") == 0)
                so.log_format = CFG_LOG_TEXT;
            else
                return usage_error("--log-format must be json or text, got '%s'", optarg);
            break;
        case 'w':
            if ((rc = count_opt("--workers", optarg, 1, 256, &workers)))
                return rc;
            so.workers = (unsigned)workers;
            break;
        case 'G':
            so.cgroup_root = optarg;
            break;
        case 'V':
            puts("retryproxy " VERSION);
            return 0;
        }
    }
    if (o < 0)
        return cl.status;

    struct cfg *c = load_or_report(&cl.path, stderr);
    if (!c)
        return EXIT_CONFIG;
    so.config_path = cl.path;
    rc = serve_run(c, &so);
    cfg_unref(c);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "check") == 0)
        return cmd_check(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "schedule") == 0)
        return cmd_schedule(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "simulate") == 0)
        return cmd_simulate(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "deliveries") == 0)
        return cmd_deliveries(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "store") == 0)
        return cmd_store(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "reference") == 0) {
        bool metrics = argc > 2 && strcmp(argv[2], "--metrics") == 0;
        if (argc > 2 + metrics)
            return usage_error("reference: unexpected argument '%s'", argv[2 + metrics]);
        if (metrics)
            metrics_write_reference(stdout);
        else
            cfg_write_reference(stdout);
        return 0;
    }
    return cmd_run(argc, argv);
}
