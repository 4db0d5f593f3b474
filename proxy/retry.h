/* retry -- one client request from its head to its last response byte: the states it goes
 * through and what moves it from one to the next (docs/forwarding.md, docs/config.md "retry").
 *
 * The work itself is done by parts, each with one job: proxy/head.c reads the request head,
 * proxy/intake.c holds its body, proxy/attempt.c runs an upstream attempt (libcurl),
 * proxy/decide.c decides whether to retry (pure), proxy/relay.c answers the client
 * (libmicrohttpd). server.c hands each request here.
 */
#ifndef RETRYPROXY_PROXY_RETRY_H
#define RETRYPROXY_PROXY_RETRY_H

#include <stdbool.h>
#include <stddef.h>

#include "proxy/wire.h"

struct worker;
struct retry_req;
struct MHD_Connection;

/* A request whose request line has arrived ('raw_target' as sent) on a connection from
 * 'peer' (the client's address as text, "" if unknown; it must stay valid while the
 * connection is open). 'refused' is not WIRE_OK when the framing check refused the head this
 * one stands in for: it is answered with that error and the connection closed. NULL if out of
 * memory. */
struct retry_req *retry_req_new(struct worker *w, struct MHD_Connection *c, const char *raw_target,
                                const char *peer, enum wire_reason refused);

/* libmicrohttpd's access handler for this request (see MHD_AccessHandlerCallback): false
 * where it wants MHD_NO (close the connection). */
bool retry_req_access(struct retry_req *r, const char *method, const char *upload_data,
                      size_t *upload_data_size);

/* libmicrohttpd is done with the request's connection (answered, or the client went away). */
void retry_req_completed(struct retry_req *r);

/* The drain deadline passed: answers every request of 'w' still waiting on the upstream side
 * (with its last upstream response, or a 503 "draining"). */
void retry_expire_all(struct worker *w);

#endif
