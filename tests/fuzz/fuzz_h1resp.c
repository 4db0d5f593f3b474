/* fuzz_h1resp: the HTTP/1.1 response head parser (proxy/upstream/h1resp.h), line by line as
 * libcurl's header callback and proxy/upstream/tunnel_up.c hand it lines.
 *
 * Invariants: it never reads past a line; a complete head has a status from 101 to 599 (101
 * only when an upgrade was asked for), one Content-Length value at most, and a transfer coding
 * hlist accepts unless no body follows; after an abort or a bad head nothing more is fed; every
 * field in the lists has a valid name and a valid value, within hlist's bounds.
 *
 * Input: one flag byte (bit 0: a HEAD request, bit 1: an upgrade to "websocket" asked for),
 * then the lines of one or more responses, each up to and with its "\n" (the last one may lack
 * it).
 */
#define FUZZ_NAME "fuzz_h1resp"
#include "tests/fuzz/fuzz.h"

#include <stdbool.h>
#include <string.h>

#include "proxy/upstream/h1resp.h"
#include "proxy/http/headers.h"

/* fuzz-link: proxy/upstream/h1resp.c proxy/http/hlist.c */

static void check_list(const struct hlist *h)
{
    size_t pos = 0, count = 0;
    const char *n, *v;
    FUZZ_CHECK(h->len <= HLIST_MAX_BYTES, "%zu bytes", h->len);
    while (hlist_next(h, &pos, &n, &v)) {
        count++;
        FUZZ_CHECK(hdr_name_valid_n(n, strlen(n)), "name \"%s\"", n);
        size_t vl = strlen(v);
        FUZZ_CHECK(hdr_value_valid_n(v, vl), "value \"%s\"", v);
    }
    FUZZ_CHECK(count == h->count && count <= HLIST_MAX_COUNT, "%zu fields", count);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = { data, size };
    uint8_t flags = fuzz_byte(&in);
    bool no_body = flags & 1;
    const char *upgrade = flags & 2 ? "websocket" : NULL;
    struct h1resp p;
    struct hlist head = { 0 }, trailers = { 0 };
    h1resp_start(&p, upgrade, no_body);
    bool heads = false;
    while (in.n) {
        size_t len = 0;
        while (len < in.n && in.p[len] != '\n')
            len++;
        if (len < in.n)
            len++;
        /* a copy of exactly the line: ASan sees any read past it */
        char *line = malloc(len);
        FUZZ_CHECK(line != NULL, "out of memory");
        memcpy(line, in.p, len);
        in.p += len;
        in.n -= len;
        bool done_before = p.head_done;
        enum h1resp_step st = h1resp_line(&p, &head, &trailers, line, len);
        free(line);
        if (st == H1RESP_ABORT)
            break;
        FUZZ_CHECK(!p.bad, "a bad head that was not refused");
        if (st == H1RESP_HEAD) {
            FUZZ_CHECK(!done_before && p.head_done, "a second head");
            FUZZ_CHECK(p.status >= 101 && p.status <= 599, "status %d", p.status);
            FUZZ_CHECK(p.status != 101 || upgrade, "a 101 without an upgrade asked for");
            FUZZ_CHECK(p.status == 101 || p.status >= 200, "an interim status %d", p.status);
            FUZZ_CHECK(hlist_length_unambiguous(&head), "two lengths");
            bool bodiless = no_body || p.status == 204 || p.status == 304 || p.status == 101;
            FUZZ_CHECK(bodiless || hlist_transfer_coding_ok(&head), "a transfer coding");
            heads = true;
        } else {
            FUZZ_CHECK(heads == p.head_done, "the head ended without H1RESP_HEAD");
        }
    }
    check_list(&head);
    check_list(&trailers);
    hlist_free(&head);
    hlist_free(&trailers);
    return 0;
}
