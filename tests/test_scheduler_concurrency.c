/* cotrain tests: the scheduler under concurrency.  64 hosts (threads, each
 * with its own curl handle and host token) ask for work and heartbeat; some
 * finish, some hand back part of their range, some go silent so that their
 * deadlines (2 s: wu_seconds = 1) pass and the reaper returns their rest.
 * A monitor checks, many times while this runs, in one snapshot each time,
 * that the pool, the live work units and the finished parts of the others
 * tile [0, frontier) exactly: no microbatch is in two places (in particular
 * in two live work units) and none is lost.  Then the expired remainders must
 * be reissued, and at the end the same tiling must hold with nothing live. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shared/database/db.h"
#include "tests/pgtmp.h"
#include "tests/tap.h"
#include "tests/test_server_harness.h"

#define HOSTS 64
#define PHASE1_SECONDS 5

static long long project_id;
static atomic_int phase; /* 1: mixed behaviour, 2: finish only, 0: stop */
static atomic_long n_assigned, n_finished, n_returned, n_silent, n_late, n_errors;
static atomic_long n_checks, n_violations;

typedef struct {
	int idx;
	long long host_id;
	char token[64];
	char key[64];
} host;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* POST and expect 200; a 409 means the work unit expired under a slow host
 * (legal: its deadline passed), anything else is an error. */
static bool post(CURL *c, const char *path, const host *h, const char *body)
{
	th_resp r;
	if (!th_http(c, "POST", path, h->token, body, NULL, &r)) {
		atomic_fetch_add(&n_errors, 1);
		return false;
	}
	bool good = r.status == 200;
	if (r.status == 409) {
		atomic_fetch_add(&n_late, 1);
	} else if (!good) {
		atomic_fetch_add(&n_errors, 1);
		diag("host %d: %s: %ld %s", h->idx, path, r.status, r.body);
	}
	th_resp_free(&r);
	return good;
}

static void *host_main(void *arg)
{
	host *h = arg;
	CURL *c = curl_easy_init();
	unsigned seed = (unsigned)h->idx * 7919u + 17u;
	char body[128], path[96];
	snprintf(body, sizeof body, "{\"host_id\": %lld}", h->host_id);
	int ph;
	while ((ph = atomic_load(&phase)) != 0) {
		th_resp r;
		if (!th_http(c, "POST", "/v1/projects/conc/work", h->token, body, NULL, &r) ||
		    r.status != 200) {
			atomic_fetch_add(&n_errors, 1);
			diag("host %d: work: %ld %s", h->idx, r.status, r.body ? r.body : "");
			th_resp_free(&r);
			break;
		}
		long long wu = th_json_int(&r, "work_unit_id");
		long long size = th_json_int(&r, "hi") - th_json_int(&r, "lo");
		th_resp_free(&r);
		atomic_fetch_add(&n_assigned, 1);

		int action = ph == 1 ? (int)(rand_r(&seed) % 4) : 0; /* 0,1 finish; 2 hand back; 3 silent */
		long long done = size > 0 ? (long long)(rand_r(&seed) % (unsigned)(size + 1)) : 0;
		char hb[96];
		snprintf(path, sizeof path, "/v1/workunits/%lld/heartbeat", wu);
		snprintf(hb, sizeof hb, "{\"mb_done\": %lld, \"samples_per_sec\": %d}", done / 2,
		         100 + h->idx);
		if (!post(c, path, h, hb))
			continue;
		snprintf(hb, sizeof hb, "{\"mb_done\": %lld, \"samples_per_sec\": %d}", done, 100 + h->idx);
		if (!post(c, path, h, hb))
			continue;
		if (action <= 1) {
			snprintf(path, sizeof path, "/v1/workunits/%lld/finish", wu);
			if (post(c, path, h, NULL))
				atomic_fetch_add(&n_finished, 1);
		} else if (action == 2) {
			snprintf(path, sizeof path, "/v1/workunits/%lld/handback", wu);
			if (post(c, path, h, hb))
				atomic_fetch_add(&n_returned, 1);
		} else {
			atomic_fetch_add(&n_silent, 1); /* never heard of again */
		}
	}
	curl_easy_cleanup(c);
	return NULL;
}

/* The tiling of [0, frontier) by pool ranges, live work units and finished
 * parts, in one snapshot: (overlaps or gaps, first lo, total length,
 * frontier, live count). */
static const char *tiling_sql =
        "WITH iv AS ("
        "   SELECT lo, hi FROM mb_pool WHERE project_id = $1"
        "   UNION ALL SELECT lo, hi FROM work_unit WHERE project_id = $1 AND state = 'live'"
        "   UNION ALL SELECT lo, lo + mb_done FROM work_unit"
        "              WHERE project_id = $1 AND state <> 'live' AND mb_done > 0"
        "), o AS (SELECT lo, hi, lag(hi) OVER (ORDER BY lo, hi) AS prev FROM iv)"
        " SELECT (SELECT count(*) FROM o WHERE prev IS NOT NULL AND prev <> lo),"
        "        (SELECT coalesce(min(lo), 0) FROM iv),"
        "        (SELECT coalesce(sum(hi - lo), 0) FROM iv),"
        "        (SELECT frontier FROM project WHERE id = $1),"
        "        (SELECT count(*) FROM work_unit WHERE project_id = $1 AND state = 'live')";

typedef struct {
	long long bad, first, total, frontier, live;
} tiling;

static bool check_tiling(PGconn *c, tiling *t)
{
	char pid[24];
	snprintf(pid, sizeof pid, "%lld", project_id);
	const char *params[] = { pid };
	PGresult *r = PQexecParams(c, tiling_sql, 1, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		diag("tiling query: %s", PQerrorMessage(c));
		PQclear(r);
		return false;
	}
	t->bad = atoll(PQgetvalue(r, 0, 0));
	t->first = atoll(PQgetvalue(r, 0, 1));
	t->total = atoll(PQgetvalue(r, 0, 2));
	t->frontier = atoll(PQgetvalue(r, 0, 3));
	t->live = atoll(PQgetvalue(r, 0, 4));
	PQclear(r);
	return t->bad == 0 && t->first == 0 && t->total == t->frontier;
}

static void *monitor_main(void *arg)
{
	PGconn *c = NULL;
	cot_errbuf eb = { "", "" };
	if (db_connect(pgtmp_conninfo(), &c, &eb)) {
		diag("monitor: %s", eb.msg);
		atomic_fetch_add(&n_violations, 1);
		return NULL;
	}
	while (atomic_load(&phase) != 0) {
		tiling t;
		if (!check_tiling(c, &t)) {
			if (atomic_fetch_add(&n_violations, 1) < 5)
				diag("violation: %lld gaps/overlaps, first %lld, total %lld, frontier %lld",
				     t.bad, t.first, t.total, t.frontier);
		}
		atomic_fetch_add(&n_checks, 1);
		usleep(20000);
	}
	PQfinish(c);
	return NULL;
}

int main(void)
{
	plan_lazy();
	/* Small frontier chunks, so that carving (the project row lock) is
	 * exercised often too. */
	const char *args[] = { "--reap-interval", "1", "--threads", "8", "--pool-chunk", "64", NULL };
	th_start(args);
	/* wu_seconds 1: deadline 2 s after assignment; n = flops / 4e5. */
	project_id = th_seed_project("conc", 1, 1e5, 4, 16, 64, 100000);
	/* The scheduler alone: a target no test reaches keeps round 0 open
	 * (a closing round refuses new work, see tests/test_rounds.c). */
	th_sql("UPDATE project SET target_batch = 2147483647 WHERE id = %lld", project_id);

	static host hosts[HOSTS];
	for (int i = 0; i < HOSTS; i++) {
		hosts[i].idx = i;
		th_new_host("conc", 4e5 * (1 + i % 20), hosts[i].key, &hosts[i].host_id, hosts[i].token);
	}

	atomic_store(&phase, 1);
	pthread_t th[HOSTS], mon;
	pthread_create(&mon, NULL, monitor_main, NULL);
	for (int i = 0; i < HOSTS; i++)
		pthread_create(&th[i], NULL, host_main, &hosts[i]);
	double t0 = now_s();
	while (now_s() - t0 < PHASE1_SECONDS)
		usleep(100000);
	atomic_store(&phase, 0);
	for (int i = 0; i < HOSTS; i++)
		pthread_join(th[i], NULL);
	pthread_join(mon, NULL);
	long long a1 = atomic_load(&n_assigned);
	diag("phase 1: %lld assigned, %ld finished, %ld handed back, %ld silent, %ld late, %ld errors", a1,
	     atomic_load(&n_finished), atomic_load(&n_returned), atomic_load(&n_silent), atomic_load(&n_late),
	     atomic_load(&n_errors));
	ok(a1 > HOSTS, "work was handed out (%lld work units)", a1);
	ok(atomic_load(&n_silent) > 0 && atomic_load(&n_returned) > 0 && atomic_load(&n_finished) > 0,
	   "hosts finished, handed back and went silent");
	is_int(atomic_load(&n_errors), 0, "no request failed");
	ok(atomic_load(&n_checks) >= 20, "the tiling was checked %ld times while hosts worked",
	   atomic_load(&n_checks));
	is_int(atomic_load(&n_violations), 0, "never a microbatch in two places, never one lost");

	/* The silent hosts' deadlines pass; the reaper returns their rest. */
	bool drained = false;
	for (int i = 0; i < 200 && !drained; i++) {
		drained = th_sql_int("SELECT count(*) FROM work_unit WHERE project_id = %lld AND state = "
		                     "'live'",
		                     project_id) == 0;
		if (!drained)
			usleep(100000);
	}
	ok(drained, "every silent work unit expired");
	long long expired_rest = th_sql_int("SELECT count(*) FROM work_unit WHERE project_id = %lld AND "
	                                    "state = 'expired' AND lo + mb_done < hi",
	                                    project_id);
	ok(expired_rest > 0, "expired work units left %lld remainders", expired_rest);
	long long frontier1 = th_sql_int("SELECT frontier FROM project WHERE id = %lld", project_id);
	long long last_wu1 = th_sql_int("SELECT max(id) FROM work_unit WHERE project_id = %lld", project_id);
	tiling t;
	bool tiled = check_tiling(th_db(), &t);
	ok(tiled, "after expiry: pool + finished parts tile [0, %lld)", t.frontier);

	/* Phase 2: everyone finishes what it gets, until no pool range below
	 * the old frontier is left: the remainders were reissued. */
	atomic_store(&phase, 2);
	pthread_create(&mon, NULL, monitor_main, NULL);
	for (int i = 0; i < HOSTS; i++)
		pthread_create(&th[i], NULL, host_main, &hosts[i]);
	bool reissued = false;
	t0 = now_s();
	while (!reissued && now_s() - t0 < 60) {
		reissued = th_sql_int("SELECT count(*) FROM mb_pool WHERE project_id = %lld AND lo < %lld",
		                      project_id, frontier1) == 0;
		if (!reissued)
			usleep(50000);
	}
	atomic_store(&phase, 0);
	for (int i = 0; i < HOSTS; i++)
		pthread_join(th[i], NULL);
	pthread_join(mon, NULL);
	ok(reissued, "every free range below the old frontier was handed out again");
	long long reissues =
	        th_sql_int("SELECT count(*) FROM work_unit n JOIN work_unit e ON e.project_id = n.project_id"
	                   " WHERE n.project_id = %lld AND n.id > %lld AND e.state = 'expired'"
	                   "   AND n.lo >= e.lo + e.mb_done AND n.hi <= e.hi",
	                   project_id, last_wu1);
	ok(reissues > 0, "%lld new work units lie inside expired remainders", reissues);
	is_int(atomic_load(&n_errors), 0, "no request failed in phase 2");
	is_int(atomic_load(&n_violations), 0, "no violation in phase 2 (%ld checks in all)",
	       atomic_load(&n_checks));

	tiled = check_tiling(th_db(), &t);
	ok(tiled, "at the end: exact tiling of [0, %lld)", t.frontier);
	is_int(t.bad, 0, "no overlaps or gaps");
	is_int(t.live, 0, "nothing left live");
	is_int(th_sql_int("SELECT count(*) FROM work_unit w1 JOIN work_unit w2 ON w1.project_id = "
	                  "w2.project_id"
	                  " AND w1.id < w2.id AND w1.state = 'done' AND w2.state = 'done'"
	                  " AND w1.lo < w2.hi AND w2.lo < w1.hi WHERE w1.project_id = %lld",
	                  project_id),
	       0, "no two done work units overlap");
	is_int(th_sql_int("SELECT coalesce(sum(mb_done), 0) FROM version_progress WHERE project_id = %lld",
	                  project_id),
	       th_sql_int("SELECT coalesce(sum(mb_done), 0) FROM work_unit WHERE project_id = %lld",
	                  project_id),
	       "accumulated counter equals the sum over work units");
	ok(th_stop_server(), "server exits 0 on SIGTERM");
	return exit_status();
}
