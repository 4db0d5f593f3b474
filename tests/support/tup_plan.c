/* The test upstream's plans (tup.h): the X-Test-Plan directives read into a struct plan, and
 * the hash and the pattern of generated bodies. */
#include "tests/support/tup.h"
#include "tests/support/tup_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---- hashing and the body pattern ---- */

uint64_t tup_hash_update(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

uint64_t tup_hash(const void *data, size_t n)
{
    return tup_hash_update(TUP_HASH_INIT, data, n);
}

static const char pattern_alphabet[65] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

unsigned char tup_pattern_byte(uint64_t i)
{
    if (i % 64 == 63)
        return '\n';
    /* Top bits of a Weyl sequence: no short period, so offsets matter. */
    return (unsigned char)pattern_alphabet[(i * UINT64_C(0x9e3779b97f4a7c15)) >> 58];
}

void tup_pattern_fill(unsigned char *dst, uint64_t offset, size_t n)
{
    for (size_t k = 0; k < n; k++)
        dst[k] = tup_pattern_byte(offset + k);
}

uint64_t tup_pattern_hash(uint64_t n)
{
    unsigned char buf[16384];
    uint64_t h = TUP_HASH_INIT;
    for (uint64_t off = 0; off < n;) {
        size_t k = n - off < sizeof buf ? (size_t)(n - off) : sizeof buf;
        tup_pattern_fill(buf, off, k);
        h = tup_hash_update(h, buf, k);
        off += k;
    }
    return h;
}

/* ---- plans ---- */

void tup_plan_init(struct plan *p)
{
    memset(p, 0, sizeof *p);
    p->action = ACT_STATUS;
    p->status = 503;
    p->ok = 200;
}

void tup_plan_free(struct plan *p)
{
    free(p->retry_after);
    p->retry_after = NULL;
    free(p->header);
    p->header = NULL;
}

bool tup_is_ows(char ch)
{
    return ch == ' ' || ch == '\t';
}

/* Trims [*s, *e) of spaces and tabs. */
void tup_trim(const char **s, const char **e)
{
    while (*s < *e && tup_is_ows(**s))
        (*s)++;
    while (*e > *s && tup_is_ows((*e)[-1]))
        (*e)--;
}

bool tup_parse_u64(const char *s, const char *e, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (s == e)
        return false;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9')
            return false;
        unsigned d = (unsigned)(*s - '0');
        if (d > max || v > (max - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

static bool token_is(const char *s, const char *e, const char *word)
{
    size_t n = strlen(word);
    return (size_t)(e - s) == n && memcmp(s, word, n) == 0;
}

int tup_plan_parse(const char *text, struct plan *p, char *err, size_t errlen)
{
    tup_plan_init(p);
    const char *s = text;
    for (;;) {
        const char *end = strchr(s, ';');
        if (!end)
            end = s + strlen(s);
        const char *ks = s;
        const char *ke = end;
        tup_trim(&ks, &ke);
        if (ks < ke) {
            const char *eq = memchr(ks, '=', (size_t)(ke - ks));
            if (!eq) {
                snprintf(err, errlen, "directive '%.*s' has no '='", (int)(ke - ks), ks);
                goto bad;
            }
            const char *vs = eq + 1;
            const char *ve = ke;
            ke = eq;
            tup_trim(&ks, &ke);
            tup_trim(&vs, &ve);
            uint64_t v = 0;
            bool ok = true;
            if (token_is(ks, ke, "fail")) {
                ok = tup_parse_u64(vs, ve, UINT32_MAX, &v);
                p->fail = v;
            } else if (token_is(ks, ke, "action")) {
                if (token_is(vs, ve, "status"))
                    p->action = ACT_STATUS;
                else if (token_is(vs, ve, "hang"))
                    p->action = ACT_HANG;
                else if (token_is(vs, ve, "reset"))
                    p->action = ACT_RESET;
                else if (token_is(vs, ve, "close"))
                    p->action = ACT_CLOSE;
                else if (token_is(vs, ve, "reset-mid"))
                    p->action = ACT_RESET_MID;
                else if (token_is(vs, ve, "stall-mid"))
                    p->action = ACT_STALL_MID;
                else
                    ok = false;
            } else if (token_is(ks, ke, "status") || token_is(ks, ke, "ok")) {
                ok = tup_parse_u64(vs, ve, 599, &v) && v >= 200;
                if (*ks == 's')
                    p->status = (unsigned)v;
                else
                    p->ok = (unsigned)v;
            } else if (token_is(ks, ke, "retry-after")) {
                for (const char *q = vs; q < ve; q++)
                    if ((unsigned char)*q < 0x20 && *q != '\t')
                        ok = false;
                if (vs == ve)
                    ok = false;
                if (ok) {
                    free(p->retry_after);
                    p->retry_after = tup_xmalloc((size_t)(ve - vs) + 1);
                    memcpy(p->retry_after, vs, (size_t)(ve - vs));
                    p->retry_after[ve - vs] = '\0';
                }
            } else if (token_is(ks, ke, "header")) {
                const char *colon = memchr(vs, ':', (size_t)(ve - vs));
                for (const char *q = vs; q < ve; q++)
                    if ((unsigned char)*q < 0x20 && *q != '\t')
                        ok = false;
                if (!colon || colon == vs)
                    ok = false;
                if (ok) {
                    size_t nl = (size_t)(colon - vs), vl = (size_t)(ve - colon - 1);
                    free(p->header);
                    p->header = tup_xmalloc(nl + vl + 3);
                    memcpy(p->header, vs, nl);
                    memcpy(p->header + nl, ": ", 2);
                    memcpy(p->header + nl + 2, colon + 1, vl);
                    p->header[nl + 2 + vl] = '\0';
                }
            } else if (token_is(ks, ke, "body")) {
                ok = tup_parse_u64(vs, ve, MAX_BODY_PARAM, &v);
                p->body = v;
                p->body_set = true;
            } else if (token_is(ks, ke, "delay")) {
                ok = tup_parse_u64(vs, ve, MAX_DELAY_MS, &v);
                p->delay_ms = (unsigned)v;
            } else if (token_is(ks, ke, "chunked") || token_is(ks, ke, "echo") ||
                       token_is(ks, ke, "close-after") || token_is(ks, ke, "stale")) {
                ok = tup_parse_u64(vs, ve, 1, &v);
                bool b = v == 1;
                if (*ks == 'e')
                    p->echo = b;
                else if (*ks == 's')
                    p->stale = b;
                else if (token_is(ks, ke, "chunked"))
                    p->chunked = b;
                else
                    p->close_after = b;
            } else {
                snprintf(err, errlen, "unknown key '%.*s'", (int)(ke - ks), ks);
                goto bad;
            }
            if (!ok) {
                snprintf(err, errlen, "bad value '%.*s' for '%.*s'", (int)(ve - vs), vs,
                         (int)(ke - ks), ks);
                goto bad;
            }
        }
        if (!*end)
            break;
        s = end + 1;
    }
    return 0;
bad:
    tup_plan_free(p);
    return -1;
}

int tup_plan_check(const char *plan, char *err, size_t errlen)
{
    struct plan p;
    char buf[256];
    if (!err || !errlen) {
        err = buf;
        errlen = sizeof buf;
    }
    if (tup_plan_parse(plan, &p, err, errlen) < 0)
        return -1;
    tup_plan_free(&p);
    return 0;
}
