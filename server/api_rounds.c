/* cotrain-server: the routes of a training round (db/functions/round.sql
 * holds the state machine, round_averaging.sql the group sums): a work unit's report once the round closes, a host's averaging
 * plan (a long poll), each group's gradient sum (from which the server
 * computes the round's mean gradient and v+1 itself, round_step.h), a
 * host's outcome, and the list of a project's rounds.  Like api_work.c,
 * each is one PL/pgSQL call answering (status, body); this file checks the
 * request's shape and turns untrusted fields into bounded parameters. */
#include "server/api.h"

#include <arpa/inet.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/apiutil.h"
#include "server/metrics.h"
#include "server/plan_cache.h"
#include "server/round_coord.h"
#include "server/round_step.h"
#include "shared/common/filestore.h"
#include "shared/common/hash.h"
#include "shared/common/sketch.h"
#include "shared/common/json.h"
#include "shared/common/log.h"

#define RTT_MAX_ENTRIES 4096
#define RTT_MAX_MS 1e6
#define INCLUDED_MAX 100000
/* Most hosts in a group sum's "included" query argument, and its length. */
#define GROUP_INCLUDED_MAX 4096
#define GROUP_INCLUDED_MAX_LEN (GROUP_INCLUDED_MAX * 20)
#define PLAN_WAIT_MAX 60
#define ROUND_LIST_MAX 1000
#define LINKS_MAX 256
#define CONNECT_MS_MAX 600000

/* "a.b.c.d:port" or "[v6]:port" with a port 1..65535. */
static bool endpoint_valid(const char *s)
{
	char host[64];
	const char *colon = strrchr(s, ':');
	if (!colon || colon == s || strlen(s) > 63)
		return false;
	size_t hl = (size_t)(colon - s);
	memcpy(host, s, hl);
	host[hl] = '\0';
	char *end;
	long port = strtol(colon + 1, &end, 10);
	if (colon[1] < '1' || colon[1] > '9' || *end || port < 1 || port > 65535)
		return false;
	unsigned char buf[16];
	if (host[0] == '[') {
		if (hl < 3 || host[hl - 1] != ']')
			return false;
		host[hl - 1] = '\0';
		return inet_pton(AF_INET6, host + 1, buf) == 1;
	}
	return inet_pton(AF_INET, host, buf) == 1;
}

/* Check rtt ({"<host id>": ms, ...}) and write its canonical JSON text to
 * *out (malloc'd). */
static cot_err rtt_param(const json_t *body, char **out, cot_errbuf *eb)
{
	json_t *rtt = json_object_get(body, "rtt");
	json_t *canon = json_object();
	if (!canon)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	if (rtt && !json_is_null(rtt)) {
		if (!json_is_object(rtt) || json_object_size(rtt) > RTT_MAX_ENTRIES) {
			json_decref(canon);
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "field \"rtt\" must be an object of at most %d host ids",
			                  RTT_MAX_ENTRIES);
		}
		const char *k;
		json_t *v;
		json_object_foreach(rtt, k, v)
		{
			char *end;
			long long id =
			        k[0] >= '1' && k[0] <= '9' && strlen(k) <= 18 ? strtoll(k, &end, 10) : 0;
			double ms = json_is_number(v) ? json_number_value(v) : -1;
			if (id <= 0 || *end || !(ms >= 0 && ms <= RTT_MAX_MS)) {
				json_decref(canon);
				cot_seterr(eb, COT_ERR_INVALID,
				           "field \"rtt\" must map host ids to milliseconds");
				cot_sethint(eb, "Send {\"<host id>\": <round-trip time in ms, 0 to 1000000>, "
				                "...}.");
				return COT_ERR_INVALID;
			}
			json_object_set_new(canon, k, json_real(ms));
		}
	}
	*out = json_dumps(canon, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(canon);
	return *out ? COT_OK : cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
}

static const dbc_stmt st_report = { "round_report_loss",
	                            "SELECT status, body FROM round_report($1::bytea, $2, $3, $4, $5, $6, "
	                            "$7, $8::jsonb,"
	                            " $9::double precision, $10::jsonb)",
	                            10 };

void api_work_report(http_req *req)
{
	long long wu;
	char hp[API_HASH_PARAM_LEN];
	if (req->early)
		return; /* up to API_REPORT_MAX_BYTES (the sketches): read it */
	if (!api_path_id(req, 0, "work unit", &wu) || !api_bearer(req, hp))
		return;
	json_t *body;
	if (!api_body(req, false, &body))
		return;
	char *sketches = NULL;
	long long mb_done = 0, samples = 0;
	double bandwidth = 0, loss = -1;
	bool can_aggregate = false;
	const char *endpoint = NULL;
	char *rtt = NULL;
	cot_errbuf eb = { 0 };
	if (cot_json_int(body, "mb_done", true, 0, (1LL << 40), &mb_done, &eb) ||
	    cot_json_int(body, "samples", true, 0, (1LL << 50), &samples, &eb) ||
	    cot_json_str(body, "endpoint", true, 1, 63, &endpoint, &eb) ||
	    cot_json_num(body, "bandwidth", true, 1, 1e13, &bandwidth, &eb) ||
	    cot_json_bool(body, "can_aggregate", true, &can_aggregate, &eb) ||
	    cot_json_num(body, "loss", false, 0, 1e300, &loss, &eb) || rtt_param(body, &rtt, &eb)) {
		api_bad_request(req, &eb);
		goto out;
	}
	if (!endpoint_valid(endpoint)) {
		http_reply_error(req, 400, "invalid", "field \"endpoint\" must be \"ip:port\"",
		                 "Send the address peers can reach this host at, as \"203.0.113.5:7070\" or "
		                 "\"[2001:db8::5]:7070\".");
		goto out;
	}
	char smb[24], ssamples[24], sbw[40], sloss[40];
	snprintf(smb, sizeof smb, "%lld", mb_done);
	snprintf(ssamples, sizeof ssamples, "%lld", samples);
	snprintf(sbw, sizeof sbw, "%.17g", bandwidth);
	snprintf(sloss, sizeof sloss, "%.17g", loss);
	const char *params[] = {
		hp,  req->params[0],           smb, ssamples, endpoint, sbw, can_aggregate ? "true" : "false",
		rtt, loss >= 0 ? sloss : NULL, NULL
	};
	const json_t *sk = json_object_get(body, "sketches");
	if (sk && !json_is_null(sk)) {
		/* Its shape is checked against the unit and the policy in SQL. */
		if (!json_is_array(sk)) {
			http_reply_error(req, 400, "invalid", "field \"sketches\" must be an array",
			                 "Send one array of the policy's k numbers per microbatch reported.");
			goto out;
		}
		if (!(sketches = json_dumps(sk, JSON_COMPACT))) {
			http_reply_error(req, 500, "out_of_memory", "out of memory", NULL);
			goto out;
		}
		params[9] = sketches;
	}
	api_relay(req, &st_report, params);
	round_coord_wake(); /* maybe the last report the plan waits for */
out:
	free(sketches);
	free(rtt);
	json_decref(body);
}

/* Path parameter 1 as a version (an integer >= 0). */
bool rounds_path_version(http_req *req, long long *out)
{
	const char *s = req->params[1];
	char *end;
	long long v = s[0] >= '0' && s[0] <= '9' && strlen(s) <= 9 ? strtoll(s, &end, 10) : -1;
	if (v < 0 || *end || (s[0] == '0' && s[1])) {
		char msg[120];
		snprintf(msg, sizeof msg, "version \"%.40s\" is not an integer >= 0", s);
		http_reply_error(req, 400, "invalid", msg, NULL);
		return false;
	}
	*out = v;
	return true;
}

/* A positive integer query argument (at most 18 digits), or 0. */
long long rounds_query_pos(http_req *req, const char *name)
{
	const char *s = http_query(req, name);
	char *end = NULL;
	long long v = s && s[0] >= '1' && s[0] <= '9' && strlen(s) <= 18 ? strtoll(s, &end, 10) : 0;
	return v > 0 && !*end ? v : 0;
}

static const dbc_stmt st_plan = { "round_plan_get",
	                          "SELECT status, body FROM round_plan_get($1::bytea, $2, $3, $4)", 4 };

/* Does a 200 plan answer (JSON text) lack the mean gradient? */
static bool plan_without_gradient(const char *body, size_t len)
{
	json_t *j = json_loadb(body, len, 0, NULL);
	bool without = j && !json_object_get(j, "gradient");
	json_decref(j);
	return without;
}

/* The plan, a long poll (doc/api.md): with wait=S the request is held (the
 * connection suspended, http_hold) while the round is open or closing, or,
 * with after=gradient, until the mean gradient exists; the coordinator
 * (a plan), the group sum that completes the round (the mean), or the
 * deadline wake it up, and it looks again.  A wait that runs out answers
 * 204 with Retry-After. */
void api_round_plan(http_req *req)
{
	long long version;
	char hp[API_HASH_PARAM_LEN];
	if (!rounds_path_version(req, &version) || !api_bearer(req, hp))
		return;
	const char *h = http_query(req, "host_id");
	char *end = NULL;
	long long host = h && h[0] >= '1' && h[0] <= '9' && strlen(h) <= 18 ? strtoll(h, &end, 10) : 0;
	if (host <= 0 || *end) {
		http_reply_error(req, 400, "invalid", "query argument \"host_id\" must be a positive integer",
		                 "Ask for /v1/projects/<name>/rounds/<version>/plan?host_id=<your host id>.");
		return;
	}
	long long wait = 0;
	if (!api_query_int(req, "wait", 0, PLAN_WAIT_MAX, &wait))
		return;
	const char *after = http_query(req, "after");
	if (after && strcmp(after, "gradient") != 0) {
		http_reply_error(req, 400, "invalid", "query argument \"after\" must be \"gradient\"",
		                 "Leave it out to wait for the plan; add after=gradient to wait for the mean "
		                 "gradient.");
		return;
	}
	if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
		return;
	}
	/* Held before: the database took its token at the first look. */
	bool resumed = req->hold_until != 0;
	if (wait > 0 && req->hold_until == 0)
		req->hold_until = http_now() + (double)wait;
	req->hold_kind = HTTP_HOLD_PLAN;
	char sv[24], sh[24];
	snprintf(sv, sizeof sv, "%lld", version);
	snprintf(sh, sizeof sh, "%lld", host);
	const char *params[] = { hp, req->params[0], sv, sh };
	for (int look = 0;; look++) {
		unsigned long gen = http_wake_gen(req);
		size_t clen = 0;
		bool cgrad = false;
		char *cached = resumed || look > 0
		                       ? plan_cache_get(req->params[0], version, host, hp, gen, &clen, &cgrad)
		                       : NULL;
		if (cached && (!after || cgrad)) {
			metrics_plan_answer(true);
			http_reply_raw(req, 200, cached, clen);
			free(cached);
			return;
		}
		PGresult *r = NULL;
		int status = 204; /* a cached plan without the mean, after=gradient */
		if (!cached) {
			if (!(r = api_exec(req, &st_plan, params, NULL)))
				return;
			status = PQntuples(r) == 1 ? atoi(PQgetvalue(r, 0, 0)) : 500;
			if (status == 200) /* the others woken with it: from one query */
				plan_cache_fill(req->params[0], version, gen);
			if (status == 200 && after &&
			    plan_without_gradient(PQgetvalue(r, 0, 1), (size_t)PQgetlength(r, 0, 1)))
				status = 204; /* no mean gradient yet: as if no plan */
		}
		free(cached);
		if (status == 204 && wait > 0) {
			api_poll t = api_long_poll(req, gen, look);
			if (t != API_POLL_ANSWER) {
				PQclear(r);
				if (t == API_POLL_HELD)
					return;
				continue;
			}
		}
		if (status == 204) {
			/* No plan (or no mean) yet: no body, and when to ask again. */
			char ra[16];
			snprintf(ra, sizeof ra, "%d", req->cfg->round_interval);
			http_reply_raw(req, 204, "", 0);
			http_add_header(req, "Retry-After", ra);
		} else if (status == 500) {
			http_reply_error(req, 500, "internal_error", "unexpected result from the database",
			                 NULL);
		} else {
			if (status == 200)
				metrics_plan_answer(false);
			http_reply_raw(req, status, PQgetvalue(r, 0, 1), (size_t)PQgetlength(r, 0, 1));
		}
		PQclear(r);
		return;
	}
}

static const dbc_stmt st_outcome = { "round_outcome_links",
	                             "SELECT status, body FROM round_outcome_links($1::bytea, $2, $3, $4, "
	                             "$5, $6::jsonb, $7, $8::jsonb, $9::jsonb, $10)",
	                             10 };

/* After a new 'ok' or 'dropped' is in: the commit it may complete, in a
 * transaction of its own (round_outcome_settle says why).  A row, the
 * host's answer, when the round moved; none else. */
static const dbc_stmt st_outcome_settle = { "round_outcome_settle",
	                                    "SELECT status, body FROM round_outcome_settle($1, $2, $3)", 3 };

/* A held outcome's later looks read the answer only (the outcome is in). */
static const dbc_stmt st_outcome_look = {
	"round_outcome_look", "SELECT status, body FROM round_outcome_look($1::bytea, $2, $3, $4)", 4
};

static bool known_rung(const char *r)
{
	return strcmp(r, "lan") == 0 || strcmp(r, "direct") == 0 || strcmp(r, "punch") == 0 ||
	       strcmp(r, "relay") == 0;
}

/* Check the outcome's optional "links" (the connections this host dialed:
 * [{"peer": id, "rung": "lan"|"direct"|"punch"|"relay", "connect_ms": 0..600000,
 *   "plan": the rung the NAT service planned, optional, one of the same}],
 * at most LINKS_MAX, each peer once) and write their canonical JSON text to
 * *out (malloc'd; NULL when the field is absent or null).  COT_ERR_INVALID
 * with a message naming the entry; COT_ERR_NOMEM. */
static cot_err links_param(const json_t *body, char **out, cot_errbuf *eb)
{
	*out = NULL;
	const json_t *links = json_object_get(body, "links");
	if (!links || json_is_null(links))
		return COT_OK;
	if (!json_is_array(links) || json_array_size(links) > LINKS_MAX)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "field \"links\" must be an array of at most %d connections", LINKS_MAX);
	json_t *canon = json_array();
	if (!canon)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	cot_err rc = COT_OK;
	size_t i;
	const json_t *l;
	json_array_foreach(links, i, l)
	{
		long long peer;
		const char *rung, *plan = NULL;
		double ms;
		cot_errbuf fe = { "", "" };
		if (!json_is_object(l)) {
			rc = cot_seterr(eb, COT_ERR_INVALID, "links[%zu] must be an object", i);
			break;
		}
		if (cot_json_int(l, "peer", true, 1, (1LL << 62), &peer, &fe) ||
		    cot_json_str(l, "rung", true, 1, 16, &rung, &fe) ||
		    cot_json_num(l, "connect_ms", true, 0, CONNECT_MS_MAX, &ms, &fe) ||
		    cot_json_str(l, "plan", false, 1, 16, &plan, &fe)) {
			rc = cot_seterr(eb, COT_ERR_INVALID, "links[%zu]: %s", i, fe.msg);
			break;
		}
		if (!known_rung(rung) || (plan && !known_rung(plan))) {
			rc = cot_seterr(eb, COT_ERR_INVALID,
			                "links[%zu]: field \"%s\" must be \"lan\", \"direct\", \"punch\" or "
			                "\"relay\"",
			                i, known_rung(rung) ? "plan" : "rung");
			break;
		}
		for (size_t j = 0; j < json_array_size(canon); j++)
			if (json_integer_value(json_object_get(json_array_get(canon, j), "peer")) == peer)
				rc = cot_seterr(eb, COT_ERR_INVALID, "links[%zu]: peer %lld is named twice",
				                i, peer);
		if (rc)
			break;
		if (json_array_append_new(canon, json_pack("{s:I, s:s, s:f, s:s?}", "peer", (json_int_t)peer,
		                                           "rung", rung, "connect_ms", ms, "plan", plan))) {
			rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
			break;
		}
	}
	if (!rc && !(*out = json_dumps(canon, JSON_COMPACT)))
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	json_decref(canon);
	return rc;
}

static api_news moved_seen = API_NEWS_INIT;
static api_news due_seen = API_NEWS_INIT;

/* A host's outcome (doc/api.md "Rounds").  With the query argument wait=S
 * an "ok" whose answer cannot say yet whether the host is accepted (the
 * server's own v+1 is not computed) is held until the round moves, so the
 * host hears the moment it can go on. */
void api_round_outcome(http_req *req)
{
	if (req->early)
		return; /* a body of up to API_REPORT_MAX_BYTES (sketches): read it */
	long long version, wait = 0;
	char hp[API_HASH_PARAM_LEN];
	if (!rounds_path_version(req, &version) || !api_bearer(req, hp) ||
	    !api_query_int(req, "wait", 0, PLAN_WAIT_MAX, &wait))
		return;
	json_t *body;
	if (!api_body(req, false, &body))
		return;
	long long host = 0;
	const char *status = NULL, *sha = NULL, *moments = NULL;
	char *included = NULL, *links = NULL, *sketches = NULL;
	cot_errbuf eb = { 0 };
	if (cot_json_int(body, "host_id", true, 1, (1LL << 62), &host, &eb) ||
	    cot_json_str(body, "status", true, 1, 16, &status, &eb)) {
		api_bad_request(req, &eb);
		goto out;
	}
	bool okay = strcmp(status, "ok") == 0;
	if (!okay && strcmp(status, "failed") != 0 && strcmp(status, "dropped") != 0) {
		http_reply_error(req, 400, "invalid",
		                 "field \"status\" must be \"ok\", \"failed\" or \"dropped\"", NULL);
		goto out;
	}
	if (cot_json_str(body, "params_sha256", okay, 64, 64, &sha, &eb) ||
	    cot_json_str(body, "moments_sha256", false, 64, 64, &moments, &eb)) {
		api_bad_request(req, &eb);
		goto out;
	}
	const char *bad = sha && !hash_is_sha256_hex(sha)           ? "params_sha256"
	                  : moments && !hash_is_sha256_hex(moments) ? "moments_sha256"
	                                                            : NULL;
	if (bad) {
		char msg[64];
		snprintf(msg, sizeof msg, "field \"%s\" must be 64 lowercase hex digits", bad);
		http_reply_error(req, 400, "invalid", msg, NULL);
		goto out;
	}
	if (!okay)
		moments = NULL; /* the moments of a v+1 it did not take */
	json_t *inc = json_object_get(body, "included_hosts");
	json_t *canon = json_array();
	if (json_is_null(inc))
		inc = NULL; /* absent: an empty list */
	bool good = canon && (!inc || (json_is_array(inc) && json_array_size(inc) <= INCLUDED_MAX));
	size_t i;
	json_t *v;
	json_array_foreach(good && inc ? inc : NULL, i, v)
	{
		if (!json_is_integer(v) || json_integer_value(v) <= 0) {
			good = false;
			break;
		}
		json_array_append(canon, v);
	}
	included = good ? json_dumps(canon, JSON_COMPACT) : NULL;
	json_decref(canon);
	if (!included) {
		http_reply_error(req, 400, "invalid", "field \"included_hosts\" must be an array of host ids",
		                 NULL);
		goto out;
	}
	cot_err lrc = links_param(body, &links, &eb);
	if (lrc == COT_ERR_NOMEM) {
		http_reply_error(req, 500, "internal_error", "out of memory", NULL);
		goto out;
	} else if (lrc) {
		api_bad_request(req, &eb);
		goto out;
	}
	char sv[24], sh[24];
	snprintf(sv, sizeof sv, "%lld", version);
	snprintf(sh, sizeof sh, "%lld", host);
	if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
		goto out;
	}
	/* The sketches of what the host averaged: checked in
	 * round_sketches_invalid (db/functions/round_sketch.sql). */
	const json_t *skj = json_object_get(body, "sketches");
	if (skj && !json_is_null(skj) && !json_is_object(skj)) {
		http_reply_error(req, 400, "invalid", "field \"sketches\" must be an object", NULL);
		goto out;
	}
	sketches = skj && json_is_object(skj) ? json_dumps(skj, JSON_COMPACT) : NULL;
	if (skj && json_is_object(skj) && !sketches) {
		http_reply_error(req, 500, "internal_error", "out of memory", NULL);
		goto out;
	}
	const char *params[] = { hp, req->params[0], sv, sh, status, included, sha, links, sketches, moments };
	bool resumed = req->hold_until != 0; /* woken from a hold, not a new request */
	if (wait > 0 && req->hold_until == 0)
		req->hold_until = http_now() + (double)wait;
	req->hold_kind = HTTP_HOLD_OUTCOME;
	req->hold_tag = host;
	for (int look = 0;; look++) {
		unsigned long gen = http_wake_gen(req);
		/* Posted on the first look, whose answer held it: the later looks
		 * (woken, or again at once) only read.  Posting again would also
		 * record the outcome in a rerun's new plan, which it is not about. */
		bool post = !resumed && look == 0;
		PGresult *r = api_exec(req, post ? &st_outcome : &st_outcome_look, params, NULL);
		if (r && post && strcmp(status, "failed") != 0 && PQntuples(r) == 1 && PQnfields(r) == 2 &&
		    atoi(PQgetvalue(r, 0, 0)) == 200) {
			/* Our outcome may be the last the round waited for: a round
			 * that moved is answered as it is now. */
			const char *sp[] = { req->params[0], sv, sh };
			PGresult *m = api_exec(req, &st_outcome_settle, sp, NULL);
			if (!m) {
				PQclear(r);
				goto out;
			}
			if (PQntuples(m) == 1) {
				PQclear(r);
				r = m;
			} else {
				PQclear(m);
			}
		}
		if (!r)
			goto out;
		if (PQntuples(r) != 1 || PQnfields(r) != 2) {
			http_reply_error(req, 500, "internal_error", "unexpected result from the database",
			                 NULL);
			PQclear(r);
			goto out;
		}
		int st = atoi(PQgetvalue(r, 0, 0));
		json_t *j = st == 200 ? json_loadb(PQgetvalue(r, 0, 1), (size_t)PQgetlength(r, 0, 1), 0, NULL)
		                      : NULL;
		const char *state = json_string_value(json_object_get(json_object_get(j, "round"), "state"));
		bool undecided = state && strcmp(state, "averaging") == 0 &&
		                 !json_is_boolean(json_object_get(j, "accepted"));
		bool moved = state && strcmp(state, "averaging") != 0;
		/* Across groups between the peers: a peer asked for v+1 must hear
		 * it now, and is woken when it waits (round_cross.sql). */
		bool upload = json_is_true(json_object_get(j, "checkpoint_upload"));
		json_int_t uploader = json_integer_value(json_object_get(j, "checkpoint_uploader"));
		char news_key[160];
		snprintf(news_key, sizeof news_key, "%s:%s:%lld:%s:%lld", req->params[0], sv,
		         (long long)json_integer_value(
		                 json_object_get(json_object_get(j, "round"), "attempt")),
		         state ? state : "", (long long)uploader);
		json_decref(j); /* state pointed into j: use moved from here on */
		/* A new outcome that made v+1 due wakes the uploader's long poll,
		 * and only it, once a round attempt and uploader (each later post
		 * that saw it due woke every held outcome: some 250 wake-ups a
		 * round at 1,000 hosts; then one wake of the thousand, which took
		 * 2 s of the threads to tell one host). */
		if (uploader > 0 && uploader != host && post && api_is_news(&due_seen, news_key))
			http_wake_tag(HTTP_WAKE(HTTP_HOLD_OUTCOME), uploader);
		if (undecided && okay && wait > 0 && !upload) {
			/* Our v+1 is in, the server's is not yet: wait for it. */
			api_poll t = api_long_poll(req, gen, look);
			if (t != API_POLL_ANSWER) {
				PQclear(r);
				if (t == API_POLL_HELD)
					goto out;
				continue;
			}
		}
		http_reply_raw(req, st, PQgetvalue(r, 0, 1), (size_t)PQgetlength(r, 0, 1));
		/* A commit or a failure this outcome made moved the round: long
		 * polls look again.  Once per round and state: the thousand outcomes
		 * answered after a commit each waking every held request were a
		 * million looks a round (a resumed look never moves the round: the
		 * v+1 or mean it waited for moved it, and woke them). */
		if (moved && !resumed && api_is_news(&moved_seen, news_key))
			http_wake_held();
		PQclear(r);
		break;
	}
out:
	free(included);
	free(links);
	free(sketches);
	json_decref(body);
}

/* Sketch the group sum x[0..n) (named sha, of group group of round
 * version of project project_id) under seed with k (1..SKETCH_K_MAX)
 * values and keep it through st (round_group_sum_sketch or its seed2
 * twin: project, version, group, sha, sketch).  False when the database
 * failed (answered). */
static bool store_sum_sketch(http_req *req, const dbc_stmt *st, const char *project_id, const char *version,
                             const char *group, const char *sha, const float *x, size_t n, uint64_t seed,
                             int k)
{
	double acc[SKETCH_K_MAX] = { 0 };
	sketch_add(x, n, 0, seed, k, acc);
	char lit[API_FLOAT8_LEN(SKETCH_K_MAX)];
	api_float8_literal(acc, (size_t)k, lit, sizeof lit);
	const char *sp[] = { project_id, version, group, sha, lit };
	PGresult *r = api_exec(req, st, sp, NULL);
	PQclear(r);
	return r != NULL;
}

static const dbc_stmt st_seed2_todo = { "round_group_sum_seed2_todo",
	                                "SELECT project_id, group_id, sum_sha256, seed2, k"
	                                " FROM round_group_sum_seed2_todo($1::bytea, $2, $3, $4)",
	                                4 };
static const dbc_stmt st_sketch2 = { "round_group_sum_sketch2",
	                             "SELECT round_group_sum_sketch2($1, $2, $3, $4, $5::double precision[])",
	                             5 };

/* Before a peer alone in its group stores its sketches under the second
 * seed (which may run the check under it): the server's own sketch, under
 * that seed, of the group sum the peer uploaded (round_group_sum_seed2_todo;
 * check 4 of round_seed2_verify).  Nothing when the peer was not alone on
 * the server's path, or the token is not the host's (the report answers
 * that).  False when the database failed (answered); a sum that cannot be
 * read is logged and left unsketched, and its check skipped. */
static bool sketch_lone_sum_seed2(http_req *req, const char *hp, const char *sv, const char *sh)
{
	const char *pp[] = { hp, req->params[0], sv, sh };
	PGresult *r = api_exec(req, &st_seed2_todo, pp, NULL);
	if (!r)
		return false;
	int k = PQntuples(r) == 1 && !PQgetisnull(r, 0, 3) && !PQgetisnull(r, 0, 4)
	                ? atoi(PQgetvalue(r, 0, 4))
	                : 0;
	if (k < 1 || k > SKETCH_K_MAX) {
		PQclear(r);
		return true;
	}
	uint64_t seed2 = (uint64_t)strtoll(PQgetvalue(r, 0, 3), NULL, 10);
	char pid[24], group[24], sha[FS_SHA_HEX_LEN + 1];
	snprintf(pid, sizeof pid, "%s", PQgetvalue(r, 0, 0));
	snprintf(group, sizeof group, "%s", PQgetvalue(r, 0, 1));
	snprintf(sha, sizeof sha, "%s", PQgetvalue(r, 0, 2));
	PQclear(r);
	unsigned char *buf = NULL;
	size_t len = 0;
	cot_errbuf eb = { 0 };
	if (fs_read_verified(req->cfg->files_dir, sha, SIZE_MAX, &buf, &len, &eb) || len % sizeof(float)) {
		log_warn("round %s of project %s: could not sketch host %s's group sum %s under the second "
		         "seed: %s",
		         sv, req->params[0], sh, sha, eb.msg[0] ? eb.msg : "not fp32 values");
		free(buf);
		return true;
	}
	bool done = store_sum_sketch(req, &st_sketch2, pid, sv, group, sha, (const float *)buf,
	                             len / sizeof(float), seed2, k);
	free(buf);
	return done;
}

static const dbc_stmt st_seed2 = {
	"round_seed2_report", "SELECT status, body FROM round_seed2_report($1::bytea, $2, $3, $4, $5::jsonb)",
	5
};

/* A peer's sketches under the second seed of a committed round (doc/api.md
 * "Rounds"): {"host_id", "sketches"}, the shape checked in SQL
 * (round_seed2_invalid). */
void api_round_seed2(http_req *req)
{
	if (req->early)
		return; /* a body of up to API_REPORT_MAX_BYTES: read it */
	long long version, host = 0;
	char hp[API_HASH_PARAM_LEN];
	if (!rounds_path_version(req, &version) || !api_bearer(req, hp))
		return;
	json_t *body;
	if (!api_body(req, false, &body))
		return;
	char *sketches = NULL;
	cot_errbuf eb = { 0 };
	const json_t *skj = json_object_get(body, "sketches");
	if (cot_json_int(body, "host_id", true, 1, (1LL << 62), &host, &eb)) {
		api_bad_request(req, &eb);
	} else if (!json_is_object(skj)) {
		http_reply_error(req, 400, "invalid", "field \"sketches\" must be an object", NULL);
	} else if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
	} else if (!(sketches = json_dumps(skj, JSON_COMPACT))) {
		http_reply_error(req, 500, "internal_error", "out of memory", NULL);
	} else {
		char sv[24], sh[24];
		snprintf(sv, sizeof sv, "%lld", version);
		snprintf(sh, sizeof sh, "%lld", host);
		const char *params[] = { hp, req->params[0], sv, sh, sketches };
		if (sketch_lone_sum_seed2(req, hp, sv, sh))
			api_relay(req, &st_seed2, params);
	}
	free(sketches);
	json_decref(body);
}

PGresult *rounds_member_begin(http_req *req, const dbc_stmt *stmt, const char *hp, long long version,
                              long long host, long long samples, const char *included, rounds_member_args *a)
{
	if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
		return NULL;
	}
	snprintf(a->version, sizeof a->version, "%lld", version);
	snprintf(a->host, sizeof a->host, "%lld", host);
	snprintf(a->samples, sizeof a->samples, "%lld", samples);
	const char *params[] = { hp, req->params[0], a->version, a->host, a->samples, included };
	PGresult *r = api_exec(req, stmt, params, NULL);
	if (!r)
		return NULL;
	if (PQntuples(r) != 1)
		http_reply_error(req, 500, "internal_error", "unexpected result from the database", NULL);
	else if (!PQgetisnull(r, 0, 0))
		http_reply_raw(req, atoi(PQgetvalue(r, 0, 0)), PQgetvalue(r, 0, 1),
		               (size_t)PQgetlength(r, 0, 1));
	else
		return r;
	PQclear(r);
	return NULL;
}

/* The "included" query argument: ascending positive host ids separated by
 * commas, at most GROUP_INCLUDED_MAX of them, as a JSON array text into
 * out (malloc'd).  False (answered 400) otherwise. */
bool rounds_included_param(http_req *req, char **out)
{
	const char *s = http_query(req, "included");
	size_t len = s ? strlen(s) : 0;
	const char *why = NULL;
	if (!s || len == 0)
		why = "query argument \"included\" is missing";
	else if (len > GROUP_INCLUDED_MAX_LEN)
		why = "query argument \"included\" is too long";
	char *buf = why ? NULL : malloc(len + 3);
	if (!why && !buf) {
		http_reply_error(req, 500, "internal_error", "out of memory", NULL);
		return false;
	}
	size_t o = 0;
	int count = 0;
	long long prev = 0;
	if (buf)
		buf[o++] = '[';
	for (const char *p = s; !why;) {
		const char *q = p;
		while (*q >= '0' && *q <= '9')
			q++;
		size_t nd = (size_t)(q - p);
		if (nd == 0 || nd > 18 || *p == '0' || (*q != ',' && *q != '\0')) {
			why = "query argument \"included\" must be host ids separated by commas";
			break;
		}
		long long id = strtoll(p, NULL, 10);
		if (id <= prev) {
			why = "query argument \"included\" must list host ids in ascending order, each once";
			break;
		}
		if (++count > GROUP_INCLUDED_MAX) {
			why = "query argument \"included\" lists too many hosts";
			break;
		}
		prev = id;
		if (o > 1)
			buf[o++] = ',';
		memcpy(buf + o, p, nd);
		o += nd;
		if (*q == '\0')
			break;
		p = q + 1;
	}
	if (why) {
		free(buf);
		http_reply_error(req, 400, "invalid", why,
		                 "Send included=<id>,<id>,... : the ascending ids of the hosts whose "
		                 "contributions the sum holds.");
		return false;
	}
	buf[o++] = ']';
	buf[o] = '\0';
	*out = buf;
	return true;
}

static const dbc_stmt st_sum_begin = { "round_group_sum_begin",
	                               "SELECT status, body, project_id, attempt, group_id, param_count"
	                               " FROM round_group_sum_begin($1::bytea, $2, $3, $4, $5, $6::jsonb)",
	                               6 };
static const dbc_stmt st_sum_store = { "round_group_sum_store",
	                               "SELECT status, body, compute, sums, checkpoint_sha256, config"
	                               " FROM round_group_sum_store($1, $2, $3, $4, $5, $6, $7::jsonb, $8)",
	                               8 };
/* The round's sketch seed and k, for a group of one peer only. */
static const dbc_stmt st_sum_sketch_params = { "round_group_sum_sketch_params",
	                                       "SELECT s->>'seed', s->>'k' FROM spot_sketch_params($1, $2) s"
	                                       " WHERE round_group_size($1, $2, $3) = 1",
	                                       3 };
static const dbc_stmt st_sum_sketch = {
	"round_group_sum_sketch", "SELECT round_group_sum_sketch($1, $2, $3, $4, $5::double precision[])", 5
};

/* A group of one peer (included names one host): sketch the sum it
 * uploaded under the round's sketch seed and keep the sketch beside the
 * kept sum (round_group_sum_sketch), for round_sketch_verify to compare
 * with the sketches the peer committed (doc/credit.md, "A peer alone in
 * its group").  Nothing for a group of several or a project not checked.
 * False when the database failed (answered). */
static bool sketch_lone_sum(http_req *req, const char *project_id, const char *version, const char *group,
                            const char *included, const char *gsha, const float *sum, size_t n)
{
	if (strchr(included, ','))
		return true;
	const char *pp[] = { project_id, version, group };
	PGresult *r = api_exec(req, &st_sum_sketch_params, pp, NULL);
	if (!r)
		return false;
	bool checked = PQntuples(r) == 1 && !PQgetisnull(r, 0, 0) && !PQgetisnull(r, 0, 1);
	long long seed = checked ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : 0;
	int k = checked ? atoi(PQgetvalue(r, 0, 1)) : 0;
	PQclear(r);
	if (!checked || k < 1 || k > SKETCH_K_MAX)
		return true;
	return store_sum_sketch(req, &st_sum_sketch, project_id, version, group, gsha, sum, n, (uint64_t)seed,
	                        k);
}

static const dbc_stmt st_mean_store = { "round_mean_store",
	                                "SELECT round_mean_store($1, $2, $3, $4, $5, $6, $7, $8, $9)", 9 };

/* Every group of the round has a sum: compute the mean gradient from the
 * stored sums (store's "sums", ascending groups) and v+1 from it, keep both,
 * and record them (round_mean_store), which answers the request.  On
 * failure answers 500 (a later upload of any group tries again). */
static void compute_mean(http_req *req, long long version, const char *project_id, const char *attempt,
                         const char *group, size_t n, PGresult *st)
{
	json_t *sums = json_loads(PQgetvalue(st, 0, 3), 0, NULL);
	size_t ns = json_array_size(sums);
	const char **names = calloc(ns ? ns : 1, sizeof *names);
	float *mean = malloc(n * sizeof *mean);
	long long total = 0;
	cot_errbuf eb = { 0 };
	cot_err rc = COT_OK;
	if (!sums || !names || !mean || ns == 0 || ns > INT32_MAX) {
		rc = cot_seterr(&eb, COT_ERR_NOMEM, "could not read the group sums");
		goto out;
	}
	for (size_t k = 0; k < ns; k++) {
		json_t *e = json_array_get(sums, k);
		names[k] = json_string_value(json_object_get(e, "sha256"));
		total += json_integer_value(json_object_get(e, "samples"));
		if (!names[k]) {
			rc = cot_seterr(&eb, COT_ERR_INTERNAL, "a group sum has no name");
			goto out;
		}
	}
	char gsha[FS_SHA_HEX_LEN + 1], ckpt[FS_SHA_HEX_LEN + 1], psha[FS_SHA_HEX_LEN + 1];
	uint64_t size = 0;
	rc = round_step_mean(req->cfg->files_dir, names, (int)ns, total, mean, n, &eb);
	if (rc)
		goto out;
	if (hash_sha256_hex(mean, n * sizeof *mean, gsha)) {
		rc = cot_seterr(&eb, COT_ERR_INTERNAL, "could not hash the mean gradient");
		goto out;
	}
	if ((rc = fs_put_buffer(req->cfg->files_dir, mean, n * sizeof *mean, gsha, NULL, &eb)) ||
	    (rc = round_step_compute(req->cfg->files_dir, PQgetisnull(st, 0, 4) ? "" : PQgetvalue(st, 0, 4),
	                             PQgetvalue(st, 0, 5), version, mean, n, ckpt, &size, psha, &eb)))
		goto out;
	char sv[24], stotal[24], ssize[24];
	snprintf(sv, sizeof sv, "%lld", version);
	snprintf(stotal, sizeof stotal, "%lld", total);
	snprintf(ssize, sizeof ssize, "%llu", (unsigned long long)size);
	const char *params[] = { project_id, sv, attempt, group, gsha, stotal, ckpt, ssize, psha };
	PGresult *r = api_exec(req, &st_mean_store, params, NULL);
	if (r) {
		http_reply_raw(req, 200, PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0));
		PQclear(r);
		log_info("round %lld of project %s: mean gradient of %zu groups over %lld samples, "
		         "v+1 params %s",
		         version, req->params[0], ns, total, psha);
		http_wake_held(); /* plans waiting for the mean gradient, and a commit maybe */
	}
out:
	if (rc) {
		log_error("round %lld of project %s: the server's step failed: %s", version, req->params[0],
		          eb.msg);
		http_reply_error(req, 500, "internal_error", "could not compute the next version", eb.msg);
	}
	free(mean);
	free(names);
	json_decref(sums);
}

/* A group's gradient sum (doc/api.md, "Group sums"): checked by the
 * database (token, plan membership, state, included hosts, samples) before
 * the body is read, by Content-Length (req->early), then by length and
 * values; the first valid upload per group is kept, and the upload that
 * completes the set computes the round's mean gradient and v+1
 * (compute_mean), synchronously. */
void api_round_group_sum(http_req *req)
{
	long long version;
	char hp[API_HASH_PARAM_LEN];
	char *included = NULL;
	PGresult *r = NULL;
	float *sum = NULL;
	if (!rounds_path_version(req, &version) || !api_bearer(req, hp))
		return;
	long long host = rounds_query_pos(req, "host_id"), samples = rounds_query_pos(req, "samples");
	if (!host || !samples) {
		http_reply_error(req, 400, "invalid",
		                 "query arguments \"host_id\" and \"samples\" must be positive integers",
		                 "POST "
		                 "/v1/projects/<name>/rounds/<version>/"
		                 "group_sum?host_id=<id>&samples=<S>&included=<ids>.");
		return;
	}
	if (!rounds_included_param(req, &included))
		return;
	rounds_member_args a;
	r = rounds_member_begin(req, &st_sum_begin, hp, version, host, samples, included, &a);
	if (!r)
		goto out;
	const char *sv = a.version, *sh = a.host, *ss = a.samples;
	unsigned long long n = strtoull(PQgetvalue(r, 0, 5), NULL, 10);
	unsigned long long want = n * sizeof(float);
	unsigned long long have = req->body_len;
	if (req->early) {
		const char *cl = http_header(req, "Content-Length");
		char *end = NULL;
		have = cl && *cl >= '0' && *cl <= '9' ? strtoull(cl, &end, 10) : want;
		if (!end || *end)
			have = want; /* no usable length: read, then check */
	}
	if (n == 0 || n > API_GRADIENT_MAX_BYTES / sizeof(float) || have != want) {
		char msg[160];
		snprintf(msg, sizeof msg,
		         "the group sum must be exactly %llu bytes (%llu fp32 values), not %llu", want, n,
		         have);
		http_reply_error(req, have > want ? 413 : 400, have > want ? "too_large" : "invalid", msg,
		                 "Send the group's gradient sum as raw little-endian fp32, param_count "
		                 "values.");
		goto out;
	}
	if (req->early) {
		req->body_max = (size_t)want; /* a chunked body too: not a byte more */
		goto out;                     /* the length is right: read the body */
	}
	metrics_gradient_bytes(req->body_len);
	sum = malloc(req->body_len);
	if (!sum) {
		http_reply_error(req, 500, "internal_error", "out of memory for the group sum",
		                 "Try again later.");
		goto out;
	}
	memcpy(sum, req->body, req->body_len); /* aligned */
	for (size_t i = 0; i < n; i++)
		if (!isfinite(sum[i])) {
			char msg[96];
			snprintf(msg, sizeof msg, "value %zu of the group sum is not finite", i);
			http_reply_error(req, 400, "invalid", msg, "Every value of the sum must be finite.");
			goto out;
		}
	char gsha[FS_SHA_HEX_LEN + 1];
	cot_errbuf eb = { 0 };
	if (hash_sha256_hex(sum, req->body_len, gsha) ||
	    fs_put_buffer(req->cfg->files_dir, sum, req->body_len, gsha, NULL, &eb)) {
		http_reply_error(req, 500, "internal_error", "could not store the group sum",
		                 eb.msg[0] ? eb.msg : NULL);
		goto out;
	}
	char project_id[24], attempt[16], group[16];
	snprintf(project_id, sizeof project_id, "%s", PQgetvalue(r, 0, 2));
	snprintf(attempt, sizeof attempt, "%s", PQgetvalue(r, 0, 3));
	snprintf(group, sizeof group, "%s", PQgetvalue(r, 0, 4));
	PQclear(r);
	const char *sparams[] = { project_id, sv, attempt, group, sh, ss, included, gsha };
	r = api_exec(req, &st_sum_store, sparams, NULL);
	if (!r)
		goto out;
	if (PQntuples(r) != 1) {
		http_reply_error(req, 500, "internal_error", "unexpected result from the database", NULL);
		goto out;
	}
	/* Kept (200): sketched before the peer hears so, and so before its
	 * outcome can commit the round. */
	if (atoi(PQgetvalue(r, 0, 0)) == 200 &&
	    !sketch_lone_sum(req, project_id, sv, group, included, gsha, sum, (size_t)n))
		goto out;
	free(sum);
	sum = NULL;
	if (strcmp(PQgetvalue(r, 0, 2), "t") == 0 && atoi(PQgetvalue(r, 0, 0)) == 200)
		compute_mean(req, version, project_id, attempt, group, (size_t)n, r);
	else
		http_reply_raw(req, atoi(PQgetvalue(r, 0, 0)), PQgetvalue(r, 0, 1),
		               (size_t)PQgetlength(r, 0, 1));
out:
	free(sum);
	PQclear(r);
	free(included);
}

static const dbc_stmt st_list = { "round_list", "SELECT status, body FROM round_list($1, $2, $3)", 3 };

/* The rounds of a project, newest first (public). */
void api_round_list(http_req *req)
{
	long long limit = 100, before = -1;
	if (!api_query_int(req, "limit", 1, ROUND_LIST_MAX, &limit) ||
	    !api_query_int(req, "before", 0, 1000000000, &before))
		return;
	if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
		return;
	}
	char sl[24], sb[24];
	snprintf(sl, sizeof sl, "%lld", limit);
	snprintf(sb, sizeof sb, "%lld", before);
	const char *params[] = { req->params[0], sl, before >= 0 ? sb : NULL };
	api_relay(req, &st_list, params);
}
