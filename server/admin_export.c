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
		fputs("Writes DIR/tables.xml, DIR/user.gz, DIR/team.gz and DIR/host.gz in BOINC's\n"
		      "db_dump layout, for stats sites to fetch (serve DIR as <project URL>/stats/).\n",
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
