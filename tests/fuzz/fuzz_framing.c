/* The request framing check (proxy/http1/wire.h) fed raw bytes, as a client would send them.
 *
 * The first input byte chooses how the bytes are cut into reads; the rest is the stream.
 * Invariants:
 *   - the outcome (what libmicrohttpd receives, refused or reset) is the same whether the
 *     stream arrives whole or cut into pieces: a split head is checked exactly as a whole one;
 *   - what libmicrohttpd receives is itself clean: fed through a fresh checker it passes
 *     unchanged, with no refusal and no reset (a refused head is never handed over; the
 *     stand-in that replaces it is well formed);
 *   - when nothing is refused or reset, every byte is handed over unchanged.
 */
/* fuzz-link: proxy/http1/wire.c proxy/http1/wire_recv.c proxy/http/refusal.c */
#define FUZZ_NAME "fuzz_framing"
#include <string.h>

#include "proxy/http1/wire.h"
#include "tests/fuzz/fuzz.h"

#define OUT_MAX (1 << 17)

static char out_whole[OUT_MAX], out_cut[OUT_MAX], out_again[OUT_MAX];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t pieces[4] = { 1 + (data[0] & 7), 1 + ((data[0] >> 3) & 3), 13, 1 + (data[0] >> 5) };
    const char *s = (const char *)data + 1;
    size_t n = size - 1;

    struct wire a, b, c;
    bool closed_a, closed_b, closed_c;
    wire_init(&a, 0, WIRE_HEAD_DEFAULT);
    size_t na = wire_run(s, n, NULL, 0, out_whole, OUT_MAX, &closed_a, &a);
    wire_init(&b, 0, WIRE_HEAD_DEFAULT);
    size_t nb = wire_run(s, n, pieces, 4, out_cut, OUT_MAX, &closed_b, &b);

    FUZZ_CHECK(closed_a == closed_b, "reset whole %d, cut %d", closed_a, closed_b);
    FUZZ_CHECK(a.rejected == b.rejected, "refused whole %d, cut %d", a.rejected, b.rejected);
    if (!closed_a) {
        FUZZ_CHECK(na == nb && memcmp(out_whole, out_cut, na) == 0,
                   "handed over %zu bytes whole, %zu cut", na, nb);
        FUZZ_CHECK(a.heads_out == b.heads_out, "heads %u whole, %u cut", a.heads_out, b.heads_out);
    }
    if (!closed_a && a.rejected == REFUSE_NONE)
        FUZZ_CHECK(na <= n && memcmp(out_whole, s, na) == 0, "bytes changed on the way");
    if (!closed_a && a.rejected != REFUSE_NONE)
        FUZZ_CHECK(na >= wire_standin_len && memcmp(out_whole + na - wire_standin_len, wire_standin,
                                                    wire_standin_len) == 0,
                   "a refusal ends with the stand-in");

    wire_init(&c, 0, WIRE_HEAD_DEFAULT);
    size_t nc = wire_run(out_whole, na, NULL, 0, out_again, OUT_MAX, &closed_c, &c);
    FUZZ_CHECK(!closed_c && c.rejected == REFUSE_NONE, "handed-over bytes are not clean: %s",
               refusal_text(c.rejected));
    FUZZ_CHECK(nc == na && memcmp(out_again, out_whole, na) == 0, "clean bytes pass unchanged");

    wire_release(&a);
    wire_release(&b);
    wire_release(&c);
    return 0;
}
