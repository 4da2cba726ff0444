/* cotrain-server: the reaper thread.  Every interval it expires the live
 * work units whose deadline has passed (sched_reap in db/functions/sched.sql,
 * FOR UPDATE SKIP LOCKED, so it never waits on a heartbeat) and so returns
 * their unprocessed microbatches to the pool.  It uses its own database
 * connection; errors are logged and retried at the next pass.  Of several
 * server processes on one database only the holder of the DUTY_REAPER
 * advisory lock reaps (server/duty.h). */
#ifndef COT_SERVER_REAPER_H
#define COT_SERVER_REAPER_H

#include "shared/common/error.h"

typedef struct reaper reaper;

/* Start reaping every interval_s seconds (>= 1), holding the duty on a
 * connection with conninfo (not copied).  *out owns the thread. */
cot_err reaper_start(const char *conninfo, int interval_s, reaper **out, cot_errbuf *eb);
/* Wake the thread, wait for it to finish its pass and exit, free r. */
void reaper_stop(reaper *r);

#endif
