/* cotrain-admin: the maintainer's tool.  Global options, dispatch to the
 * command groups, and the helpers they share (admin.h). */
#include "server/admin.h"
#include "server/export_stats.h"

#include <errno.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/backend.h"
#include "shared/common/log.h"
#include "shared/common/options.h"

/* The command groups, each with its own argv ([0] the group's name). */
static int help_main(admin_ctx *ctx, int argc, char **argv);

static int export_main(admin_ctx *ctx, int argc, char **argv)
{
	return admin_export_main(ctx, argc, argv); /* export_stats.h takes a void * */
}

static const struct {
	const char *name;
	int (*run)(admin_ctx *ctx, int argc, char **argv);
} groups[] = {
	{ "db", admin_db_main },       { "dataset", admin_dataset_main }, { "project", admin_project_main },
	{ "user", admin_user_main },   { "team", admin_team_main },       { "status", admin_status_main },
	{ "export", export_main },     { "model", admin_model_main },     { "help", help_main },
	{ "files", admin_files_main }, { "backup", admin_backup_main },   { "restore", admin_restore_main },
	{ "host", admin_host_main },
};

static const opt_spec admin_opts[] = {
	{ "data-dir", 0, OPT_STRING, offsetof(admin_ctx, data_dir), .metavar = "DIR",
	  .help = "the server's data folder (default $COTRAIN_DATA_DIR, else " ADMIN_DEFAULT_DATA_DIR
	          "); the file store is DIR/files" },
	{ "db", 0, OPT_STRING, offsetof(admin_ctx, conninfo), .metavar = "CONNINFO",
	  .help = "a libpq connection string (default $COTRAIN_DB, else the embedded PostgreSQL "
	          "cluster in DIR/pg, started if needed)" },
	{ "help", 'h', OPT_HELP, .help = "this text; every command also takes --help" },
	{ "version", 0, OPT_VERSION, .help = "the version" },
	{ NULL }
};

static const opt_program admin_prog = {
	.prog = "cotrain-admin",
	.synopsis = "[--data-dir DIR] [--db CONNINFO] COMMAND [ARGS...]",
	.intro = "\n"
	         "The maintainer's tool for a cotrain project server.\n"
	         "\n"
	         "Commands:\n"
	         "  db migrate                     apply the pending database migrations\n"
	         "  db status                      show the schema version\n"
	         "  dataset import [--shard-tokens N] NAME PATH...\n"
	         "                                 import UTF-8 text files, folders and archives\n"
	         "  dataset list                   list the datasets\n"
	         "  project create FILE            create a project from a project file\n"
	         "  project list [--json]          list the projects\n"
	         "  project show [--json] NAME     one project: settings, config, round\n"
	         "  project pause NAME | project resume NAME\n"
	         "                                 stop or restart handing out work\n"
	         "  project delete [--force] NAME  delete a project, its rounds and versions\n"
	         "  project update [--json] [--at VERSION] NAME SETTING=VALUE...\n"
	         "                                 change lr, schedule, target batch, work-unit\n"
	         "                                 seconds or spot checks from a version on\n"
	         "  model export [--version V] [--format hf|cotrain] PROJECT DIR\n"
	         "                                 write a model version for Hugging Face\n"
	         "                                 transformers (GPT-2) or as a checkpoint\n"
	         "  model pin PROJECT VERSION | model unpin PROJECT VERSION\n"
	         "                                 keep a version's checkpoint whatever the policy\n"
	         "  files gc [--dry-run] [--keep-last N] [--keep-every K] [--grace S]\n"
	         "                                 remove what the retention policy lets go\n"
	         "  backup DIR                     database and files, while the server runs\n"
	         "  restore DIR                    into an empty --data-dir (or --db)\n"
	         "  user create [--admin] [--team TEAM] [--password-stdin] [--no-key] EMAIL NAME\n"
	         "  user list | user disable EMAIL | user enable EMAIL\n"
	         "  user set-admin EMAIL yes|no    grant or revoke administrator rights\n"
	         "  user key EMAIL                 issue a new account key\n"
	         "  team create [--description TEXT] [--founder EMAIL] NAME\n"
	         "  team list | team add TEAM EMAIL... | team remove EMAIL... | team delete TEAM\n"
	         "  host merge OLD NEW             fold host OLD into host NEW (one account's)\n"
	         "  status                         projects, versions, datasets, pool, work, hosts\n"
	         "  export stats DIR               BOINC-style statistics export (tables.xml, *.gz)\n",
	.outro = "Exit status: 0 success, 1 error, 2 bad command line.\n",
	.opts = admin_opts,
	.stop_at_command = true,
	.allow_args = true,
};

static int help_main(admin_ctx *ctx, int argc, char **argv)
{
	(void)ctx, (void)argc, (void)argv;
	opt_help(&admin_prog, stdout);
	return ADMIN_OK;
}

/* "cotrain-admin: WHAT" and the help on stderr; ADMIN_USAGE. */
static int main_usage(const char *fmt, const char *arg)
{
	fputs("cotrain-admin: ", stderr);
	fprintf(stderr, fmt, arg);
	fputc('\n', stderr);
	opt_help(&admin_prog, stderr);
	return ADMIN_USAGE;
}

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
		return admin_failf("could not create data directory \"%s\": %s", ctx->data_dir,
		                   strerror(errno));
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

PGresult *admin_exec(admin_ctx *ctx, const char *sql, int n, const char *const *params, cot_errbuf *eb)
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

void admin_rollback(admin_ctx *ctx) { PQclear(PQexec(ctx->db, "ROLLBACK")); }

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv); /* first: may re-exec with a faster BLAS core */
	admin_ctx ctx = { 0 };
	cot_log_set_ident("cotrain-admin");
	ctx.data_dir = getenv("COTRAIN_DATA_DIR");
	ctx.conninfo = getenv("COTRAIN_DB");
	int first;
	opt_result orc = opt_parse(&admin_prog, argc, argv, &ctx, &first);
	if (orc)
		return orc == OPT_EXIT ? ADMIN_OK : ADMIN_USAGE;
	if (!ctx.data_dir || !*ctx.data_dir)
		ctx.data_dir = ADMIN_DEFAULT_DATA_DIR;
	if (ctx.conninfo && !*ctx.conninfo)
		ctx.conninfo = NULL;
	if (strlen(ctx.data_dir) > 300)
		return admin_failf("data directory path is too long");
	snprintf(ctx.store_dir, sizeof ctx.store_dir, "%s/files", ctx.data_dir);
	if (first >= argc)
		return main_usage("%s", "no command given");

	const char *cmd = argv[first];
	int g = 0, ng = (int)(sizeof groups / sizeof groups[0]);
	while (g < ng && strcmp(cmd, groups[g].name) != 0)
		g++;
	if (g == ng)
		return main_usage("unknown command \"%s\"", cmd);
	int rc = groups[g].run(&ctx, argc - first, argv + first);
	if (ctx.db)
		PQfinish(ctx.db);
	db_target_close(&ctx.target);
	return rc;
}
