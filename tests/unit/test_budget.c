/* Retry budgets with a fake clock: exact limits, the window sliding, many threads. */
#include <criterion/criterion.h>

#include <pthread.h>

#include "policy/budget.h"

static struct budget b;

static struct budget_limits limits(int64_t max, double ratio, double min_rps, uint32_t window)
{
    return (struct budget_limits){ max, ratio, min_rps, window };
}

/* Retries allowed in a row (each noted) at 'now'. */
static int allowed_retries(const struct budget_limits *l, uint64_t now, int cap)
{
    int n = 0;
    while (n < cap && budget_ratio_allows(&b, l, now)) {
        budget_note_retry(&b, now);
        n++;
    }
    return n;
}

Test(budget, ratio_allows_a_fifth_of_first_attempts)
{
    struct budget_limits l = limits(-1, 0.2, 0, 10000);
    budget_init(&b, l.window_ms);
    for (int i = 0; i < 100; i++)
        budget_note_request(&b, 1000);
    cr_expect_eq(allowed_retries(&l, 1000, 1000), 20);
    cr_expect_eq(budget_window_retries(&b, 1000), 20);
}

Test(budget, no_first_attempts_no_ratio_retries)
{
    struct budget_limits l = limits(-1, 0.2, 0, 10000);
    budget_init(&b, l.window_ms);
    cr_expect_not(budget_ratio_allows(&b, &l, 5));
    budget_note_request(&b, 5);
    cr_expect_not(budget_ratio_allows(&b, &l, 5)); /* 0.2 of one attempt is not a retry */
    for (int i = 0; i < 4; i++)
        budget_note_request(&b, 5);
    cr_expect(budget_ratio_allows(&b, &l, 5)); /* five attempts: one retry */
}

Test(budget, min_retries_per_second_is_a_floor_over_the_window)
{
    struct budget_limits l = limits(-1, 0.2, 10, 10000);
    budget_init(&b, l.window_ms);
    /* 10 per second over a 10 s window: 100 retries with no traffic at all */
    cr_expect_eq(allowed_retries(&l, 0, 1000), 100);
    /* plus 0.2 of 50 first attempts */
    for (int i = 0; i < 50; i++)
        budget_note_request(&b, 0);
    cr_expect_eq(allowed_retries(&l, 0, 1000), 10);
}

Test(budget, counts_slide_out_of_the_window)
{
    struct budget_limits l = limits(-1, 1.0, 0, 1000); /* 20 buckets of 50 ms */
    budget_init(&b, l.window_ms);
    for (int i = 0; i < 10; i++)
        budget_note_request(&b, 10000); /* slice 200 */
    for (int i = 0; i < 10; i++)
        budget_note_request(&b, 10500); /* slice 210 */
    cr_expect_eq(budget_window_requests(&b, 10500), 20);
    cr_expect_eq(budget_window_requests(&b, 10999), 20); /* slice 219: both still inside */
    cr_expect_eq(budget_window_requests(&b, 11000), 10); /* slice 220: 200 is 20 slices old */
    cr_expect_eq(budget_window_requests(&b, 11499), 10);
    cr_expect_eq(budget_window_requests(&b, 11500), 0);
    /* a stale bucket is restarted, not added to */
    budget_note_request(&b, 20000); /* slice 400 lands in the bucket of slice 200 */
    cr_expect_eq(budget_window_requests(&b, 20000), 1);
}

Test(budget, retries_age_out_and_free_the_ratio_again)
{
    struct budget_limits l = limits(-1, 0.5, 0, 1000);
    budget_init(&b, l.window_ms);
    for (int i = 0; i < 10; i++)
        budget_note_request(&b, 0);
    cr_expect_eq(allowed_retries(&l, 0, 100), 5);
    cr_expect_eq(allowed_retries(&l, 900, 100), 0);
    for (int i = 0; i < 10; i++)
        budget_note_request(&b, 1000); /* the old window is gone: fresh budget */
    cr_expect_eq(allowed_retries(&l, 1000, 100), 5);
}

Test(budget, concurrency_cap_counts_until_release)
{
    budget_init(&b, 1000);
    cr_expect(budget_acquire(&b, 2));
    cr_expect(budget_acquire(&b, 2));
    cr_expect_not(budget_acquire(&b, 2));
    cr_expect_eq(budget_in_flight(&b), 2);
    budget_release(&b);
    cr_expect(budget_acquire(&b, 2));
    cr_expect_not(budget_acquire(&b, 0 + 2));
    cr_expect(budget_acquire(&b, -1)); /* no cap */
    cr_expect_eq(budget_in_flight(&b), 3);
    cr_expect_not(budget_acquire(&b, 0)); /* a cap of 0 allows no retry at all */
}

Test(budget, changing_the_window_keeps_counting)
{
    budget_init(&b, 10000);
    budget_note_request(&b, 100000);
    budget_set_window(&b, 2000);
    budget_note_request(&b, 100000);
    budget_note_request(&b, 100001);
    cr_expect_eq(budget_window_requests(&b, 100001), 2);
}

struct hammer {
    int64_t max;
    atomic_int_fast64_t seen_max;
    atomic_bool stop;
};
static struct hammer h;

static void *acquirer(void *arg)
{
    (void)arg;
    for (int i = 0; i < 200000; i++) {
        if (budget_acquire(&b, h.max))
            budget_release(&b);
        budget_note_request(&b, 42);
    }
    return NULL;
}

static void *observer(void *arg)
{
    (void)arg;
    while (!atomic_load(&h.stop)) {
        int_fast64_t n = budget_in_flight(&b);
        if (n > atomic_load(&h.seen_max))
            atomic_store(&h.seen_max, n);
    }
    return NULL;
}

Test(budget, many_threads_never_pass_the_cap_and_count_exactly)
{
    budget_init(&b, 10000);
    h.max = 3;
    atomic_store(&h.seen_max, 0);
    atomic_store(&h.stop, false);
    pthread_t t[4], o;
    pthread_create(&o, NULL, observer, NULL);
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, acquirer, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    atomic_store(&h.stop, true);
    pthread_join(o, NULL);
    cr_expect_leq(atomic_load(&h.seen_max), 3, "saw %lld in flight",
                  (long long)atomic_load(&h.seen_max));
    cr_expect_eq(budget_in_flight(&b), 0);
    cr_expect_eq(budget_window_requests(&b, 42), 4 * 200000);
}
