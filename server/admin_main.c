/* cotrain-admin: the maintainer's tool.  Global options, dispatch to the
 * command groups, and the helpers they share (admin.h). */
#include "server/admin.h"
#include "server/export_stats.h"

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/backend.h"
#include "shared/common/log.h"

static const char usage_text[] =
	"usage: cotrain-admin [--data-dir DIR] [--db CONNINFO] COMMAND [ARGS...]\n"
	"\n"
	"The maintainer's tool for a cotrain project server.\n"
	"\n"
	"Commands:\n"
	"  db migrate                     apply the pending database migrations\n"
	"  db status                      show the schema version\n"
	"  dataset import [--shard-tokens N] NAME PATH...\n"
	"                                 import UTF-8 text files, folders and archives\n"
	"  dataset list                   list the datasets\n"
	"  project create FILE            create a project from a project file\n"
	"  project list                   list the projects\n"
	"  user create [--admin] [--team TEAM] [--password-stdin] [--no-key] EMAIL NAME\n"
	"  user list | user disable EMAIL | user enable EMAIL\n"
	"  user set-admin EMAIL yes|no    grant or revoke administrator rights\n"
	"  user key EMAIL                 issue a new account key\n"
	"  team create [--description TEXT] [--founder EMAIL] NAME\n"
	"  team list | team add TEAM EMAIL... | team remove EMAIL... | team delete TEAM\n"
	"  status                         projects, versions, datasets, pool, work, hosts\n"
	"  export stats DIR               BOINC-style statistics export (tables.xml, *.gz)\n"
	"\n"
	"Options:\n"
	"  --data-dir DIR    the server's data folder (default $COTRAIN_DATA_DIR, else\n"
	"                    " ADMIN_DEFAULT_DATA_DIR "); the file store is DIR/files\n"
	"  --db CONNINFO     a libpq connection string (default $COTRAIN_DB, else the\n"
	"                    embedded PostgreSQL cluster in DIR/pg, started if needed)\n"
	"  -h, --help        this text; every command also takes --help\n"
	"\n"
	"Exit status: 0 success, 1 error, 2 bad command line.\n";

int admin_fail(const cot_errbuf *eb)
{
	fprintf(stderr, "cotrain-admin: error: %s\n", eb->msg[0] ? eb->msg : "unknown error");
	if (eb->hint[0])
		fprintf(stderr, "cotrain-admin: hint: %s\n", eb->hint);
	return ADMIN_FAIL;
}

int admin_failf(const char *fmt, ...)
{
	va_list ap;
	fputs("cotrain-admin: error: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return ADMIN_FAIL;
}

int admin_usage(const char *usage, const char *fmt, ...)
{
	va_list ap;
	fputs("cotrain-admin: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n%s", usage);
	return ADMIN_USAGE;
}

bool admin_wants_help(int argc, char **argv)
{
	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--") == 0)
			return false;
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
			return true;
	}
	return false;
}

bool admin_parse_ll(const char *s, long long min, long long max, long long *out)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return false;
	*out = v;
	return true;
}

int admin_ensure_data_dir(admin_ctx *ctx)
{
	struct stat st;
	if (stat(ctx->data_dir, &st) == 0) {
		if (!S_ISDIR(st.st_mode))
			return admin_failf("data directory \"%s\" is not a directory", ctx->data_dir);
		return ADMIN_OK;
	}
	if (mkdir(ctx->data_dir, 0755) != 0 && errno != EEXIST)
		return admin_failf("could not create data directory \"%s\": %s", ctx->data_dir, strerror(errno));
	return ADMIN_OK;
}

int admin_connect(admin_ctx *ctx, bool check_schema)
{
	cot_errbuf eb = { "", "" };
	if (!ctx->db) {
		if (!ctx->conninfo && admin_ensure_data_dir(ctx))
			return ADMIN_FAIL;
		if (db_resolve(ctx->data_dir, ctx->conninfo, &ctx->target, &eb) ||
		    db_connect(ctx->target.conninfo, &ctx->db, &eb))
			return admin_fail(&eb);
		PQclear(PQexec(ctx->db, "SET client_min_messages = warning"));
	}
	if (check_schema && db_schema_check(ctx->db, &eb))
		return admin_fail(&eb);
	return ADMIN_OK;
}

PGresult *admin_exec(admin_ctx *ctx, const char *sql, int n, const char *const *params,
                     cot_errbuf *eb)
{
	PGresult *r = PQexecParams(ctx->db, sql, n, NULL, params, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(r);
	if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
		return r;
	if (r)
		db_result_error(r, eb, "query failed");
	else
		cot_seterr(eb, COT_ERR_DB, "could not run query: %s", PQerrorMessage(ctx->db));
	PQclear(r);
	return NULL;
}

cot_err admin_begin(admin_ctx *ctx, cot_errbuf *eb)
{
	PGresult *r = admin_exec(ctx, "BEGIN", 0, NULL, eb);
	if (!r)
		return COT_ERR_DB;
	PQclear(r);
	return COT_OK;
}

cot_err admin_commit(admin_ctx *ctx, cot_errbuf *eb)
{
	PGresult *r = admin_exec(ctx, "COMMIT", 0, NULL, eb);
	if (!r)
		return COT_ERR_DB;
	PQclear(r);
	return COT_OK;
}

void admin_rollback(admin_ctx *ctx)
{
	PQclear(PQexec(ctx->db, "ROLLBACK"));
}

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv);  /* first: may re-exec with a faster BLAS core */
	static const struct option opts[] = {
		{ "data-dir", required_argument, NULL, 'd' },
		{ "db", required_argument, NULL, 'b' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	admin_ctx ctx = { 0 };
	cot_log_set_ident("cotrain-admin");
	ctx.data_dir = getenv("COTRAIN_DATA_DIR");
	ctx.conninfo = getenv("COTRAIN_DB");
	int c;
	while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
		switch (c) {
		case 'd': ctx.data_dir = optarg; break;
		case 'b': ctx.conninfo = optarg; break;
		case 'h': fputs(usage_text, stdout); return ADMIN_OK;
		default: fputs(usage_text, stderr); return ADMIN_USAGE;
		}
	}
	if (!ctx.data_dir || !*ctx.data_dir)
		ctx.data_dir = ADMIN_DEFAULT_DATA_DIR;
	if (ctx.conninfo && !*ctx.conninfo)
		ctx.conninfo = NULL;
	if (strlen(ctx.data_dir) > 300)
		return admin_failf("data directory path is too long");
	snprintf(ctx.store_dir, sizeof ctx.store_dir, "%s/files", ctx.data_dir);
	if (optind >= argc)
		return admin_usage(usage_text, "no command given");

	const char *cmd = argv[optind];
	/* Groups get their own argv: [0] is the group's name, [1] the command. */
	int sub_argc = argc - optind;
	char **sub_argv = argv + optind;
	int rc;
	if (strcmp(cmd, "db") == 0)
		rc = admin_db_main(&ctx, sub_argc, sub_argv);
	else if (strcmp(cmd, "dataset") == 0)
		rc = admin_dataset_main(&ctx, sub_argc, sub_argv);
	else if (strcmp(cmd, "project") == 0)
		rc = admin_project_main(&ctx, sub_argc, sub_argv);
	else if (strcmp(cmd, "user") == 0)
		rc = admin_user_main(&ctx, sub_argc, sub_argv);
	else if (strcmp(cmd, "team") == 0)
		rc = admin_team_main(&ctx, sub_argc, sub_argv);
	else if (strcmp(cmd, "status") == 0)
		rc = admin_status_main(&ctx, sub_argc, sub_argv);
	else if (strcmp(cmd, "export") == 0)
		rc = admin_export_main(&ctx, sub_argc, sub_argv);
	else if (strcmp(cmd, "help") == 0) {
		fputs(usage_text, stdout);
		rc = ADMIN_OK;
	} else
		rc = admin_usage(usage_text, "unknown command \"%s\"", cmd);
	if (ctx.db)
		PQfinish(ctx.db);
	db_target_close(&ctx.target);
	return rc;
}
