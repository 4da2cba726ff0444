/* cotrain tests: a pure sender's failure across groups between the peers
 * (cotrain-server --round-cross-peers), on the real server and PostgreSQL.
 * Four hosts in two groups of two; B and D cannot aggregate, so each
 * aggregates nothing (a pure sender).  A pure sender's 'failed' before its
 * group's mean hash is kept waits for it (round_outcome): D's group posts a
 * hash over C alone, which leaves D out, and the round averages on; B's
 * group posts one over A and B, which includes B, and the round fails then
 * (round_group_sum_settle) and reopens as its next attempt with its whole
 * range back in the pool.  tests/test_round_step.c checks the same through
 * the server's mean. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/tap.h"
#include "tests/test_server_harness.h"

static th_host A, B, C, D;

/* h reports its unit of 4 microbatches (16 samples), near host `near`. */
static void report(th_host *h, th_host *near)
{
	char path[64], body[512];
	snprintf(path, sizeof path, "/v1/workunits/%lld/report", h->wu);
	snprintf(body, sizeof body,
	         "{\"mb_done\": 4, \"samples\": 16, \"endpoint\": \"192.0.2.%lld:7070\", \"bandwidth\": 1e6,"
	         " \"can_aggregate\": %s, \"loss\": 2.0, \"rtt\": {\"%lld\": 1}}",
	         h->id % 250 + 1, h == &B || h == &D ? "false" : "true", near->id);
	th_resp r = th_call("POST", path, h->token, body, 200, "report");
	th_resp_free(&r);
}

static th_resp failed(th_host *h)
{
	char body[128];
	snprintf(body, sizeof body, "{\"host_id\": %lld, \"status\": \"failed\"}", h->id);
	return th_call("POST", "/v1/projects/x1/rounds/0/outcome", h->token, body, 200, "a failed outcome");
}

/* The mean's hash posted by h for its group over `included` (ids, comma
 * separated) and samples. */
static th_resp mean_hash(th_host *h, const char *included, int samples)
{
	char path[320];
	snprintf(path, sizeof path,
	         "/v1/projects/x1/rounds/0/mean_hash?host_id=%lld&samples=%d&sha256=%064d&included=%s", h->id,
	         samples, 0, included);
	return th_call("POST", path, h->token, NULL, 200, "a mean's hash");
}

static long long member(const char *col, th_host *h)
{
	return th_sql_int("SELECT %s FROM round_member WHERE version = 0 AND host_id = %lld", col, h->id);
}

int main(void)
{
	const char *args[] = { "--round-interval",  "1", "--round-report-timeout", "10",
		               "--round-max-group", "2", "--round-cross-peers",    NULL };
	plan_lazy();
	th_start(args);
	long long pid = th_seed_project("x1", 600, 1e6, 4, 16, 4, 100000);
	th_sql("UPDATE project SET target_batch = 64, config = '{\"model\": " TH_MODEL "}' WHERE id = %lld",
	       pid);
	th_host *hs[] = { &A, &B, &C, &D };
	for (int i = 0; i < 4; i++)
		th_host_new(hs[i], "sender", 4 * 4e6 / 600 + 1e-3);
	for (int i = 0; i < 4; i++) {
		th_ask_work(hs[i], "x1", 0);
		th_resp r = th_heartbeat(hs[i], 4, 16.0 / 600 + 1e-4);
		th_resp_free(&r);
	}
	is_int(th_sql_int("SELECT count(*) FROM round WHERE version = 0 AND state = 'closing'"), 1,
	       "four units of 16 samples close the round's 64");
	report(&A, &B);
	report(&B, &A);
	report(&C, &D);
	report(&D, &C);
	char path[128];
	snprintf(path, sizeof path, "/v1/projects/x1/rounds/0/plan?host_id=%lld&wait=30", A.id);
	th_resp r = th_call("GET", path, A.token, NULL, 200, "the plan (long poll)");
	is_int(th_json_int(&r, "n_groups"), 2, "two groups");
	is_str(th_json_str(&r, "cross_group"), "peers", "averaged across groups between the peers");
	th_resp_free(&r);
	ok(member("group_id", &A) == member("group_id", &B) &&
	           member("group_id", &C) == member("group_id", &D) &&
	           member("group_id", &A) != member("group_id", &C),
	   "A and B average together, C and D together");
	is_int(th_sql_int("SELECT count(*) FROM round_member WHERE version = 0 AND lo = hi AND host_id IN "
	                  "(%lld, %lld)",
	                  B.id, D.id),
	       2, "B and D aggregate nothing (pure senders)");

	/* D fails before its group's hash: the round waits for the hash. */
	r = failed(&D);
	is_str(th_json_str(&r, "round.state"), "averaging", "D's failure waits for its group's hash");
	th_resp_free(&r);
	char inc[64];
	snprintf(inc, sizeof inc, "%lld", C.id);
	r = mean_hash(&C, inc, 16);
	is_str(th_json_str(&r, "round.state"), "averaging", "C's hash leaves D out: the round averages on");
	th_resp_free(&r);
	is_int(member("included::int", &D), 0, "D is not included");
	is_int(member("included::int", &C), 1, "C is");

	/* B fails before its group's hash, which then includes it. */
	r = failed(&B);
	is_str(th_json_str(&r, "round.state"), "averaging", "B's failure waits for its group's hash");
	th_resp_free(&r);
	snprintf(inc, sizeof inc, "%lld,%lld", A.id, B.id); /* A registered first: ascending */
	r = mean_hash(&A, inc, 32);
	is_str(th_json_str(&r, "round.state"), "open", "A's hash includes B: the round fails and reopens");
	is_int(th_json_int(&r, "round.attempt"), 2, "  as attempt 2");
	th_resp_free(&r);
	char want[96];
	snprintf(want, sizeof want, "host %lld failed to average", B.id);
	is_int(th_sql_int("SELECT count(*) FROM round WHERE version = 0 AND last_failure = '%s'", want), 1,
	       "the failure names B (%s)", want);
	is_int(th_sql_int("SELECT count(*) FROM round_member WHERE version = 0"), 0, "the plan is gone");
	th_coverage_exact(pid, "after the failed attempt");
	ok(th_stop_server(), "the server stops cleanly");
	return exit_status();
}
