/* cotrain: the database: connections, migrations, functions, and where it
 * lives.
 *
 * Migrations are the files db/migrations/NNNN_name.sql (table changes and
 * data moves, never edited once landed); function files are
 * db/functions/name.sql, the current definition of every function, each
 * idempotent (db/README).  Both are embedded into every binary at build
 * time.  Migrating applies the pending migrations in version order, each
 * recorded in schema_migrations with the sha256 of its text, then every
 * function file whose sha256 differs from the one recorded in
 * schema_function_files, in name order; all in one transaction.  Programs
 * check at start that both are this build's and refuse otherwise. */
#ifndef COT_DB_H
#define COT_DB_H

#include <libpq-fe.h>

#include "shared/common/error.h"
#include "shared/database/pgcluster.h"

typedef struct {
	int version;      /* NNNN */
	const char *name; /* file name without .sql */
	const char *sql;
} db_migration;

typedef struct {
	const char *name; /* file name, "sched.sql" */
	const char *sql;
} db_function_file;

/* The embedded migrations, in version order, and function files, in name
 * order (generated, db/db.am). */
extern const db_migration db_migrations[];
extern const int db_n_migrations;
extern const db_function_file db_function_files[];
extern const int db_n_function_files;

/* The schema version this build expects: the last embedded migration. */
int db_schema_expected(void);

/* Connect with a libpq conninfo string.  On success *out is an open
 * connection the caller PQfinish()es; on error eb holds libpq's message. */
cot_err db_connect(const char *conninfo, PGconn **out, cot_errbuf *eb);

/* Apply every embedded migration the database lacks, in version order, then
 * every embedded function file whose checksum differs from the one recorded
 * for it (or that was never applied), in name order: all in one
 * transaction, serialised against concurrent migrators, so that on error
 * nothing changes.  *applied and *files (when not NULL) get the number of
 * migrations and function files applied now.  A recorded migration whose
 * text differs from the embedded one is an error (migrations are never
 * edited once landed). */
cot_err db_migrate(PGconn *c, int *applied, int *files, cot_errbuf *eb);

/* The number of embedded function files not applied as they are (never
 * applied, or applied with another checksum), or -1 on error. */
int db_functions_pending(PGconn *c, cot_errbuf *eb);

/* The database's schema version (0 for an empty database), or -1 on error. */
int db_schema_version(PGconn *c, cot_errbuf *eb);

/* COT_OK when the database's schema is exactly what this build expects:
 * its schema version, and every function file applied as embedded;
 * COT_ERR_SCHEMA with a hint otherwise. */
cot_err db_schema_check(PGconn *c, cot_errbuf *eb);

/* Where the database is.  With `conninfo` (from --db or $COTRAIN_DB) that
 * database is used.  Without, the embedded default: the private cluster in
 * <datadir>/pg: connect to it when it is already running (the server's), or
 * start it, owned by this process and stopped by db_target_close().
 * `datadir` must exist. */
typedef struct {
	char conninfo[512];
	pgc_cluster *cluster; /* non-NULL when we started the cluster */
} db_target;

cot_err db_resolve(const char *datadir, const char *conninfo, db_target *out, cot_errbuf *eb);
void db_target_close(db_target *t);

/* Shorthand for an error from a failed PGresult: copies its primary message
 * (and hint) into eb and returns COT_ERR_DB. */
cot_err db_result_error(const PGresult *r, cot_errbuf *eb, const char *what);

#endif
