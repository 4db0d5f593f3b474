#include "config/jsonpos.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "config/strhash.h"
#include "config/utf8.h"

#define NO_PARENT SIZE_MAX

struct sbuf {
    char *p;
    size_t n, cap;
};

struct scan {
    char *s;
    size_t len, i;
    uint32_t line, col;
    struct jpos *p;
    struct cfg_errs *errs;
};

static void *xrealloc(void *p, size_t size)
{
    void *q = realloc(p, size);
    if (!q) {
        fputs("retryproxy: out of memory\n", stderr);
        abort();
    }
    return q;
}

static void sbuf_put(struct sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        b->p = xrealloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* ---- paths ---- */

static int is_ident(const char *k, size_t len)
{
    if (len == 0 || !((k[0] >= 'a' && k[0] <= 'z') || (k[0] >= 'A' && k[0] <= 'Z') || k[0] == '_'))
        return 0;
    for (size_t i = 1; i < len; i++) {
        char c = k[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_'))
            return 0;
    }
    return 1;
}

char *jpos_path_key(struct arena *a, const char *parent, const char *key, size_t len)
{
    if (is_ident(key, len))
        return arena_printf(a, "%s.%.*s", parent, (int)len, key);

    struct sbuf b = { 0 };
    sbuf_put(&b, parent, strlen(parent));
    sbuf_put(&b, "[\"", 2);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)key[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            sbuf_put(&b, esc, 2);
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            sbuf_put(&b, esc, 6);
        } else {
            sbuf_put(&b, (const char *)&key[i], 1);
        }
    }
    sbuf_put(&b, "\"]", 2);
    char *path = arena_strndup(a, b.p, b.n);
    free(b.p);
    return path;
}

char *jpos_path_index(struct arena *a, const char *parent, size_t index)
{
    return arena_printf(a, "%s[%zu]", parent, index);
}

/* ---- the path table ---- */

static size_t *slot_for(const struct jpos *p, const char *path)
{
    size_t mask = p->nslots - 1;
    for (size_t i = (size_t)str_hash(path) & mask;; i = (i + 1) & mask) {
        size_t *slot = &p->slots[i];
        if (*slot == 0 || strcmp(p->v[*slot - 1].path, path) == 0)
            return slot;
    }
}

static void table_grow(struct jpos *p)
{
    size_t old_n = p->nslots;
    size_t *old = p->slots;
    p->nslots = old_n ? old_n * 2 : 64;
    p->slots = calloc(p->nslots, sizeof(*p->slots));
    if (!p->slots) {
        fputs("retryproxy: out of memory\n", stderr);
        abort();
    }
    for (size_t i = 0; i < old_n; i++)
        if (old[i])
            *slot_for(p, p->v[old[i] - 1].path) = old[i];
    free(old);
}

const struct jpos_entry *jpos_find(const struct jpos *p, const char *path)
{
    if (p->nslots == 0)
        return NULL;
    size_t idx = *slot_for(p, path);
    return idx ? &p->v[idx - 1] : NULL;
}

/* Records a value; a later value under the same path replaces the earlier in the table. */
static size_t add_entry(struct scan *sc, const char *path, uint32_t kline, uint32_t kcol)
{
    struct jpos *p = sc->p;
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 64;
        p->v = xrealloc(p->v, p->cap * sizeof(*p->v));
    }
    if ((p->n + 1) * 2 > p->nslots)
        table_grow(p);
    size_t idx = p->n++;
    p->v[idx] = (struct jpos_entry){ path, sc->line, sc->col, kline, kcol, false };
    *slot_for(p, path) = idx + 1;
    return idx;
}

void jpos_free(struct jpos *p)
{
    if (!p)
        return;
    arena_free(&p->arena);
    free(p->v);
    free(p->slots);
    memset(p, 0, sizeof(*p));
}

/* ---- the scanner ---- */

static int peek(const struct scan *sc)
{
    return sc->i < sc->len ? (unsigned char)sc->s[sc->i] : -1;
}

/* Columns count characters, not bytes: UTF-8 continuation bytes do not advance them. */
static void adv(struct scan *sc)
{
    unsigned char c = (unsigned char)sc->s[sc->i++];
    if (c == '\n') {
        sc->line++;
        sc->col = 1;
    } else if ((c & 0xc0) != 0x80) {
        sc->col++;
    }
}

static void skip_ws(struct scan *sc)
{
    for (int c = peek(sc); c == ' ' || c == '\t' || c == '\n' || c == '\r'; c = peek(sc))
        adv(sc);
}

static int syntax(struct scan *sc, const char *path, const char *what)
{
    int c = peek(sc);
    if (c < 0)
        cfg_errs_add(sc->errs, path, sc->line, sc->col, "syntax error: %s, found end of file",
                     what);
    else if (c >= 0x20 && c < 0x7f)
        cfg_errs_add(sc->errs, path, sc->line, sc->col, "syntax error: %s, found '%c'", what, c);
    else
        cfg_errs_add(sc->errs, path, sc->line, sc->col, "syntax error: %s, found byte 0x%02x", what,
                     c);
    return -1;
}

/* A problem that names its own cause (inside a string, a trailing comma), reported at
 * 'line':'col' without the "found" part. */
static int syntax_at(struct scan *sc, const char *path, uint32_t line, uint32_t col,
                     const char *what)
{
    cfg_errs_add(sc->errs, path, line, col, "syntax error: %s", what);
    return -1;
}

static int read_hex4(struct scan *sc, const char *path, unsigned *out)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        int h = utf8_hex_digit(peek(sc));
        if (h < 0)
            return syntax(sc, path, "invalid \\u escape: expected 4 hex digits");
        v = v * 16 + (unsigned)h;
        adv(sc);
    }
    *out = v;
    return 0;
}

static size_t utf8_encode(unsigned cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* At the opening quote. Appends the decoded string to 'out' when it is not NULL. */
static int scan_string(struct scan *sc, const char *path, struct sbuf *out)
{
    adv(sc);
    for (;;) {
        int c = peek(sc);
        uint32_t line = sc->line, col = sc->col;
        if (c < 0)
            return syntax(sc, path, "unterminated string");
        if (c == '"') {
            adv(sc);
            return 0;
        }
        if (c == '\n')
            return syntax_at(sc, path, line, col,
                             "line break inside a string (a missing closing quote?)");
        if (c < 0x20)
            return syntax_at(sc, path, line, col, "control character in a string (escape it)");
        if (c == '\\') {
            adv(sc);
            int e = peek(sc);
            char ch = 0;
            switch (e) {
            case '"':
            case '\\':
            case '/':
                ch = (char)e;
                break;
            case 'b':
                ch = '\b';
                break;
            case 'f':
                ch = '\f';
                break;
            case 'n':
                ch = '\n';
                break;
            case 'r':
                ch = '\r';
                break;
            case 't':
                ch = '\t';
                break;
            case 'u': {
                adv(sc);
                unsigned cp, lo;
                if (read_hex4(sc, path, &cp) < 0)
                    return -1;
                if (cp >= 0xdc00 && cp <= 0xdfff)
                    return syntax_at(sc, path, line, col, "\\u escape of a lone low surrogate");
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    if (peek(sc) != '\\')
                        return syntax_at(sc, path, line, col,
                                         "\\u escape of a lone high surrogate");
                    adv(sc);
                    if (peek(sc) != 'u')
                        return syntax_at(sc, path, line, col,
                                         "\\u escape of a lone high surrogate");
                    adv(sc);
                    if (read_hex4(sc, path, &lo) < 0)
                        return -1;
                    if (lo < 0xdc00 || lo > 0xdfff)
                        return syntax_at(sc, path, line, col,
                                         "\\u escape of a lone high surrogate");
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                }
                if (cp == 0)
                    return syntax_at(sc, path, line, col, "\\u0000 is not allowed in strings");
                if (out) {
                    char u[4];
                    sbuf_put(out, u, utf8_encode(cp, u));
                }
                continue;
            }
            default:
                return syntax_at(sc, path, line, col, "invalid escape in a string");
            }
            adv(sc);
            if (out)
                sbuf_put(out, &ch, 1);
            continue;
        }
        size_t n = utf8_len((const unsigned char *)sc->s + sc->i, sc->len - sc->i);
        if (n == 0)
            return syntax(sc, path, "invalid UTF-8 in a string");
        if (out)
            sbuf_put(out, sc->s + sc->i, n);
        for (size_t k = 0; k < n; k++)
            adv(sc);
    }
}

static int is_digit(int c)
{
    return c >= '0' && c <= '9';
}

/* A number or literal must end at a delimiter: "01", "1x" and "truex" are single bad tokens. */
static int ends_token(const struct scan *sc)
{
    int c = peek(sc);
    return c < 0 || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == ']' ||
           c == '}' || c == ':';
}

static int scan_number(struct scan *sc, const char *path, size_t self)
{
    size_t start = sc->i;
    uint32_t line = sc->line, col = sc->col;
    int real = 0;

    if (peek(sc) == '-')
        adv(sc);
    if (peek(sc) == '0') {
        adv(sc);
    } else if (is_digit(peek(sc))) {
        while (is_digit(peek(sc)))
            adv(sc);
    } else {
        return syntax(sc, path, "invalid number");
    }
    if (peek(sc) == '.') {
        real = 1;
        adv(sc);
        if (!is_digit(peek(sc)))
            return syntax(sc, path, "invalid number: expected a digit after '.'");
        while (is_digit(peek(sc)))
            adv(sc);
    }
    if (peek(sc) == 'e' || peek(sc) == 'E') {
        real = 1;
        adv(sc);
        if (peek(sc) == '+' || peek(sc) == '-')
            adv(sc);
        if (!is_digit(peek(sc)))
            return syntax(sc, path, "invalid number: expected a digit in the exponent");
        while (is_digit(peek(sc)))
            adv(sc);
    }
    if (!ends_token(sc))
        return syntax(sc, path, "invalid number");

    /* The same conversions jansson makes, so that exactly what it would refuse is caught. */
    size_t len = sc->i - start;
    char *copy = malloc(len + 1);
    if (!copy) {
        fputs("retryproxy: out of memory\n", stderr);
        abort();
    }
    memcpy(copy, sc->s + start, len);
    copy[len] = '\0';
    int overflow;
    errno = 0;
    if (real) {
        double d = strtod(copy, NULL);
        overflow = errno == ERANGE && d != 0;
    } else {
        (void)strtoll(copy, NULL, 10);
        overflow = errno == ERANGE;
    }
    free(copy);
    if (overflow) {
        cfg_errs_add(sc->errs, path, line, col, "number %.*s%s is out of range",
                     len > 40 ? 40 : (int)len, sc->s + start, len > 40 ? "..." : "");
        memcpy(sc->s + start, "null", 4);
        memset(sc->s + start + 4, ' ', len - 4); /* every overflowing literal is >= 5 bytes */
        sc->p->v[self].bad = true;
    }
    return 0;
}

static int scan_literal(struct scan *sc, const char *path, const char *word)
{
    size_t n = strlen(word);
    if (sc->len - sc->i < n || memcmp(sc->s + sc->i, word, n) != 0)
        return syntax(sc, path, "expected a value");
    for (size_t k = 0; k < n; k++)
        adv(sc);
    if (!ends_token(sc))
        return syntax(sc, path, "invalid literal");
    return 0;
}

static int scan_value(struct scan *sc, const char *path, uint32_t kline, uint32_t kcol, int depth);

/* After a member or an element: 1 past a ',' (another one follows), 0 past 'close' (the
 * object or array ends), -1 after reporting anything else. */
static int next_or_close(struct scan *sc, const char *path, char close)
{
    skip_ws(sc);
    if (peek(sc) == ',') {
        adv(sc);
        return 1;
    }
    if (peek(sc) == close) {
        adv(sc);
        return 0;
    }
    return syntax(sc, path, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
}

static int scan_object(struct scan *sc, const char *path, size_t self, int depth)
{
    struct sbuf key = { 0 };
    int rc = -1;

    adv(sc);
    skip_ws(sc);
    if (peek(sc) == '}') {
        adv(sc);
        rc = 0;
        goto out;
    }
    for (int first = 1;; first = 0) {
        skip_ws(sc);
        if (peek(sc) != '"') {
            if (!first && peek(sc) == '}')
                syntax_at(sc, path, sc->line, sc->col, "trailing comma before '}'");
            else
                syntax(sc, path, "expected a string key");
            goto out;
        }
        uint32_t kline = sc->line, kcol = sc->col;
        key.n = 0;
        if (scan_string(sc, path, &key) < 0)
            goto out;
        char *member = jpos_path_key(&sc->p->arena, path, key.p ? key.p : "", key.n);
        skip_ws(sc);
        if (peek(sc) != ':') {
            syntax(sc, member, "expected ':' after the key");
            goto out;
        }
        adv(sc);

        /* A duplicate is an earlier member of this same object; a path seen under another
         * object (a duplicated parent) is not. Member entries are added after their parent's,
         * so an index above 'self' with the same path is one of ours. */
        const struct jpos_entry *prev = jpos_find(sc->p, member);
        if (prev && (size_t)(prev - sc->p->v) > self)
            cfg_errs_add(sc->errs, member, kline, kcol,
                         "duplicate key (first defined at line %u, column %u)", prev->key_line,
                         prev->key_col);
        if (scan_value(sc, member, kline, kcol, depth + 1) < 0)
            goto out;
        int more = next_or_close(sc, path, '}');
        if (more <= 0) {
            rc = more;
            goto out;
        }
    }
out:
    free(key.p);
    return rc;
}

static int scan_array(struct scan *sc, const char *path, int depth)
{
    adv(sc);
    skip_ws(sc);
    if (peek(sc) == ']') {
        adv(sc);
        return 0;
    }
    for (size_t i = 0;; i++) {
        char *elem = jpos_path_index(&sc->p->arena, path, i);
        skip_ws(sc);
        if (i > 0 && peek(sc) == ']')
            return syntax_at(sc, path, sc->line, sc->col, "trailing comma before ']'");
        if (scan_value(sc, elem, 0, 0, depth + 1) < 0)
            return -1;
        int more = next_or_close(sc, path, ']');
        if (more <= 0)
            return more;
    }
}

static int scan_value(struct scan *sc, const char *path, uint32_t kline, uint32_t kcol, int depth)
{
    skip_ws(sc);
    if (depth > JPOS_MAX_DEPTH)
        return syntax(sc, path, "nested more than 64 levels deep");
    int c = peek(sc);
    if (c < 0)
        return syntax(sc, path, "expected a value");
    size_t self = add_entry(sc, path, kline, kcol);
    switch (c) {
    case '{':
        return scan_object(sc, path, self, depth);
    case '[':
        return scan_array(sc, path, depth);
    case '"':
        return scan_string(sc, path, NULL);
    case 't':
        return scan_literal(sc, path, "true");
    case 'f':
        return scan_literal(sc, path, "false");
    case 'n':
        return scan_literal(sc, path, "null");
    default:
        if (c == '-' || is_digit(c))
            return scan_number(sc, path, self);
        return syntax(sc, path, "expected a value");
    }
}

int jpos_scan(struct jpos *p, char *text, size_t len, struct cfg_errs *errs)
{
    struct scan sc = { .s = text, .len = len, .line = 1, .col = 1, .p = p, .errs = errs };

    skip_ws(&sc);
    if (sc.i == len) {
        cfg_errs_add(errs, "$", 1, 1, "the file is empty: expected a JSON object");
        return -1;
    }
    if (scan_value(&sc, "$", 0, 0, 0) < 0)
        return -1;
    skip_ws(&sc);
    if (sc.i != len)
        return syntax(&sc, "$", "expected the end of the document");
    return 0;
}
