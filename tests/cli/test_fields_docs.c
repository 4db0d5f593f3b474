/* docs/forwarding.md, "Which fields cross", names in its two tables the fields the filters of
 * proxy/http/fields.c leave out: the way up's table every name the way up drops, the way down's
 * every name the way down drops, and no other field name (a name in backquotes that starts with a
 * capital letter). A name added to the code and not to the page, or the other way, fails here.
 * Run from the repository root (make test does).
 */
#include <criterion/criterion.h>

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proxy/http/fields.h"
#include "tests/support/proc.h"

#define PAGE "docs/forwarding.md"

#define MAX_NAMES 64

struct names {
    char name[MAX_NAMES][48];
    size_t n;
};

static bool has(const struct names *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcasecmp(s->name[i], name) == 0)
            return true;
    return false;
}

static void add(struct names *s, const char *name, size_t len)
{
    cr_assert_lt(s->n, MAX_NAMES);
    cr_assert_lt(len, sizeof(s->name[0]));
    memcpy(s->name[s->n], name, len);
    s->name[s->n][len] = '\0';
    if (!has(s, s->name[s->n]))
        s->n++;
}

/* The field names of the first column of the table that follows the line starting with
 * 'intro' in the section "Which fields cross". */
static void table_names(const char *text, const char *intro, struct names *out)
{
    const char *sec = strstr(text, "\n## Which fields cross\n");
    cr_assert_not_null(sec, PAGE " has no section \"Which fields cross\"");
    const char *p = strstr(sec, intro);
    cr_assert_not_null(p, PAGE ": no \"%s\" in \"Which fields cross\"", intro);
    p = strstr(p, "\n|");
    cr_assert_not_null(p);
    out->n = 0;
    for (p++; *p == '|'; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p)) {
        const char *end = strchr(p + 1, '|'); /* the first cell */
        cr_assert_not_null(end);
        for (const char *q = p; q < end; q++) {
            if (*q != '`')
                continue;
            const char *close = memchr(q + 1, '`', (size_t)(end - q - 1));
            cr_assert_not_null(close, PAGE ": unbalanced backquote");
            bool field = isupper((unsigned char)q[1]);
            for (const char *c = q + 1; c < close && field; c++)
                field = isalnum((unsigned char)*c) || *c == '-';
            if (field)
                add(out, q + 1, (size_t)(close - q - 1));
            q = close;
        }
    }
}

struct code {
    struct names up, down;
};

static void code_name(void *arg, const char *name, unsigned ways)
{
    struct code *c = arg;
    if (ways & FIELDS_UP)
        add(&c->up, name, strlen(name));
    if (ways & (FIELDS_DOWN | FIELDS_DOWN_ID))
        add(&c->down, name, strlen(name));
}

static void same(const struct names *doc, const struct names *code, const char *way)
{
    for (size_t i = 0; i < code->n; i++)
        cr_expect(has(doc, code->name[i]), PAGE ": the way %s's table lacks %s", way,
                  code->name[i]);
    for (size_t i = 0; i < doc->n; i++)
        cr_expect(has(code, doc->name[i]), PAGE ": the way %s's table names %s, which passes", way,
                  doc->name[i]);
}

Test(fields_docs, the_pages_tables_name_the_fields_each_way_leaves_out)
{
    char *text = proc_read_file(PAGE);
    cr_assert(text[0], "cannot read " PAGE " (run from the repository root)");
    struct code c = { 0 };
    fields_each(code_name, &c);
    static struct names up, down;
    table_names(text, "Never sent to the upstream", &up);
    table_names(text, "Never sent to the client", &down);
    same(&up, &c.up, "up");
    same(&down, &c.down, "down");
    free(text);
}
