/* Config loading: data-driven cases (tests/data/config/{invalid,valid}), the resolved values
 * of a snapshot, the keys read only at start and the reference. Run from the repository root
 * (make test does). test_config_errors.c has how errors are reported and the files refused,
 * test_config_lists.c long lists, test_config_jsonpos.c the position scanner; the loaders
 * they share are tests/support/cfgtext. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <criterion/parameterized.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config/cfg.h"
#include "config/jsonpos.h"
#include "policy/budget.h"
#include "tests/support/cfgtext.h"

#define DATA "tests/data/config"

struct file_case {
    char name[96];
};

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct file_case *)a)->name, ((const struct file_case *)b)->name);
}

/* Every DIR/NAME.json that is not an .expected.json, as Criterion parameters (shared memory). */
static struct criterion_test_params list_cases(const char *dir)
{
    size_t n = 0, cap = 128;
    struct file_case *v = cr_malloc(cap * sizeof(*v));
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s (run from the repository root)", dir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0 ||
            strstr(e->d_name, ".expected.json"))
            continue;
        cr_assert_lt(n, cap);
        snprintf(v[n].name, sizeof(v[n].name), "%.*s", (int)(len - 5), e->d_name);
        n++;
    }
    closedir(d);
    qsort(v, n, sizeof(*v), by_name);
    return cr_make_param_array(struct file_case, v, n, NULL);
}

/* ---- invalid configs: each NAME.json must produce exactly NAME.err ---- */

/* One timeout for the whole suite: Criterion 2.4 leaks a timer record in its runner when tests
 * with different per-test timeouts run in parallel (a LeakSanitizer report under make asan). */
TestSuite(config, .timeout = 120);

ParameterizedTestParameters(config, invalid_file_gives_its_errors)
{
    return list_cases(DATA "/invalid");
}

ParameterizedTest(struct file_case *c, config, invalid_file_gives_its_errors)
{
    char json[256], err[256];
    snprintf(json, sizeof(json), DATA "/invalid/%s.json", c->name);
    snprintf(err, sizeof(err), DATA "/invalid/%s.err", c->name);
    char *want = cfgt_read_file(err);
    cr_assert_not_null(want, "%s has no .err file beside it", json);

    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct cfg *cfg = cfg_load_file(json, &errs);
    cr_expect_null(cfg, "%s loaded although invalid", c->name);
    cfg_unref(cfg);
    char *got = cfgt_errors_text(&errs);
    cr_expect_str_eq(got, want, "%s:\n--- got\n%s--- want\n%s", c->name, got, want);
    for (size_t i = 0; i < errs.n; i++) {
        cr_expect_gt(errs.v[i].line, 0, "%s: error %zu has no line", c->name, i);
        cr_expect_eq(errs.v[i].path[0], '$', "%s: path %s", c->name, errs.v[i].path);
    }
    free(got);
    free(want);
    cfg_errs_clear(&errs);
}

Test(config, invalid_corpus_has_at_least_thirty_cases)
{
    size_t n = 0;
    DIR *d = opendir(DATA "/invalid");
    cr_assert_not_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strstr(e->d_name, ".json") != NULL;
    closedir(d);
    cr_expect_geq(n, 30);
}

/* ---- valid configs: each NAME.json loads, and its effective config holds NAME.expected.json
 * (every key there must match; keys left out are not compared) ---- */

static int json_holds(const json_t *got, const json_t *want, char *where, size_t wlen)
{
    if (json_is_number(want) && json_is_number(got))
        return fabs(json_number_value(got) - json_number_value(want)) < 1e-9;
    if (json_is_object(want)) {
        if (!json_is_object(got))
            return 0;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)want, k, v)
        {
            size_t at = strlen(where);
            snprintf(where + at, wlen - at, ".%s", k);
            const json_t *g = json_object_get(got, k);
            if (!g || !json_holds(g, v, where, wlen))
                return 0;
            where[at] = '\0';
        }
        return 1;
    }
    if (json_is_array(want)) {
        if (!json_is_array(got) || json_array_size(got) != json_array_size(want))
            return 0;
        for (size_t i = 0; i < json_array_size(want); i++) {
            size_t at = strlen(where);
            snprintf(where + at, wlen - at, "[%zu]", i);
            if (!json_holds(json_array_get(got, i), json_array_get(want, i), where, wlen))
                return 0;
            where[at] = '\0';
        }
        return 1;
    }
    return json_equal((json_t *)got, (json_t *)want);
}

ParameterizedTestParameters(config, valid_file_resolves_to_expected_values)
{
    return list_cases(DATA "/valid");
}

ParameterizedTest(struct file_case *c, config, valid_file_resolves_to_expected_values)
{
    char path[256], exp[256];
    snprintf(path, sizeof(path), DATA "/valid/%s.json", c->name);
    snprintf(exp, sizeof(exp), DATA "/valid/%s.expected.json", c->name);
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct cfg *cfg = cfg_load_file(path, &errs);
    char *etext = cfgt_errors_text(&errs);
    cr_assert_not_null(cfg, "%s rejected:\n%s", c->name, etext);
    free(etext);

    json_error_t jerr;
    json_t *want = json_load_file(exp, 0, &jerr);
    cr_assert_not_null(want, "%s: %s", exp, jerr.text);
    json_t *got = cfg_to_json(cfg);
    char where[512] = "$";
    char *dump = json_dumps(got, JSON_INDENT(1));
    cr_expect(json_holds(got, want, where, sizeof(where)), "%s: mismatch at %s in\n%s", c->name,
              where, dump);
    free(dump);
    json_decref(got);
    json_decref(want);
    cfg_unref(cfg);
    cfg_errs_clear(&errs);
}

/* ---- resolved values, read from the snapshot's structs ---- */

Test(config, defaults_merge_field_by_field_into_routes)
{
    struct cfg *c =
        cfgt_load_ok("{\"defaults\": {\"timeout_ms\": 5000, \"retry\": {\"max_attempts\": 5,"
                     " \"backoff\": {\"policy\": \"fibonacci\", \"jitter\": \"none\"}}},"
                     " \"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"],"
                     " \"retry\": {\"backoff\": {\"base_ms\": 7}}}]}");
    const struct cfg_route *r = &c->routes[0];
    cr_expect_eq(r->timeout_ms, 5000);                        /* from defaults */
    cr_expect_eq(r->retry.max_attempts, 5);                   /* from defaults */
    cr_expect_eq(r->retry.backoff.policy, BACKOFF_FIBONACCI); /* defaults, nested */
    cr_expect_eq(r->retry.backoff.jitter, JITTER_NONE);       /* defaults, nested */
    cr_expect_eq(r->retry.backoff.base_ms, 7);                /* the route's own */
    cr_expect_eq(r->retry.backoff.cap_ms, 10000);             /* schema default */
    cr_expect_eq(r->connect_timeout_ms, 1000);                /* schema default */
    cr_expect_eq(c->defaults.timeout_ms, 5000);
    cr_expect_eq(c->defaults.retry.backoff.base_ms, 100);
    cfg_unref(c);
}

/* retry.grpc_hold_ms (docs/grpc.md "A status in trailers"): 500 by default, 0 turns holding
 * off, set in defaults or per route; a bad value is named by its path. */
Test(config, grpc_hold_ms_defaults_and_bounds)
{
    struct cfg *c = cfgt_load_ok("{\"defaults\": {\"retry\": {\"grpc_hold_ms\": 0}}, \"routes\": ["
                                 "{\"name\": \"a\", \"upstreams\": [\"h2c://h:1\"]},"
                                 "{\"name\": \"b\", \"upstreams\": [\"h2c://h:1\"],"
                                 " \"retry\": {\"grpc_hold_ms\": 2000}}]}");
    cr_expect_eq(c->routes[0].retry.grpc_hold_ms, 0);
    cr_expect_eq(c->routes[1].retry.grpc_hold_ms, 2000);
    cr_expect_eq(c->defaults.retry.grpc_hold_ms, 0);
    cfg_unref(c);
    c = cfgt_load_ok("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"h2c://h:1\"]}]}");
    cr_expect_eq(c->routes[0].retry.grpc_hold_ms, 500);
    cfg_unref(c);
    char *e = cfgt_load_errors("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"h2c://h:1\"],"
                               " \"retry\": {\"grpc_hold_ms\": -1}}]}");
    cr_expect_str_eq(e, "1:81: $.routes[0].retry.grpc_hold_ms: must be an integer from 0 to "
                        "86400000, got -1\n");
    free(e);
}

Test(config, upstreams_are_split_into_scheme_authority_and_base_path)
{
    struct cfg *c = cfgt_load_ok("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:81\","
                                 " \"https://api.example.com/v1/\", \"http://[::1]:8080/x/y\"]}]}");
    const struct cfg_route *r = &c->routes[0];
    cr_assert_eq(r->n_upstreams, 3);
    cr_expect_not(r->upstreams[0].https);
    cr_expect_str_eq(r->upstreams[0].authority, "h:81");
    cr_expect_str_eq(r->upstreams[0].base_path, "");
    cr_expect(r->upstreams[1].https);
    cr_expect_str_eq(r->upstreams[1].authority, "api.example.com");
    cr_expect_str_eq(r->upstreams[1].base_path, "/v1");
    cr_expect_str_eq(r->upstreams[2].authority, "[::1]:8080");
    cr_expect_str_eq(r->upstreams[2].base_path, "/x/y");
    cr_expect_str_eq(r->upstreams[1].url, "https://api.example.com/v1/");
    cr_expect_str_eq(r->upstreams[1].origin, "https://api.example.com/");
    cr_expect_str_eq(r->upstreams[2].origin, "http://[::1]:8080/");
    cfg_unref(c);
}

/* Each upstream's host (what is resolved, docs/endpoints.md) and port, the scheme's when the URL
 * has none. */
Test(config, upstreams_have_their_host_and_port)
{
    struct cfg *c = cfgt_load_ok("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:81\","
                                 " \"https://api.example.com/v1/\", \"http://[::1]:8080/x/y\","
                                 " \"https://[fd00::7]\", \"h2c://10.0.0.1\"]}]}");
    const struct cfg_route *r = &c->routes[0];
    cr_assert_eq(r->n_upstreams, 5);
    static const struct {
        const char *host;
        unsigned port;
    } want[] = { { "h", 81 },
                 { "api.example.com", 443 },
                 { "::1", 8080 },
                 { "fd00::7", 443 },
                 { "10.0.0.1", 80 } };
    for (size_t i = 0; i < 5; i++) {
        cr_expect_str_eq(r->upstreams[i].host, want[i].host, "upstream %zu", i);
        cr_expect_eq(r->upstreams[i].port, want[i].port, "upstream %zu", i);
    }
    cfg_unref(c);
}

/* docs/http2.md: h2c:// is HTTP/2 over cleartext with prior knowledge, any case of the scheme
 * like the others. */
Test(config, h2c_upstream_is_http2_over_cleartext)
{
    struct cfg *c = cfgt_load_ok(
        "{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"h2c://grpc.internal:50051/svc/\","
        " \"H2C://10.0.0.1\", \"http://h:81\", \"https://h\"]}]}");
    const struct cfg_route *r = &c->routes[0];
    cr_assert_eq(r->n_upstreams, 4);
    cr_expect_eq(r->upstreams[0].proto, CFG_PROTO_H2C);
    cr_expect_not(r->upstreams[0].https);
    cr_expect_str_eq(r->upstreams[0].authority, "grpc.internal:50051");
    cr_expect_str_eq(r->upstreams[0].base_path, "/svc");
    cr_expect_str_eq(r->upstreams[0].origin, "h2c://grpc.internal:50051/");
    cr_expect_eq(r->upstreams[1].proto, CFG_PROTO_H2C);
    cr_expect_str_eq(r->upstreams[1].origin, "h2c://10.0.0.1/");
    cr_expect_eq(r->upstreams[2].proto, CFG_PROTO_HTTP);
    cr_expect_eq(r->upstreams[3].proto, CFG_PROTO_HTTPS);
    cfg_unref(c);
}

/* routes[].tls (docs/http2.md "https upstreams"): HTTP/2 by ALPN unless "off", the system's
 * store unless a readable ca_file; defaults apply, and a bad value names its path. */
Test(config, tls_settings_of_https_upstreams)
{
    struct cfg *c =
        cfgt_load_ok("{\"defaults\": {\"tls\": {\"http2\": \"required\"}}, \"routes\": ["
                     "{\"name\": \"a\", \"upstreams\": [\"https://h\"]},"
                     "{\"name\": \"b\", \"upstreams\": [\"https://h\"], \"tls\": "
                     "{\"http2\": \"off\", \"ca_file\": \"/dev/null\"}}]}");
    cr_expect_eq(c->routes[0].tls.http2, CFG_HTTP2_REQUIRED);
    cr_expect_null(c->routes[0].tls.ca_file);
    cr_expect_eq(c->routes[1].tls.http2, CFG_HTTP2_OFF);
    cr_expect_str_eq(c->routes[1].tls.ca_file, "/dev/null");
    cfg_unref(c);
    c = cfgt_load_ok("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"https://h\"]}]}");
    cr_expect_eq(c->routes[0].tls.http2, CFG_HTTP2_AUTO, "auto by default");
    cfg_unref(c);
    char *e =
        cfgt_load_errors("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"https://h\"],"
                         " \"tls\": {\"ca_file\": \"/nonexistent/ca.pem\", \"http2\": \"yes\"}}]}");
    cr_expect(strstr(e, "$.routes[0].tls.ca_file: cannot be read"), "%s", e);
    cr_expect(strstr(e, "$.routes[0].tls.http2:"), "%s", e);
    free(e);
}

/* docs/upgrades.md: routes[].upgrades names the tunnelled tokens ("websocket" unless set, []
 * for none, inherited from defaults); the two tunnel limits have their defaults; h2c, a
 * token with a version or a space, and a token listed twice are errors naming their path. */
Test(config, upgrades_and_tunnel_limits)
{
    struct cfg *c =
        cfgt_load_ok("{\"defaults\": {\"upgrades\": [\"WebSocket\", \"x-raw\"]}, \"routes\": ["
                     "{\"name\": \"a\", \"upstreams\": [\"http://h\"]},"
                     "{\"name\": \"b\", \"upstreams\": [\"http://h\"], \"upgrades\": []}],"
                     " \"limits\": {\"max_tunnels\": 7, \"tunnel_idle_timeout_ms\": 0}}");
    cr_assert_eq(c->routes[0].n_upgrades, 2);
    cr_expect_str_eq(c->routes[0].upgrades[0].token, "WebSocket");
    cr_expect_str_eq(c->routes[0].upgrades[1].token, "x-raw");
    cr_expect_eq(c->routes[1].n_upgrades, 0);
    cr_expect_eq(c->max_tunnels, 7);
    cr_expect_eq(c->tunnel_idle_timeout_ms, 0);
    cfg_unref(c);
    c = cfgt_load_ok("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h\"]}]}");
    cr_assert_eq(c->routes[0].n_upgrades, 1);
    cr_expect_str_eq(c->routes[0].upgrades[0].token, "websocket", "websocket by default");
    cr_expect_eq(c->max_tunnels, 10000);
    cr_expect_eq(c->tunnel_idle_timeout_ms, 300000);
    cfg_unref(c);
    char *e = cfgt_load_errors(
        "{\"limits\": {\"max_tunnels\": -1, \"tunnel_idle_timeout_ms\": \"1\"},"
        " \"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h\"],"
        " \"upgrades\": [\"h2c\", \"websocket/13\", \"a b\", \"ws\", \"ws\", 1]}]}");
    cr_expect(strstr(e, "$.limits.max_tunnels: must be an integer"), "%s", e);
    cr_expect(strstr(e, "$.limits.tunnel_idle_timeout_ms: expected an integer"), "%s", e);
    cr_expect(strstr(e, "$.routes[0].upgrades[0]: \"h2c\" is not tunnelled"), "%s", e);
    cr_expect(strstr(e, "$.routes[0].upgrades[1]: \"websocket/13\" must be an upgrade token"), "%s",
              e);
    cr_expect(strstr(e, "$.routes[0].upgrades[2]:"), "%s", e);
    cr_expect(strstr(e, "$.routes[0].upgrades[4]: \"ws\" is listed twice"), "%s", e);
    cr_expect(strstr(e, "$.routes[0].upgrades[5]:"), "%s", e);
    free(e);
}

Test(config, retry_on_tokens_become_conditions_in_file_order)
{
    struct cfg *c = cfgt_load_ok("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"],"
                                 " \"retry\": {\"retry_on\": [\"429\", \"gateway-error\", \"5xx\","
                                 " \"500-503\", \"reset\", \"timeout\", \"connect-failure\"]}}]}");
    const struct cfg_retry *r = &c->routes[0].retry;
    cr_assert_eq(r->n_on, 7);
    cr_expect(r->on[0].kind == CFG_RETRY_STATUS && r->on[0].lo == 429 && r->on[0].hi == 429);
    cr_expect(r->on[1].kind == CFG_RETRY_STATUS && r->on[1].lo == 502 && r->on[1].hi == 504);
    cr_expect(r->on[2].kind == CFG_RETRY_STATUS && r->on[2].lo == 500 && r->on[2].hi == 599);
    cr_expect(r->on[3].kind == CFG_RETRY_STATUS && r->on[3].lo == 500 && r->on[3].hi == 503);
    cr_expect_eq(r->on[4].kind, CFG_RETRY_RESET);
    cr_expect_eq(r->on[5].kind, CFG_RETRY_TIMEOUT);
    cr_expect_eq(r->on[6].kind, CFG_RETRY_CONNECT_FAILURE);
    cr_expect_str_eq(r->on[1].token, "gateway-error");
    cfg_unref(c);
}

Test(config, grpc_status_conditions_by_name_and_number)
{
    struct cfg *c =
        cfgt_load_ok("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"],"
                     " \"retry\": {\"retry_on\": [\"cancelled\", \"deadline-exceeded\","
                     " \"resource-exhausted\", \"internal\", \"unavailable\", \"grpc:2\","
                     " \"grpc:10-11\", \"503\"]}}]}");
    const struct cfg_retry *r = &c->routes[0].retry;
    cr_assert_eq(r->n_on, 8);
    static const uint16_t lo[] = { 1, 4, 8, 13, 14, 2, 10 }, hi[] = { 1, 4, 8, 13, 14, 2, 11 };
    for (size_t i = 0; i < 7; i++) {
        cr_expect_eq(r->on[i].kind, CFG_RETRY_GRPC, "%s", r->on[i].token);
        cr_expect(r->on[i].lo == lo[i] && r->on[i].hi == hi[i], "%s: %u-%u", r->on[i].token,
                  r->on[i].lo, r->on[i].hi);
    }
    cr_expect_eq(r->on[7].kind, CFG_RETRY_STATUS, "an HTTP status stays one");
    cfg_unref(c);
}

Test(config, header_conditions_and_the_pushback_header)
{
    struct cfg *c = cfgt_load_ok("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"],"
                                 " \"retry\": {\"retry_on\": [\"header:X-Retry-Me\","
                                 " \"header:X-Up=a=b c\", \"header:X-Empty=\"],"
                                 " \"pushback_header\": \"grpc-retry-pushback-ms\"}}]}");
    const struct cfg_retry *r = &c->routes[0].retry;
    cr_assert_eq(r->n_on, 3);
    cr_expect_eq(r->on[0].kind, CFG_RETRY_HEADER);
    cr_expect_str_eq(r->on[0].name, "X-Retry-Me");
    cr_expect_null(r->on[0].value, "no value: any");
    cr_expect_str_eq(r->on[1].name, "X-Up");
    cr_expect_str_eq(r->on[1].value, "a=b c", "the value is everything after the first '='");
    cr_expect_str_eq(r->on[2].value, "", "an empty value must be empty");
    cr_expect_str_eq(r->pushback_header, "grpc-retry-pushback-ms");
    cr_expect_null(c->routes[0].deadline_header, "off unless set");
    cfg_unref(c);
}

Test(config, methods_and_match_resolve_to_bitmasks)
{
    struct cfg *c =
        cfgt_load_ok("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"],"
                     " \"match\": {\"host\": \"Orders.Internal\", \"methods\": [\"POST\"],"
                     " \"path_prefix\": \"/orders\"}, \"retry\": {\"methods\": [\"GET\","
                     " \"PATCH\"]}}, {\"name\": \"b\", \"upstreams\": [\"http://h:1\"]}]}");
    cr_expect_str_eq(c->routes[0].match_host, "orders.internal");
    cr_expect_eq(c->routes[0].match_methods, CFG_METHOD_POST);
    cr_expect_str_eq(c->routes[0].match_path_prefix, "/orders");
    cr_expect_eq(c->routes[0].retry.methods, CFG_METHOD_GET | CFG_METHOD_PATCH);
    cr_expect_null(c->routes[1].match_host);
    cr_expect_eq(c->routes[1].match_methods, 0);
    cr_expect_str_eq(c->routes[1].match_path_prefix, "/");
    cr_expect_eq(c->routes[1].retry.methods, CFG_METHOD_GET | CFG_METHOD_HEAD | CFG_METHOD_OPTIONS |
                                                 CFG_METHOD_PUT | CFG_METHOD_DELETE |
                                                 CFG_METHOD_TRACE);
    cfg_unref(c);
}

Test(config, budgets_default_differently_at_top_and_per_route)
{
    struct cfg *c =
        cfgt_load_ok("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"]}]}");
    cr_expect_eq(c->budget.max_concurrent_retries, 100);
    cr_expect_eq(c->routes[0].budget.max_concurrent_retries, -1); /* null: no cap */
    cr_expect_float_eq(c->budget.retry_ratio, 0.2, 1e-12);
    cr_expect_float_eq(c->routes[0].budget.min_retries_per_second, 10.0, 1e-12);
    cr_expect_eq(c->routes[0].budget.window_ms, 10000);
    cfg_unref(c);
}

/* The config holds a budget as policy/budget.h's own type: the budget functions take it as it
 * is. */
Test(config, budgets_are_held_as_the_policys_limits)
{
    struct cfg *c =
        cfgt_load_ok("{\"budget\": {\"max_concurrent_retries\": 1, \"retry_ratio\": 0,"
                     " \"min_retries_per_second\": 1, \"window_ms\": 1000},"
                     " \"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"]}]}");
    const struct budget_limits *l = &c->budget;
    struct budget b;
    budget_init(&b, l->window_ms);
    cr_expect(budget_acquire(&b, l->max_concurrent_retries));
    cr_expect_not(budget_acquire(&b, l->max_concurrent_retries), "max_concurrent_retries is 1");
    cr_expect(budget_ratio_allows(&b, l, 0));
    budget_note_retry(&b, 0);
    cr_expect_not(budget_ratio_allows(&b, l, 0), "1 retry per second over 1 s");
    cfg_unref(c);
}

/* ---- keys read only at start ---- */

static void add_path(const char *path, void *arg)
{
    char *buf = arg;
    size_t n = strlen(buf);
    snprintf(buf + n, 256 - n, "%s%s", n ? "," : "", path);
}

#define ONE_ROUTE "\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"]}]"

Test(config, restart_changes_name_the_changed_keys_read_only_at_start)
{
    struct cfg *start = cfgt_load_ok("{" ONE_ROUTE "}");
    char got[256] = "";
    cr_expect_eq(cfg_restart_changes(start, start, add_path, got), 0);
    cr_expect_str_eq(got, "");

    /* Keys read on reload change beside two read only at start, the default of one of which is
     * written out (not a change). */
    struct cfg *some =
        cfgt_load_ok("{\"listen\": \"127.0.0.1:1\", \"admin\": \"127.0.0.1:15000\","
                     " \"log\": {\"level\": \"debug\"}, \"drain_timeout_ms\": 1,"
                     " \"limits\": {\"max_header_bytes\": 16384,"
                     " \"max_upstream_requests\": 7, \"connection_timeout_ms\": 5,"
                     " \"header_timeout_ms\": 5, \"max_body_bytes\": 5,"
                     " \"max_buffered_body_bytes\": 5}, \"budget\": {\"window_ms\": 5},"
                     " \"routes\": [{\"name\": \"b\", \"upstreams\": [\"http://h:2\"]}]}");
    cr_expect_eq(cfg_restart_changes(start, some, add_path, got), 2);
    cr_expect_str_eq(got, "listen,limits.max_header_bytes");

    struct cfg *every =
        cfgt_load_ok("{\"listen\": \"127.0.0.1:1\", \"admin\": \"127.0.0.1:2\", \"limits\":"
                     " {\"max_connections\": 1, \"max_header_bytes\": 1024}, " ONE_ROUTE "}");
    got[0] = '\0';
    cr_expect_eq(cfg_restart_changes(start, every, add_path, got), 4);
    cr_expect_str_eq(got, "listen,admin,limits.max_connections,limits.max_header_bytes");
    got[0] = '\0';
    cr_expect_eq(cfg_restart_changes(every, start, add_path, got), 4, "either way round");
    cfg_unref(every);
    cfg_unref(some);
    cfg_unref(start);
}

Test(config, reference_says_when_a_change_takes_effect)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    cfg_write_reference(m);
    fclose(m);
    cr_expect(strstr(buf, "| key | type | default | takes effect | meaning |\n"));
    cr_expect(strstr(buf, "| `listen` | string | `\"127.0.0.1:15001\"` | at restart |"));
    cr_expect(strstr(buf, "| `limits.max_header_bytes` | integer 1024 to 65536 | `8192` | at "
                          "restart |"));
    cr_expect(strstr(buf, "| `limits.max_upstream_requests` | integer 1 to 1000000 | `1024` | on "
                          "reload |"));
    cr_expect(strstr(buf, "| `limits` | object |  |  |"), "an object's keys say it");
    free(buf);
}

Test(config, route_lookup_by_name)
{
    struct cfg *c = cfgt_load_ok("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"]},"
                                 " {\"name\": \"b\", \"upstreams\": [\"http://h:2\"]}]}");
    cr_expect_eq(cfg_route_by_name(c, "b"), &c->routes[1]);
    cr_expect_null(cfg_route_by_name(c, "c"));
    cfg_unref(c);
}

Test(config, snapshot_lives_until_last_reference)
{
    struct cfg *c =
        cfgt_load_ok("{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://h:1\"]}]}");
    struct cfg *held = cfg_ref(c);
    cr_expect_eq(held, c);
    cfg_unref(c);
    cr_expect_str_eq(held->routes[0].name, "a"); /* still valid: ASan would catch a free */
    cfg_unref(held);
    cfg_unref(NULL);
}

Test(config, reference_lists_every_key_with_its_default)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    cfg_write_reference(m);
    fclose(m);
    cr_expect(strstr(buf, "| `routes[].retry.backoff.base_ms` | integer 0 to 86400000 | `100` |"));
    cr_expect(strstr(buf, "| `budget.max_concurrent_retries` | integer 0 to 1000000000, or null "
                          "| `100` |"));
    cr_expect(strstr(buf, "| `routes[].name` | string | required |"));
    free(buf);
}
