/* deploytest -- what the suites of deploy/ share (deploytest.h): the YAML reader, the config
 * and the defaults docs/config.md gives, and the Kubernetes pod of each variant, found once. */
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include <criterion/criterion.h>
#include <criterion/logging.h>

#include "tests/support/deploytest.h"
#include "tests/support/proc.h"

#define CONFIG_MD "docs/config.md"

/* ---- YAML: a loaded stream of documents and a few ways into it ---- */

/* Loads every document of 'text' ('what' names it in failures). */
void dep_yaml_load(struct yaml *y, const char *text, const char *what)
{
    yaml_parser_t p;
    y->n = 0;
    cr_assert(yaml_parser_initialize(&p));
    yaml_parser_set_input_string(&p, (const unsigned char *)text, strlen(text));
    for (;;) {
        cr_assert_lt(y->n, DEP_MAX_DOCS, "%s: more than %d YAML documents", what, DEP_MAX_DOCS);
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

void dep_yaml_load_file(struct yaml *y, const char *path)
{
    char *text = proc_read_file(path);
    cr_assert(*text, "%s: missing or empty", path);
    dep_yaml_load(y, text, path);
    free(text);
}

void dep_yaml_free(struct yaml *y)
{
    for (int i = 0; i < y->n; i++)
        yaml_document_delete(&y->docs[i]);
    y->n = 0;
}

struct ynode y_root(struct yaml *y, int i)
{
    return (struct ynode){ &y->docs[i], yaml_document_get_root_node(&y->docs[i]) };
}

/* The scalar's text, or NULL when 'n' is absent or not a scalar. */
const char *y_str(struct ynode n)
{
    return n.node && n.node->type == YAML_SCALAR_NODE ? (const char *)n.node->data.scalar.value
                                                      : NULL;
}

/* The value of 'key' in mapping 'n' (absent when 'n' is not a mapping or has no such key). */
struct ynode y_get(struct ynode n, const char *key)
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
struct ynode y_path(struct ynode n, const char *path)
{
    char buf[256], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *k = strtok_r(buf, ".", &save); k && n.node; k = strtok_r(NULL, ".", &save))
        n = y_get(n, k);
    return n;
}

/* Items of a sequence (0 when 'n' is absent or not a sequence). */
size_t y_len(struct ynode n)
{
    if (!n.node || n.node->type != YAML_SEQUENCE_NODE)
        return 0;
    return (size_t)(n.node->data.sequence.items.top - n.node->data.sequence.items.start);
}

struct ynode y_item(struct ynode n, size_t i)
{
    return (struct ynode){ n.doc,
                           yaml_document_get_node(n.doc, n.node->data.sequence.items.start[i]) };
}

/* Whether 'key' is a mapping key anywhere below 'n'. */
bool y_has_key(struct ynode n, const char *key)
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
long y_long(struct ynode n, long dflt, const char *what)
{
    const char *s = y_str(n);
    if (!s)
        return dflt;
    char *end;
    long v = strtol(s, &end, 10);
    cr_assert(*s && !*end, "%s: \"%s\" is not an integer", what, s);
    return v;
}

bool y_true(struct ynode n)
{
    const char *s = y_str(n);
    return s && strcmp(s, "true") == 0;
}

/* ---- the config: its file, defaults from docs/config.md, addresses ---- */

/* The default docs/config.md gives 'key' (its table row's third cell, without the backticks
 * and JSON quotes), malloc'd. */
char *dep_doc_default(const char *key)
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
    return v ? strdup(v) : dep_doc_default(key);
}

long long dep_cfg_integer(json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (v) {
        cr_assert(json_is_integer(v), "config: %s is not an integer", key);
        return json_integer_value(v);
    }
    char *d = dep_doc_default(key);
    long long n = strtoll(d, NULL, 10);
    free(d);
    return n;
}

/* The port of "HOST:PORT" (or "[V6]:PORT"). */
long dep_addr_port(const char *addr)
{
    const char *c = strrchr(addr, ':');
    cr_assert_not_null(c, "address \"%s\" has no port", addr);
    return strtol(c + 1, NULL, 10);
}

bool dep_addr_is_loopback(const char *addr)
{
    return strncmp(addr, "127.", 4) == 0 || strncmp(addr, "[::1]", 5) == 0 ||
           strncmp(addr, "localhost:", 10) == 0;
}

json_t *dep_parse_config(const char *text, const char *what)
{
    json_error_t e;
    json_t *cfg = json_loads(text, 0, &e);
    cr_assert_not_null(cfg, "%s:%d:%d: %s", what, e.line, e.column, e.text);
    cr_assert(json_is_object(cfg), "%s: not a JSON object", what);
    return cfg;
}

/* ---- Kubernetes ---- */

static const struct layout layouts[] = {
    [NATIVE] = { "native sidecar", "deploy/kubernetes", "deploy/kubernetes/deployment.yaml" },
    [LEGACY] = { "legacy", "deploy/kubernetes-legacy", "deploy/kubernetes-legacy/deployment.yaml" },
    /* the native Deployment with the overlay's config */
    [HEADLESS] = { "headless", "deploy/kubernetes-headless", "deploy/kubernetes/deployment.yaml" },
    /* the same, with the shared store's config and its Secret (rendered: patched in) */
    [POSTGRES] = { "postgres", "deploy/kubernetes-postgres", "deploy/kubernetes/deployment.yaml" },
};

bool dep_is_proxy(struct ynode c)
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
            if (dep_is_proxy(y_item(cs, i)))
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
    dep_yaml_load_file(&k, path);
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
    dep_yaml_free(&k);
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
void pod_load(struct pod *p, enum variant v, const char *kubectl)
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
        dep_yaml_load(&p->y, r.out, what);
        proc_result_free(&r);
    } else {
        /* an overlay that keeps its base's Deployment says so */
        snprintf(what, sizeof(what), "%s", p->l->file);
        if (strncmp(p->l->file, p->l->dir, strlen(p->l->dir)) != 0 ||
            p->l->file[strlen(p->l->dir)] != '/')
            snprintf(what, sizeof(what), "%s (%s)", p->l->dir, p->l->file);
        p->what = what;
        dep_yaml_load_file(&p->y, p->l->file);
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
            if (dep_is_proxy(y_item(cs, i))) {
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
        p->config = dep_parse_config(text, "the rendered ConfigMap");
    } else {
        char *file = generated_file(p->l->dir, cm, key, 0);
        cr_assert_not_null(file, "%s/kustomization.yaml: no configMapGenerator makes %s key %s",
                           p->l->dir, cm, key);
        char *text = proc_read_file(file);
        p->config = dep_parse_config(text, file);
        free(text);
        free(file);
    }
    const char *a = arg_value(p->proxy, "--admin"), *li = arg_value(p->proxy, "--listen");
    p->admin = a ? strdup(a) : cfg_string(p->config, "admin");
    p->listen = li ? strdup(li) : cfg_string(p->config, "listen");
    p->drain_ms = dep_cfg_integer(p->config, "drain_timeout_ms");
}

void pod_free(struct pod *p)
{
    json_decref(p->config);
    free(p->admin);
    free(p->listen);
    dep_yaml_free(&p->y);
}

/* The port number 'port' (a number or the name of a port the proxy container declares) means. */
long dep_proxy_port(struct pod *p, struct ynode port, const char *what)
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
long dep_prestop_wait_s(struct pod *p)
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
const char *dep_which(const char *name)
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

char *dep_kubectl_or_warn(void)
{
    const char *kubectl = dep_which("kubectl");
    if (!kubectl)
        cr_log_warn("kubectl is not installed: the rendered manifests were not checked");
    return kubectl ? strdup(kubectl) : NULL;
}
