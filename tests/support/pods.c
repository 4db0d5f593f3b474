#include "tests/support/pods.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "tests/support/fixture.h"

const char *pods_ip(size_t i)
{
    static char s[PODS_MAX][16];
    cr_assert_lt(i, PODS_MAX);
    snprintf(s[i], sizeof(s[i]), "127.0.0.%zu", i + 2);
    return s[i];
}

uint16_t pods_start(struct tup **pod, size_t n)
{
    uint16_t port = 0;
    for (int tries = 0; tries < 20; tries++) {
        char err[256];
        port = 0;
        size_t k = 0;
        for (; k < n; k++) {
            if (!(pod[k] = tup_try_start_at(pods_ip(k), port, NULL, NULL, err, sizeof(err))))
                break;
            port = tup_port(pod[k]);
        }
        if (k == n)
            return port;
        for (size_t i = 0; i < k; i++) {
            tup_stop(pod[i]);
            pod[i] = NULL;
        }
    }
    cr_assert_fail("no port free on every address");
    return 0;
}

json_t *pods_endpoint(const char *ip, uint16_t port)
{
    json_t *j = fx_admin_get_json("/upstreams"), *e, *found = NULL;
    json_t *r = json_array_get(json_object_get(j, "routes"), 0);
    json_t *eps = json_object_get(json_array_get(json_object_get(r, "upstreams"), 0), "endpoints");
    char addr[64];
    size_t k;
    snprintf(addr, sizeof(addr), "%s:%u", ip, port);
    json_array_foreach(eps, k, e)
    {
        if (!found && strcmp(json_str(e, "address"), addr) == 0)
            found = json_incref(e);
    }
    json_decref(j);
    return found;
}

const char *pods_state(const char *ip, uint16_t port)
{
    static char state[16];
    json_t *e = pods_endpoint(ip, port);
    snprintf(state, sizeof(state), "%s", e ? json_str(e, "state") : "");
    json_decref(e);
    return state;
}
