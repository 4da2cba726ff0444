/* cotrain-server: one PostgreSQL connection per thread.
 *
 * Each MHD worker thread (and the reaper) has its own connection, opened on
 * first use and closed when the thread exits.  Statements are declared once
 * as static dbc_stmt values beside the code that uses them and prepared on a
 * connection the first time that connection runs them, so every query is a
 * single parameterised round trip (Bind/Execute of a named statement).  A
 * connection found broken is dropped and the statement retried once on a
 * fresh one. */
#ifndef COT_SERVER_DBCONN_H
#define COT_SERVER_DBCONN_H

#include <libpq-fe.h>

#include "shared/common/error.h"

typedef struct {
	const char *name; /* unique statement name */
	const char *sql;  /* $1..$n parameters, all passed as text */
	int nparams;
} dbc_stmt;

/* Set the conninfo every thread connects with (the string is not copied) and
 * create the thread-local slot.  Call once before starting threads. */
cot_err dbc_init(const char *conninfo, cot_errbuf *eb);

/* Run stmt with params (text values; NULL for SQL NULL).  On COT_OK *out is a
 * PGRES_TUPLES_OK or PGRES_COMMAND_OK result the caller PQclear()s.  On
 * COT_ERR_DB *out is NULL, sqlstate (6 bytes) holds the SQLSTATE ("" when the
 * database could not be reached) and eb the server's message and hint. */
cot_err dbc_exec(const dbc_stmt *stmt, const char *const *params, PGresult **out, char sqlstate[6],
                 cot_errbuf *eb);

/* Close this thread's connection now (threads that exit get this for free). */
void dbc_close_thread(void);

#endif
