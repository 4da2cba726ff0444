/* cotrain-server: teams: create (the founder joins it), show, join, leave.
 * An account is in at most one team; joining another team moves it. */
#include "server/api.h"

#include <stdio.h>
#include <stdlib.h>

#include "server/apiutil.h"
#include "shared/common/json.h"

static const dbc_stmt st_create = {
	"team_create",
	"WITH t AS (INSERT INTO team (name, description, founder_id) VALUES ($1, $2, $3)"
	"           RETURNING id)"
	" UPDATE account SET team_id = (SELECT id FROM t) WHERE id = $3 RETURNING team_id",
	3
};

void api_team_create(http_req *req)
{
	long long account;
	if (!api_account(req, &account))
		return;
	json_t *body;
	if (!api_body(req, false, &body))
		return;
	const char *name = NULL, *description = "";
	cot_errbuf eb = { 0 };
	if (cot_json_str(body, "name", true, 1, 100, &name, &eb) ||
	    cot_json_str(body, "description", false, 0, 4000, &description, &eb)) {
		api_bad_request(req, &eb);
		goto out;
	}
	if (!api_text_ok(req, "name", name) || !api_text_ok(req, "description", description))
		goto out;
	char acc[24];
	snprintf(acc, sizeof acc, "%lld", account);
	const char *params[] = { name, description, acc };
	PGresult *r = api_exec(req, &st_create, params, "a team with this name already exists");
	if (!r)
		goto out;
	http_reply_json(req, 201,
	                json_pack("{s:I, s:s}", "team_id", (json_int_t)strtoll(PQgetvalue(r, 0, 0), NULL, 10),
	                          "name", name));
	PQclear(r);
out:
	json_decref(body);
}

static const dbc_stmt st_get = {
	"team_get",
	"SELECT json_build_object('id', t.id, 'name', t.name, 'description', t.description,"
	"       'founder_id', t.founder_id, 'created_at', t.created_at,"
	"       'members', (SELECT count(*) FROM account a WHERE a.team_id = t.id))::text"
	"  FROM team t WHERE t.id = $1",
	1
};

static void not_found(http_req *req, const char *id)
{
	char msg[80];
	snprintf(msg, sizeof msg, "team %s does not exist", id);
	http_reply_error(req, 404, "not_found", msg, NULL);
}

void api_team_get(http_req *req)
{
	long long id;
	if (!api_path_id(req, 0, "team", &id))
		return;
	const char *params[] = { req->params[0] };
	PGresult *r = api_exec(req, &st_get, params, NULL);
	if (!r)
		return;
	if (PQntuples(r) == 1)
		http_reply_raw(req, 200, PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0));
	else
		not_found(req, req->params[0]);
	PQclear(r);
}

static const dbc_stmt st_join = { "team_join",
	                          "UPDATE account a SET team_id = t.id FROM team t WHERE a.id = $1 AND t.id "
	                          "= $2"
	                          " RETURNING t.id",
	                          2 };

void api_team_join(http_req *req)
{
	long long account, team;
	if (!api_path_id(req, 0, "team", &team) || !api_account(req, &account))
		return;
	char acc[24];
	snprintf(acc, sizeof acc, "%lld", account);
	const char *params[] = { acc, req->params[0] };
	PGresult *r = api_exec(req, &st_join, params, NULL);
	if (!r)
		return;
	if (PQntuples(r) == 1)
		http_reply_json(req, 200, json_pack("{s:I}", "team_id", (json_int_t)team));
	else
		not_found(req, req->params[0]);
	PQclear(r);
}

static const dbc_stmt st_leave = { "team_leave",
	                           "WITH t AS (SELECT id FROM team WHERE id = $2),"
	                           "     u AS (UPDATE account SET team_id = NULL WHERE id = $1 AND team_id = "
	                           "$2 RETURNING id)"
	                           " SELECT (SELECT count(*) FROM t), (SELECT count(*) FROM u)",
	                           2 };

void api_team_leave(http_req *req)
{
	long long account, team;
	if (!api_path_id(req, 0, "team", &team) || !api_account(req, &account))
		return;
	char acc[24];
	snprintf(acc, sizeof acc, "%lld", account);
	const char *params[] = { acc, req->params[0] };
	PGresult *r = api_exec(req, &st_leave, params, NULL);
	if (!r)
		return;
	if (PQgetvalue(r, 0, 0)[0] == '0') {
		not_found(req, req->params[0]);
	} else if (PQgetvalue(r, 0, 1)[0] == '0') {
		char msg[80];
		snprintf(msg, sizeof msg, "this account is not a member of team %lld", team);
		http_reply_error(req, 409, "conflict", msg, NULL);
	} else {
		http_reply_json(req, 200, json_pack("{s:n}", "team_id"));
	}
	PQclear(r);
}
