/* The shared store's variant of the Kubernetes example (deploy/kubernetes-postgres,
 * docs/deploy.md, docs/delivery.md "Shared store"): the config's store.postgres, the password's
 * Secret mounted where password_file reads it, and the Job that runs `retryproxy store migrate`,
 * in what `kubectl kustomize` renders where kubectl is installed. Its pod's other properties are
 * test_deploy.c's (every variant); what they share is tests/support/deploytest. Run from the
 * repository root (make test does). */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/deploytest.h"

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
    char *k = dep_kubectl_or_warn();
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
