/* cotrain-server: the file store's collector on a timer (--gc-interval).
 * Every interval (the first pass one interval after start) a thread opens its
 * own database connection and runs one fgc_run pass (server/file_gc.h) with
 * the server's retention policy, logging what it removed; a pass skipped
 * because a backup holds the lock, or failed, is logged and tried again at
 * the next interval.  Of several server processes on one database only the
 * holder of the DUTY_GC advisory lock collects (server/duty.h). */
#ifndef COT_SERVER_GC_TIMER_H
#define COT_SERVER_GC_TIMER_H

#include "server/file_gc.h"
#include "shared/common/error.h"

typedef struct gc_timer gc_timer;

/* Start the thread.  conninfo and store_dir are not copied and must outlive
 * the timer.  *out owns the thread; stop it with gc_timer_stop. */
cot_err gc_timer_start(const char *conninfo, const char *store_dir, const fgc_policy *pol, int interval_s,
                       gc_timer **out, cot_errbuf *eb);
/* Stop the thread (waiting for a pass in progress) and free t.  NULL is a
 * no-op. */
void gc_timer_stop(gc_timer *t);

#endif
