/* retry -- one client request from its head to its last response byte: the states it goes
 * through and what moves it from one to the next (docs/forwarding.md, docs/config.md "retry").
 *
 * The work itself is done by parts, each with one job: proxy/http/head.c reads the request head,
 * proxy/core/intake.c holds its body, an upstream attempt runs behind proxy/upstream/attempt.h
 * (libcurl, HTTP/2 or an upgrade's connection), proxy/core/decide.c decides whether to retry
 * (pure). The client side is a front end behind proxy/core/front.h (proxy/http1/relay.c: HTTP/1.1),
 * which knows no more of the core than this header.
 */
#ifndef RETRYPROXY_PROXY_RETRY_H
#define RETRYPROXY_PROXY_RETRY_H

#include <stdbool.h>
#include <stddef.h>

#include "proxy/core/front.h"
#include "proxy/http/refusal.h"

struct worker;
struct retry_req;

/* ---- from a front end (proxy/core/front.h) ---- */

/* A request whose request line has arrived ('raw_target' as sent) on a connection from 'peer'
 * (the client's address as text, "" if unknown; it must stay valid while the connection is
 * open), in the client protocol 'proto', answered through 'ops'. 'refused' is not REFUSE_NONE when
 * the framing check refused the head this one stands in for: it is answered with that error
 * and the connection closed. Returns the front end's state, 'front_size' bytes (a struct
 * front first, zeroed but for its ops, req, proto) in the request's allocation, or NULL if out
 * of memory. The client side holds a reference until retry_req_completed(). 'peer_port' is
 * the client's port (0 if unknown), for the log. */
struct front *retry_req_new(struct worker *w, const struct front_ops *ops, size_t front_size,
                            enum front_proto proto, const char *raw_target, const char *peer,
                            unsigned peer_port, enum refusal refused);

/* The head is complete: its fields through ops->fields, no body byte read yet. An answer may
 * be made at once (400, 404, 405, 413). */
void retry_req_head(struct retry_req *r, const char *method);

/* retry_req_body(): stop reading the request and close its connection (or reset its stream). */
#define RETRY_BODY_CLOSE ((size_t)-1)
/* Body bytes: returns how many were taken (the rest is offered again after
 * ops->upload_room), or RETRY_BODY_CLOSE. */
size_t retry_req_body(struct retry_req *r, const char *data, size_t n);
/* A trailer field of the request ('k' NUL-terminated at 'kl'), after its last body byte and
 * before retry_req_end(): kept with the request, every attempt sends it after the body, a
 * retry's too (docs/forwarding.md, "Request trailers"). Hop-by-hop, framing and the proxy's
 * own fields are left out. The head's and the trailers' fields together are bounded as a head
 * is (limits.max_header_bytes, counted name + value + 32 bytes each, and 100 fields): past
 * either, or with a forbidden byte, none of the request's trailers goes, and a warning is
 * logged; the request itself goes on. */
void retry_req_trailer(struct retry_req *r, const char *k, size_t kl, const char *v, size_t vl);
/* The body is complete (or there is none). */
void retry_req_end(struct retry_req *r);

/* The client side is done with the request (answered, reset, or the client went away). */
void retry_req_completed(struct retry_req *r);
/* The upstream (its URL as configured, the request's snapshot's) of the request's last
 * attempt, NULL when none went: what a delivery records (proxy/core/durable.c). */
const char *retry_req_upstream(const struct retry_req *r);

/* The client went away, seen while the core could not have (a suspended HTTP/1.1 connection,
 * a backoff wait). Before its answer started, its attempts and waits end, and the front end is
 * told to reset it (status 0; 499 during a backoff wait); once its head has gone, the transfer
 * still sending the body ends, and the front end is told the body broke off (end()).
 * retry_req_completed() follows once the front end is done with it. */
void retry_req_client_gone(struct retry_req *r);

/* The answer is about to be handed to the protocol ('status' in the front's state): it is
 * counted before a byte leaves. */
void retry_req_sending(struct retry_req *r);

/* The front end took the response bytes just given and has no room for another write: the
 * upstream pauses now, holding none (attempt_pause_body()), until retry_req_room(). False when
 * it cannot: the front end says FRONT_FULL at the next write instead. */
bool retry_req_pause(struct retry_req *r);
/* The client took response bytes: a paused upstream may deliver again. */
void retry_req_room(struct retry_req *r);

/* References for the front end's own holders (a response body reader that the protocol library
 * may call after the request completed). */
void retry_req_hold(struct retry_req *r);
void retry_req_release(struct retry_req *r);

/* ---- from the worker ---- */

/* The drain deadline passed: answers every request of 'w' still waiting on the upstream side
 * (with its last upstream response, or a 503 "draining"). */
void retry_expire_all(struct worker *w);

#endif
