#include "proxy/upstream/share.h"

#include <stdlib.h>

struct share *share_new_conn(void)
{
    struct share *s = calloc(1, sizeof(*s));
    if (s) {
        s->refs = 1;
        s->conn = true;
    }
    return s;
}

void share_ref(struct share *s)
{
    s->refs++;
}

void share_unref(struct share *s)
{
    if (s && --s->refs == 0)
        free(s);
}
