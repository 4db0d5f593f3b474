/* The headless variant of the Kubernetes example (deploy/kubernetes-headless, docs/deploy.md):
 * a gRPC backend behind a headless Service that the config's route names (docs/endpoints.md), in
 * the overlay's files and in what `kubectl kustomize` renders where kubectl is installed. Run
 * from the repository root (make test does); the pods are loaded as test_deploy.c loads them
 * (tests/support/deploytest). */
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

#include "tests/support/deploytest.h"
#include "tests/support/proc.h"

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
        long port = dep_addr_port(auth);
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
    dep_yaml_load_file(&k, path);
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
    dep_yaml_free(&k);
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
    dep_yaml_load(&y, text, p.l->dir);
    cr_expect_geq(check_headless(&y, p.config, p.l->dir), 1, "%s: no headless Service", p.l->dir);
    dep_yaml_free(&y);
    free(text);
    pod_free(&p);

    const char *kubectl = dep_which("kubectl");
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
