/* loop_clock_us (proxy/base/loop.h): the microsecond clock the reported durations are read from,
 * beside the loop's cached milliseconds that its timers keep to (issue 27 item 2). */
#include <criterion/criterion.h>

#include <time.h>

#include "proxy/base/loop.h"

static void sleep_us(long us)
{
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Read at the call, to the microsecond: a 300 us pause shows, where the cached ms clock would
 * round it to 0 or 1 ms. */
Test(loop_clock, reads_microseconds_at_the_call)
{
    struct loop *l = loop_new();
    cr_assert(l);
    uint64_t a = loop_clock_us(l);
    sleep_us(300);
    uint64_t b = loop_clock_us(l);
    cr_expect_geq(b - a, 300, "%llu us for a 300 us pause", (unsigned long long)(b - a));
    cr_expect_lt(b - a, 2000000);
    loop_free(l);
}

/* The same clock as loop_now()'s: after loop_update_now() they agree to the millisecond. */
Test(loop_clock, agrees_with_the_cached_milliseconds)
{
    struct loop *l = loop_new();
    cr_assert(l);
    uint64_t ms = loop_update_now(l);
    uint64_t us = loop_clock_us(l);
    cr_expect_geq(us / 1000, ms);
    cr_expect_leq(us / 1000 - ms, 1000, "%llu us against %llu ms", (unsigned long long)us,
                  (unsigned long long)ms);
    loop_free(l);
}

static uint64_t fake_ms;

static uint64_t fake_clock(void *arg)
{
    (void)arg;
    return fake_ms;
}

/* A test's clock stands in for both, so durations in a driven loop are exact. */
Test(loop_clock, a_test_clock_is_read_in_its_place)
{
    struct loop *l = loop_new();
    cr_assert(l);
    fake_ms = 1234;
    loop_set_clock(l, fake_clock, NULL);
    cr_expect_eq(loop_clock_us(l), 1234000);
    fake_ms = 1240;
    cr_expect_eq(loop_clock_us(l), 1240000);
    cr_expect_eq(loop_now(l), 1234, "the cached clock moves only with the loop");
    loop_set_clock(l, NULL, NULL);
    cr_expect_gt(loop_clock_us(l), 0);
    loop_free(l);
}
