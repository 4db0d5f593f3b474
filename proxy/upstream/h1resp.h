/* h1resp -- an HTTP/1.1 response head, line by line, with the checks every upstream response
 * head passes before a byte of it is relayed (docs/hardening.md#responses): the status line,
 * field lines (an obs-fold joined to the value before it), and at the head's end one length,
 * a transfer coding proxy/http/hlist.h accepts, interim 1xx heads dropped, and a 101 only as the
 * agreement to the upgrade asked for (RFC 9110 7.8, 15.2; RFC 9112 4, 5, 6.3). Lines after
 * the head (a chunked body's trailer fields) go to a second list.
 *
 * Pure: it calls no library. The libcurl transport (proxy/upstream/h1up.c) feeds it curl's header
 * callback; an upgrade's connection (proxy/upstream/tunnel_up.c) the lines it reads.
 */
#ifndef RETRYPROXY_PROXY_H1RESP_H
#define RETRYPROXY_PROXY_H1RESP_H

#include <stdbool.h>
#include <stddef.h>

#include "proxy/http/hlist.h"

struct h1resp {
    const char *upgrade; /* the protocol an upgrade asks for (a 101 agrees to it); NULL: none */
    int status;          /* the status line's, 0 before one (or after an interim head) */
    bool no_body;        /* a response to HEAD: no body follows, whatever the head says */
    bool head_done;      /* the final head is complete: later lines are trailers */
    bool bad;            /* the head was malformed or ambiguous (a 502 of its own kind) */
};

enum h1resp_step {
    H1RESP_MORE,  /* the line is taken: more follow */
    H1RESP_HEAD,  /* the blank line of the final head (or of an agreed 101): it is complete */
    H1RESP_ABORT, /* malformed ('bad' set), or past hlist's bounds: the response is refused */
};

/* Before the first line of a response (the lists are the caller's to clear). */
static inline void h1resp_start(struct h1resp *p, const char *upgrade, bool no_body)
{
    *p = (struct h1resp){ .upgrade = upgrade, .no_body = no_body };
}

/* One line 'b' of 'len' bytes, its line end included: into 'head' until the head is complete,
 * then into 'trailers'. */
enum h1resp_step h1resp_line(struct h1resp *p, struct hlist *head, struct hlist *trailers,
                             const char *b, size_t len);

#endif
