/* fuzz_grpc: the gRPC field parsers of proxy/http/grpc.h against references written differently.
 *
 * Input: one byte choosing how the rest is cut, then bytes read as a grpc-timeout value, a
 * grpc-status value and a gRPC message stream. The timeout and status are compared with
 * sscanf-based references; the message counter is fed the stream whole and in pieces, and must
 * count the same messages as a reference that walks the prefixes one message at a time.
 */
#define FUZZ_NAME "fuzz_grpc"
#include "tests/fuzz/fuzz.h"

#include <stdbool.h>
#include <string.h>

#include "proxy/http/grpc.h"

/* fuzz-link: proxy/http/grpc.c proxy/http/hlist.c */

/* A grpc-timeout by sscanf: 1 to 8 digits then one unit letter, nothing else. */
static int ref_timeout(const char *v, size_t n, uint64_t *ms)
{
    if (n < 2 || n > 9)
        return -1;
    char buf[16];
    memcpy(buf, v, n);
    buf[n] = '\0';
    unsigned long long value;
    char unit, extra;
    int used = 0;
    if (buf[0] < '0' || buf[0] > '9' || sscanf(buf, "%llu%n", &value, &used) != 1 ||
        (size_t)used != n - 1 || sscanf(buf + used, "%c%c", &unit, &extra) != 1)
        return -1;
    static const char units[] = "HMSmun";
    static const double to_ms[] = { 3600000, 60000, 1000, 1, 1e-3, 1e-6 };
    const char *u = strchr(units, unit);
    if (!u || !unit)
        return -1;
    double exact = (double)value * to_ms[u - units];
    uint64_t up = (uint64_t)exact;
    if ((double)up < exact)
        up++;
    if (up == 0 && value)
        up = 1;
    *ms = up;
    return 0;
}

static int ref_status(const char *v, size_t n)
{
    if (n < 1 || n > 3)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (v[i] < '0' || v[i] > '9')
            return -1;
    char buf[4];
    memcpy(buf, v, n);
    buf[n] = '\0';
    return atoi(buf);
}

/* Messages begun in s[0..n), one prefix at a time. */
static uint32_t ref_messages(const uint8_t *s, size_t n)
{
    uint32_t count = 0;
    size_t i = 0;
    while (i < n) {
        count++;
        if (n - i < 5)
            break;
        uint64_t len = (uint64_t)s[i + 1] << 24 | (uint64_t)s[i + 2] << 16 |
                       (uint64_t)s[i + 3] << 8 | s[i + 4];
        i += 5;
        if (len >= n - i)
            break;
        i += (size_t)len;
    }
    return count;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = { data, size };
    uint8_t cut = fuzz_byte(&in);
    const char *v = (const char *)in.p;
    size_t n = in.n;

    uint64_t got = 0, want = 0;
    size_t tn = n < 12 ? n : 12;
    int rc = grpc_timeout_parse(v, tn, &got);
    int ref = ref_timeout(v, tn, &want);
    FUZZ_CHECK(rc == ref, "timeout \"%.*s\": %d, reference %d", (int)tn, v, rc, ref);
    FUZZ_CHECK(rc < 0 || got == want, "timeout \"%.*s\": %llu ms, reference %llu", (int)tn, v,
               (unsigned long long)got, (unsigned long long)want);
    if (rc == 0 && got <= 99999999) {
        char out[GRPC_TIMEOUT_MAX];
        size_t len = grpc_timeout_format(got, out);
        uint64_t back;
        FUZZ_CHECK(grpc_timeout_parse(out, len, &back) == 0 && back == got, "%s", out);
    }

    size_t sn = n < 5 ? n : 5;
    FUZZ_CHECK(grpc_status_parse(v, sn) == ref_status(v, sn), "status \"%.*s\"", (int)sn, v);
    (void)grpc_is_content_type(v, n);

    struct grpc_frames whole = { 0 }, pieces = { 0 };
    uint32_t m = grpc_frames_feed(&whole, v, n);
    FUZZ_CHECK(m == ref_messages(in.p, n), "messages %u, reference %u", m, ref_messages(in.p, n));
    size_t step = cut % 7 + 1, last = 0;
    for (size_t i = 0; i < n; i += step)
        last = grpc_frames_feed(&pieces, v + i, n - i < step ? n - i : step);
    FUZZ_CHECK(n == 0 || last == m, "in pieces of %zu: %zu, whole: %u", step, last, m);
    return 0;
}
