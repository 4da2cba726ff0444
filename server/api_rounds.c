/* cotrain-server: the routes of a training round (db/migrations/
 * 0003_rounds.sql holds the state machine): a work unit's report once the
 * round closes, a host's averaging plan, the round's averaged gradient
 * (from which the server computes v+1 itself, round_step.h), and a host's
 * outcome.  Like api_work.c,
 * each is one PL/pgSQL call answering (status, body); this file checks the
 * request's shape and turns untrusted fields into bounded parameters. */
#include "server/api.h"

#include <arpa/inet.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/apiutil.h"
#include "server/round_coord.h"
#include "server/round_step.h"
#include "shared/filestore.h"
#include "shared/hash.h"
#include "shared/json.h"
#include "shared/log.h"

#define RTT_MAX_ENTRIES 4096
#define RTT_MAX_MS 1e6
#define INCLUDED_MAX 100000

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
			                  "field \"rtt\" must be an object of at most %d host ids", RTT_MAX_ENTRIES);
		}
		const char *k;
		json_t *v;
		json_object_foreach(rtt, k, v) {
			char *end;
			long long id = k[0] >= '1' && k[0] <= '9' && strlen(k) <= 18 ? strtoll(k, &end, 10) : 0;
			double ms = json_is_number(v) ? json_number_value(v) : -1;
			if (id <= 0 || *end || !(ms >= 0 && ms <= RTT_MAX_MS)) {
				json_decref(canon);
				cot_seterr(eb, COT_ERR_INVALID, "field \"rtt\" must map host ids to milliseconds");
				cot_sethint(eb, "Send {\"<host id>\": <round-trip time in ms, 0 to 1000000>, ...}.");
				return COT_ERR_INVALID;
			}
			json_object_set_new(canon, k, json_real(ms));
		}
	}
	*out = json_dumps(canon, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(canon);
	return *out ? COT_OK : cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
}

static const dbc_stmt st_report = {
	"round_report",
	"SELECT status, body FROM round_report($1::bytea, $2, $3, $4, $5, $6, $7, $8::jsonb)", 8
};

void api_work_report(http_req *req)
{
	long long wu;
	char hp[API_HASH_PARAM_LEN];
	if (!api_path_id(req, 0, "work unit", &wu) || !api_bearer(req, hp))
		return;
	json_t *body;
	if (!api_body(req, false, &body))
		return;
	long long mb_done = 0, samples = 0;
	double bandwidth = 0;
	bool can_aggregate = false;
	const char *endpoint = NULL;
	char *rtt = NULL;
	cot_errbuf eb = { 0 };
	if (cot_json_int(body, "mb_done", true, 0, (1LL << 40), &mb_done, &eb) ||
	    cot_json_int(body, "samples", true, 0, (1LL << 50), &samples, &eb) ||
	    cot_json_str(body, "endpoint", true, 1, 63, &endpoint, &eb) ||
	    cot_json_num(body, "bandwidth", true, 1, 1e13, &bandwidth, &eb) ||
	    cot_json_bool(body, "can_aggregate", true, &can_aggregate, &eb) ||
	    rtt_param(body, &rtt, &eb)) {
		api_bad_request(req, &eb);
		goto out;
	}
	if (!endpoint_valid(endpoint)) {
		http_reply_error(req, 400, "invalid", "field \"endpoint\" must be \"ip:port\"",
		                 "Send the address peers can reach this host at, as \"203.0.113.5:7070\" or \"[2001:db8::5]:7070\".");
		goto out;
	}
	char smb[24], ssamples[24], sbw[40];
	snprintf(smb, sizeof smb, "%lld", mb_done);
	snprintf(ssamples, sizeof ssamples, "%lld", samples);
	snprintf(sbw, sizeof sbw, "%.17g", bandwidth);
	const char *params[] = { hp, req->params[0], smb, ssamples, endpoint, sbw,
	                         can_aggregate ? "true" : "false", rtt };
	api_relay(req, &st_report, params);
	round_coord_wake();       /* maybe the last report the plan waits for */
out:
	free(rtt);
	json_decref(body);
}

/* Path parameter 1 as a version (an integer >= 0). */
static bool path_version(http_req *req, long long *out)
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

static const dbc_stmt st_plan = {
	"round_plan_get", "SELECT status, body FROM round_plan_get($1::bytea, $2, $3, $4)", 4
};

void api_round_plan(http_req *req)
{
	long long version;
	char hp[API_HASH_PARAM_LEN];
	if (!path_version(req, &version) || !api_bearer(req, hp))
		return;
	const char *h = http_query(req, "host_id");
	char *end = NULL;
	long long host = h && h[0] >= '1' && h[0] <= '9' && strlen(h) <= 18 ? strtoll(h, &end, 10) : 0;
	if (host <= 0 || *end) {
		http_reply_error(req, 400, "invalid", "query argument \"host_id\" must be a positive integer",
		                 "Ask for /v1/projects/<name>/rounds/<version>/plan?host_id=<your host id>.");
		return;
	}
	if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
		return;
	}
	char sv[24];
	snprintf(sv, sizeof sv, "%lld", version);
	const char *params[] = { hp, req->params[0], sv, h };
	PGresult *r = api_exec(req, &st_plan, params, NULL);
	if (!r)
		return;
	int status = PQntuples(r) == 1 ? atoi(PQgetvalue(r, 0, 0)) : 500;
	if (status == 204) {
		/* No plan yet: no body, and when to ask again. */
		char ra[16];
		snprintf(ra, sizeof ra, "%d", req->cfg->round_interval);
		http_reply_raw(req, 204, "", 0);
		http_add_header(req, "Retry-After", ra);
	} else if (status == 500) {
		http_reply_error(req, 500, "internal_error", "unexpected result from the database", NULL);
	} else {
		http_reply_raw(req, status, PQgetvalue(r, 0, 1), (size_t)PQgetlength(r, 0, 1));
	}
	PQclear(r);
}

static const dbc_stmt st_outcome = {
	"round_outcome",
	"SELECT status, body FROM round_outcome($1::bytea, $2, $3, $4, $5, $6::jsonb, $7)", 7
};

void api_round_outcome(http_req *req)
{
	long long version;
	char hp[API_HASH_PARAM_LEN];
	if (!path_version(req, &version) || !api_bearer(req, hp))
		return;
	json_t *body;
	if (!api_body(req, false, &body))
		return;
	long long host = 0;
	const char *status = NULL, *sha = NULL;
	char *included = NULL;
	cot_errbuf eb = { 0 };
	if (cot_json_int(body, "host_id", true, 1, (1LL << 62), &host, &eb) ||
	    cot_json_str(body, "status", true, 1, 16, &status, &eb)) {
		api_bad_request(req, &eb);
		goto out;
	}
	bool okay = strcmp(status, "ok") == 0;
	if (!okay && strcmp(status, "failed") != 0) {
		http_reply_error(req, 400, "invalid", "field \"status\" must be \"ok\" or \"failed\"", NULL);
		goto out;
	}
	if (cot_json_str(body, "params_sha256", okay, 64, 64, &sha, &eb)) {
		api_bad_request(req, &eb);
		goto out;
	}
	for (const char *p = sha; p && *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) {
			http_reply_error(req, 400, "invalid",
			                 "field \"params_sha256\" must be 64 lowercase hex digits", NULL);
			goto out;
		}
	json_t *inc = json_object_get(body, "included_hosts");
	json_t *canon = json_array();
	if (json_is_null(inc))
		inc = NULL;          /* absent: an empty list */
	bool good = canon && (!inc || (json_is_array(inc) && json_array_size(inc) <= INCLUDED_MAX));
	size_t i;
	json_t *v;
	json_array_foreach(good && inc ? inc : NULL, i, v) {
		if (!json_is_integer(v) || json_integer_value(v) <= 0) {
			good = false;
			break;
		}
		json_array_append(canon, v);
	}
	included = good ? json_dumps(canon, JSON_COMPACT) : NULL;
	json_decref(canon);
	if (!included) {
		http_reply_error(req, 400, "invalid",
		                 "field \"included_hosts\" must be an array of host ids", NULL);
		goto out;
	}
	char sv[24], sh[24];
	snprintf(sv, sizeof sv, "%lld", version);
	snprintf(sh, sizeof sh, "%lld", host);
	if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
		goto out;
	}
	const char *params[] = { hp, req->params[0], sv, sh, status, included, sha };
	api_relay(req, &st_outcome, params);
out:
	free(included);
	json_decref(body);
}

static const dbc_stmt st_grad_begin = {
	"round_gradient_begin",
	"SELECT status, body, project_id, attempt, param_count, gradient_sha256, checkpoint_sha256,"
	" config FROM round_gradient_begin($1::bytea, $2, $3, $4, $5)", 5
};
static const dbc_stmt st_grad_store = {
	"round_gradient_store",
	"SELECT status, body FROM round_gradient_store($1, $2, $3, $4, $5, $6, $7)", 7
};

/* A positive integer query argument (at most 18 digits), or 0. */
static long long query_pos(http_req *req, const char *name)
{
	const char *s = http_query(req, name);
	char *end = NULL;
	long long v = s && s[0] >= '1' && s[0] <= '9' && strlen(s) <= 18 ? strtoll(s, &end, 10) : 0;
	return v > 0 && !*end ? v : 0;
}

/* The round's averaged gradient (doc/api.md, "The server's step"): checked
 * by the database (token, plan membership, state, sample total), then by
 * length; the first upload is stepped here, synchronously (one step at a
 * time, round_step_compute), and recorded; later ones are compared by
 * sha256. */
void api_round_gradient(http_req *req)
{
	long long version;
	char hp[API_HASH_PARAM_LEN];
	if (!path_version(req, &version) || !api_bearer(req, hp))
		return;
	long long host = query_pos(req, "host_id"), samples = query_pos(req, "samples");
	if (!host || !samples) {
		http_reply_error(req, 400, "invalid",
		                 "query arguments \"host_id\" and \"samples\" must be positive integers",
		                 "POST /v1/projects/<name>/rounds/<version>/gradient?host_id=<id>&samples=<round_samples>.");
		return;
	}
	if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
		return;
	}
	char sv[24], sh[24], ss[24];
	snprintf(sv, sizeof sv, "%lld", version);
	snprintf(sh, sizeof sh, "%lld", host);
	snprintf(ss, sizeof ss, "%lld", samples);
	const char *params[] = { hp, req->params[0], sv, sh, ss };
	PGresult *r = api_exec(req, &st_grad_begin, params, NULL);
	if (!r)
		return;
	if (PQntuples(r) != 1) {
		http_reply_error(req, 500, "internal_error", "unexpected result from the database", NULL);
		goto out;
	}
	if (!PQgetisnull(r, 0, 0)) {
		http_reply_raw(req, atoi(PQgetvalue(r, 0, 0)), PQgetvalue(r, 0, 1),
		               (size_t)PQgetlength(r, 0, 1));
		goto out;
	}
	unsigned long long n = strtoull(PQgetvalue(r, 0, 4), NULL, 10);
	if (n == 0 || n > API_GRADIENT_MAX_BYTES / sizeof(float) || req->body_len != n * sizeof(float)) {
		char msg[160];
		snprintf(msg, sizeof msg, "the gradient must be exactly %llu bytes (%llu fp32 values), not %zu",
		         n * sizeof(float), n, req->body_len);
		http_reply_error(req, req->body_len > n * sizeof(float) ? 413 : 400,
		                 req->body_len > n * sizeof(float) ? "too_large" : "invalid", msg,
		                 "Send the round's averaged gradient as raw little-endian fp32, param_count values.");
		goto out;
	}
	char gsha[FS_SHA_HEX_LEN + 1];
	if (hash_sha256_hex(req->body, req->body_len, gsha)) {
		http_reply_error(req, 500, "internal_error", "could not hash the gradient", NULL);
		goto out;
	}
	const char *have = PQgetisnull(r, 0, 5) ? NULL : PQgetvalue(r, 0, 5);
	char ckpt[FS_SHA_HEX_LEN + 1] = "", psha[FS_SHA_HEX_LEN + 1] = "", ssize[24] = "0";
	if (!have) {
		/* The first upload: keep the bytes (a transient file, not in
		 * `file`) and take the step. */
		uint64_t size = 0;
		float *grad = malloc(req->body_len);
		if (!grad) {
			http_reply_error(req, 500, "internal_error", "out of memory for the gradient", "Try again later.");
			goto out;
		}
		memcpy(grad, req->body, req->body_len);   /* aligned for the kernels */
		for (size_t i = 0; i < n; i++)
			if (!isfinite(grad[i])) {
				char msg[96];
				snprintf(msg, sizeof msg, "value %zu of the gradient is not finite", i);
				http_reply_error(req, 400, "invalid", msg, "Every value of the gradient must be finite.");
				free(grad);
				goto out;
			}
		cot_errbuf eb = { 0 };
		cot_err rc = fs_put_buffer(req->cfg->files_dir, req->body, req->body_len, gsha, NULL, &eb);
		if (!rc)
			rc = round_step_compute(req->cfg->files_dir, PQgetvalue(r, 0, 6), PQgetvalue(r, 0, 7),
			                        version, grad, (size_t)n, ckpt, &size, psha, &eb);
		free(grad);
		if (rc) {
			log_error("round %lld of project %s: the server's step failed: %s", version,
			          req->params[0], eb.msg);
			http_reply_error(req, 500, "internal_error", "could not compute the next version", eb.msg);
			goto out;
		}
		snprintf(ssize, sizeof ssize, "%llu", (unsigned long long)size);
	} else {
		/* Already stepped: only the bytes need comparing; the store
		 * function answers 200 for the same, 409 for others. */
		snprintf(ckpt, sizeof ckpt, "%s", have);
		snprintf(psha, sizeof psha, "%s", have);
	}
	const char *sparams[] = { PQgetvalue(r, 0, 2), sv, PQgetvalue(r, 0, 3), gsha, ckpt, ssize, psha };
	api_relay(req, &st_grad_store, sparams);
out:
	PQclear(r);
}
