/* cotrain tests: the server's own step of a round on the real cotrain-server
 * and PostgreSQL: a peer uploads the averaged gradient, the server computes
 * version v+1 from checkpoint v with the project's optimizer, bit-identical
 * to the kernels run here on the same inputs; the round commits once every
 * peer reported, accepting the peer whose hash matches and telling the other
 * to reload; bad uploads (length, sample total, non-member, a second
 * different gradient, a non-finite one) are refused and change nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/checkpoint.h"
#include "kernels/optimizer.h"
#include "shared/filestore.h"
#include "shared/hash.h"
#include "tests/tap.h"
#include "tests/test_server_harness.h"

/* The model of tests/test_rounds.c: 3064 parameters. */
#define MODEL "{\"n_layer\": 1, \"n_shared\": 1, \"n_head\": 2, \"d_model\": 8, \"d_ff\": 32, \"seq_len\": 16, \"vocab\": 256}"
#define OPTIMIZER "{\"type\": \"adamw\", \"lr\": 0.01, \"beta1\": 0.8, \"beta2\": 0.99, \"eps\": 1e-7, \"weight_decay\": 0.05, \"clip_norm\": 0.5, \"schedule\": {\"warmup_steps\": 3, \"total_steps\": 100, \"decay\": \"linear\", \"min_lr_ratio\": 0.2}}"
#define PARAMS 3064
#define SEED 7

typedef struct {
	char key[64], token[64];
	long long id, wu;
} host;

static host A, B, E;

static char *fingerprint(void)
{
	char *base = th_db_fingerprint();
	PGresult *r = PQexec(th_db(),
		"SELECT (SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') FROM round t)"
		" || (SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') FROM round_member t)"
		" || (SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') FROM model_version t)"
		" || (SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') FROM file t)");
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		bail_out("fingerprint: %s", PQerrorMessage(th_db()));
	size_t n = strlen(base) + (size_t)PQgetlength(r, 0, 0) + 2;
	char *out = malloc(n);
	snprintf(out, n, "%s%s", base, PQgetvalue(r, 0, 0));
	PQclear(r);
	free(base);
	return out;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
	th_resp *r = arg;
	char *b = realloc(r->body, r->len + size * n + 1);
	if (!b)
		return 0;
	memcpy(b + r->len, p, size * n);
	r->body = b;
	r->len += size * n;
	r->body[r->len] = '\0';
	return size * n;
}

/* POST len raw bytes (th_http sends C strings only). */
static th_resp post_raw(const char *path, const char *token, const void *data, size_t len)
{
	th_resp r;
	memset(&r, 0, sizeof r);
	CURL *c = curl_easy_init();
	char url[512], auth[128];
	snprintf(url, sizeof url, "%s%s", th_url(), path);
	snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
	struct curl_slist *h = curl_slist_append(NULL, auth);
	h = curl_slist_append(h, "Content-Type: application/octet-stream");
	h = curl_slist_append(h, "Expect:");
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_POST, 1L);
	curl_easy_setopt(c, CURLOPT_POSTFIELDS, data);
	curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
	if (curl_easy_perform(c) != CURLE_OK)
		bail_out("POST %s failed", path);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
	char *ct = NULL;
	curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
	snprintf(r.content_type, sizeof r.content_type, "%s", ct ? ct : "");
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	if (!r.body)
		r.body = strdup("");
	r.json = json_loadb(r.body, r.len, 0, NULL);
	return r;
}

static th_resp call(const char *method, const char *path, const char *bearer, const char *body,
                    long status, const char *what)
{
	th_resp r;
	if (!th_http(NULL, method, path, bearer, body, NULL, &r))
		bail_out("%s: request failed", what);
	if (!is_int(r.status, status, "%s: %ld", what, status))
		diag("  body: %s", r.body);
	return r;
}

static void upload_refused(const char *path, const char *token, const void *data, size_t len,
                           long status, const char *code, const char *what)
{
	char *before = fingerprint();
	th_resp r = post_raw(path, token, data, len);
	th_is_error(&r, status, code, what);
	char *after = fingerprint();
	is_str(after, before, "%s: database unchanged", what);
	free(after);
	free(before);
	th_resp_free(&r);
}

/* Store the version-0 checkpoint of the test model and point the project at
 * it; its path in the store goes to path. */
static void seed_checkpoint(long long pid, char *path, size_t len)
{
	kern_config c = { .n_layer = 1, .n_shared = 1, .n_head = 2, .d_model = 8, .d_ff = 32,
	                  .seq_len = 16, .vocab = 256 };
	kern_model *m = NULL;
	cot_errbuf eb = { "", "" };
	char tmp[512], store[512], sha[FS_SHA_HEX_LEN + 1];
	uint64_t size;
	snprintf(tmp, sizeof tmp, "%s/ckpt0.safetensors", th_data_dir());
	snprintf(store, sizeof store, "%s/files", th_data_dir());
	if (kern_model_create(&c, 0, &m, &eb))
		bail_out("model: %s", eb.msg);
	kern_model_init(m, SEED);
	if (ckpt_save(m, tmp, &eb) || fs_put_file(store, tmp, sha, &size, &eb) ||
	    fs_path(store, sha, path, len, &eb))
		bail_out("checkpoint 0: %s", eb.msg);
	kern_model_free(m);
	unlink(tmp);
	th_sql("INSERT INTO file (sha256, size, kind) VALUES ('%s', %llu, 'checkpoint')", sha,
	       (unsigned long long)size);
	th_sql("UPDATE model_version SET checkpoint_sha256 = '%s' WHERE project_id = %lld AND version = 0",
	       sha, pid);
}

/* Two hosts fill round 0 (16 samples each), report, and get the plan. */
static void plan_round(void)
{
	host *hs[] = { &A, &B };
	char path[128], body[256];
	for (int i = 0; i < 2; i++) {
		snprintf(body, sizeof body, "{\"host_id\": %lld}", hs[i]->id);
		th_resp r = call("POST", "/v1/projects/s1/work", hs[i]->token, body, 200, "work");
		hs[i]->wu = th_json_int(&r, "work_unit_id");
		th_resp_free(&r);
		snprintf(path, sizeof path, "/v1/workunits/%lld/heartbeat", hs[i]->wu);
		r = call("POST", path, hs[i]->token, "{\"mb_done\": 4, \"samples_per_sec\": 1e6}", 200, "heartbeat");
		th_resp_free(&r);
	}
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof path, "/v1/workunits/%lld/report", hs[i]->wu);
		snprintf(body, sizeof body,
		         "{\"mb_done\": 4, \"samples\": 16, \"endpoint\": \"192.0.2.%d:7070\","
		         " \"bandwidth\": 1e6, \"can_aggregate\": true, \"rtt\": {}}", i + 1);
		th_resp r = call("POST", path, hs[i]->token, body, 200, "report");
		th_resp_free(&r);
	}
	snprintf(path, sizeof path, "/v1/projects/s1/rounds/0/plan?host_id=%lld", A.id);
	time_t t0 = time(NULL);
	long st = 0;
	do {
		th_resp r;
		if (!th_http(NULL, "GET", path, A.token, NULL, NULL, &r))
			bail_out("plan");
		st = r.status;
		if (st == 200)
			is_int(th_json_int(&r, "round_samples"), 32, "the plan: 32 samples in the round");
		th_resp_free(&r);
		if (st == 204)
			usleep(200000);
	} while (st == 204 && time(NULL) - t0 < 30);
	if (!is_int(st, 200, "the round is planned"))
		bail_out("no plan");
}

/* v+1 computed here with the kernels: checkpoint 0, grads = g, one AdamW
 * step with the project's settings. */
static kern_model *local_step(const char *ckpt0, const float *g)
{
	kern_model *m = NULL;
	cot_errbuf eb = { "", "" };
	if (ckpt_load_new(ckpt0, 0, &m, &eb))
		bail_out("load checkpoint 0: %s", eb.msg);
	kern_opt_config o;
	kern_opt_default(&o, KERN_OPT_ADAMW);
	o.lr = 0.01f;
	o.beta1 = 0.8f;
	o.beta2 = 0.99f;
	o.eps = 1e-7f;
	o.weight_decay = 0.05f;
	o.clip_norm = 0.5f;
	o.warmup_steps = 3;
	o.total_steps = 100;
	o.decay = KERN_DECAY_LINEAR;
	o.min_lr_ratio = 0.2f;
	memcpy(m->grads, g, PARAMS * sizeof *g);
	if (kern_opt_step(m, &o, NULL, &eb))
		bail_out("local step: %s", eb.msg);
	return m;
}

static void outcome(host *h, const char *sha, th_resp *out)
{
	char body[512];
	snprintf(body, sizeof body, "{\"host_id\": %lld, \"status\": \"ok\", \"included_hosts\": [%lld, %lld], \"params_sha256\": \"%s\"}",
	         h->id, A.id, B.id, sha);
	*out = call("POST", "/v1/projects/s1/rounds/0/outcome", h->token, body, 200, "outcome");
}

int main(void)
{
	const char *args[] = { "--round-interval", "1", "--round-report-timeout", "3", NULL };
	plan_lazy();
	th_start(args);
	long long pid = th_seed_project("s1", 600, 1e6, 4, 16, 4, 100000);
	th_sql("UPDATE project SET target_batch = 32, config = '{\"model\": " MODEL ", \"optimizer\": " OPTIMIZER "}' WHERE id = %lld", pid);
	host *hs[] = { &A, &B, &E };
	for (int i = 0; i < 3; i++)
		th_new_host("step", 8 * 4e6 / 600 + 1e-3, hs[i]->key, &hs[i]->id, hs[i]->token);
	char ckpt0[1024];
	seed_checkpoint(pid, ckpt0, sizeof ckpt0);
	plan_round();

	/* The mean gradient; big enough that clipping applies. */
	float *g = malloc((PARAMS + 1) * sizeof *g);
	for (int i = 0; i <= PARAMS; i++)
		g[i] = 0.01f * sinf(0.37f * (float)i) + 0.002f;
	char path[256];
	snprintf(path, sizeof path, "/v1/projects/s1/rounds/0/gradient?host_id=%lld&samples=32", A.id);

	/* Refusals before any upload. */
	upload_refused(path, A.token, g, (PARAMS - 1) * sizeof *g, 400, "invalid", "a short gradient");
	upload_refused(path, A.token, g, (PARAMS + 1) * sizeof *g, 413, "too_large", "a long gradient");
	char p2[256];
	snprintf(p2, sizeof p2, "/v1/projects/s1/rounds/0/gradient?host_id=%lld&samples=31", A.id);
	upload_refused(p2, A.token, g, PARAMS * sizeof *g, 400, "invalid", "a wrong sample total");
	snprintf(p2, sizeof p2, "/v1/projects/s1/rounds/0/gradient?host_id=%lld", A.id);
	upload_refused(p2, A.token, g, PARAMS * sizeof *g, 400, "invalid", "no sample total");
	snprintf(p2, sizeof p2, "/v1/projects/s1/rounds/0/gradient?host_id=%lld&samples=32", E.id);
	upload_refused(p2, E.token, g, PARAMS * sizeof *g, 409, "conflict", "a host not in the plan");
	upload_refused(path, B.token, g, PARAMS * sizeof *g, 403, "forbidden", "another host's token");
	upload_refused("/v1/projects/s1/rounds/1/gradient?host_id=1&samples=32", A.token, g,
	               PARAMS * sizeof *g, 404, "not_found", "an unknown round");
	float keep = g[5];
	g[5] = NAN;
	upload_refused(path, A.token, g, PARAMS * sizeof *g, 400, "invalid", "a gradient that is not finite");
	g[5] = keep;

	/* The upload and the server's step. */
	th_resp r = post_raw(path, A.token, g, PARAMS * sizeof *g);
	if (!is_int(r.status, 200, "the gradient is accepted"))
		diag("  body: %s", r.body);
	char server_params[65] = "", server_ckpt[65] = "";
	snprintf(server_params, sizeof server_params, "%s", th_json_str(&r, "params_sha256") ? th_json_str(&r, "params_sha256") : "");
	snprintf(server_ckpt, sizeof server_ckpt, "%s", th_json_str(&r, "checkpoint_sha256") ? th_json_str(&r, "checkpoint_sha256") : "");
	is_str(th_json_str(&r, "round.state"), "averaging", "no outcome yet: still averaging");
	char gsha[65];
	hash_sha256_hex(g, PARAMS * sizeof *g, gsha);
	is_str(th_json_str(&r, "gradient_sha256"), gsha, "the answer names the gradient by its sha256");
	th_resp_free(&r);

	kern_model *mine = local_step(ckpt0, g);
	char mine_sha[65];
	hash_sha256_hex(mine->params, PARAMS * sizeof(float), mine_sha);
	is_str(server_params, mine_sha, "params_sha256 is the sha256 of the raw fp32 parameters computed here");
	char store[512], cpath[1024];
	snprintf(store, sizeof store, "%s/files", th_data_dir());
	cot_errbuf eb = { "", "" };
	kern_model *theirs = NULL;
	ok(!fs_path(store, server_ckpt, cpath, sizeof cpath, &eb) && !ckpt_load_new(cpath, 0, &theirs, &eb),
	   "the server's checkpoint 1 is in the store and loads (%s)", eb.msg);
	ok(theirs && memcmp(theirs->params, mine->params, PARAMS * sizeof(float)) == 0,
	   "its parameters are bit-identical to the kernels' step here");
	ok(theirs && memcmp(theirs->m, mine->m, PARAMS * sizeof(float)) == 0 &&
	   memcmp(theirs->v, mine->v, PARAMS * sizeof(float)) == 0, "and so are the optimizer's moments");
	is_int(theirs ? theirs->step : -1, 1, "checkpoint 1 has taken one step");
	kern_model *before = NULL;
	ok(!ckpt_load_new(ckpt0, 0, &before, &eb) &&
	   memcmp(before->params, mine->params, PARAMS * sizeof(float)) != 0,
	   "the step moved the parameters");
	kern_model_free(before);
	kern_model_free(theirs);
	is_int(th_sql_int("SELECT count(*) FROM file WHERE sha256 = '%s' AND kind = 'checkpoint'", server_ckpt), 1,
	       "checkpoint 1 is indexed in the store");
	is_int(th_sql_int("SELECT count(*) FROM file WHERE sha256 = '%s'", gsha), 0,
	       "the gradient is not indexed (transient)");
	ok(!fs_verify(store, gsha, NULL, &eb), "the gradient's bytes are kept in the store");

	r = post_raw(path, B.token, g, PARAMS * sizeof *g);
	ok(r.status == 403, "B cannot upload with host_id of A");
	th_resp_free(&r);
	snprintf(p2, sizeof p2, "/v1/projects/s1/rounds/0/gradient?host_id=%lld&samples=32", B.id);
	r = post_raw(p2, B.token, g, PARAMS * sizeof *g);
	is_int(r.status, 200, "the same gradient again (from B): 200");
	is_str(th_json_str(&r, "params_sha256"), server_params, "answered as the first");
	th_resp_free(&r);
	g[17] += 1e-3f;
	upload_refused(p2, B.token, g, PARAMS * sizeof *g, 409, "conflict", "a different second gradient");
	g[17] -= 1e-3f;

	/* Outcomes: A holds the server's parameters, B something else. */
	const char *wrong = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
	outcome(&A, mine_sha, &r);
	is_str(th_json_str(&r, "round.state"), "averaging", "one peer of two reported: averaging");
	ok(json_is_true(json_object_get(r.json, "accepted")), "A's hash matches the server's: accepted");
	th_resp_free(&r);
	outcome(&B, wrong, &r);
	is_str(th_json_str(&r, "round.state"), "committed", "every peer reported and v+1 exists: committed");
	ok(json_is_false(json_object_get(r.json, "accepted")), "B's hash differs: not accepted");
	is_str(th_json_str(&r, "reload.checkpoint_sha256"), server_ckpt, "B is told to reload checkpoint 1");
	is_int(th_json_int(&r, "reload.version"), 1, "... of version 1");
	char url[128];
	snprintf(url, sizeof url, "/files/%s", server_ckpt);
	is_str(th_json_str(&r, "reload.url"), url, "... at its URL");
	th_resp_free(&r);
	outcome(&A, mine_sha, &r);
	ok(json_is_true(json_object_get(r.json, "accepted")) && !json_object_get(r.json, "reload"),
	   "A's outcome again: accepted, nothing to reload");
	th_resp_free(&r);
	is_int(th_sql_int("SELECT count(*) FROM round_member WHERE project_id = %lld AND version = 0 AND host_id = %lld AND accepted", pid, A.id),
	       1, "A is marked accepted");
	is_int(th_sql_int("SELECT count(*) FROM round_member WHERE project_id = %lld AND version = 0 AND host_id = %lld AND NOT accepted", pid, B.id),
	       1, "B is marked not accepted");
	is_int(th_sql_int("SELECT current_version FROM project WHERE id = %lld", pid), 1, "the project is at version 1");
	is_int(th_sql_int("SELECT count(*) FROM model_version WHERE project_id = %lld AND version = 1 AND checkpoint_sha256 = '%s'", pid, server_ckpt),
	       1, "model version 1 has the server's checkpoint");
	is_int(th_sql_int("SELECT count(*) FROM round WHERE project_id = %lld AND version = 1 AND state = 'open'", pid),
	       1, "round 1 is open");
	r = call("GET", url, NULL, NULL, 200, "checkpoint 1 is served");
	th_resp_free(&r);
	char body[64];
	snprintf(body, sizeof body, "{\"host_id\": %lld}", E.id);
	r = call("POST", "/v1/projects/s1/work", E.token, body, 200, "work after the commit");
	is_int(th_json_int(&r, "version"), 1, "new work is for version 1");
	th_resp_free(&r);
	upload_refused(path, A.token, g, PARAMS * sizeof *g, 409, "conflict", "a gradient after the commit");

	kern_model_free(mine);
	free(g);
	ok(th_stop_server(), "the server stops cleanly");
	return exit_status();
}
