#include "proxy/http1/wire.h"

#include "proxy/http1/wire_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The stand-in for a refused head: a request libmicrohttpd parses without complaint. The
 * access handler knows it by its position (wire_take_reject), never by its bytes, so a client
 * sending the same bytes gets no special treatment. */
const char wire_standin[] = "GET / HTTP/1.1\r\nHost: -\r\n\r\n";
const size_t wire_standin_len = sizeof(wire_standin) - 1;

/* A chunk-size line (with extensions) and a trailer section are bounded too. */
#define CHUNK_LINE_MAX 4096
#define TRAILER_MAX    (8 * 1024)

enum st {
    S_START, /* before a head, or inside its leading empty lines */
    S_LEAD_CR,
    S_METHOD,
    S_TARGET0,
    S_TARGET,
    S_VERSION,
    S_RL_CR,
    S_FIELD_START,
    S_NAME,
    S_VALUE,
    S_VALUE_CR,
    S_END_CR, /* last head state */
    S_BODY,   /* Content-Length body */
    S_CHUNK_SIZE,
    S_CHUNK_EXT,
    S_CHUNK_SIZE_CR,
    S_CHUNK_DATA,
    S_CHUNK_DATA_CR,
    S_CHUNK_DATA_LF,
    S_TRAILER_START,
    S_TRAILER_NAME,
    S_TRAILER_VALUE,
    S_TRAILER_VALUE_CR,
    S_TRAILER_END_CR,
};

/* Which framing field the current line is. */
enum field { F_OTHER, F_CL, F_TE, F_HOST };

/* Head facts (w->flags). */
#define FL_VAL_OVERFLOW 0x01 /* the framing value did not fit w->val */
#define FL_TE_BAD       0x02 /* a Transfer-Encoding element is not a token */

void wire_init(struct wire *w, uint32_t head_timeout_ms, uint32_t head_max)
{
    memset(w, 0, sizeof(*w));
    w->head_timeout_ms = head_timeout_ms;
    w->head_max = head_max;
}

void wire_release(struct wire *w)
{
    free(w->stash);
    free(w->q);
    w->stash = w->q = NULL;
    w->stash_len = w->q_len = w->q_off = 0;
}

/* Byte classes: what may stand in a name, a value, a target. */
#define C_TARGET 1 /* VCHAR or obs-text */
#define C_VALUE  2 /* HTAB, SP, VCHAR or obs-text */
#define C_TCHAR  4 /* RFC 9110 tchar */
#define C_TV     (C_TARGET | C_VALUE)
#define C_TVT    (C_TARGET | C_VALUE | C_TCHAR)
static const uint8_t byte_class[256] = {
    ['\t'] = C_VALUE,       [' '] = C_VALUE,      ['!'] = C_TVT,         ['"'] = C_TV,
    ['#' ... '\''] = C_TVT, ['(' ... ')'] = C_TV, ['*' ... '+'] = C_TVT, [','] = C_TV,
    ['-' ... '.'] = C_TVT,  ['/'] = C_TV,         ['0' ... '9'] = C_TVT, [':' ... '@'] = C_TV,
    ['A' ... 'Z'] = C_TVT,  ['[' ... ']'] = C_TV, ['^' ... 'z'] = C_TVT, ['{'] = C_TV,
    ['|'] = C_TVT,          ['}'] = C_TV,         ['~'] = C_TVT,         [0x80 ... 0xff] = C_TV,
};

/* RFC 9110 tchar. */
static bool is_tchar(unsigned char c)
{
    return byte_class[c] & C_TCHAR;
}

/* A byte of a field value (or a chunk extension): HTAB, SP, VCHAR, obs-text. */
static bool is_value_byte(unsigned char c)
{
    return byte_class[c] & C_VALUE;
}

/* A byte of a request target: VCHAR or obs-text, never a control byte or space. */
static bool is_target_byte(unsigned char c)
{
    return byte_class[c] & C_TARGET;
}

static char lower(unsigned char c)
{
    return (char)(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
}

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

static bool lower_eq(const char *a, size_t n, const char *lit)
{
    return strlen(lit) == n && memcmp(a, lit, n) == 0;
}

/* The value of a framing field without its surrounding whitespace. */
static const char *trimmed(struct wire *w, size_t *n)
{
    const char *s = w->val, *e = w->val + w->vlen;
    while (s < e && (*s == ' ' || *s == '\t'))
        s++;
    while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
    *n = (size_t)(e - s);
    return s;
}

/* A field line ended: checks the framing fields. */
static enum refusal end_field(struct wire *w)
{
    size_t n;
    const char *v;
    switch ((enum field)w->field) {
    case F_CL: {
        w->n_cl++;
        v = w->val;
        n = w->vlen;
        while (n && (*v == ' ' || *v == '\t')) {
            v++;
            n--;
        }
        /* Digits only: libmicrohttpd reads the value with its trailing whitespace, so "5 "
         * would not mean 5 to it; no sign, no list, at most 18 digits. */
        if ((w->flags & FL_VAL_OVERFLOW) || n == 0 || n > 18)
            return REFUSE_BAD_CONTENT_LENGTH;
        uint64_t cl = 0;
        for (size_t i = 0; i < n; i++) {
            if (v[i] < '0' || v[i] > '9')
                return REFUSE_BAD_CONTENT_LENGTH;
            cl = cl * 10 + (uint64_t)(v[i] - '0');
        }
        w->cl = cl;
        break;
    }
    case F_TE: {
        w->n_te_fields++;
        if (w->flags & FL_VAL_OVERFLOW) {
            w->flags |= FL_TE_BAD;
            break;
        }
        /* libmicrohttpd compares the value with its trailing whitespace: "chunked " would not
         * be chunked to it, so trailing whitespace is refused like any other oddity here */
        v = trimmed(w, &n);
        if (v + n != w->val + w->vlen)
            w->flags |= FL_TE_BAD;
        /* a comma-separated list of codings, each a bare token */
        size_t i = 0;
        do {
            while (i < n && (v[i] == ' ' || v[i] == '\t'))
                i++;
            size_t s = i;
            while (i < n && is_tchar((unsigned char)v[i]))
                i++;
            size_t e = i;
            while (i < n && (v[i] == ' ' || v[i] == '\t'))
                i++;
            if (e == s || (i < n && v[i] != ',')) {
                w->flags |= FL_TE_BAD;
                break;
            }
            char low[8];
            bool chunked = false;
            if (e - s == 7) {
                for (size_t k = 0; k < 7; k++)
                    low[k] = lower((unsigned char)v[s + k]);
                chunked = memcmp(low, "chunked", 7) == 0;
            }
            w->te_codings++;
            w->te_chunked += chunked;
            w->te_last_chunked = chunked;
            if (i < n)
                i++; /* the comma */
            else
                break;
        } while (1);
        break;
    }
    case F_HOST:
        w->n_host++;
        break;
    case F_OTHER:
        break;
    }
    return REFUSE_NONE;
}

/* A chunk-size line begins. */
static void chunk_size_start(struct wire *w)
{
    w->tok = 0;
    w->left = 0;
    w->line = 0;
}

/* The head is complete: is its framing unambiguous? Sets up the body. */
static enum refusal end_head(struct wire *w)
{
    if (w->version == 11 && w->n_host == 0)
        return REFUSE_NO_HOST;
    if (w->n_host > 1)
        return REFUSE_TWO_HOSTS;
    if (w->n_cl && w->n_te_fields)
        return REFUSE_CL_AND_TE;
    if (w->n_cl > 1)
        return REFUSE_TWO_CONTENT_LENGTHS;
    if (w->n_te_fields) {
        if (w->version == 10)
            return REFUSE_TE_IN_HTTP10;
        if (w->flags & FL_TE_BAD)
            return REFUSE_BAD_TRANSFER_ENCODING;
        /* RFC 9112 6.1: chunked exactly once and last; one field line, so that no two
         * recipients can disagree on which line counts */
        if (w->n_te_fields > 1 || w->te_chunked != 1 || !w->te_last_chunked)
            return REFUSE_BAD_TRANSFER_ENCODING;
        if (w->te_codings > 1)
            return REFUSE_UNSUPPORTED_CODING;
        w->st = S_CHUNK_SIZE;
        chunk_size_start(w);
    } else if (w->n_cl && w->cl > 0) {
        w->st = S_BODY;
        w->left = w->cl;
    } else {
        w->st = S_START;
    }
    w->heads_out++;
    w->head = 0;
    w->blank = 0;
    return REFUSE_NONE;
}

static void head_reset(struct wire *w)
{
    w->flags = 0;
    w->version = 0;
    w->fields = 0;
    w->tok = 0;
    w->line = 0;
    w->n_cl = w->n_host = w->n_te_fields = 0;
    w->te_codings = w->te_chunked = 0;
    w->te_last_chunked = false;
    w->cl = 0;
}

static bool in_head_state(uint8_t st)
{
    return st <= S_END_CR;
}

/* A head or one of its lines grown past its bound, or REFUSE_NONE. */
static enum refusal over_limit(const struct wire *w)
{
    uint32_t line_max = w->head_max < REQ_LINE_MAX ? w->head_max : REQ_LINE_MAX;
    if (w->st <= S_RL_CR && w->line > line_max)
        return REFUSE_TARGET_TOO_LONG;
    if (w->head > w->head_max || w->line > line_max)
        return REFUSE_HEAD_TOO_LARGE;
    return REFUSE_NONE;
}

/* The class of bytes that may be taken in bulk in the current state, or 0: the rest of a
 * field name, a target, or a value that is not a framing field's. */
static uint8_t bulk_class(const struct wire *w)
{
    if (w->st == S_NAME)
        return C_TCHAR;
    if (w->st == S_TARGET)
        return C_TARGET;
    if (w->st == S_VALUE && w->field != F_CL && w->field != F_TE)
        return C_VALUE;
    return 0;
}

/* The chunked body's states that take one kind of byte and end at one byte (RFC 9112 7.1),
 * one row each: bytes of class 'run' (none where 0) stay in the state, the byte 'end' leads
 * to 'next', and any other byte breaks the framing. 'line_ends': the end byte closes a line
 * whose length was bounded by CHUNK_LINE_MAX (the trailer section is bounded as a whole). */
static const struct body_step {
    uint8_t run;
    unsigned char end;
    uint8_t next;
    bool line_ends;
} body_steps[] = {
    [S_CHUNK_EXT] = { C_VALUE, '\r', S_CHUNK_SIZE_CR, false },
    [S_CHUNK_SIZE_CR] = { 0, '\n', S_CHUNK_DATA, true }, /* S_TRAILER_START after size 0 */
    [S_CHUNK_DATA_CR] = { 0, '\r', S_CHUNK_DATA_LF, false },
    [S_CHUNK_DATA_LF] = { 0, '\n', S_CHUNK_SIZE, true },
    [S_TRAILER_NAME] = { C_TCHAR, ':', S_TRAILER_VALUE, false },
    [S_TRAILER_VALUE] = { C_VALUE, '\r', S_TRAILER_VALUE_CR, false },
    [S_TRAILER_VALUE_CR] = { 0, '\n', S_TRAILER_START, false },
    [S_TRAILER_END_CR] = { 0, '\n', S_START, true }, /* the message is complete */
};

struct wire_scan wire_parse(struct wire *w, const char *p, size_t n)
{
    struct wire_scan sc = { n, REFUSE_NONE };
    /* where the head (or the lone CR) still open began: before these bytes, or not at all */
    size_t head_at = w->head > 0 || w->st == S_LEAD_CR ? 0 : (size_t)-1;
    size_t i = 0;
    enum refusal bad = REFUSE_NONE;

    while (i < n) {
        /* body bytes pass in bulk */
        if (w->st == S_BODY || w->st == S_CHUNK_DATA) {
            size_t k = n - i;
            if (k > w->left)
                k = (size_t)w->left;
            i += k;
            w->left -= k;
            if (w->left == 0)
                w->st = w->st == S_BODY ? S_START : S_CHUNK_DATA_CR;
            continue;
        }
        uint8_t want = bulk_class(w);
        if (want) {
            size_t j = i;
            while (j < n && (byte_class[(unsigned char)p[j]] & want))
                j++;
            if (j > i) {
                if (w->st == S_NAME) {
                    /* kept, lowercased, while it may still be a framing field's name */
                    unsigned tok = w->tok;
                    for (size_t k = i; k < j; k++, tok++)
                        if (tok < sizeof(w->name))
                            w->name[tok] = lower((unsigned char)p[k]);
                    w->tok = (uint16_t)(tok < UINT16_MAX ? tok : UINT16_MAX);
                }
                w->head += (uint32_t)(j - i);
                w->line += (uint32_t)(j - i);
                i = j;
                if ((bad = over_limit(w)) != REFUSE_NONE)
                    goto refuse;
                continue;
            }
        }
        unsigned char c = (unsigned char)p[i++];
        if (w->head == 0 && (w->st == S_START || w->st == S_LEAD_CR)) {
            /* Empty lines before a request line are passed on, not held as a head (RFC 9112
             * 2.2: tolerated; libmicrohttpd skips them): a client that ends a body with a
             * stray CRLF and then idles is not a slow head. A few only. */
            if (w->st == S_LEAD_CR) {
                /* head_at is the CR: it goes on only with its LF */
                if (c != '\n') {
                    bad = REFUSE_BARE_CR;
                    goto refuse;
                }
                w->st = S_START;
                head_at = (size_t)-1;
                continue;
            }
            if (c == '\r' || c == '\n') {
                if (++w->blank > 8) {
                    head_at = i - 1;
                    bad = REFUSE_BAD_REQUEST_LINE;
                    goto refuse;
                }
                if (c == '\r') {
                    w->st = S_LEAD_CR;
                    head_at = i - 1;
                }
                continue;
            }
        }
        if (in_head_state(w->st)) {
            if (w->head == 0) {
                head_reset(w);
                head_at = i - 1;
            }
            w->head++;
            w->line++;
            if ((bad = over_limit(w)) != REFUSE_NONE)
                goto refuse;
        } else if (w->st >= S_TRAILER_START) {
            if (++w->line > TRAILER_MAX)
                goto broken;
        } else if (w->st != S_CHUNK_DATA_CR && w->st != S_CHUNK_DATA_LF) {
            if (++w->line > CHUNK_LINE_MAX)
                goto broken;
        }

        switch ((enum st)w->st) {
        case S_START:
            if (!is_tchar(c)) {
                bad = REFUSE_BAD_REQUEST_LINE;
                goto refuse;
            }
            w->st = S_METHOD;
            w->tok = 1;
            break;
        case S_LEAD_CR:
            break; /* handled before the head began */
        case S_METHOD:
            if (c == ' ') {
                w->st = S_TARGET0;
            } else if (!is_tchar(c)) {
                bad = REFUSE_BAD_METHOD;
                goto refuse;
            } else if (++w->tok > REQ_METHOD_MAX) {
                bad = REFUSE_METHOD_TOO_LONG;
                goto refuse;
            }
            break;
        case S_TARGET0:
        case S_TARGET:
            if (c == ' ' && w->st == S_TARGET) {
                w->st = S_VERSION;
                w->tok = 0;
            } else if (is_target_byte(c)) {
                w->st = S_TARGET;
            } else {
                bad = c == ' ' || c == '\r' || c == '\n' ? REFUSE_BAD_REQUEST_LINE
                                                         : REFUSE_BAD_TARGET;
                goto refuse;
            }
            break;
        case S_VERSION:
            if (w->tok < 8) {
                static const char form[] = "HTTP/d.d";
                bool ok =
                    form[w->tok] == 'd' ? (c >= '0' && c <= '9') : c == (unsigned char)form[w->tok];
                if (!ok) {
                    bad = REFUSE_BAD_REQUEST_LINE;
                    goto refuse;
                }
                if (w->tok == 5)
                    w->version = (uint8_t)((c - '0') * 10);
                else if (w->tok == 7)
                    w->version = (uint8_t)(w->version + (c - '0'));
                w->tok++;
                break;
            }
            if (c != '\r' && c != '\n') {
                bad = REFUSE_BAD_REQUEST_LINE;
                goto refuse;
            }
            if (w->version != 10 && w->version != 11) {
                bad = REFUSE_BAD_VERSION;
                goto refuse;
            }
            if (c == '\r') {
                w->st = S_RL_CR;
                break;
            }
            w->st = S_FIELD_START;
            w->line = 0;
            break;
        case S_RL_CR:
        case S_VALUE_CR:
        case S_END_CR:
            if (c != '\n') {
                bad = REFUSE_BARE_CR;
                goto refuse;
            }
            if (w->st == S_VALUE_CR && (bad = end_field(w)) != REFUSE_NONE)
                goto refuse;
            if (w->st == S_END_CR)
                goto head_done;
            w->st = S_FIELD_START;
            w->line = 0;
            break;
        case S_FIELD_START:
            if (c == '\r') {
                w->st = S_END_CR;
            } else if (c == '\n') {
                goto head_done;
            } else if (c == ' ' || c == '\t') {
                /* RFC 9112 5.2: obs-fold; whitespace before the first field is no better */
                bad = w->fields ? REFUSE_OBS_FOLD : REFUSE_BAD_FIELD_NAME;
                goto refuse;
            } else if (is_tchar(c)) {
                if (++w->fields > REQ_FIELDS_MAX) {
                    bad = REFUSE_HEAD_TOO_LARGE;
                    goto refuse;
                }
                w->st = S_NAME;
                w->tok = 1;
                w->name[0] = lower(c);
            } else {
                bad = REFUSE_BAD_FIELD_NAME;
                goto refuse;
            }
            break;
        case S_NAME:
            if (c == ':') {
                size_t nl = w->tok;
                w->field = F_OTHER;
                if (nl <= sizeof(w->name)) {
                    if (lower_eq(w->name, nl, "content-length"))
                        w->field = F_CL;
                    else if (lower_eq(w->name, nl, "transfer-encoding"))
                        w->field = F_TE;
                    else if (lower_eq(w->name, nl, "host"))
                        w->field = F_HOST;
                }
                w->vlen = 0;
                w->flags &= (uint8_t)~FL_VAL_OVERFLOW;
                w->st = S_VALUE;
            } else if (c == ' ' || c == '\t') {
                bad = REFUSE_SPACE_BEFORE_COLON;
                goto refuse;
            } else {
                /* tchar were taken in bulk above: this byte is not one */
                bad = REFUSE_BAD_FIELD_NAME;
                goto refuse;
            }
            break;
        case S_VALUE:
            if (c == '\r') {
                w->st = S_VALUE_CR;
            } else if (c == '\n') {
                if ((bad = end_field(w)) != REFUSE_NONE)
                    goto refuse;
                w->st = S_FIELD_START;
                w->line = 0;
            } else if (!is_value_byte(c)) {
                bad = REFUSE_BAD_FIELD_VALUE;
                goto refuse;
            } else if (w->field == F_CL || w->field == F_TE) {
                if (w->vlen < sizeof(w->val))
                    w->val[w->vlen++] = (char)c;
                else
                    w->flags |= FL_VAL_OVERFLOW;
            }
            break;

        /* ---- chunked body: a violation here closes the connection ---- */
        case S_CHUNK_SIZE: {
            int h = hexval(c);
            if (h >= 0) {
                if (++w->tok > 15)
                    goto broken; /* 15 hex digits: 2^60, far above any body we take */
                w->left = w->left * 16 + (uint64_t)h;
            } else if (w->tok && c == ';') {
                w->st = S_CHUNK_EXT;
            } else if (w->tok && c == '\r') {
                w->st = S_CHUNK_SIZE_CR;
            } else {
                goto broken;
            }
            break;
        }
        case S_TRAILER_START:
            if (c == '\r')
                w->st = S_TRAILER_END_CR;
            else if (is_tchar(c))
                w->st = S_TRAILER_NAME;
            else
                goto broken;
            break;
        case S_CHUNK_EXT:
        case S_CHUNK_SIZE_CR:
        case S_CHUNK_DATA_CR:
        case S_CHUNK_DATA_LF:
        case S_TRAILER_NAME:
        case S_TRAILER_VALUE:
        case S_TRAILER_VALUE_CR:
        case S_TRAILER_END_CR: {
            const struct body_step *bs = &body_steps[w->st];
            if (c != bs->end) {
                if (!(byte_class[c] & bs->run))
                    goto broken;
                break;
            }
            if (bs->line_ends)
                w->line = 0;
            w->st = bs->next;
            if (w->st == S_CHUNK_DATA && w->left == 0)
                w->st = S_TRAILER_START; /* the last chunk, of size 0 */
            else if (w->st == S_CHUNK_SIZE)
                chunk_size_start(w);
            break;
        }
        case S_BODY:
        case S_CHUNK_DATA:
            break; /* handled above */
        }
        continue;

    head_done:
        if ((bad = end_head(w)) != REFUSE_NONE)
            goto refuse;
        head_at = (size_t)-1;
        w->line = 0;
    }
    sc.safe = head_at == (size_t)-1 ? n : head_at;
    return sc;

refuse:
    sc.safe = head_at == (size_t)-1 ? 0 : head_at;
    sc.reason = bad;
    return sc;
broken:
    sc.safe = 0;
    sc.reason = REFUSE_BAD_CHUNK;
    return sc;
}

bool wire_quiet(const struct wire *w)
{
    return !w->stash_len && w->q_off >= w->q_len && !w->dead && !w->closing && !w->reject_head;
}
