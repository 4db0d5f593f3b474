/* deploytest -- what the suites of the deployment examples under deploy/ share
 * (tests/cli/test_deploy*.c, docs/deploy.md): a YAML stream read with libyaml and a few ways into
 * it, the proxy's config with the defaults docs/config.md gives, and the Kubernetes pod of each
 * variant, found once the way kubelet would. Run from the repository root; Criterion asserts. */
#ifndef RETRYPROXY_TESTS_SUPPORT_DEPLOYTEST_H
#define RETRYPROXY_TESTS_SUPPORT_DEPLOYTEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <yaml.h>

#define DEFAULT_CONFIG "/etc/retryproxy/config.json" /* without -c or $RETRYPROXY_CONFIG */
#define DEP_MAX_DOCS   16
/* After drain_timeout_ms, responses still streaming get one more second. */
#define STREAM_GRACE_MS 1000

/* ---- YAML: a loaded stream of documents and a few ways into it ---- */

struct yaml {
    yaml_document_t docs[DEP_MAX_DOCS];
    int n;
};

/* A node together with its document, so lookups need one argument. */
struct ynode {
    yaml_document_t *doc;
    yaml_node_t *node; /* NULL: absent */
};

/* Loads every document of 'text' ('what' names it in failures), or of the file at 'path'. */
void dep_yaml_load(struct yaml *y, const char *text, const char *what);
void dep_yaml_load_file(struct yaml *y, const char *path);
void dep_yaml_free(struct yaml *y);
/* Document 'i''s root node. */
struct ynode y_root(struct yaml *y, int i);
/* The scalar's text, or NULL when 'n' is absent or not a scalar. */
const char *y_str(struct ynode n);
/* The value of 'key' in mapping 'n' (absent when 'n' is not a mapping or has no such key). */
struct ynode y_get(struct ynode n, const char *key);
/* y_get along a dotted path: "spec.template.spec". */
struct ynode y_path(struct ynode n, const char *path);
/* Items of a sequence (0 when 'n' is absent or not a sequence), and item 'i'. */
size_t y_len(struct ynode n);
struct ynode y_item(struct ynode n, size_t i);
/* Whether 'key' is a mapping key anywhere below 'n'. */
bool y_has_key(struct ynode n, const char *key);
/* An integer scalar, or 'dflt' when absent; a scalar that is not one fails the test. */
long y_long(struct ynode n, long dflt, const char *what);
bool y_true(struct ynode n);

/* ---- the config: its file, defaults from docs/config.md, addresses ---- */

/* The default docs/config.md gives 'key', malloc'd. */
char *dep_doc_default(const char *key);
/* The config's integer value of 'key', else the documented default. */
long long dep_cfg_integer(json_t *cfg, const char *key);
/* The port of "HOST:PORT" (or "[V6]:PORT"). */
long dep_addr_port(const char *addr);
bool dep_addr_is_loopback(const char *addr);
/* 'text' parsed as a JSON object ('what' names it in failures). */
json_t *dep_parse_config(const char *text, const char *what);

/* ---- Kubernetes ---- */

enum variant { NATIVE, LEGACY, HEADLESS, POSTGRES, VARIANTS };

struct layout {
    const char *name;
    const char *dir;  /* kustomization directory */
    const char *file; /* its Deployment (the pod spec whole) */
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

/* Whether container 'c' is retryproxy (by its image). */
bool dep_is_proxy(struct ynode c);
/* Loads variant 'v' from its file, or (rendered) from `kubectl kustomize` at 'kubectl'. */
void pod_load(struct pod *p, enum variant v, const char *kubectl);
void pod_free(struct pod *p);
/* The port number 'port' (a number or the name of a port the proxy container declares) means. */
long dep_proxy_port(struct pod *p, struct ynode port, const char *what);
/* Seconds the proxy's preStop hook waits (an exec of sleep N, or the sleep action), else 0. */
long dep_prestop_wait_s(struct pod *p);
/* The path of program 'name' on $PATH, or NULL when it is not installed (a static buffer). */
const char *dep_which(const char *name);
/* kubectl's path (malloc'd), or NULL having said that the rendered manifests go unchecked. */
char *dep_kubectl_or_warn(void);

#endif
