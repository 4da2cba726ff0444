/* cotrain tests: migrations, function files, schema checks, the embedded default, and the
 * private cluster's clean-up when its starter dies. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shared/database/db.h"
#include "shared/database/pgcluster.h"
#include "tests/pgtmp.h"
#include "tests/tap.h"

static int count(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	int n = PQresultStatus(r) == PGRES_TUPLES_OK ? atoi(PQgetvalue(r, 0, 0)) : -1;
	PQclear(r);
	return n;
}

static bool dir_exists(const char *d)
{
	struct stat st;
	return stat(d, &st) == 0;
}

static void test_migrations(void)
{
	PGconn *c;
	cot_errbuf eb = { "", "" };
	if (!ok(db_connect(pgtmp_start(), &c, &eb) == COT_OK, "connect to the throwaway cluster")) {
		diag("%s", eb.msg);
		return;
	}
	is_int(db_schema_version(c, &eb), 0, "an empty database is at schema version 0");
	is_int(db_schema_check(c, &eb), COT_ERR_SCHEMA, "schema check refuses an empty database");
	ok(strstr(eb.hint, "cotrain-admin db migrate") != NULL, "with a hint to migrate (\"%s\")", eb.hint);

	int applied = -1, files = -1;
	is_int(db_migrate(c, &applied, &files, &eb), COT_OK, "migrations apply to an empty database");
	is_int(applied, db_n_migrations, "all %d migrations applied", db_n_migrations);
	is_int(files, db_n_function_files, "then all %d function files", db_n_function_files);
	is_int(db_schema_check(c, &eb), COT_OK, "schema check passes after migrating");
	is_int(count(c, "SELECT count(*) FROM schema_migrations"), db_n_migrations,
	       "each migration recorded");
	is_int(count(c, "SELECT count(*) FROM schema_function_files"), db_n_function_files,
	       "each function file recorded");
	is_int(count(c, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'work_unit'"), 1,
	       "tables exist");
	is_int(count(c, "SELECT count(*) FROM pg_proc WHERE proname = 'host_auth'"), 1, "functions exist");

	is_int(db_migrate(c, &applied, &files, &eb), COT_OK, "migrating again succeeds");
	is_int(applied + files, 0, "and applies nothing");

	/* A function file whose recorded checksum is not its text's (it changed
	 * since it was applied) is refused by the check and applied again by
	 * migrate, alone. */
	PQclear(PQexec(c, "CREATE OR REPLACE FUNCTION host_auth(p_token_hash bytea) RETURNS bigint"
	                  " LANGUAGE sql STABLE AS $$ SELECT 42::bigint $$;"
	                  "UPDATE schema_function_files SET checksum = 'old' WHERE name = 'host_auth.sql'"));
	is_int(db_functions_pending(c, &eb), 1, "a changed function file is pending");
	is_int(db_schema_check(c, &eb), COT_ERR_SCHEMA, "schema check refuses a pending function file");
	ok(strstr(eb.hint, "cotrain-admin db migrate") != NULL, "with a hint to migrate (\"%s\")", eb.hint);
	is_int(db_migrate(c, &applied, &files, &eb), COT_OK, "migrate applies it");
	ok(applied == 0 && files == 1, "that file only (%d migrations, %d files)", applied, files);
	is_int(count(c, "SELECT count(*) FROM pg_proc WHERE proname = 'host_auth' AND prolang ="
	                " (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')"),
	       1, "its definition is back");
	is_int(db_schema_check(c, &eb), COT_OK, "schema check passes again");

	/* An edited migration is detected, and nothing changes. */
	PQclear(PQexec(c, "UPDATE schema_migrations SET checksum = 'edited' WHERE version = 1"));
	is_int(db_migrate(c, &applied, &files, &eb), COT_ERR_SCHEMA, "an edited migration is refused");
	ok(strstr(eb.msg, "differs") != NULL, "message says it differs: %s", eb.msg);

	/* A database newer than the build is refused too. */
	PQclear(PQexec(c, "INSERT INTO schema_migrations VALUES (9999, 'future', 'x')"));
	is_int(db_schema_check(c, &eb), COT_ERR_SCHEMA, "a newer schema is refused");
	ok(strstr(eb.msg, "newer") != NULL, "message says newer: %s", eb.msg);
	PQfinish(c);
}

static void test_embedded_default(void)
{
	char datadir[] = "/tmp/cotrain-data-XXXXXX";
	if (!mkdtemp(datadir))
		bail_out("mkdtemp: %m");
	chmod(datadir, 0755); /* the cluster's unprivileged user must reach <datadir>/pg */
	cot_errbuf eb = { "", "" };
	db_target t;
	cot_err e = db_resolve(datadir, NULL, &t, &eb);
	if (!is_int(e, COT_OK, "embedded default starts a private cluster under the data directory")) {
		diag("%s %s", eb.msg, eb.hint);
		return;
	}
	ok(t.cluster != NULL, "the cluster is owned by this process");
	PGconn *c;
	ok(db_connect(t.conninfo, &c, &eb) == COT_OK, "connects to it");
	PQclear(PQexec(c, "CREATE TABLE persisted (x int); INSERT INTO persisted VALUES (42)"));
	PQfinish(c);

	db_target t2;
	is_int(db_resolve(datadir, NULL, &t2, &eb), COT_OK, "a second program finds it running");
	ok(t2.cluster == NULL, "and does not start another");
	db_target_close(&t2);

	char ci[512];
	snprintf(ci, sizeof ci, "%s", t.conninfo);
	db_target_close(&t);
	ok(PQping(ci) != PQPING_OK, "closing stops the cluster");

	is_int(db_resolve(datadir, NULL, &t, &eb), COT_OK, "it starts again");
	if (db_connect(t.conninfo, &c, &eb) == COT_OK) {
		is_int(count(c, "SELECT x FROM persisted"), 42, "data survived the restart");
		PQfinish(c);
	} else {
		ok(false, "data survived the restart: %s", eb.msg);
	}
	db_target_close(&t);

	db_target t3;
	is_int(db_resolve(datadir, "host=/nonexistent dbname=x", &t3, &eb), COT_OK,
	       "a configured connection string is used as is");
	ok(t3.cluster == NULL && strcmp(t3.conninfo, "host=/nonexistent dbname=x") == 0,
	   "without starting a cluster");
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf %s", datadir);
	if (system(cmd) != 0)
		diag("could not remove %s", datadir);
}

/* A child starts an ephemeral cluster and is killed with SIGKILL; the cluster
 * must stop and its directory disappear anyway. */
static void test_cleanup_on_crash(void)
{
	int p[2];
	if (pipe(p) < 0)
		bail_out("pipe: %m");
	pid_t pid = fork();
	if (pid == 0) {
		close(p[0]);
		char dir[] = "/tmp/cotrain-pg-XXXXXX";
		pgc_cluster *c;
		cot_errbuf eb;
		if (!mkdtemp(dir) || pgc_start(dir, 0, PGC_EPHEMERAL, "cotrain", &c, &eb))
			_exit(1);
		char line[700];
		int n = snprintf(line, sizeof line, "%s\n%s\n", dir, pgc_conninfo(c));
		if (write(p[1], line, n) != n)
			_exit(1);
		raise(SIGKILL);
	}
	close(p[1]);
	char buf[700] = "";
	size_t got = 0;
	ssize_t n;
	while ((n = read(p[0], buf + got, sizeof buf - 1 - got)) > 0)
		got += n;
	buf[got] = '\0';
	close(p[0]);
	int st;
	waitpid(pid, &st, 0);
	ok(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the starter was killed");
	char *nl = strchr(buf, '\n');
	if (!ok(nl != NULL, "the starter had started a cluster"))
		return;
	*nl = '\0';
	char *ci = nl + 1;
	ci[strcspn(ci, "\n")] = '\0';
	bool gone = false;
	for (int i = 0; i < 600 && !gone; i++) { /* at most 30 s */
		gone = !dir_exists(buf) && PQping(ci) != PQPING_OK;
		if (!gone)
			usleep(50000);
	}
	ok(gone, "its cluster stopped and %s was removed", buf);
}

int main(void)
{
	plan_lazy();
	test_migrations();
	test_embedded_default();
	test_cleanup_on_crash();
	pgtmp_stop();
	ok(pgtmp_conninfo() == NULL, "throwaway cluster stopped");
	return exit_status();
}
