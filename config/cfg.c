#include "config/cfg.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/arena.h"
#include "config/jsonpos.h"
#include "config/schema.h"

/* The public struct cfg is the first member, so a snapshot is found from it. */
struct snapshot {
    struct cfg cfg;
    atomic_uint refs;
    struct arena arena;
};

static struct snapshot *snap_of(struct cfg *c)
{
    return (struct snapshot *)(void *)c;
}

/* ---- jansson's allocations ---- */

static void *(*json_malloc_fn)(size_t) = malloc;
static _Thread_local bool json_alloc_failed;
static pthread_once_t json_alloc_once = PTHREAD_ONCE_INIT;

static void *json_malloc_tracked(size_t size)
{
    void *p = json_malloc_fn(size);
    if (!p)
        json_alloc_failed = true;
    return p;
}

static void json_alloc_install(void)
{
    json_set_alloc_funcs(json_malloc_tracked, free);
}

void cfg_set_json_malloc(void *(*fn)(size_t))
{
    pthread_once(&json_alloc_once, json_alloc_install);
    json_malloc_fn = fn ? fn : malloc;
}

struct cfg *cfg_load_buffer(const char *text, size_t len, const char *source, struct cfg_errs *errs)
{
    struct jpos pos = { 0 };
    struct snapshot *s = NULL;
    json_t *root = NULL;
    size_t errs_before = errs->n + errs->dropped;

    pthread_once(&json_alloc_once, json_alloc_install);
    json_alloc_failed = false;

    /* The scanner may rewrite unrepresentable numbers, so it works on a copy. */
    char *copy = malloc(len + 1);
    if (!copy) {
        cfg_errs_add(errs, "$", 0, 0, "out of memory reading the config");
        goto out;
    }
    memcpy(copy, text, len);
    copy[len] = '\0';

    if (jpos_scan(&pos, copy, len, errs) < 0)
        goto out;

    /* JSON_DECODE_ANY: a root that is not an object is the schema's to report ("expected a
     * JSON object, got a string"), as the scanner accepts it. */
    json_error_t jerr;
    root = json_loadb(copy, len, JSON_DECODE_ANY, &jerr);
    if (!root) {
        /* Everything the scanner accepts jansson should too, unless an allocation failed;
         * report it rather than trust it. */
        if (json_alloc_failed)
            cfg_errs_add(errs, "$", 0, 0, "out of memory parsing the config");
        else
            cfg_errs_add(errs, "$", jerr.line > 0 ? (uint32_t)jerr.line : 0,
                         jerr.column > 0 ? (uint32_t)jerr.column : 0, "%s",
                         jerr.text[0] ? jerr.text : "jansson cannot load the document");
        goto out;
    }

    s = calloc(1, sizeof(*s));
    if (!s) {
        cfg_errs_add(errs, "$", 0, 0, "out of memory building the config");
        goto out;
    }
    atomic_init(&s->refs, 1);
    s->cfg.source = arena_strdup(&s->arena, source ? source : "");
    schema_build(&s->cfg, &s->arena, root, &pos, errs);
    if (json_alloc_failed)
        cfg_errs_add(errs, "$", 0, 0, "out of memory parsing the config");

out:
    if (errs->n + errs->dropped != errs_before) {
        cfg_errs_sort(errs);
        if (s) {
            arena_free(&s->arena);
            free(s);
            s = NULL;
        }
    }
    json_decref(root);
    jpos_free(&pos);
    free(copy);
    return s ? &s->cfg : NULL;
}

static const char *file_kind(mode_t mode)
{
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    return "an unknown kind of file";
}

int cfg_read_file(const char *path, char **buf, size_t *len, struct cfg_errs *errs)
{
    int rc = -1;
    char *b = NULL;
    size_t n = 0;
    /* O_NONBLOCK: opening a FIFO (or a device) for reading would otherwise wait for a writer,
     * and it is only after the open that fstat can tell what the path is. It changes nothing
     * for a regular file, the one kind read. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        cfg_errs_add(errs, "$", 0, 0, "cannot open: %s", strerror(errno));
        goto out;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        cfg_errs_add(errs, "$", 0, 0, "cannot stat: %s", strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        cfg_errs_add(errs, "$", 0, 0, "not a regular file (%s)", file_kind(st.st_mode));
        goto out;
    }
    /* Read up to one byte past the cap so an oversized file (even one still growing) is
     * recognised without trusting st_size. */
    size_t cap = CFG_MAX_FILE_BYTES + 1;
    b = malloc(cap);
    if (!b) {
        cfg_errs_add(errs, "$", 0, 0, "out of memory reading the config");
        goto out;
    }
    for (;;) {
        ssize_t got = read(fd, b + n, cap - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            cfg_errs_add(errs, "$", 0, 0, "cannot read: %s", strerror(errno));
            goto out;
        }
        if (got == 0)
            break;
        n += (size_t)got;
        if (n == cap) {
            cfg_errs_add(errs, "$", 0, 0,
                         "larger than %u MiB (%u bytes), the limit for a config file",
                         CFG_MAX_FILE_BYTES >> 20, CFG_MAX_FILE_BYTES);
            goto out;
        }
    }
    *buf = b;
    *len = n;
    b = NULL;
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    free(b);
    return rc;
}

struct cfg *cfg_load_file(const char *path, struct cfg_errs *errs)
{
    char *buf;
    size_t len;
    if (cfg_read_file(path, &buf, &len, errs) < 0)
        return NULL;
    struct cfg *c = cfg_load_buffer(buf, len, path, errs);
    free(buf);
    return c;
}

struct cfg *cfg_ref(struct cfg *c)
{
    atomic_fetch_add_explicit(&snap_of(c)->refs, 1, memory_order_relaxed);
    return c;
}

void cfg_unref(struct cfg *c)
{
    if (!c)
        return;
    struct snapshot *s = snap_of(c);
    /* acq_rel: the thread that frees sees every other holder's reads as finished. */
    if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1) {
        arena_free(&s->arena);
        free(s);
    }
}

const struct cfg_route *cfg_route_by_name(const struct cfg *c, const char *name)
{
    for (size_t i = 0; i < c->n_routes; i++)
        if (strcmp(c->routes[i].name, name) == 0)
            return &c->routes[i];
    return NULL;
}

json_t *cfg_to_json(const struct cfg *c)
{
    return schema_dump(c);
}

void cfg_write_reference(FILE *out)
{
    schema_write_reference(out);
}
