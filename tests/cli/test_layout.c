/* The layout of proxy/ (docs/architecture.md) holds: tests/cli/layout.py reads who calls whom
 * from the build's objects and who includes whom from the sources, and checks them against the
 * parts and what each may call and include, the circles, the libraries, the headers and the
 * lengths, those of tests/ too (docs/testing.md). The check is shown to catch a file in the
 * wrong part, a circle across parts, the core calling a transport past its interface, a library
 * called from a part not its own, a long test file, a part of the request's state machine
 * calling back into it, and each wall issue 41 found crossed: a
 * header of a part above, a core or front end file including a transport's insides, an engine
 * made outside the worker, a transport reaching into another, and two files including each
 * other. Run from the repository
 * root (make test does); the objects are those of the binary under test.
 */
#include <criterion/criterion.h>

#include <libgen.h>
#include <stdio.h>
#include <string.h>

#include "tests/support/proc.h"

/* Runs the check with 'extra' arguments (NULL-ended); its exit status, its output in *out. */
static int layout(const char *const *extra, char **out)
{
    char bin[512], objdir[600];
    snprintf(bin, sizeof(bin), "%s", proc_bin());
    snprintf(objdir, sizeof(objdir), "%s/obj/proxy", dirname(bin));
    char *argv[16] = { "/usr/bin/python3", "tests/cli/layout.py", objdir };
    size_t n = 3;
    for (; extra && *extra && n < 15; extra++)
        argv[n++] = (char *)*extra;
    argv[n] = NULL;
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 60000, &r), 0, "cannot run python3 tests/cli/layout.py");
    *out = strdup(r.out);
    cr_log_info("%s%s", r.out, r.err);
    int status = r.status;
    proc_result_free(&r);
    return status;
}

Test(layout, the_parts_call_down_only)
{
    char *out;
    int status = layout(NULL, &out);
    cr_expect_eq(status, 0, "the layout check found breaches:\n%s", out);
    cr_expect(strstr(out, " 0 breaches"), "%s", out);
    free(out);
}

/* The check run with 'extra' fails, and says 'breach'. */
static void expect_breach(const char *extra, const char *breach)
{
    const char *args[] = { extra, NULL };
    char *out;
    cr_expect_eq(layout(args, &out), 1, "%s passed the check", extra);
    cr_expect(strstr(out, breach), "no \"%s\" in:\n%s", breach, out);
    free(out);
}

Test(layout, a_file_in_a_lower_part_is_caught)
{
    /* the request state machine among the utilities: base/ would call the core */
    expect_breach("retry=base", "retry (base) calls");
}

Test(layout, a_circle_across_parts_is_caught)
{
    /* h2front.c and h2stream.c call each other: in two parts, that is a circle across them */
    expect_breach("h2stream=http1", "a call circle across parts");
}

Test(layout, the_core_reaches_a_transport_only_through_the_interface)
{
    /* with no file for an interface, the core's calls into upstream/ go past it */
    expect_breach("--interface=none", "the core reaches the upstream side only through");
}

Test(layout, a_library_called_from_another_part_is_caught)
{
    /* the HTTP/1.1 front end taken for a part of the core: the core would call libmicrohttpd */
    expect_breach("relay=core", "relay (core) calls MHD_");
}

Test(layout, a_header_of_a_part_above_is_caught)
{
    /* the shared HTTP layer taking the answer's tag from the core, as it once did */
    expect_breach("--include=proxy/http/answer.h=proxy/core/front.h",
                  "proxy/http/answer.h includes proxy/core/front.h: http/ may include base, "
                  "telemetry");
}

Test(layout, the_core_includes_only_the_interface_of_the_upstream_side)
{
    expect_breach("--include=proxy/core/runtime.c=proxy/upstream/curlm.h",
                  "proxy/core/runtime.c includes proxy/upstream/curlm.h: of upstream/, core/ may "
                  "include attempt.h only");
}

Test(layout, a_front_end_includes_no_transport_engine)
{
    /* the HTTP/1.1 server once included libcurl's engine and used none of it */
    expect_breach("--include=proxy/http1/server.c=proxy/upstream/curlm.h",
                  "proxy/http1/server.c includes proxy/upstream/curlm.h: of upstream/, http1/ may "
                  "include tunnel_up.h only");
    /* the tunnel once read a TLS upstream by itself, past the connector's kick for the bytes
     * OpenSSL holds (issue 41) */
    expect_breach("--include=proxy/http1/tunnel.c=proxy/upstream/tls.h",
                  "proxy/http1/tunnel.c includes proxy/upstream/tls.h: of upstream/, http1/ may "
                  "include tunnel_up.h only");
}

Test(layout, only_the_worker_makes_the_transport_engines)
{
    /* without its leave, the worker's making and freeing of the engines go past the interface */
    expect_breach("--makers=none", "worker (core) calls curlm: ");
    expect_breach("--makers=none", "proxy/core/worker.c includes proxy/upstream/curlm.h");
}

Test(layout, the_transports_neither_include_nor_call_each_other)
{
    /* the connector taken for the upgrade transport's own: the HTTP/2 sessions would reach into
     * it, as the upgrade once took the HTTP/2 sessions' loop and TLS contexts */
    expect_breach("--transport=connect=upgrade", "h2up_conn (HTTP/2) calls connect (upgrade): ");
    expect_breach(
        "--transport=connect=upgrade",
        "proxy/upstream/h2up_conn.c (HTTP/2) includes proxy/upstream/connect.h (upgrade)");
}

Test(layout, two_files_including_each_other_are_caught)
{
    /* the balancer reading the snapshot's header, which includes the balancer's: as before */
    expect_breach("--include=proxy/core/balance.c=proxy/core/runtime.h",
                  "an include circle between proxy/core/balance, proxy/core/runtime");
}

Test(layout, a_long_test_file_is_caught)
{
    /* tests/ under a bound of 100 lines: most suites pass it, and each is named */
    expect_breach("--max-test-lines=100", "tests/support/tup.c: ");
    expect_breach("--max-test-lines=100", "over 100: split it by what it covers");
}

Test(layout, a_part_calling_back_into_the_state_machine_is_caught)
{
    /* req.c taken for the machine: race.c, edge.c... call it, as they called retry.c before
     * the machine's calls went one way */
    expect_breach("--machine=req", "race calls req: ");
}
