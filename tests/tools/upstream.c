/* upstream -- the test upstream (tests/support/tup.h) as a standalone server for demos.
 *
 *   build/tests/upstream --port 9001 --plan 'fail=2;status=503'
 *
 * Prints "listening on 127.0.0.1:PORT" once ready, logs one line per request to stderr, and
 * exits 0 on SIGINT or SIGTERM. Each line starts with the address, so that two of them logging
 * into one terminal (make demo-upstream) are told apart, and shows the X-Retry-Attempt the
 * request carried (the proxy's count) beside seen=N, this upstream's own count of the requests
 * with that X-Request-Id (what its plan's fail=N goes by):
 *
 *   127.0.0.1:9001 #1 conn 1/1 GET /hello id=ID X-Retry-Attempt=1 seen=1 body=0 -> 503 (fail 1/2)
 */
#include "tests/support/tup.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fputs("usage: upstream [--port N] [--plan PLAN] [--bind IP]\n"
          "\n"
          "Test HTTP/1.1 upstream on 127.0.0.1. Each request follows its X-Test-Plan header,\n"
          "or PLAN when it has none: directives 'key=value' separated by ';'.\n"
          "\n"
          "  --port N     listen on port N (default 0: an ephemeral port)\n"
          "  --bind IP    listen on IPv4 address IP (default 127.0.0.1; 0.0.0.0: every\n"
          "               127.x address at once, the pods of a name with many addresses)\n"
          "  --plan PLAN  plan for requests without X-Test-Plan (default: answer 200 \"ok\")\n"
          "  --help       this text\n"
          "\n"
          "Directives: fail=N action=status|hang|reset|close|reset-mid|stall-mid status=NNN\n"
          "  retry-after=VALUE ok=NNN body=N chunked=1 echo=1 delay=MS close-after=1 stale=1\n"
          "Attempts are counted per X-Request-Id. One line per request on stderr, starting\n"
          "with the address: X-Retry-Attempt=N is the proxy's count, seen=N this upstream's.\n"
          "See tests/support/tup.h.\n"
          "\n"
          "Example: upstream --port 9001 --plan 'fail=2;status=503'\n",
          f);
}

static int parse_port(const char *s, uint16_t *port)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > 65535)
        return -1;
    *port = (uint16_t)v;
    return 0;
}

int main(int argc, char **argv)
{
    uint16_t port = 0;
    const char *plan = NULL, *addr = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strncmp(a, "--port=", 7) == 0) {
            val = a + 7;
        } else if (strncmp(a, "--plan=", 7) == 0) {
            val = a + 7;
        } else if (strncmp(a, "--bind=", 7) == 0) {
            val = a + 7;
        } else if (strcmp(a, "--port") == 0 || strcmp(a, "--plan") == 0 ||
                   strcmp(a, "--bind") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "upstream: %s needs a value\n", a);
                usage(stderr);
                return 2;
            }
            val = argv[++i];
        } else {
            fprintf(stderr, "upstream: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (strncmp(a, "--port", 6) == 0) {
            if (parse_port(val, &port) < 0) {
                fprintf(stderr, "upstream: bad port '%s'\n", val);
                return 2;
            }
        } else if (strncmp(a, "--bind", 6) == 0) {
            addr = val;
        } else {
            plan = val;
        }
    }
    if (plan) {
        char err[256];
        if (tup_plan_check(plan, err, sizeof err) < 0) {
            fprintf(stderr, "upstream: bad --plan: %s\n", err);
            return 2;
        }
    }

    /* Blocked before the server thread exists, so only sigwait below ever sees them. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    char err[256];
    struct tup *t = tup_try_start_at(addr, port, plan, stderr, err, sizeof err);
    if (!t) {
        fprintf(stderr, "upstream: cannot listen: %s\n", err);
        return 1;
    }
    printf("listening on %s:%u\n", addr ? addr : "127.0.0.1", tup_port(t));
    fflush(stdout);

    int sig = 0;
    int rc = sigwait(&set, &sig);
    if (rc != 0)
        fprintf(stderr, "upstream: sigwait: %s\n", strerror(rc));
    else
        fprintf(stderr, "%s:%u %s, stopping after %zu requests on %llu connections\n",
                addr ? addr : "127.0.0.1", tup_port(t), sig == SIGINT ? "SIGINT" : "SIGTERM",
                tup_count(t), (unsigned long long)tup_connections(t));
    tup_stop(t);
    return rc == 0 ? 0 : 1;
}
