/* cotrain tests: credit (db/functions/credit.sql, spotcheck.sql and their routes)
 * through the real cotrain-server and PostgreSQL.
 *
 * Rounds are committed the way the round code does it (members marked
 * accepted, the round row turned 'committed'), so the grant runs from the
 * trigger, at clock times injected with SET cotrain.now.  Checked: the
 * ledger's invariants (the granted credit is exactly the FLOPs of the
 * accepted samples / 4.32e11; nothing for rejected or dropped hosts;
 * idempotence), BOINC's RAC at chosen times, spot checks over HTTP with
 * fingerprints of real gradients from kernels/model.h (agreement grants,
 * disagreement denies and resets, a host that never answers is denied), the
 * leaderboards' keyset pages and their 400s, the pages, /metrics, and the
 * stats export parsed as XML with the expected totals. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/model.h"
#include "shared/common/fingerprint.h"
#include "tests/pgtmp.h"
#include "tests/tap.h"
#include "tests/test_server_harness.h"

#define FPS 3e9 /* flops per sample of the test project */
#define MBS 4   /* samples per microbatch */
#define COBBLE 4.32e11

typedef struct {
	char key[64], token[64];
	long long id, account;
} host;

static host A, B, C, D;
static long long pid;

static void new_host(host *h, const char *tag)
{
	th_new_host(tag, 1e9, h->key, &h->id, h->token);
	h->account = th_sql_int("SELECT account_id FROM host WHERE id = %lld", h->id);
}

static double sql_double(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static double sql_double(const char *fmt, ...)
{
	char q[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(q, sizeof q, fmt, ap);
	va_end(ap);
	PGresult *r = PQexec(th_db(), q);
	double v = NAN;
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
		v = strtod(PQgetvalue(r, 0, 0), NULL);
	else if (PQresultStatus(r) != PGRES_TUPLES_OK)
		diag("SQL failed: %s: %s", q, PQresultErrorMessage(r));
	PQclear(r);
	return v;
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1, fabs(b)); }

typedef struct {
	host *h;
	long long lo, hi, mb_done;
	int accepted; /* 1 accepted, 0 hash differed, -1 dropped (not a member) */
} member;

static double mb_sketch(long long g, int j, int data);
static bool sketch_units; /* commit_round: with sketches of the units' microbatches */

/* Commit round `version` of the test project at clock time `now` (opened a
 * day before), with these members, the way the round code does. */
static void commit_round(int version, const char *now, const member *m, int n)
{
	th_sql("SET cotrain.now = '%s'", now);
	th_sql("UPDATE round SET opened_at = '%s'::timestamptz - interval '1 day'"
	       " WHERE project_id = %lld AND version = %d",
	       now, pid, version);
	for (int i = 0; i < n; i++) {
		bool dropped = m[i].accepted < 0;
		th_sql("INSERT INTO work_unit (project_id, host_id, version, lo, hi, mb_done, state, "
		       "deadline)"
		       " VALUES (%lld, %lld, %d, %lld, %lld, %lld, '%s', now())",
		       pid, m[i].h->id, version, m[i].lo, m[i].hi, dropped ? 0 : m[i].mb_done,
		       dropped ? "expired" : "returned");
		if (sketch_units) {
			char vals[4096] = "";
			size_t len = 0;
			for (long long g = m[i].lo; g < m[i].lo + m[i].mb_done; g++)
				for (int j = 0; j < 4; j++)
					len += (size_t)snprintf(vals + len, sizeof vals - len, "%s%.17g",
					                        len ? "," : "", mb_sketch(g, j, 0));
			th_sql("INSERT INTO work_unit_sketch (work_unit_id, k, sketches)"
			       " SELECT id, 4, '{%s}' FROM work_unit WHERE project_id = %lld AND host_id = "
			       "%lld"
			       " AND version = %d AND lo = %lld",
			       vals, pid, m[i].h->id, version, m[i].lo);
		}
		if (!dropped)
			th_sql("INSERT INTO round_member (project_id, version, host_id, group_id, samples,"
			       " endpoint, bandwidth, can_aggregate, lo, hi, outcome, params_sha256, "
			       "accepted)"
			       " VALUES (%lld, %d, %lld, 0, %lld, '127.0.0.1:1', 1e6, true, 0, 0, 'ok', "
			       "'%s', %s)",
			       pid, version, m[i].h->id, m[i].mb_done * MBS, m[i].accepted ? "good" : "bad",
			       m[i].accepted ? "true" : "false");
	}
	th_sql("UPDATE round SET state = 'committed', committed_at = '%s', samples = (SELECT sum(samples)"
	       " FROM round_member WHERE project_id = %lld AND version = %d)"
	       " WHERE project_id = %lld AND version = %d",
	       now, pid, version, pid, version);
	th_sql("INSERT INTO round (project_id, version) VALUES (%lld, %d) ON CONFLICT DO NOTHING", pid,
	       version + 1);
	th_sql("UPDATE project SET current_version = %d WHERE id = %lld", version + 1, pid);
}

static double credit_of(long long samples) { return FPS * (double)samples / COBBLE; }

static double granted_sum(void)
{
	return sql_double("SELECT coalesce(sum(credit), 0) FROM credit_grant WHERE status = 'granted'");
}

static double host_total(const host *h)
{
	return sql_double("SELECT coalesce((SELECT total FROM host_credit WHERE host_id = %lld), 0)", h->id);
}

/* The totals of hosts, accounts and teams each add up to the granted ledger. */
static void totals_match_ledger(const char *when)
{
	double g = granted_sum();
	ok(near(sql_double("SELECT coalesce(sum(total), 0) FROM host_credit"), g),
	   "%s: host totals add up to the granted ledger (%.6f)", when, g);
	ok(near(sql_double("SELECT coalesce(sum(total), 0) FROM account_credit"), g),
	   "%s: account totals add up to the granted ledger", when);
	ok(near(sql_double("SELECT coalesce(sum(total), 0) FROM team_credit"),
	        sql_double("SELECT coalesce(sum(credit), 0) FROM credit_grant WHERE status = 'granted'"
	                   " AND team_id IS NOT NULL")),
	   "%s: team totals add up to the granted ledger of team members", when);
}

static void test_ledger(void)
{
	ok(sql_double("SELECT count(*) FROM spot_policy WHERE project_id = %lld AND trusted_after = 1"
	              " AND first_rate = 1 AND decay = 0.5",
	              pid) == 1,
	   "a new project gets the default spot-check policy (new hosts always, halved per agreeing "
	   "check)");
	th_sql("DELETE FROM spot_policy WHERE project_id = %lld", pid);
	ok(sql_double("SELECT spot_rate(spot_policy_of(%lld), 0)", pid) == 0,
	   "a project without a spot_policy row is not spot-checked");
#define DEFAULT_POLICY "ROW(1, 1, 1, 0.01, 16, 1e-3, 86400, 2, 0.5)::spot_policy"
	ok(sql_double("SELECT spot_rate(" DEFAULT_POLICY ", 0)") == 1 &&
	           near(sql_double("SELECT spot_rate(" DEFAULT_POLICY ", 1)"), 0.5) &&
	           near(sql_double("SELECT spot_rate(" DEFAULT_POLICY ", 3)"), 0.125) &&
	           near(sql_double("SELECT spot_rate(" DEFAULT_POLICY ", 1000000)"), 0.01),
	   "the default rule: a new host always, then halved by each agreeing check, at least min_rate");
	ok(sql_double("SELECT spot_rate(ROW(1, 10, 0.8, 0.01, 16, 1e-3, 86400, 2, 0.25)::spot_policy, 9)") ==
	                   0.8 &&
	           near(sql_double("SELECT spot_rate(ROW(1, 10, 0.8, 0.01, 16, 1e-3, 86400, 2, "
	                           "0.25)::spot_policy, "
	                           "11)"),
	                0.8 * 0.25 * 0.25),
	   "first_rate below trusted_after agreeing checks, then first_rate x decay per further one");
	th_sql("INSERT INTO spot_policy (project_id, trusted_after, first_rate, min_rate)"
	       " VALUES (%lld, 1000000, 0, 0)",
	       pid); /* no spot checks yet */
	th_sql("INSERT INTO team (name) VALUES ('credit team')");
	th_sql("UPDATE account SET team_id = (SELECT id FROM team WHERE name = 'credit team')"
	       " WHERE id IN (%lld, %lld)",
	       A.account, B.account);

	member r0[] = {
		{ &A, 0, 10, 10, 1 },  /* 40 samples */
		{ &B, 10, 30, 15, 1 }, /* 60 samples; 5 microbatches went back to the pool */
		{ &C, 30, 40, 5, 0 },  /* hash differed: not accepted */
		{ &D, 40, 50, 7, -1 }, /* dropped from the round */
	};
	commit_round(0, "2030-01-01 00:00:00+00", r0, 4);
	double want = credit_of(40 + 60);
	ok(near(granted_sum(), want), "round 0: granted %.9f = FLOPs of accepted samples / 4.32e11 = %.9f",
	   granted_sum(), want);
	ok(near(host_total(&A), credit_of(40)) && near(host_total(&B), credit_of(60)),
	   "round 0: each accepted host gets flops_per_sample x its samples / 4.32e11");
	ok(host_total(&C) == 0 &&
	           th_sql_int("SELECT count(*) FROM credit_grant WHERE host_id = %lld", C.id) == 0,
	   "round 0: a host whose hash differed gets nothing");
	ok(host_total(&D) == 0 &&
	           th_sql_int("SELECT count(*) FROM credit_grant WHERE host_id = %lld", D.id) == 0,
	   "round 0: a host dropped from the round gets nothing for its samples");
	ok(near(sql_double("SELECT sum(samples) FROM credit_grant"), 100) &&
	           near(sql_double("SELECT sum(flops) FROM credit_grant"), FPS * 100),
	   "round 0: the ledger rows carry samples and FLOPs");
	ok(th_sql_int("SELECT credit_grant_round(%lld, 0)", pid) == 0 && near(granted_sum(), want),
	   "granting round 0 again grants nothing twice");
	th_sql("UPDATE round SET state = 'committed' WHERE project_id = %lld AND version = 0", pid);
	ok(near(granted_sum(), want), "a committed round updated again grants nothing");
	ok(th_sql_int("SELECT credit_grant_round(%lld, 1)", pid) == 0, "an open round grants nothing");
	ok(near(sql_double("SELECT total FROM team_credit"), want),
	   "the team's total is its members' credit");
	totals_match_ledger("round 0");

	/* RAC: BOINC's update at grant time.  Round 0 (work over one day) set
	 * A's RAC to its credit per day; a week later round 1 adds more. */
	double w0 = credit_of(40);
	ok(near(sql_double("SELECT rac FROM host_credit WHERE host_id = %lld", A.id), w0),
	   "RAC after the first grant = credit / days of work (%.6f)", w0);
	member r1[] = { { &A, 50, 60, 10, 1 } };
	commit_round(1, "2030-01-08 00:00:00+00", r1, 1);
	double w1 = credit_of(40);
	double want_rac = w0 * 0.5 + 0.5 * w1 / 7;
	ok(near(sql_double("SELECT rac FROM host_credit WHERE host_id = %lld", A.id), want_rac),
	   "RAC a week later: avg * 1/2 + (1 - 1/2) * work / 7 days = %.9f", want_rac);
	th_sql("SET cotrain.now = '2030-01-15 00:00:00+00'");
	ok(near(sql_double("SELECT credit_rac_at(rac, rac_time, credit_now()) FROM host_credit"
	                   " WHERE host_id = %lld",
	                   A.id),
	        want_rac / 2),
	   "read a week later, RAC decayed to half");
	th_sql("SET cotrain.now = '2030-01-29 00:00:00+00'");
	ok(near(sql_double("SELECT credit_rac_at(rac, rac_time, credit_now()) FROM host_credit"
	                   " WHERE host_id = %lld",
	                   A.id),
	        want_rac / 8),
	   "read three weeks later, RAC decayed to an eighth");
	ok(near(sql_double("SELECT credit_rac_at(rac, rac_time, credit_now()) FROM account_credit"
	                   " WHERE account_id = %lld",
	                   A.account),
	        want_rac / 8),
	   "the account's RAC decays the same");
	th_sql("RESET cotrain.now");
	totals_match_ledger("round 1");
}

/* The gradient of microbatches [lo, hi) of a tiny model, summed over
 * samples; `data_seed` picks the tokens (a cheat computes other data). */
static float *range_gradient(long long lo, long long hi, unsigned data_seed, size_t *n)
{
	kern_config c = {
		.n_layer = 1, .n_shared = 1, .n_head = 2, .d_model = 16, .seq_len = 8, .vocab = 256, .d_ff = 64
	};
	kern_model *m;
	cot_errbuf eb = { 0 };
	if (kern_model_create(&c, MBS, &m, &eb))
		bail_out("could not create the model: %s", eb.msg);
	kern_model_init(m, 42);
	kern_zero_grad(m);
	int32_t tok[MBS * 8], tgt[MBS * 8];
	for (long long g = lo; g < hi; g++) {
		unsigned s = (unsigned)g * 2654435761u + data_seed;
		for (int i = 0; i < MBS * 8; i++) {
			s = s * 1103515245u + 12345u;
			tok[i] = (int32_t)((s >> 16) % 256);
		}
		for (int i = 0; i < MBS * 8; i++)
			tgt[i] = tok[(i + 1) % (MBS * 8)];
		float loss;
		if (kern_forward(m, tok, tgt, MBS, &loss, &eb) || kern_backward_scaled(m, MBS, &eb))
			bail_out("could not compute a gradient: %s", eb.msg);
	}
	*n = m->n_params;
	float *g = malloc(*n * sizeof *g);
	if (!g)
		bail_out("out of memory");
	memcpy(g, m->grads, *n * sizeof *g);
	kern_model_free(m);
	return g;
}

static th_resp call(const char *method, const char *path, const char *bearer, const char *body)
{
	th_resp r;
	if (!th_http(NULL, method, path, bearer, body, NULL, &r))
		bail_out("%s %s: transfer failed", method, path);
	return r;
}

/* POST host h's fingerprint of check (id, lo, hi, seed, k). */
static th_resp send_fp(const host *h, json_t *check, unsigned data_seed)
{
	long long id = json_integer_value(json_object_get(check, "id"));
	long long lo = json_integer_value(json_object_get(check, "lo"));
	long long hi = json_integer_value(json_object_get(check, "hi"));
	int k = (int)json_integer_value(json_object_get(check, "k"));
	uint64_t seed = (uint64_t)strtoll(json_string_value(json_object_get(check, "seed")), NULL, 10);
	size_t n;
	float *g = range_gradient(lo, hi, data_seed, &n);
	double fp[SPOT_K_MAX];
	spot_fingerprint_compute(g, n, seed, k, fp);
	free(g);
	json_t *vals = json_array();
	for (int j = 0; j < k; j++)
		json_array_append_new(vals, json_real(fp[j]));
	json_t *req = json_pack("{s:o}", "values", vals);
	char *body = json_dumps(req, JSON_COMPACT);
	json_decref(req);
	char path[80];
	snprintf(path, sizeof path, "/api/v1/spotchecks/%lld/fingerprint", id);
	th_resp r = call("POST", path, h->token, body);
	free(body);
	return r;
}

static json_t *own_check(const host *h)
{
	char path[80];
	snprintf(path, sizeof path, "/v1/hosts/%lld/spotchecks", h->id);
	th_resp r = call("GET", path, h->token, NULL);
	json_t *own = r.status == 200 ? json_object_get(r.json, "own") : NULL;
	json_t *c = own && json_array_size(own) == 1 ? json_incref(json_array_get(own, 0)) : NULL;
	if (!c)
		diag("spotchecks of host %lld: %ld %s", h->id, r.status, r.body);
	th_resp_free(&r);
	return c;
}

static void test_spot_checks(void)
{
	th_sql("UPDATE spot_policy SET first_rate = 1, k = 8 WHERE project_id = %lld", pid);
	double before = granted_sum();
	double a_before = host_total(&A);
	member r2[] = { { &A, 60, 63, 3, 1 }, { &C, 63, 66, 3, 1 } };
	commit_round(2, "2030-02-01 00:00:00+00", r2, 2);
	th_sql("RESET cotrain.now");
	ok(th_sql_int("SELECT count(*) FROM spot_check WHERE version = 2 AND state = 'open'") == 2 &&
	           th_sql_int("SELECT count(*) FROM credit_grant WHERE version = 2 AND status = 'pending'") ==
	                   2 &&
	           near(granted_sum(), before),
	   "checked hosts' grants stay pending while their checks are open");

	json_t *ca = own_check(&A), *cc = own_check(&C);
	ok(ca && cc, "each host lists the check of its own work, with seed and range");
	if (!ca || !cc)
		return;
	ok(json_integer_value(json_object_get(ca, "lo")) == 60 &&
	           json_integer_value(json_object_get(ca, "hi")) == 63 &&
	           json_integer_value(json_object_get(ca, "k")) == 8,
	   "the check covers the host's committed range [60, 63) with k = 8");

	th_resp r = call("POST", "/v1/projects/credit/spotchecks/claim", B.token, NULL);
	ok(r.status == 200 && th_json_int(&r, "id") == json_integer_value(json_object_get(ca, "id")),
	   "B claims the check of A's range");
	json_t *cb = r.json ? json_incref(r.json) : NULL;
	th_resp_free(&r);
	r = call("POST", "/v1/projects/credit/spotchecks/claim", D.token, NULL);
	ok(r.status == 200 && th_json_int(&r, "id") == json_integer_value(json_object_get(cc, "id")),
	   "D claims the check of C's range");
	json_t *cd = r.json ? json_incref(r.json) : NULL;
	th_resp_free(&r);
	r = call("POST", "/v1/projects/credit/spotchecks/claim", A.token, NULL);
	ok(r.status == 204, "with only its own work left, a host is given nothing to check (%ld)", r.status);
	th_resp_free(&r);
	if (!cb || !cd)
		return;

	r = send_fp(&D, ca, 1);
	ok(th_is_error(&r, 403, "forbidden", "a host that is neither side"),
	   "a stranger's fingerprint is refused");
	th_resp_free(&r);
	r = call("POST", "/v1/spotchecks/1/fingerprint", A.token, "{\"values\": [1, 2]}");
	ok(r.status == 400 || r.status == 403, "a fingerprint of the wrong length is refused (%ld)",
	   r.status);
	th_resp_free(&r);
	r = call("POST", "/v1/spotchecks/1/fingerprint", A.token,
	         "{\"values\": [1, 2, 3, 4, 5, 6, 7, \"x\"]}");
	ok(th_is_error(&r, 400, "invalid", "a non-number value"),
	   "a non-number value among k = 8 is refused");
	th_resp_free(&r);
	r = call("POST", "/v1/spotchecks/1/fingerprint", "not-a-valid-token-at-all", "{\"values\": [1]}");
	ok(r.status == 401, "a bad token is refused");
	th_resp_free(&r);

	/* A and its checker B computed the same range honestly. */
	r = send_fp(&A, ca, 0);
	ok(r.status == 200 && strcmp(th_json_str(&r, "state"), "open") == 0,
	   "A's fingerprint is stored; the check waits for the checker");
	th_resp_free(&r);
	r = send_fp(&A, ca, 0);
	ok(r.status == 200, "the same fingerprint again answers the same");
	th_resp_free(&r);
	r = send_fp(&A, ca, 9);
	ok(th_is_error(&r, 409, "conflict", "a different fingerprint"),
	   "a different fingerprint is a conflict");
	th_resp_free(&r);
	r = send_fp(&B, cb, 0);
	ok(r.status == 200 && strcmp(th_json_str(&r, "state"), "agreed") == 0,
	   "the checker's fingerprint agrees: %s", r.body);
	th_resp_free(&r);
	ok(near(host_total(&A), a_before + credit_of(12)), "A's pending credit is granted on agreement");
	ok(near(host_total(&B), credit_of(60) + credit_of(12)),
	   "the checker earns the credit of the range it recomputed");
	ok(th_sql_int("SELECT consecutive FROM host_check_record WHERE host_id = %lld", A.id) == 1,
	   "A's record of agreeing checks grows");

	/* C cheated: its fingerprint is of other data. */
	th_sql("INSERT INTO host_check_record (host_id, consecutive) VALUES (%lld, 5)", C.id);
	r = send_fp(&C, cc, 7);
	ok(r.status == 200, "C's fingerprint is stored");
	th_resp_free(&r);
	r = send_fp(&D, cd, 0);
	ok(r.status == 200 && strcmp(th_json_str(&r, "state"), "disagreed") == 0,
	   "the checker's fingerprint disagrees with C's: %s", r.body);
	th_resp_free(&r);
	ok(host_total(&C) == 0 &&
	           th_sql_int("SELECT count(*) FROM credit_grant WHERE host_id = %lld AND status = 'denied'",
	                      C.id) == 1,
	   "a host whose spot check disagrees gets nothing for that work");
	ok(th_sql_int("SELECT consecutive FROM host_check_record WHERE host_id = %lld", C.id) == 0,
	   "a disagreement resets the host's record");
	ok(host_total(&D) == 0, "the checker of a disagreeing check gets nothing either");
	ok(near(granted_sum(), before + credit_of(12) + credit_of(12)),
	   "the ledger grew by exactly A's round and B's check");

	/* A host that never answers its own check: denied at the deadline. */
	member r3[] = { { &A, 66, 70, 4, 1 } };
	commit_round(3, "2030-03-01 00:00:00+00", r3, 1);
	ok(th_sql_int("SELECT spot_expire('2030-03-01 12:00:00+00')") == 0,
	   "nothing expires before the deadline");
	ok(th_sql_int("SELECT spot_expire('2030-03-03 00:00:00+00')") == 1 &&
	           th_sql_int("SELECT count(*) FROM credit_grant WHERE host_id = %lld AND version = 3"
	                      " AND status = 'denied'",
	                      A.id) == 1,
	   "a check the host never answered expires and its credit is denied");
	th_sql("RESET cotrain.now");
	totals_match_ledger("after spot checks");
	json_decref(ca);
	json_decref(cc);
	json_decref(cb);
	json_decref(cd);
}

static void test_leaderboards(void)
{
	th_sql("UPDATE account SET name = '<b>x</b><script>alert(1)</script>' WHERE id = %lld", B.account);
	th_resp r = call("GET", "/api/v1/credit/users?limit=1", NULL, NULL);
	json_t *rows = json_object_get(r.json, "rows");
	ok(r.status == 200 && json_array_size(rows) == 1 && th_json_str(&r, "next"),
	   "a page of one user, with a cursor to the next");
	long long first = json_integer_value(json_object_get(json_array_get(rows, 0), "id"));
	ok(first == A.account, "the top user by total is A");
	char path[300];
	snprintf(path, sizeof path, "/api/v1/credit/users?limit=1&after=%s", th_json_str(&r, "next"));
	th_resp r2 = call("GET", path, NULL, NULL);
	json_t *row2 = json_array_get(json_object_get(r2.json, "rows"), 0);
	ok(r2.status == 200 && json_integer_value(json_object_get(row2, "id")) == B.account &&
	           json_integer_value(json_object_get(row2, "rank")) == 2,
	   "the next page starts after the cursor, ranked 2");
	const char *nm = json_string_value(json_object_get(row2, "name"));
	ok(nm && strcmp(nm, "<b>x</b><script>alert(1)</script>") == 0,
	   "the JSON carries the name as it was typed");
	th_resp_free(&r);
	th_resp_free(&r2);
	r = call("GET", "/api/v1/credit/users?limit=100", NULL, NULL);
	ok(r.status == 200 && json_array_size(json_object_get(r.json, "rows")) == 2 &&
	           json_is_null(json_object_get(r.json, "next")),
	   "the last page has no cursor");
	th_resp_free(&r);
	r = call("GET", "/api/v1/credit/hosts?order=rac", NULL, NULL);
	ok(r.status == 200 && json_array_size(json_object_get(r.json, "rows")) == 2, "hosts by RAC");
	th_resp_free(&r);
	r = call("GET", "/api/v1/credit/teams", NULL, NULL);
	ok(r.status == 200 && json_array_size(json_object_get(r.json, "rows")) == 1, "teams by total");
	th_resp_free(&r);

	static const char *const bad[] = {
		"/api/v1/credit/users?limit=0",
		"/api/v1/credit/users?limit=101",
		"/api/v1/credit/users?limit=abc",
		"/api/v1/credit/users?limit=99999999999999999999",
		"/api/v1/credit/users?order=name",
		"/api/v1/credit/users?after=x",
		"/api/v1/credit/users?after=1,2",
		"/api/v1/credit/users?after=nan,1,1",
		"/api/v1/credit/users?after=1,-2,1",
		"/api/v1/credit/users/0",
		"/api/v1/credit/users/abc",
		"/api/v1/projects/credit/dashboard?rounds=0",
		"/api/v1/projects/credit/dashboard?rounds=1001",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		r = call("GET", bad[i], NULL, NULL);
		ok(th_is_error(&r, 400, "invalid", bad[i]), "%s: 400 invalid", bad[i]);
		th_resp_free(&r);
	}
	r = call("GET", "/api/v1/credit/planets", NULL, NULL);
	ok(th_is_error(&r, 404, "not_found", "unknown leaderboard"), "an unknown leaderboard is 404");
	th_resp_free(&r);
	r = call("GET", "/api/v1/credit/users/99999999", NULL, NULL);
	ok(th_is_error(&r, 404, "not_found", "unknown user"), "an unknown user is 404");
	th_resp_free(&r);

	snprintf(path, sizeof path, "/api/v1/credit/users/%lld", A.account);
	r = call("GET", path, NULL, NULL);
	ok(r.status == 200 && json_array_size(json_object_get(r.json, "hosts")) == 1 &&
	           json_array_size(json_object_get(r.json, "grants")) == 4 && !strstr(r.body, "@example.org"),
	   "a user's page: hosts and grants, and no email");
	th_resp_free(&r);
	snprintf(path, sizeof path, "/api/v1/credit/hosts/%lld", C.id);
	r = call("GET", path, NULL, NULL);
	ok(r.status == 200 && strstr(r.body, "\"denied\"") && strstr(r.body, "disagreed"),
	   "a host's page explains its denied grant");
	th_resp_free(&r);
	snprintf(path, sizeof path, "/v1/credit/teams/%lld",
	         th_sql_int("SELECT id FROM team WHERE name = 'credit team'"));
	r = call("GET", path, NULL, NULL);
	ok(r.status == 200 && json_array_size(json_object_get(r.json, "members")) == 2,
	   "a team's page lists its members");
	th_resp_free(&r);

	r = call("GET", "/api/v1/projects/credit/dashboard", NULL, NULL);
	ok(r.status == 200 && json_array_size(json_object_get(r.json, "rounds")) == 5 &&
	           th_json_int(&r, "current_version") == 4,
	   "the dashboard JSON has every round");
	th_resp_free(&r);
}

static void test_pages_and_metrics(void)
{
	th_resp r = call("GET", "/", NULL, NULL);
	ok(r.status == 200 && strstr(r.content_type, "text/html") && strstr(r.body, "/static/app.js"),
	   "/ is the project page");
	th_resp_free(&r);
	static const char *const pages[] = { "/dashboard",     "/leaderboard",     "/user", "/team", "/host",
		                             "/static/app.js", "/static/style.css" };
	for (size_t i = 0; i < sizeof pages / sizeof pages[0]; i++) {
		r = call("GET", pages[i], NULL, NULL);
		ok(r.status == 200, "%s is served", pages[i]);
		th_resp_free(&r);
	}
	r = call("GET", "/static/nothing.js", NULL, NULL);
	ok(r.status == 404 && r.json, "an unknown static file is a JSON 404");
	th_resp_free(&r);
	r = call("POST", "/", NULL, "{}");
	ok(r.status == 404 || r.status == 405, "POST / is refused");
	th_resp_free(&r);

	/* The CSP header: through curl's command line, the harness keeps only a few headers. */
	char cmd[512];
	snprintf(cmd, sizeof cmd,
	         "curl -s -o /dev/null -D - '%s/leaderboard' | grep -qi "
	         "'^content-security-policy:.*script-src .self.'",
	         th_url());
	ok(system(cmd) == 0, "pages carry a Content-Security-Policy allowing only the site's scripts");

	r = call("GET", "/metrics", NULL, NULL);
	ok(r.status == 200 && strstr(r.content_type, "text/plain") &&
	           strstr(r.body, "cotrain_rounds_committed_total{project=\"credit\"} 4") &&
	           strstr(r.body, "cotrain_samples_committed_total{project=\"credit\"}") &&
	           strstr(r.body, "cotrain_active_hosts{project=\"credit\"}") &&
	           strstr(r.body, "cotrain_http_request_duration_seconds_bucket{le=\"+Inf\"}"),
	   "/metrics has rounds, samples, active hosts and the latency histogram");
	th_resp_free(&r);
}

static void test_export(void)
{
	const char *bd = getenv("top_builddir");
	char dir[] = "/tmp/cotrain-stats-XXXXXX";
	if (!bd || !mkdtemp(dir)) {
		ok(false, "could not set up the export");
		return;
	}
	/* The credit of the four users; then a disabled account with credit of
	 * its own, which the export leaves out, totals included. */
	double total = sql_double("SELECT sum(total) FROM account_credit");
	th_sql("WITH a AS (INSERT INTO account (email, name, password_hash, cross_project_id, disabled)"
	       " VALUES ('gone@example.org', 'gone', 'x', 'x', true) RETURNING id)"
	       " INSERT INTO account_credit (account_id, total) SELECT id, 1000 FROM a");
	char cmd[2048];
	snprintf(cmd, sizeof cmd, "'%s/server/cotrain-admin' --db '%s' export stats '%s/out' >/dev/null", bd,
	         pgtmp_conninfo(), dir);
	ok(system(cmd) == 0, "cotrain-admin export stats writes the export");
	/* BOINC's db_dump leaves out users and hosts without credit, and
	 * disabled accounts. */
	int nusers =
	        (int)sql_double("SELECT count(*) FROM account_credit c JOIN account a ON a.id = c.account_id"
	                        " WHERE c.total > 0 AND NOT a.disabled");
	int nhosts = (int)sql_double("SELECT count(*) FROM host_credit WHERE total > 0");
	char *email = NULL;
	PGresult *pr = PQexec(th_db(), "SELECT md5(cross_project_id || lower(email)), id FROM account"
	                               " WHERE name LIKE '<b>%'");
	if (PQntuples(pr) == 1)
		email = strdup(PQgetvalue(pr, 0, 0));
	PQclear(pr);
	snprintf(cmd, sizeof cmd,
	         "python3 - '%s/out' '%.17g' '%s' %d %d <<'EOF'\n"
	         "import gzip, sys, xml.etree.ElementTree as ET\n"
	         "d, total, cpid = sys.argv[1], float(sys.argv[2]), sys.argv[3]\n"
	         "nusers, nhosts = int(sys.argv[4]), int(sys.argv[5])\n"
	         "t = ET.parse(d + '/tables.xml').getroot()\n"
	         "u = ET.fromstring(gzip.open(d + '/user.gz').read())\n"
	         "tm = ET.fromstring(gzip.open(d + '/team.gz').read())\n"
	         "h = ET.fromstring(gzip.open(d + '/host.gz').read())\n"
	         "users = u.findall('user')\n"
	         "assert int(t.find('nusers_total').text) == len(users) == nusers, 'users'\n"
	         "assert int(t.find('nteams_total').text) == len(tm.findall('team')) == 1, 'teams'\n"
	         "assert int(t.find('nhosts_total').text) == len(h.findall('host')) == nhosts, 'hosts'\n"
	         "s = sum(float(x.find('total_credit').text) for x in users)\n"
	         "eps = 5e-7 * (len(users) + 1) + 1e-9 * total  # %%f: six decimals, as BOINC writes\n"
	         "assert abs(s - total) < eps and abs(float(t.find('total_credit').text) - total) < eps, "
	         "'total'\n"
	         "hs = sum(float(x.find('total_credit').text) for x in h.findall('host'))\n"
	         "assert abs(hs - total) < 5e-7 * (len(h.findall('host')) + 1) + 1e-9 * total, 'host total'\n"
	         "b = [x for x in users if x.find('name').text.startswith('<b>')]\n"
	         "assert len(b) == 1 and b[0].find('name').text == '<b>x</b><script>alert(1)</script>', "
	         "'name'\n"
	         "assert b[0].find('cpid').text == cpid, 'cpid'\n"
	         "EOF",
	         dir, total, email ? email : "", nusers, nhosts);
	ok(system(cmd) == 0,
	   "the export parses as XML: counts, total credit %.6f (a disabled account's left out), the cpid, a "
	   "hostile name intact",
	   total);
	if (system("command -v xmllint >/dev/null 2>&1") == 0) {
		snprintf(cmd, sizeof cmd, "xmllint --noout '%s/out/tables.xml'", dir);
		ok(system(cmd) == 0, "xmllint accepts tables.xml");
	} else {
		skip(1, "xmllint is not installed (Debian package libxml2-utils)");
	}
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd))
		diag("could not remove %s", dir);
	free(email);
}

/* The made-up sketch value j of stream microbatch g computed by "data"
 * honest (0) or not: what the host commits and a checker recomputes. */
static double mb_sketch(long long g, int j, int data)
{
	return sin((double)g * 7 + j + data * 100) * (1 + j);
}

/* Commit round `version` like commit_round, each member's work unit with
 * the sketches of its microbatches (k 4, mb_sketch with data 0). */
static void commit_sketched_round(int version, const char *now, const member *m, int n)
{
	th_sql("INSERT INTO round (project_id, version) VALUES (%lld, %d) ON CONFLICT DO NOTHING", pid,
	       version);
	sketch_units = true;
	commit_round(version, now, m, n);
	sketch_units = false;
	th_sql("RESET cotrain.now");
}

/* POST h's sketches of check's microbatches (data 0: honest; noise: a
 * relative perturbation, as another thread count or BLAS gives). */
static th_resp send_sketches(const host *h, json_t *check, int data, double noise)
{
	json_t *mbs = json_object_get(check, "microbatches");
	json_t *vals = json_array();
	for (size_t i = 0; i < json_array_size(mbs); i++)
		for (int j = 0; j < 4; j++)
			json_array_append_new(vals,
			                      json_real(mb_sketch(json_integer_value(json_array_get(mbs, i)),
			                                          j, data) *
			                                (1 + noise * ((j & 1) ? 1 : -1))));
	json_t *req = json_pack("{s:o}", "values", vals);
	char *body = json_dumps(req, JSON_COMPACT);
	json_decref(req);
	char path[80];
	snprintf(path, sizeof path, "/api/v1/spotchecks/%lld/fingerprint",
	         (long long)json_integer_value(json_object_get(check, "id")));
	th_resp r = call("POST", path, h->token, body);
	free(body);
	return r;
}

static json_t *claim(const host *h, long *status)
{
	th_resp r = call("POST", "/v1/projects/credit/spotchecks/claim", h->token, NULL);
	*status = r.status;
	json_t *c = r.status == 200 && r.json ? json_incref(r.json) : NULL;
	th_resp_free(&r);
	return c;
}

/* Claim checks for h until it is handed one of round `version` (returned)
 * or nothing (NULL); checks of other rounds are answered honestly. */
static json_t *claim_version(const host *h, int version)
{
	for (int i = 0; i < 20; i++) {
		long st;
		json_t *c = claim(h, &st);
		if (!c || json_integer_value(json_object_get(c, "version")) == version)
			return c;
		th_resp x = send_sketches(h, c, 0, 0);
		th_resp_free(&x);
		json_decref(c);
	}
	return NULL;
}

static const char *check_state(json_t *c)
{
	static char st[32];
	char q[200];
	snprintf(q, sizeof q,
	         "SELECT state || CASE WHEN disputed_at IS NOT NULL AND state = 'open' THEN '/disputed'"
	         " ELSE '' END FROM spot_check WHERE id = %lld",
	         (long long)json_integer_value(json_object_get(c, "id")));
	PGresult *r = PQexec(th_db(), q);
	snprintf(st, sizeof st, "%s", PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "?");
	PQclear(r);
	return st;
}

static void test_sketch_checks(void)
{
	th_sql("UPDATE spot_policy SET first_rate = 1, k = 4, microbatches = 2, tolerance = 1e-3"
	       " WHERE project_id = %lld",
	       pid);
	th_sql("DELETE FROM host_check_record");
	/* Round 40: A, C and D, each checked on 2 of its microbatches. */
	member r[] = { { &A, 400, 405, 5, 1 }, { &C, 405, 410, 5, 1 }, { &D, 410, 415, 5, 1 } };
	commit_sketched_round(40, "2031-01-01 00:00:00+00", r, 3);
	ok(th_sql_int("SELECT count(*) FROM spot_check WHERE version = 40 AND cardinality(microbatches) = 2"
	              " AND fp_host IS NOT NULL AND samples = 2 * %d",
	              MBS) == 3,
	   "each host's check names 2 of its microbatches, its committed sketches already its answer");
	ok(th_sql_int("SELECT count(*) FROM spot_check c, unnest(c.microbatches) WITH ORDINALITY m(g, i),"
	              " generate_series(1, 4) j, work_unit_sketch ws"
	              " WHERE c.version = 40 AND ws.work_unit_id = c.work_unit_id"
	              " AND c.fp_host[(i - 1) * 4 + j] = ws.sketches[(g - c.lo) * 4 + j]") == 3 * 2 * 4,
	   "the check's host values are the committed sketches of exactly those microbatches");
	ok(th_sql_int("SELECT count(*) FROM spot_check WHERE version = 40 AND seed = spot_sketch_seed(%lld, "
	              "40)",
	              pid) == 3,
	   "the checks carry the round's sketch seed");

	/* Pending credit beside the totals: A's grant of round 40 waits. */
	char path[80];
	snprintf(path, sizeof path, "/api/v1/credit/hosts/%lld", A.id);
	th_resp pr = call("GET", path, NULL, NULL);
	double pend = pr.json ? json_number_value(json_object_get(pr.json, "pending_credit")) : -1;
	ok(near(pend,
	        sql_double("SELECT sum(credit) FROM credit_grant WHERE host_id = %lld AND status = 'pending'",
	                   A.id)) &&
	           pend >= credit_of(20) - 1e-12,
	   "the host's pending credit is in its API answer (%g)", pend);
	th_resp_free(&pr);
	pr = call("GET", "/api/v1/credit/users?limit=10", NULL, NULL);
	json_t *rows = pr.json ? json_object_get(pr.json, "rows") : NULL;
	int with_pending = 0, right = json_array_size(rows) > 0;
	for (size_t i = 0; i < json_array_size(rows); i++) {
		json_t *row = json_array_get(rows, i);
		double p = json_number_value(json_object_get(row, "pending_credit"));
		with_pending += p > 0;
		right &= near(p, sql_double("SELECT credit_pending_account(%lld)",
		                            (long long)json_integer_value(json_object_get(row, "id"))));
	}
	ok(right && with_pending >= 1,
	   "each row of the users' leaderboard shows its pending credit (%d with some)", with_pending);
	th_resp_free(&pr);
	long st;
	json_t *c1 = claim(&B, &st);
	ok(c1 && json_array_size(json_object_get(c1, "microbatches")) == 2,
	   "B claims a check and is told its 2 microbatches (%ld)", st);
	if (!c1)
		return;
	long long h1 = th_sql_int("SELECT host_id FROM spot_check WHERE id = %lld",
	                          (long long)json_integer_value(json_object_get(c1, "id")));
	th_resp x = send_sketches(&B, c1, 0, 2e-5);
	ok(x.status == 200 && strcmp(th_json_str(&x, "state"), "agreed") == 0,
	   "sketches within 2e-5 of the committed ones agree: %s", x.body);
	th_resp_free(&x);
	x = call("POST", "/v1/spotchecks/1/fingerprint", B.token, "{\"values\": [1, 2, 3, 4]}");
	th_resp_free(&x);

	/* The next check: B answers it with other data; a dispute. */
	json_t *c2 = claim(&B, &st);
	ok(c2 != NULL, "B claims a second check (%ld)", st);
	if (!c2)
		return;
	long long h2 = th_sql_int("SELECT host_id FROM spot_check WHERE id = %lld",
	                          (long long)json_integer_value(json_object_get(c2, "id")));
	x = send_sketches(&B, c2, 1, 0);
	ok(x.status == 200 && strcmp(check_state(c2), "open/disputed") == 0,
	   "a checker that disagrees opens a dispute, nothing is decided yet (%s)", check_state(c2));
	th_resp_free(&x);
	/* The third: not the checked host, not the checker, nor a host the
	 * checked host checked shortly before. */
	host *hosts[] = { &A, &C, &D };
	host *third = NULL;
	for (int i = 0; i < 3; i++)
		if (hosts[i]->id != h2 && !third) {
			json_t *c3 = claim(hosts[i], &st);
			if (c3 && json_integer_value(json_object_get(c3, "id")) ==
			                  json_integer_value(json_object_get(c2, "id")))
				third = hosts[i];
			json_decref(c3);
		}
	ok(third != NULL, "another host is handed the disputed check as its third");
	if (third) {
		x = send_sketches(third, c2, 0, -3e-5);
		ok(x.status == 200 && strcmp(th_json_str(&x, "state"), "agreed") == 0,
		   "the third agrees with the committed sketches: the host wins (%s)", x.body);
		th_resp_free(&x);
		ok(th_sql_int("SELECT consecutive FROM host_check_record WHERE host_id = %lld", B.id) == 0 &&
		           th_sql_int("SELECT n_disagreed FROM host_check_record WHERE host_id = %lld",
		                      B.id) == 1,
		   "the checker that disagreed loses its record");
		ok(th_sql_int("SELECT count(*) FROM credit_grant WHERE version = 40 AND host_id = %lld"
		              " AND status = 'granted' AND kind = 'round'",
		              h2) == 1,
		   "the host's credit is granted");
	}
	/* Round 41: h1 again.  B answered its last check, so B is not handed
	 * this one; another host is. */
	host *h1p = h1 == A.id ? &A : h1 == C.id ? &C : &D;
	member r41[] = { { h1p, 415, 420, 5, 1 } };
	commit_sketched_round(41, "2031-01-02 00:00:00+00", r41, 1);
	json_t *c4 = claim_version(&B, 41);
	ok(!c4,
	   "the checker of a host's last check is not handed its next: no host vouches for another twice "
	   "in a row");
	json_decref(c4);
	host *other = h1p == &A ? &C : &A;
	c4 = claim_version(other, 41);
	ok(c4 != NULL, "another host is handed it");
	if (c4) {
		x = send_sketches(other, c4, 0, 0);
		th_resp_free(&x);
	}
	json_decref(c4);

	/* Round 42: three different answers deny the host. */
	member r42[] = { { &D, 420, 425, 5, 1 } };
	commit_sketched_round(42, "2031-01-03 00:00:00+00", r42, 1);
	json_t *c5 = claim_version(&A, 42);
	json_t *c6 = NULL;
	if (c5) {
		x = send_sketches(&A, c5, 1, 0);
		th_resp_free(&x);
		c6 = claim_version(&C, 42);
	}
	ok(c5 && c6 &&
	           json_integer_value(json_object_get(c5, "id")) ==
	                   json_integer_value(json_object_get(c6, "id")),
	   "after A disputes D's check, C is its third");
	if (c6) {
		x = send_sketches(&C, c6, 2, 0);
		ok(x.status == 200 && strcmp(th_json_str(&x, "state"), "disagreed") == 0 &&
		           th_sql_int("SELECT count(*) FROM credit_grant WHERE version = 42 AND host_id = "
		                      "%lld"
		                      " AND status = 'denied'",
		                      D.id) == 1,
		   "host, checker and third all differ: a tie denies the host (%s)", x.body);
		th_resp_free(&x);
	}
	json_decref(c5);
	json_decref(c6);

	/* Round 43: A disputed, no third before the deadline: the server's
	 * expiry denies it. */
	member r43[] = { { &A, 425, 430, 5, 1 } };
	commit_sketched_round(43, "2031-01-04 00:00:00+00", r43, 1);
	host *checkers[] = { &B, &C, &D };
	json_t *c7 = NULL;
	for (int i = 0; i < 3 && !c7; i++)
		if ((c7 = claim_version(checkers[i], 43))) {
			x = send_sketches(checkers[i], c7, 1, 0);
			th_resp_free(&x);
		}
	ok(c7 && th_sql_int("SELECT spot_expire('2031-03-01 00:00:00+00')") >= 1 &&
	           th_sql_int("SELECT count(*) FROM credit_grant WHERE version = 43 AND host_id = %lld"
	                      " AND status = 'denied'",
	                      A.id) == 1,
	   "a dispute no third host settled by the deadline denies the host");
	json_decref(c7);
	th_sql("RESET cotrain.now");
	json_decref(c1);
	json_decref(c2);
}

/* Which unit a check names: over 200 rounds in which B computed a unit of
 * 1 microbatch and one of 19, checked every round, the small one is named
 * about 1 time in 20 (10 expected; 100 were the two units drawn alike). */
static void test_check_sizing(void)
{
	th_sql("SET cotrain.now = '2032-01-01 00:00:00+00'");
	th_sql("UPDATE spot_policy SET first_rate = 1, trusted_after = 1000000, k = 1, microbatches = 1"
	       " WHERE project_id = %lld",
	       pid);
	th_sql("DO $$ DECLARE v integer; BEGIN"
	       " FOR v IN 2000..2199 LOOP"
	       "  INSERT INTO round (project_id, version) VALUES (%lld, v) ON CONFLICT DO NOTHING;"
	       "  INSERT INTO work_unit (project_id, host_id, version, lo, hi, mb_done, state, deadline)"
	       "   VALUES (%lld, %lld, v, v * 100, v * 100 + 1, 1, 'returned', now()),"
	       "          (%lld, %lld, v, v * 100 + 1, v * 100 + 20, 19, 'returned', now());"
	       "  INSERT INTO work_unit_sketch (work_unit_id, k, sketches)"
	       "   SELECT id, 1, array_fill(1.0::double precision, ARRAY[mb_done::integer]) FROM work_unit"
	       "    WHERE project_id = %lld AND version = v;"
	       "  INSERT INTO round_member (project_id, version, host_id, group_id, samples, endpoint,"
	       "   bandwidth, can_aggregate, lo, hi, outcome, params_sha256, accepted)"
	       "   VALUES (%lld, v, %lld, 0, 20 * %d, '127.0.0.1:1', 1e6, true, 0, 0, 'ok', 'good', true);"
	       "  UPDATE round SET state = 'committed', committed_at = now(), samples = 20 * %d"
	       "   WHERE project_id = %lld AND version = v;"
	       " END LOOP; END $$",
	       pid, pid, B.id, pid, B.id, pid, pid, B.id, MBS, MBS, pid);
	long long n = th_sql_int("SELECT count(*) FROM spot_check WHERE version BETWEEN 2000 AND 2199");
	long long small =
	        th_sql_int("SELECT count(*) FROM spot_check c JOIN work_unit w ON w.id = c.work_unit_id"
	                   " WHERE c.version BETWEEN 2000 AND 2199 AND w.mb_done = 1");
	ok(n == 200 && small <= 30,
	   "a check names a unit in proportion to its microbatches: the 1-microbatch unit %lld times in "
	   "%lld checks (10 expected)",
	   small, n);
	th_sql("RESET cotrain.now");
}

int main(void)
{
	plan_lazy();
	th_start(NULL);
	pid = th_seed_project("credit", 180, FPS, MBS, 8, 4, 100000);
	new_host(&A, "alice");
	new_host(&B, "bob");
	new_host(&C, "carol");
	new_host(&D, "dave");
	test_ledger();
	test_spot_checks();
	test_leaderboards();
	test_pages_and_metrics();
	test_export();
	test_sketch_checks();
	ok(near(sql_double("SELECT coalesce(sum(total), 0) FROM host_credit"), granted_sum()),
	   "after sketch checks: host totals add up to the granted ledger");
	test_check_sizing();
	done_testing();
	return exit_status();
}
