#include "tests/support/cfgb.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/fixture.h"

struct cfgb {
    json_t *root;   /* the config object; "routes" is its last member unless cfgb_top adds more */
    json_t *routes; /* borrowed from root */
};

/* "{" + the printf'd members + "}", parsed (a new reference). Fails the test if it does not
 * parse: the fragment is the test's own text. */
static json_t *members(const char *fmt, va_list ap)
{
    char *text = NULL;
    cr_assert_geq(vasprintf(&text, fmt, ap), 0, "vasprintf");
    size_t n = strlen(text);
    char *obj = malloc(n + 3);
    cr_assert_not_null(obj);
    obj[0] = '{';
    memcpy(obj + 1, text, n);
    obj[n + 1] = '}';
    obj[n + 2] = '\0';
    json_error_t err;
    json_t *j = json_loads(obj, JSON_REJECT_DUPLICATES, &err);
    cr_assert_not_null(j, "config members do not parse (%s at column %d): %s", err.text,
                       err.column - 1, text);
    free(obj);
    free(text);
    return j;
}

struct cfgb *cfgb_new(void)
{
    struct cfgb *b = calloc(1, sizeof(*b));
    cr_assert_not_null(b);
    b->root = json_object();
    b->routes = json_array();
    json_object_set_new(b->root, "routes", b->routes);
    return b;
}

void cfgb_top(struct cfgb *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    json_t *m = members(fmt, ap);
    va_end(ap);
    /* top-level members read best before "routes": move it to the end */
    json_incref(b->routes);
    json_object_del(b->root, "routes");
    cr_assert_eq(json_object_update_recursive(b->root, m), 0);
    json_object_set_new(b->root, "routes", b->routes);
    json_decref(m);
}

void cfgb_route(struct cfgb *b, const char *name, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    json_t *m = members(fmt, ap);
    va_end(ap);
    json_t *r = json_object();
    json_object_set_new(r, "name", json_string(name));
    if (!json_object_get(m, "upstreams")) {
        cr_assert_not_null(fx_up(0), "cfgb_route: no upstream running for route %s", name);
        json_t *ups = json_array();
        json_array_append_new(ups, json_string(fx_up_url(0)));
        json_object_set_new(r, "upstreams", ups);
    }
    cr_assert_eq(json_object_update_recursive(r, m), 0);
    json_array_append_new(b->routes, r);
    json_decref(m);
}

char *cfgb_text(struct cfgb *b)
{
    char *text = json_dumps(b->root, JSON_PRESERVE_ORDER);
    cr_assert_not_null(text);
    json_decref(b->root);
    free(b);
    return text;
}

char *cfg_r(const char *top, const char *route)
{
    struct cfgb *b = cfgb_new();
    cfgb_top(b, "%s", top);
    cfgb_route(b, "r", "%s", route);
    return cfgb_text(b);
}

void cfg_write_in_place(const char *path, const char *text, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
    for (size_t done = 0; done < len;) {
        ssize_t w = write(fd, text + done, len - done);
        cr_assert_gt(w, 0, "write %s: %s", path, strerror(errno));
        done += (size_t)w;
    }
    cr_assert_eq(close(fd), 0);
}

void cfg_write_renamed(const char *path, const char *text)
{
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%s.swp", path);
    cfg_write_in_place(tmp, text, strlen(text));
    cr_assert_eq(rename(tmp, path), 0, "rename: %s", strerror(errno));
}
