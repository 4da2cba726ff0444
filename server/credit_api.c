/* cotrain-server: leaderboards and the credit pages of one user, team or
 * host (public: no credentials; emails and tokens never leave the server).
 *
 * Leaderboards page by keyset: rows come in (key DESC, id DESC) order, key
 * being the total or the RAC's ordering key (credit_rac_key in 0006, which
 * orders RACs decayed to any "now" without rewriting rows), and a page ends
 * with the cursor "KEY,ID,RANK" of its last row.  The next page is one
 * index range scan from there, whatever its depth. */
#include "server/credit.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/apiutil.h"

enum { K_USERS, K_TEAMS, K_HOSTS, N_KINDS };
enum { O_TOTAL, O_RAC, N_ORDERS };

#define LB_LIMIT_MAX 100
#define LB_LIMIT_DEFAULT 50

static const char *const kind_names[N_KINDS] = { "users", "teams", "hosts" };

/* Per kind: the totals table, its id column, and the JSON of a row (p is the
 * page, x the joined holder). */
static const struct {
	const char *table, *idcol, *join, *fields;
} kinds[N_KINDS] = {
	{ "account_credit", "account_id",
	  "JOIN account x ON x.id = p.id LEFT JOIN team t ON t.id = x.team_id",
	  "'name', x.name, 'team_id', x.team_id, 'team_name', t.name,"
	  " 'pending_credit', credit_pending_account(x.id)" },
	{ "team_credit", "team_id", "JOIN team x ON x.id = p.id",
	  "'name', x.name, 'members', (SELECT count(*) FROM account a WHERE a.team_id = x.id),"
	  " 'pending_credit', credit_pending_team(x.id)" },
	{ "host_credit", "host_id", "JOIN host x ON x.id = p.id JOIN account a ON a.id = x.account_id",
	  "'owner_id', a.id, 'owner_name', a.name, 'cpu_model', x.cpu_model, 'gpu', x.gpu,"
	  " 'os_name', x.os_name, 'pending_credit', credit_pending_host(x.id)" },
};

static const char *const order_cols[N_ORDERS] = { "total", "rac_key" };

/* [kind][order][after?]: prepared once, names unique. */
static dbc_stmt lb_stmts[N_KINDS][N_ORDERS][2];
static char lb_sql[N_KINDS][N_ORDERS][2][2048];
static char lb_names[N_KINDS][N_ORDERS][2][32];
static pthread_once_t lb_once = PTHREAD_ONCE_INIT;

static void lb_build(void)
{
	for (int k = 0; k < N_KINDS; k++)
		for (int o = 0; o < N_ORDERS; o++)
			for (int a = 0; a < 2; a++) {
				const char *col = order_cols[o], *id = kinds[k].idcol;
				char where[200] = "";
				if (a)
					snprintf(where, sizeof where,
					         " WHERE (c.%s, c.%s) < ($2::float8, $3::bigint)", col, id);
				snprintf(lb_sql[k][o][a], sizeof lb_sql[k][o][a],
				         "WITH p AS (SELECT c.%s AS id, c.total, c.rac, c.rac_time, c.%s AS "
				         "key"
				         "             FROM %s c%s ORDER BY c.%s DESC, c.%s DESC LIMIT $1)"
				         " SELECT coalesce(json_agg(json_build_object('id', p.id, %s,"
				         "        'total_credit', p.total,"
				         "        'expavg_credit', credit_rac_at(p.rac, p.rac_time, "
				         "credit_now()))"
				         "        ORDER BY p.key DESC, p.id DESC), '[]')::text,"
				         "        (SELECT q.key::text || ',' || q.id FROM p q"
				         "          ORDER BY q.key ASC, q.id ASC LIMIT 1),"
				         "        count(*)"
				         "   FROM p %s",
				         id, col, kinds[k].table, where, col, id, kinds[k].fields,
				         kinds[k].join);
				snprintf(lb_names[k][o][a], sizeof lb_names[k][o][a], "credit_lb_%d_%d_%d", k,
				         o, a);
				lb_stmts[k][o][a] =
				        (dbc_stmt){ lb_names[k][o][a], lb_sql[k][o][a], a ? 3 : 1 };
			}
}

static int kind_of(const char *s)
{
	for (int k = 0; k < N_KINDS; k++)
		if (strcmp(s, kind_names[k]) == 0)
			return k;
	return -1;
}

static void bad_param(http_req *req, const char *msg, const char *hint)
{
	http_reply_error(req, 400, "invalid", msg, hint);
}

/* Parse "KEY,ID,RANK": a finite number, a positive id, a rank >= 1. */
static bool parse_cursor(const char *s, double *key, long long *id, long long *rank)
{
	if (strlen(s) > 100)
		return false;
	char *end;
	errno = 0;
	*key = strtod(s, &end);
	if (errno || end == s || *end != ',' || !isfinite(*key))
		return false;
	const char *p = end + 1;
	*id = strtoll(p, &end, 10);
	if (errno || end == p || *end != ',' || *id <= 0)
		return false;
	p = end + 1;
	*rank = strtoll(p, &end, 10);
	if (errno || end == p || *end || *rank < 1 || *rank > (1LL << 50))
		return false;
	return true;
}

void credit_leaderboard(http_req *req)
{
	pthread_once(&lb_once, lb_build);
	int k = kind_of(req->params[0]);
	if (k < 0) {
		http_reply_error(req, 404, "not_found", "no such leaderboard",
		                 "The leaderboards are /v1/credit/users, /v1/credit/teams and "
		                 "/v1/credit/hosts.");
		return;
	}
	const char *order = http_query(req, "order");
	int o = O_TOTAL;
	if (order && strcmp(order, "rac") == 0)
		o = O_RAC;
	else if (order && strcmp(order, "total") != 0) {
		bad_param(req, "order must be \"total\" or \"rac\"", NULL);
		return;
	}
	long long limit = LB_LIMIT_DEFAULT;
	const char *ls = http_query(req, "limit");
	if (ls) {
		char *end;
		errno = 0;
		limit = strtoll(ls, &end, 10);
		if (errno || end == ls || *end || limit < 1 || limit > LB_LIMIT_MAX) {
			bad_param(req, "limit must be an integer from 1 to 100", NULL);
			return;
		}
	}
	const char *after = http_query(req, "after");
	double key = 0;
	long long id = 0, rank = 0;
	if (after && !parse_cursor(after, &key, &id, &rank)) {
		bad_param(req, "after is not a cursor of this leaderboard",
		          "Pass the \"next\" value of the previous page as it is.");
		return;
	}
	char lim[24], keys[40], ids[24];
	snprintf(lim, sizeof lim, "%lld", limit);
	snprintf(keys, sizeof keys, "%.17g", key);
	snprintf(ids, sizeof ids, "%lld", id);
	const char *params[] = { lim, keys, ids };
	PGresult *r = api_exec(req, &lb_stmts[k][o][after != NULL], params, NULL);
	if (!r)
		return;
	json_error_t je;
	json_t *rows = json_loads(PQgetvalue(r, 0, 0), 0, &je);
	long long n = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
	json_t *out = rows ? json_object() : NULL;
	if (!out) {
		json_decref(rows);
		PQclear(r);
		http_reply_error(req, 500, "internal_error", "could not build the leaderboard", NULL);
		return;
	}
	size_t i;
	json_t *row;
	json_array_foreach(rows, i, row)
	        json_object_set_new(row, "rank", json_integer((json_int_t)(rank + (long long)i + 1)));
	json_object_set_new(out, "kind", json_string(kind_names[k]));
	json_object_set_new(out, "order", json_string(o == O_RAC ? "rac" : "total"));
	json_object_set_new(out, "limit", json_integer(limit));
	json_object_set_new(out, "rows", rows);
	if (n == limit && !PQgetisnull(r, 0, 1)) {
		char next[120];
		snprintf(next, sizeof next, "%s,%lld", PQgetvalue(r, 0, 1), rank + n);
		json_object_set_new(out, "next", json_string(next));
	} else {
		json_object_set_new(out, "next", json_null());
	}
	PQclear(r);
	http_reply_json(req, 200, out);
}

/* The recent grants of a holder, newest first. */
#define GRANTS_JSON(cond) \
	"(SELECT coalesce(json_agg(json_build_object('id', g.id, 'kind', g.kind," \
	"        'project', pr.name, 'version', g.version, 'host_id', g.host_id," \
	"        'samples', g.samples, 'flops', g.flops, 'credit', g.credit," \
	"        'status', g.status, 'reason', g.reason, 'created_at', g.created_at," \
	"        'granted_at', g.granted_at) ORDER BY g.id DESC), '[]')" \
	"   FROM (SELECT * FROM credit_grant g WHERE " cond " ORDER BY g.id DESC LIMIT 20) g" \
	"   JOIN project pr ON pr.id = g.project_id)"

/* clang-format off */
static const dbc_stmt st_user = {
	"credit_user",
	"SELECT json_build_object('id', a.id, 'name', a.name, 'created_at', a.created_at,"
	"       'team_id', a.team_id, 'team_name', t.name,"
	"       'total_credit', coalesce(c.total, 0),"
	"       'pending_credit', credit_pending_account(a.id),"
	"       'expavg_credit', credit_rac_at(c.rac, c.rac_time, credit_now()),"
	"       'hosts', (SELECT coalesce(json_agg(json_build_object('id', h.id,"
	"                 'cpu_model', h.cpu_model, 'gpu', h.gpu, 'os_name', h.os_name,"
	"                 'total_credit', coalesce(hc.total, 0),"
	"                 'pending_credit', credit_pending_host(h.id),"
	"                 'expavg_credit', credit_rac_at(hc.rac, hc.rac_time, credit_now()))"
	"                 ORDER BY h.id), '[]')"
	"                   FROM host h LEFT JOIN host_credit hc ON hc.host_id = h.id"
	"                  WHERE h.account_id = a.id AND NOT h.revoked),"
	"       'grants', " GRANTS_JSON("g.account_id = a.id") ")::text"
	"  FROM account a LEFT JOIN team t ON t.id = a.team_id"
	"  LEFT JOIN account_credit c ON c.account_id = a.id"
	" WHERE a.id = $1 AND NOT a.disabled",
	1
};
/* clang-format on */

/* clang-format off */
static const dbc_stmt st_team = {
	"credit_team",
	"SELECT json_build_object('id', t.id, 'name', t.name, 'description', t.description,"
	"       'created_at', t.created_at, 'founder_id', t.founder_id, 'founder_name', f.name,"
	"       'total_credit', coalesce(c.total, 0),"
	"       'pending_credit', credit_pending_team(t.id),"
	"       'expavg_credit', credit_rac_at(c.rac, c.rac_time, credit_now()),"
	"       'n_members', (SELECT count(*) FROM account a WHERE a.team_id = t.id),"
	"       'members', (SELECT coalesce(json_agg(json_build_object('id', m.id, 'name', m.name,"
	"                   'total_credit', m.total, 'expavg_credit', m.rac)"
	"                   ORDER BY m.total DESC, m.id DESC), '[]')"
	"                     FROM (SELECT a.id, a.name, coalesce(ac.total, 0) AS total,"
	"                                  credit_rac_at(ac.rac, ac.rac_time, credit_now()) AS rac"
	"                             FROM account a LEFT JOIN account_credit ac ON ac.account_id = a.id"
	"                            WHERE a.team_id = t.id AND NOT a.disabled"
	"                            ORDER BY 3 DESC, a.id DESC LIMIT 100) m),"
	"       'grants', " GRANTS_JSON("g.team_id = t.id") ")::text"
	"  FROM team t LEFT JOIN account f ON f.id = t.founder_id"
	"  LEFT JOIN team_credit c ON c.team_id = t.id"
	" WHERE t.id = $1",
	1
};
/* clang-format on */

/* clang-format off */
static const dbc_stmt st_host = {
	"credit_host",
	"SELECT json_build_object('id', h.id, 'owner_id', a.id, 'owner_name', a.name,"
	"       'cpu_model', h.cpu_model, 'cores', h.cores, 'gpu', h.gpu, 'flops', h.flops,"
	"       'os_name', h.os_name, 'os_version', h.os_version,"
	"       'client_version', h.client_version, 'created_at', h.created_at,"
	"       'last_seen', h.last_seen,"
	"       'total_credit', coalesce(c.total, 0),"
	"       'pending_credit', credit_pending_host(h.id),"
	"       'expavg_credit', credit_rac_at(c.rac, c.rac_time, credit_now()),"
	"       'spot_checks', json_build_object('consecutive', coalesce(r.consecutive, 0),"
	"                      'agreed', coalesce(r.n_agreed, 0),"
	"                      'disagreed', coalesce(r.n_disagreed, 0)),"
	"       'sketch_flags', round_sketch_flags_json(h.id),"
	"       'grants', " GRANTS_JSON("g.host_id = h.id") ")::text"
	"  FROM host h JOIN account a ON a.id = h.account_id"
	"  LEFT JOIN host_credit c ON c.host_id = h.id"
	"  LEFT JOIN host_check_record r ON r.host_id = h.id"
	" WHERE h.id = $1 AND NOT a.disabled",
	1
};
/* clang-format on */

void credit_entity(http_req *req)
{
	static const dbc_stmt *const stmts[N_KINDS] = { &st_user, &st_team, &st_host };
	static const char *const what[N_KINDS] = { "user", "team", "host" };
	int k = kind_of(req->params[0]);
	if (k < 0) {
		http_reply_error(req, 404, "not_found", "no such route",
		                 "See doc/api.md for the routes of the v1 API.");
		return;
	}
	long long id;
	if (!api_path_id(req, 1, what[k], &id))
		return;
	char ids[24];
	snprintf(ids, sizeof ids, "%lld", id);
	const char *params[] = { ids };
	char msg[80];
	snprintf(msg, sizeof msg, "%s %lld does not exist", what[k], id);
	api_reply_row(req, stmts[k], params, msg);
}
