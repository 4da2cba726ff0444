/* cotrain client: the close notice.  While the worker computes a work
 * unit, one thread long-polls the unit's round (GET
 * /v1/workunits/{id}/round?wait=30, doc/api.md), so that the daemon hears
 * that the round closed the moment it does, rather than at its next
 * heartbeat (heartbeat_interval seconds later): what every peer's report,
 * and so the round's plan, waits for (doc/scale.md).  The answer is taken
 * as a heartbeat's answer is (cl_daemon_note_round: the round is due and
 * compute stops at the next microbatch).  A server without the route (404
 * while the unit is ours to compute) is not asked again for that project
 * until the daemon restarts; heartbeats still tell the close there. */
#ifndef CL_CLOSE_WATCH_H
#define CL_CLOSE_WATCH_H

#include "client/daemon.h"

typedef struct cl_close_watch cl_close_watch;

/* Start the thread; *out owns it.  COT_ERR_NOMEM or COT_ERR_INTERNAL when
 * it cannot start (the daemon then runs without it). */
cot_err cl_close_watch_start(cl_daemon *d, cl_close_watch **out, cot_errbuf *eb);

/* Stop and free it: once d->stop is set, the long poll in flight gives up
 * at its next look (cl_http_req.cancel).  NULL is a no-op. */
void cl_close_watch_stop(cl_close_watch *w);

#endif
