/* cotrain-admin: what its command files share.
 *
 * Each command group lives in its own file (admin_db.c, admin_dataset.c,
 * admin_project.c, admin_model.c, admin_users.c, admin_status.c) and is entered through
 * one function taking the words after the group's name.  Commands return an
 * exit code: ADMIN_OK, ADMIN_FAIL (an error, already reported on stderr) or
 * ADMIN_USAGE (bad command line, already reported). */
#ifndef COT_ADMIN_H
#define COT_ADMIN_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "shared/database/db.h"
#include "shared/common/error.h"

enum { ADMIN_OK = 0, ADMIN_FAIL = 1, ADMIN_USAGE = 2 };

#define ADMIN_DEFAULT_DATA_DIR "/var/lib/cotrain"

typedef struct {
	const char *data_dir; /* --data-dir, $COTRAIN_DATA_DIR or the default */
	char store_dir[512];  /* <data dir>/files */
	const char *conninfo; /* --db or $COTRAIN_DB; NULL: the embedded default */
	db_target target;
	PGconn *db; /* after admin_connect */
} admin_ctx;

/* Command groups: argv[0] is the group's name ("dataset"), argv[1] its
 * command ("import"). */
int admin_db_main(admin_ctx *ctx, int argc, char **argv);
int admin_dataset_main(admin_ctx *ctx, int argc, char **argv);
int admin_tokenizer_main(admin_ctx *ctx, int argc, char **argv); /* dataset tokenizer ... */

struct spm_model;
/* The SentencePiece model stored under sha in ctx's file store, checked
 * against its sha256, into *out (free with spm_free).  The errors of
 * fs_read_verified and spm_load (admin_tokenizer.c). */
cot_err admin_tokenizer_load(admin_ctx *ctx, const char *sha, struct spm_model **out, cot_errbuf *eb);
int admin_project_main(admin_ctx *ctx, int argc, char **argv);
/* project update (admin_project_update.c); argv[0] is "update". */
int admin_project_update(admin_ctx *ctx, int argc, char **argv);
int admin_user_main(admin_ctx *ctx, int argc, char **argv);
int admin_team_main(admin_ctx *ctx, int argc, char **argv);
int admin_status_main(admin_ctx *ctx, int argc, char **argv);
int admin_model_main(admin_ctx *ctx, int argc, char **argv);
int admin_files_main(admin_ctx *ctx, int argc, char **argv);
int admin_backup_main(admin_ctx *ctx, int argc, char **argv);
int admin_restore_main(admin_ctx *ctx, int argc, char **argv);
int admin_host_main(admin_ctx *ctx, int argc, char **argv);

/* Open the database (starting the embedded cluster when needed) unless
 * already open.  With check_schema, refuse a database whose schema is not
 * this build's (hinting at `db migrate`).  Reports errors itself; returns
 * ADMIN_OK or ADMIN_FAIL. */
int admin_connect(admin_ctx *ctx, bool check_schema);

/* Create the data folder when it is missing.  ADMIN_OK or ADMIN_FAIL. */
int admin_ensure_data_dir(admin_ctx *ctx);

/* Report an error (and its hint) on stderr: "cotrain-admin: error: ...".
 * Returns ADMIN_FAIL. */
int admin_fail(const cot_errbuf *eb);
int admin_failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Report a usage error and the command's usage line; returns ADMIN_USAGE. */
int admin_usage(const char *usage, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* True when argv[i] is --help or -h for some i in 0..argc-1. */
bool admin_wants_help(int argc, char **argv);

/* Run a parameterized statement.  Returns the result when its status is
 * PGRES_TUPLES_OK or PGRES_COMMAND_OK (the caller PQclear()s it); otherwise
 * NULL, with the database's message in eb. */
PGresult *admin_exec(admin_ctx *ctx, const char *sql, int n, const char *const *params, cot_errbuf *eb);

/* BEGIN, COMMIT, ROLLBACK.  Begin and commit return COT_OK or COT_ERR_DB;
 * rollback cannot fail in a way the caller could act on. */
cot_err admin_begin(admin_ctx *ctx, cot_errbuf *eb);
cot_err admin_commit(admin_ctx *ctx, cot_errbuf *eb);
void admin_rollback(admin_ctx *ctx);

/* Parse a decimal integer in [min, max]; false when s is not one. */
bool admin_parse_ll(const char *s, long long min, long long max, long long *out);

#endif
