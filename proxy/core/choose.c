#include "proxy/core/choose.h"

#include <stdlib.h>

#include "policy/score.h"

/* The turn's point on weights that sum to 'sum': the fractional part of turn x golden ratio,
 * spread evenly over the sum whatever the weights (a low-discrepancy sequence: each
 * candidate's count stays within a few picks of its share). */
static uint64_t golden_point(uint32_t turn, uint64_t sum)
{
    return (((uint64_t)turn * 0x9E3779B97F4A7C15ULL) >> 32) * sum >> 32;
}

/* Linkerd's cost, (in flight + 1) / weight, of 'other' against 'first' (the first on a tie);
 * with even weights, or equal loads, the turn stands unless 'other' has less in flight. */
static bool other_is_cheaper(bool even, int64_t load_first, int64_t load_other, uint32_t w_first,
                             uint32_t w_other)
{
    if (even || load_other == load_first)
        return load_other < load_first;
    return (uint64_t)(load_other + 1) * w_first < (uint64_t)(load_first + 1) * w_other;
}

/* The j-th of the 'n' candidates not in 'avoid', skipping 'skip' (n: none). */
static size_t nth(uint64_t avoid, size_t n, size_t j, size_t skip)
{
    for (size_t i = 0; i < n; i++)
        if (!(avoid & (1ULL << i)) && i != skip && j-- == 0)
            return i;
    return n;
}

/* The candidate not in 'avoid' (nor 'skip') whose span of weight holds 'x', the spans laid end
 * to end in index order. */
static size_t at_weight(uint64_t avoid, size_t n, const uint32_t *w, uint64_t x, size_t skip)
{
    size_t last = n;
    for (size_t i = 0; i < n; i++) {
        if ((avoid & (1ULL << i)) || i == skip)
            continue;
        if (x < w[i])
            return i;
        x -= w[i];
        last = i;
    }
    return last; /* not reached with x below the sum */
}

size_t choose_balanced(enum cfg_balance b, uint64_t tried, uint64_t ejected, size_t n,
                       const int64_t *load, const uint32_t *weight, uint32_t *rr, struct rng *rng)
{
    if (n > CHOOSE_MASK_MAX)
        n = CHOOSE_MASK_MAX;
    if (n <= 1)
        return 0;
    /* Only a request's first attempt takes a turn: a retry that took one too would hand the
     * next request's first attempt to the endpoint this one just left (with two endpoints, one
     * failing, every first attempt would go to the failing one). */
    bool turn = rr && b != CFG_BALANCE_RANDOM && tried == 0;
    const uint64_t avoid[] = { tried | ejected, ejected, tried, 0 };
    uint64_t mask = n == 64 ? ~0ULL : (1ULL << n) - 1;
    for (size_t p = 0; p < sizeof(avoid) / sizeof(avoid[0]); p++) {
        size_t m = (size_t)__builtin_popcountll(~avoid[p] & mask);
        if (m == 0)
            continue;
        uint64_t sum = 0;
        uint32_t lo = UINT32_MAX, hi = 0;
        for (size_t i = 0; weight && i < n; i++) {
            if (avoid[p] & (1ULL << i))
                continue;
            sum += weight[i];
            lo = weight[i] < lo ? weight[i] : lo;
            hi = weight[i] > hi ? weight[i] : hi;
        }
        bool even = !weight || lo == hi || lo == 0;
        size_t first;
        if (even) {
            /* the turn counts over the candidates, so that one left out (ejected) does not
             * hand its share to the next in line; without a turn, any of them */
            size_t j = turn ? *rr % m : m > 1 ? (size_t)rng_between(rng, 0, m - 1) : 0;
            first = nth(avoid[p], n, j, n);
        } else {
            /* weighted: the turn's point (golden_point()), without a turn a random one */
            uint64_t x = turn ? golden_point(*rr, sum) : rng_between(rng, 0, sum - 1);
            first = at_weight(avoid[p], n, weight, x, n);
        }
        if (turn)
            *rr += 1;
        if (b != CFG_BALANCE_LEAST_REQUEST || m < 2 || !load)
            return first;
        /* the turn gave an endpoint kept at its floor weight: it is tried as it is, or under
         * least_request it would never be (it loses every comparison), nor its recovery seen */
        if (!even && turn && weight[first] <= SCORE_WEIGHT_FLOOR)
            return first;
        size_t other = even ? nth(avoid[p], n, (size_t)rng_between(rng, 0, m - 2), first)
                            : at_weight(avoid[p], n, weight,
                                        rng_between(rng, 0, sum - weight[first] - 1), first);
        /* equal loads: the turn stands (requests one after another follow the weights alone) */
        return other_is_cheaper(even, load[first], load[other], even ? 0 : weight[first],
                                even ? 0 : weight[other])
                   ? other
                   : first;
    }
    return 0;
}

/* ---- any number of candidates ---- */

/* The candidate whose span of weight holds 'x' (below the sum), by binary search in s->cum. */
static size_t span_at(const struct choose_set *s, uint64_t x)
{
    size_t lo = 0, hi = s->n - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (x < s->cum[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static uint64_t sum_of(const struct choose_set *s)
{
    return s->weight ? s->cum[s->n - 1] : s->n;
}

/* A candidate at random by weight. */
static size_t draw(const struct choose_set *s, struct rng *rng)
{
    uint64_t x = rng_between(rng, 0, sum_of(s) - 1);
    return s->weight ? span_at(s, x) : (size_t)x;
}

/* The last resort, when every draw met a candidate tried or ejected: a pass over all of them,
 * one at random by weight among the first class of choose_balanced()'s preference that has
 * any; that class's states to avoid in *avoid. */
static size_t scan(const struct choose_set *s, struct rng *rng, unsigned *avoid)
{
    static const unsigned order[] = { CHOOSE_TRIED | CHOOSE_EJECTED, CHOOSE_EJECTED, CHOOSE_TRIED,
                                      0 };
    uint64_t sum[4] = { 0 };
    for (size_t i = 0; i < s->n; i++) {
        unsigned st = s->state(s->ctx, i);
        for (size_t p = 0; p < 4; p++)
            if (!(st & order[p]))
                sum[p] += s->weight ? s->weight[i] : 1;
    }
    size_t p = 0;
    while (p < 3 && !sum[p])
        p++;
    *avoid = order[p];
    uint64_t x = rng_between(rng, 0, sum[p] - 1);
    size_t last = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->state(s->ctx, i) & order[p])
            continue; /* (a state may have changed since: then the last that fits) */
        uint64_t w = s->weight ? s->weight[i] : 1;
        if (x < w)
            return i;
        x -= w;
        last = i;
    }
    return last;
}

size_t choose_many(enum cfg_balance b, const struct choose_set *s, bool retry, uint32_t *rr,
                   struct rng *rng)
{
    size_t n = s->n;
    if (n <= 1)
        return 0;
    bool turn = rr && b != CFG_BALANCE_RANDOM && !retry;
    size_t first;
    if (turn) {
        first = s->weight ? span_at(s, golden_point(*rr, sum_of(s))) : *rr % n;
        *rr += 1;
    } else {
        first = draw(s, rng);
    }
    unsigned avoid = CHOOSE_TRIED | CHOOSE_EJECTED;
    bool by_turn = turn;
    for (size_t k = 0; s->state(s->ctx, first) & avoid; k++) {
        if (k == CHOOSE_DRAWS) {
            first = scan(s, rng, &avoid);
            break;
        }
        first = draw(s, rng);
        by_turn = false;
    }
    if (b != CFG_BALANCE_LEAST_REQUEST || !s->load)
        return first;
    /* a turn on an endpoint at its floor weight is taken as it is (choose_balanced()) */
    if (s->weight && by_turn && s->weight[first] <= SCORE_WEIGHT_FLOOR)
        return first;
    size_t other = n;
    for (size_t k = 0; k < CHOOSE_DRAWS && other == n; k++) {
        size_t c = draw(s, rng);
        if (c != first && !(s->state(s->ctx, c) & avoid))
            other = c;
    }
    if (other == n)
        return first; /* no second choice drawn: the first stands */
    bool even = !s->weight;
    return other_is_cheaper(even, s->load(s->ctx, first), s->load(s->ctx, other),
                            even ? 0 : s->weight[first], even ? 0 : s->weight[other])
               ? other
               : first;
}

/* ---- a request's tried endpoints ---- */

struct choose_tried_more {
    size_t n, cap;
    const void *id[];
};

bool choose_tried_more_has(const struct choose_tried_more *m, const void *id)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->id[i] == id)
            return true;
    return false;
}

void choose_tried_add(struct choose_tried *t, const void *id)
{
    if (!id || choose_tried_has(t, id))
        return;
    if (!t->one) {
        t->one = id;
        return;
    }
    struct choose_tried_more *m = t->more;
    if (!m || m->n == m->cap) {
        size_t cap = m ? m->cap * 2 : 4;
        struct choose_tried_more *g = realloc(m, sizeof(*g) + cap * sizeof(g->id[0]));
        if (!g)
            return;
        if (!m)
            g->n = 0;
        g->cap = cap;
        t->more = m = g;
    }
    m->id[m->n++] = id;
}

void choose_tried_free(struct choose_tried *t)
{
    free(t->more);
    t->more = NULL;
    t->one = NULL;
}
