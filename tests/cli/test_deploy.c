/* The deployment examples under deploy/ against what the proxy needs from them. Run from the
 * repository root (make test does).
 *
 * Kubernetes, three variants of one Deployment (docs/deploy.md):
 * - native: deploy/kubernetes, retryproxy in initContainers with restartPolicy: Always
 *   (Kubernetes 1.29+), started before the application and stopped after it;
 * - legacy: deploy/kubernetes-legacy, an overlay of the first whose pod spec replaces the
 *   native one whole ("$patch: replace"), retryproxy a plain second container;
 * - headless: deploy/kubernetes-headless, an overlay of the first with its own config and a
 *   gRPC backend behind a headless Service that the config's route names (docs/endpoints.md);
 * - postgres: deploy/kubernetes-postgres, an overlay of the first whose config shares one
 *   PostgreSQL store (docs/delivery.md), the password's Secret mounted where password_file
 *   reads it, and a Job running `retryproxy store migrate` on the same config and Secret.
 * Each variant's own deployment.yaml is parsed (libyaml) and, where kubectl is installed, so is
 * what `kubectl kustomize` renders from it. The properties checked, on each:
 * - the proxy's config is mounted as a directory (no subPath anywhere: kubelet never updates a
 *   subPath copy, so hot reload would see nothing) holding the file given to -c;
 * - every probe of the proxy, the declared container ports and the Prometheus annotation use
 *   the admin port of the mounted config, which listens beyond loopback (kubelet probes from
 *   the node), and the proxy port is not declared;
 * - terminationGracePeriodSeconds is above the preStop wait plus drain_timeout_ms plus the one
 *   second that responses still streaming get (docs/logs.md#signals-and-shutdown);
 * - the proxy runs as non-root with a read-only root file system, no privilege escalation and
 *   every capability dropped.
 * The mounted config is found the way kubelet would: the -c path's directory, its volume, the
 * ConfigMap's name, then the kustomization's configMapGenerator that makes it (or, rendered,
 * the ConfigMap's data). A key the config leaves out takes its default from docs/config.md.
 *
 * systemd: deploy/systemd/retryproxy.service, its properties from the unit file, and
 * `systemd-analyze verify` where installed.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "tests/support/proc.h"

#define CONFIG_MD      "docs/config.md"
#define DEFAULT_CONFIG "/etc/retryproxy/config.json" /* without -c or $RETRYPROXY_CONFIG */
#define MAX_DOCS       16
/* Kubernetes' default when a pod spec does not set terminationGracePeriodSeconds. */
#define DEFAULT_GRACE_S 30
/* After drain_timeout_ms, responses still streaming get one more second. */
#define STREAM_GRACE_MS 1000

/* ---- YAML: a loaded stream of documents and a few ways into it ---- */

struct yaml {
    yaml_document_t docs[MAX_DOCS];
    int n;
};

/* A node together with its document, so lookups need one argument. */
struct ynode {
    yaml_document_t *doc;
    yaml_node_t *node; /* NULL: absent */
};

/* Loads every document of 'text' ('what' names it in failures). */
static void yaml_load(struct yaml *y, const char *text, const char *what)
{
    yaml_parser_t p;
    y->n = 0;
    cr_assert(yaml_parser_initialize(&p));
    yaml_parser_set_input_string(&p, (const unsigned char *)text, strlen(text));
    for (;;) {
        cr_assert_lt(y->n, MAX_DOCS, "%s: more than %d YAML documents", what, MAX_DOCS);
        yaml_document_t *d = &y->docs[y->n];
        cr_assert(yaml_parser_load(&p, d), "%s:%zu:%zu: YAML: %s", what, p.problem_mark.line + 1,
                  p.problem_mark.column + 1, p.problem ? p.problem : "error");
        if (!yaml_document_get_root_node(d)) {
            yaml_document_delete(d);
            break;
        }
        y->n++;
    }
    yaml_parser_delete(&p);
}

static void yaml_load_file(struct yaml *y, const char *path)
{
    char *text = proc_read_file(path);
    cr_assert(*text, "%s: missing or empty", path);
    yaml_load(y, text, path);
    free(text);
}

static void yaml_free(struct yaml *y)
{
    for (int i = 0; i < y->n; i++)
        yaml_document_delete(&y->docs[i]);
    y->n = 0;
}

static struct ynode y_root(struct yaml *y, int i)
{
    return (struct ynode){ &y->docs[i], yaml_document_get_root_node(&y->docs[i]) };
}

/* The scalar's text, or NULL when 'n' is absent or not a scalar. */
static const char *y_str(struct ynode n)
{
    return n.node && n.node->type == YAML_SCALAR_NODE ? (const char *)n.node->data.scalar.value
                                                      : NULL;
}

/* The value of 'key' in mapping 'n' (absent when 'n' is not a mapping or has no such key). */
static struct ynode y_get(struct ynode n, const char *key)
{
    struct ynode v = { n.doc, NULL };
    if (!n.node || n.node->type != YAML_MAPPING_NODE)
        return v;
    for (yaml_node_pair_t *p = n.node->data.mapping.pairs.start; p < n.node->data.mapping.pairs.top;
         p++) {
        const char *k = y_str((struct ynode){ n.doc, yaml_document_get_node(n.doc, p->key) });
        if (k && strcmp(k, key) == 0) {
            v.node = yaml_document_get_node(n.doc, p->value);
            break;
        }
    }
    return v;
}

/* y_get along a dotted path: "spec.template.spec". */
static struct ynode y_path(struct ynode n, const char *path)
{
    char buf[256], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *k = strtok_r(buf, ".", &save); k && n.node; k = strtok_r(NULL, ".", &save))
        n = y_get(n, k);
    return n;
}

/* Items of a sequence (0 when 'n' is absent or not a sequence). */
static size_t y_len(struct ynode n)
{
    if (!n.node || n.node->type != YAML_SEQUENCE_NODE)
        return 0;
    return (size_t)(n.node->data.sequence.items.top - n.node->data.sequence.items.start);
}

static struct ynode y_item(struct ynode n, size_t i)
{
    return (struct ynode){ n.doc,
                           yaml_document_get_node(n.doc, n.node->data.sequence.items.start[i]) };
}

/* Whether 'key' is a mapping key anywhere below 'n'. */
static bool y_has_key(struct ynode n, const char *key)
{
    if (!n.node)
        return false;
    if (n.node->type == YAML_SEQUENCE_NODE) {
        for (size_t i = 0; i < y_len(n); i++)
            if (y_has_key(y_item(n, i), key))
                return true;
    } else if (n.node->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *p = n.node->data.mapping.pairs.start;
             p < n.node->data.mapping.pairs.top; p++) {
            struct ynode k = { n.doc, yaml_document_get_node(n.doc, p->key) };
            if (y_str(k) && strcmp(y_str(k), key) == 0)
                return true;
            if (y_has_key((struct ynode){ n.doc, yaml_document_get_node(n.doc, p->value) }, key))
                return true;
        }
    }
    return false;
}

/* An integer scalar, or 'dflt' when absent; a scalar that is not one fails the test. */
static long y_long(struct ynode n, long dflt, const char *what)
{
    const char *s = y_str(n);
    if (!s)
        return dflt;
    char *end;
    long v = strtol(s, &end, 10);
    cr_assert(*s && !*end, "%s: \"%s\" is not an integer", what, s);
    return v;
}

static bool y_true(struct ynode n)
{
    const char *s = y_str(n);
    return s && strcmp(s, "true") == 0;
}

/* ---- the config: its file, defaults from docs/config.md, addresses ---- */

/* The default docs/config.md gives 'key' (its table row's third cell, without the backticks
 * and JSON quotes), malloc'd. */
static char *doc_default(const char *key)
{
    char *md = proc_read_file(CONFIG_MD), row[128];
    snprintf(row, sizeof(row), "\n| `%s` |", key);
    char *p = strstr(md, row);
    cr_assert_not_null(p, CONFIG_MD ": no row for %s", key);
    p += strlen(row);
    p = strchr(p, '|'); /* past the type cell */
    cr_assert_not_null(p);
    p++;
    while (*p == ' ' || *p == '`' || *p == '"')
        p++;
    size_t n = strcspn(p, "`\"| ");
    char *v = strndup(p, n);
    free(md);
    return v;
}

/* The config's string value of 'key', else the documented default; malloc'd. */
static char *cfg_string(json_t *cfg, const char *key)
{
    const char *v = json_string_value(json_object_get(cfg, key));
    return v ? strdup(v) : doc_default(key);
}

static long long cfg_integer(json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (v) {
        cr_assert(json_is_integer(v), "config: %s is not an integer", key);
        return json_integer_value(v);
    }
    char *d = doc_default(key);
    long long n = strtoll(d, NULL, 10);
    free(d);
    return n;
}

/* The port of "HOST:PORT" (or "[V6]:PORT"). */
static long addr_port(const char *addr)
{
    const char *c = strrchr(addr, ':');
    cr_assert_not_null(c, "address \"%s\" has no port", addr);
    return strtol(c + 1, NULL, 10);
}

static bool addr_is_loopback(const char *addr)
{
    return strncmp(addr, "127.", 4) == 0 || strncmp(addr, "[::1]", 5) == 0 ||
           strncmp(addr, "localhost:", 10) == 0;
}

static json_t *parse_config(const char *text, const char *what)
{
    json_error_t e;
    json_t *cfg = json_loads(text, 0, &e);
    cr_assert_not_null(cfg, "%s:%d:%d: %s", what, e.line, e.column, e.text);
    cr_assert(json_is_object(cfg), "%s: not a JSON object", what);
    return cfg;
}

/* ---- Kubernetes ---- */

enum variant { NATIVE, LEGACY, HEADLESS, POSTGRES, VARIANTS };

struct layout {
    const char *name;
    const char *dir;  /* kustomization directory */
    const char *file; /* its Deployment (the pod spec whole) */
};

static const struct layout layouts[] = {
    [NATIVE] = { "native sidecar", "deploy/kubernetes", "deploy/kubernetes/deployment.yaml" },
    [LEGACY] = { "legacy", "deploy/kubernetes-legacy", "deploy/kubernetes-legacy/deployment.yaml" },
    /* the native Deployment with the overlay's config */
    [HEADLESS] = { "headless", "deploy/kubernetes-headless", "deploy/kubernetes/deployment.yaml" },
    /* the same, with the shared store's config and its Secret (rendered: patched in) */
    [POSTGRES] = { "postgres", "deploy/kubernetes-postgres", "deploy/kubernetes/deployment.yaml" },
};

/* What the checks look at in one variant, found once. */
struct pod {
    const struct layout *l;
    const char *what; /* the file or "kubectl kustomize DIR", for messages */
    struct yaml y;
    struct ynode deploy;       /* the Deployment */
    struct ynode template;     /* spec.template */
    struct ynode spec;         /* spec.template.spec */
    struct ynode proxy;        /* the retryproxy container */
    struct ynode config_mount; /* its volumeMount of the config's directory */
    bool proxy_is_init;        /* found in initContainers */
    const char *config_path;
    json_t *config; /* the mounted config */
    char *admin;    /* effective admin address: --admin, else the config, else the default */
    char *listen;   /* effective proxy address */
    long long drain_ms;
};

static bool is_proxy(struct ynode c)
{
    const char *image = y_str(y_get(c, "image"));
    return image && strstr(image, "retryproxy");
}

/* Whether the workload 'd' runs retryproxy in its pod. */
static bool pod_has_proxy(struct ynode d)
{
    const char *lists[] = { "spec.template.spec.initContainers", "spec.template.spec.containers" };
    for (size_t l = 0; l < 2; l++) {
        struct ynode cs = y_path(d, lists[l]);
        for (size_t i = 0; i < y_len(cs); i++)
            if (is_proxy(y_item(cs, i)))
                return true;
    }
    return false;
}

/* The value following option 'opt' in the container's args (or command), else NULL. */
static const char *arg_value(struct ynode c, const char *opt)
{
    const char *lists[] = { "command", "args" }, *v = NULL;
    for (size_t l = 0; l < 2; l++) {
        struct ynode a = y_get(c, lists[l]);
        for (size_t i = 0; i + 1 < y_len(a); i++)
            if (y_str(y_item(a, i)) && strcmp(y_str(y_item(a, i)), opt) == 0)
                v = y_str(y_item(a, i + 1));
    }
    return v;
}

static const char *env_value(struct ynode c, const char *name)
{
    struct ynode env = y_get(c, "env");
    for (size_t i = 0; i < y_len(env); i++)
        if (y_str(y_get(y_item(env, i), "name")) &&
            strcmp(y_str(y_get(y_item(env, i), "name")), name) == 0)
            return y_str(y_get(y_item(env, i), "value"));
    return NULL;
}

/* The file name, inside the ConfigMap mounted at the config's directory, that the proxy reads:
 * checks the mount and returns the ConfigMap's name and the key in *key. */
static const char *mounted_configmap(struct pod *p, const char **key)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", p->config_path);
    char *slash = strrchr(dir, '/');
    cr_assert(slash && slash != dir, "%s: config path %s is not in a directory", p->what,
              p->config_path);
    *slash = '\0';
    const char *file = strrchr(p->config_path, '/') + 1;

    struct ynode mounts = y_get(p->proxy, "volumeMounts"), m = { NULL, NULL };
    for (size_t i = 0; i < y_len(mounts); i++) {
        const char *mp = y_str(y_get(y_item(mounts, i), "mountPath"));
        if (mp && strcmp(mp, dir) == 0)
            m = y_item(mounts, i);
    }
    cr_assert_not_null(m.node,
                       "%s: no volume is mounted at %s, the directory of the config file %s: "
                       "mount the ConfigMap as that directory (hot reload watches it)",
                       p->what, dir, p->config_path);
    p->config_mount = m;

    const char *vol = y_str(y_get(m, "name"));
    struct ynode vols = y_get(p->spec, "volumes"), cm = { NULL, NULL };
    for (size_t i = 0; vol && i < y_len(vols); i++)
        if (y_str(y_get(y_item(vols, i), "name")) &&
            strcmp(y_str(y_get(y_item(vols, i), "name")), vol) == 0)
            cm = y_get(y_item(vols, i), "configMap");
    cr_assert_not_null(cm.node, "%s: volume \"%s\" mounted at %s is not a configMap volume",
                       p->what, vol ? vol : "?", dir);
    const char *name = y_str(y_get(cm, "name"));
    cr_assert_not_null(name, "%s: configMap volume \"%s\" names no ConfigMap", p->what, vol);

    /* items: each maps a key to a path in the directory. */
    *key = file;
    struct ynode items = y_get(cm, "items");
    for (size_t i = 0; i < y_len(items); i++)
        if (y_str(y_get(y_item(items, i), "path")) &&
            strcmp(y_str(y_get(y_item(items, i), "path")), file) == 0)
            *key = y_str(y_get(y_item(items, i), "key"));
    return name;
}

/* The file that configMapGenerator 'name' in the kustomization at 'dir' (or one it includes
 * through resources) makes key 'key' from: a path, malloc'd, or NULL. */
static char *generated_file(const char *dir, const char *name, const char *key, int depth)
{
    char path[PATH_MAX], *found = NULL;
    struct yaml k;
    snprintf(path, sizeof(path), "%s/kustomization.yaml", dir);
    yaml_load_file(&k, path);
    struct ynode root = y_root(&k, 0), gens = y_get(root, "configMapGenerator");
    for (size_t i = 0; !found && i < y_len(gens); i++) {
        const char *n = y_str(y_get(y_item(gens, i), "name"));
        struct ynode files = y_get(y_item(gens, i), "files");
        for (size_t j = 0; n && strcmp(n, name) == 0 && !found && j < y_len(files); j++) {
            const char *f = y_str(y_item(files, j)), *eq = f ? strchr(f, '=') : NULL;
            const char *base = f ? (strrchr(f, '/') ? strrchr(f, '/') + 1 : f) : NULL;
            if (eq && strncmp(f, key, (size_t)(eq - f)) == 0 && strlen(key) == (size_t)(eq - f))
                f = eq + 1;
            else if (eq || !base || strcmp(base, key) != 0)
                continue;
            snprintf(path, sizeof(path), "%s/%s", dir, f);
            found = strdup(path);
        }
    }
    struct ynode res = y_get(root, "resources");
    for (size_t i = 0; !found && depth < 4 && i < y_len(res); i++) {
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, y_str(y_item(res, i)));
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
            found = generated_file(path, name, key, depth + 1);
    }
    yaml_free(&k);
    return found;
}

/* The ConfigMap 'name' among the rendered documents: its data[key] text, or NULL. */
static const char *rendered_configmap(struct pod *p, const char *name, const char *key)
{
    for (int i = 0; i < p->y.n; i++) {
        struct ynode d = y_root(&p->y, i);
        const char *kind = y_str(y_get(d, "kind")), *n = y_str(y_path(d, "metadata.name"));
        if (kind && strcmp(kind, "ConfigMap") == 0 && n && strcmp(n, name) == 0)
            return y_str(y_get(y_get(d, "data"), key));
    }
    return NULL;
}

/* Loads variant 'v' from its file, or (rendered) from `kubectl kustomize` at 'kubectl'. */
static void pod_load(struct pod *p, enum variant v, const char *kubectl)
{
    static char what[2 * PATH_MAX + 32];
    memset(p, 0, sizeof(*p));
    p->l = &layouts[v];
    if (kubectl) {
        char *argv[] = { (char *)kubectl, "kustomize", (char *)p->l->dir, NULL };
        struct proc_result r;
        cr_assert_eq(proc_run(argv, NULL, 60000, &r), 0);
        cr_assert_eq(r.status, 0, "kubectl kustomize %s failed:\n%s", p->l->dir, r.err);
        snprintf(what, sizeof(what), "kubectl kustomize %s", p->l->dir);
        p->what = what;
        yaml_load(&p->y, r.out, what);
        proc_result_free(&r);
    } else {
        /* an overlay that keeps its base's Deployment says so */
        snprintf(what, sizeof(what), "%s", p->l->file);
        if (strncmp(p->l->file, p->l->dir, strlen(p->l->dir)) != 0 ||
            p->l->file[strlen(p->l->dir)] != '/')
            snprintf(what, sizeof(what), "%s (%s)", p->l->dir, p->l->file);
        p->what = what;
        yaml_load_file(&p->y, p->l->file);
    }
    /* The Deployment whose pod runs the proxy: the headless example renders its backend's too. */
    for (int i = 0; i < p->y.n; i++) {
        struct ynode d = y_root(&p->y, i);
        const char *kind = y_str(y_get(d, "kind"));
        if (kind && strcmp(kind, "Deployment") == 0 && pod_has_proxy(d)) {
            cr_assert_null(p->deploy.node, "%s: more than one Deployment with retryproxy", p->what);
            p->deploy = d;
        }
    }
    cr_assert_not_null(p->deploy.node, "%s: no Deployment with a retryproxy container", p->what);
    p->template = y_path(p->deploy, "spec.template");
    p->spec = y_get(p->template, "spec");
    cr_assert_not_null(p->spec.node, "%s: no spec.template.spec", p->what);

    const char *lists[] = { "initContainers", "containers" };
    for (size_t l = 0; l < 2; l++) {
        struct ynode cs = y_get(p->spec, lists[l]);
        for (size_t i = 0; i < y_len(cs); i++)
            if (is_proxy(y_item(cs, i))) {
                cr_assert_null(p->proxy.node, "%s: more than one retryproxy container", p->what);
                p->proxy = y_item(cs, i);
                p->proxy_is_init = l == 0;
            }
    }
    cr_assert_not_null(p->proxy.node, "%s: no container with a retryproxy image", p->what);

    p->config_path = arg_value(p->proxy, "-c");
    if (!p->config_path)
        p->config_path = env_value(p->proxy, "RETRYPROXY_CONFIG");
    if (!p->config_path)
        p->config_path = DEFAULT_CONFIG;
    const char *key;
    const char *cm = mounted_configmap(p, &key);
    if (kubectl) {
        const char *text = rendered_configmap(p, cm, key);
        cr_assert_not_null(text, "%s: no ConfigMap %s with a key %s", p->what, cm, key);
        p->config = parse_config(text, "the rendered ConfigMap");
    } else {
        char *file = generated_file(p->l->dir, cm, key, 0);
        cr_assert_not_null(file, "%s/kustomization.yaml: no configMapGenerator makes %s key %s",
                           p->l->dir, cm, key);
        char *text = proc_read_file(file);
        p->config = parse_config(text, file);
        free(text);
        free(file);
    }
    const char *a = arg_value(p->proxy, "--admin"), *li = arg_value(p->proxy, "--listen");
    p->admin = a ? strdup(a) : cfg_string(p->config, "admin");
    p->listen = li ? strdup(li) : cfg_string(p->config, "listen");
    p->drain_ms = cfg_integer(p->config, "drain_timeout_ms");
}

static void pod_free(struct pod *p)
{
    json_decref(p->config);
    free(p->admin);
    free(p->listen);
    yaml_free(&p->y);
}

/* The port number 'port' (a number or the name of a port the proxy container declares) means. */
static long proxy_port(struct pod *p, struct ynode port, const char *what)
{
    const char *s = y_str(port);
    cr_assert_not_null(s, "%s: %s has no port", p->what, what);
    char *end;
    long n = strtol(s, &end, 10);
    if (*s && !*end)
        return n;
    struct ynode ports = y_get(p->proxy, "ports");
    for (size_t i = 0; i < y_len(ports); i++)
        if (y_str(y_get(y_item(ports, i), "name")) &&
            strcmp(y_str(y_get(y_item(ports, i), "name")), s) == 0)
            return y_long(y_get(y_item(ports, i), "containerPort"), -1, what);
    cr_assert_fail("%s: %s names port \"%s\", which the retryproxy container does not declare",
                   p->what, what, s);
    return -1;
}

/* Seconds the proxy's preStop hook waits (an exec of sleep N, or the sleep action), else 0. */
static long prestop_wait_s(struct pod *p)
{
    struct ynode pre = y_path(p->proxy, "lifecycle.preStop");
    if (y_get(pre, "sleep").node)
        return y_long(y_path(pre, "sleep.seconds"), 0, "preStop.sleep.seconds");
    struct ynode cmd = y_path(pre, "exec.command");
    if (y_len(cmd) == 2 && y_str(y_item(cmd, 0)) && strstr(y_str(y_item(cmd, 0)), "sleep"))
        return y_long(y_item(cmd, 1), 0, "preStop sleep");
    cr_assert(!pre.node, "%s: a preStop hook whose wait this test cannot tell", p->what);
    return 0;
}

/* kubectl's path, or NULL when it is not installed. */
static const char *which(const char *name)
{
    static char found[PATH_MAX];
    const char *path = getenv("PATH");
    char buf[4096], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", path ? path : "/usr/bin:/bin");
    for (char *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(found, sizeof(found), "%s/%s", d, name);
        if (access(found, X_OK) == 0)
            return found;
    }
    return NULL;
}

/* ---- the checks, one property each, on a loaded variant ---- */

static void check_placement(struct pod *p, enum variant v)
{
    struct ynode cs = y_get(p->spec, "containers");
    size_t apps = 0;
    for (size_t i = 0; i < y_len(cs); i++)
        apps += !is_proxy(y_item(cs, i));
    cr_expect_gt(apps, 0, "%s: no application container in containers", p->what);

    const char *restart = y_str(y_get(p->proxy, "restartPolicy"));
    if (v != LEGACY) {
        cr_expect(p->proxy_is_init, "%s: retryproxy is not in initContainers", p->what);
        cr_expect(restart && strcmp(restart, "Always") == 0,
                  "%s: the retryproxy init container has no restartPolicy: Always, so it is not a "
                  "sidecar (the pod would wait for it to end)",
                  p->what);
        struct ynode sp = y_get(p->proxy, "startupProbe");
        cr_expect_not_null(sp.node,
                           "%s: no startupProbe: the application would start before the proxy "
                           "is ready",
                           p->what);
        const char *path = y_str(y_path(sp, "httpGet.path"));
        cr_expect(path && strcmp(path, "/readyz") == 0,
                  "%s: the startupProbe is not GET /readyz (%s)", p->what, path ? path : "none");
    } else {
        cr_expect(!p->proxy_is_init, "%s: retryproxy is not in containers", p->what);
        cr_expect_null(restart, "%s: restartPolicy on a plain container", p->what);
        cr_expect_eq(y_len(y_get(p->spec, "initContainers")), 0,
                     "%s: the legacy variant has initContainers", p->what);
    }
}

static void check_config_mount(struct pod *p)
{
    cr_expect(!y_has_key(p->deploy, "subPath") && !y_has_key(p->deploy, "subPathExpr"),
              "%s: a subPath mount: kubelet never updates it, so hot reload sees no change",
              p->what);
    /* pod_load found the config through its directory mount. */
    cr_expect(y_true(y_get(p->config_mount, "readOnly")),
              "%s: the config mount at %s is not readOnly", p->what,
              y_str(y_get(p->config_mount, "mountPath")));
}

static void check_ports(struct pod *p)
{
    long admin = addr_port(p->admin), listen = addr_port(p->listen);
    cr_expect(!addr_is_loopback(p->admin),
              "%s: the admin listener is on %s, where kubelet's probes (from the node) cannot "
              "reach it",
              p->what, p->admin);
    const char *probes[] = { "startupProbe", "livenessProbe", "readinessProbe" };
    const char *paths[] = { "/readyz", "/healthz", "/readyz" };
    for (size_t i = 0; i < 3; i++) {
        struct ynode pr = y_get(p->proxy, probes[i]);
        if (!pr.node)
            continue;
        struct ynode get = y_get(pr, "httpGet");
        cr_expect_not_null(get.node, "%s: %s is not an httpGet probe", p->what, probes[i]);
        long port = proxy_port(p, y_get(get, "port"), probes[i]);
        cr_expect_eq(port, admin, "%s: %s on port %ld, not the admin port %ld (%s)", p->what,
                     probes[i], port, admin, p->admin);
        const char *path = y_str(y_get(get, "path"));
        cr_expect(path && strcmp(path, paths[i]) == 0, "%s: %s on %s, not %s", p->what, probes[i],
                  path ? path : "no path", paths[i]);
    }
    cr_expect_not_null(y_get(p->proxy, "readinessProbe").node, "%s: no readinessProbe", p->what);
    cr_expect_not_null(y_get(p->proxy, "livenessProbe").node, "%s: no livenessProbe", p->what);

    struct ynode ports = y_get(p->proxy, "ports");
    bool declared = false;
    for (size_t i = 0; i < y_len(ports); i++) {
        long n = y_long(y_get(y_item(ports, i), "containerPort"), -1, "containerPort");
        cr_expect_neq(n, listen,
                      "%s: the proxy port %ld is declared; it is for the application only (%s)",
                      p->what, n, p->listen);
        declared |= n == admin;
    }
    cr_expect(declared, "%s: the admin port %ld is not declared", p->what, admin);

    struct ynode ann = y_path(p->template, "metadata.annotations");
    const char *scrape = y_str(y_get(ann, "prometheus.io/scrape"));
    const char *port = y_str(y_get(ann, "prometheus.io/port"));
    if (scrape && strcmp(scrape, "true") == 0)
        cr_expect_not_null(port, "%s: scraped without prometheus.io/port", p->what);
    if (port)
        cr_expect_eq(strtol(port, NULL, 10), admin,
                     "%s: prometheus.io/port is %s, not the admin port %ld", p->what, port, admin);
}

static void check_grace(struct pod *p)
{
    long grace = y_long(y_get(p->spec, "terminationGracePeriodSeconds"), DEFAULT_GRACE_S,
                        "terminationGracePeriodSeconds");
    long wait = prestop_wait_s(p);
    long long need_ms = wait * 1000 + p->drain_ms + STREAM_GRACE_MS;
    cr_expect_gt((long long)grace * 1000, need_ms,
                 "%s: terminationGracePeriodSeconds %ld is not above the preStop wait (%ld s) + "
                 "drain_timeout_ms (%lld) + 1 s for streaming responses",
                 p->what, grace, wait, p->drain_ms);
}

static void check_security(struct pod *p)
{
    struct ynode sc = y_get(p->proxy, "securityContext"), psc = y_get(p->spec, "securityContext");
    long uid = y_long(y_get(sc, "runAsUser"), y_long(y_get(psc, "runAsUser"), -1, "runAsUser"),
                      "runAsUser");
    bool nonroot = y_true(y_get(sc, "runAsNonRoot")) ||
                   (!y_get(sc, "runAsNonRoot").node && y_true(y_get(psc, "runAsNonRoot")));
    cr_expect(nonroot || uid > 0, "%s: retryproxy may run as root", p->what);
    cr_expect(y_true(y_get(sc, "readOnlyRootFilesystem")), "%s: no readOnlyRootFilesystem: true",
              p->what);
    const char *ape = y_str(y_get(sc, "allowPrivilegeEscalation"));
    cr_expect(ape && strcmp(ape, "false") == 0, "%s: no allowPrivilegeEscalation: false", p->what);
    struct ynode drop = y_path(sc, "capabilities.drop");
    bool all = false;
    for (size_t i = 0; i < y_len(drop); i++)
        all |= y_str(y_item(drop, i)) && strcmp(y_str(y_item(drop, i)), "ALL") == 0;
    cr_expect(all, "%s: capabilities are not all dropped (drop: [ALL])", p->what);
}

static void check_all(enum variant v, const char *kubectl)
{
    struct pod p;
    pod_load(&p, v, kubectl);
    check_placement(&p, v);
    check_config_mount(&p);
    check_ports(&p);
    check_grace(&p);
    check_security(&p);
    pod_free(&p);
}

Test(deploy, k8s_native_sidecar_starts_before_the_app_and_stops_after_it)
{
    struct pod p;
    pod_load(&p, NATIVE, NULL);
    check_placement(&p, NATIVE);
    pod_free(&p);
}

Test(deploy, k8s_legacy_runs_the_proxy_as_a_plain_container)
{
    struct pod p;
    pod_load(&p, LEGACY, NULL);
    check_placement(&p, LEGACY);
    pod_free(&p);
}

Test(deploy, k8s_config_is_mounted_as_a_directory_never_with_subpath)
{
    for (enum variant v = NATIVE; v < VARIANTS; v++) {
        struct pod p;
        pod_load(&p, v, NULL);
        check_config_mount(&p);
        /* The kustomizations too (a patch could add one). */
        char path[PATH_MAX];
        struct yaml k;
        snprintf(path, sizeof(path), "%s/kustomization.yaml", p.l->dir);
        yaml_load_file(&k, path);
        cr_expect(!y_has_key(y_root(&k, 0), "subPath"), "%s: a subPath", path);
        yaml_free(&k);
        pod_free(&p);
    }
}

Test(deploy, k8s_probes_and_scraping_use_the_admin_port_of_the_mounted_config)
{
    for (enum variant v = NATIVE; v < VARIANTS; v++) {
        struct pod p;
        pod_load(&p, v, NULL);
        check_ports(&p);
        pod_free(&p);
    }
}

Test(deploy, k8s_grace_period_outlasts_the_drain_of_the_mounted_config)
{
    for (enum variant v = NATIVE; v < VARIANTS; v++) {
        struct pod p;
        pod_load(&p, v, NULL);
        check_grace(&p);
        pod_free(&p);
    }
}

Test(deploy, k8s_proxy_runs_unprivileged_on_a_read_only_root)
{
    for (enum variant v = NATIVE; v < VARIANTS; v++) {
        struct pod p;
        pod_load(&p, v, NULL);
        check_security(&p);
        pod_free(&p);
    }
}

Test(deploy, k8s_mounted_config_is_valid)
{
    const char *files[] = { "deploy/kubernetes/config.json",
                            "deploy/kubernetes-headless/config.json",
                            "deploy/kubernetes-postgres/config.json" };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char *argv[] = { (char *)proc_bin(), "check", "-c", (char *)files[i], NULL };
        struct proc_result r;
        cr_assert_eq(proc_run(argv, NULL, 10000, &r), 0);
        cr_expect_eq(r.status, 0, "retryproxy check -c %s:\n%s", files[i], r.err);
        proc_result_free(&r);
    }
}

/* ---- the headless Service of deploy/kubernetes-headless ---- */

#define CLUSTER_SUFFIX ".svc.cluster.local"

/* Whether every label of the mapping 'sel' is among 'labels' with its value. */
static bool selects(struct ynode sel, struct ynode labels)
{
    if (!sel.node || sel.node->type != YAML_MAPPING_NODE ||
        sel.node->data.mapping.pairs.start == sel.node->data.mapping.pairs.top)
        return false; /* no selector: no pod of the example */
    for (yaml_node_pair_t *p = sel.node->data.mapping.pairs.start;
         p < sel.node->data.mapping.pairs.top; p++) {
        const char *k = y_str((struct ynode){ sel.doc, yaml_document_get_node(sel.doc, p->key) });
        const char *v = y_str((struct ynode){ sel.doc, yaml_document_get_node(sel.doc, p->value) });
        const char *have = k ? y_str(y_get(labels, k)) : NULL;
        if (!v || !have || strcmp(v, have) != 0)
            return false;
    }
    return true;
}

/* The port number a pod of 'w' (a workload) declares under the name 'name', or -1. */
static long named_container_port(struct ynode w, const char *name)
{
    struct ynode cs = y_path(w, "spec.template.spec.containers");
    for (size_t i = 0; i < y_len(cs); i++) {
        struct ynode ports = y_get(y_item(cs, i), "ports");
        for (size_t k = 0; k < y_len(ports); k++) {
            const char *n = y_str(y_get(y_item(ports, k), "name"));
            if (n && strcmp(n, name) == 0)
                return y_long(y_get(y_item(ports, k), "containerPort"), -1, "containerPort");
        }
    }
    return -1;
}

/* Whether a container of the workload 'w' has a readiness probe. */
static bool has_readiness(struct ynode w)
{
    struct ynode cs = y_path(w, "spec.template.spec.containers");
    for (size_t i = 0; i < y_len(cs); i++)
        if (y_get(y_item(cs, i), "readinessProbe").node)
            return true;
    return false;
}

/* The upstream URL of the config that names the Service NAME.NS.svc.cluster.local, malloc'd
 * without its scheme and path ("HOST:PORT"), with its scheme in 'scheme' and its route in
 * *route_out; NULL if none. */
static char *upstream_naming(json_t *cfg, const char *name, const char *ns, char *scheme,
                             size_t cap, json_t **route_out)
{
    char host[256];
    snprintf(host, sizeof(host), "%s.%s" CLUSTER_SUFFIX, name, ns);
    size_t ri, ui;
    json_t *route, *up;
    json_array_foreach(json_object_get(cfg, "routes"), ri, route)
    {
        json_array_foreach(json_object_get(route, "upstreams"), ui, up)
        {
            const char *url = json_string_value(up), *sep = url ? strstr(url, "://") : NULL;
            if (!sep)
                continue;
            const char *auth = sep + 3;
            size_t alen = strcspn(auth, "/");
            if (strncmp(auth, host, strlen(host)) != 0 || auth[strlen(host)] != ':')
                continue;
            snprintf(scheme, cap, "%.*s", (int)(sep - url), url);
            *route_out = route;
            return strndup(auth, alen);
        }
    }
    return NULL;
}

/* Route 'route' of 'cfg' ejects a failing endpoint: routes[].ejection.consecutive_failures, or
 * the defaults', above 0, and what counts as a failure names the route's gRPC UNAVAILABLE when
 * its retries do (a failing gRPC pod answers 200 with grpc-status 14, no 5xx). */
static void expect_ejection(json_t *cfg, json_t *route, const char *what)
{
    const char *name = json_string_value(json_object_get(route, "name"));
    json_t *ej = json_object_get(route, "ejection");
    json_t *n = json_object_get(ej, "consecutive_failures");
    if (!n)
        n = json_object_get(json_object_get(json_object_get(cfg, "defaults"), "ejection"),
                            "consecutive_failures");
    cr_expect(json_integer_value(n) > 0,
              "%s: route %s keeps sending to a failing pod: ejection.consecutive_failures is "
              "not set (docs/endpoints.md, \"Ejection per endpoint\")",
              what, name);
    json_t *retry_on = json_object_get(json_object_get(route, "retry"), "retry_on");
    json_t *on = json_object_get(ej, "on"), *v;
    size_t i, k;
    json_array_foreach(retry_on, i, v)
    {
        if (strcmp(json_string_value(v), "unavailable") != 0)
            continue;
        bool counted = false;
        json_t *o;
        json_array_foreach(on, k, o) counted |= strcmp(json_string_value(o), "unavailable") == 0;
        cr_expect(counted, "%s: route %s retries UNAVAILABLE but does not eject on it", what, name);
    }
}

/* Each headless Service among the documents of 'y' is named by an upstream of 'cfg' whose
 * port is the one its pods listen on (nothing maps a Service port to a target port for a pod's
 * own address), selects pods with a readiness probe (only ready pods are in its record), and
 * publishes no pod before it is ready; the route ejects a failing pod (expect_ejection).
 * Returns how many there were. */
static size_t check_headless(struct yaml *y, json_t *cfg, const char *what)
{
    size_t found = 0;
    for (int i = 0; i < y->n; i++) {
        struct ynode svc = y_root(y, i);
        const char *kind = y_str(y_get(svc, "kind")), *ip = y_str(y_path(svc, "spec.clusterIP"));
        if (!kind || strcmp(kind, "Service") != 0 || !ip || strcmp(ip, "None") != 0)
            continue;
        found++;
        const char *name = y_str(y_path(svc, "metadata.name"));
        const char *ns = y_str(y_path(svc, "metadata.namespace"));
        cr_assert_not_null(name, "%s: a Service without a name", what);
        ns = ns ? ns : "default";
        cr_expect(!y_true(y_path(svc, "spec.publishNotReadyAddresses")),
                  "%s: Service %s publishes pods that are not ready", what, name);

        char scheme[16];
        json_t *route = NULL;
        char *auth = upstream_naming(cfg, name, ns, scheme, sizeof(scheme), &route);
        cr_expect_not_null(auth,
                           "%s: no upstream of the config names the headless Service %s "
                           "by its full name %s.%s" CLUSTER_SUFFIX,
                           what, name, name, ns);
        if (!auth)
            continue;
        expect_ejection(cfg, route, what);
        long port = addr_port(auth);
        cr_expect(strcmp(scheme, "h2c") == 0 || strcmp(scheme, "https") == 0,
                  "%s: the upstream %s://%s of a gRPC backend is not h2c:// or https://", what,
                  scheme, auth);

        /* The pods it selects, and the port they listen on that the URL must name. */
        struct ynode sel = y_path(svc, "spec.selector"), w = { NULL, NULL };
        for (int k = 0; k < y->n && !w.node; k++) {
            struct ynode d = y_root(y, k);
            if (d.node != svc.node && selects(sel, y_path(d, "spec.template.metadata.labels")))
                w = d;
        }
        cr_expect_not_null(w.node, "%s: Service %s selects no pod of the example", what, name);
        if (w.node)
            cr_expect(has_readiness(w),
                      "%s: the pods of Service %s have no readiness probe: "
                      "they would be in its record before they serve",
                      what, name);
        struct ynode ports = y_path(svc, "spec.ports");
        bool matched = false;
        for (size_t k = 0; k < y_len(ports); k++) {
            struct ynode pt = y_item(ports, k), tp = y_get(pt, "targetPort");
            const char *t = y_str(tp);
            long target;
            if (!t)
                target = y_long(y_get(pt, "port"), -1, "port");
            else if (strspn(t, "0123456789") == strlen(t))
                target = y_long(tp, -1, "targetPort");
            else
                target = w.node ? named_container_port(w, t) : -1;
            matched |= target == port;
        }
        cr_expect(matched,
                  "%s: the upstream %s://%s names port %ld, which no port of Service %s "
                  "targets: the proxy connects to each pod's address on the URL's port",
                  what, scheme, auth, port, name);
        free(auth);
    }
    return found;
}

/* The files a kustomization lists under resources (not directories), joined as one YAML
 * stream; malloc'd. */
static char *kustomization_files(const char *dir)
{
    char path[PATH_MAX], *all = strdup("");
    struct yaml k;
    snprintf(path, sizeof(path), "%s/kustomization.yaml", dir);
    yaml_load_file(&k, path);
    struct ynode res = y_get(y_root(&k, 0), "resources");
    for (size_t i = 0; i < y_len(res); i++) {
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, y_str(y_item(res, i)));
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        char *text = proc_read_file(path), *more;
        cr_assert(asprintf(&more, "%s\n---\n%s", all, text) > 0);
        free(all);
        free(text);
        all = more;
    }
    yaml_free(&k);
    return all;
}

/* Issue 29: the example of a gRPC upstream behind a headless Service (docs/endpoints.md), from
 * its files and, where kubectl is installed, as kustomize renders it. */
Test(deploy, k8s_headless_service_is_what_the_route_names)
{
    struct pod p;
    pod_load(&p, HEADLESS, NULL);
    char *text = kustomization_files(p.l->dir);
    struct yaml y;
    yaml_load(&y, text, p.l->dir);
    cr_expect_geq(check_headless(&y, p.config, p.l->dir), 1, "%s: no headless Service", p.l->dir);
    yaml_free(&y);
    free(text);
    pod_free(&p);

    const char *kubectl = which("kubectl");
    if (!kubectl) {
        cr_log_warn("kubectl is not installed: the rendered headless example was not checked");
        return;
    }
    char *k = strdup(kubectl);
    pod_load(&p, HEADLESS, k);
    cr_expect_geq(check_headless(&p.y, p.config, p.what), 1, "%s: no headless Service", p.what);
    pod_free(&p);
    free(k);
}

/* A Kubernetes quantity of bytes ("128Mi", "1Gi", "500M", "1048576"), or -1. */
static long long quantity_bytes(const char *q)
{
    if (!q)
        return -1;
    char *end;
    long long n = strtoll(q, &end, 10);
    static const struct {
        const char *suffix;
        long long mult;
    } units[] = { { "", 1 },     { "Ki", 1LL << 10 }, { "Mi", 1LL << 20 }, { "Gi", 1LL << 30 },
                  { "k", 1000 }, { "M", 1000000 },    { "G", 1000000000 } };
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (strcmp(end, units[i].suffix) == 0)
            return n * units[i].mult;
    return -1;
}

/* A limit of the config (limits.NAME), else its documented default. */
static long long cfg_limit(json_t *cfg, const char *name)
{
    char key[96];
    snprintf(key, sizeof(key), "limits.%s", name);
    json_t *v = json_object_get(json_object_get(cfg, "limits"), name);
    if (v) {
        cr_assert(json_is_integer(v), "config: %s is not an integer", key);
        return json_integer_value(v);
    }
    char *d = doc_default(key);
    long long n = strtoll(d, NULL, 10);
    free(d);
    return n;
}

/* Issue 27: the manifests' 128Mi was below what the defaults let the proxy hold (10,000
 * connections, 128 MiB of replay bodies). The container's memory limit covers the mounted
 * config's limits by docs/deploy.md's arithmetic ("Memory"): the process at rest, each client
 * connection at its most (an HTTP/1.1 slow reader: 140 KiB and libmicrohttpd's twice
 * limits.max_header_bytes), and every replay byte. */
Test(deploy, k8s_memory_limit_covers_the_limits_of_the_mounted_config)
{
    for (enum variant v = NATIVE; v < VARIANTS; v++) {
        struct pod p;
        pod_load(&p, v, NULL);
        const char *q = y_str(y_path(p.proxy, "resources.limits.memory"));
        long long limit = quantity_bytes(q);
        cr_expect_gt(limit, 0, "%s: no memory limit (resources.limits.memory: %s)", p.what,
                     q ? q : "none");
        long long conns = cfg_limit(p.config, "max_connections");
        long long head = cfg_limit(p.config, "max_header_bytes");
        long long bodies = cfg_limit(p.config, "max_buffered_body_bytes");
        long long need = (16LL << 20) + conns * ((140LL << 10) + 2 * head) + bodies;
        cr_expect_leq(need, limit,
                      "%s: resources.limits.memory %s is below what the config lets the proxy "
                      "hold: 16 MiB + %lld connections x (140 KiB + 2 x %lld) + %lld = %lld MiB "
                      "(docs/deploy.md, \"Memory\")",
                      p.what, q, conns, head, bodies, need >> 20);
        cr_log_info("%s: %lld MiB of %lld MiB", p.what, need >> 20, limit >> 20);
        pod_free(&p);
    }
}

/* kubectl's path (malloc'd), or NULL having said that the rendered manifests go unchecked. */
static char *kubectl_or_warn(void)
{
    const char *kubectl = which("kubectl");
    if (!kubectl)
        cr_log_warn("kubectl is not installed: the rendered manifests were not checked");
    return kubectl ? strdup(kubectl) : NULL;
}

/* What kustomize makes of each variant (the legacy patch applied, the headless overlay's
 * ConfigMap in place of its base's, the ConfigMap generated) has the same properties. Where
 * kubectl is not installed, this says so and passes. */
Test(deploy, k8s_kustomize_renders_every_variant_with_every_property)
{
    char *k = kubectl_or_warn();
    if (!k)
        return;
    for (enum variant v = NATIVE; v < VARIANTS; v++)
        check_all(v, k);
    free(k);
}

/* The mount of 'c' (a container) whose mountPath is the directory of 'file', and its volume in
 * pod spec 'spec' (absent when there is none). */
static struct ynode mounted_volume(struct ynode c, struct ynode spec, const char *file)
{
    const char *slash = strrchr(file, '/');
    size_t dl = slash ? (size_t)(slash - file) : 0;
    struct ynode mounts = y_get(c, "volumeMounts"), vols = y_get(spec, "volumes");
    for (size_t i = 0; i < y_len(mounts); i++) {
        const char *mp = y_str(y_get(y_item(mounts, i), "mountPath"));
        const char *name = y_str(y_get(y_item(mounts, i), "name"));
        if (!mp || !name || strlen(mp) != dl || strncmp(mp, file, dl) != 0)
            continue;
        for (size_t k = 0; k < y_len(vols); k++) {
            const char *vn = y_str(y_get(y_item(vols, k), "name"));
            if (vn && strcmp(vn, name) == 0)
                return y_item(vols, k);
        }
    }
    return (struct ynode){ c.doc, NULL };
}

/* The shared store's recipe, as kustomize renders it: the config's store.postgres names a URL
 * without a password, a namespace, and a password_file in a directory where the proxy container
 * mounts the Secret; the migrate Job runs `store migrate -c` on the config the proxy reads, with
 * the same ConfigMap and Secret mounted at the same places. */
Test(deploy, k8s_postgres_secret_is_mounted_where_the_config_reads_it_and_a_job_migrates)
{
    char *k = kubectl_or_warn();
    if (!k)
        return;
    struct pod p;
    pod_load(&p, POSTGRES, k);
    json_t *pg = json_object_get(json_object_get(p.config, "store"), "postgres");
    const char *url = json_string_value(json_object_get(pg, "url"));
    const char *pwf = json_string_value(json_object_get(pg, "password_file"));
    cr_assert(url && pwf, "%s: the config has no store.postgres url and password_file", p.what);
    cr_expect_null(strstr(url, "password"), "%s: a password in the URL", p.what);
    cr_expect_not_null(json_string_value(json_object_get(pg, "namespace")),
                       "%s: no store namespace (the service's own)", p.what);
    struct ynode vol = mounted_volume(p.proxy, p.spec, pwf);
    const char *secret = y_str(y_path(vol, "secret.secretName"));
    cr_expect_not_null(secret, "%s: nothing of a Secret mounted at the directory of %s", p.what,
                       pwf);
    bool job = false;
    for (int i = 0; i < p.y.n; i++) {
        struct ynode r = y_root(&p.y, i);
        const char *kind = y_str(y_get(r, "kind"));
        if (!kind || strcmp(kind, "Job") != 0)
            continue;
        job = true;
        struct ynode spec = y_path(r, "spec.template.spec");
        struct ynode c = y_item(y_get(spec, "containers"), 0);
        struct ynode args = y_get(c, "args");
        char line[512] = "";
        for (size_t a = 0; a < y_len(args); a++)
            snprintf(line + strlen(line), sizeof(line) - strlen(line), "%s%s", a ? " " : "",
                     y_str(y_item(args, a)) ? y_str(y_item(args, a)) : "");
        char want[256];
        snprintf(want, sizeof(want), "store migrate -c %s", p.config_path);
        cr_expect_str_eq(line, want, "the Job's args");
        const char *js = y_str(y_path(mounted_volume(c, spec, pwf), "secret.secretName"));
        cr_expect(js && secret && strcmp(js, secret) == 0,
                  "the Job mounts no Secret %s at the directory of %s", secret, pwf);
        cr_expect_not_null(y_path(mounted_volume(c, spec, p.config_path), "configMap.name").node,
                           "the Job mounts no ConfigMap at the directory of %s", p.config_path);
    }
    cr_expect(job, "%s: no Job running retryproxy store migrate", p.what);
    pod_free(&p);
    free(k);
}

/* ---- systemd ---- */

#define UNIT_FILE "deploy/systemd/retryproxy.service"

/* A unit file's assignments in order: "Section\0Key\0Value" triples. */
struct unit {
    char *sec[256], *key[256], *val[256];
    size_t n;
};

static void unit_load(struct unit *u, const char *path)
{
    char *text = proc_read_file(path), *save = NULL, *section = strdup("");
    cr_assert(*text, "%s: missing or empty", path);
    u->n = 0;
    /* Continuation lines (a trailing backslash) join the next line. */
    for (char *s = text; (s = strstr(s, "\\\n")) != NULL;)
        s[0] = s[1] = ' ';
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        line += strspn(line, " \t");
        if (!*line || *line == '#' || *line == ';')
            continue;
        if (*line == '[') {
            free(section);
            section = strndup(line + 1, strcspn(line + 1, "]"));
            continue;
        }
        char *eq = strchr(line, '=');
        cr_assert_not_null(eq, "%s: not an assignment: %s", path, line);
        cr_assert_lt(u->n, 256);
        char *k = strndup(line, (size_t)(eq - line)), *v = eq + 1;
        for (char *e = k + strlen(k); e > k && (e[-1] == ' ' || e[-1] == '\t');)
            *--e = '\0';
        v += strspn(v, " \t");
        u->sec[u->n] = strdup(section);
        u->key[u->n] = k;
        u->val[u->n] = strdup(v);
        u->n++;
    }
    free(section);
    free(text);
}

static void unit_free(struct unit *u)
{
    for (size_t i = 0; i < u->n; i++) {
        free(u->sec[i]);
        free(u->key[i]);
        free(u->val[i]);
    }
}

/* The last value given to Section/Key, or NULL. */
static const char *unit_get(struct unit *u, const char *sec, const char *key)
{
    const char *v = NULL;
    for (size_t i = 0; i < u->n; i++)
        if (strcmp(u->sec[i], sec) == 0 && strcmp(u->key[i], key) == 0)
            v = u->val[i];
    return v;
}

static bool unit_yes(struct unit *u, const char *key)
{
    const char *v = unit_get(u, "Service", key);
    return v && (strcmp(v, "yes") == 0 || strcmp(v, "true") == 0 || strcmp(v, "on") == 0 ||
                 strcmp(v, "1") == 0);
}

/* A list setting as systemd builds it: words accumulate over assignments, an empty one clears
 * the list; a leading "~" makes it a deny list (*inverted). Returns a malloc'd " a b c " with
 * spaces around every word. */
static char *unit_list(struct unit *u, const char *key, bool *inverted)
{
    char *list = strdup(" ");
    *inverted = false;
    for (size_t i = 0; i < u->n; i++) {
        if (strcmp(u->sec[i], "Service") != 0 || strcmp(u->key[i], key) != 0)
            continue;
        const char *v = u->val[i];
        if (!*v) {
            free(list);
            list = strdup(" ");
            *inverted = false;
            continue;
        }
        if (*v == '~') {
            *inverted = true;
            v++;
        }
        char *save = NULL, *words = strdup(v);
        for (char *w = strtok_r(words, " \t", &save); w; w = strtok_r(NULL, " \t", &save)) {
            char *more;
            cr_assert(asprintf(&more, "%s%s ", list, w) > 0);
            free(list);
            list = more;
        }
        free(words);
    }
    return list;
}

/* A systemd time span ("20", "20s", "1min 30s", "500ms") in milliseconds; -1 for infinity. */
static long long timespan_ms(const char *s)
{
    static const struct {
        const char *unit;
        long long ms;
    } units[] = { { "ms", 1 },    { "msec", 1 },    { "s", 1000 },    { "sec", 1000 },
                  { "m", 60000 }, { "min", 60000 }, { "h", 3600000 }, { "hr", 3600000 },
                  { "us", 0 },    { "usec", 0 } };
    if (strcmp(s, "infinity") == 0)
        return -1;
    long long total = 0;
    const char *p = s;
    while (*p) {
        p += strspn(p, " ");
        char *end;
        double n = strtod(p, &end);
        cr_assert(end != p, "time span \"%s\" is not understood", s);
        p = end + strspn(end, " ");
        size_t ul = strspn(p, "abcdefghijklmnopqrstuvwxyz");
        long long per = ul ? -2 : 1000;
        for (size_t i = 0; ul && i < sizeof(units) / sizeof(units[0]); i++)
            if (strlen(units[i].unit) == ul && strncmp(p, units[i].unit, ul) == 0)
                per = units[i].ms;
        cr_assert_neq(per, -2, "time span \"%s\": unknown unit", s);
        total += (long long)(n * (double)per);
        p += ul;
    }
    return total;
}

Test(deploy, systemd_unit_runs_unprivileged_and_confined)
{
    struct unit u;
    unit_load(&u, UNIT_FILE);
    const char *user = unit_get(&u, "Service", "User");
    cr_expect(unit_yes(&u, "DynamicUser") ||
                  (user && strcmp(user, "root") != 0 && strcmp(user, "0") != 0),
              UNIT_FILE ": neither DynamicUser=yes nor a User= other than root");
    const char *ps = unit_get(&u, "Service", "ProtectSystem");
    cr_expect(ps && strcmp(ps, "strict") == 0, UNIT_FILE ": ProtectSystem is not strict");
    const char *yes[] = { "NoNewPrivileges",       "PrivateTmp",
                          "ProtectHome",           "PrivateDevices",
                          "ProtectKernelTunables", "ProtectKernelModules",
                          "ProtectControlGroups",  "RestrictNamespaces",
                          "RestrictSUIDSGID",      "LockPersonality" };
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        cr_expect(unit_yes(&u, yes[i]), UNIT_FILE ": %s is not yes", yes[i]);

    bool inv;
    char *caps = unit_list(&u, "CapabilityBoundingSet", &inv);
    cr_expect(unit_get(&u, "Service", "CapabilityBoundingSet") && strcmp(caps, " ") == 0 && !inv,
              UNIT_FILE ": CapabilityBoundingSet is not empty (\"%s\")", caps);
    free(caps);
    char *ambient = unit_list(&u, "AmbientCapabilities", &inv);
    cr_expect_str_eq(ambient, " ", UNIT_FILE ": AmbientCapabilities grants \"%s\"", ambient);
    free(ambient);

    char *af = unit_list(&u, "RestrictAddressFamilies", &inv);
    cr_expect(!inv, UNIT_FILE ": RestrictAddressFamilies is a deny list");
    const char *want[] = { "AF_INET", "AF_INET6", "AF_UNIX" };
    size_t words = 0;
    for (char *s = af; *s; s++)
        words += s[0] == ' ' && s[1];
    for (size_t i = 0; i < 3; i++) {
        char w[16];
        snprintf(w, sizeof(w), " %s ", want[i]);
        cr_expect_not_null(strstr(af, w), UNIT_FILE ": RestrictAddressFamilies lacks %s", want[i]);
    }
    cr_expect_eq(words, 3,
                 UNIT_FILE ": RestrictAddressFamilies is not AF_INET AF_INET6 AF_UNIX "
                           "(\"%s\")",
                 af);
    free(af);
    unit_free(&u);
}

/* The config file ExecStart names (-c FILE, else the default), which must be under
 * /etc/retryproxy and not writable by the service. */
static const char *unit_config(struct unit *u, char *buf, size_t cap)
{
    const char *exec = unit_get(u, "Service", "ExecStart");
    cr_assert_not_null(exec, UNIT_FILE ": no ExecStart");
    const char *c = strstr(exec, " -c ");
    if (c) {
        c += 4;
        snprintf(buf, cap, "%.*s", (int)strcspn(c, " "), c);
    } else {
        snprintf(buf, cap, "%s", DEFAULT_CONFIG);
    }
    return buf;
}

Test(deploy, systemd_unit_reads_its_config_from_etc_read_only)
{
    struct unit u;
    char cfg[PATH_MAX];
    unit_load(&u, UNIT_FILE);
    unit_config(&u, cfg, sizeof(cfg));
    cr_expect_eq(strncmp(cfg, "/etc/retryproxy/", 16), 0,
                 UNIT_FILE ": the config %s is not in /etc/retryproxy", cfg);
    bool inv;
    char *rw = unit_list(&u, "ReadWritePaths", &inv), *save = NULL;
    for (char *w = strtok_r(rw, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
        w += strspn(w, "-+");
        cr_expect(strncmp(cfg, w, strlen(w)) != 0,
                  UNIT_FILE ": ReadWritePaths %s makes %s writable", w, cfg);
    }
    free(rw);
    unit_free(&u);
}

Test(deploy, systemd_unit_reloads_on_hup_and_outwaits_the_drain)
{
    struct unit u;
    unit_load(&u, UNIT_FILE);
    const char *reload = unit_get(&u, "Service", "ExecReload");
    cr_expect(reload && strcmp(reload, "/bin/kill -HUP $MAINPID") == 0,
              UNIT_FILE ": ExecReload is not /bin/kill -HUP $MAINPID (SIGHUP reloads)");
    const char *sig = unit_get(&u, "Service", "KillSignal");
    cr_expect(sig && strcmp(sig, "SIGTERM") == 0, UNIT_FILE ": KillSignal is not SIGTERM");
    const char *mode = unit_get(&u, "Service", "KillMode");
    cr_expect(!mode || strcmp(mode, "none") != 0, UNIT_FILE ": KillMode=none");

    /* The file installed at the unit's config path is deploy/config.json (docs/deploy.md). */
    char *text = proc_read_file("deploy/config.json");
    json_t *cfg = parse_config(text, "deploy/config.json");
    long long drain = cfg_integer(cfg, "drain_timeout_ms");
    const char *stop = unit_get(&u, "Service", "TimeoutStopSec");
    cr_assert_not_null(stop, UNIT_FILE ": no TimeoutStopSec (the default, 90 s, is not checked)");
    long long stop_ms = timespan_ms(stop);
    cr_expect(stop_ms < 0 || stop_ms > drain + STREAM_GRACE_MS,
              UNIT_FILE ": TimeoutStopSec=%s is not above drain_timeout_ms (%lld) + 1 s", stop,
              drain);
    json_decref(cfg);
    free(text);
    unit_free(&u);
}

/* `systemd-analyze verify` on a copy of the unit whose ExecStart runs the binary under test
 * (verify needs the program to exist). Where it is not installed, this says so and passes. */
Test(deploy, systemd_analyze_verifies_the_unit)
{
    const char *sa = which("systemd-analyze");
    if (!sa) {
        cr_log_warn("systemd-analyze is not installed: the unit was not verified");
        return;
    }
    char *analyze = strdup(sa), dir[] = "/tmp/retryproxy-unit-XXXXXX", path[PATH_MAX];
    char bin[PATH_MAX];
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_not_null(realpath(proc_bin(), bin), "%s: not found", proc_bin());
    char *text = proc_read_file(UNIT_FILE), *at = strstr(text, "ExecStart=");
    cr_assert_not_null(at);
    at += strlen("ExecStart=");
    size_t prog = strcspn(at, " \n");
    snprintf(path, sizeof(path), "%s/retryproxy.service", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "%.*s%s%s", (int)(at - text), text, bin, at + prog);
    fclose(f);

    char *argv[] = { analyze, "verify", path, NULL };
    struct proc_result r;
    cr_assert_eq(proc_run(argv, NULL, 60000, &r), 0);
    cr_expect_eq(r.status, 0, "systemd-analyze verify " UNIT_FILE ":\n%s%s", r.out, r.err);
    cr_expect_str_empty(r.err, "systemd-analyze verify " UNIT_FILE ":\n%s", r.err);
    proc_result_free(&r);
    rm_tree(dir);
    free(text);
    free(analyze);
}
