/* seed -- a delivery store filled for the operators' tests (the admin API's, the CLI's), through
 * proxy/store/store.h as the proxy's courier would leave it: two dead letters and a pending,
 * an in-flight one of route "hooks", a dead letter of route "other". The requests carry
 * credentials (SEED_SECRET, SEED_API_KEY) that no output may show.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_SEED_H
#define RETRYPROXY_TESTS_SUPPORT_SEED_H

#include <stdint.h>

#include "proxy/store/store.h"

#define SEED_SECRET  "Bearer sEcReT-ToKeN-1234"
#define SEED_API_KEY "aPi-KeY-5678"

struct seeded {
    char dead_a[STORE_ID_SIZE];  /* hooks, 503 (binary final body), the credentials */
    char dead_b[STORE_ID_SIZE];  /* hooks, 410 */
    char pending[STORE_ID_SIZE]; /* hooks, due in an hour */
    char flying[STORE_ID_SIZE];  /* hooks, in flight under a 10-minute lease */
    char other[STORE_ID_SIZE];   /* other, 500 */
    uint64_t t0, t1;             /* ms: before the first accept, after the last */
};

/* Writes a key file (64 hex digits) into 'dir'; its path (static). */
const char *seed_key_file(const char *dir);
/* Fills the store at 'path' sealing with the key of seed_key_file() (asserts). */
void seed_store(const char *path, struct seeded *s);
/* The config of a proxy on that store: store.path, key_file, sensitive_fields
 * ["X-Api-Key"], routes "hooks" and "other" to upstream 0's URL 'url' (malloc'd). */
char *seed_config(const char *path, const char *key_file, const char *url);

#endif
