/* fuzz_retry_on: parsing of retry.retry_on entries ("5xx", "429", "500-504", "gateway-error",
 * "connect-failure", "unavailable", "grpc:1-4", ...) through the config loader, against a
 * reference grammar.
 *
 * The parser is internal to config/schema_values.c, so each input becomes a small valid config
 * whose only variable part is the retry_on list. Input: one flag byte (bit 0: the list goes in
 * "defaults" and two routes inherit it, else it is the route's own), then the entries,
 * separated by '\n' (at most 24). Each entry's bytes become one JSON string: printable ASCII
 * as it is, every other byte b as the character U+00bb (a NUL as U+0100), so an entry may
 * hold control characters and non-ASCII text once decoded.
 *
 * Header conditions ("header:NAME", "header:NAME=VALUE") are in the grammar too.
 *
 * Checked: the config loads exactly when every entry is valid and none repeats an earlier one;
 * then each condition has the kind and status range the reference gives, its token as written,
 * in file order, in every route that has the list, and the effective config lists the same
 * tokens. Otherwise there is exactly one error per bad entry, at that entry's JSON path, with
 * a well-formed message, and no other error.
 *
 * Then retry_match() (proxy/core/decide.c, which links without libmicrohttpd and libcurl) must
 * pick, for every status from 100 to 599 and every other outcome, the first condition in file order
 * that names it, or none.
 */
/* fuzz-link: proxy/core/decide.c proxy/http/hlist.c proxy/core/live.c proxy/base/strmap.c */
#define FUZZ_NAME "fuzz_retry_on"
#include "tests/fuzz/fuzz.h"

#include <stdbool.h>
#include <string.h>

#include <jansson.h>

#include "config/cfg.h"
#include "config/errors.h"
#include "proxy/core/decide.h"

#define MAX_ENTRIES 24

struct entry {
    char *text; /* decoded (UTF-8), NUL-terminated */
    size_t len;
    bool valid;
    bool duplicate;
    enum cfg_retry_kind kind;
    int lo, hi;
    size_t name_len; /* CFG_RETRY_HEADER */
};

static int three_digits(const char *s, size_t n)
{
    if (n != 3)
        return -1;
    for (size_t i = 0; i < 3; i++)
        if (s[i] < '0' || s[i] > '9')
            return -1;
    return (s[0] - '0') * 100 + (s[1] - '0') * 10 + (s[2] - '0');
}

/* "header:NAME" or "header:NAME=VALUE": a NAME of 1 to 64 token characters, a VALUE without
 * control characters. */
static bool header_token(const struct entry *e, size_t *name_len)
{
    static const char tchar_punct[] = "!#$%&'*+-.^_`|~";
    if (e->len < 7 || memcmp(e->text, "header:", 7) != 0)
        return false;
    const char *name = e->text + 7, *eq = memchr(name, '=', e->len - 7);
    size_t nl = eq ? (size_t)(eq - name) : e->len - 7;
    if (nl < 1 || nl > 64)
        return false;
    for (size_t i = 0; i < nl; i++) {
        unsigned char c = (unsigned char)name[i];
        bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (!alnum && (c == 0 || !strchr(tchar_punct, c)))
            return false;
    }
    for (const char *p = eq ? eq + 1 : NULL; p && p < e->text + e->len; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return false;
    *name_len = nl;
    return true;
}

/* 1 to 3 digits -> their value; -1 otherwise. */
static int grpc_digits(const char *s, size_t n)
{
    if (n < 1 || n > 3)
        return -1;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* "grpc:N" or "grpc:N-M": gRPC statuses 1..999, not backwards. */
static bool grpc_token(struct entry *e)
{
    if (e->len < 5 || memcmp(e->text, "grpc:", 5) != 0)
        return false;
    const char *n = e->text + 5;
    size_t nl = e->len - 5;
    const char *dash = memchr(n, '-', nl);
    int lo = grpc_digits(n, dash ? (size_t)(dash - n) : nl);
    int hi = dash ? grpc_digits(dash + 1, nl - (size_t)(dash - n) - 1) : lo;
    if (lo < 1 || hi < 1 || lo > hi)
        return false;
    e->lo = lo;
    e->hi = hi;
    return true;
}

/* The reference grammar: a named condition, "NNN", or "NNN-NNN", statuses 100..599, ranges
 * not backwards, a header condition, or a gRPC status by name or number. */
static void classify(struct entry *e)
{
    static const struct {
        const char *name;
        enum cfg_retry_kind kind;
        int lo, hi;
    } named[] = {
        { "connect-failure", CFG_RETRY_CONNECT_FAILURE, 0, 0 },
        { "reset", CFG_RETRY_RESET, 0, 0 },
        { "timeout", CFG_RETRY_TIMEOUT, 0, 0 },
        { "5xx", CFG_RETRY_STATUS, 500, 599 },
        { "gateway-error", CFG_RETRY_STATUS, 502, 504 },
        { "cancelled", CFG_RETRY_GRPC, 1, 1 },
        { "deadline-exceeded", CFG_RETRY_GRPC, 4, 4 },
        { "resource-exhausted", CFG_RETRY_GRPC, 8, 8 },
        { "internal", CFG_RETRY_GRPC, 13, 13 },
        { "unavailable", CFG_RETRY_GRPC, 14, 14 },
    };
    e->valid = false;
    for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
        if (e->len == strlen(named[i].name) && memcmp(e->text, named[i].name, e->len) == 0) {
            e->valid = true;
            e->kind = named[i].kind;
            e->lo = named[i].lo;
            e->hi = named[i].hi;
            return;
        }
    }
    if (grpc_token(e)) {
        e->valid = true;
        e->kind = CFG_RETRY_GRPC;
        return;
    }
    size_t nl;
    if (header_token(e, &nl)) {
        e->valid = true;
        e->kind = CFG_RETRY_HEADER;
        e->name_len = nl;
        return;
    }
    int lo, hi;
    if (e->len == 3) {
        lo = hi = three_digits(e->text, 3);
    } else if (e->len == 7 && e->text[3] == '-') {
        lo = three_digits(e->text, 3);
        hi = three_digits(e->text + 4, 3);
    } else {
        return;
    }
    if (lo < 100 || lo > 599 || hi < 100 || hi > 599 || lo > hi)
        return;
    e->valid = true;
    e->kind = CFG_RETRY_STATUS;
    e->lo = lo;
    e->hi = hi;
}

/* Appends the JSON string for 'n' input bytes to 'out' and the decoded text to 'dec'. */
static void encode(const uint8_t *p, size_t n, char **out, char *dec, size_t *dlen)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = p[i];
        unsigned cp = b == 0 ? 0x100 : b;
        if (b >= 0x20 && b < 0x7f && b != '"' && b != '\\') {
            *(*out)++ = (char)b;
        } else {
            *out += sprintf(*out, "\\u%04x", cp);
        }
        if (cp < 0x80) {
            dec[k++] = (char)cp;
        } else {
            dec[k++] = (char)(0xc0 | (cp >> 6));
            dec[k++] = (char)(0x80 | (cp & 0x3f));
        }
    }
    dec[k] = '\0';
    *dlen = k;
}

static bool has_ctl(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return true;
    return false;
}

static void check_route(const struct cfg_route *r, const struct entry *e, size_t n)
{
    FUZZ_CHECK(r->retry.n_on == n, "route %s: %zu conditions, %zu entries", r->name, r->retry.n_on,
               n);
    for (size_t i = 0; i < n; i++) {
        const struct cfg_retry_cond *c = &r->retry.on[i];
        FUZZ_CHECK(c->token && strcmp(c->token, e[i].text) == 0,
                   "entry %zu: token \"%s\" for \"%s\"", i, c->token ? c->token : "(null)",
                   e[i].text);
        FUZZ_CHECK(c->kind == e[i].kind, "entry %zu \"%s\": kind %d, want %d", i, e[i].text,
                   (int)c->kind, (int)e[i].kind);
        if (c->kind == CFG_RETRY_HEADER) {
            const char *eq = e[i].text + 7 + e[i].name_len;
            FUZZ_CHECK(strlen(c->name) == e[i].name_len &&
                           memcmp(c->name, e[i].text + 7, e[i].name_len) == 0,
                       "entry %zu \"%s\": header name \"%s\"", i, e[i].text, c->name);
            FUZZ_CHECK(*eq ? c->value && strcmp(c->value, eq + 1) == 0 : c->value == NULL,
                       "entry %zu \"%s\": header value \"%s\"", i, e[i].text,
                       c->value ? c->value : "(none)");
        }
        if (c->kind == CFG_RETRY_STATUS || c->kind == CFG_RETRY_GRPC)
            FUZZ_CHECK(c->lo == e[i].lo && c->hi == e[i].hi, "entry %zu \"%s\": %u-%u, want %d-%d",
                       i, e[i].text, c->lo, c->hi, e[i].lo, e[i].hi);
    }
}

/* The reference for retry_match(): the first entry, in file order, of kind 'k' whose range
 * holds 'status' (a status condition) or of that kind alone. n: none. */
static size_t first_naming(const struct entry *e, size_t n, enum cfg_retry_kind k, int status)
{
    for (size_t i = 0; i < n; i++)
        if (e[i].kind == k && ((k != CFG_RETRY_STATUS && k != CFG_RETRY_GRPC) ||
                               (status >= e[i].lo && status <= e[i].hi)))
            return i;
    return n;
}

static void check_match(const struct cfg_route *r, const struct entry *e, size_t n)
{
    static const struct {
        enum retry_outcome o;
        enum cfg_retry_kind k;
    } other[] = { { RETRY_OUT_CONNECT_FAILURE, CFG_RETRY_CONNECT_FAILURE },
                  { RETRY_OUT_RESET, CFG_RETRY_RESET },
                  { RETRY_OUT_TIMEOUT, CFG_RETRY_TIMEOUT } };
    for (int status = 100; status <= 599; status++) {
        size_t want = first_naming(e, n, CFG_RETRY_STATUS, status);
        const struct cfg_retry_cond *got =
            retry_match(&r->retry, RETRY_OUT_STATUS, status, NULL, -1);
        FUZZ_CHECK(got == (want < n ? &r->retry.on[want] : NULL),
                   "status %d: retry_match gave condition %td, want %zu", status,
                   got ? got - r->retry.on : -1, want);
    }
    /* a gRPC status on a 200: only gRPC conditions (a status condition naming 200 comes
     * first when it is first in file order) */
    for (int grpc = 0; grpc <= 1000; grpc++) {
        size_t want = first_naming(e, n, CFG_RETRY_GRPC, grpc);
        size_t want200 = first_naming(e, n, CFG_RETRY_STATUS, 200);
        if (want200 < want)
            want = want200;
        const struct cfg_retry_cond *got =
            retry_match(&r->retry, RETRY_OUT_STATUS, 200, NULL, grpc);
        FUZZ_CHECK(got == (want < n ? &r->retry.on[want] : NULL),
                   "grpc-status %d: retry_match gave condition %td, want %zu", grpc,
                   got ? got - r->retry.on : -1, want);
    }
    for (size_t k = 0; k < sizeof(other) / sizeof(other[0]); k++) {
        size_t want = first_naming(e, n, other[k].k, 0);
        const struct cfg_retry_cond *got = retry_match(&r->retry, other[k].o, 0, NULL, -1);
        FUZZ_CHECK(got == (want < n ? &r->retry.on[want] : NULL),
                   "outcome %d: retry_match gave condition %td, want %zu", (int)other[k].o,
                   got ? got - r->retry.on : -1, want);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = { data, size };
    bool in_defaults = fuzz_byte(&in) & 1;

    struct entry e[MAX_ENTRIES];
    size_t n = 0;
    /* Each input byte takes at most 6 bytes of JSON and 2 decoded. */
    char *list = malloc(in.n * 6 + 4 * MAX_ENTRIES + 16), *o = list;
    FUZZ_CHECK(list != NULL, "out of memory");
    *o++ = '[';
    while (in.n > 0 && n < MAX_ENTRIES) {
        size_t k = 0;
        while (k < in.n && in.p[k] != '\n')
            k++;
        e[n].text = malloc(2 * k + 1);
        FUZZ_CHECK(e[n].text != NULL, "out of memory");
        if (n)
            *o++ = ',';
        *o++ = '"';
        encode(in.p, k, &o, e[n].text, &e[n].len);
        *o++ = '"';
        classify(&e[n]);
        n++;
        in.p += k < in.n ? k + 1 : k;
        in.n -= k < in.n ? k + 1 : k;
    }
    *o++ = ']';
    *o = '\0';

    /* A later valid entry equal to an earlier valid one is listed twice. */
    for (size_t i = 0; i < n; i++) {
        e[i].duplicate = false;
        for (size_t j = 0; j < i && e[i].valid; j++)
            if (e[j].valid && strcmp(e[j].text, e[i].text) == 0)
                e[i].duplicate = true;
    }

    size_t cap = strlen(list) + 512;
    char *doc = malloc(cap);
    FUZZ_CHECK(doc != NULL, "out of memory");
    const char *base;
    if (in_defaults) {
        snprintf(doc, cap,
                 "{\"defaults\": {\"retry\": {\"retry_on\": %s}},\n"
                 " \"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://127.0.0.1:9001\"]},\n"
                 "            {\"name\": \"b\", \"upstreams\": [\"http://127.0.0.1:9002\"]}]}\n",
                 list);
        base = "$.defaults.retry.retry_on";
    } else {
        snprintf(doc, cap,
                 "{\"routes\": [{\"name\": \"a\", \"upstreams\": [\"http://127.0.0.1:9001\"],\n"
                 "              \"retry\": {\"retry_on\": %s}}]}\n",
                 list);
        base = "$.routes[0].retry.retry_on";
    }

    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct cfg *c = cfg_load_buffer(doc, strlen(doc), "retry_on", &errs);

    bool all_good = true;
    for (size_t i = 0; i < n; i++)
        all_good &= e[i].valid && !e[i].duplicate;
    if (all_good) {
        if (!c)
            cfg_errs_print(stderr, "retry_on", &errs);
        FUZZ_CHECK(c != NULL, "a valid list refused: %s", list);
        for (size_t r = 0; r < c->n_routes; r++) {
            check_route(&c->routes[r], e, n);
            check_match(&c->routes[r], e, n);
        }
        json_t *dump = cfg_to_json(c);
        json_t *route0 = json_array_get(json_object_get(dump, "routes"), 0);
        json_t *on = json_object_get(json_object_get(route0, "retry"), "retry_on");
        FUZZ_CHECK(json_array_size(on) == n, "effective retry_on has %zu entries, want %zu",
                   json_array_size(on), n);
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(strcmp(json_string_value(json_array_get(on, i)), e[i].text) == 0,
                       "effective retry_on[%zu]", i);
        json_decref(dump);
        cfg_unref(c);
    } else {
        FUZZ_CHECK(c == NULL, "loaded although an entry is bad: %s", list);
        /* One error per bad entry, at its path, and nothing else. */
        size_t want = 0;
        for (size_t i = 0; i < n; i++)
            want += !e[i].valid || e[i].duplicate;
        if (errs.n != want)
            cfg_errs_print(stderr, "retry_on", &errs);
        FUZZ_CHECK(errs.n == want, "%zu errors for %zu bad entries: %s", errs.n, want, list);
        for (size_t i = 0, k = 0; i < n; i++) {
            if (e[i].valid && !e[i].duplicate)
                continue;
            char path[64];
            snprintf(path, sizeof(path), "%s[%zu]", base, i);
            const struct cfg_err *x = &errs.v[k++];
            FUZZ_CHECK(strcmp(x->path, path) == 0, "error at %s, want %s: %s", x->path, path,
                       x->msg);
            FUZZ_CHECK(x->line > 0, "error at %s has no position", x->path);
            FUZZ_CHECK(fuzz_utf8_ok(x->msg, strlen(x->msg)) && !has_ctl(x->msg),
                       "message not one line of UTF-8: %s", x->msg);
            size_t ml = strlen(x->msg);
            if (e[i].duplicate)
                FUZZ_CHECK(ml > 17 && strcmp(x->msg + ml - 17, "\" is listed twice") == 0, "%s: %s",
                           x->path, x->msg);
            else
                FUZZ_CHECK(strncmp(x->msg, "unknown retry_on condition \"", 28) == 0 ||
                               strncmp(x->msg, "status ", 7) == 0 ||
                               strncmp(x->msg, "range \"", 7) == 0 ||
                               strncmp(x->msg, "retry_on \"header:", 17) == 0 ||
                               strncmp(x->msg, "retry_on \"grpc:", 15) == 0,
                           "%s: %s", x->path, x->msg);
        }
    }
    cfg_errs_clear(&errs);
    for (size_t i = 0; i < n; i++)
        free(e[i].text);
    free(doc);
    free(list);
    return 0;
}
