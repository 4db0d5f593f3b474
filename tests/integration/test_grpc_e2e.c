/* gRPC end to end (docs/grpc.md): a real grpcio client (tests/tools/grpc_peer.py, Debian's
 * python3-grpcio) calls through retryproxy's HTTP/2 front end to a real grpcio server behind an
 * h2c:// upstream. Each test asserts what the server recorded (attempts, metadata, the hash of
 * every request message) as well as what the client got (status, messages).
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/fixture.h"

#define PY   "/usr/bin/python3"
#define PEER "tests/tools/grpc_peer.py"

static pid_t server_pid = -1;
static int server_in = -1;
static uint16_t server_port;
static char record[96];

static void stop_server(void)
{
    if (server_pid > 0) {
        proc_helper_stop(server_pid, server_in); /* it serves until its stdin closes */
        server_pid = -1;
        unlink(record);
    }
}

static void fini(void)
{
    fx_stop();
    stop_server();
}

TestSuite(grpc_e2e, .fini = fini, .timeout = 90);

/* The grpcio server, on a port it prints; over TLS with PEM files 'cert' and 'key' unless NULL. */
static void start_server_tls(const char *cert, const char *key)
{
    snprintf(record, sizeof(record), "/tmp/retryproxy-grpc-%d.jsonl", (int)getpid());
    unlink(record);
    char *argv[] = { PY,           PEER,        "server", "--record", record, cert ? "--tls" : NULL,
                     (char *)cert, (char *)key, NULL };
    char buf[64];
    server_pid = proc_helper_start(argv, &server_in, buf, sizeof(buf), 15000);
    cr_assert_gt(server_pid, 0, "cannot start grpc_peer.py");
    unsigned port = 0;
    cr_assert_eq(sscanf(buf, "port %u", &port), 1, "grpc_peer.py server printed \"%s\"", buf);
    server_port = (uint16_t)port;
}

static void start_server(void)
{
    start_server_tls(NULL, NULL);
}

/* The server and a proxy whose route "svc" sends /test.Echo/ to it with 'retry' (a JSON
 * object's members). */
static void start(const char *retry)
{
    start_server();
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "svc",
               "\"match\": {\"path_prefix\": \"/test.Echo/\"}, \"upstreams\": "
               "[\"h2c://127.0.0.1:%u\"], \"retry\": {%s}",
               server_port, retry);
    fx_start_b(b, "--workers", "2", NULL);
}

/* One call through the proxy: 'kind' unary, server or bidi; messages and metadata are
 * NULL-terminated lists (may be NULL); 'first': a server stream cancelled once its first
 * message came ("first_ms" says when). Returns the client's JSON report (caller decrefs). */
static json_t *call_as(const char *method, const char *kind, const char *const *msgs,
                       const char *const *md, const char *timeout_s, bool first)
{
    char target[32];
    snprintf(target, sizeof(target), "127.0.0.1:%u", px->port);
    char *argv[64] = { PY,
                       PEER,
                       "call",
                       "--target",
                       target,
                       "--method",
                       (char *)method,
                       "--kind",
                       (char *)kind,
                       "--timeout",
                       (char *)(timeout_s ? timeout_s : "10") };
    size_t n = 11;
    for (size_t i = 0; msgs && msgs[i] && n < 60; i++) {
        argv[n++] = "--message";
        argv[n++] = (char *)msgs[i];
    }
    for (size_t i = 0; md && md[i] && n < 60; i++) {
        argv[n++] = "--metadata";
        argv[n++] = (char *)md[i];
    }
    if (first)
        argv[n++] = "--first";
    argv[n] = NULL;
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 30000, &r), 0);
    cr_assert_eq(r.status, 0, "grpc_peer.py call: %d\n%s", r.status, r.err);
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e);
    cr_assert_not_null(j, "not JSON: %s", r.out);
    proc_result_free(&r);
    return j;
}

static json_t *call(const char *method, const char *kind, const char *const *msgs,
                    const char *const *md, const char *timeout_s)
{
    return call_as(method, kind, msgs, md, timeout_s, false);
}

/* The server's records of request id 'id' (caller decrefs). */
static json_t *records_of(const char *id)
{
    char *text = proc_read_file(record);
    json_t *all = json_array();
    for (char *line = text; line && *line;) {
        char *end = strchr(line, '\n');
        json_t *j = json_loadb(line, end ? (size_t)(end - line) : strlen(line), 0, NULL);
        const char *rid =
            json_string_value(json_object_get(json_object_get(j, "metadata"), "x-request-id"));
        if (rid && strcmp(rid, id) == 0)
            json_array_append(all, j);
        json_decref(j);
        line = end ? end + 1 : NULL;
    }
    free(text);
    return all;
}

static const char *code_of(const json_t *j)
{
    return json_string_value(json_object_get(j, "code"));
}

static const char *message_at(const json_t *j, size_t i)
{
    return json_string_value(json_array_get(json_object_get(j, "messages"), i));
}

Test(grpc_e2e, a_unary_call_goes_through_with_its_metadata)
{
    start("\"retry_on\": [\"unavailable\"]");
    const char *msgs[] = { "hello", NULL };
    const char *md[] = { "x-request-id=plain", "x-custom=v1", NULL };
    json_t *j = call("/test.Echo/Unary", "unary", msgs, md, NULL);
    cr_expect_str_eq(code_of(j), "OK");
    cr_expect_str_eq(message_at(j, 0), "hello");
    json_decref(j);
    json_t *recs = records_of("plain");
    cr_assert_eq(json_array_size(recs), 1);
    json_t *md0 = json_object_get(json_array_get(recs, 0), "metadata");
    cr_expect_str_eq(json_string_value(json_object_get(md0, "x-custom")), "v1");
    cr_expect_str_eq(json_string_value(json_object_get(md0, "x-retry-attempt")), "1");
    json_decref(recs);
}

Test(grpc_e2e, trailers_only_unavailable_is_retried_with_the_same_message)
{
    start("\"max_attempts\": 3, \"retry_on\": [\"unavailable\"], " CFG_FAST);
    const char *msgs[] = { "again", NULL };
    const char *md[] = { "x-request-id=to-retry", "x-fail=2,14,headers", NULL };
    json_t *j = call("/test.Echo/Unary", "unary", msgs, md, NULL);
    cr_expect_str_eq(code_of(j), "OK");
    cr_expect_str_eq(message_at(j, 0), "again");
    json_decref(j);
    json_t *recs = records_of("to-retry");
    cr_assert_eq(json_array_size(recs), 3, "three attempts reached the server");
    const char *h0 =
        json_string_value(json_array_get(json_object_get(json_array_get(recs, 0), "requests"), 0));
    for (size_t i = 1; i < 3; i++)
        cr_expect_str_eq(json_string_value(json_array_get(
                             json_object_get(json_array_get(recs, i), "requests"), 0)),
                         h0, "attempt %zu sent the same message", i + 1);
    json_decref(recs);
}

Test(grpc_e2e, a_status_retry_on_does_not_name_reaches_the_client)
{
    start("\"retry_on\": [\"unavailable\"]");
    const char *md[] = { "x-request-id=internal", "x-fail=1,13,headers", NULL };
    json_t *j = call("/test.Echo/Unary", "unary", NULL, md, NULL);
    cr_expect_str_eq(code_of(j), "INTERNAL");
    cr_expect_str_eq(json_string_value(json_object_get(j, "details")), "injected failure 1");
    json_decref(j);
    json_t *recs = records_of("internal");
    cr_expect_eq(json_array_size(recs), 1);
    json_decref(recs);
}

Test(grpc_e2e, a_server_stream_retried_on_its_trailers_status_before_anything_reached_the_client)
{
    start("\"max_attempts\": 3, \"retry_on\": [\"unavailable\"], " CFG_FAST);
    const char *msgs[] = { "abc", NULL };
    const char *md[] = { "x-request-id=stream", "x-fail=1,14,trailers", NULL };
    json_t *j = call("/test.Echo/Server", "server", msgs, md, NULL);
    cr_expect_str_eq(code_of(j), "OK");
    json_t *got = json_object_get(j, "messages");
    cr_expect_eq(json_array_size(got), 3, "the second attempt's messages alone");
    cr_expect_str_eq(message_at(j, 0), "0");
    json_decref(j);
    json_t *recs = records_of("stream");
    cr_expect_eq(json_array_size(recs), 2);
    json_decref(recs);
}

Test(grpc_e2e, a_bidirectional_ping_pong_never_waits_for_a_whole_request)
{
    start("\"retry_on\": [\"unavailable\"]");
    const char *msgs[] = { "ping1", "ping2", "ping3", NULL };
    const char *md[] = { "x-request-id=pingpong", NULL };
    json_t *j = call("/test.Echo/Bidi", "bidi", msgs, md, "8");
    cr_expect_str_eq(code_of(j), "OK", "a deadlock would end in DEADLINE_EXCEEDED");
    cr_expect_eq(json_array_size(json_object_get(j, "messages")), 3);
    cr_expect_str_eq(message_at(j, 2), "ping3");
    json_decref(j);
    json_t *recs = records_of("pingpong");
    cr_expect_eq(json_array_size(recs), 1);
    json_decref(recs);
}

Test(grpc_e2e, errors_of_our_own_are_grpc_statuses)
{
    start("\"retry_on\": [\"unavailable\"]");
    const char *md[] = { "x-request-id=nowhere", NULL };
    json_t *j = call("/other.Svc/Call", "unary", NULL, md, NULL);
    cr_expect_str_eq(code_of(j), "UNIMPLEMENTED");
    cr_expect_str_eq(json_string_value(json_object_get(j, "details")),
                     "no route matches this request");
    json_decref(j);
}

Test(grpc_e2e, the_clients_deadline_bounds_the_call_and_reaches_the_server)
{
    start("\"retry_on\": [\"unavailable\"]");
    const char *md[] = { "x-request-id=slow", "x-sleep-ms=3000", NULL };
    int64_t t0 = now_ms();
    json_t *j = call("/test.Echo/Slow", "unary", NULL, md, "0.5");
    cr_expect_str_eq(code_of(j), "DEADLINE_EXCEEDED");
    cr_expect_lt(now_ms() - t0, 2900, "not the server's 3 s");
    json_decref(j);
}

/* A gRPC service behind TLS: an https upstream whose server chooses h2 by ALPN ("required":
 * HTTP/1.1 could not carry the call), its certificate trusted through tls.ca_file; a status in
 * the trailers is retried there as on h2c (docs/http2.md "https upstreams"). */
Test(grpc_e2e, a_call_to_a_tls_server_goes_over_h2_by_alpn_and_is_retried)
{
    char dir[] = "/tmp/retryproxy-grpctls-XXXXXX", cmd[512], cert[64], key[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cert, sizeof(cert), "%s/cert.pem", dir);
    snprintf(key, sizeof(key), "%s/key.pem", dir);
    snprintf(cmd, sizeof(cmd),
             "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test "
             "-addext subjectAltName=IP:127.0.0.1 -keyout %s -out %s >/dev/null 2>&1",
             key, cert);
    cr_assert_eq(fx_sh(cmd), 0, "openssl could not make a certificate");
    start_server_tls(cert, key);
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "svc",
               "\"match\": {\"path_prefix\": \"/test.Echo/\"}, \"upstreams\": "
               "[\"https://127.0.0.1:%u\"], \"tls\": {\"ca_file\": \"%s\", \"http2\": "
               "\"required\"}, \"retry\": {\"retry_on\": [\"unavailable\"], " CFG_FAST "}",
               server_port, cert);
    fx_start_b(b, "--workers", "1", NULL);
    const char *msgs[] = { "over tls", NULL };
    const char *md[] = { "x-request-id=tls-1", "x-fail=1,14,trailers", NULL };
    json_t *j = call("/test.Echo/Server", "server", msgs, md, NULL);
    cr_expect_str_eq(code_of(j), "OK");
    cr_expect_eq(json_array_size(json_object_get(j, "messages")), 8, "the second attempt's");
    json_decref(j);
    json_t *recs = records_of("tls-1");
    cr_expect_eq(json_array_size(recs), 2);
    json_decref(recs);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    fx_sh(cmd);
}

/* Hedging (docs/grpc.md "Deadlines", forwarding.md "Hedging on per-try timeout"): a call whose
 * every attempt takes 700 ms, on a route that hedges at 300 ms, gets the first attempt's
 * answer; and that attempt was told the time left before the deadline, not the per-try
 * timeout, or the server would have given up on it at 300 ms. */
Test(grpc_e2e, a_slow_call_is_hedged_and_its_first_attempt_is_not_told_to_give_up)
{
    start_server();
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "svc",
               "\"match\": {\"path_prefix\": \"/test.Echo/\"}, \"upstreams\": "
               "[\"h2c://127.0.0.1:%u\"], \"timeout_ms\": 8000, \"per_try_timeout_ms\": 300, "
               "\"retry\": {\"max_attempts\": 2, \"methods\": [\"POST\"], \"retry_on\": "
               "[\"timeout\", \"unavailable\"], \"hedge_on_per_try_timeout\": true, " CFG_FAST "}",
               server_port);
    fx_start_b(b, "--workers", "1", NULL);
    const char *msgs[] = { "slow one", NULL };
    const char *md[] = { "x-request-id=hedged", "x-sleep-ms=700", NULL };
    int64_t t0 = now_ms();
    json_t *j = call("/test.Echo/Slow", "unary", msgs, md, NULL);
    int64_t took = now_ms() - t0;
    cr_expect_str_eq(code_of(j), "OK", "not cancelled at the per-try timeout: %s",
                     json_string_value(json_object_get(j, "details")));
    cr_expect_str_eq(message_at(j, 0), "slow one");
    cr_expect_lt(took, 6000, "the first attempt's answer, long before the deadline");
    json_decref(j);
    /* the second attempt's record comes when its sleep ends, after the answer */
    json_t *recs = NULL;
    for (int i = 0; i < 60; i++) {
        json_decref(recs);
        recs = records_of("hedged");
        if (json_array_size(recs) >= 2)
            break;
        usleep(50 * 1000);
    }
    cr_assert_eq(json_array_size(recs), 2, "the first attempt and its hedge reached the server");
    const char *h[2];
    for (size_t i = 0; i < 2; i++)
        h[i] = json_string_value(
            json_array_get(json_object_get(json_array_get(recs, i), "requests"), 0));
    cr_assert(h[0] && h[1]);
    cr_expect_str_eq(h[0], h[1], "the hedge sent the same message");
    for (size_t i = 0; i < 2; i++) {
        json_t *rec = json_array_get(recs, i);
        if (json_integer_value(json_object_get(rec, "attempt")) != 1)
            continue;
        double left = json_number_value(json_object_get(rec, "time_remaining"));
        cr_expect_gt(left, 1.0, "the first attempt's grpc-timeout is the time left (%.3f s)", left);
        cr_expect_str_eq(
            json_string_value(json_object_get(json_object_get(rec, "metadata"), "x-retry-attempt")),
            "1");
    }
    json_decref(recs);
}

/* A server stream's first message (a watch's first event) on a route that retries statuses in
 * trailers is held for its status at most retry.grpc_hold_ms (docs/grpc.md "A status in
 * trailers"), here with a server that then sends nothing for 20 s; 0 never holds it. */
static void watch_first_message(const char *hold, const char *id)
{
    start_server();
    struct cfgb *b = cfgb_new();
    cfgb_route(b, "svc",
               "\"match\": {\"path_prefix\": \"/test.Echo/\"}, \"upstreams\": "
               "[\"h2c://127.0.0.1:%u\"], \"timeout_ms\": 60000, \"retry\": {\"retry_on\": "
               "[\"unavailable\"]%s}",
               server_port, hold);
    fx_start_b(b, "--workers", "1", NULL);
    char rid[64];
    snprintf(rid, sizeof(rid), "x-request-id=%s", id);
    const char *md[] = { rid, "x-sleep-ms=20000", NULL };
    json_t *j = call_as("/test.Echo/Watch", "server", NULL, md, "12", true);
    cr_expect_str_eq(message_at(j, 0), "event", "the first event never came: %s", code_of(j));
    json_t *first = json_object_get(j, "first_ms");
    cr_expect_not_null(first);
    cr_expect_lt(json_integer_value(first), 6000, "held %lld ms",
                 (long long)json_integer_value(first));
    json_decref(j);
}

Test(grpc_e2e, a_server_streams_first_message_is_held_no_longer_than_grpc_hold_ms)
{
    watch_first_message(", \"grpc_hold_ms\": 300", "watch-300");
}

Test(grpc_e2e, a_server_streams_first_message_is_held_by_default_for_a_bounded_time)
{
    watch_first_message("", "watch-default");
}

Test(grpc_e2e, grpc_hold_ms_0_never_holds_a_response)
{
    watch_first_message(", \"grpc_hold_ms\": 0", "watch-0");
}

/* Once the hold's time is up the first message has gone to the client: the call is committed,
 * and a status in its trailers that retry_on names is the answer, never retried. */
Test(grpc_e2e, a_call_whose_hold_ran_out_is_committed)
{
    start("\"max_attempts\": 3, \"retry_on\": [\"unavailable\"], \"grpc_hold_ms\": 200, " CFG_FAST);
    const char *md[] = { "x-request-id=committed", "x-sleep-ms=1500", "x-fail=1,14,trailers",
                         NULL };
    json_t *j = call("/test.Echo/Watch", "server", NULL, md, NULL);
    cr_expect_str_eq(code_of(j), "UNAVAILABLE");
    cr_expect_eq(json_array_size(json_object_get(j, "messages")), 1);
    cr_expect_str_eq(message_at(j, 0), "event");
    json_decref(j);
    json_t *recs = records_of("committed");
    cr_expect_eq(json_array_size(recs), 1, "never retried");
    json_decref(recs);
}
