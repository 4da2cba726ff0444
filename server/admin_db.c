/* cotrain-admin db: migrations and the schema version. */
#include "server/admin.h"

#include <stdio.h>
#include <string.h>

static const char usage[] =
	"usage: cotrain-admin db migrate    apply every pending migration, each in a\n"
	"                                   transaction, recorded in schema_migrations\n"
	"       cotrain-admin db status     show the database's and this build's schema\n"
	"                                   versions\n";

static int db_migrate_cmd(admin_ctx *ctx)
{
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, false))
		return ADMIN_FAIL;
	int applied = 0;
	if (db_migrate(ctx->db, &applied, &eb))
		return admin_fail(&eb);
	int v = db_schema_version(ctx->db, &eb);
	if (applied == 0)
		printf("database is up to date at schema version %d; nothing to do\n", v);
	else
		printf("applied %d migration%s; database is at schema version %d\n", applied,
		       applied == 1 ? "" : "s", v);
	return ADMIN_OK;
}

static int db_status_cmd(admin_ctx *ctx)
{
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, false))
		return ADMIN_FAIL;
	int v = db_schema_version(ctx->db, &eb);
	if (v < 0)
		return admin_fail(&eb);
	printf("schema version %d, this build expects %d: %s\n", v, db_schema_expected(),
	       v == db_schema_expected() ? "up to date" :
	       v < db_schema_expected() ? "run cotrain-admin db migrate" : "this build is older than the database");
	return v == db_schema_expected() ? ADMIN_OK : ADMIN_FAIL;
}

int admin_db_main(admin_ctx *ctx, int argc, char **argv)
{
	if (admin_wants_help(argc, argv)) {
		fputs(usage, stdout);
		return ADMIN_OK;
	}
	if (argc < 2)
		return admin_usage(usage, "db: no command given");
	if (argc > 2)
		return admin_usage(usage, "db %s: unexpected argument \"%s\"", argv[1], argv[2]);
	if (strcmp(argv[1], "migrate") == 0)
		return db_migrate_cmd(ctx);
	if (strcmp(argv[1], "status") == 0)
		return db_status_cmd(ctx);
	return admin_usage(usage, "db: unknown command \"%s\"", argv[1]);
}
