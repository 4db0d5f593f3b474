#include "proxy/ops/simulate.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "proxy/core/decide.h"
#include "proxy/base/escape.h"

/* The largest millisecond value the options take: a day, as the config's own (MS_MAX). */
#define MS_MAX 86400000ull

/* One row of the table: a policy and what the engine made of it. */
struct row {
    const char *label; /* "route", or the --policy SPEC as given */
    struct backoff_spec backoff;
    struct sim_result res;
};

static int load_policy(const struct cfg *c, const struct cfg_route *route, size_t index,
                       const char *spec, struct backoff_spec *out, FILE *err);
static void print_table(FILE *out, const struct row *rows, size_t n);
static int write_svg(FILE *f, const char *path, const struct row *rows, size_t n, FILE *err);

int simulate_run(const struct cfg *c, const struct cfg_route *route, const struct simulate_opts *o,
                 FILE *out, FILE *err)
{
    int rc = 1;
    size_t n = 1 + o->n_policies, done = 0;
    FILE *svg = NULL;
    struct row *rows = calloc(n, sizeof(*rows));
    if (!rows) {
        fputs("retryproxy: out of memory\n", err);
        return 1;
    }
    rows[0].label = "route";
    rows[0].backoff = route->retry.backoff;
    int bad = 0;
    for (size_t i = 0; i < o->n_policies; i++) {
        rows[1 + i].label = o->policies[i];
        bad |= load_policy(c, route, i + 1, o->policies[i], &rows[1 + i].backoff, err) != 0;
    }
    if (bad)
        goto out;
    /* before anything is printed: a run that cannot write its SVG prints nothing */
    if (o->svg_path && !(svg = fopen(o->svg_path, "w"))) {
        fprintf(err, "retryproxy: %s: cannot write: %s\n", o->svg_path, strerror(errno));
        goto out;
    }

    /* The upstream's failures are 503s: whether the route retries one is its retry_on and,
     * as the request is a GET, its methods (docs/config.md "retry"). */
    struct sim_policy p = {
        .max_attempts = route->retry.max_attempts,
        .timeout_ms = route->timeout_ms,
        .retryable = retry_match(&route->retry, RETRY_OUT_STATUS, 503, NULL, -1) != NULL &&
                     (route->retry.methods & CFG_METHOD_GET),
        .retry_after_honor = route->retry.retry_after_honor,
        .retry_after_max_ms = route->retry.retry_after_max_ms,
        .global = c->budget,
        .route = route->budget,
    };
    struct sim_load load = { o->clients, o->requests, o->svg_path != NULL };
    for (; done < n; done++) {
        struct rng rng;
        rng_seed(&rng, o->seed); /* every policy meets the same seed */
        p.backoff = rows[done].backoff;
        if (sim_run(&p, &o->upstream, &load, &rng, &rows[done].res) < 0) {
            fputs("retryproxy: out of memory\n", err);
            goto out;
        }
    }
    print_table(out, rows, n);
    if (svg) {
        int w = write_svg(svg, o->svg_path, rows, n, err);
        svg = NULL; /* closed */
        if (w < 0)
            goto out;
    }
    rc = 0;
out:
    if (svg)
        fclose(svg);
    for (size_t i = 0; i < done; i++)
        sim_result_free(&rows[i].res);
    free(rows);
    return rc;
}

/* ---- the option values ---- */

/* A whole decimal number of at most 'max'; the end of it in *end. -1 if there is none. */
static int parse_whole(const char *s, unsigned long long max, unsigned long long *v,
                       const char **end)
{
    unsigned long long x = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (x > (max - d) / 10)
            return -1;
        x = x * 10 + d;
    }
    if (p == s)
        return -1;
    *v = x;
    *end = p;
    return 0;
}

const char *simulate_parse_outage(const char *s, struct sim_upstream *u)
{
    unsigned long long a, b;
    const char *p;
    if (parse_whole(s, MS_MAX, &a, &p) < 0 || *p != '-' || parse_whole(p + 1, MS_MAX, &b, &p) < 0 ||
        *p)
        return "must be START_MS-END_MS, whole milliseconds from 0 to 86400000";
    if (a >= b)
        return "must end after it starts (START_MS-END_MS)";
    u->outage_start_ms = a;
    u->outage_end_ms = b;
    return NULL;
}

const char *simulate_parse_failure_rate(const char *s, struct sim_upstream *u)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    /* plain decimals only: no hex, inf or nan, no leading space or sign */
    if (!(*s >= '0' && *s <= '9') || *end || errno || !(v >= 0 && v <= 1))
        return "must be a number from 0 to 1";
    u->failure_rate = v;
    return NULL;
}

const char *simulate_parse_capacity(const char *s, struct sim_upstream *u)
{
    unsigned long long n, w;
    const char *p;
    if (parse_whole(s, UINT32_MAX, &n, &p) < 0 || *p != '/' ||
        parse_whole(p + 1, MS_MAX, &w, &p) < 0 || *p || n == 0 || w == 0)
        return "must be N/WINDOW_MS, N calls from 1 per window of 1 to 86400000 ms";
    u->capacity = (uint32_t)n;
    u->capacity_window_ms = (uint32_t)w;
    return NULL;
}

/* ---- --policy: the config's own rules ---- */

/* Validates --policy number 'index' ('spec', a JSON object of backoff keys) merged over the
 * route's backoff, by loading a config that holds the merged object as its one route's
 * retry.backoff: every rule of the schema table applies, unknown keys and cross-key checks
 * included. Errors are printed as "--policy N: $.key: message" ($ being the object). 0, or
 * -1 when it was rejected. */
static int load_policy(const struct cfg *c, const struct cfg_route *route, size_t index,
                       const char *spec, struct backoff_spec *out, FILE *err)
{
    int rc = -1;
    json_t *effective = NULL, *doc = NULL;
    char *text = NULL;
    struct cfg *pc = NULL;
    struct cfg_errs errs;
    cfg_errs_init(&errs);

    json_error_t jerr;
    json_t *given = json_loads(spec, JSON_REJECT_DUPLICATES, &jerr);
    if (!given) {
        fprintf(err, "--policy %zu: $: invalid JSON at column %d: %s\n", index, jerr.column,
                jerr.text);
        goto report;
    }
    /* The route's backoff as the effective config shows it, every key present. */
    effective = cfg_to_json(c);
    json_t *backoff =
        json_object_get(json_object_get(json_array_get(json_object_get(effective, "routes"),
                                                       (size_t)(route - c->routes)),
                                        "retry"),
                        "backoff");
    json_t *merged = json_is_object(given) ? json_deep_copy(backoff) : json_incref(given);
    if (json_is_object(given))
        json_object_update(merged, given);
    doc = json_pack("{s:[{s:s, s:[s], s:{s:o}}]}", "routes", "name", "policy", "upstreams",
                    "http://127.0.0.1:9", "retry", "backoff", merged);
    text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    if (!text) {
        fputs("retryproxy: out of memory\n", err);
        goto out;
    }
    pc = cfg_load_buffer(text, strlen(text), "--policy", &errs);
    if (pc) {
        *out = pc->routes[0].retry.backoff;
        rc = 0;
        goto out;
    }
    static const char prefix[] = "$.routes[0].retry.backoff";
    for (size_t i = 0; i < errs.n; i++) {
        const char *path = errs.v[i].path;
        if (strncmp(path, prefix, sizeof(prefix) - 1) == 0)
            fprintf(err, "--policy %zu: $%s: %s\n", index, path + sizeof(prefix) - 1,
                    errs.v[i].msg);
        else
            fprintf(err, "--policy %zu: %s: %s\n", index, path, errs.v[i].msg);
    }
report:
    fprintf(err, "retryproxy: --policy %zu: %zu error%s\n", index,
            given ? errs.n + errs.dropped : 1, given && errs.n + errs.dropped != 1 ? "s" : "");
out:
    cfg_unref(pc);
    cfg_errs_clear(&errs);
    free(text);
    json_decref(doc);
    json_decref(effective);
    json_decref(given);
    return rc;
}

/* ---- the table ---- */

static const char *const columns[] = {
    "calls",         "calls/req",          "success", "p50_ms", "p90_ms", "p99_ms", "max_ms",
    "denied_budget", "denied_concurrency",
};
#define N_COLUMNS (sizeof(columns) / sizeof(columns[0]))

/* One header line, then one line per policy: the label left-aligned in a column as wide as the
 * longest, then each number right-aligned under its heading, two spaces apart. */
static void print_table(FILE *out, const struct row *rows, size_t n)
{
    int w = (int)strlen("policy");
    for (size_t i = 0; i < n; i++)
        if ((int)strlen(rows[i].label) > w)
            w = (int)strlen(rows[i].label);
    fprintf(out, "%-*s", w, "policy");
    for (size_t k = 0; k < N_COLUMNS; k++)
        fprintf(out, "  %s", columns[k]);
    fputc('\n', out);
    for (size_t i = 0; i < n; i++) {
        const struct sim_result *r = &rows[i].res;
        char cell[N_COLUMNS][32];
        snprintf(cell[0], sizeof cell[0], "%llu", (unsigned long long)r->calls);
        snprintf(cell[1], sizeof cell[1], "%.2f", (double)r->calls / (double)r->requests);
        snprintf(cell[2], sizeof cell[2], "%.1f%%",
                 100.0 * (double)r->succeeded / (double)r->requests);
        snprintf(cell[3], sizeof cell[3], "%llu", (unsigned long long)r->p50_ms);
        snprintf(cell[4], sizeof cell[4], "%llu", (unsigned long long)r->p90_ms);
        snprintf(cell[5], sizeof cell[5], "%llu", (unsigned long long)r->p99_ms);
        snprintf(cell[6], sizeof cell[6], "%llu", (unsigned long long)r->max_ms);
        snprintf(cell[7], sizeof cell[7], "%llu", (unsigned long long)r->stopped[SIM_STOP_BUDGET]);
        snprintf(cell[8], sizeof cell[8], "%llu",
                 (unsigned long long)r->stopped[SIM_STOP_CONCURRENCY]);
        fprintf(out, "%-*s", w, rows[i].label);
        for (size_t k = 0; k < N_COLUMNS; k++)
            fprintf(out, "  %*s", (int)strlen(columns[k]), cell[k]);
        fputc('\n', out);
    }
}

/* ---- the SVG ---- */

#define SVG_W           800
#define SVG_LEFT        70 /* room for the y labels */
#define SVG_RIGHT       20
#define SVG_TOP         30   /* the title */
#define SVG_PANEL       170  /* one policy's panel: its title, plot and x labels */
#define SVG_PLOT        110  /* the plot inside a panel */
#define SVG_BUCKETS     100  /* about this many time buckets in the shortest run's panel */
#define SVG_MAX_BUCKETS 5000 /* at most this many in any panel */

static const char *const colors[] = {
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
};

/* The smallest of 1, 2, 5, 10, 20, 50 ... that is at least 'x'. */
static uint64_t nice_step(uint64_t x)
{
    uint64_t p = 1;
    for (;;) {
        if (p >= x)
            return p;
        if (2 * p >= x)
            return 2 * p;
        if (5 * p >= x)
            return 5 * p;
        p *= 10;
    }
}

/* 'text' with &, <, >, " escaped. */
static void svg_text(FILE *f, const char *text)
{
    static const char *const entities[] = { "&amp;", "&lt;", "&gt;", "&quot;" };
    escape_fputs(f, text, "&<>\"", entities);
}

/* One policy's calls over time: 'n_buckets' buckets of 'bucket' ms each, from 0 to just past
 * its last call. */
struct series {
    uint64_t bucket;
    size_t n_buckets;
    uint64_t *count; /* calls in each bucket */
    uint64_t top;
};

static uint64_t span_of(const struct sim_result *res)
{
    return res->n_calls ? res->call_ms[res->n_calls - 1] + 1 : 1;
}

/* Buckets of 'bucket' ms, coarser if that would make more than SVG_MAX_BUCKETS. */
static int series_of(const struct sim_result *res, uint64_t bucket, struct series *s)
{
    uint64_t span = span_of(res);
    if (span / bucket > SVG_MAX_BUCKETS)
        bucket = nice_step((span + SVG_MAX_BUCKETS - 1) / SVG_MAX_BUCKETS);
    s->bucket = bucket;
    s->n_buckets = (size_t)((span + bucket - 1) / bucket);
    s->count = calloc(s->n_buckets, sizeof(*s->count));
    if (!s->count)
        return -1;
    s->top = 0;
    for (size_t k = 0; k < res->n_calls; k++) {
        uint64_t *c = &s->count[res->call_ms[k] / bucket];
        if (++*c > s->top)
            s->top = *c;
    }
    return 0;
}

/* Writes to 'f' (opened on 'path', closed here) one panel per policy, stacked: its upstream
 * calls per time bucket, each on its own time axis (a policy that synchronises its clients
 * takes far longer than one that spreads them), all with the same buckets and count axis, so
 * the waves of retries compare at a glance. Nothing is loaded from elsewhere (fonts are generic
 * families). 0, or -1 with the reason on 'err'. */
static int write_svg(FILE *f, const char *path, const struct row *rows, size_t n, FILE *err)
{
    struct series *ser = calloc(n, sizeof(*ser));
    uint64_t top = 1, shortest = UINT64_MAX;
    int rc = -1;
    for (size_t i = 0; i < n; i++)
        if (span_of(&rows[i].res) < shortest)
            shortest = span_of(&rows[i].res);
    /* one bucket width for every panel, so that their heights compare */
    uint64_t bucket = nice_step((shortest + SVG_BUCKETS - 1) / SVG_BUCKETS);
    for (size_t i = 0; ser && i < n; i++) {
        if (series_of(&rows[i].res, bucket, &ser[i]) < 0)
            goto nomem;
        if (ser[i].top > top)
            top = ser[i].top;
    }
    if (!ser)
        goto nomem;
    uint64_t ystep = nice_step((top + 3) / 4), ymax = ystep * ((top + ystep - 1) / ystep);
    double pw = SVG_W - SVG_LEFT - SVG_RIGHT, yscale = SVG_PLOT / (double)ymax;
    int height = SVG_TOP + (int)n * SVG_PANEL + 10;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            SVG_W, height, SVG_W, height);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", SVG_W, height);
    fprintf(f,
            "<text x=\"%d\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">upstream calls "
            "per %llu ms over time (ms), one panel per policy</text>\n",
            SVG_W / 2, (unsigned long long)bucket);
    for (size_t i = 0; i < n; i++) {
        const struct series *s = &ser[i];
        const char *color = colors[i % (sizeof(colors) / sizeof(colors[0]))];
        double top_y = SVG_TOP + (double)i * SVG_PANEL + 22, y0 = top_y + SVG_PLOT;
        double xscale = pw / (double)(s->n_buckets * s->bucket);
        /* the panel's title: the policy and what it cost */
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-weight=\"bold\" fill=\"%s\">", SVG_LEFT,
                top_y - 8, color);
        svg_text(f, rows[i].label);
        fprintf(f, "</text><text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%llu calls",
                SVG_W - SVG_RIGHT, top_y - 8, (unsigned long long)rows[i].res.calls);
        if (s->bucket != bucket) /* a run too long for the common buckets */
            fprintf(f, " (per %llu ms here)", (unsigned long long)s->bucket);
        fputs("</text>\n", f);
        fprintf(f,
                "<g stroke=\"black\"><line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>"
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/></g>\n",
                SVG_LEFT, y0, SVG_W - SVG_RIGHT, y0, SVG_LEFT, top_y, SVG_LEFT, y0);
        for (uint64_t v = 0; v <= ymax; v += ystep) {
            double y = y0 - (double)v * yscale;
            fprintf(f,
                    "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                    "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%llu</text>\n",
                    SVG_LEFT, y, SVG_W - SVG_RIGHT, y, SVG_LEFT - 6, y + 4, (unsigned long long)v);
        }
        uint64_t xstep = nice_step((s->n_buckets * s->bucket + 5) / 6);
        for (uint64_t t = 0; t <= s->n_buckets * s->bucket; t += xstep) {
            double x = SVG_LEFT + (double)t * xscale;
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
                    "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%llu</text>\n",
                    x, y0, x, y0 + 5, x, y0 + 18, (unsigned long long)t);
        }
        /* each bucket's count at the middle of the bucket */
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
        for (size_t k = 0; k < s->n_buckets; k++)
            fprintf(f, "%s%.1f,%.1f", k ? " " : "",
                    SVG_LEFT + ((double)k + 0.5) * (double)s->bucket * xscale,
                    y0 - (double)s->count[k] * yscale);
        fputs("\"/>\n", f);
    }
    fputs("</svg>\n", f);
    if (ferror(f) | fclose(f))
        goto fail;
    rc = 0;
    goto out;
nomem:
    fclose(f);
    fputs("retryproxy: out of memory\n", err);
    goto out;
fail:
    fprintf(err, "retryproxy: %s: cannot write: %s\n", path, strerror(errno));
out:
    for (size_t i = 0; ser && i < n; i++)
        free(ser[i].count);
    free(ser);
    return rc;
}
