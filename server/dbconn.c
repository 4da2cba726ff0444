/* cotrain-server: one PostgreSQL connection per thread. */
#include "server/dbconn.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/database/db.h"
#include "shared/common/log.h"

/* More than the server's statements: one past the limit would be prepared
 * again at each use, and fail ("already exists"). */
#define MAX_STMTS 256

typedef struct {
	PGconn *conn;
	const dbc_stmt *prepared[MAX_STMTS]; /* statements prepared on conn */
	int nprepared;
} thread_conn;

static const char *g_conninfo;
static pthread_key_t g_key;

static void thread_conn_free(void *p)
{
	thread_conn *tc = p;
	if (tc) {
		PQfinish(tc->conn);
		free(tc);
	}
}

cot_err dbc_init(const char *conninfo, cot_errbuf *eb)
{
	g_conninfo = conninfo;
	if (pthread_key_create(&g_key, thread_conn_free))
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not create a thread-local key");
	return COT_OK;
}

void dbc_close_thread(void)
{
	thread_conn_free(pthread_getspecific(g_key));
	pthread_setspecific(g_key, NULL);
}

/* This thread's connection, opened when missing. */
static cot_err get_conn(thread_conn **out, cot_errbuf *eb)
{
	thread_conn *tc = pthread_getspecific(g_key);
	if (!tc) {
		tc = calloc(1, sizeof *tc);
		if (!tc)
			return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		pthread_setspecific(g_key, tc);
	}
	if (!tc->conn) {
		cot_err rc = db_connect(g_conninfo, &tc->conn, eb);
		if (rc) {
			cot_sethint(eb, "The database is unreachable; try again later.");
			return rc;
		}
		tc->nprepared = 0;
	}
	*out = tc;
	return COT_OK;
}

static bool is_prepared(const thread_conn *tc, const dbc_stmt *stmt)
{
	for (int i = 0; i < tc->nprepared; i++)
		if (tc->prepared[i] == stmt)
			return true;
	return false;
}

static void fail(const PGresult *r, char sqlstate[6], cot_errbuf *eb, const char *what)
{
	const char *s = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
	snprintf(sqlstate, 6, "%s", s ? s : "");
	db_result_error(r, eb, what);
}

/* One attempt on tc; *broken tells whether the connection died. */
static cot_err exec_once(thread_conn *tc, const dbc_stmt *stmt, const char *const *params, PGresult **out,
                         char sqlstate[6], bool *broken, cot_errbuf *eb)
{
	*broken = false;
	if (!is_prepared(tc, stmt)) {
		PGresult *r = PQprepare(tc->conn, stmt->name, stmt->sql, stmt->nparams, NULL);
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			fail(r, sqlstate, eb, "could not prepare a statement");
			log_error("could not prepare statement \"%s\": %s", stmt->name, eb ? eb->msg : "");
			PQclear(r);
			*broken = PQstatus(tc->conn) == CONNECTION_BAD;
			return COT_ERR_DB;
		}
		PQclear(r);
		if (tc->nprepared < MAX_STMTS)
			tc->prepared[tc->nprepared++] = stmt;
	}
	PGresult *r = PQexecPrepared(tc->conn, stmt->name, stmt->nparams, params, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(r);
	if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
		fail(r, sqlstate, eb, "database error");
		PQclear(r);
		*broken = PQstatus(tc->conn) == CONNECTION_BAD;
		return COT_ERR_DB;
	}
	*out = r;
	return COT_OK;
}

cot_err dbc_exec(const dbc_stmt *stmt, const char *const *params, PGresult **out, char sqlstate[6],
                 cot_errbuf *eb)
{
	*out = NULL;
	sqlstate[0] = '\0';
	for (int attempt = 0; attempt < 2; attempt++) {
		thread_conn *tc = NULL;
		cot_err rc = get_conn(&tc, eb);
		if (rc)
			return rc;
		bool broken;
		rc = exec_once(tc, stmt, params, out, sqlstate, &broken, eb);
		if (!rc || !broken)
			return rc;
		log_warn("database connection lost; reconnecting");
		PQfinish(tc->conn);
		tc->conn = NULL;
		sqlstate[0] = '\0';
	}
	cot_sethint(eb, "The database is unreachable; try again later.");
	return COT_ERR_DB;
}
