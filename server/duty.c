/* cotrain-server: duties held through PostgreSQL advisory locks (see
 * duty.h). */
#include "server/duty.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "shared/common/log.h"

struct duty {
	const char *conninfo;
	duty_kind kind;
	PGconn *conn; /* the lock's session; NULL when not connected */
	bool held;
	bool warned; /* a connection failure was logged (once until it works) */
};

static const char *duty_name(duty_kind k)
{
	switch (k) {
	case DUTY_ROUNDS:
		return "round coordinator";
	case DUTY_REAPER:
		return "reaper";
	case DUTY_HELDOUT:
		return "held-out evaluation";
	case DUTY_STATS:
		return "statistics export";
	case DUTY_GC:
		return "file store collection";
	}
	return "duty";
}

cot_err duty_open(const char *conninfo, duty_kind kind, duty **out, cot_errbuf *eb)
{
	duty *d = calloc(1, sizeof *d);
	if (!d)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	d->conninfo = conninfo;
	d->kind = kind;
	*out = d;
	return COT_OK;
}

/* Drop the lock's session (and so the lock), logging a lost duty. */
static void drop(duty *d, const char *why)
{
	if (d->held)
		log_warn("%s duty lost: %s", duty_name(d->kind), why);
	d->held = false;
	PQfinish(d->conn);
	d->conn = NULL;
}

/* One statement on the lock's session returning one boolean; -1 when the
 * session failed (it is dropped). */
static int ask(duty *d, const char *sql)
{
	char k1[16], k2[16];
	snprintf(k1, sizeof k1, "%d", DUTY_CLASS);
	snprintf(k2, sizeof k2, "%d", (int)d->kind);
	const char *params[] = { k1, k2 };
	PGresult *r = PQexecParams(d->conn, sql, 2, NULL, params, NULL, NULL, 0);
	int v = -1;
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
		v = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
	else
		drop(d, PQerrorMessage(d->conn));
	PQclear(r);
	return v;
}

bool duty_held(duty *d)
{
	if (!d->conn) {
		d->conn = PQconnectdb(d->conninfo);
		if (PQstatus(d->conn) != CONNECTION_OK) {
			if (!d->warned)
				log_warn("%s duty: could not connect: %s", duty_name(d->kind),
				         PQerrorMessage(d->conn));
			d->warned = true;
			PQfinish(d->conn);
			d->conn = NULL;
			return false;
		}
		d->warned = false;
	}
	if (d->held) {
		/* Still ours while the session lives: the lock is the session's.
		 * Asking pg_locks (not pg_try_advisory_lock again) keeps the
		 * lock's count at one. */
		if (ask(d, "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
		           " AND pid = pg_backend_pid() AND classid = $1::int::oid"
		           " AND objid = $2::int::oid AND objsubid = 2 AND granted)") == 0)
			drop(d, "the advisory lock is gone from its session");
		return d->held;
	}
	if (ask(d, "SELECT pg_try_advisory_lock($1::int, $2::int)") == 1) {
		d->held = true;
		log_info("%s duty taken (advisory lock %d/%d on backend %d)", duty_name(d->kind), DUTY_CLASS,
		         (int)d->kind, PQbackendPID(d->conn));
	}
	return d->held;
}

void duty_close(duty *d)
{
	if (!d)
		return;
	PQfinish(d->conn);
	free(d);
}
