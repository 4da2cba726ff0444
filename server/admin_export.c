/* cotrain-admin export stats DIR: write the BOINC-style statistics export
 * (server/export_stats.h) once, e.g. from cron. */
#include <stdio.h>
#include <string.h>

#include "server/admin.h"
#include "server/export_stats.h"

static const char usage[] = "usage: cotrain-admin export stats DIR\n";

int admin_export_main(void *vctx, int argc, char **argv)
{
	admin_ctx *ctx = vctx;
	if (admin_wants_help(argc, argv)) {
		fputs(usage, stdout);
		fputs("Writes what BOINC's db_dump writes (tables.xml, user.gz, user_deleted.gz,\n"
		      "host.gz, host_deleted.gz, team.gz, db_dump.xml), for stats sites to fetch\n"
		      "(serve DIR as <project URL>/stats/).  The files are written into .DIR.new\n"
		      "beside DIR, which is then swapped with DIR in one step; the previous\n"
		      "generation stays as .DIR.old until the next export (doc/credit.md).\n",
		      stdout);
		return ADMIN_OK;
	}
	if (argc < 2)
		return admin_usage(usage, "no export command given");
	if (strcmp(argv[1], "stats") != 0)
		return admin_usage(usage, "unknown export command \"%s\"", argv[1]);
	if (argc != 3)
		return admin_usage(usage, "export stats takes one folder");
	int rc = admin_connect(ctx, true);
	if (rc)
		return rc;
	cot_errbuf eb = { 0 };
	if (stats_export(ctx->db, argv[2], &eb))
		return admin_fail(&eb);
	printf("wrote the statistics export to \"%s\"\n", argv[2]);
	return ADMIN_OK;
}
