/* fuzz_config: the config loader (config/cfg.h) fed arbitrary bytes as the config file.
 *
 * The input is the whole file, loaded in memory through cfg_load_buffer(). Checked:
 *  - a snapshot comes back exactly when no error was reported;
 *  - every error is well formed: a JSON path from "$", a position inside the file (or none),
 *    a non-empty message of valid UTF-8 without control characters, the list sorted by
 *    position and without duplicates; printing it gives one line per error (plus one for
 *    dropped errors), with and without the file name;
 *  - a loaded snapshot is consistent (route names unique and found by cfg_route_by_name,
 *    retry_on ranges inside 100..599, attempts and lists non-empty), and its effective config
 *    (cfg_to_json) loads again into a snapshot whose effective config is the same;
 *  - the position scanner (config/jsonpos.h) and jansson agree: what the scanner accepts,
 *    jansson loads, and what jansson loads the scanner accepts unless it nests too deep (or
 *    holds a NUL byte, which jansson lets pass after a number);
 *  - for one input in eight, one of jansson's allocations fails (which one depends on the
 *    input; see lexer_growth for those that never do): the load must then be refused, and
 *    nothing may leak.
 */
#define FUZZ_NAME "fuzz_config"
#include "tests/fuzz/fuzz.h"

#include <stdbool.h>
#include <string.h>

#include <jansson.h>

#include "config/cfg.h"
#include "config/errors.h"
#include "config/jsonpos.h"

/* ---- a jansson allocator that fails once, on request ---- */

static long fail_at = -1; /* the allocation number that fails; -1: none */
static long alloc_count;
static bool alloc_failed;

/* jansson 2.14's lexer ignores a failure to grow the buffer it saves a token's text in (from
 * 16 bytes, doubling) and goes on with the text cut short, up to an assert(0) in
 * lex_scan_string or a read past the text: a failure there tests jansson, not the loader, so
 * allocations of 32, 64, 128... bytes never fail. */
static bool lexer_growth(size_t n)
{
    return n >= 32 && (n & (n - 1)) == 0;
}

static void *failing_malloc(size_t n)
{
    if (lexer_growth(n))
        return malloc(n);
    if (alloc_count++ == fail_at) {
        alloc_failed = true;
        return NULL;
    }
    return malloc(n);
}

static uint32_t hash(const uint8_t *d, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ d[i]) * 16777619u;
    return h;
}

/* ---- checks ---- */

static bool has_ctl(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return true;
    return false;
}

/* Bytes in line 'line' (1-based) of the text, or SIZE_MAX when there is no such line. */
static size_t line_bytes(const uint8_t *d, size_t n, uint32_t line)
{
    uint32_t l = 1;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || d[i] == '\n') {
            if (l == line)
                return i - start;
            l++;
            start = i + 1;
        }
    }
    return SIZE_MAX;
}

static void check_errs(const struct cfg_errs *e, const uint8_t *d, size_t n)
{
    FUZZ_CHECK(e->n <= CFG_ERRS_MAX, "%zu errors kept", e->n);
    FUZZ_CHECK(e->dropped == 0 || e->n == CFG_ERRS_MAX, "errors dropped before the list was full");
    for (size_t i = 0; i < e->n; i++) {
        const struct cfg_err *x = &e->v[i];
        FUZZ_CHECK(x->path && x->path[0] == '$', "error %zu: path \"%s\"", i, x->path);
        FUZZ_CHECK(x->msg && x->msg[0], "error %zu at %s: empty message", i, x->path);
        FUZZ_CHECK(fuzz_utf8_ok(x->path, strlen(x->path)), "error %zu: path is not UTF-8: %s", i,
                   x->path);
        FUZZ_CHECK(fuzz_utf8_ok(x->msg, strlen(x->msg)),
                   "error %zu at %s: message is not UTF-8 (jansson refuses it in /config and "
                   "POST /reload answers): %s",
                   i, x->path, x->msg);
        FUZZ_CHECK(!has_ctl(x->path), "error %zu: control character in path %s", i, x->path);
        FUZZ_CHECK(!has_ctl(x->msg),
                   "error %zu at %s: control character in the message, which breaks "
                   "one-line-per-error output: %s",
                   i, x->path, x->msg);
        FUZZ_CHECK((x->line == 0) == (x->col == 0), "error %zu: line %u col %u", i, x->line,
                   x->col);
        if (x->line) {
            size_t lb = line_bytes(d, n, x->line);
            FUZZ_CHECK(lb != SIZE_MAX && x->col <= lb + 1,
                       "error %zu at %u:%u lies outside the file (%s: %s)", i, x->line, x->col,
                       x->path, x->msg);
        }
        if (i > 0) {
            const struct cfg_err *p = &e->v[i - 1];
            FUZZ_CHECK(p->line < x->line || (p->line == x->line && p->col <= x->col),
                       "errors not sorted: %u:%u before %u:%u", p->line, p->col, x->line, x->col);
            for (size_t j = 0; j < i; j++)
                FUZZ_CHECK(!(e->v[j].line == x->line && e->v[j].col == x->col &&
                             strcmp(e->v[j].path, x->path) == 0 &&
                             strcmp(e->v[j].msg, x->msg) == 0),
                           "error %zu listed twice: %s: %s", i, x->path, x->msg);
        }
    }
    /* The printed form: one line per error, plus one for the dropped ones. */
    for (int with_file = 0; with_file < 2; with_file++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&buf, &len);
        FUZZ_CHECK(m != NULL, "open_memstream");
        cfg_errs_print(m, with_file ? "fuzz.json" : NULL, e);
        fclose(m);
        size_t lines = 0;
        for (size_t i = 0; i < len; i++)
            lines += buf[i] == '\n';
        FUZZ_CHECK(lines == e->n + (e->dropped > 0), "%zu errors printed as %zu lines:\n%s", e->n,
                   lines, buf);
        FUZZ_CHECK(len == 0 || buf[len - 1] == '\n', "output does not end a line");
        free(buf);
    }
}

static void check_snapshot(const struct cfg *c)
{
    FUZZ_CHECK(c->n_routes > 0 && c->routes, "a snapshot without routes");
    for (size_t i = 0; i < c->n_routes; i++) {
        const struct cfg_route *r = &c->routes[i];
        FUZZ_CHECK(r->name && r->name[0], "route %zu has no name", i);
        FUZZ_CHECK(cfg_route_by_name(c, r->name) == r, "route \"%s\" is not unique", r->name);
        FUZZ_CHECK(r->n_upstreams > 0, "route \"%s\" has no upstream", r->name);
        for (size_t u = 0; u < r->n_upstreams; u++)
            FUZZ_CHECK(r->upstreams[u].url && r->upstreams[u].origin && r->upstreams[u].authority &&
                           r->upstreams[u].base_path,
                       "route \"%s\": upstream %zu incomplete", r->name, u);
        if (r->match_host)
            for (const char *p = r->match_host; *p; p++)
                FUZZ_CHECK(!(*p >= 'A' && *p <= 'Z'), "match_host \"%s\" not lowercase",
                           r->match_host);
        FUZZ_CHECK(r->match_path_prefix && r->match_path_prefix[0] == '/', "path prefix");
        FUZZ_CHECK(r->retry.max_attempts >= 1, "route \"%s\": max_attempts 0", r->name);
        FUZZ_CHECK(r->timeout_ms > 0, "route \"%s\": timeout 0", r->name);
        for (size_t k = 0; k < r->retry.n_on; k++) {
            const struct cfg_retry_cond *cond = &r->retry.on[k];
            FUZZ_CHECK(cond->token && cond->token[0], "route \"%s\": retry_on %zu", r->name, k);
            if (cond->kind == CFG_RETRY_STATUS)
                FUZZ_CHECK(cond->lo >= 100 && cond->lo <= cond->hi && cond->hi <= 599,
                           "route \"%s\": retry_on \"%s\" is %u-%u", r->name, cond->token, cond->lo,
                           cond->hi);
        }
    }
    FUZZ_CHECK(cfg_route_by_name(c, "") == NULL, "a route without a name");
}

/* The effective config loads again, to the same effective config. */
static void check_round_trip(struct cfg *c)
{
    json_t *dump = cfg_to_json(c);
    FUZZ_CHECK(dump != NULL, "cfg_to_json failed");
    char *text = json_dumps(dump, JSON_INDENT(1));
    FUZZ_CHECK(text != NULL, "the effective config cannot be written as JSON");
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct cfg *again = cfg_load_buffer(text, strlen(text), "again", &errs);
    if (!again) {
        cfg_errs_print(stderr, "effective", &errs);
        FUZZ_CHECK(again != NULL, "the effective config does not load:\n%s", text);
    }
    json_t *dump2 = cfg_to_json(again);
    if (!json_equal(dump, dump2)) {
        char *t2 = json_dumps(dump2, JSON_INDENT(1));
        FUZZ_CHECK(false, "the effective config changed on reloading:\n%s\n---\n%s", text, t2);
    }
    json_decref(dump2);
    /* References: one more and one less leaves the snapshot alive. */
    cfg_unref(cfg_ref(again));
    cfg_unref(again);
    json_decref(dump);
    free(text);
}

/* The scanner against jansson, on their own. Returns whether the document is well-formed
 * JSON and, if so, sets *root_is_object. */
static bool check_scanner(const uint8_t *d, size_t n, bool *root_is_object)
{
    char *copy = malloc(n + 1);
    FUZZ_CHECK(copy != NULL, "out of memory");
    memcpy(copy, d, n);
    copy[n] = '\0';
    struct jpos pos = { 0 };
    struct cfg_errs errs;
    cfg_errs_init(&errs);
    int rc = jpos_scan(&pos, copy, n, &errs);
    FUZZ_CHECK(rc == 0 || rc == -1, "jpos_scan rc %d", rc);
    /* A syntax error is the last error found (duplicate keys and numbers out of range before
     * it are reported too), unless the list was full by then and it was only counted. */
    const struct cfg_err *last = errs.n ? &errs.v[errs.n - 1] : NULL;
    FUZZ_CHECK(rc == 0 || errs.dropped > 0 ||
                   (last && (strncmp(last->msg, "syntax error: ", 14) == 0 ||
                             strncmp(last->msg, "the file is empty", 17) == 0)),
               "jpos_scan failed without a syntax error: %s", last ? last->msg : "(none)");
    json_error_t jerr;
    if (rc == 0) {
        json_t *j = json_loadb(copy, n, JSON_DECODE_ANY, &jerr);
        FUZZ_CHECK(j != NULL, "the scanner accepted what jansson refuses: %s (%d:%d)", jerr.text,
                   jerr.line, jerr.column);
        FUZZ_CHECK(jpos_find(&pos, "$") != NULL, "no entry for the root");
        *root_is_object = json_is_object(j);
        json_decref(j);
    } else {
        /* jansson 2.14 lets a NUL byte after a number pass ("[1\0]" loads as [1]); the
         * scanner rightly refuses it, so documents with a NUL are left out here. */
        json_t *j =
            memchr(d, '\0', n) ? NULL : json_loadb((const char *)d, n, JSON_DECODE_ANY, &jerr);
        if (j) {
            FUZZ_CHECK(strstr(last->msg, "levels deep") != NULL,
                       "jansson loads what the scanner refuses: %u:%u %s", last->line, last->col,
                       last->msg);
            json_decref(j);
        }
    }
    check_errs(&errs, d, n);
    cfg_errs_clear(&errs);
    jpos_free(&pos);
    free(copy);
    return rc == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t h = hash(data, size);
    bool failing = (h & 7) == 0;
    fail_at = failing ? (long)((h >> 3) % 256) : -1;
    alloc_count = 0;
    alloc_failed = false;
    cfg_set_json_malloc(failing_malloc);

    struct cfg_errs errs;
    cfg_errs_init(&errs);
    struct cfg *c = cfg_load_buffer((const char *)data, size, "fuzz.json", &errs);
    cfg_set_json_malloc(NULL);
    fail_at = -1;

    FUZZ_CHECK((c != NULL) == (errs.n + errs.dropped == 0),
               "snapshot %p with %zu errors and %zu dropped", (void *)c, errs.n, errs.dropped);
    if (alloc_failed)
        FUZZ_CHECK(c == NULL, "loaded although jansson allocation %ld failed", alloc_count);
    check_errs(&errs, data, size);

    if (c) {
        FUZZ_CHECK(strcmp(c->source, "fuzz.json") == 0, "source \"%s\"", c->source);
        check_snapshot(c);
        check_round_trip(c);
        cfg_unref(c);
    }

    /* Without a failing allocation, the scanner is checked against jansson, and a well-formed
     * document whose root is not an object gets the loader's own message for it. */
    bool root_is_object = false;
    if (!failing && check_scanner(data, size, &root_is_object) && !root_is_object) {
        bool said = false;
        for (size_t i = 0; i < errs.n; i++)
            said |= strcmp(errs.v[i].path, "$") == 0 &&
                    strncmp(errs.v[i].msg, "expected a JSON object", 22) == 0;
        FUZZ_CHECK(said, "a root that is not an object: first error %s: %s",
                   errs.n ? errs.v[0].path : "", errs.n ? errs.v[0].msg : "(none)");
    }
    cfg_errs_clear(&errs);
    return 0;
}
