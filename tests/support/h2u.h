/* h2u -- the scripted HTTP/2 cleartext upstream (tests/tools/h2_upstream.py, run by Debian's
 * /usr/bin/python3 with python3-h2) for integration tests: start it on a port the kernel picks,
 * read what it recorded per connection and stream, stop it.
 *
 *   struct h2u *u = h2u_start();
 *   fx_start_b(... "\"upstreams\": [\"%s\"]", h2u_url(u, "/base") ...);
 *   ... json_t *recs = h2u_records(u); ... h2u_count(u, "action", "answered") ...
 *
 * Its scenarios (x-h2-scenario, x-h2-fail, x-h2-body, x-h2-delay-ms) are described at the top
 * of the script. h2u_stop_all() belongs in the suite's .fini, before fx_stop().
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_H2U_H
#define RETRYPROXY_TESTS_SUPPORT_H2U_H

#include <jansson.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

struct h2u;

/* Starts one (asserts that it printed its port within 10 s). */
struct h2u *h2u_start(void);
/* One speaking TLS with certificate 'cert' and key 'key' (PEM files), choosing by ALPN from
 * 'alpn' ("h2", "http/1.1,h2", "none"; NULL: "h2"); connections that do not choose h2 are
 * answered in HTTP/1.1 (see the script). */
struct h2u *h2u_start_tls(const char *cert, const char *key, const char *alpn);
/* ... requiring a client certificate that the PEM certificates in 'client_ca' verify. */
struct h2u *h2u_start_mtls(const char *cert, const char *key, const char *alpn,
                           const char *client_ca);
/* One listening on IPv4 address 'ip' (NULL: 127.0.0.1) and 'port' (0: one the kernel picks):
 * 127.0.0.2, .3... stand for the pods of one service, on one port (docs/endpoints.md). TLS
 * when 'cert' is not NULL, as h2u_start_tls(). */
struct h2u *h2u_start_at(const char *ip, uint16_t port, const char *cert, const char *key,
                         const char *alpn);
uint16_t h2u_port(const struct h2u *u);
/* "h2c://IP:PORT" (https:// for a TLS one) + base, in a static buffer. */
const char *h2u_url(const struct h2u *u, const char *base);
/* Every record so far, as a JSON array (caller decrefs): request records and
 * {"conn": N, "event": "accepted"} lines. */
json_t *h2u_records(const struct h2u *u);
/* Records whose string member 'key' equals 'value' (request_id, action, ...). */
size_t h2u_count(const struct h2u *u, const char *key, const char *value);
/* The first record whose member 'key' is 'value', or NULL (caller decrefs). */
json_t *h2u_find(const struct h2u *u, const char *key, const char *value);
/* Connections it accepted. */
size_t h2u_connections(const struct h2u *u);
/* Stops every one started. */
void h2u_stop_all(void);

/* The scripted HTTP/2 client's command line (run from the repository's top directory). */
#define H2U_PEER "/usr/bin/python3 tests/tools/h2peer.py"
/* Runs the scripted HTTP/2 client, tests/tools/h2peer.py, with the arguments 'fmt' makes
 * (its scenarios are described at its top), asserting it exits 0; its result line ("key value"
 * pairs) in out[cap]. */
void h2u_peer(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The same with another client script, 'tool' (its command line), and a va_list. */
void h2u_vtool(char *out, size_t cap, const char *tool, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
/* The number after "key " in a result line, -1 if absent or not a number. */
long h2u_peer_field(const char *line, const char *key);

#endif
