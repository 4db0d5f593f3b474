/* The deployment examples under deploy/ against what the proxy needs from them. Run from the
 * repository root (make test does).
 *
 * Kubernetes, four variants of one Deployment (docs/deploy.md):
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
 * The headless Service the headless variant's route names is test_deploy_headless.c's, the
 * shared store's Secret and migrate Job test_deploy_postgres.c's, the systemd unit
 * test_deploy_systemd.c's; what they share is tests/support/deploytest.
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

#include "tests/support/deploytest.h"
#include "tests/support/proc.h"

/* Kubernetes' default when a pod spec does not set terminationGracePeriodSeconds. */
#define DEFAULT_GRACE_S 30

/* ---- the checks, one property each, on a loaded variant ---- */

static void check_placement(struct pod *p, enum variant v)
{
    struct ynode cs = y_get(p->spec, "containers");
    size_t apps = 0;
    for (size_t i = 0; i < y_len(cs); i++)
        apps += !dep_is_proxy(y_item(cs, i));
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
    long admin = dep_addr_port(p->admin), listen = dep_addr_port(p->listen);
    cr_expect(!dep_addr_is_loopback(p->admin),
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
        long port = dep_proxy_port(p, y_get(get, "port"), probes[i]);
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
    long wait = dep_prestop_wait_s(p);
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
        dep_yaml_load_file(&k, path);
        cr_expect(!y_has_key(y_root(&k, 0), "subPath"), "%s: a subPath", path);
        dep_yaml_free(&k);
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
    char *d = dep_doc_default(key);
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

/* What kustomize makes of each variant (the legacy patch applied, the headless overlay's
 * ConfigMap in place of its base's, the ConfigMap generated) has the same properties. Where
 * kubectl is not installed, this says so and passes. */
Test(deploy, k8s_kustomize_renders_every_variant_with_every_property)
{
    char *k = dep_kubectl_or_warn();
    if (!k)
        return;
    for (enum variant v = NATIVE; v < VARIANTS; v++)
        check_all(v, k);
    free(k);
}

/* ---- systemd ---- */
