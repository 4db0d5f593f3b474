/* reload -- the config file into the running proxy (docs/reload.md). Control thread only.
 *
 * Triggers: the directory watch, a poll of the file's content hash every 2 s as a backstop for
 * missed events, SIGHUP and POST /reload (forced). A change the watch sees complete (a rename
 * into place, kubelet's ..data swap, a symlink made) is read in the loop turn that reads its
 * event; one it sees in progress (an in-place write, a deletion) about 100 ms after the last
 * such event (debounced). Each reload's log lines say which ("trigger"). A reload reads
 * and validates the whole file; only a valid one is published, atomically, as the next
 * generation; requests in flight keep the snapshot they started with. A file whose content did
 * not change since the last attempt is not re-applied unless forced, so a half-written file
 * fails once and the write that completes it succeeds. The keys the schema marks as read only
 * at start (docs/config.md, "at restart") keep their start values: a change to them is
 * reported as needing a restart (unless the command line set them) and the rest applies.
 */
#ifndef RETRYPROXY_PROXY_RELOAD_H
#define RETRYPROXY_PROXY_RELOAD_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "config/cfg.h"
#include "proxy/base/loop.h"
#include "proxy/core/proxy.h"

struct worker;
struct reload;

/* Settings from the command line that the file does not override. */
struct reload_pins {
    const char *listen; /* what was bound */
    const char *admin;
    int log_level;  /* -1: the file's */
    int log_format; /* -1: the file's */
};

/* Publishes 'initial' (generation 1, read from 'path') in px->cell. NULL if out of memory. */
struct reload *reload_new(struct proxy *px, const char *path, struct cfg *initial,
                          const struct reload_pins *pins);
void reload_free(struct reload *rl); /* accepts NULL */

/* The workers to wake when a snapshot is published. */
void reload_set_workers(struct reload *rl, struct worker **workers, unsigned n);

/* Watches the file and polls it from loop 'l'. 0, or -errno if inotify is unavailable (the
 * poll still runs). */
int reload_attach(struct reload *rl, struct loop *l);

/* Reloads now, even if the content is unchanged. Returns 0 with the generation published, or
 * -1 with every error appended to 'errs' (which may be NULL). */
int reload_force(struct reload *rl, struct cfg_errs *errs, uint64_t *generation);

/* For /config: the generation being served, when it was loaded (Unix ms), the file, the last
 * reload error (NULL if the last reload succeeded) and the settings a change of which waits
 * for a restart ("" if none; comma-separated). */
uint64_t reload_generation(const struct reload *rl);
int64_t reload_loaded_at(const struct reload *rl);
const char *reload_source(const struct reload *rl);
const char *reload_last_error(const struct reload *rl);
const char *reload_restart_required(const struct reload *rl);

/* The listeners' addresses once bound (the port the kernel picked for port 0 included). */
void reload_set_bound(struct reload *rl, const char *listen, const char *admin);

/* The config in force, as JSON with every default (GET /config, docs/admin.md): snapshot 'c',
 * except the listeners' bound addresses, the log settings the command line pins, and the
 * keys read only at start that the file has changed since (their start values). */
json_t *reload_config_in_force(const struct reload *rl, const struct cfg *c);

#endif
