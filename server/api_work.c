/* cotrain-server: the scheduler's routes.  Each is one call of a PL/pgSQL
 * function of db/functions/sched.sql (one round trip), which
 * authenticates the host token, checks ownership and state, changes what it
 * must and answers with the HTTP status and JSON body relayed here.  This
 * file only checks the request's shape. */
#include "server/api.h"

#include <stdio.h>
#include <string.h>

#include "server/apiutil.h"
#include "shared/common/json.h"

static const dbc_stmt st_assign = { "sched_assign",
	                            "SELECT status, body FROM sched_assign($1::bytea, $2, $3, $4, $5)", 5 };

void api_work_request(http_req *req)
{
	char hp[API_HASH_PARAM_LEN];
	if (!api_bearer(req, hp))
		return;
	json_t *body;
	if (!api_body(req, false, &body))
		return;
	long long host = 0;
	cot_errbuf eb = { 0 };
	if (cot_json_int(body, "host_id", true, 1, (1LL << 62), &host, &eb)) {
		api_bad_request(req, &eb);
	} else if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
	} else {
		char shost[24], smax[24], schunk[24];
		snprintf(shost, sizeof shost, "%lld", host);
		snprintf(smax, sizeof smax, "%lld", req->cfg->wu_max);
		snprintf(schunk, sizeof schunk, "%lld", req->cfg->pool_chunk);
		const char *params[] = { hp, shost, req->params[0], smax, schunk };
		api_relay(req, &st_assign, params);
	}
	json_decref(body);
}

static const dbc_stmt st_heartbeat = { "sched_heartbeat",
	                               "SELECT status, body FROM sched_heartbeat($1::bytea, $2, $3, $4)", 4 };
static const dbc_stmt st_handback = { "sched_handback",
	                              "SELECT status, body FROM sched_handback($1::bytea, $2, $3)", 3 };
static const dbc_stmt st_finish = { "sched_finish", "SELECT status, body FROM sched_finish($1::bytea, $2)",
	                            2 };

/* Shared by the three: token, work unit id, body with mb_done (required
 * unless it is finish) and samples_per_sec (optional). */
static void report(http_req *req, const dbc_stmt *stmt, bool want_mb_done)
{
	long long wu;
	char hp[API_HASH_PARAM_LEN];
	if (!api_path_id(req, 0, "work unit", &wu) || !api_bearer(req, hp))
		return;
	json_t *body;
	if (!api_body(req, !want_mb_done, &body))
		return;
	long long mb_done = 0;
	double sps = 0;
	cot_errbuf eb = { 0 };
	if ((want_mb_done && cot_json_int(body, "mb_done", true, 0, (1LL << 62), &mb_done, &eb)) ||
	    cot_json_num(body, "samples_per_sec", false, 0, 1e12, &sps, &eb)) {
		api_bad_request(req, &eb);
		json_decref(body);
		return;
	}
	json_decref(body);
	char smb[24], ssps[40];
	snprintf(smb, sizeof smb, "%lld", mb_done);
	snprintf(ssps, sizeof ssps, "%.9g", sps);
	const char *params[] = { hp, req->params[0], smb, ssps };
	if (stmt == &st_handback)
		params[3] = NULL; /* unused: the function takes three */
	api_relay(req, stmt, params);
}

void api_work_heartbeat(http_req *req) { report(req, &st_heartbeat, true); }
void api_work_handback(http_req *req) { report(req, &st_handback, true); }

void api_work_finish(http_req *req)
{
	long long wu;
	char hp[API_HASH_PARAM_LEN];
	if (!api_path_id(req, 0, "work unit", &wu) || !api_bearer(req, hp))
		return;
	json_t *body;
	if (!api_body(req, true, &body))
		return;
	json_decref(body);
	const char *params[] = { hp, req->params[0] };
	api_relay(req, &st_finish, params);
}
