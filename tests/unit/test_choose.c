/* choose_among: which upstream the next attempt goes to (docs/forwarding.md "Choosing an
 * upstream"): round-robin, preferring one neither tried nor ejected, then one not ejected, then
 * (every upstream ejected: panic mode) one not tried. */
#include <criterion/criterion.h>

#include "proxy/core/choose.h"

#define B(i) (1ULL << (i))

/* Round-robin from position 'rr' over 'n' upstreams. */
static size_t pick(uint64_t tried, uint64_t ejected, size_t n, uint32_t rr)
{
    return choose_among(tried, ejected, n, &rr, NULL);
}

Test(choose, nothing_ejected_is_round_robin_skipping_the_tried)
{
    cr_expect_eq(pick(0, 0, 3, 0), 0);
    cr_expect_eq(pick(0, 0, 3, 4), 1);
    cr_expect_eq(pick(B(1), 0, 3, 1), 2);
    cr_expect_eq(pick(B(0) | B(1) | B(2), 0, 3, 1), 1, "all tried: the one in turn");
}

Test(choose, an_ejected_upstream_is_skipped)
{
    cr_expect_eq(pick(0, B(0), 2, 0), 1);
    cr_expect_eq(pick(0, B(0), 2, 1), 1);
    cr_expect_eq(pick(0, B(1), 3, 1), 2);
}

Test(choose, a_tried_upstream_in_rotation_before_an_ejected_untried_one)
{
    /* 0 tried, 1 ejected: back to 0 rather than to the ejected one */
    cr_expect_eq(pick(B(0), B(1), 2, 1), 0);
    cr_expect_eq(pick(B(0), B(1) | B(2), 3, 1), 0);
}

Test(choose, neither_tried_nor_ejected_comes_first)
{
    cr_expect_eq(pick(B(0), B(1), 3, 0), 2);
}

Test(choose, every_upstream_ejected_prefers_the_untried_in_turn)
{
    cr_expect_eq(pick(0, B(0) | B(1), 2, 1), 1, "panic: the one in turn");
    cr_expect_eq(pick(B(1), B(0) | B(1) | B(2), 3, 1), 2, "panic: the untried next");
    cr_expect_eq(pick(B(0) | B(1), B(0) | B(1), 2, 1), 1, "all tried and ejected");
}

Test(choose, every_pick_skips_the_ejected_whatever_the_position)
{
    uint32_t rr = 0;
    size_t got[4];
    for (int i = 0; i < 4; i++)
        got[i] = choose_among(0, B(0), 2, &rr, NULL);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(got[i], 1, "pick %d", i);
}
