/* cotrain-server: the round coordinator thread. */
#include "server/round_coord.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "kernels/model.h"
#include "kernels/model_json.h"
#include "server/db_listen.h"
#include "server/dbconn.h"
#include "server/duty.h"
#include "server/grouping.h"
#include "server/http.h"
#include "server/load_balance.h"
#include "server/plan_cache.h"
#include "shared/common/deadline.h"
#include "shared/common/log.h"

/* Peers grouped together at most: grp_form needs an n*n matrix. */
#define GROUPING_CHUNK 1024
/* How often every process looks whether a round moved (the wake-up of its
 * long polls when another process moved it), whatever the notifications
 * say: the floor under them (a notification sent while the listener's
 * connection was down is lost). */
#define WATCH_MS 250
/* A notification that a round moved (db/functions/round_notify.sql) makes the
 * process look at once, but not sooner than this after its last look: a
 * thousand reports are a thousand notifications. */
#define NOTIFIED_GAP_MS 20

struct round_coord {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	bool stop, woken;
	bool notified;     /* a round moved, says the database (db_listen) */
	db_listen *listen; /* NULL when it could not start: WATCH_MS alone */
	const srv_config *cfg;
	duty *duty;        /* DUTY_ROUNDS: only its holder closes, plans and expires */
	char moved[2][40]; /* the last st_moved seen: states, then hashes */
	char *uploaders;   /* and the hosts asked for v+1 (NULL: none yet) */
	char reported[24]; /* the last st_reported seen by the duty holder */
	bool holder;       /* the last duty_held() */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static round_coord *g_coord;

typedef struct {
	long long host_id;
	long long samples;
	const char *endpoint;
	double bandwidth;
	bool can_aggregate;
	json_t *rtt; /* borrowed from the peers array */
	int group;
	uint64_t lo, hi;
} peer;

static const dbc_stmt st_close = { "round_close_due", "SELECT round_close_due($1, $2)", 2 };
static const dbc_stmt st_expire = { "round_expire_averaging", "SELECT round_expire_averaging()", 0 };
static const dbc_stmt st_spot_expire = { "spot_expire", "SELECT spot_expire()", 0 };
static const dbc_stmt st_seed2_expire = { "round_seed2_expire", "SELECT round_seed2_expire()", 0 };
static const dbc_stmt st_closing = { "round_closing",
	                             "SELECT r.project_id, r.version, p.name FROM round r"
	                             " JOIN project p ON p.id = r.project_id WHERE r.state = 'closing'"
	                             " ORDER BY r.closed_at LIMIT 100",
	                             0 };
static const dbc_stmt st_begin = { "round_plan_begin", "SELECT round_plan_begin($1, $2, $3)::text", 3 };
static const dbc_stmt st_store = { "round_plan_store",
	                           "SELECT round_plan_store($1, $2, $3, $4::jsonb, $5, $6::boolean)", 6 };
static const dbc_stmt st_fail = { "round_fail", "SELECT round_fail($1, $2, $3)", 3 };
/* What long polls wait on, for every round not committed (a commit drops
 * its row from the set): a change, made by this process or another one
 * sharing the database, wakes them.  Two digests: the rounds' states and
 * attempts (a round opened, closed, planned, committed or rerun: every kind
 * of held request looks again), and the mean's hash (plan and outcome polls
 * look again); then, across groups between the peers, the hosts asked for
 * v+1 (round_checkpoint_uploader), ascending: only their outcome polls are
 * woken (a thousand others looking again took 2 s of the threads). */
static const dbc_stmt st_moved = {
	"round_moved",
	"SELECT md5(coalesce(string_agg(project_id || ':' || version || ':' || state || ':' ||"
	" attempt, ',' ORDER BY project_id, version), '')),"
	" md5(coalesce(string_agg(coalesce(gradient_sha256, ''), ',' ORDER BY project_id, version), '')),"
	" coalesce(string_agg(u::text, ',' ORDER BY u), '')"
	" FROM round LEFT JOIN LATERAL (SELECT round_checkpoint_uploader(project_id, version) AS u"
	"                                WHERE cross_peers AND state = 'averaging') x ON true"
	" WHERE state IN ('open', 'closing', 'averaging')",
	0
};

/* The reports of the closing rounds, which the duty holder watches: a
 * report served by another process sharing the database cannot wake this
 * one's coordinator (round_coord_wake), so a change in their count makes it
 * pass at its next look instead of at round_interval.  Not part of
 * st_moved: that wakes every long poll, and reports come in storms. */
static const dbc_stmt st_reported = { "round_closing_reports",
	                              "SELECT count(*) FROM round_report rr"
	                              " JOIN round r USING (project_id, version)"
	                              " WHERE r.state = 'closing'",
	                              0 };

/* One statement; false (logged) on failure.  *out (when not NULL) gets the
 * result, which the caller PQclear()s. */
static bool run(const dbc_stmt *st, const char *const *params, PGresult **out)
{
	PGresult *r;
	char state[6];
	cot_errbuf eb = { 0 };
	if (dbc_exec(st, params, &r, state, &eb)) {
		log_warn("round coordinator: %s: %s", st->name, eb.msg);
		return false;
	}
	if (out)
		*out = r;
	else
		PQclear(r);
	return true;
}

/* The parameter count of the project's model (config "model"), or 0 with eb
 * filled when it is not a valid model. */
static uint64_t param_count(const json_t *model, cot_errbuf *eb)
{
	if (!json_is_object(model)) {
		cot_seterr(eb, COT_ERR_INVALID, "the project's config has no model");
		return 0;
	}
	kern_config c;
	if (kern_model_config_from_json(model, "model", KERN_MODEL_JSON_DEFAULTS, &c, eb) ||
	    kern_config_validate(&c, eb))
		return 0;
	return (uint64_t)kern_param_count(&c);
}

/* Group peers[0..n) (ordered by host id) with grp_form; group ids from
 * *next_group on. */
static cot_err form_groups(peer *p, int n, int max_size, int *next_group, cot_errbuf *eb)
{
	int n_agg = 0;
	for (int i = 0; i < n; i++)
		n_agg += p[i].can_aggregate;
	bool *agg = malloc((size_t)n * sizeof *agg);
	double *rtt = malloc((size_t)n * (size_t)n * sizeof *rtt);
	int *group = malloc((size_t)n * sizeof *group);
	cot_err rc = COT_OK;
	if (!agg || !rtt || !group) {
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		goto out;
	}
	/* With fewer aggregators than groups some group would have none: make
	 * the groups larger.  With none at all, everyone aggregates (through
	 * the relay). */
	for (int i = 0; i < n; i++)
		agg[i] = p[i].can_aggregate || n_agg == 0;
	if (n_agg > 0 && (n + n_agg - 1) / n_agg > max_size)
		max_size = (n + n_agg - 1) / n_agg;
	for (int i = 0; i < n * n; i++)
		rtt[i] = -1;
	for (int i = 0; i < n; i++) {
		const char *k;
		json_t *v;
		json_object_foreach(p[i].rtt, k, v)
		{
			long long id = strtoll(k, NULL, 10);
			int lo = 0, hi = n; /* binary search by host id */
			while (lo < hi) {
				int mid = (lo + hi) / 2;
				if (p[mid].host_id < id)
					lo = mid + 1;
				else
					hi = mid;
			}
			if (lo < n && p[lo].host_id == id && lo != i && json_is_number(v))
				rtt[(size_t)i * (size_t)n + (size_t)lo] = json_number_value(v);
		}
	}
	int ng = 0;
	rc = grp_form(n, rtt, agg, max_size, group, &ng, eb);
	if (!rc)
		for (int i = 0; i < n; i++)
			p[i].group = *next_group + group[i];
	*next_group += ng;
out:
	free(agg);
	free(rtt);
	free(group);
	return rc;
}

/* Each group's shares of the vector [0, len): lb_shares over the group's
 * members (in host order), then lb_split. */
static cot_err share_groups(peer *p, int n, int n_groups, uint64_t len, cot_errbuf *eb)
{
	lb_peer *lp = malloc((size_t)n * sizeof *lp);
	int *idx = malloc((size_t)n * sizeof *idx);
	double *w = malloc((size_t)n * sizeof *w);
	uint64_t *start = malloc(((size_t)n + 1) * sizeof *start);
	cot_err rc = COT_OK;
	if (!lp || !idx || !w || !start) {
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		goto out;
	}
	for (int g = 0; g < n_groups && !rc; g++) {
		int m = 0, n_agg = 0;
		for (int i = 0; i < n; i++)
			if (p[i].group == g) {
				idx[m] = i;
				lp[m].bandwidth = p[i].bandwidth;
				lp[m].can_aggregate = p[i].can_aggregate;
				n_agg += p[i].can_aggregate;
				m++;
			}
		if (m == 0)
			continue;
		for (int j = 0; j < m && n_agg == 0; j++)
			lp[j].can_aggregate = true; /* as in form_groups */
		rc = lb_shares(lp, m, w, NULL, eb);
		if (rc)
			break;
		lb_split(w, m, len, start);
		for (int j = 0; j < m; j++) {
			p[idx[j]].lo = start[j];
			p[idx[j]].hi = start[j + 1];
		}
	}
out:
	free(lp);
	free(idx);
	free(w);
	free(start);
	return rc;
}

static void fail_round(const char *sp, const char *sv, const char *why)
{
	log_warn("round coordinator: round %s of project %s fails: %s", sv, sp, why);
	const char *params[] = { sp, sv, why };
	run(&st_fail, params, NULL);
}

/* Plan one closing round (project id sp, named name; version sv), if it is
 * ready. */
static void plan_round(const srv_config *cfg, const char *sp, const char *sv, const char *name)
{
	char timeout[24];
	snprintf(timeout, sizeof timeout, "%d", cfg->round_report_timeout);
	const char *params[] = { sp, sv, timeout };
	PGresult *r;
	if (!run(&st_begin, params, &r))
		return;
	json_t *begin = NULL;
	if (PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
		begin = json_loads(PQgetvalue(r, 0, 0), 0, NULL);
	PQclear(r);
	if (!begin)
		return; /* not ready, or no longer closing */
	json_t *peers = json_object_get(begin, "peers");
	int n = (int)json_array_size(peers);
	peer *p = NULL;
	json_t *members = NULL;
	char *text = NULL;
	cot_errbuf eb = { 0 };
	uint64_t len = param_count(json_object_get(begin, "model"), &eb);
	if (json_is_true(json_object_get(begin, "reopened"))) {
		log_info("round coordinator: round %s of project %s holds only %lld samples after the close, "
		         "fewer than its min_batch_fraction: open again for the rest",
		         sv, sp, (long long)json_integer_value(json_object_get(begin, "samples")));
		http_wake_held(); /* the reported hosts' plan polls, the waiting work requests */
		goto out;
	}
	if (n == 0) {
		log_info("round coordinator: round %s of project %s had no peer left; open again", sv, sp);
		http_wake_held();
		goto out;
	}
	if (len == 0) {
		fail_round(sp, sv, eb.msg);
		goto out;
	}
	p = calloc((size_t)n, sizeof *p);
	members = json_array();
	if (!p || !members)
		goto out;
	for (int i = 0; i < n; i++) {
		json_t *e = json_array_get(peers, (size_t)i);
		p[i].host_id = json_integer_value(json_object_get(e, "host_id"));
		p[i].samples = json_integer_value(json_object_get(e, "samples"));
		p[i].endpoint = json_string_value(json_object_get(e, "endpoint"));
		p[i].bandwidth = json_number_value(json_object_get(e, "bandwidth"));
		p[i].can_aggregate = json_is_true(json_object_get(e, "can_aggregate"));
		p[i].rtt = json_object_get(e, "rtt");
	}
	int n_groups = 0;
	int64_t t_group = deadline_now_ms();
	for (int at = 0; at < n; at += GROUPING_CHUNK) {
		int m = n - at < GROUPING_CHUNK ? n - at : GROUPING_CHUNK;
		if (form_groups(p + at, m, cfg->round_max_group, &n_groups, &eb))
			break;
	}
	if (eb.msg[0] || share_groups(p, n, n_groups, len, &eb)) {
		fail_round(sp, sv, eb.msg);
		goto out;
	}
	for (int i = 0; i < n; i++)
		json_array_append_new(members,
		                      json_pack("{s:I, s:i, s:I, s:s, s:f, s:b, s:I, s:I}", "host_id",
		                                (json_int_t)p[i].host_id, "group", p[i].group, "samples",
		                                (json_int_t)p[i].samples, "endpoint",
		                                p[i].endpoint ? p[i].endpoint : "", "bandwidth",
		                                p[i].bandwidth, "can_aggregate", p[i].can_aggregate, "lo",
		                                (json_int_t)p[i].lo, "hi", (json_int_t)p[i].hi));
	text = json_dumps(members, JSON_COMPACT);
	if (!text)
		goto out;
	char slen[24], savg[24];
	snprintf(slen, sizeof slen, "%llu", (unsigned long long)len);
	snprintf(savg, sizeof savg, "%d", cfg->round_average_timeout);
	/* Between the peers unless told otherwise or the plan has fewer than
	 * three: a lone peer's bytes only the server can sketch, and of two
	 * peers that disagree on v+1 no strict majority can tell which holds
	 * it, where the server's own step can (doc/averaging.md). */
	bool cross = cfg->round_cross_peers || (!cfg->round_server_mean && n >= 3);
	const char *sparams[] = { sp, sv, slen, text, savg, cross ? "true" : "false" };
	int64_t t_store = deadline_now_ms();
	if (run(&st_store, sparams, NULL)) {
		/* Every member's answer in one query before the polls wake: they
		 * find it after one check of the round's stamp (server/plan_cache.h). */
		int64_t t_fill = deadline_now_ms();
		plan_cache_fill(name, strtoll(sv, NULL, 10), http_wake_gen_of(HTTP_HOLD_PLAN));
		http_wake(HTTP_WAKE(HTTP_HOLD_PLAN)); /* long polls waiting for the plan */
		log_info("round coordinator: round %s of project %s planned: %d peers in %d groups, "
		         "%llu parameters (grouped in %lld ms, stored in %lld ms, cached in %lld ms)",
		         sv, sp, n, n_groups, (unsigned long long)len, (long long)(t_store - t_group),
		         (long long)(t_fill - t_store), (long long)(deadline_now_ms() - t_fill));
	}
out:
	free(text);
	json_decref(members);
	free(p);
	json_decref(begin);
}

/* Wake this process's long polls when the rounds moved since the last look,
 * whoever moved them (this process, another one sharing the database, a
 * failure at a deadline). */
static void watch(round_coord *rc)
{
	PGresult *r;
	if (!run(&st_moved, NULL, &r))
		return;
	unsigned wake = 0;
	bool ok = PQntuples(r) == 1 && PQnfields(r) == 3;
	for (int i = 0; i < 2 && ok; i++) {
		if (strcmp(rc->moved[i], PQgetvalue(r, 0, i)) == 0)
			continue;
		if (rc->moved[i][0])
			wake |= i == 0 ? HTTP_WAKE_ALL
			               : HTTP_WAKE(HTTP_HOLD_PLAN) | HTTP_WAKE(HTTP_HOLD_OUTCOME);
		snprintf(rc->moved[i], sizeof rc->moved[i], "%s", PQgetvalue(r, 0, i));
	}
	/* The uploaders: each one's poll when the list changed (a host named
	 * again is woken again, which costs one look). */
	const char *up = ok ? PQgetvalue(r, 0, 2) : NULL;
	if (up && strcmp(rc->uploaders ? rc->uploaders : "", up) != 0) {
		char *keep = strdup(up);
		if (!keep) {
			wake |= HTTP_WAKE(HTTP_HOLD_OUTCOME); /* out of memory: all of them, once */
		} else if (!(wake & HTTP_WAKE(HTTP_HOLD_OUTCOME))) {
			for (const char *p = up; *p;) {
				char *end;
				long long id = strtoll(p, &end, 10);
				if (end == p)
					break;
				http_wake_tag(HTTP_WAKE(HTTP_HOLD_OUTCOME), id);
				p = *end == ',' ? end + 1 : end;
			}
		}
		free(rc->uploaders);
		rc->uploaders = keep;
	}
	PQclear(r);
	if (wake)
		http_wake(wake);
}

/* True when the duty holder should pass now: the closing rounds' reports
 * changed since its last look, maybe through another process. */
static bool reports_moved(round_coord *rc)
{
	PGresult *r;
	if (!run(&st_reported, NULL, &r))
		return false;
	bool moved = false;
	if (PQntuples(r) == 1 && strcmp(rc->reported, PQgetvalue(r, 0, 0)) != 0) {
		moved = rc->reported[0] != 0;
		snprintf(rc->reported, sizeof rc->reported, "%s", PQgetvalue(r, 0, 0));
	}
	PQclear(r);
	return moved;
}

/* The coordinator's duty: close due rounds, expire overdue averaging, spot
 * checks and checks under a second seed, plan the closing rounds. */
static void pass(const srv_config *cfg)
{
	char frac[40], budget[24];
	snprintf(frac, sizeof frac, "%.17g", cfg->round_close_fraction);
	snprintf(budget, sizeof budget, "%d", cfg->round_straggler_budget);
	const char *cparams[] = { frac, budget };
	run(&st_close, cparams, NULL);
	run(&st_expire, NULL, NULL);
	run(&st_spot_expire, NULL, NULL);  /* overdue spot checks, whoever asks or not */
	run(&st_seed2_expire, NULL, NULL); /* sketches under a second seed that never came */
	PGresult *r;
	if (!run(&st_closing, NULL, &r))
		return;
	for (int i = 0; i < PQntuples(r); i++)
		plan_round(cfg, PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2));
	PQclear(r);
}

/* t plus ms milliseconds. */
static struct timespec after_ms(struct timespec t, long ms)
{
	t.tv_nsec += ms * 1000000L;
	t.tv_sec += t.tv_nsec / 1000000000L;
	t.tv_nsec %= 1000000000L;
	return t;
}

static bool before(struct timespec a, struct timespec b)
{
	return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

/* db_listen's callback: a round moved in the database. */
static void on_notify(void *arg)
{
	round_coord *rc = arg;
	pthread_mutex_lock(&rc->lock);
	rc->notified = true;
	pthread_cond_signal(&rc->wake);
	pthread_mutex_unlock(&rc->lock);
}

static void *coord_main(void *arg)
{
	round_coord *rc = arg;
	struct timespec next_pass;
	clock_gettime(CLOCK_MONOTONIC, &next_pass);
	next_pass.tv_sec += rc->cfg->round_interval;
	pthread_mutex_lock(&rc->lock);
	while (!rc->stop) {
		/* Look again at WATCH_MS, when woken, or when notified (at least
		 * NOTIFIED_GAP_MS after this look). */
		struct timespec now, looked;
		clock_gettime(CLOCK_MONOTONIC, &looked);
		struct timespec until = after_ms(looked, WATCH_MS), gap = after_ms(looked, NOTIFIED_GAP_MS);
		for (;;) {
			if (rc->stop || rc->woken)
				break;
			if (rc->notified) {
				clock_gettime(CLOCK_MONOTONIC, &now);
				if (!before(now, gap))
					break;
				if (before(gap, until))
					until = gap;
			}
			if (pthread_cond_timedwait(&rc->wake, &rc->lock, &until) != 0)
				break; /* the time came */
		}
		rc->notified = false;
		if (rc->stop)
			break;
		clock_gettime(CLOCK_MONOTONIC, &now);
		bool due = rc->woken || now.tv_sec > next_pass.tv_sec ||
		           (now.tv_sec == next_pass.tv_sec && now.tv_nsec >= next_pass.tv_nsec);
		rc->woken = false;
		pthread_mutex_unlock(&rc->lock);
		if (!due && rc->holder)
			due = reports_moved(rc);
		if (due) {
			next_pass = now;
			next_pass.tv_sec += rc->cfg->round_interval;
			if ((rc->holder = duty_held(rc->duty)))
				pass(rc->cfg);
		}
		watch(rc);
		pthread_mutex_lock(&rc->lock);
	}
	pthread_mutex_unlock(&rc->lock);
	dbc_close_thread();
	return NULL;
}

cot_err round_coord_start(const srv_config *cfg, round_coord **out, cot_errbuf *eb)
{
	round_coord *rc = calloc(1, sizeof *rc);
	if (!rc)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	rc->cfg = cfg;
	cot_err err = duty_open(cfg->conninfo, DUTY_ROUNDS, &rc->duty, eb);
	if (err) {
		free(rc);
		return err;
	}
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&rc->wake, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&rc->lock, NULL);
	cot_errbuf le = { "", "" };
	if (db_listen_start(cfg->conninfo, "cotrain_round", on_notify, rc, &rc->listen, &le))
		log_warn("round coordinator: %s; rounds moved by other processes are seen within %d ms",
		         le.msg, WATCH_MS);
	if (pthread_create(&rc->thread, NULL, coord_main, rc)) {
		db_listen_stop(rc->listen);
		pthread_cond_destroy(&rc->wake);
		pthread_mutex_destroy(&rc->lock);
		duty_close(rc->duty);
		free(rc);
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not start the round coordinator thread");
	}
	pthread_mutex_lock(&g_lock);
	g_coord = rc;
	pthread_mutex_unlock(&g_lock);
	*out = rc;
	return COT_OK;
}

void round_coord_wake(void)
{
	pthread_mutex_lock(&g_lock);
	round_coord *rc = g_coord;
	if (rc) {
		pthread_mutex_lock(&rc->lock);
		rc->woken = true;
		pthread_cond_signal(&rc->wake);
		pthread_mutex_unlock(&rc->lock);
	}
	pthread_mutex_unlock(&g_lock);
}

void round_coord_stop(round_coord *rc)
{
	if (!rc)
		return;
	pthread_mutex_lock(&g_lock);
	g_coord = NULL;
	pthread_mutex_unlock(&g_lock);
	pthread_mutex_lock(&rc->lock);
	rc->stop = true;
	pthread_cond_signal(&rc->wake);
	pthread_mutex_unlock(&rc->lock);
	pthread_join(rc->thread, NULL);
	db_listen_stop(rc->listen);
	pthread_cond_destroy(&rc->wake);
	pthread_mutex_destroy(&rc->lock);
	duty_close(rc->duty);
	free(rc->uploaders);
	free(rc);
}
