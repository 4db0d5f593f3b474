/* main -- the command line (docs/cli.md): run, check, schedule, reference, --version, --help.
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

#include "config/cfg.h"
#include "policy/backoff.h"
#include "policy/rng.h"
#include "proxy/metrics.h"
#include "proxy/serve.h"

#define VERSION        "0.1.0"
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
    "  reference  print every config key with its type, range, default and meaning\n"
    "             (--metrics: every metric with its type, labels and meaning)\n"
    "\n"
    "options:\n"
    "  -c, --config FILE   config file [$RETRYPROXY_CONFIG, then " DEFAULT_CONFIG "]\n"
    "  --listen ADDR       proxy listener, overrides the file (HOST:PORT)\n"
    "  --admin ADDR        admin listener, overrides the file (HOST:PORT)\n"
    "  --log-level LEVEL   debug, info, warn or error, overrides the file\n"
    "  --log-format FMT    json or text, overrides the file\n"
    "  --workers N         event-loop threads [one per core]\n"
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

static const char *default_config(void)
{
    const char *env = getenv("RETRYPROXY_CONFIG");
    return env && *env ? env : DEFAULT_CONFIG;
}

/* Loads 'path'; on failure prints every error to 'out' and returns NULL. */
static struct cfg *load_or_report(const char *path, FILE *out)
{
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct cfg *c = cfg_load_file(path, &errs);
    if (!c) {
        cfg_errs_print(out, path, &errs);
        fflush(out);
        fprintf(stderr, "retryproxy: %s: %zu error%s\n", path, errs.n + errs.dropped,
                errs.n + errs.dropped == 1 ? "" : "s");
    }
    cfg_errs_clear(&errs);
    return c;
}

static int cmd_check(int argc, char **argv)
{
    static const struct option opts[] = {
        { "config", required_argument, NULL, 'c' },
        { "print", no_argument, NULL, 'p' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *path = NULL;
    int print = 0, o;
    while ((o = getopt_long(argc, argv, "+c:h", opts, NULL)) != -1) {
        switch (o) {
        case 'c':
            path = optarg;
            break;
        case 'p':
            print = 1;
            break;
        case 'h':
            fputs(usage_text, stdout);
            return 0;
        default:
            return usage_error("%s", "check: bad option");
        }
    }
    if (optind < argc)
        return usage_error("check: unexpected argument '%s'", argv[optind]);
    if (!path)
        path = default_config();

    struct cfg *c = load_or_report(path, stdout);
    if (!c)
        return EXIT_CONFIG;
    if (print) {
        json_t *j = cfg_to_json(c);
        json_dumpf(j, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
        fputc('\n', stdout);
        json_decref(j);
    } else {
        printf("%s: OK (%zu route%s)\n", path, c->n_routes, c->n_routes == 1 ? "" : "s");
    }
    cfg_unref(c);
    return 0;
}

static int cmd_schedule(int argc, char **argv)
{
    static const struct option opts[] = {
        { "config", required_argument, NULL, 'c' },
        { "route", required_argument, NULL, 'r' },
        { "retries", required_argument, NULL, 'n' },
        { "runs", required_argument, NULL, 'k' },
        { "seed", required_argument, NULL, 's' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *path = NULL, *route = NULL;
    unsigned long long retries = 0, runs = 1, seed = 0;
    int have_retries = 0, have_seed = 0, o;
    while ((o = getopt_long(argc, argv, "+c:h", opts, NULL)) != -1) {
        switch (o) {
        case 'c':
            path = optarg;
            break;
        case 'r':
            route = optarg;
            break;
        case 'n':
            if (parse_count(optarg, SCHEDULE_MAX_RETRIES, &retries) < 0)
                return usage_error("schedule: --retries must be a whole number from 0 to "
                                   "10000, got '%s'",
                                   optarg);
            have_retries = 1;
            break;
        case 'k':
            if (parse_count(optarg, SCHEDULE_MAX_RUNS, &runs) < 0 || runs == 0)
                return usage_error("schedule: --runs must be a whole number from 1 to 100000, "
                                   "got '%s'",
                                   optarg);
            break;
        case 's':
            if (parse_count(optarg, UINT64_MAX, &seed) < 0)
                return usage_error("schedule: --seed must be a whole number from 0 to 2^64-1, "
                                   "got '%s'",
                                   optarg);
            have_seed = 1;
            break;
        case 'h':
            fputs(usage_text, stdout);
            return 0;
        default:
            return usage_error("%s", "schedule: bad option");
        }
    }
    if (optind < argc)
        return usage_error("schedule: unexpected argument '%s'", argv[optind]);
    if (!route)
        return usage_error("%s", "schedule: --route NAME is required");
    if (!path)
        path = default_config();

    struct cfg *c = load_or_report(path, stderr);
    if (!c)
        return EXIT_CONFIG;
    int rc = 0;
    uint32_t *delays = NULL;
    const struct cfg_route *r = cfg_route_by_name(c, route);
    if (!r) {
        fprintf(stderr, "retryproxy: %s: no route named \"%s\" (routes:", path, route);
        for (size_t i = 0; i < c->n_routes; i++)
            fprintf(stderr, " %s", c->routes[i].name);
        fputs(")\n", stderr);
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

static int cmd_run(int argc, char **argv)
{
    static const struct option opts[] = {
        { "config", required_argument, NULL, 'c' },
        { "listen", required_argument, NULL, 'l' },
        { "admin", required_argument, NULL, 'a' },
        { "log-level", required_argument, NULL, 'L' },
        { "log-format", required_argument, NULL, 'F' },
        { "workers", required_argument, NULL, 'w' },
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, 'V' },
        { NULL, 0, NULL, 0 },
    };
    const char *path = NULL, *why;
    unsigned long long workers = 0;
    struct serve_opts so = { .log_level = -1, .log_format = -1 };
    int o;
    while ((o = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        switch (o) {
        case 'c':
            path = optarg;
            break;
        case 'l':
        case 'a':
            if ((why = cfg_address_problem(optarg)) != NULL) {
                fprintf(stderr, "retryproxy: --%s '%s': %s\n", o == 'l' ? "listen" : "admin",
                        optarg, why);
                return EXIT_USAGE;
            }
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
            if (parse_count(optarg, 256, &workers) < 0 || workers == 0)
                return usage_error("--workers must be a whole number from 1 to 256, got '%s'",
                                   optarg);
            so.workers = (unsigned)workers;
            break;
        case 'h':
            fputs(usage_text, stdout);
            return 0;
        case 'V':
            puts("retryproxy " VERSION);
            return 0;
        default:
            fputs("Try 'retryproxy --help'.\n", stderr);
            return EXIT_USAGE;
        }
    }
    if (optind < argc)
        return usage_error("unknown command '%s'", argv[optind]);
    if (!path)
        path = default_config();

    struct cfg *c = load_or_report(path, stderr);
    if (!c)
        return EXIT_CONFIG;
    so.config_path = path;
    int rc = serve_run(c, &so);
    cfg_unref(c);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "check") == 0)
        return cmd_check(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "schedule") == 0)
        return cmd_schedule(argc - 1, argv + 1);
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
