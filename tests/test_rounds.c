/* cotrain tests: a training round on the real cotrain-server and real
 * PostgreSQL: the project CA and host certificates, a round that fills and
 * closes, reports that return the unprocessed rest to the pool (the stream
 * stays exactly tiled), a host that never reports dropped at the report
 * deadline, the plan (groups, shares), the outcomes (committing needs the
 * server's own step: tests/test_round_step.c), the straggler rule, and hostile requests that change nothing. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "shared/peer/pki.h"
#include "tests/tap.h"
#include "tests/test_server_harness.h"

static void report_body(char *out, size_t n, long long mb_done, long long samples, int port, bool agg,
                        const char *rtt)
{
	snprintf(out, n,
	         "{\"mb_done\": %lld, \"samples\": %lld, \"endpoint\": \"192.0.2.%d:7070\","
	         " \"bandwidth\": %d, \"can_aggregate\": %s, \"rtt\": %s}",
	         mb_done, samples, port, 1000000 * port, agg ? "true" : "false", rtt);
}

static th_host A, B, C, D, E;

static void test_certificates(void)
{
	th_resp r = th_call("GET", "/v1/projects/r1/ca", NULL, NULL, 200, "project CA");
	const char *pem = th_json_str(&r, "certificate");
	ok(pem && strstr(pem, "-----BEGIN CERTIFICATE-----"), "the CA certificate is PEM");
	char *ca = strdup(pem ? pem : "");
	th_resp_free(&r);
	char path[256];
	struct stat st;
	snprintf(path, sizeof path, "%s/ca/r1.key", th_data_dir());
	ok(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600, "the CA key is kept with mode 0600");
	r = th_call("GET", "/v1/projects/r1/ca", NULL, NULL, 200, "project CA again");
	is_str(th_json_str(&r, "certificate"), ca, "the same CA the second time");
	th_resp_free(&r);
	th_refused("GET", "/v1/projects/nope/ca", NULL, NULL, 404, "not_found", "CA of an unknown project");
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
	r = th_call("POST", path, A.token, body, 200, "host certificate");
	const char *cert = th_json_str(&r, "certificate");
	pki_trust *t = NULL;
	int64_t who = 0;
	ok(cert && !pki_trust_new(ca, strlen(ca), "r1", &t, &eb) &&
	           !pki_trust_verify_pem(t, cert, strlen(cert), time(NULL), &who, &eb) && who == A.id,
	   "the certificate is signed by the project CA for host %lld (%s)", A.id, eb.msg);
	is_str(th_json_str(&r, "ca_certificate"), ca, "the answer carries the CA certificate");
	pki_trust_free(t);
	th_resp_free(&r);

	th_refused("POST", path, B.token, body, 403, "forbidden", "certificate for another host's id");
	th_refused("POST", path, NULL, body, 401, "unauthorized", "certificate without a token");
	th_refused("POST", path, A.token,
	           "{\"public_key\": \"-----BEGIN PUBLIC KEY-----\\ngarbage\\n-----END PUBLIC KEY-----\\n\", "
	           "\"project\": \"r1\"}",
	           400, "invalid", "certificate for a bad PEM");
	th_refused("POST", path, A.token, "{\"public_key\": \"not a key\", \"project\": \"r1\"}", 400,
	           "invalid", "certificate for a non-PEM key");
	th_refused("POST", path, A.token, "{\"project\": \"r1\"}", 400, "invalid",
	           "certificate without a key");
	b = json_pack("{s:s, s:s}", "public_key", pub, "project", "nope");
	char *body2 = json_dumps(b, JSON_COMPACT);
	json_decref(b);
	th_refused("POST", path, A.token, body2, 404, "not_found", "certificate for an unknown project");
	free(body2);
	free(body);
	free(key);
	free(pub);
	free(ca);
}

/* GET the plan of round `version` of r1 for h; the status is checked. */
static th_resp get_plan(th_host *h, long long version, long status)
{
	char path[128];
	snprintf(path, sizeof path, "/v1/projects/r1/rounds/%lld/plan?host_id=%lld", version, h->id);
	return th_call("GET", path, h->token, NULL, status, "plan");
}

/* POST .../rounds/0/group_sum of r1 with query q by h: refused with status
 * and code, nothing changed. */
static void sum_refused(th_host *h, const char *q, const float *g, size_t n, long status, const char *code,
                        const char *what)
{
	size_t len = strlen(q) + 128;
	char *path = malloc(len);
	snprintf(path, len, "/v1/projects/r1/rounds/0/group_sum?%s", q);
	th_raw_refused(path, h->token, g, n * sizeof *g, status, code, what);
	free(path);
}

/* POST path with a chunked body of n zero bytes (no Content-Length) by
 * token; the status of the answer and its first bytes in msg. */
static int chunked_post(const char *path, const char *token, size_t n, char *msg, size_t msglen)
{
	const char *u = th_url(), *colon = strrchr(u, ':');
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1)) };
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	int fd = socket(AF_INET, SOCK_STREAM, 0), status = 0;
	char head[1024];
	int hl = snprintf(head, sizeof head,
	                  "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
	                  "Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
	                  path, token);
	static char zeros[65536];
	bool sent = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
	            write(fd, head, (size_t)hl) == hl;
	for (size_t left = n; sent && left > 0;) {
		size_t k = left < sizeof zeros ? left : sizeof zeros;
		char ch[32];
		int cl = snprintf(ch, sizeof ch, "%zx\r\n", k);
		sent = write(fd, ch, (size_t)cl) == cl && write(fd, zeros, k) == (ssize_t)k &&
		       write(fd, "\r\n", 2) == 2;
		left -= k;
	}
	if (sent && write(fd, "0\r\n\r\n", 5) == 5) {
		char buf[2048];
		ssize_t k = read(fd, buf, sizeof buf - 1);
		if (k > 0) {
			buf[k] = '\0';
			sscanf(buf, "HTTP/1.%*d %d", &status);
			const char *b = strstr(buf, "\r\n\r\n");
			snprintf(msg, msglen, "%s", b ? b + 4 : "");
		}
	}
	if (fd >= 0)
		close(fd);
	return status;
}

/* Hostile or wrong group sums on round 0 of r1, whose plan has A and B in
 * two groups and C (16 samples) in one of them: each is refused before
 * anything is kept. */
static void group_sum_refusals(const long long group_of[3])
{
	th_host *u = group_of[2] == group_of[0] ? &A : &B; /* C's group */
	long long su = u == &A ? 24 : 16;
	float *g = calloc(TH_PARAMS + 1, sizeof *g);
	char q[512];
	snprintf(q, sizeof q, "host_id=%lld&samples=%lld&included=abc", u->id, su);
	sum_refused(u, q, g, TH_PARAMS, 400, "invalid", "included=abc");
	snprintf(q, sizeof q, "host_id=%lld&samples=%lld&included=%lld,%lld", u->id, su, u->id, u->id);
	sum_refused(u, q, g, TH_PARAMS, 400, "invalid", "a host included twice");
	snprintf(q, sizeof q, "host_id=%lld&samples=%lld&included=%lld,%lld", u->id, su + 16,
	         u->id > C.id ? u->id : C.id, u->id > C.id ? C.id : u->id);
	sum_refused(u, q, g, TH_PARAMS, 400, "invalid", "included hosts out of order");
	snprintf(q, sizeof q, "host_id=%lld&samples=%lld&included=", u->id, su);
	sum_refused(u, q, g, TH_PARAMS, 400, "invalid", "an empty included list");
	snprintf(q, sizeof q, "host_id=%lld&samples=%lld", u->id, su);
	sum_refused(u, q, g, TH_PARAMS, 400, "invalid", "no included list");
	snprintf(q, sizeof q, "host_id=%lld&samples=%lld&included=%lld,", u->id, su, u->id);
	sum_refused(u, q, g, TH_PARAMS, 400, "invalid", "a trailing comma");
	snprintf(q, sizeof q, "host_id=%lld&samples=%lld&included=0%lld", u->id, su, u->id);
	sum_refused(u, q, g, TH_PARAMS, 400, "invalid", "a host id with a leading zero");
	snprintf(q, sizeof q, "host_id=%lld&samples=%lld&included=-%lld", u->id, su, u->id);
	sum_refused(u, q, g, TH_PARAMS, 400, "invalid", "a negative host id");
	/* 5000 ascending ids: more than a group can hold. */
	size_t cap = 5000 * 12 + 128;
	char *huge = malloc(cap);
	size_t o = (size_t)snprintf(huge, cap, "host_id=%lld&samples=%lld&included=", u->id, su);
	for (int i = 1; i <= 5000; i++)
		o += (size_t)snprintf(huge + o, cap - o, "%s%d", i > 1 ? "," : "", i);
	sum_refused(u, huge, g, TH_PARAMS, 400, "invalid", "a list of 5000 hosts");
	free(huge);
	th_host *other = u == &A ? &B : &A;
	snprintf(q, sizeof q, "host_id=%lld&samples=%lld&included=%lld,%lld", u->id, 40LL, A.id, B.id);
	sum_refused(u, q, g, TH_PARAMS, 400, "invalid", "a host of another group included");
	snprintf(q, sizeof q, "host_id=%lld&samples=%lld&included=%lld,%lld", u->id, su, A.id, B.id);
	sum_refused(u, q, g, TH_PARAMS, 400, "invalid",
	            "a host of another group included, with the samples of this group's alone");
	snprintf(q, sizeof q, "host_id=%lld&samples=16&included=%lld", u->id, C.id);
	sum_refused(u, q, g, TH_PARAMS, 400, "invalid", "a sum that leaves the uploader out");
	snprintf(q, sizeof q, "host_id=%lld&samples=%lld&included=%lld", u->id, su + 1, u->id);
	sum_refused(u, q, g, TH_PARAMS, 400, "invalid", "samples that are not the included hosts' total");
	snprintf(q, sizeof q, "host_id=%lld&samples=%lld&included=%lld", u->id, su - 1, u->id);
	sum_refused(u, q, g, TH_PARAMS, 400, "invalid", "samples one short of the included hosts' total");
	snprintf(q, sizeof q, "host_id=%lld&samples=0&included=%lld", u->id, u->id);
	sum_refused(u, q, g, TH_PARAMS, 400, "invalid", "samples=0");
	snprintf(q, sizeof q, "host_id=%lld&samples=%lld&included=%lld", other->id, su, u->id);
	sum_refused(u, q, g, TH_PARAMS, 403, "forbidden", "another host's id");
	snprintf(q, sizeof q, "host_id=%lld&samples=16&included=%lld", E.id, E.id);
	sum_refused(&E, q, g, TH_PARAMS, 409, "conflict", "a host that is not in the plan");
	snprintf(q, sizeof q, "host_id=%lld&samples=16&included=%lld", D.id, D.id);
	sum_refused(&D, q, g, TH_PARAMS, 409, "conflict", "a host dropped from the plan");
	snprintf(q, sizeof q, "host_id=%lld&samples=%lld&included=%lld", u->id, su, u->id);
	sum_refused(u, q, g, TH_PARAMS - 1, 400, "invalid", "a short sum (refused by Content-Length)");
	sum_refused(u, q, g, TH_PARAMS + 1, 413, "too_large", "a long sum (refused by Content-Length)");
	/* Chunked, the length is unknown until the end: the body is cut at the
	 * exact size the round expects, not at the route's 1 GiB. */
	char cpath[600], cmsg[600] = "";
	snprintf(cpath, sizeof cpath, "/v1/projects/r1/rounds/0/group_sum?%s", q);
	int cst = chunked_post(cpath, u->token, TH_PARAMS * sizeof(float) + 8192, cmsg, sizeof cmsg);
	char want[64];
	snprintf(want, sizeof want, "larger than %zu bytes", TH_PARAMS * sizeof(float));
	ok(cst == 413 && strstr(cmsg, want), "a long chunked sum: 413 at the round's exact size (%d %s)", cst,
	   cmsg);
	/* Each way a float is not finite, at the start, inside and at the end. */
	static const struct {
		float v;
		int at;
		const char *what;
	} nonfinite[] = {
		{ INFINITY, 7, "a sum holding +Inf" },
		{ -INFINITY, 0, "a sum holding -Inf" },
		{ NAN, TH_PARAMS - 1, "a sum holding NaN (last value)" },
		{ -NAN, 3, "a sum holding -NaN" },
	};
	for (size_t i = 0; i < sizeof nonfinite / sizeof nonfinite[0]; i++) {
		float keep = g[nonfinite[i].at];
		g[nonfinite[i].at] = nonfinite[i].v;
		sum_refused(u, q, g, TH_PARAMS, 400, "invalid", nonfinite[i].what);
		g[nonfinite[i].at] = keep;
	}
	char path[800];
	snprintf(path, sizeof path, "/v1/projects/r1/rounds/9/group_sum?%s", q);
	th_raw_refused(path, u->token, g, TH_PARAMS * sizeof *g, 404, "not_found", "an unknown round");
	snprintf(path, sizeof path, "/v1/projects/nope/rounds/0/group_sum?%s", q);
	th_raw_refused(path, u->token, g, TH_PARAMS * sizeof *g, 404, "not_found", "an unknown project");
	snprintf(path, sizeof path, "/v1/projects/r1/rounds/0/gradient?host_id=%lld&samples=56", u->id);
	th_raw_refused(path, u->token, g, TH_PARAMS * sizeof *g, 404, "not_found",
	               "the old single-gradient upload is gone");
	free(g);
}

/* GET /v1/projects/r1/rounds while round 0 is averaging. */
static void rounds_list_averaging(long long pid)
{
	th_resp r = th_call("GET", "/v1/projects/r1/rounds", NULL, NULL, 200, "the rounds list");
	json_t *rounds = json_object_get(r.json, "rounds");
	is_int((long long)json_array_size(rounds), 1, "one round so far");
	json_t *x = json_array_get(rounds, 0);
	is_int(json_integer_value(json_object_get(x, "version")), 0, "version 0");
	is_str(json_string_value(json_object_get(x, "state")), "averaging", "averaging");
	is_int(json_integer_value(json_object_get(x, "attempt")), 1, "first attempt");
	is_int(json_integer_value(json_object_get(x, "target_batch")), 64, "the target batch");
	is_int(json_integer_value(json_object_get(x, "samples")), 56, "the plan's samples");
	is_int(json_integer_value(json_object_get(x, "n_peers")), 3, "three peers");
	is_int(json_integer_value(json_object_get(x, "n_groups")), 2, "two groups");
	ok(json_is_null(json_object_get(x, "loss")), "no loss before the commit");
	ok(json_is_null(json_object_get(x, "seconds")) && json_is_null(json_object_get(x, "committed_at")),
	   "not committed: seconds and committed_at are null");
	ok(json_is_string(json_object_get(x, "opened_at")) && json_is_string(json_object_get(x, "closed_at")),
	   "opened_at and closed_at are timestamps");
	th_resp_free(&r);
	r = th_call("GET", "/v1/projects/r1/rounds?limit=5&before=0", NULL, NULL, 200, "rounds before 0");
	is_int((long long)json_array_size(json_object_get(r.json, "rounds")), 0, "none before version 0");
	th_resp_free(&r);
	th_refused("GET", "/v1/projects/r1/rounds?limit=0", NULL, NULL, 400, "invalid", "limit=0");
	th_refused("GET", "/v1/projects/r1/rounds?limit=1001", NULL, NULL, 400, "invalid", "limit=1001");
	th_refused("GET", "/v1/projects/r1/rounds?limit=ten", NULL, NULL, 400, "invalid", "limit=ten");
	th_refused("GET", "/v1/projects/r1/rounds?before=-1", NULL, NULL, 400, "invalid", "before=-1");
	th_refused("GET", "/v1/projects/nope/rounds", NULL, NULL, 404, "not_found",
	           "rounds of an unknown project");
	(void)pid;
}

static void test_round(long long pid)
{
	/* Four hosts, eight microbatches (32 samples) each, handed out for a
	 * target of 128; then the target is lowered to 64 (as a maintainer may)
	 * so that the units hold more than the round needs and it closes on a
	 * heartbeat. */
	th_host *hs[] = { &A, &B, &C, &D };
	for (int i = 0; i < 4; i++)
		th_ask_work(hs[i], "r1", 0);
	is_int(A.hi - A.lo, 8, "a work unit of 8 microbatches");
	th_sql("UPDATE project SET target_batch = 64 WHERE id = %lld", pid);
	th_resp r;
	long long done[] = { 4, 4, 4, 2 };
	for (int i = 0; i < 4; i++) {
		r = th_heartbeat(hs[i], done[i], 1e6);
		ok(!json_object_get(r.json, "round"), "heartbeat %d: the round is open (%lld samples)", i,
		   th_json_int(&r, "accumulated_samples"));
		th_resp_free(&r);
	}
	/* The close notice: held while the round is open, answered at the close. */
	char wp[128];
	snprintf(wp, sizeof wp, "/v1/workunits/%lld/round", B.wu);
	char *fp0 = th_round_fingerprint();
	r = th_call("GET", wp, B.token, NULL, 200, "the close notice without wait");
	ok(!json_object_get(r.json, "round") && strcmp(th_json_str(&r, "state"), "live") == 0,
	   "answers at once: the unit live, the round open");
	is_int(th_json_int(&r, "work_unit_id"), B.wu, "... naming the unit");
	th_resp_free(&r);
	th_refused("GET", wp, A.token, NULL, 403, "forbidden", "the close notice of another host's unit");
	th_refused("GET", "/v1/workunits/999999/round", A.token, NULL, 404, "not_found",
	           "the close notice of an unknown unit");
	th_refused("GET", "/v1/workunits/x/round", A.token, NULL, 400, "invalid",
	           "the close notice of a unit id that is not a number");
	th_refused("GET", "/v1/workunits/1/round", "nope", NULL, 401, "unauthorized",
	           "the close notice with a bad token");
	const char *badw[] = { "?wait=61", "?wait=-1", "?wait=x" };
	for (int i = 0; i < 3; i++) {
		char bp[160];
		snprintf(bp, sizeof bp, "%s%s", wp, badw[i]);
		th_refused("GET", bp, B.token, NULL, 400, "invalid", badw[i]);
	}
	char *fp1 = th_round_fingerprint();
	is_str(fp1, fp0, "the close notice and its refusals change nothing");
	free(fp0);
	free(fp1);
	snprintf(wp, sizeof wp, "/v1/workunits/%lld/round?wait=30", B.wu);
	th_bg *notice = th_bg_get(wp, B.token);
	usleep(500000);
	ok(!th_bg_done(notice), "the close notice with wait is held while the round is open");
	/* The window the closing round's reports spread over: 0.8 ms for each
	 * unit still to report, rounded up. */
	long long n_units =
	        th_sql_int("SELECT count(*) FROM work_unit w JOIN project p ON p.id = w.project_id"
	                   " WHERE p.name = 'r1' AND w.version = 0 AND w.state IN ('live', 'done')");
	long long spread = (n_units * 4 + 4) / 5;
	r = th_heartbeat(&A, 6, 1e6);
	th_resp nr = th_bg_join(notice);
	is_int(nr.status, 200, "the held close notice is answered 200");
	is_str(th_json_str(&nr, "round.state"), "closing", "at the close, naming it");
	is_int(th_json_int(&nr, "round.report_spread_ms"), spread,
	       "... and the window its %lld units' reports spread over", n_units);
	ok(nr.seconds < 25, "before its wait ran out (%.2f s)", nr.seconds);
	th_resp_free(&nr);
	is_int(th_json_int(&r, "accumulated_samples"), 64, "64 samples: the target");
	is_str(th_json_str(&r, "round.state"), "closing", "the heartbeat says the round is closing");
	is_int(th_json_int(&r, "round.report_spread_ms"), spread, "... with the reports' window");
	is_int(th_json_int(&r, "round.version"), 0, "... of version 0");
	th_resp_free(&r);
	PGresult *cr = PQexec(th_db(), "SELECT close_reason FROM round WHERE version = 0 AND project_id = "
	                               "(SELECT id FROM project WHERE name = 'r1')");
	is_str(PQgetvalue(cr, 0, 0), "target", "closed for the target");
	PQclear(cr);

	char body[512], path[64];
	snprintf(body, sizeof body, "{\"host_id\": %lld}", E.id);
	char *before = th_round_fingerprint();
	r = th_call("POST", "/v1/projects/r1/work", E.token, body, 409, "new work while closing");
	is_str(th_json_str(&r, "round.state"), "closing", "the refusal names the round's state");
	is_int(th_json_int(&r, "round.report_spread_ms"), spread, "... and the reports' window");
	ok(th_json_int(&r, "retry_after") > 0, "and when to ask again");
	th_resp_free(&r);
	char *after = th_round_fingerprint();
	is_str(after, before, "new work while closing: database unchanged");
	free(before);
	free(after);

	/* Reports. */
	snprintf(path, sizeof path, "/v1/workunits/%lld/report", A.wu);
	char rtt[128];
	snprintf(rtt, sizeof rtt, "{\"%lld\": 5, \"%lld\": 80, \"%lld\": 90}", B.id, C.id, D.id);
	report_body(body, sizeof body, 6, 24, 1, true, rtt);
	r = th_call("POST", path, A.token, body, 200, "A reports");
	is_str(th_json_str(&r, "state"), "returned", "a reported live unit is returned");
	is_int(th_json_int(&r, "returned_lo"), A.lo + 6, "its rest starts after what it did");
	th_resp_free(&r);
	is_int(th_sql_int("SELECT count(*) FROM mb_pool WHERE project_id = %lld AND lo = %lld AND hi = %lld",
	                  pid, A.lo + 6, A.hi),
	       1, "the unprocessed rest is back in the pool");
	th_coverage_exact(pid, "after a report");
	r = th_call("POST", path, A.token, body, 200, "the same report again");
	is_int(th_json_int(&r, "samples"), 24, "answered as before");
	th_resp_free(&r);
	char other[512];
	report_body(other, sizeof other, 7, 28, 1, true, rtt);
	th_refused("POST", path, A.token, other, 409, "conflict", "a conflicting second report");
	th_refused("POST", path, B.token, body, 403, "forbidden", "a report of another host's unit");
	th_refused("POST", "/v1/workunits/999999/report", A.token, body, 404, "not_found",
	           "a report of an unknown unit");

	snprintf(path, sizeof path, "/v1/workunits/%lld/report", B.wu);
	report_body(other, sizeof other, 4, 17, 2, true, "{}");
	th_refused("POST", path, B.token, other, 400, "invalid", "samples that do not match mb_done");
	report_body(other, sizeof other, 9, 36, 2, true, "{}");
	th_refused("POST", path, B.token, other, 400, "invalid", "mb_done beyond the unit");
	report_body(other, sizeof other, 3, 12, 2, true, "{}");
	th_refused("POST", path, B.token, other, 400, "invalid", "mb_done below the last heartbeat");
	th_refused("POST", path, B.token,
	           "{\"mb_done\": 4, \"samples\": 16, \"endpoint\": \"example.org\", \"bandwidth\": 1e6, "
	           "\"can_aggregate\": true}",
	           400, "invalid", "an endpoint that is not ip:port");
	th_refused("POST", path, B.token,
	           "{\"mb_done\": 4, \"samples\": 16, \"endpoint\": \"192.0.2.2:7070\", \"bandwidth\": 1e6, "
	           "\"can_aggregate\": true, \"rtt\": {\"x\": 1}}",
	           400, "invalid", "an rtt keyed by something else than host ids");
	th_refused("POST", path, B.token,
	           "{\"mb_done\": 4, \"samples\": 16, \"endpoint\": \"192.0.2.2:7070\", \"bandwidth\": 1e6, "
	           "\"can_aggregate\": true, \"loss\": -0.5}",
	           400, "invalid", "a negative loss");
	th_refused("POST", path, B.token,
	           "{\"mb_done\": 4, \"samples\": 16, \"endpoint\": \"192.0.2.2:7070\", \"bandwidth\": 1e6, "
	           "\"can_aggregate\": true, \"loss\": \"low\"}",
	           400, "invalid", "a loss that is not a number");
	snprintf(rtt, sizeof rtt, "{\"%lld\": 5}", A.id);
	report_body(body, sizeof body, 4, 16, 2, true, rtt);
	r = th_call("POST", path, B.token, body, 200, "B reports");
	th_resp_free(&r);
	snprintf(path, sizeof path, "/v1/workunits/%lld/report", C.wu);
	snprintf(rtt, sizeof rtt, "{\"%lld\": 3}", D.id);
	report_body(body, sizeof body, 4, 16, 3, false, rtt);
	r = th_call("POST", path, C.token, body, 200, "C reports (cannot aggregate)");
	th_resp_free(&r);
	th_coverage_exact(pid, "after three reports");

	/* D never reports: no plan until the report deadline; a long poll is
	 * held until the coordinator plans, and answers at once then. */
	r = get_plan(&A, 0, 204);
	ok(r.len == 0, "no plan yet: 204 without a body");
	ok(atoi(r.retry_after) > 0, "with Retry-After");
	th_resp_free(&r);
	char pp[160];
	snprintf(pp, sizeof pp, "/v1/projects/r1/rounds/0/plan?host_id=%lld&wait=30", A.id);
	r = th_call("GET", pp, A.token, NULL, 200, "a long poll for the plan");
	ok(r.seconds >= 0.5 && r.seconds < 25,
	   "it was held until the plan existed, and answered before its wait ran out (%.2f s)", r.seconds);
	is_int(th_json_int(&r, "round_samples"), 56, "the long poll's answer is the plan");
	th_resp_free(&r);
	is_int(th_sql_int("SELECT count(*) FROM work_unit WHERE id = %lld AND state = 'expired' AND mb_done "
	                  "= 0",
	                  D.wu),
	       1, "the unit that never reported is dropped, its samples not counted");
	is_int(th_sql_int("SELECT count(*) FROM mb_pool WHERE project_id = %lld AND lo = %lld AND hi = %lld",
	                  pid, D.lo, D.hi),
	       1, "its whole range is back in the pool");
	th_coverage_exact(pid, "after the plan");
	snprintf(path, sizeof path, "/v1/workunits/%lld/heartbeat", D.wu);
	th_refused("POST", path, D.token, "{\"mb_done\": 3}", 409, "conflict",
	           "the dropped unit's heartbeat");

	/* The plan. */
	th_host *peers[] = { &A, &B, &C };
	int in_groups[3] = { 0 };
	long long group_of[3];
	for (int i = 0; i < 3; i++) {
		r = get_plan(peers[i], 0, 200);
		group_of[i] = th_json_int(&r, "group");
		is_int(th_json_int(&r, "param_count"), TH_PARAMS,
		       "peer %d: the vector is the model's %d parameters", i, TH_PARAMS);
		is_int(th_json_int(&r, "round_samples"), 56, "peer %d: 56 samples in the round", i);
		is_str(th_json_str(&r, "state"), "averaging", "peer %d: the round is averaging", i);
		ok(th_json_str(&r, "deadline") && th_json_str(&r, "compression"),
		   "peer %d: deadline and compression", i);
		json_t *members = json_object_get(r.json, "members");
		bool self = false, tiled = true;
		long long at = 0;
		size_t k;
		json_t *m;
		json_array_foreach(members, k, m)
		{
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
				is_int(json_integer_value(json_object_get(m, "samples")), 24,
				       "A's exact samples");
			ok(json_string_value(json_object_get(m, "endpoint")), "member %lld has an endpoint",
			   id);
		}
		ok(self, "peer %d is in its own group", i);
		ok(tiled && at == TH_PARAMS, "peer %d: its group's ranges tile [0, %d) exactly", i,
		   TH_PARAMS);
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

	th_refused("GET", "/v1/projects/r1/rounds/0/plan", A.token, NULL, 400, "invalid",
	           "plan without host_id");
	char p2[128];
	snprintf(p2, sizeof p2, "/v1/projects/r1/rounds/7/plan?host_id=%lld", A.id);
	th_refused("GET", p2, A.token, NULL, 404, "not_found", "plan of an unknown version");
	snprintf(p2, sizeof p2, "/v1/projects/r1/rounds/0/plan?host_id=%lld", B.id);
	th_refused("GET", p2, A.token, NULL, 403, "forbidden", "plan for another host");
	snprintf(p2, sizeof p2, "/v1/projects/nope/rounds/0/plan?host_id=%lld", A.id);
	th_refused("GET", p2, A.token, NULL, 404, "not_found", "plan of an unknown project");
	snprintf(p2, sizeof p2, "/v1/projects/r1/rounds/0/plan?host_id=%lld", D.id);
	th_refused("GET", p2, D.token, NULL, 409, "conflict", "plan for a dropped host");

	group_sum_refusals(group_of);
	rounds_list_averaging(pid);

	/* Outcomes. */
	const char *sha = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
	char ob[512];
	const char *op = "/v1/projects/r1/rounds/0/outcome";
	for (int i = 0; i < 2; i++) {
		snprintf(ob, sizeof ob,
		         "{\"host_id\": %lld, \"status\": \"ok\", \"included_hosts\": [%lld, %lld, %lld], "
		         "\"params_sha256\": \"%s\"}",
		         peers[i]->id, A.id, B.id, C.id, sha);
		r = th_call("POST", op, peers[i]->token, ob, 200, "outcome ok");
		is_str(th_json_str(&r, "round.state"), "averaging", "still averaging until every peer said");
		th_resp_free(&r);
	}
	th_refused("POST", op, A.token, ob, 403, "forbidden", "an outcome for another host");
	snprintf(ob, sizeof ob,
	         "{\"host_id\": %lld, \"status\": \"ok\", \"included_hosts\": [%lld, %lld, %lld], "
	         "\"params_sha256\": \"%s\"}",
	         A.id, A.id, B.id, C.id, sha);
	r = th_call("POST", op, A.token, ob, 200, "A's outcome again");
	th_resp_free(&r);
	snprintf(ob, sizeof ob, "{\"host_id\": %lld, \"status\": \"failed\", \"included_hosts\": []}", A.id);
	th_refused("POST", op, A.token, ob, 409, "conflict", "a different second outcome");
	snprintf(ob, sizeof ob, "{\"host_id\": %lld, \"status\": \"maybe\", \"included_hosts\": []}", C.id);
	th_refused("POST", op, C.token, ob, 400, "invalid", "an unknown outcome status");
	snprintf(ob, sizeof ob,
	         "{\"host_id\": %lld, \"status\": \"ok\", \"included_hosts\": [], \"params_sha256\": "
	         "\"xyz\"}",
	         C.id);
	th_refused("POST", op, C.token, ob, 400, "invalid", "a malformed hash");
	snprintf(ob, sizeof ob,
	         "{\"host_id\": %lld, \"status\": \"ok\", \"included_hosts\": [], \"params_sha256\": \"%s\", "
	         "\"moments_sha256\": \"%064d\"}",
	         C.id, sha, 7);
	ob[strlen(ob) - 3] = 'G'; /* not lowercase hex */
	th_refused("POST", op, C.token, ob, 400, "invalid", "a malformed moments hash");
	snprintf(ob, sizeof ob,
	         "{\"host_id\": %lld, \"status\": \"ok\", \"included_hosts\": [], \"params_sha256\": \"%s\"}",
	         D.id, sha);
	th_refused("POST", op, D.token, ob, 409, "conflict", "an outcome from a host not in the plan");
	snprintf(ob, sizeof ob,
	         "{\"host_id\": %lld, \"status\": \"ok\", \"included_hosts\": [%lld, %lld, %lld], "
	         "\"params_sha256\": \"%s\"}",
	         C.id, A.id, B.id, C.id, sha);
	th_refused("POST", "/v1/projects/r1/rounds/3/outcome", C.token, ob, 404, "not_found",
	           "an outcome for an unknown version");
	r = th_call("POST", op, C.token, ob, 200, "the last outcome");
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
	th_coverage_exact(pid, "after the outcomes");
}

/* The failure paths keep the stream tiled exactly: a round that fails
 * gives its whole range back (finished parts included, their samples
 * forgotten), the reopened round hands it out again, and a unit that
 * expires gives back its unfinished rest. */
static void test_failure_coverage(long long pid)
{
	th_sql("SELECT round_fail(%lld, 0, 'test: failed on purpose')", pid);
	is_int(th_sql_int("SELECT attempt FROM round WHERE project_id = %lld AND version = 0", pid), 2,
	       "a failed round reopens as its next attempt");
	is_int(th_sql_int("SELECT count(*) FROM work_unit WHERE project_id = %lld AND version = 0"
	                  " AND (mb_done > 0 OR state = 'live')",
	                  pid),
	       0, "its work units hold no samples and none is live");
	ok(th_sql_int("SELECT count(*) FROM mb_pool WHERE project_id = %lld", pid) >= 1,
	   "its ranges are back in the pool");
	th_coverage_exact(pid, "after a failed round");
	th_ask_work(&E, "r1", 0);
	/* E is the slowest of the hosts of the version (the others measured
	 * 1e6 samples/s): its share of the 16 microbatches the round needs is
	 * one, the top of the lowest free range. */
	ok(E.hi <= 16 && E.hi - E.lo == 1,
	   "the reopened round hands out the stream's start again, E's share of it ([%lld, %lld))", E.lo,
	   E.hi);
	th_resp r = th_heartbeat(&E, 1, 1.0);
	th_resp_free(&r);
	th_coverage_exact(pid, "after a unit of the reopened round");
	th_sql("UPDATE work_unit SET deadline = now() - interval '1 second' WHERE id = %lld", E.wu);
	is_int(th_sql_int("SELECT sched_reap(1000)"), 1, "the reaper expires the unit past its deadline");
	th_coverage_exact(pid, "after an expired unit");
}

static void test_stragglers(void)
{
	long long pid = th_seed_project("r2", 600, 1e6, 4, 16, 4, 100000);
	th_sql("UPDATE project SET target_batch = 64, config = '{\"model\": " TH_MODEL "}' WHERE id = %lld",
	       pid);
	th_host h = A;
	char pp[160];
	snprintf(pp, sizeof pp, "/v1/projects/r2/rounds/0/plan?host_id=%lld&wait=1", h.id);
	th_resp r0 = th_call("GET", pp, h.token, NULL, 204, "a long poll on an open round");
	ok(r0.seconds >= 0.9, "held for its wait of 1 s (%.2f s)", r0.seconds);
	ok(atoi(r0.retry_after) > 0 && r0.len == 0, "then 204 with Retry-After and no body");
	th_resp_free(&r0);
	const char *bad[] = { "wait=61", "wait=-1", "wait=x", "wait=1&after=plan" };
	for (int i = 0; i < 4; i++) {
		snprintf(pp, sizeof pp, "/v1/projects/r2/rounds/0/plan?host_id=%lld&%s", h.id, bad[i]);
		th_refused("GET", pp, h.token, NULL, 400, "invalid", bad[i]);
	}
	/* With --round-close-fraction 0 a round may close at any sample, but
	 * never at none: closed empty, it would fail for want of reports and
	 * open again, over and over. */
	th_sql("SELECT round_close_due(0, 60)");
	is_int(th_sql_int("SELECT count(*) FROM round WHERE project_id = %lld AND state = 'open'", pid), 1,
	       "a round without samples stays open whatever the fraction");
	th_ask_work(&h, "r2", 0);
	th_resp r = th_heartbeat(&h, 8, 0.001); /* 32 of 64 samples, and crawling */
	ok(!json_object_get(r.json, "round"), "half the target: the heartbeat finds the round open");
	th_resp_free(&r);
	time_t t0 = time(NULL);
	while (th_sql_int("SELECT count(*) FROM round WHERE project_id = %lld AND state = 'closing'", pid) ==
	               0 &&
	       time(NULL) - t0 < 20)
		usleep(100000);
	is_int(th_sql_int("SELECT count(*) FROM round WHERE project_id = %lld AND state = 'closing' AND "
	                  "close_reason = 'stragglers'",
	                  pid),
	       1, "the round closed early: the rest would take longer than the budget");
	th_coverage_exact(pid, "straggler round");
}

/* A target lowered (by the project's admin) to the samples a round already
 * holds closes it at the coordinator's next pass, for the target, although
 * its one unit is live and fast: nothing is left to wait for. */
static void test_target_lowered(void)
{
	long long pid = th_seed_project("r3", 600, 1e6, 4, 16, 4, 100000);
	th_sql("UPDATE project SET target_batch = 64, config = '{\"model\": " TH_MODEL "}' WHERE id = %lld",
	       pid);
	th_host h = B;
	th_ask_work(&h, "r3", 0);
	th_resp r = th_heartbeat(&h, 4, 1e6); /* 16 of 64 samples, fast */
	ok(!json_object_get(r.json, "round"), "a quarter of the target: the round is open");
	th_resp_free(&r);
	th_sql("UPDATE project SET target_batch = 16 WHERE id = %lld", pid);
	time_t t0 = time(NULL);
	while (th_sql_int("SELECT count(*) FROM round WHERE project_id = %lld AND state = 'closing'", pid) ==
	               0 &&
	       time(NULL) - t0 < 10)
		usleep(100000);
	is_int(th_sql_int("SELECT count(*) FROM round WHERE project_id = %lld AND state = 'closing'"
	                  " AND close_reason = 'target'",
	                  pid),
	       1, "the target lowered to the samples in: the coordinator closes the round for the target");
}

int main(void)
{
	const char *args[] = { "--round-interval", "1", "--round-report-timeout", "3", "--round-max-group",
		               "2", "--round-close-fraction", "0.5", "--round-straggler-budget", "60",
		               /* group sums to the server, whose refusals this test checks */
		               "--round-server-mean", NULL };
	plan_lazy();
	th_start(args);
	/* 8 microbatches per unit: flops * wu_seconds / (flops_per_sample * 4) = 8. */
	long long pid = th_seed_project("r1", 600, 1e6, 4, 16, 4, 100000);
	th_sql("UPDATE project SET target_batch = 128, config = '{\"model\": " TH_MODEL "}' WHERE id = %lld",
	       pid);
	th_host *hs[] = { &A, &B, &C, &D, &E };
	for (int i = 0; i < 5; i++)
		th_new_host("round", 8 * 4e6 / 600 + 1e-3, hs[i]->key, &hs[i]->id, hs[i]->token);

	test_certificates();
	test_round(pid);
	test_failure_coverage(pid);
	test_stragglers();
	test_target_lowered();

	/* A long poll held when the server stops: answered at once, and the
	 * server still exits cleanly. */
	char pp[160];
	snprintf(pp, sizeof pp, "/v1/projects/r2/rounds/0/plan?host_id=%lld&wait=60", A.id);
	th_bg *waiter = th_bg_get(pp, A.token);
	usleep(300000);
	ok(!th_bg_done(waiter), "a long poll on the closing round is held");
	ok(th_stop_server(), "the server stops cleanly with a long poll held");
	th_resp r = th_bg_join(waiter);
	ok(r.status == 204 && r.seconds < 30,
	   "the held long poll was answered 204 as the server stopped (%ld after %.2f s)", r.status,
	   r.seconds);
	th_resp_free(&r);
	return exit_status();
}
