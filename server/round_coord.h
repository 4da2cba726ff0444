/* cotrain-server: the round coordinator, a thread beside the HTTP workers.
 *
 * Every config->round_interval seconds (and at once when round_coord_wake is
 * called, as after a report) it makes one pass over the rounds in the
 * database (db/functions/round.sql, round_plan.sql):
 *   1. closes open rounds whose samples reached the target, or that reached
 *      round_close_fraction of it while the live work units, at their
 *      reported speed, would need more than round_straggler_budget seconds
 *      for the rest (round_close_due);
 *   2. fails rounds whose averaging deadline passed (round_expire_averaging)
 *      and settles spot checks past their deadline (spot_expire, so they
 *      expire whether or not a host lists or claims checks);
 *   3. plans each closing round once every holder of gradients reported (or
 *      round_report_timeout seconds after it closed, dropping those that did
 *      not): groups of at most round_max_group peers close by round-trip time
 *      (grp_form), each group's shares of the parameter vector by DeDLOC's
 *      load balancing (lb_shares, lb_split); the plan is stored and the round
 *      goes to 'averaging'.
 * Only the process holding the DUTY_ROUNDS advisory lock (server/duty.h)
 * makes these passes; another takes the duty over within round_interval
 * seconds of its holder's death.  Every step is idempotent besides, so a
 * holder that lost its lock in the middle of a pass does no harm.
 * After storing a plan, and whenever the rounds not yet committed changed
 * (every process looks every 250 ms, whoever moved them: another server
 * process, a failure at a deadline), it wakes the held long polls
 * (http_wake_held).
 * It uses its own database connection; errors are logged and the pass is
 * tried again next time. */
#ifndef COT_SERVER_ROUND_COORD_H
#define COT_SERVER_ROUND_COORD_H

#include "server/settings.h"
#include "shared/common/error.h"

typedef struct round_coord round_coord;

/* Start the thread; cfg must outlive it.  *out owns it. */
cot_err round_coord_start(const srv_config *cfg, round_coord **out, cot_errbuf *eb);
/* Ask for a pass now (no-op when no coordinator runs).  Thread-safe. */
void round_coord_wake(void);
/* Stop the thread after its current pass and free it (NULL is fine). */
void round_coord_stop(round_coord *rc);

#endif
