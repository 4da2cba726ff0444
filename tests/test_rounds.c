/* cotrain tests: a training round on the real cotrain-server and real
 * PostgreSQL: the project CA and host certificates, a round that fills and
 * closes, reports that return the unprocessed rest to the pool (the stream
 * stays exactly tiled), a host that never reports dropped at the report
 * deadline, the plan (groups, shares), the outcomes (committing needs the
 * server's own step: tests/test_round_step.c), the straggler rule, and hostile requests that change nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "shared/pki.h"
#include "tests/tap.h"
#include "tests/test_server_harness.h"

/* The test model: 1 layer, width 8, 2 heads, d_ff 32, sequence 16,
 * vocabulary 256: V*C + T*C + (2C + 3C*C + 3C + C*C + C + 2C + C*F + F +
 * F*C + C) + 2C = 2048 + 128 + 872 + 16 parameters. */
#define MODEL "{\"n_layer\": 1, \"n_shared\": 1, \"n_head\": 2, \"d_model\": 8, \"d_ff\": 32, \"seq_len\": 16, \"vocab\": 256}"
#define PARAMS 3064

static char *fingerprint(void)
{
	char *base = th_db_fingerprint();
	PGresult *r = PQexec(th_db(),
		"SELECT (SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') FROM round t)"
		" || (SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') FROM round_report t)"
		" || (SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') FROM round_member t)"
		" || (SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') FROM model_version t)");
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		bail_out("fingerprint: %s", PQerrorMessage(th_db()));
	size_t n = strlen(base) + (size_t)PQgetlength(r, 0, 0) + 2;
	char *out = malloc(n);
	snprintf(out, n, "%s%s", base, PQgetvalue(r, 0, 0));
	PQclear(r);
	free(base);
	return out;
}

static void refused(const char *method, const char *path, const char *bearer, const char *body,
                    long status, const char *code, const char *what)
{
	char *before = fingerprint();
	th_resp r;
	if (!th_http(NULL, method, path, bearer, body, NULL, &r))
		bail_out("%s: request failed", what);
	th_is_error(&r, status, code, what);
	char *after = fingerprint();
	is_str(after, before, "%s: database unchanged", what);
	free(after);
	free(before);
	th_resp_free(&r);
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

/* Every stream microbatch below the frontier is in exactly one place: a pool
 * range, a live unit, or the finished part of another unit. */
static void coverage_exact(long long project, const char *what)
{
	char sql[1024];
	snprintf(sql, sizeof sql,
	         "SELECT lo, hi FROM ("
	         " SELECT lo, hi FROM mb_pool WHERE project_id = %lld"
	         " UNION ALL SELECT lo, hi FROM work_unit WHERE project_id = %lld AND state = 'live'"
	         " UNION ALL SELECT lo, lo + mb_done FROM work_unit WHERE project_id = %lld"
	         "   AND state <> 'live' AND mb_done > 0) t ORDER BY lo, hi",
	         project, project, project);
	PGresult *r = PQexec(th_db(), sql);
	long long at = 0;
	bool good = PQresultStatus(r) == PGRES_TUPLES_OK;
	for (int i = 0; good && i < PQntuples(r); i++) {
		long long lo = atoll(PQgetvalue(r, i, 0)), hi = atoll(PQgetvalue(r, i, 1));
		if (lo != at || hi <= lo) {
			diag("  range %d: [%lld, %lld) where %lld was expected", i, lo, hi, at);
			good = false;
		}
		at = hi;
	}
	PQclear(r);
	long long frontier = th_sql_int("SELECT frontier FROM project WHERE id = %lld", project);
	ok(good && at == frontier, "%s: pool + live + done tile [0, %lld) exactly", what, frontier);
}

typedef struct {
	char key[64], token[64];
	long long id, wu, lo, hi;
} host;

static void ask_work(host *h, const char *project, long long version)
{
	char path[128], body[64];
	snprintf(path, sizeof path, "/v1/projects/%s/work", project);
	snprintf(body, sizeof body, "{\"host_id\": %lld}", h->id);
	th_resp r = call("POST", path, h->token, body, 200, "work");
	h->wu = th_json_int(&r, "work_unit_id");
	h->lo = th_json_int(&r, "lo");
	h->hi = th_json_int(&r, "hi");
	is_int(th_json_int(&r, "version"), version, "work unit %lld is for version %lld", h->wu, version);
	th_resp_free(&r);
}

static th_resp heartbeat(host *h, long long mb_done, double sps)
{
	char path[64], body[128];
	snprintf(path, sizeof path, "/v1/workunits/%lld/heartbeat", h->wu);
	snprintf(body, sizeof body, "{\"mb_done\": %lld, \"samples_per_sec\": %g}", mb_done, sps);
	return call("POST", path, h->token, body, 200, "heartbeat");
}

static void report_body(char *out, size_t n, long long mb_done, long long samples, int port,
                        bool agg, const char *rtt)
{
	snprintf(out, n,
	         "{\"mb_done\": %lld, \"samples\": %lld, \"endpoint\": \"192.0.2.%d:7070\","
	         " \"bandwidth\": %d, \"can_aggregate\": %s, \"rtt\": %s}",
	         mb_done, samples, port, 1000000 * port, agg ? "true" : "false", rtt);
}

static host A, B, C, D, E;

static void test_certificates(void)
{
	th_resp r = call("GET", "/v1/projects/r1/ca", NULL, NULL, 200, "project CA");
	const char *pem = th_json_str(&r, "certificate");
	ok(pem && strstr(pem, "-----BEGIN CERTIFICATE-----"), "the CA certificate is PEM");
	char *ca = strdup(pem ? pem : "");
	th_resp_free(&r);
	char path[256];
	struct stat st;
	snprintf(path, sizeof path, "%s/ca/r1.key", th_data_dir());
	ok(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600, "the CA key is kept with mode 0600");
	r = call("GET", "/v1/projects/r1/ca", NULL, NULL, 200, "project CA again");
	is_str(th_json_str(&r, "certificate"), ca, "the same CA the second time");
	th_resp_free(&r);
	refused("GET", "/v1/projects/nope/ca", NULL, NULL, 404, "not_found", "CA of an unknown project");
	snprintf(path, sizeof path, "%s/ca/nope.crt", th_data_dir());
	ok(access(path, F_OK) != 0, "no CA is created for an unknown project");

	char *key = NULL, *pub = NULL;
	cot_errbuf eb = { "", "" };
	if (pki_host_key_generate(&key, &pub, &eb))
		bail_out("could not make a host key: %s", eb.msg);
	json_t *b = json_pack("{s:s, s:s}", "public_key", pub, "project", "r1");
	char *body = json_dumps(b, JSON_COMPACT);
	json_decref(b);
	snprintf(path, sizeof path, "/v1/hosts/%lld/certificate", A.id);
	r = call("POST", path, A.token, body, 200, "host certificate");
	const char *cert = th_json_str(&r, "certificate");
	pki_trust *t = NULL;
	int64_t who = 0;
	ok(cert && !pki_trust_new(ca, strlen(ca), "r1", &t, &eb) &&
	   !pki_trust_verify_pem(t, cert, strlen(cert), time(NULL), &who, &eb) && who == A.id,
	   "the certificate is signed by the project CA for host %lld (%s)", A.id, eb.msg);
	is_str(th_json_str(&r, "ca_certificate"), ca, "the answer carries the CA certificate");
	pki_trust_free(t);
	th_resp_free(&r);

	refused("POST", path, B.token, body, 403, "forbidden", "certificate for another host's id");
	refused("POST", path, NULL, body, 401, "unauthorized", "certificate without a token");
	refused("POST", path, A.token, "{\"public_key\": \"-----BEGIN PUBLIC KEY-----\\ngarbage\\n-----END PUBLIC KEY-----\\n\", \"project\": \"r1\"}",
	        400, "invalid", "certificate for a bad PEM");
	refused("POST", path, A.token, "{\"public_key\": \"not a key\", \"project\": \"r1\"}",
	        400, "invalid", "certificate for a non-PEM key");
	refused("POST", path, A.token, "{\"project\": \"r1\"}", 400, "invalid",
	        "certificate without a key");
	b = json_pack("{s:s, s:s}", "public_key", pub, "project", "nope");
	char *body2 = json_dumps(b, JSON_COMPACT);
	json_decref(b);
	refused("POST", path, A.token, body2, 404, "not_found", "certificate for an unknown project");
	free(body2);
	free(body);
	free(key);
	free(pub);
	free(ca);
}

/* GET the plan of round `version` of r1 for h; the status is checked. */
static th_resp get_plan(host *h, long long version, long status)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/projects/r1/rounds/%lld/plan?host_id=%lld", version, h->id);
	return call("GET", path, h->token, NULL, status, "plan");
}

static void test_round(long long pid)
{
	/* Four hosts, eight microbatches (32 samples) each; the target is 64. */
	host *hs[] = { &A, &B, &C, &D };
	for (int i = 0; i < 4; i++)
		ask_work(hs[i], "r1", 0);
	is_int(A.hi - A.lo, 8, "a work unit of 8 microbatches");
	th_resp r;
	long long done[] = { 4, 4, 4, 2 };
	for (int i = 0; i < 4; i++) {
		r = heartbeat(hs[i], done[i], 1e6);
		ok(!json_object_get(r.json, "round"), "heartbeat %d: the round is open (%lld samples)", i,
		   th_json_int(&r, "accumulated_samples"));
		th_resp_free(&r);
	}
	r = heartbeat(&A, 6, 1e6);
	is_int(th_json_int(&r, "accumulated_samples"), 64, "64 samples: the target");
	is_str(th_json_str(&r, "round.state"), "closing", "the heartbeat says the round is closing");
	is_int(th_json_int(&r, "round.version"), 0, "... of version 0");
	th_resp_free(&r);
	is_str(PQgetvalue(PQexec(th_db(), "SELECT close_reason FROM round WHERE version = 0 AND project_id = (SELECT id FROM project WHERE name = 'r1')"), 0, 0),
	       "target", "closed for the target");

	char body[512], path[64];
	snprintf(body, sizeof body, "{\"host_id\": %lld}", E.id);
	char *before = fingerprint();
	r = call("POST", "/v1/projects/r1/work", E.token, body, 409, "new work while closing");
	is_str(th_json_str(&r, "round.state"), "closing", "the refusal names the round's state");
	ok(th_json_int(&r, "retry_after") > 0, "and when to ask again");
	th_resp_free(&r);
	char *after = fingerprint();
	is_str(after, before, "new work while closing: database unchanged");
	free(before);
	free(after);

	/* Reports. */
	snprintf(path, sizeof path, "/v1/workunits/%lld/report", A.wu);
	char rtt[128];
	snprintf(rtt, sizeof rtt, "{\"%lld\": 5, \"%lld\": 80, \"%lld\": 90}", B.id, C.id, D.id);
	report_body(body, sizeof body, 6, 24, 1, true, rtt);
	r = call("POST", path, A.token, body, 200, "A reports");
	is_str(th_json_str(&r, "state"), "returned", "a reported live unit is returned");
	is_int(th_json_int(&r, "returned_lo"), A.lo + 6, "its rest starts after what it did");
	th_resp_free(&r);
	is_int(th_sql_int("SELECT count(*) FROM mb_pool WHERE project_id = %lld AND lo = %lld AND hi = %lld",
	                  pid, A.lo + 6, A.hi), 1, "the unprocessed rest is back in the pool");
	coverage_exact(pid, "after a report");
	r = call("POST", path, A.token, body, 200, "the same report again");
	is_int(th_json_int(&r, "samples"), 24, "answered as before");
	th_resp_free(&r);
	char other[512];
	report_body(other, sizeof other, 7, 28, 1, true, rtt);
	refused("POST", path, A.token, other, 409, "conflict", "a conflicting second report");
	refused("POST", path, B.token, body, 403, "forbidden", "a report of another host's unit");
	refused("POST", "/v1/workunits/999999/report", A.token, body, 404, "not_found",
	        "a report of an unknown unit");

	snprintf(path, sizeof path, "/v1/workunits/%lld/report", B.wu);
	report_body(other, sizeof other, 4, 17, 2, true, "{}");
	refused("POST", path, B.token, other, 400, "invalid", "samples that do not match mb_done");
	report_body(other, sizeof other, 9, 36, 2, true, "{}");
	refused("POST", path, B.token, other, 400, "invalid", "mb_done beyond the unit");
	report_body(other, sizeof other, 3, 12, 2, true, "{}");
	refused("POST", path, B.token, other, 400, "invalid", "mb_done below the last heartbeat");
	refused("POST", path, B.token,
	        "{\"mb_done\": 4, \"samples\": 16, \"endpoint\": \"example.org\", \"bandwidth\": 1e6, \"can_aggregate\": true}",
	        400, "invalid", "an endpoint that is not ip:port");
	refused("POST", path, B.token,
	        "{\"mb_done\": 4, \"samples\": 16, \"endpoint\": \"192.0.2.2:7070\", \"bandwidth\": 1e6, \"can_aggregate\": true, \"rtt\": {\"x\": 1}}",
	        400, "invalid", "an rtt keyed by something else than host ids");
	snprintf(rtt, sizeof rtt, "{\"%lld\": 5}", A.id);
	report_body(body, sizeof body, 4, 16, 2, true, rtt);
	r = call("POST", path, B.token, body, 200, "B reports");
	th_resp_free(&r);
	snprintf(path, sizeof path, "/v1/workunits/%lld/report", C.wu);
	snprintf(rtt, sizeof rtt, "{\"%lld\": 3}", D.id);
	report_body(body, sizeof body, 4, 16, 3, false, rtt);
	r = call("POST", path, C.token, body, 200, "C reports (cannot aggregate)");
	th_resp_free(&r);
	coverage_exact(pid, "after three reports");

	/* D never reports: no plan until the report deadline. */
	r = get_plan(&A, 0, 204);
	ok(r.len == 0, "no plan yet: 204 without a body");
	th_resp_free(&r);
	time_t t0 = time(NULL);
	char pp[128];
	snprintf(pp, sizeof pp, "/v1/projects/r1/rounds/0/plan?host_id=%lld", A.id);
	do {
		usleep(200000);
		if (!th_http(NULL, "GET", pp, A.token, NULL, NULL, &r))
			bail_out("plan");
		long st = r.status;
		th_resp_free(&r);
		if (st != 204)
			break;
	} while (time(NULL) - t0 < 30);
	ok(time(NULL) - t0 >= 1, "the plan waited for the report deadline");
	is_int(th_sql_int("SELECT count(*) FROM work_unit WHERE id = %lld AND state = 'expired' AND mb_done = 0",
	                  D.wu), 1, "the unit that never reported is dropped, its samples not counted");
	is_int(th_sql_int("SELECT count(*) FROM mb_pool WHERE project_id = %lld AND lo = %lld AND hi = %lld",
	                  pid, D.lo, D.hi), 1, "its whole range is back in the pool");
	coverage_exact(pid, "after the plan");
	snprintf(path, sizeof path, "/v1/workunits/%lld/heartbeat", D.wu);
	refused("POST", path, D.token, "{\"mb_done\": 3}", 409, "conflict", "the dropped unit's heartbeat");

	/* The plan. */
	host *peers[] = { &A, &B, &C };
	int in_groups[3] = { 0 };
	long long group_of[3];
	for (int i = 0; i < 3; i++) {
		r = get_plan(peers[i], 0, 200);
		group_of[i] = th_json_int(&r, "group");
		is_int(th_json_int(&r, "param_count"), PARAMS, "peer %d: the vector is the model's %d parameters", i, PARAMS);
		is_int(th_json_int(&r, "round_samples"), 56, "peer %d: 56 samples in the round", i);
		is_str(th_json_str(&r, "state"), "averaging", "peer %d: the round is averaging", i);
		ok(th_json_str(&r, "deadline") && th_json_str(&r, "compression"), "peer %d: deadline and compression", i);
		json_t *members = json_object_get(r.json, "members");
		bool self = false, tiled = true;
		long long at = 0;
		size_t k;
		json_t *m;
		json_array_foreach(members, k, m) {
			long long id = json_integer_value(json_object_get(m, "host_id"));
			long long lo = json_integer_value(json_object_get(m, "lo"));
			long long hi = json_integer_value(json_object_get(m, "hi"));
			for (int j = 0; j < 3; j++)
				if (peers[j]->id == id)
					in_groups[j] += i == j;
			self |= id == peers[i]->id;
			if (lo != at || hi < lo)
				tiled = false;
			at = hi;
			if (id == C.id)
				ok(lo == hi, "the peer that cannot aggregate gets an empty range");
			if (id == A.id)
				is_int(json_integer_value(json_object_get(m, "samples")), 24, "A's exact samples");
			ok(json_string_value(json_object_get(m, "endpoint")), "member %lld has an endpoint", id);
		}
		ok(self, "peer %d is in its own group", i);
		ok(tiled && at == PARAMS, "peer %d: its group's ranges tile [0, %d) exactly", i, PARAMS);
		ok(json_array_size(members) <= 2, "at most 2 peers in a group (--round-max-group)");
		th_resp_free(&r);
	}
	is_int(in_groups[0] + in_groups[1] + in_groups[2], 3, "every peer is in exactly one group");
	/* Two groups for three peers; A and B are the only ones that accept
	 * connections, so each leads one group, however close they are. */
	ok(group_of[0] != group_of[1], "each group has a peer that can aggregate");
	ok(group_of[2] == group_of[0] || group_of[2] == group_of[1], "C joins one of them");
	is_int(th_sql_int("SELECT count(*) FROM round_member WHERE version = 0 AND project_id = %lld", pid),
	       3, "three peers in the plan");

	refused("GET", "/v1/projects/r1/rounds/0/plan", A.token, NULL, 400, "invalid", "plan without host_id");
	char p2[128];
	snprintf(p2, sizeof p2, "/v1/projects/r1/rounds/7/plan?host_id=%lld", A.id);
	refused("GET", p2, A.token, NULL, 404, "not_found", "plan of an unknown version");
	snprintf(p2, sizeof p2, "/v1/projects/r1/rounds/0/plan?host_id=%lld", B.id);
	refused("GET", p2, A.token, NULL, 403, "forbidden", "plan for another host");
	snprintf(p2, sizeof p2, "/v1/projects/nope/rounds/0/plan?host_id=%lld", A.id);
	refused("GET", p2, A.token, NULL, 404, "not_found", "plan of an unknown project");
	snprintf(p2, sizeof p2, "/v1/projects/r1/rounds/0/plan?host_id=%lld", D.id);
	refused("GET", p2, D.token, NULL, 409, "conflict", "plan for a dropped host");

	/* Outcomes. */
	const char *sha = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
	char ob[512];
	const char *op = "/v1/projects/r1/rounds/0/outcome";
	for (int i = 0; i < 2; i++) {
		snprintf(ob, sizeof ob, "{\"host_id\": %lld, \"status\": \"ok\", \"included_hosts\": [%lld, %lld, %lld], \"params_sha256\": \"%s\"}",
		         peers[i]->id, A.id, B.id, C.id, sha);
		r = call("POST", op, peers[i]->token, ob, 200, "outcome ok");
		is_str(th_json_str(&r, "round.state"), "averaging", "still averaging until every peer said");
		th_resp_free(&r);
	}
	refused("POST", op, A.token, ob, 403, "forbidden", "an outcome for another host");
	snprintf(ob, sizeof ob, "{\"host_id\": %lld, \"status\": \"ok\", \"included_hosts\": [%lld, %lld, %lld], \"params_sha256\": \"%s\"}",
	         A.id, A.id, B.id, C.id, sha);
	r = call("POST", op, A.token, ob, 200, "A's outcome again");
	th_resp_free(&r);
	snprintf(ob, sizeof ob, "{\"host_id\": %lld, \"status\": \"failed\", \"included_hosts\": []}", A.id);
	refused("POST", op, A.token, ob, 409, "conflict", "a different second outcome");
	snprintf(ob, sizeof ob, "{\"host_id\": %lld, \"status\": \"maybe\", \"included_hosts\": []}", C.id);
	refused("POST", op, C.token, ob, 400, "invalid", "an unknown outcome status");
	snprintf(ob, sizeof ob, "{\"host_id\": %lld, \"status\": \"ok\", \"included_hosts\": [], \"params_sha256\": \"xyz\"}", C.id);
	refused("POST", op, C.token, ob, 400, "invalid", "a malformed hash");
	snprintf(ob, sizeof ob, "{\"host_id\": %lld, \"status\": \"ok\", \"included_hosts\": [], \"params_sha256\": \"%s\"}", D.id, sha);
	refused("POST", op, D.token, ob, 409, "conflict", "an outcome from a host not in the plan");
	snprintf(ob, sizeof ob, "{\"host_id\": %lld, \"status\": \"ok\", \"included_hosts\": [%lld, %lld, %lld], \"params_sha256\": \"%s\"}",
	         C.id, A.id, B.id, C.id, sha);
	refused("POST", "/v1/projects/r1/rounds/3/outcome", C.token, ob, 404, "not_found",
	        "an outcome for an unknown version");
	r = call("POST", op, C.token, ob, 200, "the last outcome");
	/* The peers' agreement alone no longer commits: the server computes
	 * v+1 from the uploaded gradient first (tests/test_round_step.c). */
	is_str(th_json_str(&r, "round.state"), "averaging",
	       "every peer ok with one hash, but no gradient uploaded: still averaging");
	ok(!json_object_get(r.json, "accepted"), "nobody is accepted or refused before the server's step");
	th_resp_free(&r);
	is_int(th_sql_int("SELECT current_version FROM project WHERE id = %lld", pid), 0,
	       "the project stays at version 0");
	is_int(th_sql_int("SELECT count(*) FROM model_version WHERE project_id = %lld AND version = 1", pid),
	       0, "no model version 1 without the server's checkpoint");
	coverage_exact(pid, "after the outcomes");
}

static void test_stragglers(void)
{
	long long pid = th_seed_project("r2", 600, 1e6, 4, 16, 4, 100000);
	th_sql("UPDATE project SET target_batch = 64, config = '{\"model\": " MODEL "}' WHERE id = %lld", pid);
	host h = A;
	ask_work(&h, "r2", 0);
	th_resp r = heartbeat(&h, 8, 0.001);       /* 32 of 64 samples, and crawling */
	ok(!json_object_get(r.json, "round"), "half the target: the heartbeat finds the round open");
	th_resp_free(&r);
	time_t t0 = time(NULL);
	while (th_sql_int("SELECT count(*) FROM round WHERE project_id = %lld AND state = 'closing'", pid) == 0 &&
	       time(NULL) - t0 < 20)
		usleep(100000);
	is_int(th_sql_int("SELECT count(*) FROM round WHERE project_id = %lld AND state = 'closing' AND close_reason = 'stragglers'", pid),
	       1, "the round closed early: the rest would take longer than the budget");
	coverage_exact(pid, "straggler round");
}

int main(void)
{
	const char *args[] = { "--round-interval", "1", "--round-report-timeout", "3",
	                       "--round-max-group", "2", "--round-close-fraction", "0.5",
	                       "--round-straggler-budget", "60", NULL };
	plan_lazy();
	th_start(args);
	/* 8 microbatches per unit: flops * wu_seconds / (flops_per_sample * 4) = 8. */
	long long pid = th_seed_project("r1", 600, 1e6, 4, 16, 4, 100000);
	th_sql("UPDATE project SET target_batch = 64, config = '{\"model\": " MODEL "}' WHERE id = %lld", pid);
	host *hs[] = { &A, &B, &C, &D, &E };
	for (int i = 0; i < 5; i++)
		th_new_host("round", 8 * 4e6 / 600 + 1e-3, hs[i]->key, &hs[i]->id, hs[i]->token);

	test_certificates();
	test_round(pid);
	test_stragglers();
	ok(th_stop_server(), "the server stops cleanly");
	return exit_status();
}
