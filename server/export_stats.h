/* cotrain: the statistics export in BOINC's db_dump layout (doc/credit.md),
 * for third-party stats sites: DIR/tables.xml, DIR/user.gz, DIR/team.gz and
 * DIR/host.gz (gzip written with libarchive).  Users carry BOINC's
 * cross-project id, cpid = md5(account.cross_project_id || lower(email)).
 * Totals and expavg_credit/expavg_time are the stored RAC and its time, as
 * BOINC exports them (readers decay them). */
#ifndef COT_SERVER_EXPORT_STATS_H
#define COT_SERVER_EXPORT_STATS_H

#include <libpq-fe.h>

#include "shared/common/error.h"

/* Write the export into dir (created when missing) over connection c.  The
 * files are written under temporary names and renamed into place, so a
 * reader never sees a half-written file.  COT_ERR_IO or COT_ERR_DB with a
 * message in eb. */
cot_err stats_export(PGconn *c, const char *dir, cot_errbuf *eb);

/* A thread that runs stats_export every interval_s seconds (first at once)
 * on its own connection; errors are logged and retried at the next tick.
 * The strings must outlive the timer. */
typedef struct stats_timer stats_timer;
cot_err stats_timer_start(const char *conninfo, const char *dir, int interval_s,
                          stats_timer **out, cot_errbuf *eb);
void stats_timer_stop(stats_timer *t);

/* cotrain-admin export stats DIR (server/admin_export.c). */
/* ctx is the admin_ctx * of server/admin.h. */
int admin_export_main(void *ctx, int argc, char **argv);

#endif
