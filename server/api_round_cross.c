/* cotrain-server: the routes of a round that averages across groups
 * between the peers (db/functions/round_cross.sql; doc/api.md, "Rounds";
 * doc/averaging.md, "Across groups"): the server takes from each member
 * the sha256 of the round's mean its group holds, and from the one peer it
 * asks (round_checkpoint_uploader) the checkpoint of v+1, which it checks
 * against the parameters a strict majority of the included peers hold.  No
 * gradient reaches the server. */
#include "server/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/checkpoint.h"
#include "kernels/model.h"
#include "server/apiutil.h"
#include "server/metrics.h"
#include "shared/common/filestore.h"
#include "shared/common/hash.h"
#include "shared/common/log.h"

static const dbc_stmt st_hash_begin = { "round_mean_hash_begin",
	                                "SELECT status, body, project_id, attempt, group_id"
	                                " FROM round_group_sum_begin($1::bytea, $2, $3, $4, $5, $6::jsonb,"
	                                " true)",
	                                6 };
static const dbc_stmt st_hash_store = { "round_mean_hash_store",
	                                "SELECT status, body"
	                                " FROM round_group_sum_store($1, $2, $3, $4, $5, $6, $7::jsonb, $8)",
	                                8 };
static const dbc_stmt st_hash_settle = { "round_mean_hash_settle",
	                                 "SELECT round_group_sum_settle($1, $2, $3)", 3 };
static const dbc_stmt st_ckpt_begin = { "round_checkpoint_begin",
	                                "SELECT status, body, project_id, attempt, param_count,"
	                                " params_sha256, moments_sha256"
	                                " FROM round_checkpoint_begin($1::bytea, $2, $3, $4)",
	                                4 };
static const dbc_stmt st_ckpt_store = { "round_checkpoint_store",
	                                "SELECT round_checkpoint_store($1, $2, $3, $4, $5, $6, $7)", 7 };
static const dbc_stmt st_ckpt_refuse = { "round_checkpoint_refuse",
	                                 "SELECT round_checkpoint_refuse($1, $2, $3)", 3 };

static api_news hashes_seen = API_NEWS_INIT;

/* Whom a mean hash's answer (JSON text) for project/version wakes: the
 * outcome polls once every group's hash is in and they agreed (the answer
 * carries the mean's "gradient_sha256"; an uploader may be due),
 * every held request when the round is no longer averaging (it failed) or
 * the answer is unreadable, nobody while hashes are still to come; and
 * each of these once a round attempt (api_is_news), not at every later
 * member's post that sees it (a thousand members' posts each waking a
 * thousand held outcomes were a million looks a round). */
static unsigned hashes_wake(const char *project, const char *version, const char *body, size_t len)
{
	json_t *j = json_loadb(body, len, 0, NULL);
	const json_t *round = json_object_get(j, "round");
	const char *st = json_string_value(json_object_get(round, "state"));
	bool agreed = json_is_string(json_object_get(j, "gradient_sha256"));
	unsigned wake = !j || (st && strcmp(st, "averaging") != 0) ? HTTP_WAKE_ALL
	                : agreed                                   ? HTTP_WAKE(HTTP_HOLD_OUTCOME)
	                                                           : 0;
	if (wake && j) {
		char key[160];
		snprintf(key, sizeof key, "%s:%s:%lld:%s", project, version,
		         (long long)json_integer_value(json_object_get(round, "attempt")), st ? st : "");
		if (!api_is_news(&hashes_seen, key))
			wake = 0;
	}
	json_decref(j);
	return wake;
}

/* POST .../rounds/{v}/mean_hash?host_id=N&samples=S&included=7,9&sha256=H,
 * no body: the hash of the round's mean that the host's group holds after
 * averaging across groups, over the included hosts (checked as a group
 * sum's, round_group_sum_begin); the first per group is kept, and once
 * every group posted, their hashes must agree (round_mean_agree). */
void api_round_mean_hash(http_req *req)
{
	long long version;
	char hp[API_HASH_PARAM_LEN];
	char *included = NULL;
	PGresult *r = NULL;
	if (!rounds_path_version(req, &version) || !api_bearer(req, hp))
		return;
	long long host = rounds_query_pos(req, "host_id"), samples = rounds_query_pos(req, "samples");
	const char *sha = http_query(req, "sha256");
	if (!host || !samples || !sha || !hash_is_sha256_hex(sha)) {
		http_reply_error(req, 400, "invalid",
		                 "query arguments \"host_id\" and \"samples\" must be positive integers and "
		                 "\"sha256\" 64 lowercase hex digits",
		                 "POST /v1/projects/<name>/rounds/<version>/"
		                 "mean_hash?host_id=<id>&samples=<S>&included=<ids>&sha256=<hash>.");
		return;
	}
	if (req->body_len > 0) {
		http_reply_error(req, 400, "invalid", "a mean's hash takes no body",
		                 "The server takes no gradient: send the hash only.");
		return;
	}
	if (!rounds_included_param(req, &included))
		return;
	rounds_member_args a;
	r = rounds_member_begin(req, &st_hash_begin, hp, version, host, samples, included, &a);
	if (!r)
		goto out;
	const char *sv = a.version, *sh = a.host, *ss = a.samples;
	char project_id[24], attempt[16], group[16];
	snprintf(project_id, sizeof project_id, "%s", PQgetvalue(r, 0, 2));
	snprintf(attempt, sizeof attempt, "%s", PQgetvalue(r, 0, 3));
	snprintf(group, sizeof group, "%s", PQgetvalue(r, 0, 4));
	PQclear(r);
	const char *sparams[] = { project_id, sv, attempt, group, sh, ss, included, sha };
	r = api_exec(req, &st_hash_store, sparams, NULL);
	if (!r)
		goto out;
	if (PQntuples(r) != 1) {
		http_reply_error(req, 500, "internal_error", "unexpected result from the database", NULL);
		goto out;
	}
	if (strcmp(PQgetvalue(r, 0, 0), "200") == 0) {
		/* Every group's hash may be in now: their agreement, in a
		 * transaction of its own (round_group_sum_settle says why), and
		 * then the answer as the round is. */
		const char *gparams[] = { project_id, sv, group };
		PGresult *g = api_exec(req, &st_hash_settle, gparams, NULL);
		if (!g)
			goto out;
		if (PQntuples(g) == 1 && !PQgetisnull(g, 0, 0)) {
			PQclear(r);
			r = g;
		} else {
			PQclear(g);
		}
	}
	/* (r is the store's answer, or the settle's: status, body or the body alone) */
	int nf = PQnfields(r);
	const char *abody = PQgetvalue(r, 0, nf - 1);
	size_t alen = (size_t)PQgetlength(r, 0, nf - 1);
	http_reply_raw(req, nf == 1 ? 200 : atoi(PQgetvalue(r, 0, 0)), abody, alen);
	/* The last group's hash agrees the mean (an uploader may be due) or
	 * failed the round: the long polls look again. */
	unsigned wake = hashes_wake(req->params[0], sv, abody, alen);
	if (wake)
		http_wake(wake);
out:
	PQclear(r);
	free(included);
}

/* Check the checkpoint just stored as sha: it loads (every field checked,
 * kernels/checkpoint.h), has n parameters, has taken version + 1 steps, its
 * parameters hash to params and, when moments is not "", its optimizer
 * moments (m, then v) to moments.  COT_ERR_INVALID with why otherwise. */
static cot_err check_checkpoint(const char *store_dir, const char *sha, long long version, size_t n,
                                const char *params, const char *moments, cot_errbuf *eb)
{
	char path[4300];
	cot_err rc = fs_path(store_dir, sha, path, sizeof path, eb);
	if (rc)
		return rc;
	kern_model *m = NULL;
	if ((rc = ckpt_load_new(path, 0, &m, eb)))
		return cot_seterr(eb, COT_ERR_INVALID, "the checkpoint does not load: %s", eb->msg);
	char got[FS_SHA_HEX_LEN + 1];
	if (m->n_params != n)
		rc = cot_seterr(eb, COT_ERR_INVALID, "the checkpoint has %zu parameters, the round %zu",
		                m->n_params, n);
	else if (m->step != version + 1)
		rc = cot_seterr(eb, COT_ERR_INVALID, "the checkpoint has taken %ld steps, not %lld", m->step,
		                version + 1);
	else if (hash_sha256_hex(m->params, n * sizeof *m->params, got))
		rc = cot_seterr(eb, COT_ERR_INTERNAL, "could not hash the parameters");
	else if (strcmp(got, params) != 0)
		rc = cot_seterr(eb, COT_ERR_INVALID,
		                "the checkpoint's parameters hash to %s, not to the %s the peers hold", got,
		                params);
	else if (moments[0] && hash_sha256_hex2(m->m, n * sizeof *m->m, m->v, n * sizeof *m->v, got))
		rc = cot_seterr(eb, COT_ERR_INTERNAL, "could not hash the moments");
	else if (moments[0] && strcmp(got, moments) != 0)
		rc = cot_seterr(eb, COT_ERR_INVALID,
		                "the checkpoint's optimizer moments hash to %s, not to the %s the peers hold",
		                got, moments);
	kern_model_free(m);
	return rc;
}

/* POST .../rounds/{v}/checkpoint?host_id=N, body: the checkpoint of v+1
 * (kernels/checkpoint.h) from the host the server asked for it.  Checked by
 * the database before the body is read (the host must be the uploader;
 * the body at most 16 bytes a parameter and 1 MiB), then whole; kept in
 * the file store and committed as the round's v+1 (round_checkpoint_store),
 * answering as the host's outcome does. */
void api_round_checkpoint(http_req *req)
{
	long long version;
	char hp[API_HASH_PARAM_LEN];
	PGresult *r = NULL;
	if (!rounds_path_version(req, &version) || !api_bearer(req, hp))
		return;
	long long host = rounds_query_pos(req, "host_id");
	if (!host) {
		http_reply_error(req, 400, "invalid", "query argument \"host_id\" must be a positive integer",
		                 "POST /v1/projects/<name>/rounds/<version>/checkpoint?host_id=<id>.");
		return;
	}
	if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
		return;
	}
	char sv[24], sh[24];
	snprintf(sv, sizeof sv, "%lld", version);
	snprintf(sh, sizeof sh, "%lld", host);
	const char *params[] = { hp, req->params[0], sv, sh };
	r = api_exec(req, &st_ckpt_begin, params, NULL);
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
	unsigned long long most = n * 16 + (1u << 20);
	if (most > API_CHECKPOINT_MAX_BYTES)
		most = API_CHECKPOINT_MAX_BYTES;
	if (req->early) {
		req->body_max = (size_t)most; /* a larger body is refused as it arrives */
		goto out;
	}
	if (req->body_len == 0 || req->body_len > most) {
		char msg[128];
		snprintf(msg, sizeof msg, "the checkpoint must be 1 to %llu bytes, not %zu", most,
		         req->body_len);
		http_reply_error(req, req->body_len ? 413 : 400, req->body_len ? "too_large" : "invalid", msg,
		                 "Send the checkpoint file of v+1 as it was saved.");
		goto out;
	}
	metrics_checkpoint_bytes(req->body_len);
	char project_id[24], attempt[16], want[FS_SHA_HEX_LEN + 1], moments[FS_SHA_HEX_LEN + 1];
	char sha[FS_SHA_HEX_LEN + 1];
	snprintf(project_id, sizeof project_id, "%s", PQgetvalue(r, 0, 2));
	snprintf(attempt, sizeof attempt, "%s", PQgetvalue(r, 0, 3));
	snprintf(want, sizeof want, "%s", PQgetvalue(r, 0, 5));
	snprintf(moments, sizeof moments, "%s", PQgetisnull(r, 0, 6) ? "" : PQgetvalue(r, 0, 6));
	cot_errbuf eb = { 0 };
	cot_err rc = fs_put_buffer(req->cfg->files_dir, req->body, req->body_len, sha, NULL, &eb);
	if (rc) {
		http_reply_error(req, 500, "internal_error", "could not store the checkpoint", eb.msg);
		goto out;
	}
	if ((rc = check_checkpoint(req->cfg->files_dir, sha, version, (size_t)n, want, moments, &eb))) {
		log_warn("round %lld of project %s: host %lld uploaded a checkpoint of v+1 that is refused: "
		         "%s",
		         version, req->params[0], host, eb.msg);
		if (rc == COT_ERR_INVALID) {
			/* The next peer of the majority is asked: its held outcome
			 * poll, and only it, is woken (another process's coordinator
			 * wakes it where it waits there, round_coord.c). */
			PQclear(r);
			const char *fp[] = { project_id, sv, sh };
			if (!(r = api_exec(req, &st_ckpt_refuse, fp, NULL)))
				return;
			if (PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
				http_wake_tag(HTTP_WAKE(HTTP_HOLD_OUTCOME),
				              strtoll(PQgetvalue(r, 0, 0), NULL, 10));
		}
		http_reply_error(req, rc == COT_ERR_INVALID ? 400 : 500,
		                 rc == COT_ERR_INVALID ? "invalid" : "internal_error",
		                 "the checkpoint is not the v+1 the peers hold", eb.msg);
		goto out;
	}
	char ssize[24];
	snprintf(ssize, sizeof ssize, "%zu", req->body_len);
	PQclear(r);
	const char *sparams[] = { project_id, sv, attempt, sh, sha, ssize, want };
	r = api_exec(req, &st_ckpt_store, sparams, NULL);
	if (!r)
		goto out;
	http_reply_raw(req, 200, PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0));
	log_info("round %lld of project %s: v+1 from host %lld, checkpoint %s, params %s", version,
	         req->params[0], host, sha, want);
	http_wake_held(); /* outcomes waiting for v+1; the commit it may have made */
out:
	PQclear(r);
}
