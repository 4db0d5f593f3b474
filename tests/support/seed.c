/* seed -- a delivery store filled for the operators' tests (seed.h). */
#include "tests/support/seed.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KEY_HEX "00112233445566778899aabbccddeeff0123456789abcdef0123456789abcdef"

const char *seed_key_file(const char *dir)
{
    static char p[160];
    snprintf(p, sizeof(p), "%s/store.key", dir);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fputs(KEY_HEX "\n", f);
    fclose(f);
    return p;
}

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void run(struct store_call *c, int r)
{
    cr_assert_eq(r, 0, "the store refused a call: %d", r);
    cr_assert_eq(store_call_wait(c, 30000), 0);
    cr_assert_eq(c->result, 0, "store call: %d", c->result);
}

/* Enqueues one request of 'route'; due at 'next_at' (0: now). */
static void accept_one(struct store *st, struct store_cq *q, const char *route, uint64_t next_at,
                       char id[STORE_ID_SIZE])
{
    struct store_field f[] = { { "Authorization", SEED_SECRET },
                               { "X-Api-Key", SEED_API_KEY },
                               { "Content-Type", "application/json" } };
    struct store_new d = { .route = route,
                           .method = "POST",
                           .target = "/hook",
                           .fields = f,
                           .nfields = 3,
                           .body = "{\"n\":1}",
                           .body_len = 7,
                           .next_at = next_at };
    struct store_call c = { .cq = q };
    run(&c, store_enqueue(st, &c, &d));
    memcpy(id, c.id, STORE_ID_SIZE);
    store_call_clear(&c);
}

/* Claims the one due delivery 'id' for owner "seed". */
static void claim_it(struct store *st, struct store_cq *q, const char *id)
{
    struct store_call c = { .cq = q };
    run(&c, store_claim_due(st, &c, "seed", 1));
    cr_assert_eq(c.n, 1);
    cr_assert_str_eq(c.items[0].id, id);
    store_call_clear(&c);
}

static void bury_it(struct store *st, struct store_cq *q, const char *id, int status,
                    const char *body, size_t body_len)
{
    claim_it(st, q, id);
    char head[128];
    snprintf(head, sizeof(head), "HTTP/1.1 %d Final\r\nx-why: test\r\n\r\n", status);
    struct store_attempt a = { .at_ms = wall_ms(), .duration_ms = 7, .status = status };
    snprintf(a.outcome, sizeof(a.outcome), "status");
    struct store_dead dead = { .reason = "final",
                               .head = head,
                               .head_len = strlen(head),
                               .body = body,
                               .body_len = body_len };
    struct store_call c = { .cq = q };
    run(&c, store_bury(st, &c, id, "seed", &a, &dead));
    store_call_clear(&c);
}

void seed_store(const char *path, struct seeded *s)
{
    unsigned char key[32];
    for (int i = 0; i < 32; i++) {
        unsigned v;
        sscanf(KEY_HEX + 2 * i, "%2x", &v);
        key[i] = (unsigned char)v;
    }
    static const char *const extra[] = { "X-Api-Key" };
    struct store_opts o = {
        .path = path, .lease_ms = 600000, .key = key, .sensitive = extra, .n_sensitive = 1
    };
    struct store *st = NULL;
    struct store_err err;
    cr_assert_eq(store_sqlite_open(&o, &st, &err), 0, "%s", err.msg);
    struct store_cq *q = store_cq_new();
    cr_assert_not_null(q);
    s->t0 = wall_ms();
    accept_one(st, q, "hooks", 0, s->dead_a);
    bury_it(st, q, s->dead_a, 503,
            "\xff\x00"
            "abc",
            5);
    usleep(5000); /* accepts apart in time, for the time filters */
    accept_one(st, q, "hooks", 0, s->dead_b);
    bury_it(st, q, s->dead_b, 410, "gone", 4);
    accept_one(st, q, "other", 0, s->other);
    bury_it(st, q, s->other, 500, "oops", 4);
    accept_one(st, q, "hooks", 0, s->flying);
    claim_it(st, q, s->flying);
    accept_one(st, q, "hooks", wall_ms() + 3600000, s->pending);
    s->t1 = wall_ms() + 1;
    store_close(st);
    store_cq_free(q);
}

char *seed_config(const char *path, const char *key_file, const char *url)
{
    char *j = NULL;
    cr_assert(asprintf(&j,
                       "{\"store\": {\"path\": \"%s\", \"key_file\": \"%s\","
                       " \"sensitive_fields\": [\"X-Api-Key\"]},"
                       " \"routes\": [{\"name\": \"hooks\", \"match\": {\"path_prefix\": \"/h\"},"
                       " \"upstreams\": [\"%s\"]},"
                       " {\"name\": \"other\", \"match\": {\"path_prefix\": \"/\"},"
                       " \"upstreams\": [\"%s\"]}]}",
                       path, key_file, url, url) > 0);
    return j;
}
