/* reqfront -- the calls of proxy/core/retry.h a front end makes that move no state: its own
 * references to a request, the answer counted before a byte of it leaves, and the response's
 * flow paused and resumed as the client takes it. Beside the state machine (retry.c, the calls
 * that move a request) and above what it has (req.c, which includes nothing of retry.h: the
 * machine includes req.h, and the two would include each other).
 */
#include "proxy/core/retry.h"

#include "proxy/core/req.h"

void retry_req_hold(struct retry_req *r)
{
    r->refs++;
}

void retry_req_release(struct retry_req *r)
{
    req_release(r);
}

void retry_req_sending(struct retry_req *r)
{
    tally_answer(r);
}

bool retry_req_pause(struct retry_req *r)
{
    return attempt_pause_body(&r->cur->att);
}

void retry_req_room(struct retry_req *r)
{
    attempt_resume_body(&r->cur->att);
}
