/* cotrain-admin db: migrations, function files and the schema version. */
#include "server/admin.h"

#include <stdio.h>
#include <string.h>

static const char usage[] =
        "usage: cotrain-admin db migrate    apply every pending migration (recorded in\n"
        "                                   schema_migrations), then every function file\n"
        "                                   that changed (recorded in schema_function_files),\n"
        "                                   all in one transaction\n"
        "       cotrain-admin db status     show the database's and this build's schema\n"
        "                                   versions and the function files to apply\n";

static int db_migrate_cmd(admin_ctx *ctx)
{
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, false))
		return ADMIN_FAIL;
	int applied = 0, files = 0;
	if (db_migrate(ctx->db, &applied, &files, &eb))
		return admin_fail(&eb);
	int v = db_schema_version(ctx->db, &eb);
	if (applied == 0 && files == 0)
		printf("database is up to date at schema version %d; nothing to do\n", v);
	else
		printf("applied %d migration%s and %d function file%s; database is at schema version %d\n",
		       applied, applied == 1 ? "" : "s", files, files == 1 ? "" : "s", v);
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
	int pending = db_functions_pending(ctx->db, &eb);
	if (pending < 0)
		return admin_fail(&eb);
	int want = db_schema_expected();
	printf("schema version %d, this build expects %d; %d of %d function files to apply: %s\n", v, want,
	       pending, db_n_function_files,
	       v == want && pending == 0 ? "up to date"
	       : v <= want               ? "run cotrain-admin db migrate"
	                                 : "this build is older than the database");
	return v == want && pending == 0 ? ADMIN_OK : ADMIN_FAIL;
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
