/* cotrain client: the control commands cotrainctl sends (see daemon.h and
 * doc/client.md).  Each takes the request object and answers an object;
 * errors are cot_err with a detail. */
#include "client/daemon.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/hostinfo.h"
#include "client/logring.h"
#include "shared/common/json.h"
#include "shared/common/log.h"

static json_t *work_json(const cl_daemon *d, int i)
{
	const cl_project *p = &d->st.projects[i];
	const cl_work *w = &p->work;
	int64_t total = w->hi - w->lo;
	/* Live: what the compute loop has done since it last took the lock. */
	int64_t done = w->mb_done;
	if (d->computing_wu == w->id && d->computing_mb > done)
		done = d->computing_mb;
	double sps = d->rt[i].sps;
	double mbps = p->microbatch_size > 0 ? sps / (double)p->microbatch_size : 0;
	json_t *eta = mbps > 0 ? json_real((double)(total - done) / mbps) : json_null();
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:o, s:I}", "id", (json_int_t)w->id,
	                 "version", (json_int_t)w->version, "lo", (json_int_t)w->lo, "hi", (json_int_t)w->hi,
	                 "mb_done", (json_int_t)done, "mb_total", (json_int_t)total, "mb_reported",
	                 (json_int_t)w->mb_reported, "samples_per_sec", sps, "eta_seconds", eta, "deadline",
	                 (json_int_t)w->deadline);
}

/* The host's credit as the server last said, or null before the first
 * answer. */
static json_t *credit_json(const cl_runtime *rt)
{
	if (rt->credit_at <= 0)
		return json_null();
	return json_pack("{s:f, s:f, s:I}", "granted", rt->credit_granted, "pending", rt->credit_pending,
	                 "at", (json_int_t)rt->credit_at);
}

/* What the daemon does now, in one phrase that is true at every moment
 * (doc/client.md, "Status"): no project attached, suspended (and why),
 * computing, averaging, waiting for work with the next attempt's time, or
 * idle since when, with what it waits for (lock held). */
static void overall_activity(const cl_daemon *d, char *buf, size_t len)
{
	if (d->st.nprojects == 0) {
		snprintf(buf, len, "no project attached");
		return;
	}
	if (d->paused[0]) {
		snprintf(buf, len, "suspended: %s", d->paused);
		return;
	}
	for (int i = 0; i < d->st.nprojects; i++)
		if (d->computing_wu != 0 && d->st.projects[i].has_work &&
		    d->st.projects[i].work.id == d->computing_wu) {
			snprintf(buf, len, "computing (project %s, work unit %lld)", d->st.projects[i].name,
			         (long long)d->computing_wu);
			return;
		}
	for (int i = 0; i < d->st.nprojects; i++)
		if (strcmp(d->rt[i].activity, SPOT_ACTIVITY) == 0) {
			snprintf(buf, len, "computing (project %s, spot checks)", d->st.projects[i].name);
			return;
		}
	for (int i = 0; i < d->st.nprojects; i++)
		if (d->rt[i].round_running) {
			snprintf(buf, len, "averaging (project %s, round %lld)", d->st.projects[i].name,
			         (long long)d->rt[i].round_version);
			return;
		}
	char since[16];
	cl_daemon_clock_text(d->idle_since, since, sizeof since);
	double now = cl_now_mono(), soonest = 0;
	int k = -1;
	for (int i = 0; i < d->st.nprojects; i++)
		if (d->rt[i].bo.failures > 0 && d->rt[i].bo.next_at > now &&
		    (k < 0 || d->rt[i].bo.next_at < soonest)) {
			k = i;
			soonest = d->rt[i].bo.next_at;
		}
	if (k >= 0) {
		char at[16];
		cl_daemon_clock_text((int64_t)time(NULL) + (int64_t)(soonest - now + 0.5), at, sizeof at);
		snprintf(buf, len, "waiting for work (project %s), next attempt at %s; idle since %s",
		         d->st.projects[k].name, at, since);
		return;
	}
	const char *what = d->rt[0].activity[0] ? d->rt[0].activity : "waiting for its turn";
	snprintf(buf, len, "idle since %s (project %s: %s)", since, d->st.projects[0].name, what);
}

static json_t *cmd_status(cl_daemon *d)
{
	json_t *projects = json_array();
	double now = cl_now_mono();
	for (int i = 0; i < d->st.nprojects; i++) {
		const cl_project *p = &d->st.projects[i];
		double wait = d->rt[i].bo.next_at - now;
		json_t *next = wait > 0 && d->rt[i].bo.failures > 0
		                       ? json_integer((json_int_t)time(NULL) + (json_int_t)(wait + 0.5))
		                       : json_null();
		json_array_append_new(projects,
		                      json_pack("{s:s, s:s, s:I, s:f, s:s, s:s, s:s, s:f, s:o, s:I, s:f, "
		                                "s:o, s:o}",
		                                "name", p->name, "url", p->url, "host_id",
		                                (json_int_t)p->host_id, "resource_share", p->resource_share,
		                                "activity",
		                                d->rt[i].activity[0] ? d->rt[i].activity
		                                                     : "waiting for its turn",
		                                "network", d->rt[i].network, "links", d->rt[i].links,
		                                "retry_in", wait > 0 ? wait : 0.0, "next_attempt_at", next,
		                                "mb_total", (json_int_t)p->mb_total, "samples_per_sec",
		                                d->rt[i].sps, "credit", credit_json(&d->rt[i]), "work",
		                                p->has_work ? work_json(d, i) : json_null()));
	}
	char act[600], dev[200];
	overall_activity(d, act, sizeof act);
	cl_compute_device_text(dev, sizeof dev);
	return json_pack("{s:s, s:I, s:b, s:o, s:i, s:f, s:s, s:b, s:o, s:s, s:s, s:o}", "activity", act,
	                 "idle_since", (json_int_t)d->idle_since, "suspended", d->st.suspended, "paused",
	                 d->paused[0] ? json_string(d->paused) : json_null(), "threads", d->threads,
	                 "benchmark_flops", d->st.bench_flops, "state_dir", d->cfg.state_dir, "state_error",
	                 d->state_error, "projects", projects, "compute_device", dev, "gpus", d->hw.gpu,
	                 "gpu_none", d->gpus > 0 ? json_null() : json_string(d->gpu_why));
}

/* attach: {"url", "account_key" | "email"+"password", "resource_share"}.
 * Runs the network calls without the lock. */
static json_t *cmd_attach(cl_daemon *d, const json_t *req, cot_err *rc, cot_errbuf *eb)
{
	const char *url = NULL, *key = NULL, *email = NULL, *password = NULL;
	double share = 100;
	if ((*rc = cot_json_str(req, "url", true, 1, CL_URL_MAX - 1, &url, eb)) ||
	    (*rc = cot_json_str(req, "account_key", false, 1, CL_TOKEN_MAX - 1, &key, eb)) ||
	    (*rc = cot_json_str(req, "email", false, 1, 254, &email, eb)) ||
	    (*rc = cot_json_str(req, "password", false, 1, 1024, &password, eb)) ||
	    (*rc = cot_json_num(req, "resource_share", false, 0.001, 1e6, &share, eb)))
		return NULL;
	if (!key && !(email && password)) {
		*rc = cot_seterr(eb, COT_ERR_INVALID,
		                 "attach needs an account key, or an email and a password");
		return NULL;
	}
	cl_project *p = calloc(1, sizeof *p);
	if (!p) {
		*rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	json_t *answer = NULL;
	snprintf(p->url, sizeof p->url, "%s", url);
	p->resource_share = share;
	if ((*rc = cl_api_parse_project_url(url, p->base, sizeof p->base, p->name, sizeof p->name, eb)))
		goto out;
	pthread_mutex_lock(&d->lock);
	int dup = cl_state_find(&d->st, p->name) != NULL || cl_state_find(&d->st, url) != NULL;
	int full = d->st.nprojects >= CL_MAX_PROJECTS;
	cl_api_opts o;
	cl_daemon_api_opts(d, &o);
	cl_hostinfo hw = d->hw;
	hw.flops = d->hw.flops > 1 ? d->hw.flops : 1e9; /* a faster GPU's, when it computes */
	cl_hostinfo_machine_id(d->st.machine_secret, p->base, p->name, hw.machine_id);
	pthread_mutex_unlock(&d->lock);
	if (dup) {
		*rc = cot_seterr(eb, COT_ERR_EXISTS, "project \"%s\" is already attached", p->name);
		goto out;
	}
	if (full) {
		*rc = cot_seterr(eb, COT_ERR_TOO_LARGE, "cannot attach more than %d projects",
		                 CL_MAX_PROJECTS);
		goto out;
	}
	if (key)
		snprintf(p->account_key, sizeof p->account_key, "%s", key);
	else if ((*rc = cl_api_login(&o, p->base, email, password, p->account_key, eb)))
		goto out;
	if ((*rc = cl_api_account(&o, p->base, p->account_key, &p->account_prefs, eb)) == COT_ERR_AUTH) {
		/* The server's own hint speaks of HTTP headers: a volunteer needs
		 * to know where the key comes from. */
		cot_seterr(eb, *rc, "the project refused this account key");
		cot_sethint(eb, "Copy the key again from the project's web site: the page shown after "
		                "signing up, or your account page.  Or attach with --email and "
		                "--password-stdin.");
		goto out;
	}
	if (*rc || (*rc = cl_api_project(&o, p, NULL, eb)) ||
	    (*rc = cl_api_register_host(&o, p->base, p->account_key, &hw, &p->host_id, p->host_token, eb)))
		goto out;
	pthread_mutex_lock(&d->lock);
	cl_project *slot;
	if (cl_state_find(&d->st, p->name)) {
		*rc = cot_seterr(eb, COT_ERR_EXISTS, "project \"%s\" is already attached", p->name);
	} else if (!(*rc = cl_state_add(&d->st, &slot, eb))) {
		*slot = *p;
		int i = (int)(slot - d->st.projects);
		memset(&d->rt[i], 0, sizeof d->rt[i]);
		cl_backoff_init(&d->rt[i].bo, d->cfg.retry_base, d->cfg.retry_max);
		cl_daemon_activity(d, i, "attached: about to ask for work");
		if ((*rc = cl_daemon_save(d))) {
			cl_daemon_remove_project(d, i);
			cot_seterr(eb, *rc, "could not save the state; project \"%s\" was not attached",
			           p->name);
		} else {
			log_info("attached to project %s at %s as host %lld", p->name, p->base,
			         (long long)p->host_id);
			answer = json_pack("{s:s, s:I}", "project", p->name, "host_id",
			                   (json_int_t)p->host_id);
		}
	}
	pthread_cond_broadcast(&d->wake);
	pthread_mutex_unlock(&d->lock);
out:
	free(p);
	return answer;
}

static json_t *cmd_detach(cl_daemon *d, const json_t *req, cot_err *rc, cot_errbuf *eb)
{
	const char *name = NULL;
	if ((*rc = cot_json_str(req, "project", true, 1, CL_URL_MAX - 1, &name, eb)))
		return NULL;
	pthread_mutex_lock(&d->lock);
	cl_project *p = cl_state_find(&d->st, name);
	if (!p) {
		pthread_mutex_unlock(&d->lock);
		*rc = cot_seterr(eb, COT_ERR_NOT_FOUND, "project \"%s\" is not attached", name);
		return NULL;
	}
	int i = (int)(p - d->st.projects);
	cl_project copy = *p;
	cl_api_opts o;
	cl_daemon_api_opts(d, &o);
	cl_daemon_remove_project(d, i);
	*rc = cl_daemon_save(d);
	pthread_mutex_unlock(&d->lock);
	if (*rc) {
		cot_seterr(eb, *rc, "could not save the state after detaching \"%s\"", name);
		return NULL;
	}
	int handed = 0;
	if (copy.has_work && copy.work.pending_op != CL_REPORT_FINISH) {
		/* Give the rest back so nobody waits for its deadline. */
		cot_errbuf e2 = { "", "" };
		handed = cl_api_report(&o, &copy, CL_REPORT_HANDBACK, copy.work.id, copy.work.mb_reported, 0,
		                       NULL, NULL, &e2) == COT_OK;
		if (!handed)
			log_warn("project %s: could not hand back work unit %lld on detach: %s", copy.name,
			         (long long)copy.work.id, e2.msg);
	}
	log_info("detached from project %s", copy.name);
	return json_pack("{s:s, s:b}", "project", copy.name, "handed_back", handed);
}

static json_t *cmd_suspend(cl_daemon *d, int on, cot_err *rc, cot_errbuf *eb)
{
	pthread_mutex_lock(&d->lock);
	int was = d->st.suspended;
	d->st.suspended = on;
	*rc = cl_daemon_save(d);
	if (*rc)
		d->st.suspended = was;
	cl_daemon_update_paused(d); /* status says so before this answer */
	d->interrupt = 1;
	pthread_cond_broadcast(&d->wake);
	pthread_mutex_unlock(&d->lock);
	if (*rc) {
		cot_seterr(eb, *rc, "could not save the state");
		return NULL;
	}
	log_info("%s by the user", on ? "suspended" : "resumed");
	return json_pack("{s:b}", "suspended", on);
}

static json_t *prefs_answer(cl_daemon *d)
{
	cl_prefs eff, acc = { .set = 0 };
	cl_daemon_prefs(d, &eff);
	for (int i = 0; i < d->st.nprojects; i++)
		cl_prefs_overlay(&acc, &d->st.projects[i].account_prefs);
	return json_pack("{s:o, s:o, s:o, s:o}", "effective", cl_prefs_to_json(&eff), "local",
	                 cl_prefs_to_json(&d->st.local_prefs), "config", cl_prefs_to_json(&d->cfg.prefs),
	                 "account", cl_prefs_to_json(&acc));
}

/* prefs: {"set": {"key": "text", ...}, "unset": ["key", ...]}; both
 * optional; all or nothing. */
static json_t *cmd_prefs(cl_daemon *d, const json_t *req, cot_err *rc, cot_errbuf *eb)
{
	const json_t *set = json_object_get(req, "set"), *unset = json_object_get(req, "unset");
	if ((set && !json_is_object(set)) || (unset && !json_is_array(unset))) {
		*rc = cot_seterr(eb, COT_ERR_INVALID, "\"set\" must be an object and \"unset\" an array");
		return NULL;
	}
	pthread_mutex_lock(&d->lock);
	cl_prefs tmp = d->st.local_prefs;
	const char *k;
	json_t *v;
	json_object_foreach((json_t *)set, k, v)
	{
		int key = cl_prefs_key(k);
		char text[64];
		if (key < 0) {
			*rc = cot_seterr(eb, COT_ERR_INVALID, "unknown preference \"%.64s\"", k);
			cot_sethint(eb, "Known: max_threads, cpu_percent, only_when_idle, idle_after, "
			                "only_on_ac, download_limit, upload_limit, disk_max, memory_max.");
			goto fail;
		}
		if (json_is_string(v))
			snprintf(text, sizeof text, "%s", json_string_value(v));
		else if (json_is_integer(v))
			snprintf(text, sizeof text, "%lld", (long long)json_integer_value(v));
		else if (json_is_boolean(v))
			snprintf(text, sizeof text, "%s", json_is_true(v) ? "true" : "false");
		else {
			*rc = cot_seterr(eb, COT_ERR_INVALID,
			                 "preference \"%s\" needs a string, integer or boolean", k);
			goto fail;
		}
		if ((*rc = cl_prefs_set_text(&tmp, (cl_pref_key)key, text, eb)))
			goto fail;
	}
	size_t idx;
	json_array_foreach(unset, idx, v)
	{
		int key = json_is_string(v) ? cl_prefs_key(json_string_value(v)) : -1;
		if (key < 0) {
			*rc = cot_seterr(eb, COT_ERR_INVALID, "unknown preference in \"unset\"");
			goto fail;
		}
		tmp.set &= ~(1u << key);
	}
	if (set || unset) {
		cl_prefs old = d->st.local_prefs;
		d->st.local_prefs = tmp;
		if ((*rc = cl_daemon_save(d))) {
			d->st.local_prefs = old;
			cot_seterr(eb, *rc, "could not save the state; preferences unchanged");
			goto fail;
		}
		cl_daemon_update_paused(d); /* only_when_idle, only_on_ac, max_threads */
		d->interrupt = 1;
		pthread_cond_broadcast(&d->wake);
	}
	json_t *a = prefs_answer(d);
	pthread_mutex_unlock(&d->lock);
	return a;
fail:
	pthread_mutex_unlock(&d->lock);
	return NULL;
}

json_t *cl_commands_handle(const json_t *req, void *ctx, cot_err *rc, cot_errbuf *eb)
{
	cl_daemon *d = ctx;
	const char *cmd = json_string_value(json_object_get(req, "cmd"));
	json_t *a = NULL;
	*rc = COT_OK;
	if (strcmp(cmd, "status") == 0) {
		pthread_mutex_lock(&d->lock);
		a = cmd_status(d);
		pthread_mutex_unlock(&d->lock);
	} else if (strcmp(cmd, "attach") == 0) {
		a = cmd_attach(d, req, rc, eb);
	} else if (strcmp(cmd, "detach") == 0) {
		a = cmd_detach(d, req, rc, eb);
	} else if (strcmp(cmd, "suspend") == 0 || strcmp(cmd, "resume") == 0) {
		a = cmd_suspend(d, cmd[0] == 's', rc, eb);
	} else if (strcmp(cmd, "prefs") == 0) {
		a = cmd_prefs(d, req, rc, eb);
	} else if (strcmp(cmd, "log") == 0) {
		long long n = 50;
		if (!(*rc = cot_json_int(req, "lines", false, 1, CL_LOGRING_LINES, &n, eb)))
			a = json_pack("{s:o}", "lines", cl_logring_tail((int)n));
	} else {
		*rc = cot_seterr(eb, COT_ERR_INVALID, "unknown command \"%.64s\"", cmd);
		cot_sethint(eb, "Commands: status, attach, detach, suspend, resume, prefs, log.");
	}
	if (!a && !*rc)
		*rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	return a;
}
