/* cotrain tests: averaging across groups and the server's own step, on the
 * real cotrain-server and PostgreSQL.  Four peers in two groups of two; the
 * first group uploads its sum over both members, the second over one of
 * them (the other dropped out of its all-reduce).  The server's mean
 * gradient must equal (float)((sum0 + sum1 in double) / total) bit for bit,
 * its v+1 a local kern_opt_step on that mean; the dropped host's unit goes
 * back to the pool and its outcome is answered with a reload; a long poll
 * for the mean (after=gradient) is held on a server with ONE worker thread
 * while the uploads go through, and answers when the mean exists; the
 * round commits once every included peer reported, and its loss is the
 * sample-weighted mean of the counted units' losses.  Conflicting sums are
 * refused and change nothing.  B and D are pure senders (they cannot
 * aggregate): D's 'failed' before its group's sum waits for the sum, which
 * leaves D out, and fails nothing; in a first attempt B's did the same, but
 * its group's sum included B, which failed that attempt. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/checkpoint.h"
#include "kernels/optimizer.h"
#include "shared/common/filestore.h"
#include "shared/common/hash.h"
#include "tests/tap.h"
#include "tests/test_server_harness.h"

#define OPTIMIZER \
	"{\"type\": \"adamw\", \"lr\": 0.01, \"beta1\": 0.8, \"beta2\": 0.99, \"eps\": 1e-7, " \
	"\"weight_decay\": 0.05, \"clip_norm\": 0.5, \"schedule\": {\"warmup_steps\": 3, \"total_steps\": " \
	"100, \"decay\": \"linear\", \"min_lr_ratio\": 0.2}}"
#define SEED 7

static th_host A, B, C, D, E;

/* Store the version-0 checkpoint of the test model and point the project at
 * it; its path in the store goes to path. */
static void seed_checkpoint(long long pid, char *path, size_t len)
{
	kern_config c = {
		.n_layer = 1, .n_shared = 1, .n_head = 2, .d_model = 8, .d_ff = 32, .seq_len = 16, .vocab = 256
	};
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
	memcpy(m->grads, g, TH_PARAMS * sizeof *g);
	if (kern_opt_step(m, &o, NULL, &eb))
		bail_out("local step: %s", eb.msg);
	return m;
}

/* Report h's unit: mb_done microbatches, its loss, rtt to the hosts in
 * near (1 ms) and far (100 ms). */
static void report(th_host *h, long long mb_done, double loss, th_host *near, th_host *f1, th_host *f2)
{
	char path[64], body[512];
	snprintf(path, sizeof path, "/v1/workunits/%lld/report", h->wu);
	snprintf(body, sizeof body,
	         "{\"mb_done\": %lld, \"samples\": %lld, \"endpoint\": \"192.0.2.%lld:7070\","
	         " \"bandwidth\": 1e6, \"can_aggregate\": %s, \"loss\": %.17g,"
	         " \"rtt\": {\"%lld\": 1, \"%lld\": 100, \"%lld\": 100}}",
	         mb_done, 4 * mb_done, h->id % 250 + 1, h == &B || h == &D ? "false" : "true", loss, near->id,
	         f1->id, f2->id);
	th_resp r = th_call("POST", path, h->token, body, 200, "report");
	th_resp_free(&r);
}

/* Round 0 of s1: A 4 (in two units of 2, held at once, as a client with
 * two workers does), B 2, C 4, D 4 microbatches of 4 samples (the target
 * is 56); A and B close to each other, C and D too. */
static void fill_and_plan(void)
{
	th_host A2 = A;
	th_host *hs[] = { &A, &A2, &B, &C, &D };
	long long done[] = { 2, 2, 2, 4, 4 };
	/* The units are handed out for a larger target (each host takes 8
	 * microbatches, its speed's worth), which is then lowered to 56: the
	 * units hold more than the round needs and it closes on a heartbeat. */
	th_sql("UPDATE project SET target_batch = 1024 WHERE name = 's1'");
	for (int i = 0; i < 5; i++)
		th_ask_work(hs[i], "s1", 0);
	/* A third unit of A, finished but never reported: the unit a daemon
	 * restarted mid-round finished before it lost its gradient. */
	th_host A3 = A;
	th_ask_work(&A3, "s1", 0);
	th_sql("UPDATE project SET target_batch = 56 WHERE name = 's1'");
	char fin[64];
	snprintf(fin, sizeof fin, "/v1/workunits/%lld/finish", A3.wu);
	th_resp rf = th_call("POST", fin, A3.token, "{}", 200, "A finishes a third unit");
	th_resp_free(&rf);
	/* At the speed the units were sized for (8 microbatches of 4 samples in
	 * the unit's 600 s), so that a second attempt hands out the same. */
	for (int i = 0; i < 5; i++) {
		th_resp r = th_heartbeat(hs[i], done[i], 32.0 / 600 + 1e-4);
		th_resp_free(&r);
	}
	report(&A, 2, 1.5, &B, &C, &D);
	report(&A2, 2, 2.5, &B, &C, &D);
	report(&B, 2, 4.0, &A, &C, &D);
	report(&C, 4, 3.0, &D, &A, &B);
	report(&D, 4, 100.0, &C, &A, &B);
	char path[128];
	snprintf(path, sizeof path, "/v1/projects/s1/rounds/0/plan?host_id=%lld&wait=30", A.id);
	th_resp r = th_call("GET", path, A.token, NULL, 200, "the plan (long poll)");
	is_int(th_json_int(&r, "round_samples"), 56, "the plan: 56 samples in the round");
	is_int(th_json_int(&r, "n_groups"), 2, "two groups");
	is_int(th_sql_int("SELECT samples FROM round_member WHERE version = 0 AND host_id = %lld", A.id), 16,
	       "A's two units count together: 16 samples in the plan");
	is_int(th_sql_int("SELECT count(*) FROM work_unit WHERE id = %lld AND state = 'expired' AND mb_done "
	                  "= 0",
	                  A3.wu),
	       1, "A's finished but unreported unit is in no gradient: dropped at the plan");
	is_int(th_sql_int("SELECT count(*) FROM mb_pool WHERE project_id = (SELECT project_id FROM work_unit"
	                  " WHERE id = %1$lld) AND lo <= (SELECT lo FROM work_unit WHERE id = %1$lld)"
	                  " AND hi >= (SELECT hi FROM work_unit WHERE id = %1$lld)",
	                  A3.wu),
	       1, "  and its whole range is back in the pool");
	long st = r.status;
	th_resp_free(&r);
	if (st != 200)
		bail_out("no plan");
}

static long long group_of(th_host *h)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/projects/s1/rounds/0/plan?host_id=%lld", h->id);
	th_resp r = th_call("GET", path, h->token, NULL, 200, "plan");
	long long g = th_json_int(&r, "group");
	ok(!json_object_get(r.json, "gradient"), "no mean gradient in the plan yet");
	th_resp_free(&r);
	return g;
}

static th_resp outcome(th_host *h, const char *status, const char *sha)
{
	char body[512];
	snprintf(body, sizeof body,
	         "{\"host_id\": %lld, \"status\": \"%s\", \"included_hosts\": [%lld, %lld, %lld], "
	         "\"params_sha256\": \"%s\"}",
	         h->id, status, A.id, B.id, C.id, sha);
	return th_call("POST", "/v1/projects/s1/rounds/0/outcome", h->token, body, 200, "outcome");
}

int main(void)
{
	const char *args[] = { "--round-interval", "1", "--round-report-timeout", "10", "--round-max-group",
		               "2", "--threads", "1",
		               /* the stage across groups through the server, which this
		                  test checks (not between the peers: test_rounds_xgroup) */
		               "--round-server-mean", NULL };
	plan_lazy();
	th_start(args);
	long long pid = th_seed_project("s1", 600, 1e6, 4, 16, 4, 100000);
	th_sql("UPDATE project SET target_batch = 56, config = '{\"model\": " TH_MODEL
	       ", \"optimizer\": " OPTIMIZER "}' WHERE id = %lld",
	       pid);
	th_host *hs[] = { &A, &B, &C, &D, &E };
	for (int i = 0; i < 5; i++)
		th_host_new(hs[i], "step", 8 * 4e6 / 600 + 1e-3);
	char ckpt0[1024];
	seed_checkpoint(pid, ckpt0, sizeof ckpt0);
	fill_and_plan();
	long long ga = group_of(&A), gb = group_of(&B), gc = group_of(&C), gd = group_of(&D);
	ok(ga == gb && gc == gd && ga != gc, "A and B average together, C and D together");
	is_int(th_sql_int("SELECT count(*) FROM round_member WHERE project_id = %lld AND version = 0 AND "
	                  "lo = hi AND host_id IN (%lld, %lld)",
	                  pid, B.id, D.id),
	       2, "B and D, which cannot aggregate, aggregate nothing (pure senders)");

	/* Attempt 1: B says failed before its group's sum is in (its
	 * aggregator may have dropped it and gone on): the round waits for the
	 * sum.  The sum includes B, so B's failure fails the round then. */
	char body[256];
	snprintf(body, sizeof body, "{\"host_id\": %lld, \"status\": \"failed\"}", B.id);
	th_resp r = th_call("POST", "/v1/projects/s1/rounds/0/outcome", B.token, body, 200,
	                    "B's failure before its group's sum");
	is_str(th_json_str(&r, "round.state"), "averaging",
	       "a pure sender's failure waits for its group's sum");
	th_resp_free(&r);
	float *z = calloc(TH_PARAMS, sizeof *z);
	char pz[256];
	snprintf(pz, sizeof pz,
	         "/v1/projects/s1/rounds/0/group_sum?host_id=%lld&samples=24&included=%lld,%lld", A.id, A.id,
	         B.id);
	r = th_post_raw(pz, A.token, z, TH_PARAMS * sizeof *z);
	is_int(r.status, 409, "a sum that includes the failed sender is answered 409");
	ok(r.body && strstr(r.body, "failed to average"), "  which says why (%s)", r.body ? r.body : "");
	th_resp_free(&r);
	free(z);
	PGresult *fr = PQexec(th_db(), "SELECT attempt, state, last_failure FROM round WHERE version = 0");
	char want[96];
	snprintf(want, sizeof want, "host %lld failed to average", B.id);
	ok(PQntuples(fr) == 1 && atoi(PQgetvalue(fr, 0, 0)) == 2 &&
	           strcmp(PQgetvalue(fr, 0, 1), "open") == 0 && strcmp(PQgetvalue(fr, 0, 2), want) == 0,
	   "the round failed and reopened as attempt 2 (%s)", PQntuples(fr) ? PQgetvalue(fr, 0, 2) : "");
	PQclear(fr);
	th_coverage_exact(pid, "after the failed attempt");

	/* Attempt 2, the same hosts and work. */
	fill_and_plan();
	ok(group_of(&A) == ga && group_of(&B) == gb && group_of(&C) == gc && group_of(&D) == gd,
	   "attempt 2 groups the hosts as attempt 1 did");

	/* D dropped out of its all-reduce and says failed before its group's
	 * sum is in: nothing fails yet. */
	snprintf(body, sizeof body, "{\"host_id\": %lld, \"status\": \"failed\"}", D.id);
	r = th_call("POST", "/v1/projects/s1/rounds/0/outcome", D.token, body, 200, "D's outcome");
	is_str(th_json_str(&r, "round.state"), "averaging", "D's failure waits for its group's sum");
	ok(!json_object_get(r.json, "accepted"), "  nothing accepted or refused before the server's step");
	th_resp_free(&r);

	/* The two groups' sums: group of A over A and B (24 samples), group of
	 * C over C alone (16 samples): D dropped out of its all-reduce. */
	float *s0 = malloc(TH_PARAMS * sizeof *s0), *s1 = malloc(TH_PARAMS * sizeof *s1);
	for (int i = 0; i < TH_PARAMS; i++) {
		s0[i] = 0.24f * sinf(0.37f * (float)i) + 0.05f;
		s1[i] = 0.16f * cosf(0.11f * (float)i) - 0.03f / (float)(i + 1);
	}
	char p0[256], p1[256], q[256];
	snprintf(p0, sizeof p0,
	         "/v1/projects/s1/rounds/0/group_sum?host_id=%lld&samples=24&included=%lld,%lld", A.id, A.id,
	         B.id);
	snprintf(p1, sizeof p1, "/v1/projects/s1/rounds/0/group_sum?host_id=%lld&samples=16&included=%lld",
	         C.id, C.id);

	char pp[160];
	snprintf(pp, sizeof pp, "/v1/projects/s1/rounds/0/plan?host_id=%lld&wait=30&after=gradient", B.id);
	th_bg *waiter = th_bg_get(pp, B.token); /* a long poll for the mean, sent */
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	double t_start = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;

	/* The first group's sum. */
	r = th_post_raw(p0, A.token, s0, TH_PARAMS * sizeof *s0);
	if (!is_int(r.status, 200, "group %lld's sum is kept", ga))
		diag("  body: %s", r.body);
	char s0sha[65];
	hash_sha256_hex(s0, TH_PARAMS * sizeof *s0, s0sha);
	is_str(th_json_str(&r, "group_sum_sha256"), s0sha, "named by its sha256");
	is_int(th_json_int(&r, "groups_in"), 1, "one group of two is in");
	is_int(th_json_int(&r, "n_groups"), 2, "of two");
	ok(!json_object_get(r.json, "gradient_sha256"), "no mean gradient yet");
	is_str(th_json_str(&r, "round.state"), "averaging", "the round is averaging");
	th_resp_free(&r);
	snprintf(q, sizeof q, "/v1/projects/s1/rounds/0/group_sum?host_id=%lld&samples=24&included=%lld,%lld",
	         B.id, A.id, B.id);
	r = th_post_raw(q, B.token, s0, TH_PARAMS * sizeof *s0);
	is_int(r.status, 200, "the same sum from B: 200");
	is_str(th_json_str(&r, "group_sum_sha256"), s0sha, "answered as the first");
	th_resp_free(&r);
	s0[17] += 1e-3f;
	th_raw_refused(q, B.token, s0, TH_PARAMS * sizeof *s0, 409, "conflict",
	               "a different sum of the same group");
	s0[17] -= 1e-3f;
	snprintf(q, sizeof q, "/v1/projects/s1/rounds/0/group_sum?host_id=%lld&samples=8&included=%lld", B.id,
	         B.id);
	th_raw_refused(q, B.token, s0, TH_PARAMS * sizeof *s0, 409, "conflict",
	               "the same group's sum over other hosts");
	snprintf(q, sizeof q, "/v1/projects/s1/rounds/0/group_sum?host_id=%lld&samples=16&included=%lld",
	         E.id, E.id);
	th_raw_refused(q, E.token, s1, TH_PARAMS * sizeof *s1, 409, "conflict", "a host not in the plan");
	ok(!th_bg_done(waiter), "the long poll for the mean is still held after the first group's sum");
	is_int(th_sql_int("SELECT count(*) FROM work_unit WHERE id = %lld AND mb_done = 4", D.wu), 1,
	       "D's samples still count before the last sum");

	/* The second group's sum completes the set: the mean and v+1. */
	r = th_post_raw(p1, C.token, s1, TH_PARAMS * sizeof *s1);
	clock_gettime(CLOCK_MONOTONIC, &ts);
	double t_done = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
	if (!is_int(r.status, 200, "group %lld's sum completes the round", gc))
		diag("  body: %s", r.body);
	is_int(th_json_int(&r, "groups_in"), 2, "both groups are in");
	char gsha[65] = "", psha[65] = "";
	snprintf(gsha, sizeof gsha, "%s",
	         th_json_str(&r, "gradient_sha256") ? th_json_str(&r, "gradient_sha256") : "");
	snprintf(psha, sizeof psha, "%s",
	         th_json_str(&r, "params_sha256") ? th_json_str(&r, "params_sha256") : "");
	ok(gsha[0] && psha[0], "the answer names the mean gradient and the parameters of v+1");
	th_resp_free(&r);

	th_resp pa = th_bg_join(waiter);
	is_int(pa.status, 200, "the long poll answers once the mean exists");
	ok(pa.seconds < 29 && pa.seconds >= t_done - t_start,
	   "it was held until then (%.2f s; the uploads took %.2f s), on a server with one worker thread",
	   pa.seconds, t_done - t_start);
	is_str(th_json_str(&pa, "gradient.sha256"), gsha, "its plan names the mean gradient");
	is_int(th_json_int(&pa, "gradient.samples"), 40, "over the 40 included samples");
	char url[128];
	snprintf(url, sizeof url, "/files/%s", gsha);
	is_str(th_json_str(&pa, "gradient.url"), url, "at its URL");
	is_str(th_json_str(&pa, "params_sha256"), psha, "and the server's parameter hash");
	th_resp_free(&pa);

	/* The mean, bit for bit, and v+1. */
	float *mean = malloc(TH_PARAMS * sizeof *mean);
	for (int i = 0; i < TH_PARAMS; i++)
		mean[i] = (float)(((double)s0[i] + (double)s1[i]) / 40.0);
	r = th_call("GET", url, NULL, NULL, 200, "the mean gradient is served");
	ok(r.len == TH_PARAMS * sizeof(float) && memcmp(r.body, mean, r.len) == 0,
	   "mean[i] = (float)((sum0[i] + sum1[i] in double) / 40), bit for bit");
	th_resp_free(&r);
	kern_model *mine = local_step(ckpt0, mean);
	char mine_sha[65];
	hash_sha256_hex(mine->params, TH_PARAMS * sizeof(float), mine_sha);
	is_str(psha, mine_sha, "params_sha256 is the sha256 of a local kern_opt_step on that mean");
	char server_ckpt[65];
	PGresult *ck = PQexec(th_db(), "SELECT coalesce(checkpoint_sha256, '') FROM round WHERE version = 0");
	snprintf(server_ckpt, sizeof server_ckpt, "%s", PQgetvalue(ck, 0, 0));
	PQclear(ck);
	char store[512], cpath[1024];
	snprintf(store, sizeof store, "%s/files", th_data_dir());
	cot_errbuf eb = { "", "" };
	kern_model *theirs = NULL;
	ok(!fs_path(store, server_ckpt, cpath, sizeof cpath, &eb) && !ckpt_load_new(cpath, 0, &theirs, &eb),
	   "the server's checkpoint 1 is in the store and loads (%s)", eb.msg);
	ok(theirs && memcmp(theirs->params, mine->params, TH_PARAMS * sizeof(float)) == 0 &&
	           memcmp(theirs->m, mine->m, TH_PARAMS * sizeof(float)) == 0 &&
	           memcmp(theirs->v, mine->v, TH_PARAMS * sizeof(float)) == 0,
	   "its parameters and moments are bit-identical to the step here");
	is_int(theirs ? theirs->step : -1, 1, "checkpoint 1 has taken one step");
	kern_model_free(theirs);
	is_int(th_sql_int("SELECT count(*) FROM file WHERE sha256 = '%s'", gsha), 0,
	       "the mean gradient is not indexed (transient)");

	/* D, in no included set, is dropped. */
	is_int(th_sql_int("SELECT count(*) FROM work_unit WHERE id = %lld AND state = 'expired' AND mb_done "
	                  "= 0",
	                  D.wu),
	       1, "D's unit is dropped: its samples no longer count");
	is_int(th_sql_int("SELECT count(*) FROM mb_pool WHERE project_id = %lld AND lo = %lld AND hi = %lld",
	                  pid, D.lo, D.lo + 4),
	       1, "the part D computed is back in the pool");
	th_coverage_exact(pid, "after the mean");
	is_int(th_sql_int("SELECT count(*) FROM round_member WHERE project_id = %lld AND version = 0 AND "
	                  "included",
	                  pid),
	       3, "three peers are included");

	/* Outcomes: D (excluded) said failed, which fails nothing (the same
	 * outcome again answers as the round is now); A holds the server's
	 * parameters, B something else; C last. */
	const char *wrong = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
	r = th_call("POST", "/v1/projects/s1/rounds/0/outcome", D.token, body, 200, "D's outcome again");
	ok(json_is_false(json_object_get(r.json, "accepted")), "D is not accepted");
	is_str(th_json_str(&r, "reload.checkpoint_sha256"), server_ckpt, "D is told to reload checkpoint 1");
	is_str(th_json_str(&r, "round.state"), "averaging", "D's failure does not fail the round");
	th_resp_free(&r);
	/* Malformed sketches of what was averaged: 400, nothing applied. */
	const char *bad_sketches[] = {
		"5",
		"{\"k\": 0, \"received\": []}",
		"{\"k\": 2, \"received\": [{\"aggregator\": 1, \"sketch\": [1, 2, 3]}]}",
		"{\"k\": 2, \"received\": [], \"aggregated\": {\"members\": [], \"result\": [1, 2], "
		"\"result_err\": -1}}",
		"{\"k\": 2, \"received\": [{\"aggregator\": 1, \"sketch\": [1, \"x\"]}]}",
	};
	for (size_t i = 0; i < sizeof bad_sketches / sizeof bad_sketches[0]; i++) {
		char sb[512];
		snprintf(sb, sizeof sb,
		         "{\"host_id\": %lld, \"status\": \"ok\", \"included_hosts\": [%lld, %lld, %lld], "
		         "\"params_sha256\": \"%s\", \"sketches\": %s}",
		         A.id, A.id, B.id, C.id, mine_sha, bad_sketches[i]);
		th_refused("POST", "/v1/projects/s1/rounds/0/outcome", A.token, sb, 400, "invalid",
		           "malformed sketches of the averaged bytes");
	}
	is_int(th_sql_int("SELECT count(*) FROM round_member WHERE project_id = %lld AND version = 0 AND "
	                  "host_id = %lld AND outcome IS NULL AND sketches IS NULL",
	                  pid, A.id),
	       1, "malformed sketches are refused (400) and change nothing");
	r = outcome(&A, "ok", mine_sha);
	is_str(th_json_str(&r, "round.state"), "averaging", "one included peer of three reported: averaging");
	ok(json_is_true(json_object_get(r.json, "accepted")), "A's hash matches the server's: accepted");
	is_str(th_json_str(&r, "checkpoint_sha256"), server_ckpt,
	       "A learns the checkpoint its v+1 equals (the round may still fail)");
	ok(!json_object_get(r.json, "reload"), "A is not told to reload");
	th_resp_free(&r);
	r = outcome(&B, "ok", wrong);
	ok(json_is_false(json_object_get(r.json, "accepted")), "B's hash differs: not accepted");
	ok(!json_object_get(r.json, "checkpoint_sha256"), "B is told no checkpoint of its own");
	is_str(th_json_str(&r, "reload.checkpoint_sha256"), server_ckpt, "B is told to reload checkpoint 1");
	is_str(th_json_str(&r, "round.state"), "averaging", "C has not reported: averaging");
	th_resp_free(&r);
	r = outcome(&C, "ok", mine_sha);
	is_str(th_json_str(&r, "round.state"), "committed", "every included peer reported: committed");
	th_resp_free(&r);
	r = outcome(&A, "ok", mine_sha);
	ok(json_is_true(json_object_get(r.json, "accepted")) && !json_object_get(r.json, "reload"),
	   "A's outcome again: accepted, nothing to reload");
	th_resp_free(&r);
	is_int(th_sql_int("SELECT count(*) FROM round_member WHERE project_id = %lld AND version = 0 AND "
	                  "accepted",
	                  pid),
	       2, "A and C are marked accepted");
	is_int(th_sql_int("SELECT current_version FROM project WHERE id = %lld", pid), 1,
	       "the project is at version 1");
	is_int(th_sql_int("SELECT count(*) FROM model_version WHERE project_id = %lld AND version = 1 AND "
	                  "checkpoint_sha256 = '%s'",
	                  pid, server_ckpt),
	       1, "model version 1 has the server's checkpoint");

	/* The rounds list: the loss is weighted by the counted samples (A 8 at
	 * 1.5 and 8 at 2.5, B 8 at 4.0, C 16 at 3.0; D's 100.0 does not
	 * count): 2.8. */
	r = th_call("GET", "/v1/projects/s1/rounds", NULL, NULL, 200, "the rounds list");
	json_t *rounds = json_object_get(r.json, "rounds");
	json_t *r1 = json_array_get(rounds, 0), *r0 = json_array_get(rounds, 1);
	is_int((long long)json_array_size(rounds), 2, "two rounds");
	is_int(json_integer_value(json_object_get(r1, "version")), 1, "newest first: version 1");
	is_str(json_string_value(json_object_get(r1, "state")), "open", "version 1 is open");
	is_str(json_string_value(json_object_get(r0, "state")), "committed", "version 0 is committed");
	is_int(json_integer_value(json_object_get(r0, "samples")), 40, "with the 40 included samples");
	is_int(json_integer_value(json_object_get(r0, "n_peers")), 3, "three included peers");
	is_int(json_integer_value(json_object_get(r0, "n_groups")), 2, "two groups");
	double loss = json_number_value(json_object_get(r0, "loss"));
	ok(fabs(loss - 2.8) < 1e-12, "the loss is the sample-weighted mean over counted units: %.15g", loss);
	ok(json_is_number(json_object_get(r0, "seconds")) &&
	           json_number_value(json_object_get(r0, "seconds")) >= 0,
	   "seconds from open to commit");
	ok(json_is_string(json_object_get(r0, "committed_at")), "committed_at is a timestamp");
	ok(json_is_null(json_object_get(r1, "loss")) && json_is_null(json_object_get(r1, "seconds")),
	   "the open round has no loss and no seconds yet");
	th_resp_free(&r);
	r = th_call("GET", "/v1/projects/s1/rounds?limit=1", NULL, NULL, 200, "limit=1");
	is_int((long long)json_array_size(json_object_get(r.json, "rounds")), 1, "one round");
	th_resp_free(&r);
	r = th_call("GET", "/v1/projects/s1/rounds?before=1", NULL, NULL, 200, "before=1");
	is_int(json_integer_value(
	               json_object_get(json_array_get(json_object_get(r.json, "rounds"), 0), "version")),
	       0, "before=1 starts at version 0");
	th_resp_free(&r);

	/* After the commit: a repeat of a kept sum answers the same; anything
	 * else is refused. */
	r = th_post_raw(p0, A.token, s0, TH_PARAMS * sizeof *s0);
	is_int(r.status, 200, "A's sum again after the commit: 200");
	is_str(th_json_str(&r, "round.state"), "committed", "the round is committed");
	th_resp_free(&r);
	snprintf(q, sizeof q, "/v1/projects/s1/rounds/0/group_sum?host_id=%lld&samples=32&included=%lld,%lld",
	         D.id, C.id, D.id);
	th_raw_refused(q, D.token, s1, TH_PARAMS * sizeof *s1, 409, "conflict", "a new sum after the commit");
	snprintf(body, sizeof body, "{\"host_id\": %lld}", E.id);
	r = th_call("POST", "/v1/projects/s1/work", E.token, body, 200, "work after the commit");
	is_int(th_json_int(&r, "version"), 1, "new work is for version 1");
	th_resp_free(&r);

	kern_model_free(mine);
	free(mean);
	free(s0);
	free(s1);
	ok(th_stop_server(), "the server stops cleanly");
	return exit_status();
}
