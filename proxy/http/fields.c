#include "proxy/http/fields.h"

#include <string.h>
#include <strings.h>

#include "proxy/http/headers.h"

/* The names the filters know, by length, so that a name is compared with the few of its own
 * length only: most names are told apart by one lookup. Both directions read this one table. */
#define BY_LEN_MAX 20
#define PER_LEN    2

#define HOP (FIELDS_HOP | FIELDS_UP | FIELDS_DOWN)

static const struct named {
    const char *name;
    unsigned ways;
} by_len[BY_LEN_MAX + 1][PER_LEN] = {
    [2] = { { "TE", HOP } },
    [4] = { { "Host", FIELDS_UP } },
    [6] = { { "Expect", FIELDS_UP } },
    [7] = { { "Trailer", HOP }, { "Upgrade", HOP | FIELDS_H2 } },
    [10] = { { "Connection", HOP | FIELDS_H2 }, { "Keep-Alive", HOP | FIELDS_H2 } },
    [12] = { { "X-Request-Id", FIELDS_UP | FIELDS_DOWN_ID }, { "X-Retry-Stop", FIELDS_DOWN } },
    [14] = { { "Content-Length", FIELDS_UP | FIELDS_DOWN } },
    [15] = { { "X-Retry-Attempt", FIELDS_UP }, { "X-Forwarded-For", FIELDS_UP } },
    [16] = { { "Proxy-Connection", HOP | FIELDS_H2 }, { "X-Retry-Attempts", FIELDS_DOWN } },
    [17] = { { "Transfer-Encoding", HOP | FIELDS_H2 }, { "X-Forwarded-Proto", FIELDS_UP } },
    [18] = { { "X-Retry-Timeout-Ms", FIELDS_UP } },
    [20] = { { "X-Retry-Max-Attempts", FIELDS_UP } },
};

/* The ways of the name 'k', 0 when the table does not have it. The first and last bytes, in
 * either case, tell most names of one length apart before a whole comparison: this runs for
 * every field of every request and answer. */
static unsigned ways_of(const char *k, size_t kl)
{
    if (kl > BY_LEN_MAX)
        return 0;
    for (size_t i = 0; i < PER_LEN && by_len[kl][i].name; i++) {
        const char *n = by_len[kl][i].name;
        if (((k[0] ^ n[0]) & ~0x20) == 0 && ((k[kl - 1] ^ n[kl - 1]) & ~0x20) == 0 &&
            strncasecmp(k, n, kl) == 0)
            return by_len[kl][i].ways;
    }
    return 0;
}

static bool listed(const char *const *values, unsigned n, const char *k)
{
    for (unsigned i = 0; i < n; i++)
        if (hdr_token_listed(values[i], k))
            return true;
    return false;
}

bool fields_up_drops(const struct fields_up *u, const char *k, size_t kl)
{
    if (kl == 0 || k[0] == ':' || (ways_of(k, kl) & FIELDS_UP))
        return true;
    if ((u->deadline_header && hdr_name_eq(k, u->deadline_header)) ||
        (u->grpc && HDR_NAME_IS(k, kl, "grpc-timeout")) ||
        (u->drop_underscored && memchr(k, '_', kl)))
        return true;
    return u->n_connection && listed(u->connection, u->n_connection, k);
}

bool fields_down_drops(const struct fields_down *d, const char *k, size_t kl)
{
    unsigned w = ways_of(k, kl);
    if (kl == 0 || k[0] == ':' || (w & FIELDS_DOWN) || ((w & FIELDS_DOWN_ID) && d->own_request_id))
        return true;
    for (size_t i = 0; i < 2; i++)
        if (d->named[i] && hlist_connection_names(d->named[i], k))
            return true;
    return false;
}

void fields_down_each(const struct hlist *h, bool own_request_id,
                      void (*fn)(void *arg, const struct hfield *f), void *arg)
{
    struct fields_down d = { .named = { hlist_get(h, "Connection") ? h : NULL },
                             .own_request_id = own_request_id };
    size_t pos = 0;
    struct hfield f;
    while (hlist_next_n(h, &pos, &f))
        if (!fields_down_drops(&d, f.name, f.name_len))
            fn(arg, &f);
}

bool fields_hop_by_hop(const char *k, size_t kl)
{
    return ways_of(k, kl) & FIELDS_HOP;
}

bool fields_h2_connection_specific(const char *k, size_t kl, const char *v, size_t vl)
{
    if (HDR_NAME_IS(k, kl, "TE"))
        return !(vl == 8 && strncasecmp(v, "trailers", 8) == 0);
    return ways_of(k, kl) & FIELDS_H2;
}

void fields_each(void (*fn)(void *arg, const char *name, unsigned ways), void *arg)
{
    for (size_t l = 0; l <= BY_LEN_MAX; l++)
        for (size_t i = 0; i < PER_LEN && by_len[l][i].name; i++)
            fn(arg, by_len[l][i].name, by_len[l][i].ways);
}
