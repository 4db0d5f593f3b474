/* The soak load's proxy (tests/tools/soak.c): its config written (and rewritten for reloads)
 * in a temporary directory, the process started, watched and stopped, and its admin API read.
 */
#ifndef RETRYPROXY_TESTS_TOOLS_SOAK_PROXY_H
#define RETRYPROXY_TESTS_TOOLS_SOAK_PROXY_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- the proxy ---- */

extern char dir[64], cfg_path[128], err_path[128];

extern pid_t proxy_pid;
/* The proxy's listener and admin ports. */
extern uint16_t proxy_port, admin_port;

/* SIGINT or SIGTERM: stop the load, stop the proxy, clean up, exit 3 without judging. */
extern volatile sig_atomic_t interrupted;

void on_interrupt(int sig);

void watchdog(int sig);

/* The config, generation 'g' of the run: base_ms and cap_ms change with every reload. */
int write_config(uint16_t up_port, unsigned g);

int start_proxy(const char *bin, const char *workers);

/* Set when the proxy ended on its own during the run (a crash): its exit status. */
extern int died;

/* False, and 'died' set, once the proxy has ended on its own. */
bool proxy_alive(void);

/* Exit status after SIGTERM (128 + signal if killed by one; -1 if it had to be killed). */
int stop_proxy(int timeout_ms);

/* GET admin 'path' on a connection of its own; the body (malloc'd) or NULL. */
char *admin_get(const char *path);

/* One GET through the proxy on a connection of its own (see the idle check in main). */
void nudge(void);

/* A metric's value (first series with that name) in a /metrics text, or -1. */
double metric(const char *text, const char *name);

#endif
