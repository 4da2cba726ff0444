/* cotrain: connections, migrations and function files, the embedded default. */
#include "config.h"
#include "shared/database/db.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/common/hash.h"

#define DB_NAME "cotrain"

int db_schema_expected(void) { return db_n_migrations ? db_migrations[db_n_migrations - 1].version : 0; }

cot_err db_result_error(const PGresult *r, cot_errbuf *eb, const char *what)
{
	const char *m = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;
	const char *h = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_HINT) : NULL;
	cot_seterr(eb, COT_ERR_DB, "%s: %s", what, m ? m : "no result from server");
	if (h)
		cot_sethint(eb, "%s", h);
	return COT_ERR_DB;
}

cot_err db_connect(const char *conninfo, PGconn **out, cot_errbuf *eb)
{
	*out = NULL;
	PGconn *c = PQconnectdb(conninfo);
	if (!c)
		return COT_ERR_NOMEM;
	if (PQstatus(c) != CONNECTION_OK) {
		char msg[400];
		snprintf(msg, sizeof msg, "%s", PQerrorMessage(c));
		msg[strcspn(msg, "\n")] = '\0';
		PQfinish(c);
		return cot_seterr(eb, COT_ERR_DB, "could not connect to the database: %s", msg);
	}
	/* Keep the server's notices (e.g. "relation already exists, skipping")
	 * off the user's terminal. */
	PQsetNoticeProcessor(c, NULL, NULL);
	*out = c;
	return COT_OK;
}

static cot_err exec_ok(PGconn *c, const char *sql, cot_errbuf *eb, const char *what)
{
	PGresult *r = PQexec(c, sql);
	ExecStatusType st = PQresultStatus(r);
	cot_err e = (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) ? COT_OK : db_result_error(r, eb, what);
	PQclear(r);
	return e;
}

int db_schema_version(PGconn *c, cot_errbuf *eb)
{
	PGresult *r = PQexec(c, "SELECT to_regclass('schema_migrations') IS NOT NULL");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		db_result_error(r, eb, "could not read the schema version");
		PQclear(r);
		return -1;
	}
	int has = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
	PQclear(r);
	if (!has)
		return 0;
	r = PQexec(c, "SELECT coalesce(max(version), 0) FROM schema_migrations");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		db_result_error(r, eb, "could not read the schema version");
		PQclear(r);
		return -1;
	}
	int v = atoi(PQgetvalue(r, 0, 0));
	PQclear(r);
	return v;
}

cot_err db_schema_check(PGconn *c, cot_errbuf *eb)
{
	int have = db_schema_version(c, eb);
	if (have < 0)
		return COT_ERR_DB;
	int want = db_schema_expected();
	if (have < want) {
		cot_seterr(eb, COT_ERR_SCHEMA,
		           "database schema is at version %d, this build needs version %d", have, want);
		cot_sethint(eb, "Run \"cotrain-admin db migrate\".");
		return COT_ERR_SCHEMA;
	}
	if (have > want) {
		cot_seterr(eb, COT_ERR_SCHEMA, "database schema version %d is newer than this build's (%d)",
		           have, want);
		cot_sethint(eb, "Upgrade cotrain to the version that migrated this database.");
		return COT_ERR_SCHEMA;
	}
	int pending = db_functions_pending(c, eb);
	if (pending < 0)
		return COT_ERR_DB;
	if (pending > 0) {
		cot_seterr(eb, COT_ERR_SCHEMA,
		           "%d of this build's %d function files %s not applied to the database", pending,
		           db_n_function_files, pending == 1 ? "is" : "are");
		cot_sethint(eb, "Run \"cotrain-admin db migrate\".");
		return COT_ERR_SCHEMA;
	}
	return COT_OK;
}

int db_functions_pending(PGconn *c, cot_errbuf *eb)
{
	PGresult *r = PQexec(c, "SELECT to_regclass('schema_function_files') IS NOT NULL");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		db_result_error(r, eb, "could not read schema_function_files");
		PQclear(r);
		return -1;
	}
	int has = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
	PQclear(r);
	if (!has)
		return db_n_function_files;
	r = PQexec(c, "SELECT name, checksum FROM schema_function_files");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		db_result_error(r, eb, "could not read schema_function_files");
		PQclear(r);
		return -1;
	}
	int pending = 0;
	for (int i = 0; i < db_n_function_files; i++) {
		char sum[HASH_SHA256_HEX_LEN + 1];
		if (hash_sha256_hex(db_function_files[i].sql, strlen(db_function_files[i].sql), sum)) {
			PQclear(r);
			cot_seterr(eb, COT_ERR_NOMEM,
			           "could not compute the checksum of function file \"%s\"",
			           db_function_files[i].name);
			return -1;
		}
		bool same = false;
		for (int j = 0; j < PQntuples(r) && !same; j++)
			same = strcmp(PQgetvalue(r, j, 0), db_function_files[i].name) == 0 &&
			       strcmp(PQgetvalue(r, j, 1), sum) == 0;
		pending += !same;
	}
	PQclear(r);
	return pending;
}

/* Apply or verify one migration inside db_migrate's transaction, which holds
 * the schema_migrations lock.  *did is set when it was applied now. */
static cot_err migrate_one(PGconn *c, const db_migration *m, int *did, cot_errbuf *eb)
{
	char vs[16], sum[HASH_SHA256_HEX_LEN + 1];
	snprintf(vs, sizeof vs, "%d", m->version);
	if (hash_sha256_hex(m->sql, strlen(m->sql), sum))
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not hash migration %04d_%s", m->version,
		                  m->name);
	const char *p1[1] = { vs };
	PGresult *r = PQexecParams(c, "SELECT name, checksum FROM schema_migrations WHERE version = $1", 1,
	                           NULL, p1, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		cot_err e = db_result_error(r, eb, "could not read schema_migrations");
		PQclear(r);
		return e;
	}
	if (PQntuples(r) == 1) {
		int same = strcmp(PQgetvalue(r, 0, 1), sum) == 0;
		PQclear(r);
		if (!same) {
			cot_seterr(eb, COT_ERR_SCHEMA,
			           "migration %04d_%s differs from the one applied to this database",
			           m->version, m->name);
			cot_sethint(eb, "Migrations must never be edited once applied; add a new migration "
			                "instead.");
			return COT_ERR_SCHEMA;
		}
		*did = 0;
		return COT_OK;
	}
	PQclear(r);

	char what[160];
	snprintf(what, sizeof what, "migration %04d_%s failed", m->version, m->name);
	cot_err e = exec_ok(c, m->sql, eb, what);
	if (e)
		return e;
	const char *p3[3] = { vs, m->name, sum };
	r = PQexecParams(c, "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)", 3,
	                 NULL, p3, NULL, NULL, 0);
	e = PQresultStatus(r) == PGRES_COMMAND_OK ? COT_OK
	                                          : db_result_error(r, eb, "could not record migration");
	PQclear(r);
	*did = 1;
	return e;
}

/* Apply one function file inside the migration's transaction when the
 * checksum recorded for it differs from its text's (or none is), and record
 * the new one.  *did is set when it was applied now. */
static cot_err apply_function_file(PGconn *c, const db_function_file *f, int *did, cot_errbuf *eb)
{
	char sum[HASH_SHA256_HEX_LEN + 1];
	if (hash_sha256_hex(f->sql, strlen(f->sql), sum))
		return cot_seterr(eb, COT_ERR_NOMEM, "could not compute the checksum of function file \"%s\"",
		                  f->name);
	const char *p2[2] = { f->name, sum };
	PGresult *r = PQexecParams(c, "SELECT 1 FROM schema_function_files WHERE name = $1 AND checksum = $2",
	                           2, NULL, p2, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		cot_err e = db_result_error(r, eb, "could not read schema_function_files");
		PQclear(r);
		return e;
	}
	int same = PQntuples(r) == 1;
	PQclear(r);
	*did = 0;
	if (same)
		return COT_OK;

	char what[160];
	snprintf(what, sizeof what, "function file %s failed", f->name);
	cot_err e = exec_ok(c, f->sql, eb, what);
	if (e)
		return e;
	r = PQexecParams(c,
	                 "INSERT INTO schema_function_files (name, checksum) VALUES ($1, $2)"
	                 " ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()",
	                 2, NULL, p2, NULL, NULL, 0);
	e = PQresultStatus(r) == PGRES_COMMAND_OK ? COT_OK
	                                          : db_result_error(r, eb, "could not record function file");
	PQclear(r);
	*did = 1;
	return e;
}

/* The body of db_migrate, inside its transaction. */
static cot_err migrate_all(PGconn *c, int *applied, int *files, cot_errbuf *eb)
{
	cot_err e = exec_ok(c, "LOCK TABLE schema_migrations IN EXCLUSIVE MODE", eb,
	                    "could not lock schema_migrations");
	for (int i = 0; !e && i < db_n_migrations; i++) {
		int did = 0;
		e = migrate_one(c, &db_migrations[i], &did, eb);
		*applied += did;
	}
	/* The functions after every migration: a migration may drop or change
	 * what a function uses, and it runs against the functions the previous
	 * migrate left (on a fresh database, the definitions the migrations
	 * themselves carry).  See db/README. */
	if (!e)
		e = exec_ok(c,
		            "CREATE TABLE IF NOT EXISTS schema_function_files ("
		            " name text PRIMARY KEY, checksum text NOT NULL,"
		            " applied_at timestamptz NOT NULL DEFAULT now())",
		            eb, "could not create schema_function_files");
	for (int i = 0; !e && i < db_n_function_files; i++) {
		int did = 0;
		e = apply_function_file(c, &db_function_files[i], &did, eb);
		*files += did;
	}
	return e;
}

cot_err db_migrate(PGconn *c, int *applied, int *files, cot_errbuf *eb)
{
	int n_applied = 0, n_files = 0;
	if (applied)
		*applied = 0;
	if (files)
		*files = 0;
	cot_err e = exec_ok(c,
	                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
	                    " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
	                    " applied_at timestamptz NOT NULL DEFAULT now())",
	                    eb, "could not create schema_migrations");
	if (e)
		return e;
	e = exec_ok(c, "BEGIN", eb, "could not begin the migration");
	if (e)
		return e;
	e = migrate_all(c, &n_applied, &n_files, eb);
	if (e) {
		PQclear(PQexec(c, "ROLLBACK"));
		return e;
	}
	e = exec_ok(c, "COMMIT", eb, "could not commit the migration");
	if (e)
		return e;
	if (applied)
		*applied = n_applied;
	if (files)
		*files = n_files;
	return COT_OK;
}

cot_err db_resolve(const char *datadir, const char *conninfo, db_target *out, cot_errbuf *eb)
{
	memset(out, 0, sizeof *out);
	if (conninfo && *conninfo) {
		if (strlen(conninfo) >= sizeof out->conninfo)
			return cot_seterr(eb, COT_ERR_INVALID, "database connection string is too long");
		snprintf(out->conninfo, sizeof out->conninfo, "%s", conninfo);
		return COT_OK;
	}
	char dir[400];
	if (snprintf(dir, sizeof dir, "%s/pg", datadir) >= (int)sizeof dir)
		return cot_seterr(eb, COT_ERR_INVALID, "data directory path \"%s\" is too long", datadir);
	if (pgc_running(dir, DB_NAME, out->conninfo, sizeof out->conninfo))
		return COT_OK;
	cot_err e = pgc_start(dir, 0, 0, DB_NAME, &out->cluster, eb);
	if (e)
		return e;
	snprintf(out->conninfo, sizeof out->conninfo, "%s", pgc_conninfo(out->cluster));
	return COT_OK;
}

void db_target_close(db_target *t)
{
	if (t && t->cluster) {
		pgc_stop(t->cluster);
		t->cluster = NULL;
	}
}
