/* The container image's runtime stage against the binary its build stage makes. Run from the
 * repository root (make test does).
 *
 * The Dockerfile ($RETRYPROXY_DOCKERFILE, else ./Dockerfile) is read for what its build stage
 * copies from the context (COPY) and the make arguments of its `RUN make ...` line, and for the
 * packages its runtime stage (the last) installs with `apt-get install`. The binary is built
 * here once as the build stage would: those files copied into a temporary directory, which
 * stands for the WORKDIR, and make run there with those arguments (a few seconds to 20). Every
 * shared library `ldd` finds for it must come (`dpkg -S`) from a package the runtime image has:
 * - one the runtime stage installs, or one those depend on, recursively (Pre-Depends and
 *   Depends of the installed packages, from dpkg-query; of alternatives, the one installed
 *   here);
 * - one of priority required or Essential, which debian:12-slim already has, or one those
 *   depend on.
 * This machine stands in for the image: its Debian release must be the image's, and a runtime
 * package that is not installed here counts without its dependencies.
 *
 * The check is shown to fail as well: without libcurl4 in the runtime list, it must report
 * libcurl.so.4. To try another Dockerfile (one with a package dropped, say):
 *   RETRYPROXY_DOCKERFILE=/tmp/Dockerfile build/tests/cli/test_packaging
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/proc.h"

#define MAX_WORDS 128
#define MAX_LIBS  128
/* The image's release, as its FROM lines name it and /etc/os-release says it. */
#define IMAGE_RELEASE "12"

/* ---- the Dockerfile ---- */

/* Shell-like words of 'line' (double and single quotes grouped and removed), up to the first
 * "&&", ";" or "|" when 'stop' is set; malloc'd into w[], the count returned. */
static size_t split_words(const char *line, char **w, size_t cap, bool stop)
{
    size_t n = 0;
    const char *p = line;
    for (;;) {
        p += strspn(p, " \t\n");
        if (!*p || n == cap)
            break;
        if (stop && (strncmp(p, "&&", 2) == 0 || *p == ';' || *p == '|'))
            break;
        char *word = malloc(strlen(p) + 1), *o = word;
        char quote = 0;
        for (; *p && (quote || !strchr(" \t\n;|&", *p)); p++) {
            if (quote && *p == quote)
                quote = 0;
            else if (!quote && (*p == '"' || *p == '\''))
                quote = *p;
            else
                *o++ = *p;
        }
        *o = '\0';
        w[n++] = word;
    }
    return n;
}

static void free_words(char **w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(w[i]);
}

struct dockerfile {
    char *text;      /* continuation lines joined */
    char *stages[8]; /* each stage's text, from its FROM line; into 'text' */
    size_t nstages;
    char *make_args[MAX_WORDS]; /* the build stage's make arguments (targets and VAR=VALUE) */
    size_t nmake;
    char *runtime[MAX_WORDS]; /* what the runtime stage's apt-get install names */
    size_t nruntime;
    char *copies[32]; /* the build stage's COPY lines from the context, after "COPY " */
    size_t ncopies;
    char workdir[PATH_MAX]; /* the build stage's WORKDIR */
    char copied[PATH_MAX];  /* what the runtime stage copies from the build stage */
};

static const char *dockerfile_path(void)
{
    const char *d = getenv("RETRYPROXY_DOCKERFILE");
    return d && *d ? d : "Dockerfile";
}

/* The words after the next command 'cmd' in 'instr' from *at on, up to the end of that command
 * (malloc'd into w); *at moves past it. 0 when there is none left. */
static size_t next_command(const char *instr, const char **at, const char *cmd, char **w,
                           size_t cap)
{
    size_t cl = strlen(cmd);
    while ((*at = strstr(*at, cmd)) != NULL) {
        bool start = *at == instr || strchr(" \t&;|", (*at)[-1]);
        *at += cl;
        if (start && ((*at)[0] == ' ' || (*at)[0] == '\t')) {
            size_t n = split_words(*at, w, cap, true);
            if (n)
                return n;
        }
    }
    *at = instr + strlen(instr);
    return 0;
}

static void dockerfile_load(struct dockerfile *d, const char *path)
{
    memset(d, 0, sizeof(*d));
    d->text = proc_read_file(path);
    cr_assert(*d->text, "%s: missing or empty", path);
    /* Join continuation lines, drop comment lines. */
    for (char *s = d->text; (s = strstr(s, "\\\n")) != NULL;)
        s[0] = s[1] = ' ';
    for (char *s = d->text; *s;) {
        char *eol = strchrnul(s, '\n');
        if (s[strspn(s, " \t")] == '#')
            memset(s, ' ', (size_t)(eol - s));
        s = *eol ? eol + 1 : eol;
    }
    /* Split into stages at each FROM instruction. */
    for (char *s = d->text; *s;) {
        char *eol = strchrnul(s, '\n');
        if (strncmp(s, "FROM ", 5) == 0) {
            cr_assert_lt(d->nstages, 8);
            if (d->nstages)
                s[-1] = '\0';
            d->stages[d->nstages++] = s;
        }
        s = *eol ? eol + 1 : eol;
    }
    cr_assert_geq(d->nstages, 2, "%s: not a multi-stage build", path);

    /* Build stage: the one whose RUN line runs make. */
    for (size_t st = 0; st + 1 < d->nstages && !d->nmake; st++) {
        for (char *line = d->stages[st]; line && *line;) {
            char *eol = strchrnul(line, '\n');
            char save = *eol;
            *eol = '\0';
            if (strncmp(line, "COPY ", 5) == 0 && !strstr(line, "--from=") && d->ncopies < 32)
                d->copies[d->ncopies++] = strdup(line + 5);
            if (strncmp(line, "WORKDIR ", 8) == 0)
                snprintf(d->workdir, sizeof(d->workdir), "%s", line + 8 + strspn(line + 8, " "));
            const char *at = line;
            if (strncmp(line, "RUN ", 4) == 0 && !d->nmake)
                d->nmake = next_command(line, &at, "make", d->make_args, MAX_WORDS);
            *eol = save;
            line = save ? eol + 1 : NULL;
        }
    }
    cr_assert_gt(d->nmake, 0, "%s: no `RUN make ...` in a build stage", path);

    /* Runtime stage: the last. */
    char *rt = d->stages[d->nstages - 1];
    for (char *line = rt; line && *line;) {
        char *eol = strchrnul(line, '\n');
        char save = *eol;
        *eol = '\0';
        const char *at = line;
        char *w[MAX_WORDS];
        size_t n;
        while (strncmp(line, "RUN ", 4) == 0 &&
               (n = next_command(line, &at, "apt-get", w, MAX_WORDS)) > 0) {
            for (size_t i = 1; strcmp(w[0], "install") == 0 && i < n; i++)
                if (w[i][0] != '-' && d->nruntime < MAX_WORDS)
                    d->runtime[d->nruntime++] = strdup(w[i]);
            free_words(w, n);
        }
        if (strncmp(line, "COPY --from=", 12) == 0) {
            char *cw[8];
            size_t cn = split_words(line + 4, cw, 8, false);
            if (cn >= 3)
                snprintf(d->copied, sizeof(d->copied), "%s", cw[1]);
            free_words(cw, cn);
        }
        *eol = save;
        line = save ? eol + 1 : NULL;
    }
    cr_assert_gt(d->nruntime, 0, "%s: the runtime stage installs no package with apt-get", path);
}

static void dockerfile_free(struct dockerfile *d)
{
    free_words(d->make_args, d->nmake);
    free_words(d->runtime, d->nruntime);
    free_words(d->copies, d->ncopies);
    free(d->text);
}

/* ---- the installed packages ---- */

struct pkg {
    char *name;
    char *provides; /* ", a, b," with versions removed */
    char *depends;  /* Pre-Depends, Depends as dpkg prints them */
    bool installed, base, in_image;
};

struct pkgs {
    struct pkg *p;
    size_t n, cap;
};

static struct pkg *pkg_find(struct pkgs *db, const char *name)
{
    for (size_t i = 0; i < db->n; i++)
        if (strcmp(db->p[i].name, name) == 0)
            return &db->p[i];
    return NULL;
}

/* The installed package 'name' means: itself, or one that provides it. */
static struct pkg *pkg_resolve(struct pkgs *db, const char *name)
{
    struct pkg *p = pkg_find(db, name);
    if (p && p->installed)
        return p;
    char pat[256];
    snprintf(pat, sizeof(pat), ", %s,", name);
    for (size_t i = 0; i < db->n; i++)
        if (db->p[i].installed && strstr(db->p[i].provides, pat))
            return &db->p[i];
    return NULL;
}

static char *field(char **s)
{
    char *f = *s, *tab = strchr(f, '\t');
    if (tab) {
        *tab = '\0';
        *s = tab + 1;
    } else {
        *s = f + strlen(f);
    }
    return f;
}

/* ", a, b, " from "a (= 1), b": names only (each name gains at most 2 bytes, ", "). */
static char *names_only(const char *list)
{
    char *out = malloc(3 * strlen(list) + 4), *o = out;
    *o++ = ',';
    *o++ = ' ';
    for (const char *p = list; *p;) {
        p += strspn(p, " ,");
        size_t n = strcspn(p, " ,(:");
        if (!n)
            break;
        memcpy(o, p, n);
        o += n;
        *o++ = ',';
        *o++ = ' ';
        p += n;
        if (*p == ':')
            p += strcspn(p, " ,(");
        if (*p == ' ')
            p += strspn(p, " ");
        if (*p == '(')
            p += strcspn(p, ")") + 1;
    }
    *o = '\0';
    return out;
}

static void pkgs_load(struct pkgs *db)
{
    char *argv[] = { "/usr/bin/dpkg-query", "-W", "-f",
                     "${Package}\t${db:Status-Abbrev}\t${Priority}\t${Essential}\t${Provides}\t"
                     "${Pre-Depends}, ${Depends}\n",
                     NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 60000, &r), 0, "cannot run dpkg-query");
    cr_assert_eq(r.status, 0, "dpkg-query -W: %s", r.err);
    memset(db, 0, sizeof(*db));
    char *save = NULL;
    for (char *line = strtok_r(r.out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *s = line;
        const char *name = field(&s), *status = field(&s), *prio = field(&s), *ess = field(&s);
        const char *prov = field(&s), *deps = field(&s);
        if (pkg_find(db, name)) /* another architecture of it */
            continue;
        if (db->n == db->cap) {
            db->cap = db->cap ? 2 * db->cap : 1024;
            db->p = realloc(db->p, db->cap * sizeof(*db->p));
            cr_assert_not_null(db->p);
        }
        struct pkg *p = &db->p[db->n++];
        memset(p, 0, sizeof(*p));
        p->name = strdup(name);
        p->installed = strncmp(status, "ii", 2) == 0;
        p->base = p->installed && (strcmp(prio, "required") == 0 || strcmp(ess, "yes") == 0);
        p->provides = names_only(prov);
        p->depends = strdup(deps);
    }
    proc_result_free(&r);
}

static void pkgs_free(struct pkgs *db)
{
    for (size_t i = 0; i < db->n; i++) {
        free(db->p[i].name);
        free(db->p[i].provides);
        free(db->p[i].depends);
    }
    free(db->p);
}

/* Marks 'p' and what it depends on, recursively, as in the image. */
static void mark(struct pkgs *db, struct pkg *p)
{
    if (!p || p->in_image)
        return;
    p->in_image = true;
    char *deps = strdup(p->depends), *save = NULL;
    for (char *dep = strtok_r(deps, ",", &save); dep; dep = strtok_r(NULL, ",", &save)) {
        /* "a (>= 1) | b": the first alternative installed here, else none known. */
        char *alt_save = NULL;
        for (char *alt = strtok_r(dep, "|", &alt_save); alt; alt = strtok_r(NULL, "|", &alt_save)) {
            alt += strspn(alt, " ");
            alt[strcspn(alt, " (:")] = '\0';
            struct pkg *q = *alt ? pkg_resolve(db, alt) : NULL;
            if (q) {
                mark(db, q);
                break;
            }
        }
    }
    free(deps);
}

/* What the image would have with 'runtime' (n names, 'skip' left out if not NULL) installed. */
static void image_packages(struct pkgs *db, char **runtime, size_t n, const char *skip)
{
    for (size_t i = 0; i < db->n; i++)
        db->p[i].in_image = false;
    for (size_t i = 0; i < db->n; i++)
        if (db->p[i].base)
            mark(db, &db->p[i]);
    for (size_t i = 0; i < n; i++)
        if (!skip || strcmp(runtime[i], skip) != 0)
            mark(db, pkg_resolve(db, runtime[i]));
}

/* ---- the binary's libraries ---- */

struct lib {
    char soname[128];
    char path[PATH_MAX];
    char pkg[128]; /* "" when no package ships it */
};

/* The libraries 'bin' links, each with the package that ships it. */
static size_t linked_libs(const char *bin, struct lib *libs, size_t cap)
{
    char *argv[] = { "/usr/bin/ldd", (char *)bin, NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 30000, &r), 0, "cannot run ldd");
    cr_assert_eq(r.status, 0, "ldd %s: %s", bin, r.err);
    size_t n = 0;
    char *save = NULL;
    for (char *line = strtok_r(r.out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        line += strspn(line, " \t");
        char *arrow = strstr(line, " => ");
        cr_assert(!strstr(line, "not found"), "ldd %s: %s", bin, line);
        const char *path = arrow ? arrow + 4 : line;
        if (*path != '/') /* linux-vdso.so.1: in the kernel */
            continue;
        cr_assert_lt(n, cap);
        struct lib *l = &libs[n++];
        memset(l, 0, sizeof(*l));
        snprintf(l->soname, sizeof(l->soname), "%.*s", (int)strcspn(line, " "), line);
        snprintf(l->path, sizeof(l->path), "%.*s", (int)strcspn(path, " "), path);
    }
    proc_result_free(&r);

    /* One dpkg -S for every path a library may be shipped under: as ldd names it, with /usr
     * added or taken away (/lib is /usr/lib on Debian 12, either may be the packaged one), and
     * the same for the file the link resolves to. */
    char *dargv[MAX_LIBS * 4 + 3];
    size_t na = 0;
    dargv[na++] = "/usr/bin/dpkg";
    dargv[na++] = "-S";
    for (size_t i = 0; i < n; i++) {
        char real[PATH_MAX];
        const char *bases[2] = { libs[i].path, realpath(libs[i].path, real) };
        for (size_t b = 0; b < 2 && bases[b]; b++) {
            dargv[na++] = strdup(bases[b]);
            char *alt;
            if (strncmp(bases[b], "/usr/", 5) == 0)
                alt = strdup(bases[b] + 4);
            else
                cr_assert(asprintf(&alt, "/usr%s", bases[b]) > 0);
            dargv[na++] = alt;
        }
    }
    dargv[na] = NULL;
    cr_assert_eq(proc_run(dargv, NULL, 60000, &r), 0, "cannot run dpkg");
    /* Each line: "pkg[:arch][, pkg2]: /path". Paths not found are reported on stderr. */
    save = NULL;
    for (char *line = strtok_r(r.out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *sep = strstr(line, ": /");
        if (!sep)
            continue;
        *sep = '\0';
        const char *path = sep + 2;
        char real[PATH_MAX];
        for (size_t i = 0; i < n; i++) {
            if (libs[i].pkg[0])
                continue;
            const char *cands[2] = { libs[i].path, realpath(libs[i].path, real) };
            for (size_t c = 0; c < 2 && cands[c] && !libs[i].pkg[0]; c++) {
                const char *a = cands[c], *b = path;
                a += strncmp(a, "/usr/", 5) == 0 ? 4 : 0;
                b += strncmp(b, "/usr/", 5) == 0 ? 4 : 0;
                if (strcmp(a, b) == 0)
                    snprintf(libs[i].pkg, sizeof(libs[i].pkg), "%.*s", (int)strcspn(line, ":,"),
                             line);
            }
        }
    }
    proc_result_free(&r);
    for (size_t i = 2; i < na; i++)
        free(dargv[i]);
    return n;
}

/* The libraries of libs[] whose package the image lacks, one per line ("" when none). */
static char *missing(struct pkgs *db, struct lib *libs, size_t n)
{
    char *out = strdup(""), *more;
    for (size_t i = 0; i < n; i++) {
        struct pkg *p = libs[i].pkg[0] ? pkg_find(db, libs[i].pkg) : NULL;
        if (p && p->in_image)
            continue;
        cr_assert(asprintf(&more, "%s  %s (%s, package %s)\n", out, libs[i].soname, libs[i].path,
                           libs[i].pkg[0] ? libs[i].pkg : "none: dpkg -S finds no owner") > 0);
        free(out);
        out = more;
    }
    return out;
}

/* ---- the build ---- */

static void run_ok(char **argv, int timeout_ms, const char *what)
{
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, timeout_ms, &r), 0, "cannot run %s", argv[0]);
    cr_assert_eq(r.status, 0, "%s failed (status %d):\n%s%s", what, r.status, r.out, r.err);
    proc_result_free(&r);
}

/* Builds the binary as the Dockerfile's build stage does: what its COPY lines take from the
 * build context (the repository: the current directory) goes into 'dir', which stands for its
 * WORKDIR, and its make line runs there. Returns the binary's path, and the make line's own
 * name for it in *target. */
static char *build_as_dockerfile(struct dockerfile *d, const char *dir, const char **target)
{
    for (size_t c = 0; c < d->ncopies; c++) {
        char *w[MAX_WORDS], *dest;
        size_t n = split_words(d->copies[c], w, MAX_WORDS, false), first = 0;
        while (first < n && strncmp(w[first], "--", 2) == 0)
            first++;
        cr_assert_geq(n - first, 2, "%s: COPY %s: no source and destination", dockerfile_path(),
                      d->copies[c]);
        const char *to = w[n - 1];
        size_t wl = strlen(d->workdir);
        if (wl && strncmp(to, d->workdir, wl) == 0 && (!to[wl] || to[wl] == '/'))
            to += wl;
        cr_assert(to[0] != '/', "%s: COPY %s: a destination outside WORKDIR %s", dockerfile_path(),
                  d->copies[c], d->workdir);
        cr_assert(asprintf(&dest, "%s/%s", dir, to) > 0);
        for (size_t i = first; i + 1 < n; i++) {
            char *argv[] = { "/bin/cp", "-a", w[i], dest, NULL };
            run_ok(argv, 60000, "cp");
        }
        free(dest);
        free_words(w, n);
    }

    /* env -u: nothing of an enclosing make (make test, make asan: MAKEFLAGS carries its
     * command-line variables, SAN= among them) or of the caller's compiler settings reaches
     * this build, which is the image's. */
    char *argv[MAX_WORDS + 24], *bin = NULL;
    size_t na = 0;
    /* make exports the variables of its own command line (make asan: BUILD, OPT, SAN) */
    const char *pre[] = {
        "/usr/bin/env",  "-u",   "MAKEFLAGS", "-u", "MFLAGS",  "-u", "MAKELEVEL", "-u",
        "MAKEOVERRIDES", "-u",   "CFLAGS",    "-u", "LDFLAGS", "-u", "CC",        "-u",
        "BUILD",         "-u",   "OPT",       "-u", "SAN",     "-u", "WERROR",    "-u",
        "TEST_JOBS",     "make", "-j2",       "-C", dir
    };
    for (size_t i = 0; i < sizeof(pre) / sizeof(pre[0]); i++)
        argv[na++] = (char *)pre[i];
    for (size_t i = 0; i < d->nmake; i++) {
        const char *a = d->make_args[i];
        if (!bin && !strchr(a, '=') && a[0] != '-') {
            cr_assert(asprintf(&bin, "%s/%s", dir, a) > 0);
            *target = a;
        }
        argv[na++] = d->make_args[i];
    }
    argv[na] = NULL;
    cr_assert_not_null(bin, "%s: the make line names no target", dockerfile_path());
    run_ok(argv, 600000, "the Dockerfile's build");
    cr_assert_eq(access(bin, X_OK), 0, "%s was not built", bin);
    return bin;
}

static bool os_release_is(const char *version)
{
    char *os = proc_read_file("/etc/os-release"), want[64];
    snprintf(want, sizeof(want), "\nVERSION_ID=\"%s\"", version);
    bool yes = strstr(os, want) != NULL;
    free(os);
    return yes;
}

/* The build's directory, removed after the test whether it passed or not. */
static char build_dir[] = "/tmp/retryproxy-image-XXXXXX";
static bool build_dir_made;

static void remove_build_dir(void)
{
    if (build_dir_made)
        rm_tree(build_dir);
}

TestSuite(packaging, .fini = remove_build_dir);

Test(packaging, image_runtime_stage_installs_every_library_the_binary_links, .timeout = 600)
{
    const char *path = dockerfile_path();
    struct dockerfile d;
    dockerfile_load(&d, path);

    /* The stand-in is only as good as its release. */
    for (size_t i = 0; i < d.nstages; i++) {
        char from[128];
        snprintf(from, sizeof(from), "%.*s", (int)strcspn(d.stages[i] + 5, " \n"), d.stages[i] + 5);
        cr_assert(strncmp(from, "debian:" IMAGE_RELEASE, 7 + strlen(IMAGE_RELEASE)) == 0,
                  "%s: stage FROM %s; this test stands in for debian:" IMAGE_RELEASE, path, from);
    }
    cr_assert(os_release_is(IMAGE_RELEASE),
              "this machine is not Debian " IMAGE_RELEASE ", the image's release: its libraries "
              "and packages say nothing of the image's");

    char *dir = build_dir;
    cr_assert_not_null(mkdtemp(dir));
    build_dir_made = true;
    const char *target;
    char *bin = build_as_dockerfile(&d, dir, &target);

    /* The runtime stage copies what the make line built. */
    char built[PATH_MAX * 2];
    snprintf(built, sizeof(built), "%s/%s", d.workdir, target);
    cr_expect_str_eq(d.copied, built, "%s: the runtime stage copies %s, the build makes %s", path,
                     d.copied, built);

    struct lib libs[MAX_LIBS];
    size_t n = linked_libs(bin, libs, MAX_LIBS);
    cr_assert_gt(n, 3, "ldd %s found %zu libraries", bin, n);

    struct pkgs db;
    pkgs_load(&db);
    image_packages(&db, d.runtime, d.nruntime, NULL);
    char *lack = missing(&db, libs, n);
    cr_expect_str_empty(
        lack, "%s: the runtime stage does not install (nor depend on) the package of:\n%s", path,
        lack);
    free(lack);

    /* And the check can fail: without libcurl4, libcurl.so.4 has no package in the image. */
    bool has_curl = false;
    for (size_t i = 0; i < d.nruntime; i++)
        has_curl |= strcmp(d.runtime[i], "libcurl4") == 0;
    if (has_curl) {
        image_packages(&db, d.runtime, d.nruntime, "libcurl4");
        lack = missing(&db, libs, n);
        cr_expect(strstr(lack, "libcurl.so.4"),
                  "with libcurl4 left out of the runtime list, libcurl.so.4 was not reported "
                  "missing (reported: \"%s\")",
                  lack);
        free(lack);
    }

    pkgs_free(&db);
    free(bin);
    dockerfile_free(&d);
}

/* ---- the configs the image ships ---- */

/* A line of the runtime stage starting with 'instr' (e.g. "EXPOSE "), from *at on: its text
 * after 'instr' (up to the line's end) in 'out'; false when there is no more. */
static bool runtime_line(const struct dockerfile *d, const char *instr, const char **at, char *out,
                         size_t cap)
{
    const char *rt = d->stages[d->nstages - 1];
    if (!*at)
        *at = rt;
    for (const char *p = *at; *p;) {
        const char *eol = strchrnul(p, '\n');
        *at = *eol ? eol + 1 : eol;
        if (strncmp(p, instr, strlen(instr)) == 0) {
            p += strlen(instr);
            snprintf(out, cap, "%.*s", (int)(eol - p), p);
            return true;
        }
        p = *at;
    }
    return false;
}

/* `retryproxy check -c FILE --print`: the effective "listen" and "admin" of FILE. */
static void config_addresses(const char *file, char *listen, char *admin, size_t cap)
{
    char *argv[] = { (char *)proc_bin(), "check", "-c", (char *)file, "--print", NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 10000, &r), 0);
    cr_assert_eq(r.status, 0, "the image's config %s does not pass check: %s%s", file, r.out,
                 r.err);
    /* "listen": "ADDR" as --print writes it (jansson, one member a line or compact) */
    const char *keys[] = { "\"listen\"", "\"admin\"" };
    char *outs[] = { listen, admin };
    for (int k = 0; k < 2; k++) {
        const char *p = strstr(r.out, keys[k]);
        cr_assert_not_null(p, "check --print of %s shows no %s", file, keys[k]);
        p = strchr(p + strlen(keys[k]), '"');
        cr_assert_not_null(p);
        snprintf(outs[k], cap, "%.*s", (int)strcspn(p + 1, "\""), p + 1);
    }
    proc_result_free(&r);
}

static unsigned port_of(const char *addr)
{
    const char *c = strrchr(addr, ':');
    return c ? (unsigned)atoi(c + 1) : 0;
}

/* Issue 27: the one config the image had bound both listeners to 127.0.0.1, so `docker run -p`
 * reached nothing though the Dockerfile EXPOSEs the ports. Every config the runtime stage
 * copies passes `check`; the default (CMD's -c) listens on the EXPOSEd ports; and for each
 * EXPOSEd port a shipped config listens on it on every address (docs/deploy.md, "Container
 * image"). */
Test(packaging, image_configs_pass_check_and_one_serves_the_exposed_ports)
{
    const char *path = dockerfile_path();
    struct dockerfile d;
    dockerfile_load(&d, path);

    unsigned exposed[8];
    size_t ne = 0;
    char line[512];
    const char *at = NULL;
    while (runtime_line(&d, "EXPOSE ", &at, line, sizeof(line)))
        for (char *p = line; *p && ne < 8;) {
            exposed[ne++] = (unsigned)strtoul(p, &p, 10);
            p += strspn(p, " \t");
        }
    cr_assert_gt(ne, 0, "%s: the runtime stage EXPOSEs no port", path);

    at = NULL;
    cr_assert(runtime_line(&d, "CMD ", &at, line, sizeof(line)), "%s: no CMD", path);
    const char *c = strstr(line, "\"-c\", \"");
    cr_assert_not_null(c, "%s: CMD names no -c FILE: %s", path, line);
    char dflt[256];
    snprintf(dflt, sizeof(dflt), "%.*s", (int)strcspn(c + 7, "\""), c + 7);

    bool dflt_shipped = false, served[8] = { false };
    size_t nconf = 0;
    at = NULL;
    while (runtime_line(&d, "COPY ", &at, line, sizeof(line))) {
        char src[256], dst[256];
        if (strstr(line, "--from=") || sscanf(line, "%255s %255s", src, dst) != 2 ||
            !strstr(src, ".json"))
            continue;
        char listen[128], admin[128];
        config_addresses(src, listen, admin, sizeof(listen));
        cr_log_info("%s (%s): listen %s, admin %s", dst, src, listen, admin);
        nconf++;
        const char *addrs[] = { listen, admin };
        for (int k = 0; k < 2; k++) {
            bool any = strncmp(addrs[k], "0.0.0.0:", 8) == 0 || strncmp(addrs[k], "[::]:", 5) == 0;
            for (size_t i = 0; i < ne; i++)
                served[i] |= any && port_of(addrs[k]) == exposed[i];
        }
        if (strcmp(dst, dflt) == 0) {
            dflt_shipped = true;
            for (int k = 0; k < 2; k++) {
                bool is_exposed = false;
                for (size_t i = 0; i < ne; i++)
                    is_exposed |= port_of(addrs[k]) == exposed[i];
                cr_expect(is_exposed, "%s: the default config %s listens on %s, not EXPOSEd", path,
                          src, addrs[k]);
            }
        }
    }
    cr_expect_gt(nconf, 0, "%s: the runtime stage copies no config", path);
    cr_expect(dflt_shipped, "%s: CMD's -c %s is no config the runtime stage copies", path, dflt);
    for (size_t i = 0; i < ne; i++)
        cr_expect(served[i],
                  "%s: no config of the image listens on port %u on every address (0.0.0.0): "
                  "`docker run -p %u:%u` would reach nothing",
                  path, exposed[i], exposed[i], exposed[i]);
    dockerfile_free(&d);
}

/* Issue 27: docs/deploy.md named the image's libraries without libnghttp2 and libssl. Each
 * package the runtime stage installs is named there. */
Test(packaging, deploy_md_names_every_package_of_the_image)
{
    struct dockerfile d;
    dockerfile_load(&d, dockerfile_path());
    char *doc = proc_read_file("docs/deploy.md");
    const char *sec = strstr(doc, "\n## Container image");
    cr_assert_not_null(sec, "docs/deploy.md: no \"## Container image\" section");
    const char *end = strstr(sec + 1, "\n## ");
    size_t len = end ? (size_t)(end - sec) : strlen(sec);
    for (size_t i = 0; i < d.nruntime; i++) {
        char want[160];
        snprintf(want, sizeof(want), "`%s`", d.runtime[i]);
        const char *hit = strstr(sec, want);
        cr_expect(hit && hit < sec + len,
                  "docs/deploy.md, \"Container image\": the runtime package %s is not named", want);
    }
    free(doc);
    dockerfile_free(&d);
}
