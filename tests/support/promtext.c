#include "tests/support/promtext.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Past the label pair ('name="value"', escapes kept) at p, or NULL if malformed. */
static const char *pair_end(const char *p)
{
    p += strcspn(p, "=\"},\n");
    if (p[0] != '=' || p[1] != '"')
        return NULL;
    for (p += 2; *p && *p != '"' && *p != '\n'; p++)
        if (*p == '\\' && p[1])
            p++;
    return *p == '"' ? p + 1 : NULL;
}

/* Whether the labels at 'have' (past its '{') hold the pair [pair, pair + n); *end is past
 * the closing '}', NULL if the labels are malformed. */
static bool has_pair(const char *have, const char *pair, size_t n, const char **end)
{
    bool found = false;
    const char *p = have;
    *end = NULL;
    while (*p && *p != '}') {
        const char *e = pair_end(p);
        if (!e)
            return false;
        found |= (size_t)(e - p) == n && memcmp(p, pair, n) == 0;
        p = *e == ',' ? e + 1 : e;
    }
    if (*p == '}')
        *end = p + 1;
    return found && *end;
}

double prom_sum(const char *text, const char *series)
{
    size_t nl = strcspn(series, "{");
    const char *want = series[nl] == '{' ? series + nl + 1 : "}";
    double sum = NAN;
    for (const char *line = text; line && *line;) {
        const char *next = strchr(line, '\n');
        if (line[0] != '#' && strncmp(line, series, nl) == 0 &&
            (line[nl] == '{' || line[nl] == ' ')) {
            const char *v = line + nl;
            bool all = true;
            if (*v == '{') {
                const char *end = NULL;
                has_pair(v + 1, "", 0, &end); /* where the line's labels end */
                for (const char *w = want; all && *w && *w != '}';) {
                    const char *we = pair_end(w);
                    const char *ignored;
                    all = we && has_pair(v + 1, w, (size_t)(we - w), &ignored);
                    w = we && *we == ',' ? we + 1 : we;
                }
                v = end;
            } else {
                all = *want == '}';
            }
            if (all && v && *v == ' ')
                sum = (isnan(sum) ? 0 : sum) + strtod(v + 1, NULL);
        }
        line = next ? next + 1 : NULL;
    }
    return sum;
}
