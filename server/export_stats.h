/* cotrain: the statistics export as BOINC's db_dump writes it with its
 * default spec (doc/credit.md, "Stats export"), for third-party stats sites:
 * DIR/tables.xml, user.gz, user_deleted.gz, host.gz, host_deleted.gz,
 * team.gz and db_dump.xml, in db_dump's byte conventions (xml_escape's
 * escaping, %f numbers, its inclusion rules and optional elements).  Users
 * carry BOINC's cross-project id, cpid = md5(account.cross_project_id ||
 * lower(email)); hosts host_cpid = md5(host.cpid_seed || lower(email)). */
#ifndef COT_SERVER_EXPORT_STATS_H
#define COT_SERVER_EXPORT_STATS_H

#include <libpq-fe.h>

#include "shared/common/error.h"

/* Write the export as the folder dir over connection c, from one snapshot:
 * every file goes into the sibling .NAME.new, which then replaces dir in
 * one atomic exchange (the previous generation is kept as .NAME.old until
 * the next export), so dir always holds one whole generation.  Exports of
 * one dir are serialised by flock on .NAME.lock.  COT_ERR_IO, COT_ERR_DB or
 * COT_ERR_INVALID (dir not a folder path) with a message in eb; on error dir
 * is left as it was. */
cot_err stats_export(PGconn *c, const char *dir, cot_errbuf *eb);

/* A thread that runs stats_export every interval_s seconds (first at once)
 * on its own connection; errors are logged and retried at the next tick.
 * Of several server processes on one database only the holder of the
 * DUTY_STATS advisory lock exports (server/duty.h).  The strings must
 * outlive the timer. */
typedef struct stats_timer stats_timer;
cot_err stats_timer_start(const char *conninfo, const char *dir, int interval_s, stats_timer **out,
                          cot_errbuf *eb);
void stats_timer_stop(stats_timer *t);

/* cotrain-admin export stats DIR (server/admin_export.c). */
/* ctx is the admin_ctx * of server/admin.h. */
int admin_export_main(void *ctx, int argc, char **argv);

#endif
