/* wsu -- the WebSocket upstream and client of tests/tools/ws_peer.py (Debian's /usr/bin/python3
 * with python3-websockets) for the upgrade tests (docs/upgrades.md): start upstreams on ports
 * the kernel picks, read what they recorded, run a client scenario through the proxy.
 *
 *   struct wsu *u = wsu_start(0);              (403: every handshake refused with that status)
 *   fx_start_b(... "\"upstreams\": [\"%s\"]", wsu_url(u) ...);
 *   json_t *res = wsu_client(fx_ws_url("/chat"), "text");   ("ok": true when it worked)
 *
 * wsu_stop_all() belongs in the suite's .fini, before fx_stop().
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_WSU_H
#define RETRYPROXY_TESTS_SUPPORT_WSU_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct wsu;

/* Starts one (asserts that it printed its port within 10 s); 'refuse' 0 or an HTTP status. */
struct wsu *wsu_start(int refuse);
/* One speaking TLS with certificate 'cert' and key 'key' (PEM files). */
struct wsu *wsu_start_tls(const char *cert, const char *key);
/* ... requiring a client certificate that the PEM certificates in 'client_ca' verify. */
struct wsu *wsu_start_mtls(const char *cert, const char *key, const char *client_ca);
/* One (cleartext, echoing) listening on IPv4 address 'ip' and 'port' (0: one the kernel
 * picks): 127.0.0.2, .3... stand for the pods of one service, on one port (docs/endpoints.md). */
struct wsu *wsu_start_at(const char *ip, uint16_t port);
uint16_t wsu_port(const struct wsu *u);
/* "http://IP:PORT" (https:// for a TLS one), in a static buffer. */
const char *wsu_url(const struct wsu *u);
/* Its records so far (caller decrefs): {"event": "handshake", "path", "headers"} and
 * {"event": "closed", "path", "code", "at_ms"}. */
json_t *wsu_records(const struct wsu *u);
/* Records whose member "event" is 'event' (and "path" is 'path', unless NULL). */
size_t wsu_count(const struct wsu *u, const char *event, const char *path);
/* Runs client scenario 'scenario' against 'url' (ws://...): its JSON result (caller decrefs),
 * asserted to be one. */
json_t *wsu_client(const char *url, const char *scenario);
/* Stops every one started. */
void wsu_stop_all(void);

#endif
