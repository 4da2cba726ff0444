/* cotrain-server: the scheduler's routes.  Each is one call of a PL/pgSQL
 * function of db/functions/sched.sql (one round trip), which
 * authenticates the host token, checks ownership and state, changes what it
 * must and answers with the HTTP status and JSON body relayed here.  This
 * file only checks the request's shape. */
#include "server/api.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/apiutil.h"
#include "shared/common/json.h"

static const dbc_stmt st_assign = { "sched_assign",
	                            "SELECT status, body FROM sched_assign($1::bytea, $2, $3, $4, $5)", 5 };

/* Was work refused (JSON text) because of the round (it is not open, or
 * its target is covered), with nothing for this host to report, so that
 * it can only wait? */
static bool refused_to_wait(const char *body, size_t len)
{
	json_t *j = json_loadb(body, len, 0, NULL);
	const json_t *r = json_object_get(j, "round");
	bool wait = json_is_object(r) && !json_is_true(json_object_get(r, "report"));
	json_decref(j);
	return wait;
}

/* A work request (doc/api.md "Work").  With the query argument wait=S (at
 * most WORK_WAIT_MAX) a refusal because of the round, with nothing for the
 * host to report, is held (the
 * connection suspended, http_hold) until the round moves: anything that
 * wakes the long polls (a commit, a failure, a close, a hand-back or an
 * expiry that frees part of the target) makes it ask again, so a host is
 * back at work the moment there is work, without polling. */
void api_work_request(http_req *req)
{
	char hp[API_HASH_PARAM_LEN];
	long long wait = 0;
	if (!api_bearer(req, hp) || !api_query_int(req, "wait", 0, WORK_WAIT_MAX, &wait))
		return;
	json_t *body;
	if (!api_body(req, false, &body))
		return;
	long long host = 0;
	cot_errbuf eb = { 0 };
	if (cot_json_int(body, "host_id", true, 1, (1LL << 62), &host, &eb)) {
		api_bad_request(req, &eb);
		json_decref(body);
		return;
	}
	json_decref(body);
	if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
		return;
	}
	if (wait > 0 && req->hold_until == 0)
		req->hold_until = http_now() + (double)wait;
	char shost[24], smax[24], schunk[24];
	snprintf(shost, sizeof shost, "%lld", host);
	snprintf(smax, sizeof smax, "%lld", req->cfg->wu_max);
	snprintf(schunk, sizeof schunk, "%lld", req->cfg->pool_chunk);
	const char *params[] = { hp, shost, req->params[0], smax, schunk };
	req->hold_kind = HTTP_HOLD_WORK;
	for (int look = 0;; look++) {
		unsigned long gen = http_wake_gen(req);
		PGresult *r = api_exec(req, &st_assign, params, NULL);
		if (!r)
			return;
		if (wait > 0 && PQntuples(r) == 1 && PQnfields(r) == 2 && atoi(PQgetvalue(r, 0, 0)) == 409 &&
		    refused_to_wait(PQgetvalue(r, 0, 1), (size_t)PQgetlength(r, 0, 1))) {
			api_poll t = api_long_poll(req, gen, look);
			if (t != API_POLL_ANSWER) {
				PQclear(r);
				if (t == API_POLL_HELD)
					return;
				continue;
			}
		}
		api_relay_result(req, r);
		PQclear(r);
		return;
	}
}

static const dbc_stmt st_heartbeat = { "sched_heartbeat",
	                               "SELECT status, body FROM sched_heartbeat($1::bytea, $2, $3, $4)", 4 };
static const dbc_stmt st_handback = { "sched_handback",
	                              "SELECT status, body FROM sched_handback($1::bytea, $2, $3)", 3 };
static const dbc_stmt st_finish = { "sched_finish",
	                            "SELECT status, body FROM sched_finish($1::bytea, $2, $3)", 3 };

/* Should an answer that carries "round" (a close: JSON text) wake the held
 * long polls?  Every heartbeat, finish and hand-back of the round's units
 * carries it from the close on, and each wake makes every held request look
 * again (a thousand hosts' answers, a thousand held plan polls: a million
 * looks).  So a round's state wakes them once per round attempt in this
 * process (api_is_news): a request held after that looked at the database
 * after the wake (http_wake_gen), and a change another process made is
 * woken by the coordinator's watch (round_coord.c). */
static bool close_news(const char *body, size_t len)
{
	static api_news seen = API_NEWS_INIT;
	json_t *j = json_loadb(body, len, 0, NULL);
	const json_t *r = json_object_get(j, "round");
	const char *st = json_string_value(json_object_get(r, "state"));
	char key[96];
	snprintf(key, sizeof key, "%s:%lld:%lld", st ? st : "",
	         (long long)json_integer_value(json_object_get(r, "version")),
	         (long long)json_integer_value(json_object_get(r, "attempt")));
	bool news = r && api_is_news(&seen, key);
	json_decref(j);
	return news;
}

/* Shared by the three: token, work unit id, body with mb_done (required
 * unless it is finish, which may leave out the body) and samples_per_sec
 * (optional; heartbeat and finish keep it). */
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
	const char *params[] = { hp, req->params[0], stmt == &st_finish ? ssps : smb, ssps };
	if (stmt != &st_heartbeat)
		params[3] = NULL; /* unused: the function takes three */
	PGresult *r = api_exec(req, stmt, params, NULL);
	if (!r)
		return;
	/* A hand-back frees part of a round's target; an answer with "round"
	 * means the round closed (or is no longer open): held work requests
	 * and plan polls look again. */
	if (api_relay_result(req, r) == 200 &&
	    (stmt == &st_handback || close_news(PQgetvalue(r, 0, 1), (size_t)PQgetlength(r, 0, 1))))
		http_wake_held();
	PQclear(r);
}

void api_work_heartbeat(http_req *req) { report(req, &st_heartbeat, true); }
void api_work_handback(http_req *req) { report(req, &st_handback, true); }

void api_work_finish(http_req *req) { report(req, &st_finish, false); }

static const dbc_stmt st_round_watch = { "sched_round_watch",
	                                 "SELECT status, body FROM sched_round_watch($1::bytea, $2)", 2 };

/* Does the close notice (JSON text) say the host may go on computing: its
 * unit live, its round open? */
static bool still_computing(const char *body, size_t len)
{
	json_t *j = json_loadb(body, len, 0, NULL);
	const char *st = json_string_value(json_object_get(j, "state"));
	bool on = st && strcmp(st, "live") == 0 && !json_object_get(j, "round");
	json_decref(j);
	return on;
}

/* The close notice of a work unit (doc/api.md, "GET /v1/workunits/{id}/round").
 * With wait=S (at most WORK_WAIT_MAX) it is held while the unit is live and
 * its round open: the close wakes every held request (a heartbeat, finish
 * or hand-back answer that carries "round", the coordinator's straggler
 * close through its watch), so a computing host hears of the close at once
 * instead of at its next heartbeat.  Read-only: one SELECT a look. */
void api_work_round_watch(http_req *req)
{
	long long wu, wait = 0;
	char hp[API_HASH_PARAM_LEN];
	if (!api_path_id(req, 0, "work unit", &wu) || !api_bearer(req, hp) ||
	    !api_query_int(req, "wait", 0, WORK_WAIT_MAX, &wait))
		return;
	if (wait > 0 && req->hold_until == 0)
		req->hold_until = http_now() + (double)wait;
	const char *params[] = { hp, req->params[0] };
	req->hold_kind = HTTP_HOLD_PLAN;
	for (int look = 0;; look++) {
		unsigned long gen = http_wake_gen(req);
		PGresult *r = api_exec(req, &st_round_watch, params, NULL);
		if (!r)
			return;
		if (wait > 0 && PQntuples(r) == 1 && PQnfields(r) == 2 && atoi(PQgetvalue(r, 0, 0)) == 200 &&
		    still_computing(PQgetvalue(r, 0, 1), (size_t)PQgetlength(r, 0, 1))) {
			api_poll t = api_long_poll(req, gen, look);
			if (t != API_POLL_ANSWER) {
				PQclear(r);
				if (t == API_POLL_HELD)
					return;
				continue;
			}
		}
		api_relay_result(req, r);
		PQclear(r);
		return;
	}
}
