/* cotrain client: the work loop (see daemon.h). */
#include "client/daemon.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "client/download.h"
#include "client/idle.h"
#include "client/peer_fetch.h"
#include "client/power.h"
#include "client/priority.h"
#include "client/shard_cache.h"
#include "client/cheat.h"
#include "client/spotcheck.h"
#include "client/throttle.h"
#include "kernels/backend.h"
#include "shared/common/hash.h"
#include "shared/common/json.h"
#include "shared/common/log.h"

#define ACCOUNT_CHECK_S 3600
#define DEADLINE_MARGIN_S 1 /* hand back this long before the deadline (units may live only seconds) */
#define ROUND_RETRY_MAX_S 2 /* seconds between asks for work while a round commits */
#define WORK_WAIT_S 20      /* how long the server may hold a work request (a long poll) */
#define SPOT_SHARE 0.1      /* of the wall time, at most, for spot checks */
#define SPOT_PASS_MIN_S 1.0
#define SPOT_PASS_MAX_S 60.0

void cl_daemon_prefs(cl_daemon *d, cl_prefs *out)
{
	cl_prefs_defaults(out);
	for (int i = 0; i < d->st.nprojects; i++)
		cl_prefs_overlay(out, &d->st.projects[i].account_prefs);
	cl_prefs_overlay(out, &d->cfg.prefs);
	cl_prefs_overlay(out, &d->st.local_prefs);
}

void cl_daemon_api_opts(cl_daemon *d, cl_api_opts *o)
{
	cl_prefs p;
	cl_daemon_prefs(d, &p);
	o->timeout_s = d->cfg.http_timeout;
	o->upload_limit = p.v[PREF_UPLOAD_LIMIT];
}

cot_err cl_daemon_save(cl_daemon *d)
{
	cot_errbuf eb = { "", "" };
	d->st.saved_at = (int64_t)time(NULL);
	cot_err rc = cl_state_save(&d->st, d->cfg.state_dir, &eb);
	if (rc) {
		if (!d->state_error)
			log_error("%s; computing waits until the state can be saved%s%s", eb.msg,
			          eb.hint[0] ? ". " : "", eb.hint);
		d->state_error = 1;
	} else if (d->state_error) {
		log_info("state saved again; computing resumes");
		d->state_error = 0;
	}
	return rc;
}

void cl_daemon_remove_project(cl_daemon *d, int i)
{
	if (i < 0 || i >= d->st.nprojects)
		return;
	/* A session the worker computes with right now is closed by the worker. */
	/* A session the worker or a round computes with right now is closed
	 * by them. */
	if (d->rt[i].session != d->computing && !d->rt[i].round_running)
		cl_compute_close(d->rt[i].session);
	cl_piece_server_stop(d->rt[i].pieces);
	cl_peer_free(&d->rt[i].peer);
	cl_spot_job_free(d->rt[i].spot);
	cl_peer_forget(&d->st.projects[i], d->cfg.state_dir);
	memmove(&d->rt[i], &d->rt[i + 1], (size_t)(d->st.nprojects - i - 1) * sizeof d->rt[0]);
	memset(&d->rt[d->st.nprojects - 1], 0, sizeof d->rt[0]);
	cl_state_remove(&d->st, i);
}

void cl_daemon_pieces_lend(cl_daemon *d, int i)
{
	cl_runtime *rt = &d->rt[i];
	if (!rt->peer.lst || !rt->peer.ctx)
		return;
	if (!rt->pieces) {
		cot_errbuf eb = { "", "" };
		if (!(rt->pieces = cl_piece_server_start(d->st.projects[i].name, &eb))) {
			log_warn("project %s: could not serve checkpoint pieces: %s", d->st.projects[i].name,
			         eb.msg);
			return;
		}
	}
	cl_prefs prefs;
	cl_daemon_prefs(d, &prefs);
	cl_piece_server_attach(rt->pieces, rt->peer.lst, rt->peer.ctx, prefs.v[PREF_UPLOAD_LIMIT]);
}

void cl_daemon_drop_gradient(cl_daemon *d, int i, const char *why)
{
	cl_runtime *rt = &d->rt[i];
	if (rt->session && rt->acc.n > 0)
		log_warn("project %s: dropping the gradient of version %lld (%d work units): %s",
		         d->st.projects[i].name, (long long)rt->session_version, rt->acc.n, why);
	if (rt->session != d->computing)
		cl_compute_close(rt->session);
	rt->session = NULL;
	rt->session_wu = 0;
	rt->round_due = 0;
	memset(&rt->acc, 0, sizeof rt->acc);
}

/* The entry of work unit id in project i's gradient, or NULL. */
static int acc_find(const cl_round_acc *a, int64_t id)
{
	for (int k = 0; k < a->n; k++)
		if (a->u[k].id == id)
			return k;
	return -1;
}

/* Remember what an answer's "round" says (lock held): when the round of
 * the version our gradient is for is no longer open, take part in it. */
void cl_daemon_note_round(cl_daemon *d, int i, const json_t *answer)
{
	const json_t *r = json_object_get(answer, "round");
	const char *st = NULL;
	long long v = -1, att = 0;
	if (!json_is_object(r) || cot_json_str(r, "state", true, 1, 15, &st, NULL) ||
	    cot_json_int(r, "version", true, 0, 1LL << 31, &v, NULL))
		return;
	cot_json_int(r, "attempt", false, 1, 1LL << 31, &att, NULL);
	long long spread = 0;
	if (cot_json_int(r, "report_spread_ms", false, 0, 60000, &spread, NULL))
		spread = 0;
	cl_runtime *rt = &d->rt[i];
	if (strcmp(st, "open") != 0 && rt->session && rt->session_version == v && rt->acc.n > 0) {
		if (!rt->round_due)
			log_info("project %s: round %lld is %s; reporting %d work units",
			         d->st.projects[i].name, v, st, rt->acc.n);
		rt->round_due = 1;
		rt->round_version = v;
		rt->round_attempt = att;
		rt->round_spread_ms = spread;
		d->interrupt = 1; /* stop computing: the round needs us */
	}
}

int cl_daemon_find(cl_daemon *d, const char *url)
{
	for (int i = 0; i < d->st.nprojects; i++)
		if (strcmp(d->st.projects[i].url, url) == 0)
			return i;
	return -1;
}

void cl_daemon_kick(cl_daemon *d)
{
	pthread_mutex_lock(&d->lock);
	d->interrupt = 1;
	pthread_cond_broadcast(&d->wake);
	pthread_mutex_unlock(&d->lock);
}

void cl_daemon_clock_text(int64_t t, char *buf, size_t len)
{
	time_t tt = (time_t)t;
	struct tm tm;
	if (!localtime_r(&tt, &tm) || !strftime(buf, len, "%H:%M:%S", &tm))
		snprintf(buf, len, "?");
}

/* Ask the server for project i's host credit when it is time (lock held;
 * released during the request).  Looked at after each finished unit and
 * every CREDIT_REFRESH_S otherwise; a failure is not worth a backoff of the
 * work, only a later look. */
#define CREDIT_REFRESH_S 600
static void refresh_credit(cl_daemon *d, int i)
{
	cl_project copy = d->st.projects[i];
	d->rt[i].next_credit_at = cl_now_mono() + CREDIT_REFRESH_S;
	if (copy.host_id <= 0)
		return;
	cl_api_opts o;
	cl_daemon_api_opts(d, &o);
	pthread_mutex_unlock(&d->lock);
	double g = 0, pend = 0;
	cot_errbuf eb = { "", "" };
	cot_err rc = cl_api_host_credit(&o, copy.base, copy.host_id, &g, &pend, &eb);
	pthread_mutex_lock(&d->lock);
	i = cl_daemon_find(d, copy.url);
	if (i < 0)
		return; /* detached meanwhile */
	if (rc) {
		log_debug("project %s: could not read the host's credit: %s", copy.name, eb.msg);
		return;
	}
	d->rt[i].credit_granted = g;
	d->rt[i].credit_pending = pend;
	d->rt[i].credit_at = (int64_t)time(NULL);
}

void cl_daemon_activity(cl_daemon *d, int i, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(d->rt[i].activity, sizeof d->rt[i].activity, fmt, ap);
	va_end(ap);
}

/* Back off project i after a failure (lock held). */
static void fail(cl_daemon *d, int i, const char *what, const cot_errbuf *eb)
{
	if (d->stop)
		return; /* cut short by stopping (a download cancelled): no failure */
	double delay = cl_backoff_fail(&d->rt[i].bo, cl_now_mono(), cl_random01());
	log_warn("project %s: %s: %s%s%s; retrying in %.0f s", d->st.projects[i].name, what, eb->msg,
	         eb->hint[0] ? ". " : "", eb->hint, delay);
	char at[16];
	cl_daemon_clock_text((int64_t)time(NULL) + (int64_t)(delay + 0.5), at, sizeof at);
	cl_daemon_activity(d, i, "%s failed: %s; next attempt at %s", what, eb->msg, at);
}

void cl_daemon_update_paused(cl_daemon *d)
{
	cl_prefs p;
	cl_daemon_prefs(d, &p);
	d->threads = cl_prefs_threads(&p, d->hw.cores);
	/* The GPU, when usable and allowed now; the CPU otherwise. */
	int gpu = -1;
	if (p.v[PREF_USE_GPU] && p.v[PREF_GPU_DEVICE] < d->gpus) {
		gpu = (int)p.v[PREF_GPU_DEVICE];
		if (p.v[PREF_GPU_ONLY_WHEN_IDLE] &&
		    cl_idle_seconds(&d->cfg, &d->idle_source) < (double)p.v[PREF_IDLE_AFTER])
			gpu = -1;
	}
	cl_compute_use_gpu(gpu);
	d->paused[0] = '\0';
	if (d->state_error) {
		snprintf(d->paused, sizeof d->paused, "the state cannot be saved");
	} else if (d->st.suspended) {
		snprintf(d->paused, sizeof d->paused, "by the user");
	} else if (p.v[PREF_ONLY_ON_AC] && !cl_power_on_ac(d->cfg.power_supply_dir)) {
		snprintf(d->paused, sizeof d->paused, "on battery power");
	} else if (p.v[PREF_ONLY_WHEN_IDLE]) {
		double idle = cl_idle_seconds(&d->cfg, &d->idle_source);
		if (idle < (double)p.v[PREF_IDLE_AFTER])
			snprintf(d->paused, sizeof d->paused, "the user is active (%s)", d->idle_source);
	}
	for (int j = 0; j < d->st.nprojects; j++) {
		if (d->paused[0] && d->rt[j].bo.failures == 0)
			cl_daemon_activity(d, j, "suspended: %s", d->paused);
		else if (!d->paused[0] && strncmp(d->rt[j].activity, "suspended: ", 11) == 0)
			d->rt[j].activity[0] = '\0'; /* shown as waiting for its turn */
	}
}

void cl_daemon_check_clock(cl_daemon *d, int64_t wall, double mono)
{
	if (d->last_mono > 0) {
		double jump = (double)(wall - d->last_wall) - (mono - d->last_mono);
		if (fabs(jump) > 30) {
			log_warn("the system clock jumped by %+.0f s; deadlines were moved with it", jump);
			for (int i = 0; i < d->st.nprojects; i++)
				if (d->st.projects[i].has_work)
					d->st.projects[i].work.deadline += (int64_t)jump;
			cl_daemon_save(d);
		}
	}
	d->last_wall = wall;
	d->last_mono = mono;
}

/* Send a report for project i's work unit, journaled first (lock held on
 * entry and exit; released during the request).  Returns COT_OK when the
 * work unit is settled or the report acknowledged. */
static cot_err send_report(cl_daemon *d, int i, cl_report_op op, int64_t mb)
{
	cl_project *p = &d->st.projects[i];
	cl_work *w = &p->work;
	/* A journaled finish or hand-back is never replaced by something else. */
	if (w->pending_op == CL_REPORT_FINISH || w->pending_op == CL_REPORT_HANDBACK) {
		op = w->pending_op;
		mb = w->pending_mb;
	}
	w->pending_op = op;
	w->pending_mb = mb;
	if (cl_daemon_save(d))
		return COT_ERR_IO; /* nothing is sent unjournaled */
	cl_project copy = *p;
	double sps = d->rt[i].sps;
	cl_api_opts o;
	cl_daemon_api_opts(d, &o);
	pthread_mutex_unlock(&d->lock);
	cot_errbuf eb = { "", "" };
	json_t *answer = NULL;
	time_t date = 0;
	cot_err rc = cl_api_report(&o, &copy, op, copy.work.id, mb, sps, &answer, &date, &eb);
	pthread_mutex_lock(&d->lock);
	/* The project may have been detached meanwhile. */
	if (i >= d->st.nprojects || strcmp(d->st.projects[i].url, copy.url) != 0 ||
	    !d->st.projects[i].has_work || d->st.projects[i].work.id != copy.work.id) {
		json_decref(answer);
		return COT_OK;
	}
	if (answer) {
		cl_daemon_note_round(d, i, answer);
		/* A heartbeat moves the deadline (doc/api.md): take the server's,
		 * translated to our clock through its Date header. */
		const char *dl = NULL;
		int64_t t;
		if (op == CL_REPORT_HEARTBEAT && date > 0 &&
		    !cot_json_str(answer, "deadline", false, 10, 64, &dl, NULL) && dl &&
		    (t = cl_api_parse_timestamp(dl)) > 0)
			d->st.projects[i].work.deadline = (int64_t)time(NULL) + (t - (int64_t)date);
	}
	json_decref(answer);
	if (rc == COT_ERR_CONFLICT || rc == COT_ERR_NOT_FOUND || rc == COT_ERR_FORBIDDEN ||
	    op == CL_REPORT_HANDBACK) {
		/* The unit no longer counts: neither can a gradient that sums it. */
		if (acc_find(&d->rt[i].acc, copy.work.id) >= 0)
			cl_daemon_drop_gradient(d, i,
			                        rc ? "the server no longer counts one of its work units"
			                           : "one of its work units was handed back");
	}
	p = &d->st.projects[i];
	w = &p->work;
	static const char *names[] = { "", "heartbeat", "finish", "hand-back" };
	if (rc == COT_ERR_NETWORK || rc == COT_ERR_IO || rc == COT_ERR_NOMEM) {
		fail(d, i, names[op], &eb);
		return rc;
	}
	d->rt[i].last_report = cl_now_mono();
	if (rc == COT_OK && op == CL_REPORT_HEARTBEAT) {
		w->mb_reported = mb;
		w->pending_op = CL_REPORT_NONE;
		cl_backoff_ok(&d->rt[i].bo);
		cl_daemon_save(d);
		return COT_OK;
	}
	if (rc == COT_OK || rc == COT_ERR_CONFLICT || rc == COT_ERR_NOT_FOUND || rc == COT_ERR_FORBIDDEN) {
		/* Done with this work unit: acknowledged, or the server says it is
		 * no longer live (a resent finish after a crash lands here). */
		if (rc)
			log_warn("project %s: %s of work unit %lld: %s; dropping it", p->name, names[op],
			         (long long)w->id, eb.msg);
		else
			log_info("project %s: work unit %lld %s with %lld microbatches", p->name,
			         (long long)w->id,
			         op == CL_REPORT_FINISH     ? "finished"
			         : op == CL_REPORT_HANDBACK ? "handed back"
			                                    : "reported",
			         (long long)mb);
		if (op == CL_REPORT_FINISH || op == CL_REPORT_HANDBACK || rc) {
			if (rc == COT_OK)
				p->mb_total += mb;
			d->rt[i].next_credit_at = 0; /* a new grant may be pending */
			cl_project_mark_done(p, w->id);
			p->has_work = 0;
			memset(w, 0, sizeof *w);
			d->rt[i].download_failures = 0;
		} else {
			w->pending_op = CL_REPORT_NONE;
		}
		cl_backoff_ok(&d->rt[i].bo);
		cl_daemon_save(d);
		return COT_OK;
	}
	/* 400 or 401: a bug or a revoked host; wait long and say so. */
	fail(d, i, names[op], &eb);
	return rc;
}

static void hand_back(cl_daemon *d, int i, const char *why)
{
	cl_work *w = &d->st.projects[i].work;
	log_warn("project %s: handing back work unit %lld: %s", d->st.projects[i].name, (long long)w->id,
	         why);
	send_report(d, i, CL_REPORT_HANDBACK, w->mb_done);
}

/* Checkpoint sha (size bytes) of project i from the peers that hold it
 * (client/peer_fetch.h), with our peer identity and listener made ready
 * first: a joiner has none before its first round.  Lock not held; the
 * peer is taken from the runtime meanwhile, as a round takes it (no round
 * runs: the project has no session). */
static cot_err from_peers(cl_daemon *d, int i, const cl_project *p, const cl_api_opts *o,
                          const cl_fetch_env *env, const char *sha, int64_t size, char *dest, size_t destlen,
                          cot_errbuf *eb)
{
	pthread_mutex_lock(&d->lock);
	if (i >= d->st.nprojects || strcmp(d->st.projects[i].url, p->url) != 0 || d->rt[i].round_running) {
		pthread_mutex_unlock(&d->lock);
		return cot_seterr(eb, COT_ERR_CONFLICT, "the project is busy");
	}
	cl_peer pe = d->rt[i].peer;
	memset(&d->rt[i].peer, 0, sizeof d->rt[i].peer);
	cl_piece_server_detach(d->rt[i].pieces);
	pthread_mutex_unlock(&d->lock);

	nat_config nc;
	dialer *dl = NULL;
	cot_err rc = cl_peer_ready(&pe, o, p, &d->cfg, eb);
	if (!rc)
		rc = cl_peer_nat_config(&pe, p, &d->cfg, &nc) ? nat_dialer_new(&nc, p->name, 0, &dl, eb)
		                                              : dialer_direct_new(&dl, eb);
	cl_peer_fetch_info info;
	if (!rc)
		rc = cl_peer_fetch(env, o, p, pe.ctx, dl, sha, size, dest, destlen, &info, eb);
	dialer_free(dl);

	pthread_mutex_lock(&d->lock);
	if (i < d->st.nprojects && strcmp(d->st.projects[i].url, p->url) == 0) {
		d->rt[i].peer = pe;
		cl_daemon_pieces_lend(d, i);
	} else {
		cl_peer_free(&pe); /* detached meanwhile */
	}
	pthread_mutex_unlock(&d->lock);
	return rc;
}

/* Before asking for work: the project's current checkpoint into the cache
 * (lock held; released while fetching).  A work unit's deadline runs from
 * its assignment, so a checkpoint fetched after it over a slow or
 * rate-limited link (download_limit) could outlast the unit, which would
 * expire and come back over and over; fetched first, the unit starts at
 * once.  Returns 1 when the worker may ask for work now. */
static int prefetch_checkpoint(cl_daemon *d, int i)
{
	cl_project copy = d->st.projects[i];
	char held[65];
	snprintf(held, sizeof held, "%s", d->rt[i].session ? d->rt[i].session_ckpt : "");
	cl_api_opts o;
	cl_daemon_api_opts(d, &o);
	cl_prefs prefs;
	cl_daemon_prefs(d, &prefs);
	cl_fetch_env env = { .cache_dir = d->cache_dir,
		             .downloads_dir = d->downloads_dir,
		             .max_file_bytes = d->cfg.max_file_bytes,
		             .timeout_s = d->cfg.http_timeout,
		             .cancel = &d->stop,
		             .rate_limit = prefs.v[PREF_DOWNLOAD_LIMIT] };
	pthread_mutex_unlock(&d->lock);
	cot_errbuf eb = { "", "" };
	json_t *info = NULL;
	cot_err rc = cl_api_project(&o, &copy, &info, &eb);
	const json_t *ck = json_object_get(info, "checkpoint");
	const char *sha = NULL;
	long long size = 0;
	char sha_copy[65] = "", dest[PATH_MAX];
	int fetched = 0;
	if (!rc && json_is_object(ck) && !cot_json_str(ck, "sha256", true, 64, 64, &sha, NULL) &&
	    hash_is_sha256_hex(sha) && !cot_json_int(ck, "size", true, 1, 1LL << 40, &size, NULL) &&
	    strcmp(sha, held) != 0 && !cl_cache_has(d->cache_dir, sha, size)) {
		snprintf(sha_copy, sizeof sha_copy, "%s", sha);
		char part[PATH_MAX + 80];
		struct stat pst;
		snprintf(part, sizeof part, "%s/%s.part", d->downloads_dir, sha);
		int resumed = stat(part, &pst) == 0 && pst.st_size > 0;
		pthread_mutex_lock(&d->lock);
		cl_daemon_activity(d, i, "downloading checkpoint %s (%lld bytes) before asking for work", sha,
		                   size);
		pthread_mutex_unlock(&d->lock);
		/* From the peers that hold it, the server filling in; a server
		 * without the route, or any failure, leaves it to the whole
		 * download below. */
		cot_errbuf pe = { "", "" };
		rc = resumed ? COT_ERR_EXISTS
		             : from_peers(d, i, &copy, &o, &env, sha, size, dest, sizeof dest, &pe);
		if (rc && !resumed)
			log_info("project %s: checkpoint %s not from peers (%s); downloading it whole",
			         copy.name, sha, pe.msg);
		if (rc)
			rc = cl_cache_fetch(&env, copy.base, copy.host_token, sha, size, dest, sizeof dest,
			                    NULL, &eb);
		if (!rc) {
			log_info("project %s: downloaded %s (%lld bytes%s) before asking for work", copy.name,
			         sha, size, resumed ? ", resumed" : "");
			fetched = 1;
		} else if (rc == COT_ERR_NOT_FOUND)
			rc = COT_OK; /* a newer version replaced it meanwhile: the unit will say which */
	}
	json_decref(info);
	pthread_mutex_lock(&d->lock);
	if (i >= d->st.nprojects || strcmp(d->st.projects[i].url, copy.url) != 0)
		return 0; /* detached meanwhile */
	if (fetched) {
		cl_daemon_pieces_lend(d, i);
		cl_piece_server_hold(d->rt[i].pieces, sha_copy, dest, (uint64_t)size);
	}
	if (rc) {
		fail(d, i, "fetching the checkpoint", &eb);
		return 0;
	}
	return 1;
}

/* Ask for a work unit (lock held; released during the requests). */
static void get_work(cl_daemon *d, int i)
{
	cl_project copy = d->st.projects[i];
	cl_api_opts o;
	cl_daemon_api_opts(d, &o);
	cl_daemon_activity(d, i, "asking for work");
	/* The server may hold the request until the round moves (cut short by
	 * an interrupt: a command, stopping), unless another project could use
	 * the worker meanwhile. */
	int others = 0;
	for (int j = 0; j < d->st.nprojects; j++)
		others += j != i && !d->rt[j].round_running;
	int wait_s = others ? 0 : WORK_WAIT_S;
	d->interrupt = 0;
	pthread_mutex_unlock(&d->lock);
	cot_errbuf eb = { "", "" };
	cot_err rc = COT_OK;
	if (copy.model.n_layer == 0 || !copy.mode.known)
		rc = cl_api_project(&o, &copy, NULL, &eb);
	cl_work *w = malloc(sizeof *w);
	if (!w)
		rc = cot_seterr(&eb, COT_ERR_NOMEM, "out of memory");
	json_t *refusal = NULL;
	double t0 = cl_now_mono();
	if (!rc)
		rc = cl_api_request_work(&o, &copy, w, wait_s, &d->interrupt, &refusal, &eb);
	double waited = cl_now_mono() - t0;
	pthread_mutex_lock(&d->lock);
	if (i >= d->st.nprojects || strcmp(d->st.projects[i].url, copy.url) != 0) {
		free(w);
		json_decref(refusal);
		return; /* detached meanwhile */
	}
	cl_project *p = &d->st.projects[i];
	if (rc == COT_ERR_TIMEOUT && d->interrupt) {
		/* The wait was cut short (stopping, a command, a round): look again. */
		free(w);
		json_decref(refusal);
		return;
	}
	if (rc == COT_ERR_CONFLICT && json_is_object(json_object_get(refusal, "round"))) {
		/* No work while a round is not open, or while its target is
		 * covered by the work out: take part in it, or wait. */
		free(w);
		long long after = 10;
		cot_json_int(refusal, "retry_after", false, 1, 3600, &after, NULL);
		cl_daemon_note_round(d, i, refusal);
		int full = json_is_true(json_object_get(json_object_get(refusal, "round"), "full"));
		json_decref(refusal);
		if (!d->rt[i].round_due) {
			/* The server held the request until the round moved (or the
			 * wait ran out): ask again at once.  One that answered at
			 * once does not hold: ask again soon, as a round commits
			 * seconds after it plans. */
			d->rt[i].bo.next_at =
			        cl_now_mono() +
			        (waited >= 1
			                 ? 0
			                 : (double)(after < ROUND_RETRY_MAX_S ? after : ROUND_RETRY_MAX_S));
			cl_daemon_activity(d, i,
			                   full ? "waiting: the round's batch is being computed by others"
			                        : "waiting for the round to commit");
		}
		return;
	}
	json_decref(refusal);
	if (rc) {
		free(w);
		fail(d, i, "asking for work", &eb);
		return;
	}
	if (cl_project_recently_done(p, w->id)) {
		log_warn("project %s: server handed out work unit %lld again, which this client already "
		         "reported",
		         p->name, (long long)w->id);
		free(w);
		fail(d, i, "asking for work", &(cot_errbuf){ "a finished work unit came back", "" });
		return;
	}
	p->seq_len = copy.seq_len;
	p->microbatch_size = copy.microbatch_size;
	p->mb_per_epoch = copy.mb_per_epoch;
	p->flops_per_sample = copy.flops_per_sample;
	p->model = copy.model;
	p->mode = copy.mode;
	p->seed = copy.seed;
	p->work = *w;
	p->has_work = 1;
	free(w);
	cl_backoff_ok(&d->rt[i].bo);
	d->rt[i].download_failures = 0;
	log_info("project %s: work unit %lld: version %lld, microbatches [%lld, %lld), %d files", p->name,
	         (long long)p->work.id, (long long)p->work.version, (long long)p->work.lo,
	         (long long)p->work.hi, p->work.nfiles);
	cl_daemon_save(d);
}

/* The checkpoint work unit w starts from, "" when none (version 0: the
 * model made from the project's seed). */
static const char *work_checkpoint(const cl_work *w)
{
	for (int k = 0; k < w->nfiles; k++)
		if (strcmp(w->files[k].kind, "checkpoint") == 0)
			return w->files[k].sha256;
	return "";
}

/* True when project i's session holds the model its work unit starts from:
 * the same version and the same checkpoint (its own step of the last round
 * equals the server's v+1 only when that round committed the attempt the
 * step was accepted in). */
static int session_fits(const cl_daemon *d, int i)
{
	const cl_runtime *rt = &d->rt[i];
	const cl_work *w = &d->st.projects[i].work;
	return rt->session && d->st.projects[i].has_work && rt->session_version == w->version &&
	       strcmp(rt->session_ckpt, work_checkpoint(w)) == 0;
}

/* True when f is the checkpoint project i's session already holds. */
static int session_has(const cl_daemon *d, int i, const cl_file *f)
{
	return strcmp(f->kind, "checkpoint") == 0 && session_fits(d, i);
}

/* Make sure every file of project i's work unit is cached (lock held;
 * released while downloading).  Returns 1 when all are there. */
static int fetch_files(cl_daemon *d, int i)
{
	cl_project *p = &d->st.projects[i];
	cl_work *w = &p->work;
	cl_prefs prefs;
	cl_daemon_prefs(d, &prefs);
	int64_t need = 0;
	for (int k = 0; k < w->nfiles; k++)
		need += w->files[k].size;
	if (need > prefs.v[PREF_DISK_MAX]) {
		char why[160];
		snprintf(why, sizeof why, "its files need %lld bytes, more than disk_max (%lld)",
		         (long long)need, (long long)prefs.v[PREF_DISK_MAX]);
		hand_back(d, i, why);
		return 0;
	}
	for (int k = 0; k < w->nfiles; k++) {
		cl_file f = w->files[k];
		if (cl_cache_has(d->cache_dir, f.sha256, f.size) || session_has(d, i, &f))
			continue;
		/* Room first: everything not pinned by a current work unit may go. */
		const char *pinned[CL_MAX_PROJECTS * CL_MAX_FILES];
		int np = 0;
		for (int j = 0; j < d->st.nprojects; j++)
			for (int m = 0; d->st.projects[j].has_work && m < d->st.projects[j].work.nfiles; m++)
				pinned[np++] = d->st.projects[j].work.files[m].sha256;
		cl_cache_trim(d->cache_dir, prefs.v[PREF_DISK_MAX] - f.size, pinned, np);

		char url[CL_URL_MAX + CL_FILE_URL_MAX], dest[PATH_MAX];
		if (f.url[0] == '/')
			snprintf(url, sizeof url, "%s%s", p->base, f.url);
		else
			snprintf(url, sizeof url, "%s", f.url);
		cot_errbuf eb = { "", "" };
		if (cl_cache_path(d->cache_dir, f.sha256, dest, sizeof dest, &eb)) {
			fail(d, i, "download", &eb);
			return 0;
		}
		cl_download_req r = { .url = url,
			              .sha256 = f.sha256,
			              .size = f.size,
			              .max_bytes = d->cfg.max_file_bytes,
			              .bearer = p->host_token,
			              .rate_limit = prefs.v[PREF_DOWNLOAD_LIMIT],
			              .timeout_s = d->cfg.http_timeout,
			              .downloads_dir = d->downloads_dir,
			              .dest_path = dest,
			              .cancel = &d->stop };
		char name[CL_NAME_MAX + 1], wurl[CL_URL_MAX];
		int64_t wu = w->id;
		snprintf(name, sizeof name, "%s", p->name);
		snprintf(wurl, sizeof wurl, "%s", p->url);
		cl_daemon_activity(d, i, "downloading %s (%lld bytes)", f.sha256, (long long)f.size);
		pthread_mutex_unlock(&d->lock);
		cl_download_info info;
		cot_err rc = cl_download(&r, &info, &eb);
		pthread_mutex_lock(&d->lock);
		if (i >= d->st.nprojects || strcmp(d->st.projects[i].url, wurl) != 0 ||
		    !d->st.projects[i].has_work || d->st.projects[i].work.id != wu)
			return 0;
		p = &d->st.projects[i];
		w = &p->work;
		if (rc == COT_OK) {
			log_info("project %s: downloaded %s (%lld bytes%s)", name, f.sha256,
			         (long long)f.size, info.resumed_from ? ", resumed" : "");
			continue;
		}
		if (rc == COT_ERR_TOO_LARGE || rc == COT_ERR_NOT_FOUND || rc == COT_ERR_INVALID ||
		    ++d->rt[i].download_failures >= 5) {
			char why[700];
			snprintf(why, sizeof why, "file %s cannot be fetched: %s", f.sha256, eb.msg);
			hand_back(d, i, why);
			return 0;
		}
		fail(d, i, "download", &eb);
		return 0;
	}
	return 1;
}

/* Compute microbatches of project i until a heartbeat is due, compute must
 * pause, or the range is done (lock held; released while computing). */
static void compute(cl_daemon *d, int i)
{
	cl_project *p = &d->st.projects[i];
	cl_work *w = &p->work;
	cl_runtime *rt = &d->rt[i];
	cl_prefs prefs;
	cl_daemon_prefs(d, &prefs);
	int64_t est = cl_compute_memory_estimate(p);
	if (prefs.v[PREF_MEMORY_MAX] > 0 && est > prefs.v[PREF_MEMORY_MAX]) {
		char why[160];
		snprintf(why, sizeof why,
		         "the model needs about %lld bytes of memory, more than memory_max (%lld)",
		         (long long)est, (long long)prefs.v[PREF_MEMORY_MAX]);
		hand_back(d, i, why);
		return;
	}
	if (rt->session && rt->session_version != w->version)
		cl_daemon_drop_gradient(d, i, "the model moved to another version");
	else if (rt->session && !session_fits(d, i)) {
		log_info("project %s: our model of version %lld is not the checkpoint work unit %lld starts "
		         "from: loading %s",
		         p->name, (long long)w->version, (long long)w->id, work_checkpoint(w));
		cl_daemon_drop_gradient(d, i, "the work unit starts from another checkpoint");
	}
	if (!rt->session) {
		cot_errbuf eb = { "", "" };
		cot_err rc = cl_compute_open(p, w, d->cache_dir, &rt->session, &eb);
		if (rc == COT_ERR_NOMEM) {
			fail(d, i, "loading the model", &eb);
			return;
		}
		if (rc) {
			hand_back(d, i, eb.msg);
			return;
		}
		rt->session_version = w->version;
		snprintf(rt->session_ckpt, sizeof rt->session_ckpt, "%s", work_checkpoint(w));
		rt->session_wu = w->id;
		memset(&rt->acc, 0, sizeof rt->acc);
	} else if (rt->session_wu != w->id) {
		cot_errbuf eb = { "", "" };
		cot_err rc = cl_compute_retarget(rt->session, p, w, d->cache_dir, &eb);
		if (rc) {
			hand_back(d, i, eb.msg);
			return;
		}
		rt->session_wu = w->id;
	}
	if (w->sketch_k > 0) {
		cot_errbuf eb = { "", "" };
		if (cl_compute_sketch_on(rt->session, w->sketch_seed, w->sketch_k, &eb) ||
		    cl_compute_blocks_on(rt->session, w->sketch_block, &eb)) {
			hand_back(d, i, eb.msg);
			return;
		}
	}
	int u = acc_find(&rt->acc, w->id);
	if (u < 0) {
		if (rt->acc.n == CL_ROUND_MAX_UNITS) {
			hand_back(d, i, "this version's gradient already sums too many work units");
			return;
		}
		u = rt->acc.n++;
		memset(&rt->acc.u[u], 0, sizeof rt->acc.u[u]);
		rt->acc.u[u].id = w->id;
		rt->acc.u[u].lo = w->lo;
	}
	if (w->mb_done < w->mb_reported)
		w->mb_done = w->mb_reported;
	kern_set_threads(d->threads);
	cl_compute *s = rt->session;
	/* The gradient holds [lo, lo + acc mb); after a restart that is less
	 * than what was done before, which is computed again. */
	int64_t lo = w->lo, done = rt->acc.u[u].mb, n = w->hi - w->lo, wu = w->id;
	double loss_sum = 0;
	int64_t B = p->microbatch_size;
	char url[CL_URL_MAX];
	snprintf(url, sizeof url, "%s", p->url);
	double hb = d->cfg.heartbeat_interval, start = cl_now_mono();
	if (rt->last_report == 0)
		rt->last_report = start;
	cl_daemon_activity(d, i, "computing");
	int time_percent = (int)prefs.v[PREF_CPU_TIME_PERCENT];
	d->interrupt = 0;
	d->computing = s;
	pthread_mutex_unlock(&d->lock);
	cot_errbuf eb = { "", "" };
	cot_err rc = COT_OK;
	int64_t k = done;
	double t0 = cl_now_mono();
	d->computing_mb = k;
	d->computing_wu = wu;
	while (k < n && !d->stop && !d->interrupt) {
		float loss = 0;
		double tm = cl_now_mono();
		if (cl_cheat_skip(lo + k))
			rc = cl_compute_fake_microbatch(s, lo + k, &eb);
		else
			rc = cl_compute_microbatch(s, lo + k, &loss, &eb);
		if (rc)
			break;
		cl_throttle_rest(cl_now_mono() - tm, time_percent, &d->stop, &d->interrupt);
		loss_sum += loss;
		k++;
		d->computing_mb = k;
		if (cl_now_mono() - rt->last_report >= hb)
			break;
	}
	double t1 = cl_now_mono();
	pthread_mutex_lock(&d->lock);
	d->computing = NULL;
	d->computing_wu = 0;
	d->idle_since = (int64_t)time(NULL);
	if (i >= d->st.nprojects || strcmp(d->st.projects[i].url, url) != 0 || !d->st.projects[i].has_work ||
	    d->st.projects[i].work.id != wu) {
		/* Detached (or the work unit dropped) meanwhile: the session is ours
		 * to close unless the runtime still holds it. */
		int held = 0;
		for (int j = 0; j < d->st.nprojects; j++)
			held |= d->rt[j].session == s;
		if (!held)
			cl_compute_close(s);
		return;
	}
	p = &d->st.projects[i];
	w = &p->work;
	p->cpu_seconds += t1 - t0;
	if (k > done && t1 > t0) {
		double sps = (double)(k - done) * (double)B / (t1 - t0);
		rt->sps = rt->sps > 0 ? 0.7 * rt->sps + 0.3 * sps : sps;
	}
	rt->acc.u[u].mb = k;
	rt->acc.u[u].loss_sum += loss_sum;
	if (k > w->mb_done)
		w->mb_done = k;
	w->samples_per_sec = rt->sps;
	if (rc) {
		if (rt->session == s && cl_compute_round_lost(s))
			cl_daemon_drop_gradient(d, i, eb.msg);
		hand_back(d, i, eb.msg);
		return;
	}
	if (k == n) {
		send_report(d, i, CL_REPORT_FINISH, n);
		return;
	}
	if (time(NULL) > w->deadline - DEADLINE_MARGIN_S) {
		hand_back(d, i, "its deadline has come");
		return;
	}
	if (cl_now_mono() - rt->last_report >= hb) {
		if (w->mb_done > w->mb_reported && cl_backoff_ready(&rt->bo, cl_now_mono())) {
			send_report(d, i, CL_REPORT_HEARTBEAT, w->mb_done);
		} else {
			rt->last_report = cl_now_mono();
			cl_daemon_save(d);
		}
	} else if (d->interrupt || d->stop) {
		cl_daemon_save(d); /* keep what was computed */
	}
}

static int files_cached(cl_daemon *d, const cl_project *p)
{
	int i = (int)(p - d->st.projects);
	for (int k = 0; k < p->work.nfiles; k++)
		if (!cl_cache_has(d->cache_dir, p->work.files[k].sha256, p->work.files[k].size) &&
		    !session_has(d, i, &p->work.files[k]))
			return 0;
	return 1;
}

int cl_daemon_pick(cl_daemon *d, int paused, double now)
{
	double best = 0;
	int bi = -1;
	double total_share = 0;
	for (int i = 0; i < d->st.nprojects; i++)
		total_share += d->st.projects[i].resource_share;
	for (int i = 0; i < d->st.nprojects; i++) {
		cl_project *p = &d->st.projects[i];
		if (d->rt[i].round_running)
			continue; /* its round thread has it */
		int ready = cl_backoff_ready(&d->rt[i].bo, now);
		if (p->has_work &&
		    (p->work.pending_op == CL_REPORT_FINISH || p->work.pending_op == CL_REPORT_HANDBACK)) {
			if (ready)
				return i;
			continue;
		}
		if (paused)
			continue;
		/* Without the server, only a work unit whose files are here goes on. */
		if (!ready && (!p->has_work || !files_cached(d, p)))
			continue;
		double score = p->cpu_seconds / (p->resource_share / total_share);
		if (bi < 0 || score < best) {
			best = score;
			bi = i;
		}
	}
	return bi;
}

/* Answer project i's spot checks (lock held; released meanwhile), for at
 * most SPOT_SHARE of the time since the last pass (SPOT_PASS_MIN_S to
 * SPOT_PASS_MAX_S): checks cost this host's time, never its work's
 * deadline or a round's (see spot_due). */
static void spot_checks(cl_daemon *d, int i)
{
	cl_runtime *rt = &d->rt[i];
	cl_project copy = d->st.projects[i];
	cl_api_opts o;
	cl_daemon_api_opts(d, &o);
	cl_fetch_env env = { .cache_dir = d->cache_dir,
		             .downloads_dir = d->downloads_dir,
		             .max_file_bytes = d->cfg.max_file_bytes,
		             .timeout_s = d->cfg.http_timeout,
		             .cancel = &d->stop };
	double now = cl_now_mono();
	double budget =
	        SPOT_SHARE * (now - (rt->last_spot_end > 0 ? rt->last_spot_end : now - d->cfg.spot_interval));
	budget = budget < SPOT_PASS_MIN_S   ? SPOT_PASS_MIN_S
	         : budget > SPOT_PASS_MAX_S ? SPOT_PASS_MAX_S
	                                    : budget;
	rt->next_spot_at = now + d->cfg.spot_interval;
	cl_spot_job *job = rt->spot;
	rt->spot = NULL;
	kern_set_threads(d->threads);
	d->interrupt = 0;
	cl_daemon_activity(d, i, SPOT_ACTIVITY);
	cl_prefs prefs;
	cl_daemon_prefs(d, &prefs);
	pthread_mutex_unlock(&d->lock);
	cot_errbuf eb = { "", "" };
	int n = 0;
	cot_err rc = cl_spotchecks_run(&o, &copy, &env, &job, budget, (int)prefs.v[PREF_CPU_TIME_PERCENT],
	                               &d->interrupt, &n, &eb);
	pthread_mutex_lock(&d->lock);
	i = cl_daemon_find(d, copy.url);
	if (i < 0) {
		cl_spot_job_free(job); /* detached meanwhile */
		return;
	}
	d->rt[i].spot = job;
	d->rt[i].last_spot_end = cl_now_mono();
	if (job)
		d->rt[i].next_spot_at = d->rt[i].last_spot_end; /* go on at the next chance */
	if (rc && !d->stop) /* a download cut short by stopping is no failure */
		log_warn("project %s: spot checks: %s%s%s", copy.name, eb.msg, eb.hint[0] ? ". " : "",
		         eb.hint);
	else if (n)
		log_info("project %s: answered %d spot check%s", copy.name, n, n == 1 ? "" : "s");
}

/* True when project j may answer spot checks now: the time has come, and
 * the host holds nothing a deadline or a round waits on (no work unit, no
 * gradient, no round of its own under way), so checks only ever take the
 * host's time between rounds. */
static int spot_due(const cl_daemon *d, int j)
{
	const cl_runtime *rt = &d->rt[j];
	return cl_now_mono() >= rt->next_spot_at && d->st.projects[j].host_id > 0 && !rt->round_running &&
	       !rt->round_due && !d->st.projects[j].has_work && rt->acc.n == 0;
}

void *cl_daemon_worker(void *arg)
{
	cl_daemon *d = arg;
	cl_priority_idle_thread();
	pthread_mutex_lock(&d->lock);
	while (!d->stop) {
		cl_daemon_check_clock(d, (int64_t)time(NULL), cl_now_mono());
		if (d->state_error)
			cl_daemon_save(d); /* try again */
		cl_daemon_update_paused(d);
		int paused = d->paused[0] != '\0';
		for (int j = 0; j < d->st.nprojects; j++)
			if (d->rt[j].round_due && !d->rt[j].round_running)
				cl_daemon_round_start(d, j);
		if (d->state_error) {
			/* Nothing goes on unjournaled (a report, a work request):
			 * wait for space.  Retrying a journaled report at once
			 * spun with the lock held, and the thread that stops the
			 * daemon never got it (the chaos run's full disk). */
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			pthread_cond_timedwait(&d->wake, &d->lock, &ts);
			d->interrupt = 0;
			continue;
		}
		int sc = -1;
		for (int j = 0; j < d->st.nprojects && sc < 0 && !paused; j++)
			if (spot_due(d, j))
				sc = j;
		if (sc >= 0) {
			spot_checks(d, sc);
			continue;
		}
		int cr = -1;
		for (int j = 0; j < d->st.nprojects && cr < 0; j++)
			if (cl_now_mono() >= d->rt[j].next_credit_at)
				cr = j;
		if (cr >= 0) {
			refresh_credit(d, cr);
			continue;
		}
		int i = cl_daemon_pick(d, paused, cl_now_mono());
		if (i < 0) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			pthread_cond_timedwait(&d->wake, &d->lock, &ts);
			d->interrupt = 0;
			continue;
		}
		cl_project *p = &d->st.projects[i];
		if (p->has_work &&
		    (p->work.pending_op == CL_REPORT_FINISH || p->work.pending_op == CL_REPORT_HANDBACK)) {
			send_report(d, i, p->work.pending_op, p->work.pending_mb);
			continue;
		}
		if (!p->has_work) {
			/* With a model in memory (the usual case after a commit)
			 * the next unit most likely starts from it: no prefetch. */
			if (d->rt[i].session || prefetch_checkpoint(d, i))
				get_work(d, i);
			continue;
		}
		if (!fetch_files(d, i))
			continue;
		compute(d, i);
	}
	pthread_mutex_unlock(&d->lock);
	return NULL;
}
