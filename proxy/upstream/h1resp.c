#include "proxy/upstream/h1resp.h"

#include <string.h>
#include <strings.h>

#include "proxy/http/headers.h"

static enum h1resp_step bad(struct h1resp *p)
{
    p->bad = true;
    return H1RESP_ABORT;
}

/* The status line: "HTTP/x.y NNN ...", NNN from 100 to 599 (RFC 9110 15). Anything else is no
 * HTTP response: refused as a reset would be. */
static enum h1resp_step status_line(struct h1resp *p, struct hlist *head, const char *b, size_t len)
{
    const char *sp = memchr(b, ' ', len);
    if (!sp || (size_t)(sp - b) + 4 > len || sp[1] < '0' || sp[1] > '9' || sp[2] < '0' ||
        sp[2] > '9' || sp[3] < '0' || sp[3] > '9')
        return H1RESP_ABORT;
    int status = (sp[1] - '0') * 100 + (sp[2] - '0') * 10 + (sp[3] - '0');
    if (status < 100 || status > 599)
        return H1RESP_ABORT;
    p->status = status;
    hlist_clear(head);
    return H1RESP_MORE;
}

/* A 101 agrees to the upgrade asked for when its Upgrade names that protocol (any case, the
 * version too if the request gave one) and its Connection names "upgrade" (RFC 9110 7.8):
 * anything else is no switch this proxy asked for, a malformed answer. */
static bool upgrade_agreed(const struct h1resp *p, const struct hlist *head)
{
    const char *vals[2];
    size_t lens[2];
    if (hlist_values(head, "Upgrade", vals, lens, 2) != 1 ||
        !hlist_connection_names(head, "upgrade"))
        return false;
    size_t vl = lens[0];
    const char *v = hdr_trim(vals[0], &vl);
    size_t want = strlen(p->upgrade);
    bool versioned = strchr(p->upgrade, '/') != NULL;
    if (!versioned && memchr(v, '/', vl))
        vl = (size_t)((const char *)memchr(v, '/', vl) - v);
    return vl == want && strncasecmp(v, p->upgrade, want) == 0;
}

/* The blank line after the fields. An interim 1xx head is dropped: the real one follows. A
 * head whose body cannot be framed is refused here, before the owner relays a byte of it: two
 * lengths, or a Transfer-Encoding other than one "chunked" unless no body can follow (a
 * response to HEAD, a 204, a 304: RFC 9112 6.3). */
static enum h1resp_step head_end(struct h1resp *p, const struct hlist *head)
{
    if (p->status < 200) {
        if (p->status == 101 && p->upgrade) {
            if (!upgrade_agreed(p, head))
                return bad(p);
            p->head_done = true;
            return H1RESP_HEAD;
        }
        p->status = 0; /* interim (a 101 too, to a request that asked for no upgrade) */
        return H1RESP_MORE;
    }
    bool bodiless = p->no_body || p->status == 204 || p->status == 304;
    if (!hlist_length_unambiguous(head) || (!bodiless && !hlist_transfer_coding_ok(head)))
        return bad(p);
    p->head_done = true;
    return H1RESP_HEAD;
}

/* "name: value", or an obs-fold continuing the previous value (RFC 9112 5.2: a proxy replaces
 * it by a space before anything reads the value). */
static enum h1resp_step field_line(struct h1resp *p, struct hlist *into, const char *b, size_t len)
{
    size_t end = len;
    while (end > 0 && (b[end - 1] == '\r' || b[end - 1] == '\n'))
        end--;
    bool fold = b[0] == ' ' || b[0] == '\t';
    const char *colon = fold ? NULL : memchr(b, ':', end);
    if (!fold && (!colon || !hdr_name_valid_n(b, (size_t)(colon - b))))
        return bad(p); /* not a field line */
    const char *v = fold ? b : colon + 1;
    size_t vl = (size_t)(b + end - v);
    v = hdr_trim(v, &vl);
    if (!hdr_value_valid_n(v, vl))
        return bad(p);
    if (fold)
        return hlist_extend_last(into, v, vl) < 0 ? bad(p) : H1RESP_MORE;
    if (hlist_add(into, b, (size_t)(colon - b), v, vl) < 0)
        return H1RESP_ABORT; /* too many or too large: refused as a reset would be */
    return H1RESP_MORE;
}

enum h1resp_step h1resp_line(struct h1resp *p, struct hlist *head, struct hlist *trailers,
                             const char *b, size_t len)
{
    if (len == 0)
        return bad(p);
    bool blank = len <= 2 && (b[0] == '\r' || b[0] == '\n');
    if (p->head_done) /* trailers, after a chunked body */
        return blank ? H1RESP_MORE : field_line(p, trailers, b, len);
    if (len >= 5 && memcmp(b, "HTTP/", 5) == 0)
        return status_line(p, head, b, len);
    if (p->status == 0)
        return bad(p); /* a field before any status line */
    if (blank)
        return head_end(p, head);
    return field_line(p, head, b, len);
}
